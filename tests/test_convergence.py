"""Convergence checks: a trial whose best val epoch is its last is flagged, with advice, in
spml probe, the study summary (and its log) and the report's leaderboard."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from probe.evaluation.convergence import ADVICE, best_is_last, count_best_is_last
from studies.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("curve,expected", [
    ([40.0, 41.0, 42.0], True),
    ([40.0, 42.0, 41.0], False),
    ([40.0, 42.0, 42.0], False),  # first of equals is the selected epoch
    ([40.0, None, 42.0, None], True),  # not evaluated every epoch: last *evaluated*
    ([40.0, math.nan, 39.0], False),
    ([40.0, 41.0, math.nan], True),  # a NaN last epoch is never selected; 41 is last finite
    ([41.0], False),  # one evaluation says nothing
    ([], False),
])
def test_best_is_last(curve, expected):
    assert best_is_last(curve) is expected


def test_count():
    assert count_best_is_last([[1, 2], [2, 1], [1, 3]]) == 2


def test_probe_warns_when_the_best_epoch_is_the_last(yeast_store, capsys):
    # 2 epochs at a small learning rate: val mAP still rises
    assert main(["probe", yeast_store, "--loss", "an", "--epochs", "2", "--lr", "1e-4",
                 "--batch-size", "32", "--device", "cpu", "--quiet", "--intervals", "0"]) == 0
    out = capsys.readouterr().out
    assert "(best = last epoch)" in out
    assert "warning: 1 of 1 trial had" in out and ADVICE in out


def test_study_summary_counts_unconverged_trials(tmp_path):
    from studies.study.settings import StudySettings
    from studies.study.summary import summarize

    study = optuna.create_study(direction="maximize")
    dist = {"gr.w_T": FloatDistribution(1, 10)}
    for i, curve in enumerate([[40, 41, 42], [40, 43, 41], [39, 40, 44], [38, 39]]):
        state = TrialState.COMPLETE if i < 3 else TrialState.PRUNED
        study.add_trial(create_trial(state=state, params={"gr.w_T": 2.0 + i}, distributions=dist,
                                     value=max(curve) if i < 3 else None,
                                     intermediate_values=dict(enumerate(curve))))
    settings = StudySettings(store=str(tmp_path / "s.zarr"), loss="gr", out=str(tmp_path))
    summary = summarize(study, settings)
    assert summary.n_complete == 3 and summary.n_best_at_last == 2  # pruned ones not counted

