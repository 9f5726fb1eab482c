"""Optuna studies, reports and the end-to-end fine-tune, on top of :mod:`probe` and
:mod:`featurize`; also home of the ``spml`` command line (:mod:`studies.cli`), the top of the
dependency graph.

The public API is importable from here (names load on first use, so ``import studies`` does not
import optuna or polars until a name needs them)::

    from studies import StudySettings, run_study, confirm_study, load_study, build_report
    summary = run_study(StudySettings(store="yeast.zarr", loss="gr", n_trials=16, out="gr"))
    summary.best_value, summary.best_params
    build_report("gr")                           # gr/report.html, gr/report.md, PNG figures

Modules (each reads only ``probe``, ``featurize`` and the modules above it here):

* studies themselves -- :mod:`~studies.study.settings` (settings and the checks before any
  write), :mod:`~studies.study.storage` (storages, the best-trial rule, the paper mark),
  :mod:`~studies.study.create`, :mod:`~studies.study.worker`, :mod:`~studies.study.run`
  (``run_study``), :mod:`~studies.study.summary` and :mod:`~studies.study.verdict` (what a study
  prints), :mod:`~studies.study.space`, :mod:`~studies.study.pruning`,
  :mod:`~studies.study.heartbeat`;
* results -- :mod:`~studies.results.rows` (rows per trial), :mod:`~studies.results.export` (one tidy
table);
* after a study -- :mod:`~studies.results.confirm` (seeds and draws),
:mod:`~studies.results.compare` (paired
  tests of heads), :mod:`studies.report` (HTML/Markdown), :mod:`studies.table` (the paper's
  table), :mod:`studies.analyses` (the GR paper's analyses), :mod:`~studies.plots`;
* :mod:`~studies.finetune.run` (with ``finetune_config``, ``finetune_data``), :mod:`~studies.demo`,
  :mod:`~studies.study.bench`, and :mod:`studies.cli` (every ``spml`` command).
"""

from __future__ import annotations

from probe.lazy import lazy_exports

_EXPORTS = {
    # studies
    "StudySettings": "studies.study.settings",
    "StudySummary": "studies.study.summary",
    "run_study": "studies.study.run",
    "create_or_join": "studies.study.create",
    "StudyError": "studies.study.storage",
    "open_storage": "studies.study.storage",
    "parse_storage": "studies.study.storage",
    "read_results": "studies.results.rows",
    # results anywhere: one tidy table of probe runs, studies and confirmations
    "collect": "studies.results.export",
    # confirming winners
    "confirm_study": "studies.results.confirm",
    "load_study": "studies.results.confirm",
    "winner": "studies.results.confirm",
    # the paper's table: every method as a row, one column per store
    "TableConfig": "studies.table",
    "build_table": "studies.table",
    # reports
    "ReportOptions": "studies.report",
    "build_report": "studies.report",
    # end-to-end fine-tune
    "FinetuneConfig": "studies.finetune.run",
    "finetune": "studies.finetune.run",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
