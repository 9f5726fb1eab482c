"""The multi-label-learning metrics batched over heads (``mll_metrics_stacked``,
``tuned_thresholds``) equal, head by head, the single-head functions and the previous
implementation -- the numpy functions below, copied unchanged (renamed ``_reference_*``) from
``probe/metrics/mll.py`` before the metrics moved to torch; that implementation was itself
checked against a transcription of palm-ml/smile's ``metrics.py`` and scikit-learn
(tests/test_mll_metrics.py). The Evaluator's recorded best-record values equal the reference
computed per trial from its best head, on one val set and on per-trial folds.

Tolerance: float64, abs 1e-12 (the means are summed in another order); the tuned thresholds
and the Hamming losses (integer counts over the same size) are compared exactly."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import probe.evaluation.heads as heads_module
from probe import train_probe
from probe.engine.logits import stacked_logits
from probe.metrics import MetricInputError
from probe.metrics.mll import (
    MLL_METRICS,
    average_precision,
    coverage,
    hamming_loss,
    macro_auc,
    mll_metrics,
    mll_metrics_stacked,
    one_error,
    probabilities,
    ranking_loss,
    tuned_threshold,
    tuned_thresholds,
)
from tests.test_stacked_draws_shared import _config
from tests.test_stacked_folds import _folds

pytestmark = pytest.mark.usefixtures("one_thread")

ATOL = 1e-12

# ----------------------------------------------------------------------------- the reference
# the previous implementation (numpy, one head), copied unchanged but for the names


def _reference_positions(keys, axis):
    return _reference_positions_of(np.argsort(keys, axis=axis, kind="stable"), axis)


def _reference_positions_of(index, axis):
    ranks = np.empty_like(index)
    shape = [1, 1]
    shape[axis] = index.shape[axis]
    positions = np.broadcast_to(np.arange(index.shape[axis]).reshape(shape), index.shape)
    np.put_along_axis(ranks, index, positions, axis=axis)
    return ranks


def _reference_descending_order(scores):
    return np.argsort(-scores, axis=1, kind="stable")


def _reference_mean_pair_share(ranks, targets, axis):
    has = targets.astype(bool)
    m = has.sum(axis)
    n = has.shape[axis] - m
    lines = (m > 0) & (n > 0)
    if not lines.any():
        return float("nan")
    rank_sum = np.where(has, ranks, 0).sum(axis)
    share = (rank_sum[lines] - m[lines] * (m[lines] - 1) / 2.0) / (m[lines] * n[lines])
    return float(share.mean())


def _reference_one_error(scores, targets):
    top = np.argmax(scores, axis=1)
    hit = targets[np.arange(len(top)), top] == 1
    return float(1.0 - hit.mean())


def _reference_coverage(ranks, targets):
    has = targets.astype(bool)
    deepest = np.where(has, ranks + 1, 0).max(1)
    return float((deepest.sum() / ranks.shape[0] - 1.0) / ranks.shape[1])


def _reference_average_precision(order, targets):
    has = targets.astype(bool)
    rows = has.any(1)
    if not rows.any():
        return float("nan")
    ranked = np.take_along_axis(has[rows], order[rows], axis=1)
    precision = np.cumsum(ranked, axis=1) / np.arange(1, ranked.shape[1] + 1)
    per_row = (precision * ranked).sum(1) / ranked.sum(1)
    return float(per_row.mean())


def _reference_macro_auc(scores, targets):
    return _reference_mean_pair_share(_reference_positions(scores, axis=0), targets, axis=0)


def _reference_hamming_loss(probabilities, targets, threshold=0.5):
    predicted = probabilities > threshold
    return float((predicted != targets.astype(bool)).mean())


def _reference_tuned_threshold(probabilities, targets):
    candidates = np.round(np.arange(1, 100) / 100.0, 2)
    has = targets.astype(bool)
    bins_pos = np.searchsorted(candidates, probabilities[has], side="left")
    bins_neg = np.searchsorted(candidates, probabilities[~has], side="left")
    missed = np.cumsum(np.bincount(bins_pos, minlength=len(candidates) + 1))[:-1]
    false = len(bins_neg) - np.cumsum(np.bincount(bins_neg, minlength=len(candidates) + 1))[:-1]
    losses = (missed + false) / probabilities.size
    best = min(range(len(candidates)), key=lambda k: (losses[k], abs(candidates[k] - 0.5)))
    return float(candidates[best])


def _reference_mll_metrics(test_logits, test_targets, threshold=0.5):
    probabilities = 1.0 / (1.0 + np.exp(-test_logits.astype(np.float64)))
    order = _reference_descending_order(test_logits)
    ranks = _reference_positions_of(order, axis=1)
    return {"ranking_loss": _reference_mean_pair_share(ranks, test_targets, axis=1),
            "one_error": _reference_one_error(test_logits, test_targets),
            "coverage": _reference_coverage(ranks, test_targets),
            "average_precision": _reference_average_precision(order, test_targets),
            "hamming_loss": _reference_hamming_loss(probabilities, test_targets, 0.5),
            "hamming_loss_tuned": _reference_hamming_loss(probabilities, test_targets, threshold),
            "macro_auc": _reference_macro_auc(test_logits, test_targets)}


# ----------------------------------------------------------------------------- fixtures


def _case(kind: str, seed: int):
    """Three heads' logits (3, N, C) float64 and shared 0/1 targets (N, C) uint8."""
    rng = np.random.default_rng(seed)
    n, c = (50, 1) if kind == "one_class" else (50, 6)
    targets = (rng.random((n, c)) < 0.35).astype(np.uint8)
    targets[:3] = 0  # rows without positives
    targets[3] = 1  # a row of positives only
    logits = rng.normal(size=(3, n, c)) * 2.0
    if kind == "tied":
        logits = np.round(logits)  # integer-valued: ties in every row and class
        logits[1, :10] = 0.0  # a block of one value: the index decides alone
    elif kind == "one_kind_classes":
        targets[:, 0] = 0  # a class without positives
        targets[:, 1] = 1  # a class without negatives
    elif kind == "no_positives":
        targets[:] = 0  # every metric with nothing to measure: NaN (one-error 1)
    elif kind == "all_positive":
        targets[:] = 1
    return logits, targets


