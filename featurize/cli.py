"""``spml featurize``, ``spml import {cole,arrays,yeast,priors}``, ``spml info``, ``spml verify``,
``spml draw`` and ``spml bench featurize``: thin layers over :mod:`featurize.runner`,
:mod:`featurize.imports`, :mod:`featurize.bench` and :mod:`probe.store`, imported when a command
runs (``spml --help`` loads neither torch nor zarr)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap
from typing import TYPE_CHECKING, Any

from featurize.specs import (
    BACKBONES,
    DECODE_CHOICES,
    DEFAULT_BACKBONE,
    EMBED_CHOICES,
    FAMILIES,
    PRECISION_CHOICES,
    RANDOM,
    TRANSFORM_CHOICES,
)
from probe.cliargs import add_device_argument, add_seeds_argument, parse_seeds, wrap
from probe.errors import SpmlError

if TYPE_CHECKING:
    from probe.store import Store

DTYPES = ("float16", "float32")  # = probe.store.DTYPES (a test checks they agree)
TEST_FRACTION = 0.2  # = featurize.imports.DEFAULT_TEST_FRACTION (a test checks they agree)
BAD_SHOWN = 20  # unreadable images listed after a run (the rest are counted)

_FAMILY_LINES = "".join(
    f"    {f.prefix + ':' + f.syntax:<36} e.g. {f.example}\n"
    f"    {'':<36} (pip install -e '.[{f.extra}]')\n"
    for f in FAMILIES.values()
)
_FEATURIZE_EPILOG = f"""\
what it does (docs/protocol.md steps 6-7):
  every image of the dataset (official train split = pool rows, then the test split) is resized
  to SIZExSIZE (default 448; bilinear, antialias, aspect not kept, no crop), normalised with the
  backbone's mean/std (ImageNet's for torchvision models), run through the frozen backbone, and
  its global-average-pooled features are stored; so are those of the horizontally flipped image
  (the protocol's only augmentation), unless --no-flip.

weights (never downloaded unless you say --download):
  default       the backbone's standard ImageNet weights: torchvision's IMAGENET1K_V1 file from
                the torch hub cache ($TORCH_HOME/hub/checkpoints, e.g. resnet50-0676ba61.pth);
                for efficientnet_lite0 the file inside its pip package (works offline)
  NAME          another torchvision weights name, e.g. imagenet1k_v2
  PATH          a state_dict file for the backbone's architecture
  random        seeded random weights (--weights-seed): tests and speed only, marked in the store
  The weights file's sha256 is recorded in the store.

backbones (default {DEFAULT_BACKBONE}; 'spml backbones' says which families are installed):
{textwrap.fill(", ".join(BACKBONES), width=94, initial_indent="  ", subsequent_indent="  ")}
  or any torchvision classification model name (pooled features = its classifier's input),
  or a library-qualified name, with the model's own preprocessing (--transform protocol for
  the SIZExSIZE one) and weights from the library's cache, downloaded on first use
  (docs/backbones.md):
{_FAMILY_LINES}
speed: the GPU fast path -- images decoded on the GPU (nvJPEG, batched; CPU fallback for
  grayscale, CMYK, PNG, …), bf16 autocast, channels_last, pinned host buffers -- is written but
  has NEVER RUN ON A GPU, so it is off unless asked for: --decode torchvision --precision bf16.
  By default (auto) CUDA runs the reference preprocessing (PIL decode, fp32). Reader threads
  prefetch, a writer thread stores blocks. On a CPU it works, slowly (~1 s/image for ResNet-50
  at 448 on 2 cores).

several GPUs or machines: run the same command under torchrun, e.g.
  torchrun --nproc-per-node 4 -m studies.cli featurize coco --root ~/data/coco --out s.zarr
  Rank r featurizes blocks r, r+N, … of one store on cuda:<LOCAL_RANK> (the store must be on a
  file system every machine sees); rank 0 marks it complete when all are done, and prints the
  summary. An interrupted run resumes with the same command (any number of ranks).

folder (your own images): --root holds the images and labels.csv (or labels.jsonl; another
  file with --option annotations=PATH). labels.csv has one row per image, columns
  path,labels[,split]: path relative to --root (or absolute), the image's labels joined by ';',
  and optionally split = train or test (then on every row; without it a seeded 20% test split,
  --option test_fraction=F). A header row naming the columns is optional. For example:
      path,labels,split
      img/001.jpg,cat;dog,train
      img/002.jpg,dog,test
  labels.jsonl: one {{"path": ..., "labels": [...], "split": ...}} object a line. Classes are
  the sorted labels seen (or --option classes=FILE, one name a line); a row without labels is
  an error (--option empty=keep|drop).

resume: an interrupted run is continued by running the same command again (blocks of
  --block-rows rows are the unit); a store made with another backbone, weights or transform is
  refused. Unreadable images stop the run naming the file; with --skip-bad they get zero
  features and are listed in the store's bad_rows attribute.

examples:
  spml featurize voc --root ~/data/pascal --out stores/voc_resnet50.zarr
  spml featurize coco --root ~/data/coco --out stores/coco.zarr --batch-size 512
  spml featurize folder --root ~/photos --out stores/mine.zarr      # ~/photos/labels.csv
  spml featurize folder --root ~/photos --option annotations=$HOME/photos/a.jsonl --out s.zarr
  spml featurize voc --root ~/data/pascal --out /tmp/voc_lite0.zarr --backbone efficientnet_lite0
  spml featurize voc --root ~/data/pascal --out /tmp/t.zarr --weights random --size 224
"""

_BENCH_EPILOG = """\
Writes synthetic photo-like JPEGs (default 640x480, quality 90, COCO-like) to a temporary
folder; prints decode images/s (read + decode + resize + normalise alone), forward images/s
(the forward passes alone, with the flipped image) and end-to-end images/s (the real pipeline
into a temporary store), each after an untimed warm-up, with the machine and its load, as a
table and as JSON. Random weights by default.

examples:
  spml bench featurize                               # CUDA if available, 4096 images
  spml bench featurize --device cpu --images 16 --size 224
  spml bench featurize --device cuda --decode torchvision --precision bf16   # the GPU target
                                                     # (one H100: 1,323 images/s, README)
"""


def _option_value(text: str) -> Any:
    """``--option`` values: JSON scalars (numbers, true/false/null) or plain strings."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, (int, float, bool)) or value is None else text


def _dataset_options(pairs: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SpmlError(
                f"--option expects KEY=VALUE (e.g. annotations=labels.csv), got {pair!r}"
            )
        out[key.strip().replace("-", "_")] = _option_value(value)
    return out


def _add_run_options(p: argparse.ArgumentParser, default_weights: str | None) -> None:
    """Options shared by featurize and its benchmark (model, images, compute)."""
    model = p.add_argument_group("model")
    model.add_argument(
        "--backbone",
        default=DEFAULT_BACKBONE,
        help=f"backbone name (default: {DEFAULT_BACKBONE}), or timm:<model>, "
        "open_clip:<arch>/<pretrained>, hf:<repo id> (--list-backbones)",
    )
    model.add_argument(
        "--list-backbones",
        action=_ListBackbones,
        help="say which backbone families are installed and how to add the others, and exit",
    )
    model.add_argument(
        "--embed",
        choices=EMBED_CHOICES,
        default="auto",
        help="which embedding: auto (default) = the family's (CLIP: projected, others: pooled); "
        "pooled, projected (CLIP's image embedding), mean (of the patch tokens, hf:)",
    )
    model.add_argument(
        "--weights",
        default=default_weights,
        metavar="WEIGHTS",
        help="default | a torchvision weights name | PATH (.pth, .pt, .safetensors) | random "
        "(default: "
        + (default_weights or "the backbone's standard ImageNet weights")
        + ")",
    )
    model.add_argument(
        "--weights-seed", type=int, default=0, help="seed of --weights random (default: 0)"
    )
    model.add_argument(
        "--download",
        action="store_true",
        help="fetch missing torchvision weights into the torch hub cache (needs "
        "internet; off by default)",
    )
    images = p.add_argument_group("images")
    images.add_argument(
        "--transform",
        choices=TRANSFORM_CHOICES,
        default="auto",
        help="auto (default): the model's own preprocessing for timm:/open_clip:/hf: "
        "backbones, the protocol's for the others; model; protocol = SIZExSIZE resize, no crop",
    )
    images.add_argument(
        "--size",
        type=int,
        default=None,
        help="square input size of --transform protocol in pixels (default: 448, the "
        "protocol's)",
    )
    images.add_argument(
        "--decode",
        choices=DECODE_CHOICES,
        default="auto",
        help="auto (default): pil; pil = the reference preprocessing exactly; torchvision = "
        "torchvision decode (nvJPEG on CUDA) + torch resize: the fast path, 6.6x the reference's "
        "images/s on an H100",
    )
    compute = p.add_argument_group("compute")
    add_device_argument(compute)
    compute.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="images per forward (default: 256 on CUDA, 16 on CPU)",
    )
    compute.add_argument(
        "--precision",
        choices=PRECISION_CHOICES,
        default="auto",
        help="auto (default): fp32; bf16 = autocast + channels_last on CUDA (the fast path; "
        "features within cosine 0.999 of fp32's)",
    )
    compute.add_argument(
        "--workers",
        type=int,
        default=None,
        help="image reader threads (default: min(16, CPU count))",
    )
    compute.add_argument(
        "--no-flip",
        dest="with_flip",
        action="store_false",
        help="skip the flipped-image features (half the compute)",
    )


def _config(args: argparse.Namespace, **extra: Any) -> Any:
    from featurize.runner import FeaturizeConfig

    return FeaturizeConfig(
        backbone=args.backbone,
        weights=args.weights,
        weights_seed=args.weights_seed,
        download=args.download,
        size=args.size,
        transform=args.transform,
        embed=args.embed,
        device=args.device,
        batch_size=args.batch_size,
        decode=args.decode,
        precision=args.precision,
        with_flip=args.with_flip,
        workers=args.workers,
        **extra,
    )


class _ListBackbones(argparse.Action):
    """``--list-backbones``: print the families and exit (like ``--version``)."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from featurize.backbones import describe_families

        print(describe_families())
        parser.exit()


def _cmd_backbones(args: argparse.Namespace) -> int:
    from featurize.backbones import describe_families, family_status

    print(json.dumps(family_status(), indent=2) if args.json else describe_families())
    return 0


def _before_writing(args: argparse.Namespace) -> None:
    """The checks a featurize/import makes before it writes anything: the draws' seeds parse
    and ``--out`` can be written (its real cause named: permission, a virtual file system)."""
    from probe.io import check_writable

    parse_seeds(args.seeds)
    check_writable(args.out, "--out")


def _cmd_featurize(args: argparse.Namespace) -> int:
    from featurize.runner import distributed_from_env, featurize_dataset

    _before_writing(args)

    config = _config(
        args,
        dtype=args.dtype,
        block_rows=args.block_rows,
        skip_bad=args.skip_bad,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    options = _dataset_options(args.dataset_options)
    if args.skip_bad and args.dataset in ("folder", "coco", "cub"):
        options.setdefault("check_images", False)  # missing images become bad rows
    with distributed_from_env() as ranks:  # under torchrun: one rank of several
        result = featurize_dataset(args.dataset, args.root, args.out, config, **options)
    if ranks.rank != 0:
        return 0  # rank 0 reports for the whole run
    add_draws(str(result.store_path), args.seeds)
    summary = {
        **{k: v for k, v in dataclasses.asdict(result).items() if k != "bad_rows"},
        "store_path": str(result.store_path),
        "n_bad_rows": len(result.bad_rows),
        "bad_rows": result.bad_rows[:BAD_SHOWN],
    }
    if args.json:
        from probe.results import versioned

        print(json.dumps(versioned(summary), indent=2))
    else:
        resumed = f", {result.blocks_resumed} blocks already done" if result.blocks_resumed else ""
        print(
            f"wrote {result.store_path}: {result.n_rows} images ({result.rows_done} featurized "
            f"now{resumed}) with {result.backbone} [{result.weights}] on {result.device}, "
            f"{result.images_per_s:.1f} images/s. 'spml info {result.store_path}' shows more."
        )
        if result.bad_rows:
            print(f"{len(result.bad_rows)} unreadable images got zero features (store "
                  "attribute bad_rows):")
            for row in result.bad_rows[:BAD_SHOWN]:
                print(f"  {row['path']}: {row['error']}")
            if len(result.bad_rows) > BAD_SHOWN:
                print(f"  ... and {len(result.bad_rows) - BAD_SHOWN} more ('spml info "
                      f"{result.store_path}' lists them all)")
    if args.weights == RANDOM:
        print(
            f"WARNING: random weights (seed {args.weights_seed}) -- these features are NOT "
            "pretrained; use them for tests and speed measurements only"
        )
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from featurize.bench import BenchConfig, bench_featurize

    try:
        width, height = (int(v) for v in args.image_size.lower().split("x"))
    except ValueError:
        raise SpmlError(
            f"--image-size expects WIDTHxHEIGHT, e.g. 500x375; got {args.image_size!r}"
        ) from None
    config = BenchConfig(
        featurize=_config(args, progress=not args.quiet and not args.json),
        n_images=args.images,
        width=width,
        height=height,
    )
    result = bench_featurize(config)
    if not args.json:
        width_key = max(len(k) for k in result)
        for key, value in result.items():
            print(f"{key:<{width_key}}  {value}")
    from probe.results import versioned

    print(json.dumps(versioned(result)))
    return 0


def _register_featurize(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction
                        ) -> None:
    """``spml featurize`` and ``spml bench featurize``."""
    p = sub.add_parser(
        "featurize",
        help="run a frozen backbone over a dataset once, into a feature store",
        description="Featurize a dataset with a frozen backbone (default: torchvision ResNet-50, "
        "IMAGENET1K_V1, 448x448, 2048-d pooled features + flipped-image features) into a Zarr "
        "feature store with labels, the SPML protocol's single positives and splits.",
        epilog=_FEATURIZE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "dataset", metavar="DATASET", help="dataset adapter: voc, coco, nus, cub, folder, cole"
    )
    p.add_argument("--root", required=True, help="the dataset's folder as distributed")
    p.add_argument("--out", required=True, metavar="STORE", help="output store directory")
    p.add_argument(
        "--option",
        action="append",
        dest="dataset_options",
        metavar="KEY=VALUE",
        help="adapter option, repeatable (e.g. annotations=labels.csv for folder, "
        "dataset=coco for cole)",
    )
    _add_run_options(p, default_weights=None)
    store = p.add_argument_group("store")
    store.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float16",
        help="feature storage type (default: float16)",
    )
    store.add_argument(
        "--block-rows",
        type=int,
        default=1024,
        help="rows per chunk, the unit of resume (default: 1024)",
    )
    store.add_argument(
        "--skip-bad",
        action="store_true",
        help="store zero features for unreadable images and list them in the "
        "store's bad_rows, instead of stopping",
    )
    store.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing store at --out instead of resuming it",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_seeds_argument(p)
    p.add_argument("--json", action="store_true", help="print the run summary as JSON")
    p.set_defaults(func=_cmd_featurize)

    p = sub.add_parser(
        "backbones",
        help="which backbone families (torchvision, timm, OpenCLIP, Hugging Face) are installed",
        description="List the backbone families of 'spml featurize --backbone', whether each "
        "is installed (and how to add it: pip install -e '.[timm]', '.[clip]', '.[hf]'), and "
        "the registry names. The same as 'spml featurize --list-backbones'. docs/backbones.md "
        "describes the preprocessing, the embeddings and what a store records.",
    )
    p.add_argument("--json", action="store_true", help="print the families as JSON")
    p.set_defaults(func=_cmd_backbones)

    b = bench.add_parser(
        "featurize",
        help="images/s of the featurize pipeline on synthetic JPEGs",
        description="Measure featurize throughput (images/s) for a device, batch size and "
        "decode path.",
        epilog=_BENCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument(
        "--images",
        type=int,
        default=None,
        help="images to featurize (default: 4096 on CUDA, 24 on CPU)",
    )
    b.add_argument(
        "--image-size",
        default="640x480",
        metavar="WxH",
        help="synthetic JPEG size (default: 640x480, a typical COCO photo)",
    )
    _add_run_options(b, default_weights=RANDOM)
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.add_argument("--json", action="store_true", help="print only the JSON line")
    b.set_defaults(func=_cmd_bench)


_STORE_LAYOUT = (
    "The store is a Zarr v3 directory: features (N, D), labels (N, C), single positives "
    "observed/1200 (Cole et al.'s seed, drawn per phase), split (train/val: 80/20 of the pool with "
    "seed 1200; test), image ids and provenance. An interrupted import is resumed by running the "
    "same command again."
)


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


def add_draws(path: str, seeds_text: str, *, k: int = 1, fraction: float = 1.0) -> list[int]:
    """Add the draws ``seeds_text`` names (``"1200,1,2"``) to a complete store: single
    positives (the protocol), or ``k`` positives on a ``fraction`` of the images (a label
    budget); draws already there are kept. Returns the store's seeds."""
    from probe.store import add_observed_seed, open_store

    for seed in parse_seeds(seeds_text):
        add_observed_seed(path, seed, k=k, fraction=fraction)
    return open_store(path).observed_seeds()


def _report(store: Store, seeds_text: str) -> None:
    add_draws(str(store.path), seeds_text)
    sizes = " / ".join(f"{name} {len(store.split(name))}" for name in ("train", "val", "test"))
    print(
        f"wrote {store.path}: {store.dataset}, {store.n_rows} rows ({sizes}), "
        f"{store.n_classes} classes, {store.feature_dim}-dim {store.dtype} features. "
        f"'spml info {store.path}' shows more."
    )


def _cmd_import_cole(args: argparse.Namespace) -> int:
    from featurize import imports

    _before_writing(args)

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

    _before_writing(args)

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

    _before_writing(args)

    store = imports.import_yeast(
        args.out,
        dtype=args.dtype,
        test_fraction=args.test_fraction,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    _report(store, args.seeds)
    return 0


def _read_class_weights(path: str, class_names: list[str]) -> list[float]:
    """``--class-weights``: C numbers, one per line in the store's class order, or
    ``name weight`` lines naming every class once."""
    from pathlib import Path

    lines = [ln.split() for ln in Path(path).read_text(encoding="utf-8").splitlines()
             if ln.strip()]
    try:
        if lines and all(len(p) >= 2 for p in lines):
            named = {" ".join(p[:-1]): float(p[-1]) for p in lines}
            missing = [c for c in class_names if c not in named]
            if missing or len(named) != len(class_names):
                raise SpmlError(f"--class-weights {path}: 'name weight' lines must name each of "
                                f"the store's {len(class_names)} classes once; missing "
                                f"{missing[:5]}")
            return [named[c] for c in class_names]
        return [float(p[0]) for p in lines]
    except ValueError as err:
        raise SpmlError(f"--class-weights {path}: not a number ({err})") from None


def _cmd_draw(args: argparse.Namespace) -> int:
    from probe.store import open_store

    if args.bias is not None:
        return _biased_draws(args)
    if args.class_weights is not None:
        raise SpmlError("--class-weights goes with --bias semantic")
    seeds = add_draws(args.store, args.seeds, k=args.k, fraction=args.fraction)
    print(f"{args.store}: draws for seeds {seeds}")
    budgets = open_store(args.store).summary()["observed_budgets"]
    for seed, b in budgets.items():
        print(f"  draw {seed}: k={b['k']} positives per image on {100 * b['fraction']:g}% of "
              "the images (label budget)")
    return 0


def _biased_draws(args: argparse.Namespace) -> int:
    from probe.errors import MissingPathError
    from probe.store import add_biased_draw, open_store

    if args.k != 1 or args.fraction != 1.0:
        raise SpmlError("--bias draws one positive per image: drop --k / --fraction")
    store = open_store(args.store)
    weights = None
    if args.class_weights is not None:
        from pathlib import Path

        if not Path(args.class_weights).is_file():
            raise MissingPathError(f"--class-weights: file {args.class_weights} not found")
        weights = _read_class_weights(args.class_weights, store.class_names)
    for seed in parse_seeds(args.seeds):
        add_biased_draw(args.store, seed, args.bias, weights)
        print(f"{args.store}: draw {seed} with {args.bias} bias (train on it with "
              f"--observed-seed {seed})")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from probe.store import open_store

    summary = open_store(args.store).summary()
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from probe.store import verify_store
    from probe.store.chunks import chunk_label, repair_hint

    report = verify_store(args.store)
    n_chunks = sum(a["chunks"] for a in report.arrays.values())
    for d in report.damaged:
        print(f"DAMAGED {d.array} chunk {chunk_label(d.chunk)}: {d.reason}")
    if report.unchecksummed:
        print(
            f"note: arrays {report.unchecksummed} carry no checksums (written before spml-probe "
            "stored them): a chunk damaged without changing its length cannot be detected there; "
            "re-create the store (featurize/import with --overwrite) to add them"
        )
    if report.damaged:
        print(f"{report.path}: {len(report.damaged)} of {n_chunks} chunks damaged; "
              f"{repair_hint(report.path)}")
        return 1
    print(f"{report.path}: all {n_chunks} chunks of {len(report.arrays)} arrays read back as "
          "written")
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
        f"positives   single-positive draws for seeds {s['observed_seeds']}"
        + "".join(f"; draw {seed}: k={b['k']} on {100 * b['fraction']:g}% of the images"
                  for seed, b in s.get("observed_budgets", {}).items()),
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
    for name, rec in s.get("priors", {}).items():  # probe.store.priors
        prov = rec["provenance"]
        extras = f", extras {rec['extras']}" if rec["extras"] else ""
        lines.append(f"prior       {name}: model {prov.get('model')}, temperature "
                     f"{prov.get('temperature')}, tiles {prov.get('tiles')}{extras}; source "
                     f"{prov.get('source')}")
    if s["other_attrs"]:
        lines += ["", "attributes"]
        lines += [f"  {k}: {_flat(v)}" for k, v in s["other_attrs"].items()]
    lines += ["", "provenance"]
    lines += [f"  {k}: {_flat(v)}" for k, v in s["provenance"].items()]
    return "\n".join(lines)


def register_cli(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    """Add ``spml featurize``, ``spml import …``, ``spml info``, ``spml draw`` and
    ``spml bench featurize``."""
    _register_featurize(sub, bench)
    imp = sub.add_parser(
        "import",
        help="build a feature store from precomputed features (no backbone run)",
        description=wrap("Build a feature store from features computed elsewhere.", _STORE_LAYOUT),
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
        description=wrap(
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
        description=wrap(
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
        description=wrap(
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

    _register_import_priors(isub)

    p = sub.add_parser(
        "info",
        help="show what a feature store holds (sizes, splits, labels, provenance)",
        description=wrap(
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
        "verify",
        help="read every chunk of a feature store and report damaged ones",
        description=wrap(
            "Read every chunk of every array of a feature store (finished or not), check its "
            "length and CRC-32C checksum, and list the damaged chunks by array and index. Exit "
            "status 0: no damage; 1: damage found (re-run the featurize/import that wrote the "
            "store: it rewrites only the damaged blocks); 2: not a readable store."
        ),
        epilog="examples:\n  spml verify stores/voc.zarr",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", metavar="STORE", help="feature store directory")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser(
        "draw",
        help="add single-positive draws (other seeds of the protocol) or label-budget draws "
        "to a store",
        description=wrap(
            "Add observed/<seed> arrays to a complete store: docs/protocol.md step 2 re-run with "
            "other seeds, each phase re-seeded. The literature's draw is seed 1200; other draws "
            "let 'spml study confirm --observed-seeds' report mean ± std over draws. With --k "
            "and --fraction a draw keeps k positives per image on a fraction of the images "
            "(a label budget, the same seeded walk); every command that takes --observed-seed "
            "then trains on it, and 'spml info' lists it. Draws already in the store are kept "
            "as they are; a seed names one draw."
        ),
        epilog="examples:\n  spml draw stores/coco.zarr --seeds 1,2,3\n"
        "  spml draw stores/coco.zarr --seeds 20 --k 2 --fraction 0.5   # then --observed-seed 20\n"
        "  spml draw stores/coco.zarr --seeds 21 --bias size            # label bias (COCO boxes)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", metavar="STORE", help="feature store directory")
    p.add_argument("--seeds", required=True, metavar="S1,S2,...", help="seeds to add")
    p.add_argument("--k", type=int, default=1,
                   help="observed positives per image (default 1: the protocol)")
    p.add_argument("--fraction", type=float, default=1.0,
                   help="fraction of the images labelled, in (0, 1] (default 1: the protocol)")
    p.add_argument("--bias", choices=("size", "location", "semantic"),
                   help="draw the single positive with a label bias (Cole et al.'s spml-bias): "
                   "in proportion to its objects' total area (size) or to the inverse distance "
                   "of their centres from the image centre (location) -- both need a store "
                   "featurized from COCO's instance annotations -- or to fixed per-class "
                   "weights (semantic, --class-weights); docs/priors.md")
    p.add_argument("--class-weights", metavar="FILE",
                   help="--bias semantic: one weight per class, one per line, in the store's "
                   "class order (or 'name weight' lines)")
    p.set_defaults(func=_cmd_draw)


# ----------------------------------------------------------------------------- spml import priors


def _key_file(text: str) -> tuple[str, str]:
    key, sep, path = text.partition("=")
    if not sep or not key or not path:
        raise argparse.ArgumentTypeError(
            f"expected NAME=FILE (e.g. tile_max=max.npy); got {text!r}")
    return key, path


def _tiles(text: str) -> list[int]:
    rows, sep, cols = text.lower().partition("x")
    if not sep or not rows.isdigit() or not cols.isdigit() or int(rows) < 1 or int(cols) < 1:
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS (e.g. 4x4); got {text!r}")
    return [int(rows), int(cols)]


def _cmd_import_priors(args: argparse.Namespace) -> int:
    from featurize.priors_import import import_priors

    provenance = {"model": args.model, "prompt_template": args.prompt_template,
                  "temperature": args.temperature, "tiles": args.tiles}
    prior = import_priors(args.store, args.name, args.from_path, extras=dict(args.extra or []),
                          provenance=provenance, class_names_path=args.class_names,
                          overwrite=args.overwrite)
    n, c = prior.scores.shape
    extras = f" and extras {sorted(prior.extras)}" if prior.extras else ""
    print(f"wrote prior {prior.name!r} to {args.store}: {n} rows x {c} classes{extras}. "
          f"Train with it: spml probe {args.store} --loss vlpl --priors {prior.name}")
    return 0


def _register_import_priors(isub: argparse._SubParsersAction) -> None:
    p = isub.add_parser(
        "priors",
        help="per-image class scores (CLIP, a teacher) into a store's priors/<name>",
        description=wrap(
            "Store per-image class scores computed elsewhere as a named prior of a complete "
            "store, for the losses that use one (spml probe --loss vlpl|gpr --priors NAME; "
            "docs/priors.md). --from is an (N, C) .npy matrix in the store's row and class "
            "order, or a .csv/.parquet table with one column per class name (any order) and "
            "optionally an image_id column matching the store's image ids. The scores must "
            "cover every store row (train, val and test), be finite, and (with --class-names) "
            "be in the store's class order; a refused prior leaves the store untouched. The "
            "prior is checksummed like the features and listed by 'spml info'."
        ),
        epilog="examples:\n"
        "  spml import priors stores/coco.zarr --name clip --from clip_scores.npy \\\n"
        "      --model openai/clip-vit-large-patch14-336 --temperature 0.01\n"
        "  spml import priors stores/coco.zarr --name damp --from global.npy \\\n"
        "      --extra tile_max=tmax.npy --extra tile_min=tmin.npy --tiles 4x4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    p.add_argument("--prompt-template",
                   help="provenance: the text prompt, e.g. 'a photo of a {}.'")
    p.add_argument("--temperature", type=float, help="provenance: the softmax temperature")
    p.add_argument("--tiles", type=_tiles, metavar="RxC", help="provenance: the tile grid (4x4)")
    p.add_argument("--overwrite", action="store_true", help="replace a prior of the same name")
    p.set_defaults(func=_cmd_import_priors)
