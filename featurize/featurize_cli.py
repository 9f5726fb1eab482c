"""``spml featurize`` and ``spml bench featurize`` (thin layers over featurize.runner and
featurize.bench). ``featurize/cli.py`` calls :func:`register_featurize_cli`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap
from typing import Any

from featurize.backbones import BACKBONES, DEFAULT_BACKBONE, RANDOM
from featurize.runner import DECODE_CHOICES, PRECISION_CHOICES, FeaturizeConfig

_DTYPES = ("float16", "float32")  # probe.store.DTYPES, without importing zarr for --help

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

backbones (default {DEFAULT_BACKBONE}):
{textwrap.fill(", ".join(BACKBONES), width=94, initial_indent="  ", subsequent_indent="  ")}
  or any torchvision classification model name (pooled features = its classifier's input).

speed: on CUDA images are decoded on the GPU (nvJPEG, batched; CPU fallback for grayscale,
  CMYK, PNG, …), the model runs in bf16 with channels_last, reader threads prefetch file bytes
  and a writer thread stores blocks. --decode pil --precision fp32 reproduces the reference
  preprocessing (PIL) exactly, at lower speed. On a CPU it works, slowly (~1 s/image for
  ResNet-50 at 448 on 2 cores).

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
Writes synthetic photo-like JPEGs to a temporary folder and featurizes them through the real
pipeline into a temporary store; prints images/s (after an untimed warm-up) and the forward
passes alone (model_only), as a table and as JSON. Random weights by default.

examples:
  spml bench featurize                               # CUDA if available, 4096 images
  spml bench featurize --device cpu --images 16 --size 224
  spml bench featurize --decode pil --batch-size 128 --json
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
            raise ValueError(
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
        help=f"backbone name (default: {DEFAULT_BACKBONE}; the list is in 'spml featurize --help')",
    )
    model.add_argument(
        "--weights",
        default=default_weights,
        metavar="WEIGHTS",
        help="default | a torchvision weights name | PATH | random (default: "
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
        "--size",
        type=int,
        default=448,
        help="square input size in pixels (default: 448, the protocol's)",
    )
    images.add_argument(
        "--decode",
        choices=DECODE_CHOICES,
        default="auto",
        help="auto (default): torchvision/nvJPEG on CUDA, pil on CPU; pil = the reference "
        "preprocessing exactly; torchvision = torchvision decode + torch resize",
    )
    compute = p.add_argument_group("compute")
    compute.add_argument(
        "--device", default="auto", help="auto (default: cuda if available), cpu, cuda, cuda:N"
    )
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
        help="auto (default): bf16 autocast on CUDA, fp32 on CPU",
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


def _config(args: argparse.Namespace, **extra: Any) -> FeaturizeConfig:
    return FeaturizeConfig(
        backbone=args.backbone,
        weights=args.weights,
        weights_seed=args.weights_seed,
        download=args.download,
        size=args.size,
        device=args.device,
        batch_size=args.batch_size,
        decode=args.decode,
        precision=args.precision,
        with_flip=args.with_flip,
        workers=args.workers,
        **extra,
    )


def _cmd_featurize(args: argparse.Namespace) -> int:
    from featurize.runner import featurize_dataset

    config = _config(
        args,
        dtype=args.dtype,
        block_rows=args.block_rows,
        skip_bad=args.skip_bad,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    result = featurize_dataset(
        args.dataset, args.root, args.out, config, **_dataset_options(args.dataset_options)
    )
    from featurize.cli import add_draws

    add_draws(str(result.store_path), args.seeds)
    summary = {
        **{k: v for k, v in dataclasses.asdict(result).items() if k != "bad_rows"},
        "store_path": str(result.store_path),
        "n_bad_rows": len(result.bad_rows),
        "bad_rows": result.bad_rows[:20],
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        resumed = f", {result.blocks_resumed} blocks already done" if result.blocks_resumed else ""
        print(
            f"wrote {result.store_path}: {result.n_rows} images ({result.rows_done} featurized "
            f"now{resumed}) with {result.backbone} [{result.weights}] on {result.device}, "
            f"{result.images_per_s:.1f} images/s. 'spml info {result.store_path}' shows more."
        )
        if result.bad_rows:
            print(
                f"{len(result.bad_rows)} unreadable images got zero features (store attribute "
                f"bad_rows), e.g. {result.bad_rows[0]['path']}: {result.bad_rows[0]['error']}"
            )
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
        raise ValueError(
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
    print(json.dumps(result))
    return 0


def register_featurize_cli(
    sub: argparse._SubParsersAction, bench: argparse._SubParsersAction
) -> None:
    """Add ``spml featurize`` to ``sub`` and ``spml bench featurize`` to ``bench``."""
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
        choices=_DTYPES,
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
    from featurize.cli import add_seeds_argument

    add_seeds_argument(p)
    p.add_argument("--json", action="store_true", help="print the run summary as JSON")
    p.set_defaults(func=_cmd_featurize)

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
        default="500x375",
        metavar="WxH",
        help="synthetic JPEG size (default: 500x375, a typical VOC/COCO photo)",
    )
    _add_run_options(b, default_weights=RANDOM)
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.add_argument("--json", action="store_true", help="print only the JSON line")
    b.set_defaults(func=_cmd_bench)
