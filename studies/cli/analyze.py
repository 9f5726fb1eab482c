"""``spml analyze …``: thin argparse layers over :mod:`studies.analyses` (the GR paper's analyses).

``register_analyze_cli(sub)`` adds ``spml analyze ablation | sensitivity | distinguish |
calibration | curves``. Every command prints its table, then writes ``OUT/<name>.json``,
``OUT/<name>.md`` and the PNG figures (``--out``, default ``spml-analysis/<command>``).
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from pathlib import Path
from typing import Any

from probe.cli.args import (
    add_device_argument,
    add_observed_seed_argument,
    add_training_overrides,
    add_trials_at_once_argument,
    parse_floats,
    parse_names,
)
from probe.io import atomic_write_text

_COMMON_EPILOG = """
Training (store commands): --epochs, --batch-size and --lr default to GR's paper setting for the
store's dataset (VOC/COCO/NUS/CUB, Table 6), else Cole et al.'s linear probe (bs 8, lr 1e-4,
25 epochs, Adam); every run of one analysis uses the same values. --seeds 0,1,2 trains each
configuration once per seed, stacked, and reports mean ± std. The epoch is chosen on val (full
labels), test mAP is read there (docs/protocol.md step 5).

--set KEY=VALUE sets a loss hyperparameter ('spml losses show gr'), or lr / weight_decay;
LOSS.KEY=VALUE (e.g. gr.w_T=2) names the loss where several are trained.
"""

_ABLATION_EPILOG = """\
examples:
  spml analyze ablation yeast.zarr --epochs 10 --batch-size 16 --lr 1e-3
  spml analyze ablation voc.zarr --seeds 0,1,2 --out runs/voc-ablation
  spml analyze ablation coco.zarr --set w_T=10 --set b_T=-8 --set q3=1

Rows (paper Table 3): AN (baseline); GR with k̂ / v / robust L each on (✓) or off (×: k̂ ≡ 0,
v ≡ 1, q1 = q2 = q3 = 0.01), all 7 combinations; and "◦ ◦ ✓" with (w, b, μ, σ) learned by
gradient descent (learn_kv=True). Each row is one run (the switches are structural); its seeds
train stacked. Writes ablation.json, ablation.md and ablation.png.
""" + _COMMON_EPILOG

_SENSITIVITY_EPILOG = """\
examples:
  spml analyze sensitivity yeast.zarr --param tau --epochs 10 --lr 1e-3
  spml analyze sensitivity voc.zarr --param tau --tau 0.4,0.6,0.8,1 --b-T=-2,-5,-8
  spml analyze sensitivity voc.zarr --param mu --mu-T 0.2,0.5,0.8,1 --sigma-T 0.1,0.5,1
  spml analyze sensitivity voc.zarr --param q2q3 --q2 0.01,0.1,1 --q3 0.5,1,1.5 --seeds 0,1

Sweeps (paper Fig. 2): tau — k̂'s threshold τ = −b/w at fixed b_T (w_T = −b_T/τ; defaults
τ 0.2,0.4,…,1 and b_T −2,−5,−8); mu — μ_T (0.2,…,1) at fixed σ_T (0.1,0.5,1); q2q3 — a grid
(q2 0.01,0.1,0.5,1 × q3 0.01,0.1,0.5,1,1.5). All points (× seeds) train stacked in one run.
Negative values need '=': --b-T=-2,-8. The AN baseline trains too unless --no-baseline.
Writes sensitivity_<param>.json/.md/.png (a heatmap for q2q3).
""" + _COMMON_EPILOG

_DISTINGUISH_EPILOG = """\
examples:
  spml analyze distinguish yeast.zarr --epochs 10 --lr 1e-3
  spml analyze distinguish voc.zarr --loss gr,an,em --hist-epochs 1,best,last
  spml analyze distinguish voc.zarr --split val --bins 40 --set gr.w_T=2 --set gr.b_T=-2

