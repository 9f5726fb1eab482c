"""``spml losses …``, ``spml probe``, ``spml bench probe`` and ``spml bench store``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from probe.cli.args import (
    add_device_argument,
    add_observed_seed_argument,
    add_priors_argument,
    add_training_overrides,
    parse_ints,
    parse_sets,
    wrap,
)
from probe.errors import SpmlError
from probe.evaluation.convergence import ADVICE, best_is_last
from probe.progress import plural


def _losses_list(args: argparse.Namespace) -> int:
    from probe import losses as _losses

    classes = {name: _losses.get_loss_class(name) for name in _losses.available()}
    rows = [{"name": name, "paper": cls.paper, "stateful": cls.stateful,
             "searchable": [s.name for s in cls.hparam_specs if s.search is not None],
             "origin": _losses.loss_origin(name)} for name, cls in classes.items()]
    failures = _losses.plugin_failures()
    if args.json:
        print(json.dumps(rows, indent=2))
        for failure in failures:  # the rows stay a list; what failed goes beside them
            print(f"warning: {failure}", file=sys.stderr)
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        flag = " [stateful]" if r["stateful"] else ""
        if r["origin"] != "the built-in loss":
            flag += f" [{r['origin']}]"
        print(f"{r['name']:<{width}}  {r['paper']}{flag}")
    print(f"\n{len(rows)} losses; 'spml losses show NAME' for the formula and hyperparameters.")
    if failures:
        print(f"\n{plural(len(failures), 'loss plugins')} failed to load (their losses are not "
              "listed):")
        for failure in failures:
            print(f"  {failure}")
    return 0


def _losses_show(args: argparse.Namespace) -> int:
    from probe import losses as _losses

    cls = _losses.get_loss_class(args.name)
    origin = _losses.loss_origin(args.name)
    if args.json:
        specs = [
            {"name": s.name, "default": s.default, "kind": s.kind, "valid": s.range_text(),
             "search": list(s.search) if s.search else None, "log": s.log, "doc": s.doc,
             "from_data": s.from_data}
            for s in cls.hparam_specs]
        print(json.dumps({"name": cls.name, "paper": cls.paper, "formula": cls.formula,
                          "hparams": specs, "presets": cls.presets,
                          "train_presets": cls.train_presets, "notes": cls.notes,
                          "origin": origin}, indent=2))
        return 0
    print(cls.describe())
    if origin != "the built-in loss":
        print(f"\nfrom {origin}")
    return 0


def loss_reference_markdown(plugins: bool = False) -> str:
    """docs/loss-reference.md: every built-in loss's card (``spml losses show``) as Markdown,
    generated from the registry so that the reference cannot drift from the code; with
    ``plugins``, the installed plugins' losses too."""
    from probe import losses as _losses

    parts = ["# Loss reference\n",
             "Generated from the loss registry by `spml losses doc > docs/loss-reference.md` "
             "(a test fails when this file and the code disagree). The specification the losses "
             "implement, with the conventions, is [losses.md](losses.md).\n"]
    for name in _losses.available():
        if not plugins and _losses.loss_origin(name) != "the built-in loss":
            continue
        parts.append(f"## {name}\n\n```text\n{_losses.get_loss_class(name).describe()}\n```\n")
    return "\n".join(parts)


def _losses_doc(args: argparse.Namespace) -> int:
    print(loss_reference_markdown(plugins=args.plugins), end="")
    return 0


def register_cli(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    losses = sub.add_parser(
        "losses",
        help="list the SPML losses, or show one's formula, paper, defaults and search ranges",
        description="The loss library (probe.losses): every loss of docs/losses.md by its name.")
    lsub = losses.add_subparsers(dest="losses_command", metavar="ACTION", required=True)
    p = lsub.add_parser(
        "list", help="one line per registered loss (built-in and plugins), and any plugin that "
                     "failed to load")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_losses_list)
    p = lsub.add_parser(
        "show", help="formula, paper, defaults, valid and searchable ranges, dataset presets",
        epilog="example: spml losses show gr")
    p.add_argument("name", help="registry name, e.g. gr, an, em_apl, opml")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_losses_show)
    p = lsub.add_parser(
        "doc", help="every loss's card as Markdown (docs/loss-reference.md is its output)",
        epilog="example: spml losses doc > docs/loss-reference.md")
    p.add_argument("--plugins", action="store_true",
                   help="also the losses of installed plugins (docs/plugins.md); without it, "
                        "the built-in losses only")
    p.set_defaults(func=_losses_doc)
    _register_probe(sub, bench)


