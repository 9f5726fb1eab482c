"""``spml import {cole,arrays,yeast,arff,mat,priors}``: build a feature store from features computed
elsewhere, or add a prior scored elsewhere to one; thin layers over :mod:`featurize.imports` and
:mod:`featurize.priors.files`, imported when a command runs."""

from __future__ import annotations

import argparse

from featurize.cli import DTYPES, add_command, check_before_writing
from probe.cli.args import add_seeds_argument, parse_seeds, wrap

__all__ = ["register_cli"]

TEST_FRACTION = 0.2  # = featurize.imports.DEFAULT_TEST_FRACTION (a test checks they agree)

_STORE_LAYOUT = (
    "The store is a Zarr v3 directory: features (N, D), labels (N, C), single positives "
    "observed/1200 (Cole et al.'s seed, drawn per phase), split (train/val: 80/20 of the pool with "
    "seed 1200; test), image ids and provenance. An interrupted import is resumed by running the "
    "same command again.")


def _common(parser: argparse.ArgumentParser) -> None:
    """The options and the command of every feature import (cole, arrays, yeast)."""
    parser.add_argument("--out", required=True, metavar="STORE", help="output store directory")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="float16",
        help="feature storage type (default: float16, half the disk and memory; float32 keeps "
        "full precision)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing store at --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_seeds_argument(parser)
    parser.set_defaults(func=_cmd_import)


def _cmd_import(args: argparse.Namespace) -> int:
    from featurize import imports
    from probe.store import add_draws

    check_before_writing(args)
    common = {"dtype": args.dtype, "overwrite": args.overwrite, "progress": not args.quiet}
    if args.import_source == "cole":
        store = imports.import_cole(args.dir, args.dataset, args.out, block_rows=args.block_rows,
                                    class_names_file=args.class_names, **common)
    elif args.import_source == "arrays":
        store = imports.import_array_files(args.out, args.features, args.labels, name=args.name,
                                           test_features_path=args.test_features,
                                           test_labels_path=args.test_labels,
                                           test_fraction=args.test_fraction,
                                           class_names_path=args.class_names,
                                           split=args.split, **common)
    elif args.import_source == "mat":
        store = imports.import_mat(args.out, args.mat, name=args.name, **common)
        print(f"{args.mat}: row indices read as {store.attrs['test_split']['index_base']}-based")
    elif args.import_source == "arff":
        store = imports.import_arff(args.out, args.arff, args.xml, name=args.name,
                                    test_fraction=args.test_fraction, split=args.split, **common)
    else:
        store = imports.import_yeast(args.out, test_fraction=args.test_fraction,
                                     split=args.split, **common)
    add_draws(store.path, parse_seeds(args.seeds))
    sizes = " / ".join(f"{name} {len(store.split(name))}" for name in ("train", "val", "test"))
    print(f"wrote {store.path}: {store.dataset}, {store.n_rows} rows ({sizes}), "
          f"{store.n_classes} classes, {store.feature_dim}-dim {store.dtype} features. "
          f"'spml info {store.path}' shows more.")
    return 0


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {text}")
    return value


def _split(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"three fractions TRAIN,VAL,TEST such as 0.8,0.1,0.1; got {text!r}") from None
    from featurize.imports import check_split
    from probe.errors import SpmlError

    try:
        check_split(values)
    except SpmlError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--split: ")) from None
    return values


def _split_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--split", type=_split, default=None, metavar="TRAIN,VAL,TEST",
        help="split all rows into train/val/test by these fractions (seed 1200), e.g. "
        "0.8,0.1,0.1 as the tabular SPML benchmark (SMILE, CRISP); instead of --test-fraction "
        "(whose pool is split 80/20 into train/val)")


def _held_out_options(parser: argparse.ArgumentParser) -> None:
    """--test-fraction or --split, and the common options (yeast, arff)."""
    parser.add_argument(
        "--test-fraction", type=_fraction, default=None,
        help=f"fraction of rows held out as the test set (default: {TEST_FRACTION})")
    _split_argument(parser)
    _common(parser)