Per completed epoch (0 = before training) the exact Wasserstein-1 distance between the
confidences p of the truly positive and the truly negative unannotated entries (observed 0;
truth from the store's full labels), of the train split by default (the paper used its
validation images: --split val). Each loss trains in turn, its seeds stacked. Histograms of
the two distributions at --hist-epochs (numbers, 'best' = the best val epoch, 'last').
Writes distinguish.json/.md, distinguish.png (W1 per epoch) and distinguish_hist.png.
Needs a store with full labels.
""" + _COMMON_EPILOG

_CALIBRATION_EPILOG = """\
examples:
  spml analyze calibration yeast.zarr --epochs 10 --lr 1e-3
  spml analyze calibration coco.zarr --buckets 100 --seeds 0,1,2
  spml analyze calibration voc.zarr --loss an

Among the unannotated train entries, the fraction that is truly positive (FN/(FN+TN)) per
confidence bucket (--buckets equal intervals of [0, 1], paper Appendix E.3), before training
and after the last epoch, seeds pooled; against GR's k̂ = σ(w·p + b) at (w_0, b_0) and
(w_T, b_T) (Eq. 7) and Eq. 6's (1−a)p/(1−a·p) with a = P(s=1|y=1) measured on the store.
Writes calibration.json/.md/.png. Needs a store with full labels.
""" + _COMMON_EPILOG

_CURVES_EPILOG = """\
examples:
  spml analyze curves                                    # an, hill, em, gr at epochs 1 and 8
  spml analyze curves --loss gr --set q3=0.001,0.5,1 --at 8      # paper Fig. 1a
  spml analyze curves --loss em,hill,gr --at 1,8                 # paper Fig. 1b
  spml analyze curves --loss gr,focal,asl --set gr.w_T=2 --set gr.b_T=-2 --epochs 8

The entry loss ℓ and its gradient ∂ℓ/∂z w.r.t. the logit (autograd), on an unannotated label
(y = 0) and on a positive (y = 1), for p from 0.002 to 0.998; scheduled losses (GR, SPLC) at
each epoch of --at (counted from 1 of --epochs). --set lists draw one curve per value. Losses
with per-example state or whose entry loss depends on the batch or on the other classes (EPR,
ROLE, EM+APL, vPU, ZLPR, OPML, LL after epoch 1) are refused with the reason. No store needed.
Writes curves.json/.md/.png.

