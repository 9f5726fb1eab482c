"""``build_report``: reads the study, trains the runs it compares against, computes the
sections and writes ``report.html``, ``report.md`` and the figures."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from probe.io import atomic_write_text

from .data import open_study_view, report_commands
from .render import Figure, Note, render_html, render_markdown
from .runs import train_report_runs
from .sections import (
    ReportOptions,
    baseline_section,
    comparison_section,
    compute_importances,
    contours_section,
    curves_section,
    history_section,
    importance_section,
    leaderboard_section,
    slices_section,
    summary_section,
)

_FIGURE_NAMES = ("history", "importance", "slices", "contours", "learning_curves", "class_ap",
                 "comparison")


@dataclass
class ReportResult:
    html_path: Path
    md_path: Path
    figures: list[Path]
    sections: list[str]  # headings written, in order (every one of SECTIONS)
    skipped: dict[str, str] = field(default_factory=dict)  # heading → why it has no figure
    baseline_path: Path | None = None  # an_baseline.json, when the baseline was trained


def build_report(
    study_dir: str | os.PathLike,
    *,
    storage: str | None = None,
    name: str | None = None,
    store: str | None = None,
    out: str | os.PathLike | None = None,
    options: ReportOptions | None = None,
    log: Callable[[str], None] | None = None,
) -> ReportResult:
    """Write ``report.html``, ``report.md`` and ``figures/*.png`` for the study in ``study_dir``.

    ``storage``: the study's storage when not ``study_dir/study.log`` or ``study.db``;
    ``name``: the study, when the storage holds several; ``store``: the feature store for the
    AN baseline (default: the one the study recorded); ``out``: default ``study_dir/report``.
    Raises FileNotFoundError / :class:`StudyError` when there is no such study. A study with
    no completed trial still gets a report, which says so.
    """
    options = options or ReportOptions()
    options.validate()
    log = log or (lambda msg: None)
    study_dir = Path(study_dir)
    st = open_study_view(study_dir, storage, name)
    out_dir = Path(out) if out is not None else study_dir / "report"
    fig_dir = out_dir / "figures"
    made = [d for d in (*reversed(out_dir.parents), out_dir, fig_dir) if not d.exists()]
    fig_dir.mkdir(parents=True, exist_ok=True)
    try:
        commands = report_commands(st, name, store, out_dir)
        log(f"study {st.study.study_name}: {len(st.trials)} trials; drawing figures")
        imp, imp_reason = compute_importances(st, options)
        ctx, why = train_report_runs(st, store, device=options.device, baseline=options.baseline,
                                     progress=options.progress, log=log)
        sections = [
            summary_section(st, commands),
            leaderboard_section(st, options, ctx),
            history_section(st, fig_dir, options),
            importance_section(st, imp, imp_reason, fig_dir, options),
            slices_section(st, fig_dir, options),
            contours_section(st, imp, fig_dir, options),
            curves_section(st, fig_dir, options),
        ]
        baseline, baseline_path = baseline_section(st, ctx, why, fig_dir, out_dir, options)
        sections += [baseline, comparison_section(st, ctx, why, fig_dir, options)]
        figures = [b.path for s in sections for b in s.blocks if isinstance(b, Figure)]
        for stem in _FIGURE_NAMES:  # a figure of an earlier report that this one could not draw
            old = fig_dir / f"{stem}.png"
            if old.exists() and old not in figures:
                old.unlink()
        skipped = {s.title: b.text.removeprefix("Skipped: ").rstrip(".") for s in sections
                   for b in s.blocks if isinstance(b, Note) and b.kind == "skip"}
        title = f"Study report: {st.study.study_name}"
        subtitle = (f"loss {st.loss} on {st.identity.get('dataset', '?')}; "
                    f"{len(st.trials)} trials; {st.storage}")
        page = render_html(title, subtitle, sections, options.dpi)
        html_path = atomic_write_text(out_dir / "report.html", page)
        md_path = atomic_write_text(out_dir / "report.md",
                                    render_markdown(title, subtitle, sections, out_dir))
        return ReportResult(html_path=html_path, md_path=md_path, figures=figures,
                            sections=[s.title for s in sections], skipped=skipped,
                            baseline_path=baseline_path)
    except BaseException:  # refused or failed: the folders this call made go again if empty
        for d in reversed(made):
            try:
                d.rmdir()
            except OSError:  # not empty (something was written), or not ours to remove
                break
        raise
