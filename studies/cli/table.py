"""``spml table``: a thin argparse layer over :func:`studies.table.build_table`."""

from __future__ import annotations

import argparse
import sys

from probe.cli.args import (
    add_device_argument,
    add_training_overrides,
    parse_names,
    parse_seeds,
    print_report,
)

TABLE_EPILOG = """\
examples:
  spml table yeast.zarr --include full --out t/
  spml table yeast.zarr --observed-seeds 1200,1,2 --include full --out t/
  spml table yeast.zarr --losses gr --observed-seeds 1200,1,2,3 --out t/   # only new cells
  spml table coco.zarr --priors clip --out t/          # + vlpl, gpr and the zero-shot row
  spml table yeast.zarr --losses an,em,gr --tune 16 --out t/    # a tuned row per loss
  spml table yeast.zarr --observed-seeds 1200,1,2 --tune grid --out t/   # rows chosen on val
  spml table voc.zarr coco.zarr --losses an,gr --from runs/gr-study --out t/

Rows: every loss (--losses all) at its paper preset for each store's dataset, or the generic
setting where a paper gives none (said below the table); --include full adds the full-label
oracle; --priors NAME the losses that read that store prior and the zero-shot row (the prior's
scores as the classifier); --tune N an N-trial study per loss, its winner as a
row; --tune grid each loss row's cell on each draw the grid setting with the best val mAP;
--from a study's winner. A row's draws train as one stacked run (--no-stack: one run per
cell). Columns: one per store (its dataset). A cell is the test mAP at the best-val
epoch, mean over the draws (--observed-seeds; default: every draw the store holds) with its
95% interval; bold = the column's best; a dagger = not significantly worse than it (paired
bootstrap over the same test images, Holm within the column). With --out, every trained cell
is kept (keyed by its settings): a rerun trains nothing, a larger table only its new cells.
--out also gets table.md, table.tex (booktabs), cells.parquet / cells.csv (the 'spml export'
rows, one per cell and draw) and commands.sh (the 'spml probe' command of every cell).
docs/tables.md explains the marks and the keys.
"""