--set KEY=V1,V2 sets a loss hyperparameter (LOSS.KEY=… names the loss when several are drawn).
"""


def _loss_sets(items: list[str] | None, losses: list[str], lists: bool = False
               ) -> dict[str, dict[str, Any]]:
    """``--set [LOSS.]KEY=V[,V…]`` → per-loss hyperparameters. An unprefixed key goes to every
    listed loss that has it (or lr / weight_decay to all); single values unless ``lists``."""
    from probe.cli.args import parse_sets
    from probe.engine.config import TRAINER_KEYS
    from probe.losses import get_loss_class
    from studies.analyses import AnalyzeError

    out: dict[str, dict[str, Any]] = {name: {} for name in losses}
    known = {name: {s.name for s in get_loss_class(name).hparam_specs} for name in losses}
    for key, values in parse_sets(items).items():
        value: Any = values
        if not lists and len(values) == 1:
            value = values[0]
        loss, dot, name = key.partition(".")
        if dot:
            if loss not in out:
                raise AnalyzeError(f"--set {key}: '{loss}' is not among the losses "
                                   f"{', '.join(losses)}")
            out[loss][name] = value
            continue
        targets = [n for n in losses if key in known[n] or (key in TRAINER_KEYS and not lists)]
        if not targets:
            if len(losses) == 1:  # let the loss name the unknown key (with a suggestion)
                targets = losses
            else:
                raise AnalyzeError(f"--set {key}: none of the losses {', '.join(losses)} has a "
                                   f"hyperparameter '{key}' ('spml losses show NAME' lists them)")
        for n in targets:
            out[n][key] = value
    return out


def _config(args: argparse.Namespace):
    """The training settings of a store command (each analysis validates them, then loads the
    store with them)."""
    from probe.cli.args import parse_ints
    from probe.engine.config import ProbeConfig

    seeds = parse_ints(args.seeds, "--seeds")
    return ProbeConfig(batch_size=args.batch_size, lr=args.lr, epochs=args.epochs,
                       seeds=tuple(seeds) if seeds else None, flip=not args.no_flip,
                       observed_seed=args.observed_seed, device=args.device,
                       use_presets=not args.no_presets)


def _finish(result, args: argparse.Namespace) -> int:
    from studies.analyses.figures import write_outputs

    print(result.text())
    paths = write_outputs(result, args.out or f"spml-analysis/{args.analysis}", dpi=args.dpi)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _cmd_ablation(args: argparse.Namespace) -> int:
    from studies.analyses import run_ablation

    return _finish(run_ablation(args.store, _config(args), _loss_sets(args.set, ["gr"])["gr"],
                                progress=not args.quiet), args)


_SWEEP_FLAGS = {"tau": ("tau", "b_T"), "mu": ("mu_T", "sigma_T"), "q2q3": ("q2", "q3")}


def _cmd_sensitivity(args: argparse.Namespace) -> int:
    from studies.analyses import AnalyzeError, run_sensitivity

    x_key, s_key = _SWEEP_FLAGS[args.param]
    flag = {k: "--" + k.replace("_", "-") for pair in _SWEEP_FLAGS.values() for k in pair}
    for key in flag.keys() - {x_key, s_key}:
        if getattr(args, key) is not None:
            raise AnalyzeError(f"{flag[key]} belongs to another sweep; --param {args.param} "
                               f"takes {flag[x_key]} and {flag[s_key]}")
    values, series = (parse_floats(getattr(args, k), flag[k]) for k in (x_key, s_key))
    return _finish(run_sensitivity(args.store, _config(args), args.param, values=values,
                                   series=series, hparams=_loss_sets(args.set, ["gr"])["gr"],
                                   baseline=not args.no_baseline, progress=not args.quiet), args)


def _cmd_distinguish(args: argparse.Namespace) -> int:
    from studies.analyses import run_distinguish

    losses = parse_names(args.loss)
    parts = [t for t in map(str.strip, args.hist_epochs.split(",")) if t]
    hist = [int(t) if t.isascii() and t.isdigit() else t for t in parts]  # the rest: refused
    return _finish(run_distinguish(args.store, _config(args), losses,
                                   hparams=_loss_sets(args.set, losses), split=args.split,
                                   hist_epochs=hist, bins=args.bins, progress=not args.quiet),
                   args)


def _cmd_calibration(args: argparse.Namespace) -> int:
    from studies.analyses import AnalyzeError, run_calibration

    names = parse_names(args.loss)
    if len(names) != 1:
        raise AnalyzeError(f"--loss: calibration trains one loss; got {', '.join(names)}")
    return _finish(run_calibration(args.store, _config(args), names[0],
                                   hparams=_loss_sets(args.set, names)[names[0]],
                                   n_buckets=args.buckets, progress=not args.quiet), args)


def _cmd_curves(args: argparse.Namespace) -> int:
    from probe.cli.args import parse_ints
    from studies.analyses import loss_curves

    losses = parse_names(args.loss)
    return _finish(loss_curves(losses, _loss_sets(args.set, losses, lists=True),
                               n_epochs=args.epochs, at=parse_ints(args.at, "--at"),
                               points=args.points, classes=args.classes), args)


def _log(args: argparse.Namespace) -> Any:
    """Per-run lines on stderr, unless --quiet."""
    import sys

    return None if args.quiet else (lambda m: print(m, file=sys.stderr))


def _write_json(out: Path, stem: str, config: Any, rows: list, **extra: Any) -> Path:
    """``OUT/<stem>.json``: the run's config, ``extra`` and rows."""
    from probe.engine.results import write_json_atomic

    return write_json_atomic(out / f"{stem}.json",
                             {"config": dataclasses.asdict(config), **extra, "rows": rows})


