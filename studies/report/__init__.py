"""``spml report``: one study as a self-contained HTML page and a Markdown file with PNG figures.

Reads what ``spml study … --out DIR`` and ``spml study confirm`` leave behind -- the Optuna
storage (``DIR/study.log`` or ``DIR/study.db``, or any ``--storage``), the per-batch Parquet
results (``DIR/results``) and ``DIR/confirm.parquet`` when present -- and writes into ``out``
(default ``DIR/report``):

* ``report.html``: inline CSS, every figure a base64 ``data:`` URI, no script, no external
  asset: one file to mail or attach;
* ``report.md``: the same content, figures linked as files beside it;
* ``figures/*.png``: 150 dpi, titled, labelled axes (for papers);
* ``an_baseline.json``: the AN probe trained for the per-class comparison (when it ran).

Sections (:data:`SECTIONS`): summary (study, loss, store provenance, trial counts, best val mAP
against the paper point, the commands that reproduce it), leaderboard (val mAP, test mAP at the
best epoch, mean ± std over seeds where confirmed), optimisation history, fANOVA parameter
importances (``optuna.importance``), slice and contour plots, learning curves, and per-class
test AP of the best trial against an AN ("assume negative", Cole et al. 2021 Eq. 3) probe trained
on the same store with the same training settings. A section that cannot be drawn says why.

The package: :mod:`~studies.report.data` reads the study, :mod:`~studies.report.runs` trains the
runs it compares against, :mod:`~studies.report.sections` computes each section and draws its
figures, :mod:`~studies.report.render` writes the HTML and Markdown, and
:mod:`~studies.report.build` (:func:`build_report`) runs them in order.
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
