"""``spml priors``: compute a store's CLIP prior from its images (:mod:`featurize.priors.clip`);
``spml import priors`` (scores computed elsewhere) is in :mod:`featurize.cli.imports`."""

from __future__ import annotations

import argparse
import json

from featurize.cli import add_command, config_of, dataset_options_of
from featurize.priors.files import PROMPT_FLAGS
from probe.cli.args import add_device_argument, wrap

__all__ = ["register_cli"]


def _cmd_priors(args: argparse.Namespace) -> int:
    from featurize.priors.clip import ClipPriorConfig, ClipPriorError, compute_clip_prior
    from featurize.priors.files import parse_tiles

    if args.source != "clip":
        return _cmd_other_source(args)
    if args.model is None:
        raise ClipPriorError("--model: the clip source needs an OpenCLIP model, e.g. --model "
                             "open_clip:ViT-B-16/openai (or --source NAME for another source)")

    rows, cols = parse_tiles(args.tiles)
    if rows != cols:
        raise ClipPriorError(f"--tiles: spml priors cuts a square grid, K or KxK (e.g. 4 or "
                             f"4x4); got {args.tiles}")
    config = config_of(ClipPriorConfig, args, tiles=rows, progress=not args.quiet)
    result = compute_clip_prior(args.store, config, root=args.root,
                                dataset_options=dataset_options_of(args.option),
                                adapter=args.dataset)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    resumed = f", {result.blocks_resumed} blocks resumed" if result.blocks_resumed else ""
    print(f"wrote prior '{result.name}' to {result.store}: {result.rows} images x "
          f"{result.classes} classes, {result.views_per_image} views each{resumed}. Train with "
          f"it: spml probe {result.store} --loss vlpl --priors {result.name}")
    return 0


def _cmd_other_source(args: argparse.Namespace) -> int:
    """``spml priors STORE --source NAME --source-option KEY=VALUE …``: a registered source."""
    from featurize.priors import write_prior_from

    options = dataset_options_of(args.source_option)
    prior = write_prior_from(args.source, args.store, args.name, overwrite=args.overwrite,
                             **options)
    if args.json:
        print(json.dumps({"store": str(args.store), "name": args.name, "source": args.source,
                          "rows": int(prior.scores.shape[0]),
                          "classes": int(prior.scores.shape[1])}, indent=2))
        return 0
    print(f"wrote prior '{args.name}' to {args.store} with source '{args.source}'. Train with "
          f"it: spml probe {args.store} --loss vlpl --priors {args.name}")
    return 0


def register_cli(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    """Add ``spml priors``."""
    p = add_command(
        sub, "priors",
        help="compute CLIP zero-shot class scores of a store's images as a prior (VLPL, GPR)",
        description=wrap(
            "Compute a vision-language prior for every row of a feature store: an OpenCLIP "
            "model's zero-shot scores of the store's classes, softmax over classes of "
            "image-text cosine similarity at --temperature, from the prompt --prompt. With "
            "--tiles k each image is also cut into a k x k grid and the per-class max, min and "
            "mean over the tiles are stored too (AEVLP's DAMP reads them). The images are read "
            "from the dataset the store was featurized from (--root to point elsewhere). The "
            "prior is validated and written all or nothing (priors/NAME, spml info lists it); "
            "an interrupted run resumes from its last finished block of rows. For scores "
            "computed elsewhere use 'spml import priors'. A resume needs the same settings: an "
            "unfinished run of others is refused by name. docs/priors.md explains the losses "
            "that read it."),
        epilog="examples:\n"
        "  spml priors stores/voc.zarr --model open_clip:ViT-L-14-336/openai --name vlpl\n"
        "  spml priors stores/coco.zarr --model open_clip:ViT-B-16/openai --tiles 4 --name damp\n"
        "  spml priors s.zarr --model open_clip:ViT-B-16 --weights clip.safetensors --device cpu")
    p.add_argument("store", metavar="STORE", help="the feature store (.zarr) to add the prior to")
    p.add_argument("--model", default=None,
                   help="OpenCLIP model open_clip:<arch>/<pretrained> (VLPL: "
                   "open_clip:ViT-L-14-336/openai; AEVLP: open_clip:ViT-B-16/openai); "
                   "required by the clip source")
    p.add_argument("--source", default="clip",
                   help="the prior source: clip (default), or a source an installed plugin "
                   "registers (spml plugins lists them; docs/plugins.md)")
    p.add_argument("--source-option", action="append", metavar="KEY=VALUE",
                   help="an option of a --source other than clip (repeatable)")
    p.add_argument("--weights", default=None,
                   help="a local checkpoint (.pt/.pth/.safetensors) instead of the pretrained "
                   "tag's download; 'random' for a seeded random model (tests only)")
    p.add_argument("--name", default="clip", help="the prior's name in the store (default clip)")
    p.add_argument(*PROMPT_FLAGS, dest="prompt", default="a photo of a {}.",
                   help="prompt template with {} for the class name (default 'a photo of a {}.'; "
                   "the same flag as spml import priors)")
    p.add_argument("--temperature", type=float, default=0.01,
                   help="softmax temperature over the classes (default 0.01, both papers)")
    p.add_argument("--tiles", default="0", metavar="K|KxK",
                   help="also score a K x K grid of tiles per image, 4 or 4x4 (DAMP: 4, CUB 5; "
                   "default 0 = the whole image only; the same form as spml import priors)")
    p.add_argument("--root", default=None,
                   help="where the store's images are now (default: the dataset root its "
                   "provenance records)")
    p.add_argument("--dataset", default=None,
                   help="the dataset adapter to read the images with (voc, coco, nus, cub, folder; "
                   "default: the store's dataset, or folder for a folder-named one)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="a dataset adapter option, as given to spml featurize (repeatable)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="images per forward pass (each with 1 + k^2 views; default 32)")
    add_device_argument(p)
    p.add_argument("--overwrite", action="store_true", help="replace an existing prior of NAME")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_priors)