KINDS = ("random", "tied", "one_kind_classes", "one_class", "no_positives", "all_positive")


def _close(got, want, name):
    if math.isnan(want):
        assert math.isnan(got), (name, got)
    else:
        assert got == pytest.approx(want, abs=ATOL, rel=0), (name, got, want)


# ----------------------------------------------------------------------------- the metrics


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", KINDS)
def test_three_heads_at_once_equal_each_head_alone_and_the_reference(kind, seed):
    logits, targets = _case(kind, seed)
    thresholds = np.array([0.5, 0.3, 0.71])
    stacked = mll_metrics_stacked(torch.as_tensor(logits), torch.as_tensor(targets),
                                  torch.as_tensor(thresholds))
    assert set(stacked) == set(MLL_METRICS)
    for name, v in stacked.items():
        assert v.shape == (3,) and v.dtype == torch.float64, name
    for j in range(3):
        alone = mll_metrics(logits[j], targets, thresholds[j])
        reference = _reference_mll_metrics(logits[j], targets, thresholds[j])
        for name in MLL_METRICS:
            _close(float(stacked[name][j]), reference[name], name)
            _close(alone[name], reference[name], name)
        # the Hamming losses are counts over one size: exactly the reference's
        assert float(stacked["hamming_loss_tuned"][j]) == reference["hamming_loss_tuned"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_single_head_functions_equal_the_reference(kind):
    logits, targets = _case(kind, seed=7)
    scores = logits[2]
    order = _reference_descending_order(scores)
    ranks = _reference_positions_of(order, axis=1)
    p = 1.0 / (1.0 + np.exp(-scores))
    pairs = [(ranking_loss(scores, targets),
              _reference_mean_pair_share(ranks, targets, axis=1)),
             (one_error(scores, targets), _reference_one_error(scores, targets)),
             (coverage(scores, targets), _reference_coverage(ranks, targets)),
             (average_precision(scores, targets), _reference_average_precision(order, targets)),
             (macro_auc(scores, targets), _reference_macro_auc(scores, targets)),
             (hamming_loss(p, targets, 0.42), _reference_hamming_loss(p, targets, 0.42)),
             (tuned_threshold(p, targets), _reference_tuned_threshold(p, targets))]
    for i, (got, want) in enumerate(pairs):
        assert isinstance(got, float)
        _close(got, want, i)


def test_float32_logits_are_ranked_as_their_float64_values():
    """The Evaluator hands float32 logits: the same figures as their float64 copy's."""
    logits, targets = _case("tied", seed=3)
    low = torch.as_tensor(logits, dtype=torch.float32)
    got = mll_metrics_stacked(low, torch.as_tensor(targets), 0.5)
    for j in range(3):
        want = _reference_mll_metrics(low[j].double().numpy(), targets)
        for name in MLL_METRICS:
            _close(float(got[name][j]), want[name], name)


def _tie_probabilities(seed: int):
    """Three heads' probabilities (3, N, C), some on the candidates, and targets, where head 0's
    smallest loss is a plateau around 0.5 (the pick: 0.5), head 1's a plateau 0.54 … 0.79 (the
    pick: its nearest end, 0.54), head 2's random with values on the grid."""
    rng = np.random.default_rng(seed)
    n, c = 40, 5
    targets = (rng.random((n, c)) < 0.4).astype(np.uint8)
    has = targets.astype(bool)
    p = np.empty((3, n, c))
    p[0] = np.where(has, 0.8, 0.2)
    p[1] = np.where(has, 0.8, 0.54)  # right at 0.54 a negative is not predicted (p > t)
    p[2] = np.clip(targets * 0.3 + rng.random((n, c)) * 0.6, 0, 1)
    on_grid = rng.random((n, c)) < 0.4
    p[2][on_grid] = np.round(rng.integers(1, 100, on_grid.sum()) / 100.0, 2)
    return p, targets


@pytest.mark.parametrize("seed", range(4))
def test_thresholds_are_tuned_per_head_with_ties_nearest_one_half(seed):
    p, targets = _tie_probabilities(seed)
    got = tuned_thresholds(torch.as_tensor(p), torch.as_tensor(targets))
    assert got.shape == (3,) and got.dtype == torch.float64
    want = [_reference_tuned_threshold(p[j], targets) for j in range(3)]
    assert got.tolist() == want
    assert want[:2] == [0.5, 0.54]  # the fixture's premise: both tie-breaks are exercised
    for j in range(3):
        assert tuned_threshold(p[j], targets) == want[j]


def test_bad_shapes_are_refused_naming_the_argument():
    logits, targets = _case("random", seed=0)
    with pytest.raises(MetricInputError, match="logits must be"):
        mll_metrics_stacked(torch.as_tensor(logits[0]), targets)
    with pytest.raises(MetricInputError, match="targets must be"):
        mll_metrics_stacked(torch.as_tensor(logits), targets[:, :3])
    with pytest.raises(MetricInputError, match="thresholds must be"):
        mll_metrics_stacked(torch.as_tensor(logits), targets, torch.tensor([0.5, 0.5]))
    with pytest.raises(MetricInputError, match="scores must be one head"):
        ranking_loss(logits, targets)
    with pytest.raises(MetricInputError, match=r"probs must be the logits' probabilities"):
        mll_metrics_stacked(torch.as_tensor(logits), targets,
                            probs=probabilities(torch.as_tensor(logits[:2])))


@pytest.mark.parametrize("kind", ("random", "tied"))
def test_probabilities_given_by_the_caller_give_the_same_metrics(kind):
    """The Evaluator forms val's probabilities once, to tune the thresholds, and hands them on:
    the same figures as the probabilities formed inside, exactly (one formula)."""
    logits, targets = _case(kind, seed=3)
    z = torch.as_tensor(logits).float()
    probs = probabilities(z)
    thresholds = tuned_thresholds(probs, torch.as_tensor(targets))
    given = mll_metrics_stacked(z, targets, thresholds, probs=probs)
    formed = mll_metrics_stacked(z, targets, thresholds)
    for name in MLL_METRICS:
        assert torch.equal(given[name].nan_to_num(-1.0), formed[name].nan_to_num(-1.0)), name
    # the given probabilities are the ones thresholded: other ones move the Hamming losses only
    other = mll_metrics_stacked(z, targets, thresholds, probs=1.0 - probs)
    assert not torch.equal(other["hamming_loss"], formed["hamming_loss"])
    assert torch.equal(other["ranking_loss"].nan_to_num(-1.0),
                       formed["ranking_loss"].nan_to_num(-1.0))


# ----------------------------------------------------------------------------- the Evaluator


def _assert_recorded(result, val_sets, fold_index, test):
    """Each trial's best record holds the reference's figures of its best head."""
    test_x, test_y = test
    for t, trial in enumerate(result.trials):
        w = result.best_heads[t : t + 1].float()
        val_x, val_y = val_sets[fold_index[t]]
        logits = {"val": stacked_logits(val_x, w)[0].double().numpy(),
                  "test": stacked_logits(test_x, w)[0].double().numpy()}
        targets = {"val": val_y.numpy().astype(np.uint8), "test": test_y.numpy().astype(np.uint8)}
        threshold = _reference_tuned_threshold(1.0 / (1.0 + np.exp(-logits["val"])),
                                               targets["val"])
        assert trial.best["hamming_threshold"] == threshold, t
        for split in ("val", "test"):
            want = _reference_mll_metrics(logits[split], targets[split], threshold)
            for name in MLL_METRICS:
                _close(trial.best[f"{split}_{name}"], want[name], (t, split, name))
                assert isinstance(trial.best[f"{split}_{name}"], float)


@pytest.mark.parametrize("block", [None, 1])
def test_the_evaluator_records_each_trials_reference_figures(monkeypatch, block):
    """Three trials on one val set; ``block`` 1: one trial per block (EVAL_BLOCK made tiny)."""
    if block is not None:
        monkeypatch.setattr(heads_module, "EVAL_BLOCK", block)
    data = _folds()[0]
    result = train_probe(data, _config(seeds=(1, 2, 3)), "an", {})
    assert len(result.trials) == 3
    _assert_recorded(result, [(data.val_x, data.val_labels.bool())], [0, 0, 0],
                     (data.test_x, data.test_labels.bool()))


@pytest.mark.parametrize("val_labels", ["clean", "observed"])
def test_the_evaluator_scores_each_trial_on_its_folds_val_rows(monkeypatch, val_labels):
    """Per-trial folds (trials on folds 2, 0, 1, 0, 2): each trial's val figures and threshold
    from its own fold's val rows; blocks of two trials, so a fold's trials span blocks."""
    folds = _folds()
    rows = max(folds[0].val_x.shape[0], folds[0].test_x.shape[0])
    monkeypatch.setattr(heads_module, "EVAL_BLOCK", 2 * rows * folds[0].n_classes)
    fold_index = [2, 0, 1, 0, 2]
    cfg = replace(_config(val_labels=val_labels), seeds=(1, 2, 3, 4, 5))
    result = train_probe(folds, cfg, "an", {}, fold_index=fold_index)
    val_sets = []
    for fold in folds:
        y = fold.val_labels.bool() if val_labels == "clean" else fold.val_observed == 1
        val_sets.append((fold.val_x, y))
    _assert_recorded(result, val_sets, fold_index, (folds[0].test_x,
                                                    folds[0].test_labels.bool()))
    val_figures = {trial.best["val_ranking_loss"] for trial in result.trials}
    assert len(val_figures) > 1  # the trials' val figures differ (the check has teeth)


def test_probabilities_are_float64():
    z = torch.tensor([[[0.0, 2.0]]], dtype=torch.float32)
    p = probabilities(z)
    assert p.dtype == torch.float64
    assert p[0, 0].tolist() == [0.5, 1.0 / (1.0 + math.exp(-2.0))]
