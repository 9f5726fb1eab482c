"""The multi-label-learning metrics (probe.metrics.mll) equal palm-ml/smile's ``metrics.py`` --
transcribed below from the released code, with its loops and torch sorts -- on random and tied
scores, and scikit-learn's functions where the definitions coincide."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import (
    coverage_error,
    label_ranking_average_precision_score,
    label_ranking_loss,
    roc_auc_score,
)

from probe.metrics import METRIC_DIRECTIONS
from probe.metrics.mll import (
    MLL_METRICS,
    average_precision,
    coverage,
    hamming_loss,
    macro_auc,
    mll_metrics,
    one_error,
    ranking_loss,
    tuned_threshold,
)

# ----------------------------------------------------------------------------- the reference
# palm-ml/smile, metrics.py, transcribed: the same loops, sorts and normalisations; the one
# change is stable=True in the score sorts, which pins the order of tied scores that the
# released torch.sort leaves to the implementation (a stable CPU sort in practice)


def smile_hamming(pred_labels, target_labels):
    return torch.mean((pred_labels != target_labels).float()).item()


def smile_one_error(pred_scores, target_labels):
    _, index = torch.max(pred_scores, dim=1)
    oneerror = 0.0
    num_data = pred_scores.size(0)
    for i in range(num_data):
        if target_labels[i, index[i]] != 1:
            oneerror += 1
    return oneerror / num_data


def smile_coverage(pred_scores, target_labels):
    _, index = torch.sort(pred_scores, dim=1, descending=True, stable=True)
    _, order = torch.sort(index, 1)
    has_label = target_labels == 1
    coverage = 0.0
    num_data, num_classes = pred_scores.size()
    for i in range(num_data):
        if has_label[i, :].sum() > 0:
            r = torch.max(order[i, has_label[i, :]]).item() + 1
            coverage += r
    coverage = coverage / num_data - 1.0
    return coverage / num_classes


def smile_ranking_loss(pred_scores, target_labels):
    _, index = torch.sort(pred_scores, dim=1, descending=True, stable=True)
    _, order = torch.sort(index, 1)
    has_label = target_labels == 1
    rankingloss = 0.0
    count = 0
    num_data, num_classes = pred_scores.size()
    for i in range(num_data):
        m = torch.sum(has_label[i, :]).item()
        n = num_classes - m
        if m != 0 and n != 0:
            rankingloss = rankingloss + (torch.sum(order[i, has_label[i, :]]).item()
                                         - m * (m - 1) / 2.0) / (m * n)
            count += 1
    return rankingloss / count


def smile_average_precision(pred_scores, target_labels):
    _, index = torch.sort(pred_scores, dim=1, descending=True, stable=True)
    _, order = torch.sort(index, 1)
    has_label = target_labels == 1
    ap = 0.0
    count = 0
    num_data, _num_classes = pred_scores.size()
    for i in range(num_data):
        m = torch.sum(has_label[i, :]).item()
        if m != 0:
            sorts, _ = torch.sort(order[i, has_label[i, :]])
            temp = 0.0
            for j in range(sorts.size(0)):
                temp += (j + 1.0) / (sorts[j].item() + 1)
            ap += temp / m
            count += 1
    return ap / count


def smile_macro_auc(pred_scores, target_labels):
    _, index = torch.sort(pred_scores, dim=0, stable=True)
    _, order = torch.sort(index, 0)
    has_label = target_labels == 1
    macroauc = 0.0
    count = 0
    num_data, num_classes = pred_scores.size()
    for i in range(num_classes):
        m = torch.sum(has_label[:, i]).item()
        n = num_data - m
        if m != 0 and n != 0:
            macroauc = macroauc + (torch.sum(order[has_label[:, i], i]).item()
                                   - m * (m - 1) / 2.0) / (m * n)
            count += 1
    return macroauc / count


# ----------------------------------------------------------------------------- fixtures


def _data(seed: int, tied: bool):
    rng = np.random.default_rng(seed)
    n, c = 60, 7
    targets = (rng.random((n, c)) < 0.3).astype(np.uint8)
    targets[:3] = 0  # rows without positives
    targets[3] = 1  # a row of positives only
    scores = rng.normal(size=(n, c))
    if tied:
        scores = np.round(scores, 0)  # few distinct values: ties everywhere
    return scores, targets


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_each_metric_equals_smiles_code(seed, tied):
    scores, targets = _data(seed, tied)
    s, t = torch.tensor(scores), torch.tensor(targets)
    assert ranking_loss(scores, targets) == pytest.approx(smile_ranking_loss(s, t), abs=1e-12)
    assert one_error(scores, targets) == pytest.approx(smile_one_error(s, t), abs=1e-12)
    assert coverage(scores, targets) == pytest.approx(smile_coverage(s, t), abs=1e-12)
    assert average_precision(scores, targets) == pytest.approx(
        smile_average_precision(s, t), abs=1e-12)
    assert macro_auc(scores, targets) == pytest.approx(smile_macro_auc(s, t), abs=1e-12)
    probabilities = 1 / (1 + np.exp(-scores))
    predicted = torch.tensor((probabilities > 0.5).astype(np.uint8))
    assert hamming_loss(probabilities, targets) == pytest.approx(smile_hamming(predicted, t))


@pytest.mark.parametrize("seed", range(5))
def test_the_metrics_equal_scikit_learn_where_the_definitions_coincide(seed):
    scores, targets = _data(seed, tied=False)
    both = (targets.sum(1) > 0) & (targets.sum(1) < targets.shape[1])
    assert ranking_loss(scores, targets) == pytest.approx(
        label_ranking_loss(targets[both], scores[both]), abs=1e-12)
    labelled = targets.sum(1) > 0
    c = targets.shape[1]
    assert coverage(scores[labelled], targets[labelled]) == pytest.approx(
        (coverage_error(targets[labelled], scores[labelled]) - 1) / c, abs=1e-12)
    assert average_precision(scores, targets) == pytest.approx(
        label_ranking_average_precision_score(targets[labelled], scores[labelled]), abs=1e-12)
    classes = (targets.sum(0) > 0) & (targets.sum(0) < targets.shape[0])
    assert macro_auc(scores, targets) == pytest.approx(
        roc_auc_score(targets[:, classes], scores[:, classes], average="macro"), abs=1e-12)


def test_a_perfect_ranking_and_the_directions():
    targets = np.array([[1, 0, 0], [0, 1, 1], [1, 1, 0]], dtype=np.uint8)
    scores = targets * 2.0 - 1.0  # every positive above every negative
    values = mll_metrics(scores, targets, threshold=0.5)
    assert set(values) == set(MLL_METRICS)
    assert values["ranking_loss"] == values["one_error"] == values["hamming_loss"] == 0.0
    assert values["average_precision"] == values["macro_auc"] == 1.0
    assert values["coverage"] == pytest.approx((5 / 3 - 1) / 3)  # deepest ranks 1, 2, 2
    for name in MLL_METRICS:
        assert name in METRIC_DIRECTIONS
    assert METRIC_DIRECTIONS["map"] and METRIC_DIRECTIONS["average_precision"]
    assert not METRIC_DIRECTIONS["ranking_loss"] and not METRIC_DIRECTIONS["coverage"]


def test_the_tuned_threshold_minimises_val_hamming():
    rng = np.random.default_rng(0)
    targets = (rng.random((200, 5)) < 0.2).astype(np.uint8)
    probabilities = np.clip(targets * 0.4 + rng.random((200, 5)) * 0.5, 0, 1)
    t = tuned_threshold(probabilities, targets)
    grid = [hamming_loss(probabilities, targets, k / 100) for k in range(1, 100)]
    assert hamming_loss(probabilities, targets, t) == pytest.approx(min(grid))


@pytest.mark.parametrize("seed", range(6))
def test_the_tuned_threshold_is_the_grid_search_it_replaces(seed):
    """The counting form picks what a loop of hamming_loss over 0.01 … 0.99 picks (smallest
    loss, then nearest 0.5), with probabilities sitting exactly on candidates (p > t is strict)."""
    rng = np.random.default_rng(seed)
    targets = (rng.random((300, 7)) < rng.uniform(0.1, 0.7)).astype(np.uint8)
    probabilities = np.clip(targets * rng.uniform(0, 0.5) + rng.random((300, 7)) * 0.6, 0, 1)
    on_grid = rng.random(probabilities.shape) < 0.3
    probabilities[on_grid] = np.round(rng.integers(1, 100, on_grid.sum()) / 100.0, 2)
    candidates = [round(k / 100.0, 2) for k in range(1, 100)]
    losses = [hamming_loss(probabilities, targets, t) for t in candidates]
    want = min(range(99), key=lambda k: (losses[k], abs(candidates[k] - 0.5)))
    assert tuned_threshold(probabilities, targets) == candidates[want]


# ----------------------------------------------------------------------------- the protocol


def test_the_benchmark_split_and_the_metrics_a_probe_records(tmp_path, capsys):
    """`spml import yeast --split 0.8,0.1,0.1` gives 80/10/10 (one random positive per train
    row, val and test fully labelled); `spml probe --json` records every metric on val and test
    at the best epoch, equal to the functions on the saved head's scores."""
    import json

    from probe.engine.data import ProbeData
    from probe.engine.results import from_linear, load_head
    from probe.evaluation.heads import stacked_logits
    from probe.store import open_store
    from studies.cli import main

    store = tmp_path / "y.zarr"
    assert main(["import", "yeast", "--out", str(store), "--split", "0.8,0.1,0.1",
                 "--quiet"]) == 0
    opened = open_store(store)
    sizes = {s: len(opened.split(s)) for s in ("train", "val", "test")}
    assert sizes == {"train": 1933, "val": 242, "test": 242}
    observed = opened.observed(1200, opened.split("train"))
    assert ((observed == 1).sum(1) <= 1).all()
    with pytest.raises(SystemExit) as refused:  # argparse refuses it, naming the flag
        main(["import", "yeast", "--out", str(tmp_path / "x.zarr"), "--split", "0.8,0.3,0.1",
              "--quiet"])
    assert refused.value.code == 2
    assert "--split" in capsys.readouterr().err and not (tmp_path / "x.zarr").exists()
    record = tmp_path / "an.json"
    head = tmp_path / "an.pt"
    assert main(["probe", str(store), "--loss", "an", "--epochs", "3", "--lr", "0.01",
                 "--quiet", "--intervals", "0", "--json", str(record),
                 "--save-head", str(head)]) == 0
    capsys.readouterr()
    best = json.loads(record.read_text())["trials"][0]["best"]
    for split in ("val", "test"):
        for name in MLL_METRICS:
            assert 0.0 <= best[f"{split}_{name}"] <= 1.0, (split, name)
    data = ProbeData.from_store(store, device="cpu", flip=False)
    linear, _ = load_head(head, 0)
    logits = stacked_logits(data.test_x, from_linear(linear)[None])[0].double().numpy()
    targets = data.test_labels.numpy().astype(np.uint8)
    expected = mll_metrics(logits, targets, best["hamming_threshold"])
    for name in MLL_METRICS:
        assert best[f"test_{name}"] == pytest.approx(expected[name], abs=1e-6), name


def test_a_metric_with_nothing_to_measure_is_nan_not_zero():
    """Rows without positives or without negatives, classes of one kind: NaN, never a
    made-up 0 or 1 (SMILE's code divides by a zero count there)."""
    import math

    scores = np.array([[0.2, 0.9], [0.4, 0.1]])
    everything = np.ones((2, 2), dtype=np.uint8)
    nothing = np.zeros((2, 2), dtype=np.uint8)
    assert math.isnan(ranking_loss(scores, everything))  # no negatives in any row
    assert math.isnan(macro_auc(scores, everything))
    assert math.isnan(average_precision(scores, nothing))
    assert one_error(scores, nothing) == 1.0  # defined: a row without positives always errs