def _cmd_label_budget(args: argparse.Namespace) -> int:
    from probe.cli.args import parse_ints
    from studies.analyses.label_budget import BudgetConfig, format_budget, label_budget, plot_budget

    config = BudgetConfig(
        losses=tuple(parse_names(args.losses)), ks=tuple(parse_ints(args.k, "--k") or ()),
        fractions=tuple(parse_floats(args.fractions, "--fractions") or ()),
        seed=args.draw_seed, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        train_seed=args.seed, device=args.device)
    rows = label_budget(args.store, config, log=_log(args))
    print(format_budget(rows))
    out = Path(args.out or "spml-analysis/label-budget")
    path = _write_json(out, "label_budget", config, rows)
    print(f"wrote {path} and {plot_budget(rows, out / 'label_budget.png')}")
    return 0


def _cmd_selection(args: argparse.Namespace) -> int:
    from probe.cli.args import parse_ints
    from studies.analyses.selection_check import (
        SelectionCheck,
        check_selection,
        format_selection,
        plot_selection,
        summarize_selection,
    )

    out = Path(args.out or "spml-analysis/selection")
    config = SelectionCheck(
        loss=args.loss, modes=tuple(parse_names(args.modes)),
        study_seeds=tuple(parse_ints(args.study_seeds, "--study-seeds") or ()),
        trials=args.trials, batch=args.batch,
        eval_seeds=tuple(parse_ints(args.eval_seeds, "--eval-seeds") or ()),
        epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, device=args.device,
        out=str(out))
    rows = check_selection(args.store, config, log=_log(args))
    table = format_selection(rows)
    print(table)
    path = _write_json(out, "selection", config, rows, summary=summarize_selection(rows))
    atomic_write_text(out / "selection.md", table + "\n")
    fig = plot_selection(rows, out / "selection.png")
    print(f"wrote {path}, {out / 'selection.md'} and {fig}")
    return 0


def _common(p: argparse.ArgumentParser, name: str, store: bool = True,
            files: str | None = None) -> None:
    files = files or name
    if store:
        p.add_argument("store", metavar="STORE",
                       help="feature store directory (from 'spml featurize' / 'spml import')")
    p.add_argument("--set", action="append", metavar="[LOSS.]KEY=VALUE",
                   help="a loss hyperparameter (repeatable); see the epilog")
    if store:
        g = p.add_argument_group("training (default: the paper setting of GR, or of the first "
                                 "loss, for the store's dataset; else Cole et al.'s)")
        add_training_overrides(g)
        g.add_argument("--seeds", default="0", metavar="S1,S2,...",
                       help="training seeds (init + batch order), stacked; default: 0")
        g.add_argument("--no-flip", action="store_true",
                       help="no flip augmentation (default: flip when the store has flips)")
        g.add_argument("--no-presets", action="store_true",
                       help="ignore the losses' paper presets for the store's dataset")
        add_observed_seed_argument(g)
        add_device_argument(g)
    g = p.add_argument_group("output")
    g.add_argument("--out", metavar="DIR",
                   help=f"folder for {files}.json, {files}.md and the PNGs "
                        f"(default: spml-analysis/{name})")
    g.add_argument("--dpi", type=int, default=150, help="figure resolution (default: 150)")
    if store:
        g.add_argument("--quiet", action="store_true", help="no progress bars")


def _run_options(p: argparse.ArgumentParser, files: str, name: str, quiet: str) -> None:
    """The store, training, device and output options of label-budget and selection."""
    p.add_argument("store", metavar="STORE", help="feature store directory")
    add_training_overrides(p)
    add_device_argument(p)
    p.add_argument("--out", metavar="DIR",
                   help=f"folder for {files} (default: spml-analysis/{name})")
    p.add_argument("--quiet", action="store_true", help=quiet)


def _parser(sub: argparse._SubParsersAction, name: str, help_: str, description: str,
            epilog: str, func: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_, description=textwrap.fill(description, width=88),
                       epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=func)
    return p