_PROBE_EPILOG = """\
examples:
  spml probe yeast.zarr --loss an
  spml probe coco.zarr --loss gr --json runs/gr.json --save-head runs/gr.pt
  spml probe coco.zarr --loss gr --set w_T=2,5,10 --set mu_T=0.6,0.8     # 6 stacked trials
  spml probe coco.zarr --loss gr --set w_T=2,5,10 --set b_T=-2,-5,-8 --zip  # 3 trials
  spml probe coco.zarr --loss an --set lr=1e-5,1e-4,1e-3 --trials-seeds 0,1,2  # 9 trials
  spml probe coco.zarr --loss an --labels full          # the full-label oracle
  spml probe coco.zarr --loss knn --set k=10,20,50      # the training-free kNN baseline
  spml probe coco.zarr --eval-head runs/gr.pt           # evaluate a saved head

Trials: every --set KEY=V1,V2,... gives a list of values; the trials are the product over the
keys (first key slowest), or with --zip the i-th values of every list together (lists of one
value repeat). --trials-seeds crosses them with seeds. All trials train at once as one stacked
model. Keys are the loss's hyperparameters ('spml losses show NAME') plus the per-trial
trainer settings lr and weight_decay. Trials sharing a seed share init and batch order.

Defaults: batch size, learning rate and epochs come from the loss's paper settings for the
store's dataset (e.g. gr on coco: 16, 1e-5, 8), else Cole et al.'s linear-probe setting
(8, 1e-4, 25 epochs, Adam). EPR/ROLE's k comes from the dataset (Cole et al.'s expected
positives, else the val split's mean label count). The best epoch is chosen on val (clean
labels unless --val-labels observed); test mAP is reported at that epoch.
"""


def _trials_from_args(args: argparse.Namespace) -> tuple[list[dict], tuple[int, ...] | None]:
    from probe.engine.trials import expand_grid

    grid = expand_grid(parse_sets(args.set), zip_=args.zip)
    seeds = parse_ints(args.trials_seeds, "--trials-seeds")
    if seeds is None:
        return grid, None
    return [dict(g) for g in grid for _ in seeds], tuple(s for _ in grid for s in seeds)


def _print_result(result, stacked_keys: list[str]) -> None:
    best = result.best_trial()
    cols = ["trial", "seed", *stacked_keys, "best_ep", "val_mAP", "test_mAP", "test_95%_CI",
            "test_OF1", "test_CF1"]
    rows = []
    for tr in result.trials:
        settings = {**tr.hparams, "lr": tr.lr, "weight_decay": tr.weight_decay}
        b = tr.best
        low, high = b.get("test_map_low"), b.get("test_map_high")
        rows.append([str(tr.trial), str(tr.seed), *[f"{settings.get(k)}" for k in stacked_keys],
                     "-" if tr.best_epoch is None else str(tr.best_epoch),
                     *(f"{b[k]:.2f}" if k in b else "-" for k in ("val_map", "test_map")),
                     "-" if low is None or high is None else f"[{low:.2f}, {high:.2f}]",
                     *(f"{b[k]:.2f}" if k in b else "-" for k in ("test_OF1", "test_CF1"))])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    at_last = [tr.stopped_at is None and best_is_last([e.get("val_map") for e in tr.epochs])
               for tr in result.trials]
    for r, tr, last in zip(rows, result.trials, at_last):
        mark = "  <- best" if tr.trial == best and len(rows) > 1 else ""
        mark += "  (best = last epoch)" if last else ""
        stopped = f"  (stopped after epoch {tr.stopped_at})" if tr.stopped_at is not None else ""
        flag = "  (non-finite!)" if not tr.finite else ""
        print("  ".join(v.rjust(w) for v, w in zip(r, widths)) + mark + stopped + flag)
    if any(at_last):
        print(f"warning: {sum(at_last)} of {plural(len(at_last), 'trials')} had their best "
              f"epoch at the last one, so they may not have converged; {ADVICE}")


