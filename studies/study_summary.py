"""The end of a study: :class:`StudySummary`, what :func:`summarize` reads from its trials."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from probe.convergence import count_best_is_last

from .study_settings import StudySettings

__all__ = ["StudySummary", "summarize"]

@dataclass
class StudySummary:
    name: str
    storage: str
    out: str
    n_complete: int
    n_pruned: int
    n_failed: int
    best_value: float | None
    best_params: dict[str, Any]
    best_trial: int | None
    paper_value: float | None  # val mAP of the enqueued paper point, if it ran
    # completed trials whose best val epoch was their last (probe.convergence): not converged
    n_best_at_last: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(study: optuna.Study, settings: StudySettings) -> StudySummary:
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = max(complete, key=lambda t: (t.value, -t.number)) if complete else None
    paper = [t for t in complete if t.user_attrs.get("spml:paper")]
    return StudySummary(
        name=study.study_name,
        storage=settings.storage_spec().display,
        out=str(settings.out),
        n_complete=len(complete),
        n_pruned=sum(t.state == TrialState.PRUNED for t in trials),
        n_failed=sum(t.state == TrialState.FAIL for t in trials),
        best_value=best.value if best else None,
        best_params=dict(best.params) if best else {},
        best_trial=best.number if best else None,
        paper_value=paper[0].value if paper else None,
        n_best_at_last=count_best_is_last([_curve(t) for t in complete]),
    )


def _curve(trial: optuna.trial.FrozenTrial) -> list[float | None]:
    """A trial's val mAP per reported epoch, in order (its intermediate values)."""
    steps = trial.intermediate_values
    return [steps[k] for k in sorted(steps)]