def register_cli(sub: argparse._SubParsersAction,
                 bench: argparse._SubParsersAction | None = None) -> None:
    top = sub.add_parser(
        "analyze",
        help="the GR paper's analyses: ablation, sensitivity, distinguishability, k̂ "
             "calibration, loss/gradient curves",
        description=textwrap.fill(
            "Reproduce the analyses of Chen et al., Generalized Robust Loss (IJCAI 2024) on a "
            "feature store with the probe engine: Table 3 (ablation), Fig. 2 (sensitivity), "
            "Fig. 3 (distinguishability), Fig. 5 (k̂ calibration) and Fig. 1 (loss and gradient "
            "curves). Each prints a table and writes JSON, Markdown and PNG files.", width=88),
        epilog="Run 'spml analyze ANALYSIS --help' for the options and examples of each.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    an = top.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)

    p = _parser(an, "ablation", "paper Table 3: GR with k̂ / v / robust L on and off",
                "Train the GR ablation of paper Table 3 on a store: the AN baseline, GR with each "
                "combination of k̂, v and the robust L switched on or off, and the learned (k̂, v) "
                "row; val and test mAP per row (mean ± std over --seeds).", _ABLATION_EPILOG,
                _cmd_ablation)
    _common(p, "ablation")

    p = _parser(an, "sensitivity", "paper Fig. 2: val/test mAP over τ, μ_T or q2 × q3",
                "Sweep one group of GR hyperparameters (paper Fig. 2), every point trained "
                "stacked in one run, and plot val and test mAP against it.", _SENSITIVITY_EPILOG,
                _cmd_sensitivity)
    p.add_argument("--param", required=True, choices=tuple(_SWEEP_FLAGS),
                   help="tau: τ at fixed b_T; mu: μ_T at fixed σ_T; q2q3: the q2 × q3 grid")
    g = p.add_argument_group("sweep values (comma lists; defaults: the paper's ranges)")
    g.add_argument("--tau", help="τ = −b_T/w_T values, > 0 (default 0.2,0.4,0.6,0.8,1)")
    g.add_argument("--b-T", dest="b_T", help="fixed b_T per curve, < 0 (default -2,-5,-8; "
                   "write --b-T=-2,-8)")
    g.add_argument("--mu-T", dest="mu_T", help="μ_T values in [0, 1] (default 0.2,0.3,…,1)")
    g.add_argument("--sigma-T", dest="sigma_T", help="fixed σ_T per curve, > 0 "
                   "(default 0.1,0.5,1)")
    g.add_argument("--q2", help="q2 values, >= 0 (default 0.01,0.1,0.5,1)")
    g.add_argument("--q3", help="q3 values, >= 0 (default 0.01,0.1,0.5,1,1.5)")
    g.add_argument("--no-baseline", action="store_true", help="do not train the AN baseline")
    _common(p, "sensitivity", files="sensitivity_PARAM")

    p = _parser(an, "distinguish", "paper Fig. 3: W1 between positive and negative "
                "unannotated confidences per epoch",
                "Per epoch, the Wasserstein-1 distance between the confidence distributions of "
                "the truly positive and the truly negative unannotated labels (paper Fig. 3), "
                "for one or more losses, with histograms at chosen epochs.",
                _DISTINGUISH_EPILOG, _cmd_distinguish)
    p.add_argument("--loss", default="gr,an",
                   help="losses to compare, trained in turn (default: gr,an)")
    p.add_argument("--split", choices=("train", "val"), default="train",
                   help="whose unannotated entries are measured (default: train)")
    p.add_argument("--hist-epochs", default="1,best,last", metavar="E1,E2,...",
                   help="completed epochs to histogram: numbers (0 = before training), 'best', "
                        "'last' (default: 1,best,last)")
    p.add_argument("--bins", type=int, default=50, help="histogram bins over [0, 1] "
                   "(default: 50)")
    _common(p, "distinguish")

    p = _parser(an, "calibration", "paper Fig. 5: FN/(FN+TN) per confidence bucket vs k̂",
                "Among the unannotated train entries, the observed fraction of true positives "
                "per confidence bucket before and after training, against GR's k̂ curve at the "
                "schedule's start and final values (paper Fig. 5, Appendix E.3).",
                _CALIBRATION_EPILOG, _cmd_calibration)
    p.add_argument("--loss", default="gr", help="the loss to train (default: gr)")
    p.add_argument("--buckets", type=int, default=100,
                   help="equal confidence buckets of [0, 1] (default: 100, as the paper)")
    _common(p, "calibration")

    p = _parser(an, "curves", "paper Fig. 1: loss and gradient of losses against p",
                "Draw the per-entry loss and its gradient w.r.t. the logit of registered losses "
                "on an unannotated label and on a positive, against p (paper Fig. 1), for "
                "teaching. Needs no store.", _CURVES_EPILOG, _cmd_curves)
    p.add_argument("--loss", default="an,hill,em,gr",
                   help="comma list of losses (default: an,hill,em,gr)")
    p.add_argument("--epochs", type=int, default=8,
                   help="length of the schedules (GR's w, b, μ, σ; SPLC) (default: 8)")
    p.add_argument("--at", metavar="E1,E2,...",
                   help="epochs of the schedule to draw, from 1 (default: 1 and --epochs)")
    p.add_argument("--points", type=int, default=199, help="values of p (default: 199)")
    p.add_argument("--classes", type=int, default=20,
                   help="classes of the sample (WAN weights unannotated entries by 1/(C−1); "
                        "default: 20)")
    _common(p, "curves", store=False)

    p = _parser(an, "label-budget", "test mAP of each loss as labels get scarcer (k positives "
                "per image, a fraction of images labelled)",
                "Train each loss on label budgets drawn from the store's full labels, seeded "
                "like the protocol and nested: k observed positives per image (k=1 is the "
                "protocol) on a fraction of the images (the rest unlabelled); report test mAP "
                "with 95% bootstrap intervals per loss and budget, as a table, JSON and a PNG.",
                "examples:\n  spml analyze label-budget yeast.zarr\n  spml analyze "
                "label-budget coco.zarr --losses an,gr,em --k 1,2,4 --fractions 1,0.5,0.1",
                _cmd_label_budget)
    p.add_argument("--losses", default="an,gr", help="comma list of losses (default: an,gr)")
    p.add_argument("--k", default="1,2,3", help="positives per image (default: 1,2,3)")
    p.add_argument("--fractions", default="1,0.5,0.25",
                   help="fractions of images labelled (default: 1,0.5,0.25)")
    p.add_argument("--draw-seed", type=int, default=1200,
                   help="seed of the budget draws (default: 1200, so k=1 on all images is the "
                   "protocol's draw)")
    p.add_argument("--seed", type=int, default=0, help="training seed (default: 0)")
    _run_options(p, "label_budget.json and .png", "label-budget", "no per-run lines on stderr")

    p = _parser(an, "selection", "does a study's winner beat the paper's values on test, per "
                "--select mode (val, cv:K, draws:N)?",
                "For each selection mode and study seed, run one study (sampler and training "
                "seed = the study seed), train its winner and the paper's values on the "
                "protocol's split with --eval-seeds, and report the winner's test mAP minus the "
                "paper values' (mean over study seeds, sd, worst, how often >= 0), as a "
                "Markdown table, JSON and a PNG. The studies are kept under OUT/studies: "
                "re-running resumes them. docs/selection.md shows the result on yeast.",
                "examples:\n  spml analyze selection yeast.zarr\n  spml analyze selection "
                "yeast.zarr --modes val,cv:5 --study-seeds 0,1,2 --trials 16", _cmd_selection)
    p.add_argument("--loss", default="gr", help="the loss whose search is checked (default: gr)")
    p.add_argument("--modes", default="val,cv:5,draws:5",
                   help="selection modes (default: val,cv:5,draws:5)")
    p.add_argument("--study-seeds", default="0,1,2,3,4",
                   help="one study per mode and seed (default: 0,1,2,3,4)")
    p.add_argument("--trials", type=int, default=24, help="trials per study (default: 24)")
    add_trials_at_once_argument(p, 8, "trials trained stacked")
    p.add_argument("--eval-seeds", default="0,1,2",
                   help="training seeds of the winner's and the paper's test runs (default: "
                   "0,1,2)")
    _run_options(p, "the studies, selection.json/.md/.png", "selection",
                 "no per-study lines on stderr")