def _cmd_probe(args: argparse.Namespace) -> int:
    from probe.engine.config import TRAINER_KEYS, ProbeConfig
    from probe.engine.data import ProbeData
    from probe.engine.results import from_linear, load_head, save_head, write_json_atomic
    from probe.engine.speed import SpeedOptions
    from probe.engine.train import train_probe
    from probe.engine.trials import check_prior_request
    from probe.evaluation.heads import evaluate_head
    from probe.evaluation.intervals import (
        few_test_images,
        head_intervals,
        prefetch_bootstrap_counts,
    )
    from probe.io import check_writable
    from probe.knn import run_knn
    from probe.losses import check_hparams, get_loss_class

    config = ProbeConfig(
        batch_size=args.batch_size, lr=args.lr, epochs=args.epochs,
        weight_decay=args.weight_decay, optimizer=args.optimizer, momentum=args.momentum,
        seed=args.seed, flip=not args.no_flip, labels=args.labels, val_labels=args.val_labels,
        observed_seed=args.observed_seed, device=args.device, eval_every=args.eval_every,
        test_curve=args.test_curve, eval_init=args.eval_init, cuda_graph=args.cuda_graph,
        compile=args.compile,
        drop_last=not args.no_drop_last, use_presets=not args.no_presets,
        test_intervals=args.intervals, priors=args.priors,
    )
    speed = SpeedOptions(step_threads=args.step_threads, trial_block=args.trial_block)
    speed.validate()
    config.validate()
    for flag, path in (("--json", args.json), ("--save-head", args.save_head)):
        if path:  # refused now, not after the training
            check_writable(path, flag)
    if args.eval_head:
        head, meta = load_head(args.eval_head, trial=args.head_trial)
        data = ProbeData.from_store(args.store, device=args.device,
                                    observed_seed=args.observed_seed, flip=False)
        scores = evaluate_head(data, head.to(data.device))
        ci = ""
        if args.intervals > 0:
            (iv,) = head_intervals(data.test_x, data.test_labels, from_linear(head)[None],
                                   n_resamples=args.intervals).intervals
            scores.update(test_map_low=iv.low, test_map_high=iv.high)
            ci = f" [{iv.low:.2f}, {iv.high:.2f}]"
        print(f"{args.eval_head} (loss {meta.get('loss')}, trial {args.head_trial}) on "
              f"{args.store}: val mAP {scores['val_map']:.2f}, test mAP {scores['test_map']:.2f}"
              f"{ci}, test OF1 {scores['test_OF1']:.2f}, CF1 {scores['test_CF1']:.2f}")
        if args.json:
            write_json_atomic(args.json, {"head": str(args.eval_head), "meta": meta, **scores})
        return 0
    trials, seeds = _trials_from_args(args)
    if args.loss != "knn":  # name bad hyperparameters before a large store is loaded
        cls = get_loss_class(args.loss)
        for t in trials:
            check_hparams(cls.hparam_specs, {k: v for k, v in t.items()
                                             if k not in TRAINER_KEYS}, cls.name)
        check_prior_request(cls, args.priors)  # a missing or unwanted --priors: before loading
    elif args.priors is not None:
        raise SpmlError(f"the kNN baseline uses no prior, but --priors {args.priors} was given; "
                        "drop --priors")
    if seeds is not None:
        config = dataclasses.replace(config, seeds=seeds)
        config.validate()
    data = ProbeData.from_store(args.store, device=args.device,
                                observed_seed=args.observed_seed, flip=not args.no_flip,
                                priors=args.priors)
    if args.loss == "knn":
        if args.save_head:
            raise SpmlError("--save-head: the kNN baseline has no trained head")
        result = run_knn(data, config, trials, backend=args.knn_backend)
    else:
        if args.intervals > 0:  # the resamples are drawn on a thread while training runs
            prefetch_bootstrap_counts(data.test_x.shape[0], args.intervals)
        result = train_probe(data, config, args.loss, trials, progress=not args.quiet,
                             speed=speed)
    stacked = sorted({k for t in trials for k in t})
    cfg = result.config
    where = f"{data.dataset}, {data.n_train} train rows, {cfg.get('device', data.device)}"
    if args.loss == "knn":
        print(f"knn baseline on {args.store} ({where}), {plural(result.n_trials, 'trials')}")
    else:
        per_epoch = result.timing["train_seconds"]
        lr = "per trial" if "lr" in stacked else f"{cfg['lr']:g}"
        print(f"{result.loss} on {args.store} ({where}): {plural(result.n_trials, 'trials')}, "
              f"batch {cfg['batch_size']}, lr {lr}, {plural(cfg['epochs'], 'epochs')}, "
              f"{cfg['optimizer']}; {sum(per_epoch) / max(len(per_epoch), 1):.2f} s/epoch")
        for note in cfg.get("notes", []):
            print(f"  note: {note}")
    _print_result(result, stacked)
    if "test_interval" in cfg:
        print(f"test_95%_CI: paired bootstrap over the {data.test_x.shape[0]} test images "
              f"({cfg['test_interval']['n_resamples']} resamples); compare heads with "
              "'spml compare'")
        warning = few_test_images(data.test_x.shape[0])
        if warning:
            print(warning, file=sys.stderr)
    if args.json:
        result.write_json(args.json)
        print(f"results written to {args.json}")
    if args.save_head:
        save_head(args.save_head, result)
        print(f"best-epoch heads of all trials saved to {args.save_head}")
    return 0


