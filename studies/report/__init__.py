"""``spml report``: one study as a self-contained HTML page and a Markdown file with PNG figures.

Reads what ``spml study … --out DIR`` and ``spml study confirm`` leave and writes into ``out``
(default ``DIR/report``) ``report.html`` (figures inline, no script), ``report.md``,
``figures/*.png`` and ``an_baseline.json``; a section of :data:`SECTIONS` that cannot be drawn
says why. :mod:`~studies.report.data` reads the study, :mod:`~studies.report.runs` trains the
runs it compares against, :mod:`~studies.report.sections` computes each section,
:mod:`~studies.report.render` writes HTML and Markdown, :func:`build_report` runs them in order.
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