def _table(args: argparse.Namespace) -> int:
    from studies.table import TableConfig, build_table, write_outputs

    losses = None if args.losses == "all" else tuple(parse_names(args.losses, "--losses"))
    include = parse_names(args.include, "--include") if args.include else []
    if bad := [what for what in include if what != "full"]:
        from studies.table import TableError

        raise TableError(f"--include: 'full' (the full-label oracle) is the only row to "
                         f"include; got {bad[0]!r}")
    seeds = (tuple(parse_seeds(args.observed_seeds, "--observed-seeds"))
             if args.observed_seeds else None)
    tune, grid = _tune(args.tune, args.grid, args.epochs)
    config = TableConfig(
        losses=losses, include_full="full" in include, observed_seeds=seeds, priors=args.priors,
        tune=tune, grid=grid, stack=not args.no_stack, select=args.select,
        from_studies=tuple(args.from_study or ()), seed=args.seed, epochs=args.epochs,
        batch_size=args.batch_size, lr=args.lr,
        out=args.out, device=args.device, resamples=args.resamples,
        metrics=tuple(parse_names(args.metrics, "--metrics")), stat=args.stat)
    from probe.progress import plural

    table = build_table(args.stores, config, progress=not args.quiet,
                        log=lambda m: print(m, file=sys.stderr))
    print(table.markdown(), end="")
    if args.out:
        written = write_outputs(table, args.out)
        print(f"\n{plural(table.n_trained, 'cells')} trained; written: "
              + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0


def _tune(text: str, grid_items: list[str] | None, epochs: int | None) -> tuple[int, object]:
    """``--tune``: ``grid`` (the equal grid; ``--grid`` overrides its values) or a number of
    trials N (an Optuna study per loss) -> (trials, Grid or None)."""
    from studies.table import TableError
    from studies.table.grid import Grid

    value = str(text).strip().lower()
    if value == "grid":
        return 0, Grid.parse(grid_items or (), epochs=epochs)
    if grid_items:
        raise TableError("--grid sets the values of --tune grid; add --tune grid")
    try:
        return int(value), None
    except ValueError:
        raise TableError(f"--tune: grid (every loss row chosen per draw from the equal grid) "
                         f"or a number of trials N (an Optuna study per loss, e.g. --tune 16); "
                         f"got {text!r}") from None


def register_cli(sub: argparse._SubParsersAction,
                 bench: argparse._SubParsersAction | None = None) -> None:
    p = sub.add_parser(
        "table",
        help="the paper's Table 1: every loss (and the oracle, zero-shot, tuned rows) on each "
             "store, mean test mAP over draws with intervals and significance marks",
        description="Rows = methods, columns = stores; Markdown on stdout, and with --out "
                    "LaTeX, Parquet/CSV and the reproducing command of every cell.",
        epilog=TABLE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("stores", nargs="+", metavar="STORE", help="feature stores, one column each")
    p.add_argument("--losses", default="all",
                   help="comma list of losses ('spml losses list'), or all (default)")
    p.add_argument("--include", metavar="full",
                   help="full: also the full-label oracle (spml probe --labels full)")
    p.add_argument("--observed-seeds", metavar="S1,S2,...",
                   help="single-positive draws of every cell (default: every draw the store "
                   "holds; 'spml draw' adds one)")
    p.add_argument("--priors", metavar="NAME",
                   help="a store prior: adds the losses that read it (vlpl, gpr) and the "
                   "zero-shot row")
    p.add_argument("--tune", default="0", metavar="N|grid",
                   help="N: also an N-trial study per loss (same sampler, seed and --select), "
                   "its winner as a row (needs --out); grid: every loss row's batch size, lr "
                   "and weight decay chosen per draw on val mAP from the tabular benchmark's "
                   "grid (batch {8,16} x lr {1e-2..1e-5} x weight decay {1e-2..1e-5}, 10 "
                   "epochs; --epochs sets its epochs)")
    p.add_argument("--grid", nargs="+", metavar="NAME=V1,V2",
                   help="with --tune grid: other values for batch_size, lr, weight_decay or "
                   "epochs, e.g. --grid batch_size=8 lr=1e-2,1e-3")
    p.add_argument("--select", default="val",
                   help="how a --tune study scores a trial: val | cv:K | draws:N (as spml study)")
    p.add_argument("--from", dest="from_study", action="append", metavar="STUDY_DIR",
                   help="a study folder ('spml study --out'): its winner as a row (repeatable)")
    p.add_argument("--seed", type=int, default=0,
                   help="training seed of every cell, and the tuning sampler's (default: 0)")
    add_training_overrides(p)  # of every cell
    p.add_argument("--out", metavar="DIR",
                   help="keep the cells here (resumable) and write table.md, table.tex, "
                   "cells.parquet, cells.csv, commands.sh")
    p.add_argument("--resamples", type=int, default=1000,
                   help="bootstrap resamples of the test images (default: 1000)")
    p.add_argument("--metrics", default="map", metavar="NAMES",
                   help="one table per metric, comma-separated: map (default; the marks' "
                   "metric), OF1, CF1, and the multi-label-learning metrics ranking_loss, "
                   "one_error, coverage, average_precision, hamming_loss, hamming_loss_tuned, "
                   "macro_auc (bold by each one's direction; docs/benchmarks.md)")
    p.add_argument("--stat", choices=("interval", "std"), default="interval",
                   help="beside each mean: its interval (default), or the standard deviation "
                   "over the draws (the papers' mean ± std)")
    add_device_argument(p)
    p.add_argument("--no-stack", action="store_true",
                   help="one run per cell: the reference the stacked pass equals within float "
                   "rounding")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_table)
    if bench is not None:
        _register_bench_table(bench)


def _bench_table(args: argparse.Namespace) -> int:
    from studies.table.bench import TableBenchConfig, bench_table, format_table_bench

    losses = ("all",) if args.losses == "all" else tuple(parse_names(args.losses, "--losses"))
    config = TableBenchConfig(store=args.store, rows=args.rows, losses=losses, draws=args.draws,
                              epochs=args.epochs, cache_dir=args.cache_dir, device=args.device)
    report = bench_table(config, progress=not args.quiet)  # the tables' notes: not the bench's
    print_report(format_table_bench(report), report, args.json)
    return 0


def _register_bench_table(bench: argparse._SubParsersAction) -> None:
    b = bench.add_parser(
        "table",
        help="spml table stacked (every draw of a row in one pass) vs one run per cell, on a "
             "COCO-shaped store named coco",
        description=(
            "Builds the same spml table twice in one process, stacked and with --no-stack, on a "
            "cached COCO-shaped synthetic store whose dataset name is coco (so every loss "
            "trains at its COCO paper preset: its own epochs, batch size and lr), and prints "
            "both wall times, their ratio, the largest difference between the two tables' "
            "cells and the machine with its load. One run each (a table is one long run)."),
        epilog=("examples:\n"
                "  spml bench table\n"
                "  spml bench table --store yeast --losses an,gr,em,role\n"
                "  spml bench table --losses an,role --rows 4096 --epochs 2\n"
                "  spml bench table --losses all --rows 65665   # COCO's train rows, every "
                "loss: hours on 2 cores\n"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--store", choices=("coco", "yeast"), default="coco",
                   help="coco (default): the COCO-shaped synthetic store named coco; yeast: "
                   "the real yeast set (2,417 rows, each loss at its yeast or generic setting)")
    b.add_argument("--rows", type=int, default=16_384,
                   help="train rows of the COCO-shaped store (default: 16,384; COCO: 65,665)")
    b.add_argument("--losses", default="an,gr,em,em_apl,ll_r",
                   help="the table's rows, comma-separated, or all (default: "
                   "an,gr,em,em_apl,ll_r; role's dense per-example Adam costs many minutes at "
                   "COCO's shape)")
    b.add_argument("--draws", type=int, default=3,
                   help="single-positive draws per row (default: 3)")
    b.add_argument("--epochs", type=int, default=None,
                   help="the same epochs for every row (default: each loss's COCO preset)")
    b.add_argument("--cache-dir", default=None,
                   help="where the synthetic store is kept (default: the bench cache)")
    b.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    add_device_argument(b)
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(func=_bench_table)
