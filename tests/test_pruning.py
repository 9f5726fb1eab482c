"""studies.study.pruning: in-process median pruning takes Optuna's decisions on the same history."""

from __future__ import annotations

import math
import random

import optuna
import pytest

from studies.study.pruning import BatchPruner, MedianRule

RULES = [
    MedianRule(n_startup_trials=4, n_warmup_steps=1),  # what `spml study --trials-at-once 8` uses
    MedianRule(n_startup_trials=0, n_warmup_steps=0),
    MedianRule(n_startup_trials=2, n_warmup_steps=2, interval_steps=3, n_min_trials=3),
    MedianRule(n_startup_trials=1, percentile=25.0),
]


def _history(study: optuna.Study, rng: random.Random, n_done: int, steps: int) -> None:
    """Completed, pruned and failed trials with gaps, NaNs and ties in their curves."""
    for _ in range(n_done):
        trial = study.ask()
        for s in range(steps):
            if rng.random() < 0.2:
                continue  # a step this trial never reported (eval_every > 1, pruned early)
            v = rng.choice([math.nan, 50.0, rng.uniform(0, 100)]) if rng.random() < 0.2 \
                else rng.uniform(0, 100)
            trial.report(v, s)
        state = rng.choice([optuna.trial.TrialState.COMPLETE] * 3 + [
            optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL])
        study.tell(trial, rng.uniform(0, 100) if state.name == "COMPLETE" else None, state=state)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_decisions_equal_optunas_pruner_on_the_same_history(rule, seed, direction):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = random.Random(seed)
    steps = 6
    study = optuna.create_study(direction=direction, pruner=rule.optuna(),
                                sampler=optuna.samplers.RandomSampler(seed=seed))
    _history(study, rng, n_done=rng.choice([0, 1, 3, 8, 20]), steps=steps)
    running = [study.ask() for _ in range(8)]
    pruner = BatchPruner(rule, study)
    active = set(range(len(running)))
    for step in range(steps):
        eligible = []
        for i in sorted(active):
            if rng.random() < 0.15:
                continue  # not evaluated this epoch
            value = rng.uniform(0, 100)
            running[i].report(value, step)
            pruner.record(i, step, value)
            eligible.append(i)
        expected = [i for i in eligible if running[i].should_prune()]
        assert pruner.decide(eligible, step) == expected, (step, expected)
        active -= set(expected)
    # the history can change between epochs (another worker completes a trial): still equal
    done = study.ask()
    for s in range(steps):
        done.report(rng.uniform(0, 100), s)
    study.tell(done, 1.0)
    still = sorted(active)
    assert pruner.decide(still, steps - 1) == [i for i in still if running[i].should_prune()]


def test_no_rule_never_prunes_and_reads_nothing():
    class NoStudy:
        def get_trials(self, *a, **k):  # pragma: no cover - must not be called
            raise AssertionError("read the storage")

    pruner = BatchPruner(None, NoStudy())  # type: ignore[arg-type]
    pruner.record(0, 3, 0.0)
    assert pruner.decide([0], 3) == []


def test_some_trials_are_pruned_in_these_histories():
    """The equality test above is not vacuous: the same setting does prune."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", pruner=RULES[1].optuna())
    for v in (10.0, 20.0, 30.0):
        t = study.ask()
        t.report(v, 0)
        study.tell(t, v)
    pruner = BatchPruner(RULES[1], study)
    pruner.record(0, 0, 5.0)
    pruner.record(1, 0, 25.0)
    assert pruner.decide([0, 1], 0) == [0]
