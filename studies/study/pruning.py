"""Median pruning decided in process, without a storage round-trip per trial.

Optuna's :class:`~optuna.pruners.MedianPruner` reads every completed trial from the storage
once per trial per epoch; a batch of T stacked trials would ask T times an epoch the same
question. :class:`BatchPruner` takes the same decisions (:class:`optuna.pruners.PercentilePruner`'s
rule, line by line; ``tests/test_pruning.py`` checks them against Optuna's) from one read per
epoch and the values the worker holds. The study is still created with the equivalent Optuna
pruner (:meth:`MedianRule.optuna`), so a study read by other tools says what pruned it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np
import optuna
from optuna.study import StudyDirection
from optuna.trial import TrialState

__all__ = ["BatchPruner", "MedianRule"]


@dataclass(frozen=True)
class MedianRule:
    """The median pruner's settings (Optuna's names and meaning)."""

    n_startup_trials: int = 5  # no pruning before this many trials completed (Optuna's default)
    n_warmup_steps: int = 0  # no pruning at steps below this (Optuna's default)
    interval_steps: int = 1  # decide at every step (Optuna's default)
    n_min_trials: int = 1  # completed trials with a value at the step needed (Optuna's default)
    percentile: float = 50.0  # the median

    def optuna(self) -> optuna.pruners.BasePruner:
        """The equivalent Optuna pruner (what the study is created with)."""
        kwargs = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "percentile"}
        if self.percentile == 50.0:
            return optuna.pruners.MedianPruner(**kwargs)
        return optuna.pruners.PercentilePruner(self.percentile, **kwargs)


class BatchPruner:
    """Pruning decisions for one batch of a worker's trials, one storage read per epoch.

    :meth:`record` each trial's reported value (what ``trial.report`` wrote), then
    :meth:`decide` once per epoch for the trials that may be pruned. ``rule`` None never
    prunes (``--pruner none``) and reads nothing.
    """

    def __init__(self, rule: MedianRule | None, study: optuna.Study) -> None:
        self.rule, self.study = rule, study
        self.values: dict[int, dict[int, float]] = {}  # trial key -> step -> value

    def record(self, key: int, step: int, value: float) -> None:
        """Trial ``key`` reported ``value`` at ``step`` (the first report of a step counts,
        as in Optuna, which ignores a repeated step)."""
        self.values.setdefault(key, {}).setdefault(int(step), float(value))

    def decide(self, keys: Iterable[int], step: int) -> list[int]:
        """The trials among ``keys`` that Optuna's percentile pruner would prune after their
        report at ``step``, given the completed trials read now (once)."""
        keys = list(keys)
        if self.rule is None or not keys:
            return []
        completed = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        maximize = self.study.direction == StudyDirection.MAXIMIZE
        cache: dict[int, float] = {}
        return [k for k in keys
                if self._prune(self.values.get(k, {}), completed, maximize, cache)]

    def _prune(self, values: dict[int, float], completed: list, maximize: bool,
               cache: dict[int, float]) -> bool:
        """PercentilePruner.prune (optuna/pruners/_percentile.py), from held values."""
        rule = self.rule
        assert rule is not None
        if not completed or len(completed) < rule.n_startup_trials or not values:
            return False
        step = max(values)  # trial.last_step
        if step < rule.n_warmup_steps or not _first_in_interval(
                step, values, rule.n_warmup_steps, rule.interval_steps):
            return False
        own = np.asarray(list(values.values()), dtype=float)
        best = np.nanmax(own) if maximize else np.nanmin(own)
        if math.isnan(best):
            return True
        if step not in cache:
            cache[step] = _percentile_at(completed, step, rule, maximize)
        p = cache[step]
        if math.isnan(p):
            return False
        return bool(best < p) if maximize else bool(best > p)


def _first_in_interval(step: int, steps: Iterable[int], warmup: int, interval: int) -> bool:
    """Optuna's ``_is_first_in_interval_step``: no earlier report in this step's interval."""
    nearest_lower = (step - warmup) // interval * interval + warmup
    second_last = max((s for s in steps if s != step), default=-1)
    return second_last < nearest_lower


def _percentile_at(completed: list, step: int, rule: MedianRule, maximize: bool) -> float:
    """The percentile of the completed trials' values at ``step`` (NaN: too few)."""
    values = [t.intermediate_values[step] for t in completed if step in t.intermediate_values]
    if len(values) < rule.n_min_trials:
        return math.nan
    q = 100 - rule.percentile if maximize else rule.percentile
    return float(np.nanpercentile(np.array(values, dtype=float), q))
