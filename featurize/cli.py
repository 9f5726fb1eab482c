"""``spml import {cole,arrays,yeast}`` and ``spml info`` (thin layers over featurize.imports and
probe.store, imported when a command runs so that ``spml --help`` does not load zarr)."""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probe.store import Store

DTYPES = ("float16", "float32")  # = probe.store.DTYPES (a test checks they agree)
TEST_FRACTION = 0.2  # = featurize.imports.DEFAULT_TEST_FRACTION (a test checks they agree)

_STORE_LAYOUT = (
    "The store is a Zarr v3 directory: features (N, D), labels (N, C), single positives "
    "observed/1200 (Cole et al.'s seed, drawn per phase), split (train/val: 80/20 of the pool with "
    "seed 1200; test), image ids and provenance. An interrupted import is resumed by running the "
    "same command again."
)


def _wrap(*paragraphs: str) -> str:
    """Description text for RawDescriptionHelpFormatter (which keeps the epilog's line breaks)."""
    return "\n\n".join(textwrap.fill(p, width=88) for p in paragraphs)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="STORE", help="output store directory")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float16",
        help="feature storage type (default: float16, half the disk and memory; float32 keeps "
        "full precision)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing store at --out"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_seeds_argument(parser)


SEEDS_HELP = (
    "single-positive draws to store, comma list (default: 1200, the literature's; docs/protocol.md "
    "step 2 re-run with each seed gives other draws for multi-seed confirmation)"
)


def add_seeds_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", default="1200", metavar="S1,S2,...", help=SEEDS_HELP)


