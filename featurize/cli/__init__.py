"""``spml featurize``, ``spml backbones`` and ``spml bench featurize``: thin layers over
:mod:`featurize.extract.run` and :mod:`featurize.bench`, imported when a command runs (``spml
--help`` loads neither torch nor zarr). The other featurize commands: ``spml import …`` in
:mod:`featurize.cli.imports`, ``spml info`` / ``verify`` / ``draw`` in :mod:`featurize.cli.store`,
``spml priors`` in :mod:`featurize.cli.priors`; they share the helpers here (``--option`` values,
the checks before writing)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap
from typing import Any

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
from probe.cli.args import add_device_argument, add_seeds_argument, parse_seeds, parse_value
from probe.errors import SpmlError

DTYPES = ("float16", "float32")  # = probe.store.DTYPES (a test checks they agree)
BAD_SHOWN = 20  # unreadable images listed after a run (the rest are counted)

_FAMILY_LINES = "".join(
    f"    {f.name + ':' + f.syntax:<36} e.g. {f.example}\n"
    f"    {'':<36} ({f.install})\n"
    for f in FAMILIES.registered_now() if f.qualified)
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
{_FAMILY_LINES}    and the families of installed plugins (spml backbones lists them)

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
  spml bench featurize --device cuda --precision bf16 --profile   # and where the time goes
"""


