"""``spml study`` and ``spml study confirm``: thin argparse layers over :mod:`studies.study.run` and
:mod:`studies.results.confirm`."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from probe.cli.args import (
    add_device_argument,
    add_observed_seed_argument,
    add_priors_argument,
    add_training_overrides,
    add_trials_at_once_argument,
    print_report,
)
from probe.errors import SpmlError

STUDY_EPILOG = """\
examples:
  spml study yeast.zarr --loss gr --trials 64 --trials-at-once 16
  spml study coco.zarr --loss gr --params w_T,b_T --search-lr --storage study.log --workers 4
  spml study coco.zarr --loss gr --sampler grid --grid gr.b_T=-8,-4,-2 --grid gr.w_T=2,6,10
  spml study coco.zarr --loss opml --storage postgresql://me@db-host:5432/spml   # on each machine
  spml study confirm --storage spml-study/study.log --store yeast.zarr --top-k 3 --seeds 0,1,2

Parameters are named <loss>.<hparam> (gr.w_T) and train.<setting> (train.lr); the ranges come
from 'spml losses show LOSS' unless --space overrides them. The paper's values run first.
Results: <out>/results/batch-*.parquet (one file per trained batch, readable while running).
A worker that dies mid-trial leaves a trial whose heartbeat stops; after --grace seconds another
worker marks it failed and runs the same parameters again.
"""


def _ints(text: str | None, flag: str) -> tuple[int, ...]:
    from probe.cli.args import parse_ints

    return tuple(parse_ints(text, flag) or ())


def settings_from_args(args: argparse.Namespace):
    """The :class:`StudySettings` that ``spml study``'s arguments ask for (checked when the
    study runs)."""
    from probe.cli.args import parse_assignments, parse_sets
    from studies.study.settings import StudySettings
    from studies.study.space import parse_range

    fixed = parse_assignments(args.set)
    device, workers, devices = args.device, args.workers, ()
    if args.devices:
        devices = tuple(d.strip() for d in args.devices.split(",") if d.strip())
        if not devices:
            raise SpmlError(f"--devices expects DEV1,DEV2,... e.g. cuda:0,cuda:1; got "
                            f"{args.devices!r}")
        from probe.devices import resolve_device

        for name in devices:  # a typo fails here, not in every worker
            resolve_device(name)
        if workers == 1:
            workers = len(devices)  # one worker per device
        if len(devices) == 1:  # one worker (also each worker of a --devices run)
            device, devices = devices[0], ()
    grid = {key if "." in key else f"{args.loss}.{key}": tuple(values)
            for key, values in parse_sets(args.grid, "--grid").items()}
    same = ("store", "loss", "batch", "sampler", "pruner", "storage", "name", "out", "seed",
            "train_seed", "search_lr", "epochs", "batch_size", "lr", "val_labels", "select",
            "observed_seed", "priors")
    return StudySettings(
        **{key: getattr(args, key) for key in same}, n_trials=args.trials, fixed=fixed,
        space=dict(parse_range(s) for s in args.space or ()),
        params=tuple(args.params.split(",")) if args.params else None, grid=grid,
        batch_sizes=_ints(args.batch_sizes, "--batch-sizes"),
        epochs_choices=_ints(args.epochs_choices, "--epochs-choices"), device=device,
        enqueue_paper=not args.no_paper, heartbeat_seconds=args.heartbeat,
        grace_seconds=args.grace, workers=workers, devices=devices,
    )


def _study(args: argparse.Namespace) -> int:
    from studies.study.run import run_study
    from studies.study.settings import open_study_store

    settings = settings_from_args(args)
    command = None
    if settings.workers > 1:
        spec = settings.storage_spec()
        storage = {"postgresql": args.storage, "journal": f"journal:{spec.target}"}.get(
            spec.kind, spec.target)
        command = [sys.executable, "-m", "studies.cli", *args.argv, "--workers", "1",
                   "--storage", storage, "--as-worker"]
    summary = run_study(settings, worker_command=command, log=lambda m: print(m, file=sys.stderr),
                        verdict=not args.as_worker)
    if args.as_worker:  # one of several: the parent that started it prints the summary once
        return 0
    interrupted = ""
    if summary.n_interrupted:
        interrupted = (f", {summary.n_interrupted} interrupted by Ctrl-C (their parameters ran "
                       "again as new trials)")
    print(f"study {summary.name} in {summary.storage}: {summary.n_complete} complete, "
          f"{summary.n_pruned} pruned, {summary.n_failed} failed{interrupted}")
    if summary.best_value is not None:
        print(f"best val mAP {summary.best_value:.2f} in trial {summary.best_trial}; its "
              "parameters:")
        from studies.study.summary import param_lines

        print("\n".join(param_lines(settings.loss, summary.best_params)))
    for line in summary.facts:  # epochs, batch size, lr, --set values, draw, prior
        print(line)
    if summary.n_best_at_last:
        from probe.evaluation.convergence import ADVICE

        print(f"warning: {summary.n_best_at_last} of {summary.n_complete} completed trials had "
              f"their best val mAP at their last epoch (not converged); {ADVICE}")
    if settings.select == "val":  # a small val split: --select cv:5 picks better values
        n_val = len(open_study_store(settings.store).split("val"))
        if n_val < SMALL_VAL:
            print(f"note: the val split has {n_val} rows; on yeast (387) the winner of --select "
                  "cv:5 held up on test better than --select val's (docs/selection.md)")
    q = shlex.quote
    print(f"results: {Path(summary.out) / 'results'}")
    storage = f" --storage {q(summary.storage)}" if settings.storage else ""  # else in out
    name = f" --name {q(summary.name)}" if summary.several else ""
    print(f"next: spml report {q(summary.out)}{storage}{name} --store {q(settings.store)}")
    if summary.verdict_error:  # e.g. the store moved since: the study itself is done
        print(f"note: the winner was not tested against the paper values: "
              f"{summary.verdict_error}")
    if summary.verdict is not None:
        from studies.study.verdict import format_verdict

        print("\n".join(format_verdict(summary.verdict)))
    if args.json:
        from probe.engine.results import write_json_atomic

        write_json_atomic(args.json, summary.to_dict())
    return 0


def _confirm(args: argparse.Namespace) -> int:
    from studies.results.confirm import confirm_study, default_out, load_study
    from studies.study.storage import parse_storage

    study = load_study(args.storage, args.name)  # refuses a storage file that is not there
    out = Path(args.out) if args.out else default_out(args.storage)
    # the study's results folder: beside its storage file (in --out for PostgreSQL)
    beside = out if parse_storage(args.storage).kind == "postgresql" else default_out(args.storage)
    rows = confirm_study(
        study, args.store, top_k=args.top_k, seeds=_ints(args.seeds, "--seeds"),
        observed_seeds=(None if args.observed_seeds is None
                        else _ints(args.observed_seeds, "--observed-seeds")),
        out=out, device=args.device, log=lambda m: print(m, file=sys.stderr), progress=True,
        refit=args.refit, results=beside / "results")
    print(f"{'rank':>4} {'trial':>5}  {'val mAP':>8}  {'test mAP (mean ± std)':>22}  "
          f"{'95% interval':>16}  runs  params")
    for r in rows:
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in r.params.items())
        ci = f"[{r.test_low:.2f}, {r.test_high:.2f}]" if r.n_runs > 1 else "- (1 run)"
        print(f"{r.rank:>4} {r.trial:>5}  {r.val_mean:8.2f}  {r.test_mean:13.2f} ± "
              f"{r.test_std:5.2f}  {ci:>16}  {r.n_runs:>4}  {params}")
    win = rows[0]
    if win.refit_epochs is not None:
        ci = (f"[{win.refit_test_low:.2f}, {win.refit_test_high:.2f}]"
              if len(win.refit_test_maps) > 1 else "- (1 run)")
        print(f"refit: trial {win.trial} re-trained on train + val for {win.refit_epochs} "
              f"epochs (the median best val epoch): test mAP {win.refit_test_mean:.2f} "
              f"{ci} over {len(win.refit_test_maps)} runs (vs {win.test_mean:.2f} trained "
              "on train only)")
    print("95% interval: Student-t interval of the mean test mAP over the runs (training seeds "
          "x single-positive draws); it does not include the test-image variation that "
          "'spml compare' measures")
    print(f"wrote {out / 'confirm.parquet'} (read by 'spml report {out}') and "
          f"{out / 'best.json'} (for spml finetune --from-json)")
    return 0


SMALL_VAL = 1000  # val rows below which one split's val mAP is noisy enough to mislead a search


def register_cli(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "study",
        help="Optuna search over a loss's hyperparameters on the stacked probe engine",
        description=(
            "Search a loss's hyperparameters with Optuna: T trials are asked at once, trained "
            "stacked as one model, pruned by per-epoch val mAP, and told back. "
            "'spml study confirm' re-runs the best trials over several seeds."
        ),
        epilog=STUDY_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", help="feature store (from spml featurize / spml import)")
    p.add_argument("--loss", required=True, help="registered loss name (spml losses list)")
    p.add_argument("--trials", type=int, default=32, help="finished trials to reach (default 32)")
    add_trials_at_once_argument(p, 8)
    p.add_argument("--sampler", default="tpe", help="tpe (default) | gp | cmaes | random | grid")
    p.add_argument("--pruner", default="median", help="median (default) | none")
    p.add_argument("--storage", help="OUT/study.log by default: a journal file (one or several "
                   "processes; the fastest) | study.db (SQLite, one process) | "
                   "postgresql://user@host:port/db (many machines)")
    p.add_argument("--name", help="study name (default <dataset>-<loss>)")
    p.add_argument("--out", default="spml-study", help="results folder (default spml-study)")
    p.add_argument("--workers", type=int, default=1,
                   help="local worker processes (needs a journal or PostgreSQL storage)")
    p.add_argument("--devices", metavar="DEV1,DEV2,...",
                   help="one worker per device, e.g. cuda:0,cuda:1,cuda:2,cuda:3 (sets --workers; "
                   "needs a journal or PostgreSQL storage); cpu,cpu works too")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="hold a loss hyperparameter fixed (repeatable), e.g. --set use_v=false")
    p.add_argument("--space", action="append", metavar="NAME=LOW:HIGH[:log]",
                   help="override a range, or NAME=A,B,C for choices (repeatable)")
    p.add_argument("--params", help="search only these loss hyperparameters (comma list)")
    p.add_argument("--grid", action="append", metavar="NAME=V1,V2,...",
                   help="grid values for --sampler grid (repeatable)")
    lr = p.add_mutually_exclusive_group()
    lr.add_argument("--search-lr", action="store_true", default=None,
                    help="also search train.lr (log-uniform 1e-5..1e-1). Default: searched on a "
                    "store for which the loss has no paper preset (no paper gives its lr) "
                    "unless --lr is given; docs/selection.md")
    lr.add_argument("--no-search-lr", dest="search_lr", action="store_false",
                    help="never search train.lr: train at --lr, else the preset or generic lr")
    p.add_argument("--batch-sizes", help="also search train.batch_size among these, e.g. 8,16")
    p.add_argument("--epochs-choices", help="also search train.epochs among these")
    add_training_overrides(p)
    p.add_argument("--val-labels", default="clean", choices=("clean", "observed"),
                   help="select epochs on clean (default) or single-positive val labels")
    p.add_argument("--select", default="val", metavar="val|cv:K|draws:N",
                   help="how a trial is scored: val (default: the protocol's one split and "
                   "draw), cv:K (mean val mAP over K train/val re-splits of the pool) or draws:N "
                   "(mean over N single-positive draws); K or N times the heads, trained as one "
                   "stacked run, no pruning. "
                   "docs/selection.md measures which picks values that hold up on test")
    add_observed_seed_argument(p)
    add_priors_argument(p)
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--train-seed", type=int, default=0,
                   help="init/batch-order seed shared by all trials (default 0)")
    add_device_argument(p)
    p.add_argument("--no-paper", action="store_true", help="do not enqueue the paper's values")
    p.add_argument("--heartbeat", type=float, default=10.0, help="heartbeat interval, s (10)")
    p.add_argument("--grace", type=float, default=120.0,
                   help="retry a RUNNING trial silent this long, s (120)")
    p.add_argument("--json", help="write the summary as JSON here")
    p.add_argument("--as-worker", action="store_true", help=argparse.SUPPRESS)  # --workers N
    p.set_defaults(func=_study)

    b = bench.add_parser(
        "study",
        help="trials/min of a real 'spml study' (yeast or the COCO-shaped store) and where the "
        "time goes",
        description=(
            "Run one 'spml study' (one worker, a fresh storage in a temporary folder) on "
            "the real yeast set or the COCO-shaped synthetic store of 'spml bench probe', and "
            "print trials/min with the split of the wall time into train / eval / optuna / io "
            "/ setup, beside the machine and its load."
        ),
        epilog=(
            "examples:\n  spml bench study                       # yeast, GR, 64 trials, "
            "batch 16\n  spml bench study --store coco --trials-at-once 64 --epochs 8\n"
            "  spml bench study --store PATH --loss an --trials 32"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("--store", default="yeast",
                   help="yeast (river's copy, imported once into the cache; default) | coco "
                   "(the synthetic COCO-shaped store) | a store path")
    b.add_argument("--loss", default="gr", help="loss searched (default gr)")
    b.add_argument("--trials", type=int, default=64, help="finished trials (default 64)")
    add_trials_at_once_argument(b, 16, "trials stacked at once")
    b.add_argument("--epochs", type=int, help="epochs (default: the loss's preset)")
    b.add_argument("--batch-size", type=int, help="batch size (default: the loss's preset)")
    b.add_argument("--pruner", default="median", help="median (default) | none")
    b.add_argument("--storage", default="journal", choices=("journal", "sqlite"),
                   help="the study's storage kind, a fresh file in a temporary folder "
                   "(default journal, as spml study's default; sqlite to compare)")
    b.add_argument("--cache-dir",
                   help="where bench stores are cached (default ~/.cache/spml-probe)")
    b.add_argument("--json", help="also write the JSON report here")
    b.set_defaults(func=_bench_study)
    _register_bench_replicates(bench)


def _register_bench_replicates(bench: argparse._SubParsersAction) -> None:
    b = bench.add_parser(
        "replicates",
        help="a confirmation over seeds and a draws:N / cv:K study's replicates: stacked vs "
             "one run each vs one run, on a COCO-shaped store named coco",
        description=(
            "Trains one trial the way 'spml study confirm' trains it over --seeds training "
            "seeds, a '--select draws:N' study over --draws single-positive draws and a "
            "'--select cv:K' study over --folds re-splits of the pool: stacked (one pass), one "
            "run per replicate, and one run alone, on a cached COCO-shaped "
            "synthetic store whose dataset name is coco (the loss at its COCO paper preset). "
            "Prints each time, the stacked / one-run ratio, the arithmetic floor of the "
            "stacked heads (their products and Adam update alone), the largest test-mAP "
            "difference between stacked and one-run-each heads, and the machine with its load. "
            "Every mode runs once untimed first; each is then timed once."),
        epilog=("examples:\n"
                "  spml bench replicates            # an, 3 seeds, 5 draws, 5 folds, 16,384 "
                "rows\n"
                "  spml bench replicates --loss role --epochs 2\n"
                "  spml bench replicates --rows 65665 --device cuda   # COCO's train rows\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--loss", default="an", help="the confirmed trial's loss (default an)")
    b.add_argument("--rows", type=int, default=16_384,
                   help="train rows of the COCO-shaped store (default: 16,384; COCO: 65,665)")
    b.add_argument("--seeds", type=int, default=3,
                   help="training seeds, as spml study confirm --seeds (default: 3)")
    b.add_argument("--draws", type=int, default=5,
                   help="replicates of --select draws:N (default: 5)")
    b.add_argument("--folds", type=int, default=5,
                   help="replicates of --select cv:K (default: 5)")
    b.add_argument("--epochs", type=int, default=None,
                   help="epochs (default: the loss's COCO preset)")
    b.add_argument("--cache-dir", default=None,
                   help="where the synthetic store is kept (default: the bench cache)")
    b.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    add_device_argument(b)
    b.add_argument("--quiet", action="store_true", help="no progress bar while the store builds")
    b.set_defaults(func=_bench_replicates)


def _bench_replicates(args: argparse.Namespace) -> int:
    from studies.study.bench import (
        ReplicatesBenchConfig,
        bench_replicates,
        format_replicates_bench,
    )

    config = ReplicatesBenchConfig(loss=args.loss, rows=args.rows, seeds=args.seeds,
                                   draws=args.draws, folds=args.folds, epochs=args.epochs,
                                   cache_dir=args.cache_dir, device=args.device)
    report = bench_replicates(config, progress=not args.quiet and sys.stderr.isatty())
    print_report(format_replicates_bench(report), report, args.json)
    return 0


def _bench_study(args: argparse.Namespace) -> int:
    from probe.bench.engine import synthetic_store
    from studies.study.bench import (
        StudyBenchConfig,
        bench_study,
        format_study_bench,
        yeast_bench_store,
    )

    if args.store == "yeast":
        store = yeast_bench_store(args.cache_dir)
    elif args.store == "coco":
        store = synthetic_store(cache_dir=args.cache_dir, progress=sys.stderr.isatty())
    else:
        store = Path(args.store)
    config = StudyBenchConfig(store=str(store), loss=args.loss, n_trials=args.trials,
                              batch=args.batch, epochs=args.epochs, batch_size=args.batch_size,
                              pruner=args.pruner, storage=args.storage)
    report = bench_study(config)
    print_report(format_study_bench(report), report, args.json)
    return 0


def confirm_parser() -> argparse.ArgumentParser:
    """``spml study confirm`` (its own parser: see :func:`studies.cli.main`)."""
    from probe.cli.args import Parser

    c = Parser(
        prog="spml study confirm",
        description=(
            "Re-train the top-k trials of a study over several training seeds and "
            "single-positive draws; report test mAP as mean ± std (winner chosen on val)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: spml study confirm --storage spml-study/study.log --store yeast.zarr\n"
               "  writes spml-study/confirm.parquet and spml-study/best.json; then "
               "'spml report spml-study' shows the confirmed results",
    )
    c.add_argument("--storage", required=True, help="the study's storage (as given to spml study)")
    c.add_argument("--name", help="study name (default: the only study in the storage)")
    c.add_argument("--store", required=True, help="the feature store the study trained on")
    c.add_argument("--top-k", type=int, default=3, help="trials to confirm (default 3)")
    c.add_argument("--seeds", default="0,1,2", help="training seeds (default 0,1,2)")
    c.add_argument("--observed-seeds", help="draws to train on (default: the draw the study "
                   "trained on, --observed-seed; protocol draws not in the store are added)")
    c.add_argument("--out", help="folder for confirm.parquet and best.json (default: beside the "
                   "study, the folder of the --storage file, where 'spml report' finds them; "
                   "required for PostgreSQL)")
    c.add_argument("--refit", action="store_true",
                   help="then re-train the winner on train + val for the epochs val selected "
                   "and report its test mAP (per seed and draw)")
    add_device_argument(c)
    c.set_defaults(func=_confirm)
    return c
