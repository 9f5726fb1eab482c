"""``spml report``: one study as a self-contained HTML page and a Markdown file with PNG figures.

Reads what ``spml study … --out DIR`` and ``spml study confirm`` leave (the Optuna storage,
``DIR/results``, ``DIR/confirm.parquet``) and writes into ``out`` (default ``DIR/report``)
``report.html`` (inline CSS, figures as ``data:`` URIs, no script), ``report.md`` (figures
linked), ``figures/*.png`` (150 dpi) and ``an_baseline.json``. Its :data:`SECTIONS`: the
summary, the leaderboard, the optimisation history, fANOVA importances, slice and contour plots,
learning curves, per-class test AP against an AN probe (Cole et al. 2021 Eq. 3) and the paired
intervals; one that cannot be drawn says why. :mod:`~studies.report.data` reads the study,
:mod:`~studies.report.runs` trains the runs it compares against,
:mod:`~studies.report.sections` computes each section, :mod:`~studies.report.render` writes
HTML and Markdown, :mod:`~studies.report.build` (:func:`build_report`) runs them in order.
"""

from __future__ import annotations

from .build import ReportResult, build_report
from .data import study_command
from .sections import SECTIONS, ReportOptions

__all__ = [
    "SECTIONS",
    "ReportOptions",
    "ReportResult",
    "build_report",
    "study_command",
]
