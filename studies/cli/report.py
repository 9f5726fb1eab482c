"""``spml report``: a thin argparse layer over :func:`studies.report.build_report`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from probe.cli.args import DEVICE_HELP, add_device_argument
from probe.errors import SpmlError

REPORT_EPILOG = """\
examples:
  spml report spml-study                       # reads spml-study/study.log (or study.db)
  spml report spml-study --store yeast.zarr    # the store for the AN baseline, if it moved
  spml report runs/coco-gr --storage postgresql://me@db-host:5432/spml --name coco-gr
  spml report spml-study --out paper/figs --no-baseline

Writes OUT/report.html (one self-contained file: figures embedded, no scripts, no external
files), OUT/report.md with OUT/figures/*.png (150 dpi) beside it, and OUT/an_baseline.json.
OUT defaults to STUDY_DIR/report. Sections: summary (with the commands that reproduce the
study), leaderboard (test mAP at the best epoch; mean ± std over seeds after 'spml study
confirm'), optimisation history, fANOVA parameter importances, slice and contour plots,
learning curves, per-class test AP of the best trial vs an AN probe trained on the same store
with the same settings. A section that cannot be drawn (too few trials, one parameter, no
store) says why. The report reads the study without changing it, also while it runs.
"""


def _report(args: argparse.Namespace) -> int:
    from studies.report import ReportOptions, build_report

    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise SpmlError(f"--out {args.out}: is a file; expected a folder for the report")
    options = ReportOptions(top=args.top, baseline=not args.no_baseline, device=args.device,
                            dpi=args.dpi, progress=True)
    result = build_report(args.study_dir, storage=args.storage, name=args.name, store=args.store,
                          out=args.out, options=options,
                          log=lambda m: print(m, file=sys.stderr))
    for title, reason in result.skipped.items():
        print(f"{title}: skipped: {reason}", file=sys.stderr)
    print(f"wrote {result.html_path} (self-contained), {result.md_path} and "
          f"{len(result.figures)} figures in {result.md_path.parent / 'figures'}")
    return 0


def register_cli(sub: argparse._SubParsersAction,
                 bench: argparse._SubParsersAction | None = None) -> None:
    p = sub.add_parser(
        "report",
        help="HTML + Markdown report of a study, with PNG figures",
        description=(
            "Write a report of an Optuna study made by 'spml study': a self-contained HTML "
            "page and a Markdown file with PNG figures (history, importances, slices, "
            "contours, learning curves, per-class AP against the AN baseline)."
        ),
        epilog=REPORT_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("study_dir", metavar="STUDY_DIR",
                   help="the folder given to 'spml study --out' (holds study.log or study.db, "
                        "results/ and, after 'spml study confirm', confirm.parquet)")
    p.add_argument("--storage", help="the study's storage when it is not STUDY_DIR/study.log or "
                   "study.db: a file or postgresql://user@host:port/db")
    p.add_argument("--name", help="study name (default: the only study in the storage)")
    p.add_argument("--store", help="feature store for the AN baseline (default: the path the "
                   "study recorded)")
    p.add_argument("--out", help="output folder (default STUDY_DIR/report)")
    p.add_argument("--top", type=int, default=10, help="leaderboard rows (default 10)")
    p.add_argument("--dpi", type=int, default=150, help="figure resolution (default 150)")
    p.add_argument("--no-baseline", action="store_true",
                   help="do not train the AN baseline (skips the per-class section)")
    add_device_argument(p, help="where the AN baseline trains: " + DEVICE_HELP)
    p.set_defaults(func=_report)