def _cmd_bench_probe(args: argparse.Namespace) -> int:
    import torch

    from probe.bench.engine import BenchConfig, format_report, run_bench
    from probe.engine.results import versioned, write_json_atomic

    trials = tuple(parse_ints(args.trials, "--trials") or ())
    config = BenchConfig(
        n_train=args.rows, dim=args.dim, n_classes=args.classes, batch_size=args.batch_size,
        epochs=args.epochs, trials=trials, plain=not args.no_plain, device=args.device,
        cache_dir=args.cache_dir, papers=not args.no_papers, papers_workers=args.papers_workers,
        compare_eager=args.compare_eager, compare_one_block=args.compare_one_block,
        compare_compiled=args.compare_compiled,
        isolate=not args.in_process, loss=args.loss, profile=args.profile,
    )
    if args.threads is not None:
        if args.threads < 1:
            raise SpmlError(f"--threads must be >= 1; got {args.threads}")
        torch.set_num_threads(args.threads)
    report = run_bench(config, progress=not args.quiet)
    print(format_report(report))
    print(json.dumps(versioned(report), indent=1))
    if args.json:
        write_json_atomic(args.json, report)
    return 0


def _cmd_bench_store(args: argparse.Namespace) -> int:
    from probe.bench.store import format_store_report, run_store_bench

    report = run_store_bench(repeats=args.repeats, zstd_chunks=args.zstd_chunks,
                             cache_dir=args.cache_dir, progress=not args.quiet)
    print(format_store_report(report))
    print(json.dumps(report, indent=1))
    return 0