def add_draws(path: str, seeds_text: str) -> list[int]:
    """Add the single-positive draws ``seeds_text`` names (``"1200,1,2"``) to a complete store;
    draws already there are kept. Returns the store's seeds."""
    from probe.store import add_observed_seed, open_store

    try:
        seeds = [int(s) for s in seeds_text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(
            f"--seeds must be integers separated by commas, e.g. 1200,1,2; got {seeds_text!r}"
        ) from None
    if not seeds or any(s < 0 or s >= 2**32 for s in seeds):
        raise ValueError(f"--seeds needs integers in [0, 2**32); got {seeds_text!r}")
    for seed in seeds:
        add_observed_seed(path, seed)
    return open_store(path).observed_seeds()


def _report(store: Store, seeds_text: str = "1200") -> None:
    add_draws(str(store.path), seeds_text)
    sizes = " / ".join(f"{name} {len(store.split(name))}" for name in ("train", "val", "test"))
    print(
        f"wrote {store.path}: {store.dataset}, {store.n_rows} rows ({sizes}), "
        f"{store.n_classes} classes, {store.feature_dim}-dim {store.dtype} features. "
        f"'spml info {store.path}' shows more."
    )


def _cmd_import_cole(args: argparse.Namespace) -> int:
    from featurize import imports

    store = imports.import_cole(
        args.dir,
        args.dataset,
        args.out,
        dtype=args.dtype,
        class_names_file=args.class_names,
        overwrite=args.overwrite,
        block_rows=args.block_rows,
        progress=not args.quiet,
    )
    _report(store, args.seeds)
    return 0


def _cmd_import_arrays(args: argparse.Namespace) -> int:
    from featurize import imports

    store = imports.import_array_files(
        args.out,
        args.features,
        args.labels,
        name=args.name,
        test_features_path=args.test_features,
        test_labels_path=args.test_labels,
        test_fraction=args.test_fraction,
        class_names_path=args.class_names,
        dtype=args.dtype,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    _report(store, args.seeds)
    return 0


def _cmd_import_yeast(args: argparse.Namespace) -> int:
    from featurize import imports

    store = imports.import_yeast(
        args.out,
        dtype=args.dtype,
        test_fraction=args.test_fraction,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    _report(store, args.seeds)
    return 0


def _cmd_draw(args: argparse.Namespace) -> int:
    seeds = add_draws(args.store, args.seeds)
    print(f"{args.store}: single-positive draws for seeds {seeds}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from probe.store import open_store

    summary = open_store(args.store).summary()
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {text}")
    return value


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", … ({len(names) - limit} more)" if len(names) > limit else "")


def _flat(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def format_summary(summary: dict) -> str:
    """Human-readable ``spml info`` text for :meth:`probe.store.Store.summary`."""
    s = summary
    flip = "with flipped features" if s["has_flip"] else "no flipped features"
    lines = []
    if s["provenance"].get("weights_random"):
        lines += [
            "WARNING: RANDOM WEIGHTS — these features come from a randomly initialised backbone "
            f"({s['provenance'].get('weights')}); for tests and benchmarks only, not results.",
            "",
        ]
    if s["other_attrs"].get("n_bad_rows"):
        lines += [
            f"WARNING: {s['other_attrs']['n_bad_rows']} images could not be read (--skip-bad); "
            "their features are zero (attribute bad_rows lists them).",
            "",
        ]
    lines += [
        f"store       {s['path']} (schema {s['schema_version']}, completed {s['completed']})",
        f"dataset     {s['dataset']}: {s['rows']} rows, {s['classes']} classes, "
        f"{s['feature_dim']}-dim {s['dtype']} features, {flip}",
        f"classes     {_names(s['class_names'])}",
        f"positives   single-positive draws for seeds {s['observed_seeds']}",
        f"unlabeled   rows with no positive: pool {s['n_unlabeled']['pool']}, "
        f"test {s['n_unlabeled']['test']}",
        f"disk        {s['disk_bytes'] / 2**20:.1f} MiB",
        "",
        f"{'split':<6} {'rows':>8} {'labels/row':>11} {'rows w/o pos':>13} {'classes w/o pos':>16}",
    ]
    for name, sp in s["splits"].items():
        lines.append(
            f"{name:<6} {sp['rows']:>8} {sp['label_cardinality']:>11.3f} "
            f"{sp['rows_without_positive']:>13} {sp['classes_without_positive']:>16}"
        )
    for name, sp in s["splits"].items():
        if sp["classes_without_positive"]:
            lines.append(
                f"  {name}: no positive for {_names(sp['classes_without_positive_names'])} "
                "(AP counts as 0 for them)"
            )
    if s["other_attrs"]:
        lines += ["", "attributes"]
        lines += [f"  {k}: {_flat(v)}" for k, v in s["other_attrs"].items()]
    lines += ["", "provenance"]
    lines += [f"  {k}: {_flat(v)}" for k, v in s["provenance"].items()]
    return "\n".join(lines)


def register_cli(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    """Add ``spml featurize``, ``spml import …``, ``spml info`` and ``spml bench featurize``."""
    from featurize.featurize_cli import register_featurize_cli

    register_featurize_cli(sub, bench)
    imp = sub.add_parser(
        "import",
        help="build a feature store from precomputed features (no backbone run)",
        description=_wrap("Build a feature store from features computed elsewhere.", _STORE_LAYOUT),
        epilog="examples:\n"
        "  spml import cole data/coco --dataset coco --out stores/coco-cole.zarr\n"
        "  spml import arrays --features X.npy --labels Y.npy --name mydata --out my.zarr\n"
        "  spml import yeast --out stores/yeast.zarr",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    isub = imp.add_subparsers(dest="import_source", metavar="SOURCE", required=True)

    p = isub.add_parser(
        "cole",
        help="Cole et al. (2021)'s released ResNet-50 features and formatted labels",
        description=_wrap(
            "Import Cole et al.'s released files from one dataset directory: "
            "formatted_{train,val}_labels.npy, formatted_{train,val}_images.npy and "
            "{train,val}_features_imagenet_resnet50.npy (their 'val' is our test phase; rows "
            "keep the files' order; there are no flipped features). Class names: VOC/COCO "
            "standard orders; NUS-WIDE from Concepts81.txt if present (else the alphabetical "
            "81 concepts); CUB from attributes.txt (or --class-names). If the directory holds "
            "their formatted_*_labels_obs.npy, our seed-1200 draw is compared with it and the "
            "result recorded in the provenance.",
            _STORE_LAYOUT,
        ),
        epilog="example:\n  spml import cole data/pascal --dataset voc --out stores/voc-cole.zarr",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", help="directory holding Cole et al.'s .npy files")
    p.add_argument(
        "--dataset",
        required=True,
        choices=("voc", "coco", "nus", "cub"),
        help="which dataset the files are (sets the class names and image folder; Cole et "
        "al.'s 'pascal' is voc, 'nuswide' is nus)",
    )
    p.add_argument(
        "--class-names",
        metavar="FILE",
        help="class names, one per line, overriding the defaults above",
    )
    p.add_argument(
        "--block-rows",
        type=int,
        default=1024,
        help="rows per store chunk / write block (default: 1024)",
    )
    _common(p)
    p.set_defaults(func=_cmd_import_cole)

    p = isub.add_parser(
        "arrays",
        help="any (N, D) feature matrix with an (N, C) 0/1 label matrix (.npy files)",
        description=_wrap(
            "Import any features with a multi-label 0/1 matrix, one row per sample, as .npy "
            "files. Test rows come from --test-features/--test-labels, or are held out from the "
            "rows with --test-fraction (default 0.2 when no test files are given; Cole et al.'s "
            "seeded split, seed 1200). Image ids are 'row<i>' (input row i) for held-out splits "
            "and 'train<i>'/'test<i>' otherwise.",
            _STORE_LAYOUT,
        ),
        epilog="examples:\n"
        "  spml import arrays --features X.npy --labels Y.npy --name mydata --out my.zarr\n"
        "  spml import arrays --features Xtr.npy --labels Ytr.npy --test-features Xte.npy \\\n"
        "      --test-labels Yte.npy --class-names classes.txt --name mydata --out my.zarr",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--features", required=True, metavar="F.npy", help="(N, D) features")
    p.add_argument("--labels", required=True, metavar="L.npy", help="(N, C) 0/1 labels")
    p.add_argument("--test-features", metavar="F2.npy", help="(M, D) test features")
    p.add_argument("--test-labels", metavar="L2.npy", help="(M, C) 0/1 test labels")
    p.add_argument(
        "--test-fraction",
        type=_fraction,
        help="hold out this fraction of the rows as the test set (default 0.2 without test files)",
    )
    p.add_argument(
        "--class-names", metavar="FILE", help="C class names, one per line (default class_0 …)"
    )
    p.add_argument("--name", required=True, help="dataset name recorded in the store")
    _common(p)
    p.set_defaults(func=_cmd_import_arrays)

    p = isub.add_parser(
        "yeast",
        help="the MULAN yeast set shipped inside the river package (2,417 x 103, 14 labels)",
        description=_wrap(
            "Import the real multi-label yeast set (Elisseeff & Weston 2001; 2,417 genes x 103 "
            "features, 14 functional classes) from river/datasets/yeast.csv.gz -- no network "
            "needed, but the river package must be installed (pip install 'spml-probe[yeast]'). "
            "The csv has no official test split: --test-fraction of the rows (default 0.2) are "
            "held out with a seeded random split (seed 1200), recorded in the store's "
            "'test_split' attribute; the remaining pool is split 80/20 into train/val.",
            _STORE_LAYOUT,
        ),
        epilog="example:\n  spml import yeast --out stores/yeast.zarr\n"
        "  spml info stores/yeast.zarr",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--test-fraction",
        type=_fraction,
        default=TEST_FRACTION,
        help="fraction of rows held out as the test set (default: 0.2)",
    )
    _common(p)
    p.set_defaults(func=_cmd_import_yeast)

    p = sub.add_parser(
        "info",
        help="show what a feature store holds (sizes, splits, labels, provenance)",
        description=_wrap(
            "Validate a feature store and print its dataset, shapes, per-split sizes, label "
            "cardinality, classes with no positive per split (their AP is 0), rows without a "
            "positive, single-positive seeds, disk size and provenance."
        ),
        epilog="examples:\n  spml info stores/voc.zarr\n"
        "  spml info stores/voc.zarr --json | jq .splits",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", metavar="STORE", help="feature store directory")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser(
        "draw",
        help="add single-positive draws (other seeds of the protocol) to a store",
        description=_wrap(
            "Add observed/<seed> arrays to a complete store: docs/protocol.md step 2 re-run with "
            "other seeds, each phase re-seeded. The literature's draw is seed 1200; other draws "
            "let 'spml study confirm --observed-seeds' report mean ± std over draws. Draws "
            "already in the store are kept as they are."
        ),
        epilog="example:\n  spml draw stores/coco.zarr --seeds 1,2,3",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", metavar="STORE", help="feature store directory")
    p.add_argument("--seeds", required=True, metavar="S1,S2,...", help="seeds to add")
    p.set_defaults(func=_cmd_draw)
