"""``spml finetune``: a thin layer over :func:`studies.finetune.run.finetune` (options and a
``--from-json`` winner file → :class:`~studies.finetune.run.FinetuneConfig`; prints the summary)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probe.cli.args import add_device_argument
from probe.store.protocol import PROTOCOL_SEED
from studies.finetune.config import AMP_MODES, TRAIN_JSON_KEYS

if TYPE_CHECKING:
    from studies.finetune.run import FinetuneConfig, FinetuneResult


EPILOG = """\
examples:
  # GR Loss on VOC 2012 with the paper's settings (bs 8, lr 1e-5, 8 epochs), ImageNet weights
  spml finetune voc --root ~/data/pascal --loss gr --out runs/voc-gr
  # the winner a study wrote, with one hyperparameter changed
  spml finetune coco --root ~/data/coco --from-json winner.json --set w_T=8 --out runs/coco-win
  # continue after an interruption (same command + --resume)
  spml finetune coco --root ~/data/coco --from-json winner.json --out runs/coco-win --resume
  # smoke run / throughput: random weights, 200 steps, images/s printed at the end
  spml finetune voc --root ~/data/pascal --loss an --weights random --max-steps 200 \\
      --out /tmp/ft-bench --overwrite

Settings not given come from the loss's paper values for the dataset ('spml losses show NAME'),
else batch 8, lr 1e-5, 10 epochs. The run directory gets checkpoint.pt (every epoch and every
--checkpoint-every steps, written atomically), results.json (config, per-epoch metrics, best
epoch, per-class test AP there, images/s) and best_model.pt (weights at the best val epoch).
torchvision's pretrained weights are never downloaded: put its file in the torch hub cache or
pass --weights PATH; timm:, open_clip: and hf: weights come from the library's own cache
(downloaded on first use). --store STORE rebuilds the backbone a feature store was made with
and reads its images again; --from-study does so with the study's store.
"""


def parse_assignments(items: list[str] | None, option: str = "--set") -> dict[str, Any]:
    """``["name=value", ...]`` → dict (see :func:`probe.cli.args.parse_assignments`)."""
    from probe.cli.args import parse_assignments as parse
    from studies.finetune.run import FinetuneError

    try:
        return parse(items, option)
    except ValueError as err:
        raise FinetuneError(str(err)) from None


def _open_study(study: str, name: str | None) -> Any:
    from studies.results.confirm import load_study
    from studies.study.storage import find_storage

    storage = find_storage(study) if Path(study).is_dir() else study
    return load_study(storage, name, name_flag="--study-name")


def winner_from_study(study: str, name: str | None = None) -> tuple[str, dict, dict]:
    """The loss, hyperparameters and training record of a study's best trial. ``study``: the
    folder given to ``spml study --out`` or a storage (study.db, study.log, postgresql://…)."""
    from studies.results.confirm import winner

    record = winner(_open_study(study, name))
    return record["loss"], record["hparams"], record["train"]


def _study_store(study: str, opened: Any) -> str | None:
    """Where the feature store the ``--from-study`` study (``opened``) trained on is now: as its
    settings record it (absolute, or from this directory), else beside the study's folder;
    ``None`` for a study that records none or a store of imported features (no backbone to
    rebuild); refused by name where the store is in neither place."""
    from probe.store import open_store
    from studies.finetune.run import FinetuneError

    recorded = (opened.user_attrs.get("spml.settings") or {}).get("store")
    if not recorded:
        return None
    candidates = [Path(recorded).expanduser()]
    if not candidates[0].is_absolute() and Path(study).exists():
        folder = Path(study) if Path(study).is_dir() else Path(study).parent
        candidates += [folder / recorded, folder.parent / recorded]
    for path in candidates:
        if path.exists():
            return str(path) if open_store(path).provenance.get("backbone") else None
    raise FinetuneError(
        f"--from-study {study}: the study trained on the store {recorded}, which is not there "
        "from this directory; pass --store STORE (its backbone and images), or --backbone and "
        "--weights"
    )


def _model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The backbone's FinetuneConfig fields: a --store's provenance, overridden by the options
    given; without either, resnet50 with imagenet1k_v1 at 448 (a library-qualified backbone:
    its own default weights)."""
    from featurize.specs import family_of
    from studies.finetune.config import store_backbone

    model = store_backbone(args.store) if args.store else {}
    if args.weights is not None or args.backbone is not None:
        model.pop("weights_sha256", None)  # other weights than the store's
    model.update({key: getattr(args, key) for key in ("backbone", "weights", "weights_seed",
                                                      "transform", "embed", "size")
                  if getattr(args, key) is not None})
    model.setdefault("backbone", "resnet50")
    if "weights" not in model:
        model["weights"] = "imagenet1k_v1" if family_of(model["backbone"]) is None else None
    return model


def _data_options(args: argparse.Namespace) -> dict[str, Any]:
    """The dataset, its root and adapter options: those given, else the images a --store's
    (or the --from-study study's store's) provenance records."""
    from studies.finetune.config import store_images
    from studies.finetune.run import FinetuneError

    given = parse_assignments(args.dataset_option, "--dataset-option")
    if args.store and (args.dataset is None or args.root is None):
        data = store_images(args.store)
        if args.dataset is not None and args.dataset != data["dataset"]:
            data["dataset_options"] = {}  # another adapter than the store's: not its options
        data["dataset_options"] = {**data["dataset_options"], **given}
        data.update({k: getattr(args, k) for k in ("dataset", "root")
                     if getattr(args, k) is not None})
        return data
    if args.dataset is None or args.root is None:
        raise FinetuneError(
            "finetune: name the dataset and its folder (e.g. 'spml finetune voc --root DIR'), "
            "or give --store STORE (or --from-study STUDY) whose provenance records them"
        )
    return {"dataset": args.dataset, "root": args.root, "dataset_options": given}


def config_from_args(args: argparse.Namespace) -> tuple[FinetuneConfig, dict[str, Any]]:
    """Merge precedence: command-line options > the --from-json winner > paper presets."""
    from studies.finetune.run import FinetuneConfig, FinetuneError, read_winner_json

    loss, hparams, train = args.loss, {}, {}
    if args.from_json and args.from_study:
        raise FinetuneError("give the winner once: --from-json PATH or --from-study STUDY_DIR")
    source = args.from_json or args.from_study
    if source:
        if args.from_json:
            json_loss, hparams, train = read_winner_json(args.from_json)
        else:
            json_loss, hparams, train = winner_from_study(args.from_study, args.study_name)
            if args.store is None and args.backbone is None:
                args.store = _study_store(args.from_study,
                                          _open_study(args.from_study, args.study_name))
        if loss is not None and loss != json_loss:
            raise FinetuneError(
                f"--loss {loss} conflicts with the loss '{json_loss}' in {source}; drop "
                "one of them"
            )
        loss = json_loss
    if loss is None:
        raise FinetuneError(
            "finetune: name the loss with --loss NAME (or give --from-json PATH or --from-study "
            "STUDY_DIR)"
        )
    data = _data_options(args)
    hparams.update(parse_assignments(args.set))
    settings = {**train, **{k: getattr(args, k) for k in TRAIN_JSON_KEYS
                            if getattr(args, k) is not None}}
    config = FinetuneConfig(
        loss=loss, out=args.out, **data, preset=None if args.no_preset else "auto",
        **_model_options(args), threshold=args.threshold, device=args.device, amp=args.amp,
        channels_last=args.channels_last, num_workers=args.workers,
        eval_batch_size=args.eval_batch_size, max_steps=args.max_steps,
        checkpoint_every=args.checkpoint_every, resume=args.resume, overwrite=args.overwrite,
        save_best=not args.no_save_best, progress=not args.no_progress, **settings,
    )
    return config, hparams


def format_summary(result: FinetuneResult) -> str:
    """The human-readable end-of-run report (per-epoch mAP, best epoch, images/s, status)."""
    t, ips = result.train, result.images_per_s

    def num(x: float | None, spec: str = ".1f") -> str:
        return "n/a" if x is None else format(x, spec)

    lines = [
        f"loss {result.loss} {result.hparams}",
        f"train: bs {t['batch_size']}, lr {t['lr']:g}, {t['epochs']} epochs "
        f"({t['steps_per_epoch']} steps each) on {t['device']}, amp {t['amp'] or 'off'}",
    ]
    for e in result.epochs:
        lines.append(f"  epoch {e['epoch']}: loss {num(e['train_loss'], '.4f')}  val mAP "
                     f"{num(e['val_map'], '.2f')}  test mAP {num(e['test_map'], '.2f')}  "
                     f"{num(e['train_images_per_s'])} img/s")
    lines.append(f"images/s: train {num(ips['train'])} (steady {num(ips['train_steady'])}), "
                 f"eval {num(ips['eval'])}")
    if result.best_epoch is not None:
        lines.append(f"best val epoch {result.best_epoch}: val mAP "
                     f"{num(result.best_val_map, '.2f')}, test mAP {num(result.test_map, '.2f')}")
    status = "completed" if result.completed else (
        f"stopped at step {result.global_step} ({result.stopped}); continue with --resume")
    lines.append(f"{status}; results in {result.paths['results']}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from studies.finetune.run import finetune

    result = finetune(*config_from_args(args))
    from probe.engine.results import versioned

    print(json.dumps(versioned(result.to_dict()), indent=2) if args.json
          else format_summary(result))
    return 0


def register_cli(sub: argparse._SubParsersAction,
                 bench: argparse._SubParsersAction | None = None) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "finetune",
        help="fine-tune the backbone + a linear head end to end on the images (confirm winners)",
        description=(
            "End-to-end fine-tuning of ResNet-50 (or another registry backbone) with any SPML "
            "loss, with the protocol of the probe: train/val split of the official train set "
            "(seed 1200), single positives, clean val, test mAP at the best val epoch. Adam as "
            "in Cole et al. (one lr for backbone and head), 448x448 resize, random flips."
        ), epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", nargs="?",
                   help="dataset adapter: voc, coco, nus, cub, folder (default: the one a "
                        "--store's provenance records)")
    p.add_argument("--root", help="the dataset's folder as you hold it on disk (default: the "
                   "image root a --store's provenance records)")
    p.add_argument("--out", required=True,
                   help="run directory (checkpoint.pt, results.json, best_model.pt)")
    p.add_argument("--loss", help="loss name ('spml losses list'); or take it from --from-json")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="loss hyperparameter, repeatable (over the dataset's paper preset and "
                        "--from-json); e.g. --set alpha=0.2")
    p.add_argument("--from-json", metavar="PATH",
                   help='a study winner: {"loss": NAME, "hparams": {...}, "train": {...}}; '
                        f"train keys: {', '.join(TRAIN_JSON_KEYS)}")
    p.add_argument("--from-study", metavar="STUDY",
                   help="take the loss and hyperparameters of a study's best trial: the folder "
                        "given to 'spml study --out', or its storage (the probe's lr, batch size "
                        "and epochs do not carry over: a head's lr is no fine-tuning lr)")
    p.add_argument("--study-name", help="with --from-study: the study's name when the storage "
                   "holds several")
    p.add_argument("--no-preset", action="store_true",
                   help="start from the loss's defaults, not the dataset's paper hyperparameters")
    g = p.add_argument_group("training (default: the paper's values for loss and dataset)")
    g.add_argument("--batch-size", dest="batch_size", type=int,
                   help="images per step (default: paper's, else 8)")
    g.add_argument("--lr", type=float, help="Adam learning rate (default: paper's, else 1e-5)")
    g.add_argument("--epochs", type=int, help="epochs (default: paper's, else 10)")
    g.add_argument("--seed", type=int, help="head init, batch order, flips (default 0)")
    g.add_argument("--observed-seed", dest="observed_seed", type=int,
                   help=f"single-positive draw (default {PROTOCOL_SEED}, the literature's), "
                   "drawn from the dataset's labels: a store's label-budget draws (spml draw "
                   "--k/--fraction) do not apply here")
    g.add_argument("--val-labels", dest="val_labels", choices=("clean", "observed"),
                   help="score val on full labels (default) or on the single positives")
    g.add_argument("--threshold", type=float, default=0.5,
                   help="probability threshold of OF1/CF1 (default 0.5)")
    m = p.add_argument_group("model and data")
    m.add_argument("--store", metavar="STORE",
                   help="build the backbone as this feature store's provenance records it "
                        "(backbone, weights file and its sha256, transform, size, embedding) "
                        "and read its images (dataset, root, adapter options); the options "
                        "given override it (default with --from-study: the study's store)")
    m.add_argument("--backbone", default=None,
                   help="backbone name (default resnet50), or timm:<model>, "
                        "open_clip:<arch>/<pretrained>, hf:<repo id> (docs/backbones.md)")
    m.add_argument("--weights", default=None,
                   help="imagenet1k_v1 (torch hub cache; never downloaded), random, or a file "
                        "PATH (default imagenet1k_v1; for timm:/open_clip:/hf: the name's own)")
    m.add_argument("--weights-seed", type=int, default=None,
                   help="seed of --weights random (default 0)")
    m.add_argument("--transform", choices=("auto", "model", "protocol"), default=None,
                   help="auto (default): the model's own preprocessing for timm:/open_clip:/hf:, "
                        "the protocol's SIZE x SIZE resize for the others")
    m.add_argument("--embed", choices=("auto", "pooled", "projected", "mean"), default=None,
                   help="which embedding the head reads (default auto: the family's)")
    m.add_argument("--size", type=int, default=None,
                   help="resize to SIZE x SIZE with --transform protocol (default 448, the "
                        "protocol's)")
    m.add_argument("--dataset-option", action="append", metavar="NAME=VALUE",
                   help="adapter option, e.g. annotations=labels.csv for folder")
    r = p.add_argument_group("running")
    add_device_argument(r)
    r.add_argument("--amp", choices=AMP_MODES, default="auto",
                   help="autocast: auto = bf16 on CUDA (fp16 + GradScaler without bf16), off on "
                        "CPU")
    r.add_argument("--channels-last", dest="channels_last", action=argparse.BooleanOptionalAction,
                   default=None, help="channels_last memory format (default: on CUDA)")
    r.add_argument("--workers", type=int, help="image-decoding processes (default: CPUs - 1, at "
                   "most 16, on CUDA; 0 on CPU)")
    r.add_argument("--eval-batch-size", type=int, help="default max(2 x batch size, 32)")
    r.add_argument("--max-steps", type=int,
                   help="stop after this many optimiser steps in total (smoke runs; --resume "
                        "continues)")
    r.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="also checkpoint every N steps (default 0: at epoch ends only)")
    r.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its checkpoint (same settings; a "
                        "fresh start if there is none)")
    r.add_argument("--overwrite", action="store_true", help="discard a run already in --out")
    r.add_argument("--no-save-best", action="store_true",
                   help="do not write best_model.pt (the weights at the best val epoch)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--json", action="store_true", help="print the results JSON")
    p.set_defaults(func=_run)
    return p