def dataset_options_of(pairs: list[str] | None) -> dict[str, Any]:
    """The dataset adapter's options from repeated ``--option KEY=VALUE``, values read as every
    command's (:func:`probe.cli.args.parse_value`: true/false, none, numbers, else text)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SpmlError(
                f"--option expects KEY=VALUE (e.g. annotations=labels.csv), got {pair!r}")
        out[key.strip().replace("-", "_")] = parse_value(value)
    return out


def _add_run_options(p: argparse.ArgumentParser, default_weights: str | None) -> None:
    """Options shared by featurize and its benchmark (model, images, compute)."""
    model = p.add_argument_group("model")
    model.add_argument("--backbone", default=DEFAULT_BACKBONE,
                       help=f"backbone name (default: {DEFAULT_BACKBONE}), or timm:<model>, "
                       "open_clip:<arch>/<pretrained>, hf:<repo id> (--list-backbones)")
    model.add_argument(
        "--list-backbones", action=_ListBackbones,
        help="say which backbone families are installed and how to add the others, and exit")
    model.add_argument(
        "--embed", choices=EMBED_CHOICES, default="auto",
        help="which embedding: auto (default) = the family's (CLIP: projected, others: pooled); "
        "pooled, projected (CLIP's image embedding), mean (of the patch tokens, hf:)")
    model.add_argument(
        "--weights", default=default_weights, metavar="WEIGHTS",
        help="default | a torchvision weights name | PATH (.pth, .pt, .safetensors) | random "
        "(default: " + (default_weights or "the backbone's standard ImageNet weights") + ")")
    model.add_argument(
        "--weights-seed", type=int, default=0, help="seed of --weights random (default: 0)")
    model.add_argument("--download", action="store_true",
                       help="fetch missing torchvision weights into the torch hub cache (needs "
                       "internet; off by default)")
    images = p.add_argument_group("images")
    images.add_argument(
        "--transform", choices=TRANSFORM_CHOICES, default="auto",
        help="auto (default): the model's own preprocessing for timm:/open_clip:/hf: "
        "backbones, the protocol's for the others; model; protocol = SIZExSIZE resize, no crop")
    images.add_argument(
        "--size", type=int, default=None,
        help="square input size of --transform protocol in pixels (default: 448, the "
        "protocol's)")
    images.add_argument(
        "--decode", choices=DECODE_CHOICES, default="auto",
        help="auto (default): pil; pil = the reference preprocessing exactly; torchvision = "
        "torchvision decode (nvJPEG on CUDA) + torch resize: the fast path, 6.6x the reference's "
        "images/s on an H100")
    compute = p.add_argument_group("compute")
    add_device_argument(compute)
    compute.add_argument("--batch-size", type=int, default=None,
                         help="images per forward (default: 256 on CUDA, 16 on CPU)")
    compute.add_argument(
        "--precision", choices=PRECISION_CHOICES, default="auto",
        help="auto (default): fp32; bf16 = autocast + channels_last on CUDA (the fast path; "
        "features within cosine 0.999 of fp32's)")
    compute.add_argument("--workers", type=int, default=None,
                         help="image reader threads (default: min(16, CPU count))")
    compute.add_argument("--compile", action="store_true",
                         help="run the backbone through torch.compile (inductor: fused kernels; "
                         "each batch shape compiles once; features within float tolerance)")
    compute.add_argument("--no-flip", dest="with_flip", action="store_false",
                         help="skip the flipped-image features (half the compute)")


def add_command(sub: argparse._SubParsersAction, name: str, **kwargs: Any
                ) -> argparse.ArgumentParser:
    """A subcommand whose description and epilog keep their line breaks."""
    return sub.add_parser(name, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)


def config_of(cls: type, args: argparse.Namespace, **extra: Any) -> Any:
    """The config dataclass ``cls`` of the options (each named as its field) and ``extra``."""
    given = {f.name for f in dataclasses.fields(cls)} & set(vars(args)) - set(extra)
    return cls(**{k: getattr(args, k) for k in given}, **extra)


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


def check_before_writing(args: argparse.Namespace) -> None:
    """The checks a featurize/import makes before it writes anything: the draws' seeds parse
    and ``--out`` can be written (its real cause named: permission, a virtual file system)."""
    from probe.io import check_writable

    parse_seeds(args.seeds)
    check_writable(args.out, "--out")


def _cmd_featurize(args: argparse.Namespace) -> int:
    from featurize.extract.ranks import distributed_from_env
    from featurize.extract.run import FeaturizeConfig, featurize_dataset
    from probe.store import add_draws

    check_before_writing(args)
    config = config_of(FeaturizeConfig, args, progress=not args.quiet)  # --dtype, --skip-bad, …
    options = dataset_options_of(args.dataset_options)
    if args.skip_bad and args.dataset in ("folder", "coco", "cub"):
        options.setdefault("check_images", False)  # missing images become bad rows
    with distributed_from_env() as ranks:  # under torchrun: one rank of several
        result = featurize_dataset(args.dataset, args.root, args.out, config, **options)
    if ranks.rank != 0:
        return 0  # rank 0 reports for the whole run
    add_draws(result.store_path, parse_seeds(args.seeds))
    summary = {**{k: v for k, v in dataclasses.asdict(result).items() if k != "bad_rows"},
               "store_path": str(result.store_path), "n_bad_rows": len(result.bad_rows),
               "bad_rows": result.bad_rows[:BAD_SHOWN]}
    if args.json:
        from probe.engine.results import versioned

        print(json.dumps(versioned(summary), indent=2))
    else:
        resumed = f", {result.blocks_resumed} blocks already done" if result.blocks_resumed else ""
        print(
            f"wrote {result.store_path}: {result.n_rows} images ({result.rows_done} featurized "
            f"now{resumed}) with {result.backbone} [{result.weights}] on {result.device}, "
            f"{result.images_per_s:.1f} images/s. 'spml info {result.store_path}' shows more.")
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
            "pretrained; use them for tests and speed measurements only")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from featurize.bench import BenchConfig, bench_featurize
    from featurize.extract.run import FeaturizeConfig

    try:
        width, height = (int(v) for v in args.image_size.lower().split("x"))
    except ValueError:
        raise SpmlError(
            f"--image-size expects WIDTHxHEIGHT, e.g. 500x375; got {args.image_size!r}") from None
    config = BenchConfig(featurize=config_of(FeaturizeConfig, args,
                                             progress=not args.quiet and not args.json),
                         n_images=args.images, width=width, height=height,
                         profile=args.profile)
    result = bench_featurize(config)
    if not args.json:
        from probe.profiling import format_summary

        width_key = max(len(k) for k in result)
        for key, value in result.items():
            if key != "profile":
                print(f"{key:<{width_key}}  {value}")
        for part, summary in result.get("profile", {}).items():
            if summary:
                print("\n".join(format_summary(summary, part.replace("_", " "))))
    from probe.engine.results import versioned

    print(json.dumps(versioned(result)))
    return 0


def register_cli(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    """Add ``spml featurize``, ``spml backbones`` and ``spml bench featurize``."""
    p = add_command(
        sub, "featurize", help="run a frozen backbone over a dataset once, into a feature store",
        description="Featurize a dataset with a frozen backbone (default: torchvision ResNet-50, "
        "IMAGENET1K_V1, 448x448, 2048-d pooled features + flipped-image features) into a Zarr "
        "feature store with labels, the SPML protocol's single positives and splits.",
        epilog=_FEATURIZE_EPILOG)
    p.add_argument(
        "dataset", metavar="DATASET", help="dataset adapter: voc, coco, nus, cub, folder, cole")
    p.add_argument("--root", required=True, help="the dataset's folder as distributed")
    p.add_argument("--out", required=True, metavar="STORE", help="output store directory")
    p.add_argument("--option", action="append", dest="dataset_options", metavar="KEY=VALUE",
                   help="adapter option, repeatable (e.g. annotations=labels.csv for folder, "
                   "dataset=coco for cole)")
    _add_run_options(p, default_weights=None)
    store = p.add_argument_group("store")
    store.add_argument("--dtype", choices=DTYPES, default="float16",
                       help="feature storage type (default: float16)")
    store.add_argument("--block-rows", type=int, default=1024,
                       help="rows per chunk, the unit of resume (default: 1024)")
    store.add_argument("--skip-bad", action="store_true",
                       help="store zero features for unreadable images and list them in the "
                       "store's bad_rows, instead of stopping")
    store.add_argument("--overwrite", action="store_true",
                       help="replace an existing store at --out instead of resuming it")
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
        "describes the preprocessing, the embeddings and what a store records.")
    p.add_argument("--json", action="store_true", help="print the families as JSON")
    p.set_defaults(func=_cmd_backbones)

    b = add_command(
        bench, "featurize", help="images/s of the featurize pipeline on synthetic JPEGs",
        description="Measure featurize throughput (images/s) for a device, batch size and "
        "decode path.", epilog=_BENCH_EPILOG)
    b.add_argument("--images", type=int, default=None,
                   help="images to featurize (default: 4096 on CUDA, 24 on CPU)")
    b.add_argument("--image-size", default="640x480", metavar="WxH",
                   help="synthetic JPEG size (default: 640x480, a typical COCO photo)")
    _add_run_options(b, default_weights=RANDOM)
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.add_argument("--json", action="store_true", help="print only the JSON line")
    b.add_argument("--profile", action="store_true",
                   help="also profile (torch.profiler), after the timed run, four batches end "
                   "to end and the forward batches again: wall time, the device's busy share, "
                   "kernel launches and the most expensive operators and kernels, printed and "
                   "in the JSON as 'profile'")
    b.set_defaults(func=_cmd_bench)

