"""The kNN baseline (probe.knn): neighbours and scores against a hand-worked case and an
independent numpy reference; faiss and torch backends agree; evaluated like a probe."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from probe import ProbeConfig, ProbeConfigError
from probe.engine.data import ProbeData
from probe.knn import knn_scores, nearest_neighbours, run_knn
from probe.losses import LossInputError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_hand_worked_two_neighbours():
    # train rows point along x, y and (1,1)/√2; the query (2, 0) has cosine 1, 1/√2, 0 with them
    train = torch.tensor([[1.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    labels = torch.tensor([[1, 0], [0, 1], [1, 1]], dtype=torch.bool)
    sims, ids = nearest_neighbours(train, torch.tensor([[2.0, 0.0]]), k=2, backend="torch")
    assert ids.tolist() == [[0, 2]]
    torch.testing.assert_close(sims, torch.tensor([[1.0, 1 / math.sqrt(2)]]))
    # softmax over (1, 0.7071)/τ with τ = 1: weights e^1/(e^1 + e^0.7071) and the rest
    w0 = math.exp(1) / (math.exp(1) + math.exp(1 / math.sqrt(2)))
    scores = knn_scores(sims, ids, labels, k=2, temperature=1.0)
    torch.testing.assert_close(scores, torch.tensor([[1.0, 1 - w0]]))
    # k = 1: the nearest row's labels exactly
    assert knn_scores(sims, ids, labels, k=1, temperature=0.07).tolist() == [[1.0, 0.0]]


def _numpy_reference(train, labels, query, k, tau):
    tn = train / np.linalg.norm(train, axis=1, keepdims=True)
    qn = query / np.linalg.norm(query, axis=1, keepdims=True)
    out = np.zeros((len(query), labels.shape[1]))
    for i, q in enumerate(qn):
        s = tn @ q
        top = np.argsort(-s, kind="stable")[:k]
        w = np.exp(s[top] / tau - np.max(s[top] / tau))
        w /= w.sum()
        out[i] = (w[:, None] * labels[top]).sum(0)
    return out


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_scores_match_numpy_reference(backend):
    if backend == "faiss":
        pytest.importorskip("faiss")
    rng = np.random.default_rng(0)
    train = rng.normal(size=(60, 8)).astype(np.float32)
    labels = (rng.random((60, 4)) < 0.3)
    query = rng.normal(size=(9, 8)).astype(np.float32)
    sims, ids = nearest_neighbours(torch.from_numpy(train), torch.from_numpy(query), 7, backend)
    got = knn_scores(sims, ids, torch.from_numpy(labels), k=7, temperature=0.1)
    want = _numpy_reference(train, labels.astype(float), query, 7, 0.1)
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)


def _data():
    rng = np.random.default_rng(1)
    proto = rng.normal(size=(4, 10))

    def split(n):
        y = (rng.random((n, 4)) < 0.4).astype(np.uint8)
        y[np.arange(n), rng.integers(0, 4, n)] = 1
        return (y @ proto + 0.3 * rng.normal(size=(n, 10))).astype(np.float16), y

    return ProbeData.from_arrays(split(80), split(30), split(30))


def test_run_knn_evaluates_like_a_probe_and_beats_chance():
    data = _data()
    result = run_knn(data, ProbeConfig(), [{"k": 5}, {"k": 20, "temperature": 0.5}],
                     backend="torch")
    assert result.loss == "knn" and result.n_trials == 2
    for tr in result.trials:
        assert tr.best_epoch == 0 and len(tr.best["test_ap"]) == 4
        assert tr.best["test_map"] > 60  # well-separated prototypes: far above chance (~50)
    assert result.trials[1].hparams == {"k": 20, "temperature": 0.5}
    full = run_knn(data, ProbeConfig(labels="full"), {"k": 5}, backend="torch")
    assert full.trials[0].best["test_map"] >= result.trials[0].best["test_map"] - 1
    if pytest.importorskip("faiss"):
        same = run_knn(data, ProbeConfig(), {"k": 5}, backend="faiss")
        assert same.trials[0].best["test_map"] == pytest.approx(
            result.trials[0].best["test_map"], abs=1e-3)


def test_knn_errors():
    data = _data()
    with pytest.raises(ProbeConfigError, match=r"k=500 neighbours .* 80 rows"):
        run_knn(data, ProbeConfig(), {"k": 500}, backend="torch")
    with pytest.raises(LossInputError, match="unknown hyperparameter 'kk'"):
        run_knn(data, ProbeConfig(), {"kk": 5})
    with pytest.raises(LossInputError, match="'temperature' must lie in"):
        run_knn(data, ProbeConfig(), {"temperature": 0.0})
    with pytest.raises(ProbeConfigError, match="backend must be one of"):
        run_knn(data, ProbeConfig(), {"k": 3}, backend="annoy")
