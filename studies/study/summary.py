"""The end of a study: :class:`StudySummary`, what :func:`summarize` reads from its trials."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from probe.evaluation.convergence import count_best_is_last
from studies.study.heartbeat import is_interrupted
from studies.study.settings import StudySettings
from studies.study.storage import best_trial, is_paper_trial

__all__ = ["StudySummary", "summarize", "with_verdict"]

@dataclass
class StudySummary:
    name: str
    storage: str
    out: str
    n_complete: int
    n_pruned: int
    n_failed: int  # failed for a reason (a non-finite loss, an error): not the interrupted
    best_value: float | None
    best_params: dict[str, Any]
    best_trial: int | None
    paper_value: float | None  # val mAP of the enqueued paper point, if it ran
    # completed trials whose best val epoch was their last (probe.evaluation.convergence): not
    # converged
    n_best_at_last: int = 0
    # the val winner against the paper values on the test split, with 95% intervals and the
    # paired difference (studies.study.verdict.Verdict: .winner.test_map, .paper.test_low, .diff,
    # .better_on_test, ...); None without a completed trial, in a worker, or when it could
    # not be measured (verdict_error says why)
    verdict: Any = None
    verdict_error: str | None = None
    several: bool = False  # the storage holds other studies too (commands then need --name)
    # trials stopped by Ctrl-C: their parameters ran again on resume (not counted as failed)
    n_interrupted: int = 0
    facts: list[str] = field(default_factory=list)  # the summary's settings lines

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}
        out["verdict"] = self.verdict.to_dict() if self.verdict is not None else None
        return out


def with_verdict(summary: StudySummary, study: optuna.Study, settings: StudySettings
                 ) -> StudySummary:
    """``summary`` with the val winner tested against the paper values on the test split
    (:func:`studies.study.verdict.study_verdict`: the heads the study kept, re-trained only where
    missing) and the confirm and compare commands that settle it."""
    from probe.devices import resolve_device
    from probe.errors import SpmlError
    from studies.study.storage import open_storage
    from studies.study.verdict import settle_commands, study_verdict

    spec = settings.storage_spec()
    summary.several = len(optuna.get_all_study_names(open_storage(spec))) > 1
    if summary.best_value is None:
        return summary
    in_out = spec.kind != "postgresql" and (
        Path(spec.target).expanduser().resolve().parent == Path(summary.out).resolve())
    commands = settle_commands(summary.out, summary.storage, settings.store,
                               name=summary.name if summary.several else None,
                               storage_in_out=in_out)
    try:
        summary.verdict = study_verdict(study, settings.store,
                                        device=str(resolve_device(settings.device)),
                                        commands=commands,
                                        heads_dir=Path(settings.out) / "results")
    except SpmlError as err:
        summary.verdict_error = str(err)
    return summary


def summarize(study: optuna.Study, settings: StudySettings) -> StudySummary:
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = best_trial(complete)
    paper = [t for t in complete if is_paper_trial(t)]
    return StudySummary(
        name=study.study_name, storage=settings.storage_spec().display, out=str(settings.out),
        n_complete=len(complete), n_pruned=sum(t.state == TrialState.PRUNED for t in trials),
        n_failed=sum(t.state == TrialState.FAIL and not is_interrupted(t) for t in trials),
        n_interrupted=sum(is_interrupted(t) for t in trials),
        best_value=best.value if best else None, best_params=dict(best.params) if best else {},
        best_trial=best.number if best else None, paper_value=paper[0].value if paper else None,
        # each trial's val mAP per reported epoch (its intermediate values)
        n_best_at_last=count_best_is_last(
            [[v for _, v in sorted(t.intermediate_values.items())] for t in complete]),
        facts=settings_lines(study, best) + grid_exhausted_lines(study, settings),
    )


def grid_size(settings: StudySettings) -> int:
    """The number of cells of a grid study's grid (1 for a study without a grid)."""
    size = 1
    for values in settings.grid.values():
        size *= len(values)
    return size


def grid_exhausted_lines(study: optuna.Study, settings: StudySettings) -> list[str]:
    """The line that says a grid study stopped short of ``--trials`` because every cell of its
    grid was tried (the grid never repeats a cell), else nothing."""
    if settings.sampler != "grid" or not settings.grid:
        return []
    finished = [t for t in study.get_trials(deepcopy=False)
                if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    # the cells tried, counted from the storage (the study may be loaded without its sampler)
    cells = {tuple(sorted(t.params.items())) for t in finished}
    if len(finished) >= settings.n_trials or len(cells) < grid_size(settings):
        return []
    return [f"the grid is exhausted: all {grid_size(settings)} of its cells are tried, so the "
            f"study stopped at {len(finished)} of --trials {settings.n_trials} (a grid never "
            "repeats a cell; add values to --grid to run more)"]


def param_lines(loss: str, params: dict[str, Any]) -> list[str]:
    """The winner's parameters as the summary prints them, one ``  name = value`` a line; a
    count searched as a number (``gpr.top_k``) also says what it acts as in training
    (``gpr.top_k = 7.27868 (acts as 8)``)."""
    from probe.losses import get_loss_class

    try:
        specs = {s.name: s for s in get_loss_class(loss).hparam_specs}
    except Exception:  # a plugin gone since the study ran: the values as recorded
        specs = {}
    lines = []
    for key, value in params.items():
        text = f"{value:.6g}" if isinstance(value, float) else f"{value}"
        owner, _, name = key.rpartition(".")
        spec = specs.get(name) if owner == loss else None
        if spec is not None and spec.effective(value) != value:
            text += f" (acts as {spec.effective(value)})"
        lines.append(f"  {key} = {text}")
    return lines


def settings_lines(study: optuna.Study, best: Any = None) -> list[str]:
    """What every trial trained with, as quotable lines: epochs, batch size and lr (the
    winner's where searched), the fixed --set values, the draw and the store prior."""
    trained = study.user_attrs.get("spml.training") or {}
    fixed = study.user_attrs.get("spml.fixed") or {}
    params = dict(best.params) if best is not None else {}
    parts = []
    for key, flag in (("epochs", "epochs"), ("batch_size", "batch size"), ("lr", "lr")):
        value = trained.get(key)
        if value == "searched":
            value = params.get(f"train.{key}")
            parts.append(f"{flag} {_num(value)} (searched; the winner's)" if value is not None
                         else f"{flag} searched")
        elif value is not None:
            parts.append(f"{flag} {_num(value)}")
    lines = ["trained with: " + ", ".join(parts)] if parts else []
    if fixed:
        lines.append("fixed (--set): " + ", ".join(f"{k}={_num(v)}" for k, v in fixed.items()))
    draw = trained.get("observed_seed")
    if draw is not None:
        lines.append(f"draw: --observed-seed {draw}"
                     + (f"; prior: --priors {trained['priors']}" if trained.get("priors")
                        else ""))
    return lines


def _num(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)
