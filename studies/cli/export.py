"""``spml export``: a thin argparse layer over :func:`studies.results.export.export`."""

from __future__ import annotations

import argparse

EXPORT_EPILOG = """\
examples:
  spml export runs/gr runs/an --out all.csv          # every trial of two studies
  spml export runs/gr/confirm.parquet probe-an.json --out mixed.parquet
  spml export runs/gr --epochs --out curves.csv      # one row per trial and epoch

PATH may be a probe results JSON (spml probe --json), a study folder (spml study --out), its
results/ folder or batch files, a confirm.parquet (or the folder holding it), or a table this
command wrote. One row per trial (a confirmation: per re-run), one schema for all: params as one
JSON column with one key scheme for every source (<loss>.<name> for a loss hyperparameter, e.g.
gr.b_T, also for a probe run's; train.<name> for a training setting), mAP/AP in percent,
epochs counted from 1, and the settings each trial trained with (lr, batch_size, epochs,
optimizer, observed_seed, draw, prior, val_labels, store, backbone, loss_package, ...). In
Python: studies.results.export.collect(paths) returns the same table as a polars DataFrame.
"""


def _export(args: argparse.Namespace) -> int:
    from studies.results.export import export

    path, frame = export(args.paths, args.out, epochs=args.epochs)
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(
        frame.group_by("kind").len().iter_rows()) if k) if frame.height else "nothing"
    unit = "trial-epoch rows" if args.epochs else "rows"
    print(f"wrote {path}: {frame.height} {unit} ({kinds}), {frame.width} columns")
    return 0


def register_cli(sub: argparse._SubParsersAction,
                 bench: argparse._SubParsersAction | None = None) -> None:
    p = sub.add_parser(
        "export",
        help="collect probe runs, studies and confirmations into one CSV or Parquet table",
        description=("Collect the trials of probe runs, studies and confirmations into one "
                     "tidy table (one row per trial), written as CSV or Parquet."),
        epilog=EXPORT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="results to collect (see below)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="FILE.csv or FILE.parquet (the format follows the suffix)")
    p.add_argument("--epochs", action="store_true",
                   help="one row per trial and epoch (epoch, epoch_train_loss, epoch_val_map, "
                        "epoch_test_map) instead of one per trial")
    p.set_defaults(func=_export)