def _register_probe(sub: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "probe",
        help="train linear heads on a feature store with an SPML loss (many trials at once)",
        description=wrap(
            "Train T linear heads (trials) with one SPML loss on a feature store, all at once on "
            "the device, evaluating val mAP (and OF1/CF1) after every epoch; the best epoch of "
            "each trial is chosen on val and test is measured once on its head. Prints one line "
            "per trial."),
        epilog=_PROBE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("store", help="feature store directory (from 'spml featurize'/'spml import')")
    p.add_argument("--loss", default="an",
                   help="loss registry name ('spml losses list'), or 'knn' for the kNN "
                   "baseline (default: an)")
    p.add_argument("--set", action="append", metavar="KEY=V[,V...]",
                   help="a loss hyperparameter (or lr / weight_decay) per trial; comma lists "
                   "stack trials (repeatable)")
    p.add_argument("--zip", action="store_true",
                   help="combine --set lists element-wise instead of as a product")
    p.add_argument("--trials-seeds", metavar="S1,S2,...",
                   help="run every trial once per seed (init + batch order), e.g. 0,1,2")
    p.add_argument("--seed", type=int, default=0, help="seed of all trials (default: 0)")
    g = p.add_argument_group("training (default: the loss's paper setting for the dataset)")
    add_training_overrides(g)  # --epochs, --batch-size, --lr
    g.add_argument("--weight-decay", type=float, default=0.0,
                   help="L2 weight decay of the head (default: 0)")
    g.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                   help="default: adam (every SPML paper)")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    g.add_argument("--no-flip", action="store_true",
                   help="no flip augmentation (default: flip when the store has flipped features)")
    g.add_argument("--no-drop-last", action="store_true",
                   help="also train on the last partial batch (default: dropped, as Cole et al.)")
    g.add_argument("--no-presets", action="store_true",
                   help="ignore the loss's paper presets for the store's dataset")
    g = p.add_argument_group("labels and evaluation")
    g.add_argument("--labels", choices=("observed", "full"), default="observed",
                   help="train on the single positives (default) or the full labels (oracle)")
    g.add_argument("--val-labels", choices=("clean", "observed"), default="clean",
                   help="labels that choose the best epoch (default: clean = full labels)")
    add_observed_seed_argument(g)
    add_priors_argument(g)
    g.add_argument("--eval-every", type=int, default=1,
                   help="evaluate val every N epochs and after the last (default: 1); test is "
                   "measured once, at the end, on each trial's best-val head")
    g.add_argument("--test-curve", action="store_true",
                   help="also measure test at every evaluated epoch (the per-epoch test curve in "
                   "--json; the reported figures are the same)")
    g.add_argument("--eval-init", action="store_true",
                   help="also evaluate the untrained heads before training")
    g = p.add_argument_group("device and output")
    add_device_argument(g)
    g.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                   help="CUDA: replay the training steps as captured CUDA graphs (same heads "
                   "bit for bit; 5-14x faster epochs on an H100). Default: wherever the step "
                   "can be captured; --cuda-graph: required (an error says why not); "
                   "--no-cuda-graph: the eager step")
    g.add_argument("--compile", action="store_true",
                   help="run the training step through torch.compile (fused kernels; equal to "
                   "the eager step to float rounding; the eager step where it cannot apply)")
    g.add_argument("--trial-block", type=int, default=None, metavar="N",
                   help="CPU: train the stacked trials in blocks of N, one after the other, so "
                   "that a block's heads and Adam state stay in cache (the same heads). Default: "
                   "sized to the cache; 0: one block")
    g.add_argument("--step-threads", type=int, default=None, metavar="N",
                   help="CPU: threads of the training steps (the heads agree to float rounding "
                   "on any number). Default: one, or torch's setting where measured clearly "
                   "faster once per machine and step shape (remembered in $SPML_CACHE_DIR or "
                   "~/.cache/spml-probe/step-threads.json; delete it to measure again)")
    g.add_argument("--json", metavar="PATH",
                   help="write config, per-epoch metrics and the best epoch of every trial")
    g.add_argument("--save-head", metavar="PATH", help="save the best-epoch heads (torch file)")
    g.add_argument("--eval-head", metavar="PATH",
                   help="evaluate a saved head on the store instead of training")
    g.add_argument("--head-trial", type=int, default=0,
                   help="which trial of --eval-head's file (default: 0)")
    g.add_argument("--knn-backend", choices=("auto", "faiss", "torch"), default="auto",
                   help="kNN search: faiss if installed (auto), or exact torch search")
    g.add_argument("--intervals", type=int, default=1000, metavar="B",
                   help="bootstrap resamples of the test images for each trial's 95%% interval "
                   "of test mAP (default: 1000; 0: none)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_probe)
    _register_bench_probe(bench)
    _register_bench_store(bench)


def _register_bench_probe(bench: argparse._SubParsersAction) -> None:
    b = bench.add_parser(
        "probe",
        help="seconds per epoch of the probe engine vs a plain PyTorch loop; T stacked trials",
        description=wrap(
            "On a COCO-shaped synthetic store (built once and cached) measure (a) one GR trial "
            "at batch size 16 with Adam, engine vs a plain DataLoader + nn.Linear + "
            "torch.optim.Adam loop with the same semantics, (b) T stacked trials, (c) peak "
            "memory. Medians over the measured epochs; printed as a table, then as JSON."),
        epilog=(
            "examples:\n  spml bench probe\n  spml bench probe --trials 1,8 --epochs 2 "
            "--threads 2\n  spml bench probe --rows 2000 --dim 256 --epochs 1 --json b.json\n\n"
            "Targets (docs/design.md): 2 CPU cores, 1 trial <= 2.5 s/epoch (plain loop ~8 s); one "
            "H100, 64 trials <= 1 s/epoch."),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--rows", type=int, default=65_665,
                   help="train rows of the synthetic store (default: COCO's 65,665)")
    b.add_argument("--dim", type=int, default=2048, help="feature dimension (default: 2048)")
    b.add_argument("--classes", type=int, default=80, help="classes (default: 80)")
    b.add_argument("--batch-size", type=int, default=16, help="default: 16 (GR on COCO)")
    b.add_argument("--epochs", type=int, default=3,
                   help="measured epochs per configuration, median reported (default: 3)")
    b.add_argument("--trials", default="1,8,64",
                   help="stacked trial counts to time (default: 1,8,64)")
    b.add_argument("--loss", default="gr",
                   help="the loss the engine rows train (default: gr); a loss that reads a "
                   "prior (vlpl, gpr) gets a synthetic one in the bench store; the plain and "
                   "papers-style loops run for gr only")
    b.add_argument("--no-plain", action="store_true", help="skip the plain PyTorch loop")
    b.add_argument("--no-papers", action="store_true",
                   help="skip the papers-style loop (DataLoader workers, metrics every epoch)")
    b.add_argument("--papers-workers", type=int, default=2,
                   help="DataLoader worker processes of the papers-style loop (default: 2)")
    b.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    add_device_argument(b)
    b.add_argument("--compare-eager", action="store_true",
                   help="CUDA: also time each stacked configuration with the eager step "
                   "(spml probe --no-cuda-graph; the engine rows replay CUDA graphs), its heads "
                   "compared with the graph run's")
    b.add_argument("--compare-compiled", action="store_true",
                   help="also time each stacked configuration with the step through "
                   "torch.compile (spml probe --compile), its heads compared with the engine's")
    b.add_argument("--compare-one-block", action="store_true",
                   help="CPU: also time each configuration that trains in trial blocks (spml "
                   "probe --trial-block) as one block, its heads compared with the blocks'")
    b.add_argument("--in-process", action="store_true",
                   help="time every configuration in this process, one after the other "
                   "(default: each alone in a fresh process, so the rows do not disturb each "
                   "other)")
    b.add_argument("--profile", action="store_true",
                   help="also profile one more training epoch of each engine row, after its "
                   "timed epochs (torch.profiler): wall time, the device's busy share, kernel "
                   "and CUDA-graph launches and the most expensive operators, in the JSON row "
                   "as 'profile' and summed up under the table")
    b.add_argument("--json", metavar="PATH", help="also write the JSON report to PATH")
    _add_bench_options(b)
    b.set_defaults(func=_cmd_bench_probe)


def _register_bench_store(bench: argparse._SubParsersAction) -> None:
    b = bench.add_parser(
        "store",
        help="seconds to load a COCO-sized store from the page cache; what its format costs",
        description=wrap(
            "On the COCO-shaped synthetic store of 'spml bench probe' (built once and cached), "
            "time ProbeData.from_store (what spml probe and every study worker do) against the "
            "previous zarr read path, the CRC-32C check alone, and zstd's size and decode speed "
            "on a few chunks. Medians; machine and load average printed; then JSON."),
        epilog="examples:\n  spml bench store\n  spml bench store --repeats 9\n\n"
        "Target (docs/protocol.md \"The feature store\"): <= 1 s from the page cache.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--repeats", type=int, default=5, help="timed loads (default: 5)")
    b.add_argument("--zstd-chunks", type=int, default=8,
                   help="feature chunks compressed to measure zstd (default: 8)")
    _add_bench_options(b)
    b.set_defaults(func=_cmd_bench_store)


def _add_bench_options(b: argparse.ArgumentParser) -> None:
    """The options ``spml bench probe`` and ``spml bench store`` share."""
    b.add_argument("--cache-dir",
                   help="where the synthetic store is cached (default: $SPML_CACHE_DIR or "
                   "~/.cache/spml-probe)")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