def register_cli(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    """Add ``spml import`` and its sources ``cole``, ``arrays``, ``yeast`` and ``priors``."""
    imp = add_command(
        sub, "import", help="build a feature store from precomputed features (no backbone run)",
        description=wrap("Build a feature store from features computed elsewhere.", _STORE_LAYOUT),
        epilog="examples:\n"
        "  spml import cole data/coco --dataset coco --out stores/coco-cole.zarr\n"
        "  spml import arrays --features X.npy --labels Y.npy --name mydata --out my.zarr\n"
        "  spml import yeast --out stores/yeast.zarr")
    isub = imp.add_subparsers(dest="import_source", metavar="SOURCE", required=True)

    p = add_command(
        isub, "cole",
        help="Cole et al. (2021)'s released ResNet-50 features and formatted labels",
        description=wrap(
            "Import Cole et al.'s released files from one dataset directory: "
            "formatted_{train,val}_labels.npy, formatted_{train,val}_images.npy and "
            "{train,val}_features_imagenet_resnet50.npy (their 'val' is our test phase; rows "
            "keep the files' order; there are no flipped features). Class names: VOC/COCO "
            "standard orders; NUS-WIDE from Concepts81.txt if present (else the alphabetical "
            "81 concepts); CUB from attributes.txt (or --class-names). If the directory holds "
            "their formatted_*_labels_obs.npy, our seed-1200 draw is compared with it and the "
            "result recorded in the provenance.",
            _STORE_LAYOUT),
        epilog="example:\n  spml import cole data/pascal --dataset voc --out stores/voc-cole.zarr")
    p.add_argument("dir", metavar="DIR", help="directory holding Cole et al.'s .npy files")
    p.add_argument(
        "--dataset", required=True, choices=("voc", "coco", "nus", "cub"),
        help="which dataset the files are (sets the class names and image folder; Cole et "
        "al.'s 'pascal' is voc, 'nuswide' is nus)")
    p.add_argument("--class-names", metavar="FILE",
                   help="class names, one per line, overriding the defaults above")
    p.add_argument("--block-rows", type=int, default=1024,
                   help="rows per store chunk / write block (default: 1024)")
    _common(p)

    p = add_command(
        isub, "arrays",
        help="any (N, D) feature matrix with an (N, C) 0/1 label matrix (.npy files)",
        description=wrap(
            "Import any features with a multi-label 0/1 matrix, one row per sample, as .npy "
            "files. Test rows come from --test-features/--test-labels, or are held out from the "
            "rows with --test-fraction (default 0.2 when no test files are given; Cole et al.'s "
            "seeded split, seed 1200). Image ids are 'row<i>' (input row i) for held-out splits "
            "and 'train<i>'/'test<i>' otherwise.",
            _STORE_LAYOUT),
        epilog="examples:\n"
        "  spml import arrays --features X.npy --labels Y.npy --name mydata --out my.zarr\n"
        "  spml import arrays --features Xtr.npy --labels Ytr.npy --test-features Xte.npy \\\n"
        "      --test-labels Yte.npy --class-names classes.txt --name mydata --out my.zarr")
    p.add_argument("--features", required=True, metavar="F.npy", help="(N, D) features")
    p.add_argument("--labels", required=True, metavar="L.npy", help="(N, C) 0/1 labels")
    p.add_argument("--test-features", metavar="F2.npy", help="(M, D) test features")
    p.add_argument("--test-labels", metavar="L2.npy", help="(M, C) 0/1 test labels")
    p.add_argument(
        "--test-fraction", type=_fraction,
        help="hold out this fraction of the rows as the test set (default 0.2 without test files)")
    _split_argument(p)
    p.add_argument(
        "--class-names", metavar="FILE", help="C class names, one per line (default class_0 …)")
    p.add_argument("--name", required=True, help="dataset name recorded in the store")
    _common(p)

    p = add_command(
        isub, "yeast",
        help="the MULAN yeast set shipped inside the river package (2,417 x 103, 14 labels)",
        description=wrap(
            "Import the real multi-label yeast set (Elisseeff & Weston 2001; 2,417 genes x 103 "
            "features, 14 functional classes) from river/datasets/yeast.csv.gz -- no network "
            "needed, but the river package must be installed (pip install 'spml-probe[yeast]'). "
            "The csv has no official test split: --test-fraction of the rows (default 0.2) are "
            "held out with a seeded random split (seed 1200), recorded in the store's "
            "'test_split' attribute; the remaining pool is split 80/20 into train/val.",
            _STORE_LAYOUT),
        epilog="example:\n  spml import yeast --out stores/yeast.zarr\n"
        "  spml info stores/yeast.zarr")
    _held_out_options(p)

    p = add_command(
        isub, "mat",
        help="SMILE's released .mat dataset files (X, Y, tr_idx, va_idx, te_idx)",
        description=wrap(
            "Import a dataset file of palm-ml/smile: X (features), Y (0/1 labels) and the row "
            "indices tr_idx, va_idx, te_idx (1-based or 0-based; detected and printed). te_idx "
            "is the test set; tr_idx + va_idx the pool, split into train/val by the seeded draw "
            "at the file's val share. Y_obs is not used: single positives are drawn per seed. "
            "MATLAB v7.3 (HDF5) files need h5py.", _STORE_LAYOUT),
        epilog="example:\n  spml import mat yeast.mat --out stores/yeast-smile.zarr")
    p.add_argument("mat", metavar="FILE.mat", help="the .mat file")
    p.add_argument("--name", default=None, help="dataset name (default: the file's stem)")
    _common(p)

    p = add_command(
        isub, "arff",
        help="a MULAN multi-label set: its ARFF file (dense or sparse) and label XML",
        description=wrap(
            "Import a MULAN set (scene, corel5k, mirflickr, delicious, ...) from its ARFF file "
            "and the XML naming its label attributes; every other attribute is a numeric "
            "feature. Split as 'spml import yeast' (--test-fraction, or --split 0.8,0.1,0.1 "
            "for the tabular SPML benchmark).", _STORE_LAYOUT),
        epilog="example:\n  spml import arff scene.arff --xml scene.xml --split 0.8,0.1,0.1 "
        "--out stores/scene.zarr")
    p.add_argument("arff", metavar="FILE.arff", help="the MULAN ARFF file")
    p.add_argument("--xml", required=True, metavar="FILE.xml", help="MULAN's label XML")
    p.add_argument("--name", default=None, help="dataset name (default: the ARFF file's stem)")
    _held_out_options(p)

    _register_import_priors(isub)


# ----------------------------------------------------------------------------- spml import priors


def _key_file(text: str) -> tuple[str, str]:
    key, sep, path = text.partition("=")
    if not sep or not key or not path:
        raise argparse.ArgumentTypeError(
            f"expected NAME=FILE (e.g. tile_max=max.npy); got {text!r}")
    return key, path


def _tiles(text: str) -> tuple[int, int]:
    from featurize.priors.files import parse_tiles  # the one form, shared with spml priors

    try:
        return parse_tiles(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--tiles: ")) from None


def _cmd_import_priors(args: argparse.Namespace) -> int:
    from featurize.priors.files import import_priors, tiles_text

    provenance = {"model": args.model, "prompt_template": args.prompt_template,
                  "temperature": args.temperature, "tiles": tiles_text(args.tiles)}
    prior = import_priors(args.store, args.name, args.from_path, extras=dict(args.extra or []),
                          provenance=provenance, class_names_path=args.class_names,
                          overwrite=args.overwrite)
    n, c = prior.scores.shape
    extras = f" and extras {', '.join(sorted(prior.extras))}" if prior.extras else ""
    print(f"wrote prior {prior.name!r} to {args.store}: {n} rows x {c} classes{extras}. "
          f"Train with it: spml probe {args.store} --loss vlpl --priors {prior.name}")
    return 0


def _register_import_priors(isub: argparse._SubParsersAction) -> None:
    p = add_command(
        isub, "priors",
        help="per-image class scores (CLIP, a teacher) into a store's priors/<name>",
        description=wrap(
            "Store per-image class scores computed elsewhere as a named prior of a complete "
            "store, for the losses that use one (spml probe --loss vlpl|gpr --priors NAME; "
            "docs/priors.md). --from is an (N, C) .npy matrix in the store's row and class "
            "order, or a .csv/.parquet table with one column per class name (any order) and "
            "optionally an image_id column matching the store's image ids. The scores must "
            "cover every store row (train, val and test), be finite, and (with --class-names) "
            "be in the store's class order; a refused prior leaves the store untouched. The "
            "prior is checksummed like the features and listed by 'spml info'."),
        epilog="examples:\n"
        "  spml import priors stores/coco.zarr --name clip --from clip_scores.npy \\\n"
        "      --model openai/clip-vit-large-patch14-336 --temperature 0.01\n"
        "  spml import priors stores/coco.zarr --name damp --from global.npy \\\n"
        "      --extra tile_max=tmax.npy --extra tile_min=tmin.npy --tiles 4x4")
    p.add_argument("store", metavar="STORE", help="a complete feature store")
    p.add_argument("--name", required=True, help="the prior's name (e.g. clip)")
    p.add_argument("--from", dest="from_path", required=True, metavar="FILE",
                   help="the scores: .npy (N, C), .csv or .parquet (columns = class names)")
    p.add_argument("--extra", action="append", type=_key_file, metavar="NAME=FILE",
                   help="an extra (N, C) array in the same format, e.g. DAMP's per-class "
                   "tile_max, tile_min and tile_mean over the tiles, with the global scores as "
                   "--from (repeatable)")
    p.add_argument("--class-names", metavar="FILE",
                   help="the .npy columns' class names, one per line (checked against the "
                   "store's order)")
    p.add_argument("--model", help="provenance: the model that scored the images")
    p.add_argument("--prompt-template", "--prompt", dest="prompt_template",
                   help="provenance: the text prompt, e.g. 'a photo of a {}.'")
    p.add_argument("--temperature", type=float, help="provenance: the softmax temperature")
    p.add_argument("--tiles", type=_tiles, metavar="K|RxC",
                   help="provenance: the tile grid, 4 or 4x4 (as spml priors --tiles)")
    p.add_argument("--overwrite", action="store_true", help="replace a prior of the same name")
    p.set_defaults(func=_cmd_import_priors)
