"""CRISP: the prior estimator equals a brute-force numpy reading of Theorem 4.1's rule, recovers
known priors on a synthetic set, and the loss equals its terms written out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from probe.losses import LossInputError, create_loss, crisp, crisp_priors


def brute_force_priors(scores: np.ndarray, observed: np.ndarray, delta: float, tau: float):
    """Theorem 4.1's rule, one class and one candidate threshold at a time (float64)."""
    n, c = scores.shape
    out = np.zeros(c)
    for j in range(c):
        pos_rows = observed[:, j] == 1
        n_pos = pos_rows.sum()
        if n_pos == 0:
            continue
        width = math.sqrt(math.log(4 / delta) / (2 * n)) + math.sqrt(
            math.log(4 / delta) / (2 * n_pos))
        best, best_pi = math.inf, 0.0
        for t in sorted(set(scores[:, j].tolist()), reverse=True):  # highest first
            q = np.mean(scores[:, j] >= t)
            qp = np.mean(scores[pos_rows, j] >= t)
            if qp == 0:
                continue
            bound = q / qp + (1 + tau) / qp * width
            if bound < best:  # strict: ties keep the higher threshold
                best, best_pi = bound, q / qp
        out[j] = min(max(best_pi, 0.0), 1.0)
    return out


def _observed(n, c, rng):
    obs = np.zeros((n, c), dtype=np.int8)
    obs[np.arange(n), rng.integers(0, c, n)] = 1
    return obs


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tied", [False, True])
def test_estimator_equals_brute_force(seed, tied):
    rng = np.random.default_rng(seed)
    n, c = 60, 5
    scores = rng.random((n, c))
    if tied:
        scores = np.round(scores * 6) / 6  # many ties
    obs = _observed(n, c, rng)
    obs[:, 4] = 0  # a class without observed positives: π̂ = 0
    got = crisp_priors(torch.tensor(scores), torch.tensor(obs), 0.01, 0.01).numpy()
    want = brute_force_priors(scores, obs, 0.01, 0.01)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)  # float32 result
    assert got[4] == 0.0


def test_estimator_stacked_equals_separate():
    rng = np.random.default_rng(3)
    scores = torch.tensor(rng.random((3, 50, 4)))
    obs = torch.tensor(_observed(50, 4, rng))
    delta = torch.tensor([0.01, 0.1, 0.3])
    stacked = crisp_priors(scores, obs, delta, 0.05)
    for t in range(3):
        np.testing.assert_allclose(
            stacked[t].numpy(), brute_force_priors(scores[t].numpy(), obs.numpy(),
                                                   float(delta[t]), 0.05), rtol=1e-6, atol=1e-7)


def test_estimator_recovers_known_priors():
    """SCAR data with true priors π and scores that separate positives from negatives: the
    estimate is within 0.05 of π (n = 20000)."""
    rng = np.random.default_rng(0)
    n = 20000
    priors = np.array([0.05, 0.15, 0.3, 0.5])
    y = (rng.random((n, 4)) < priors).astype(np.int8)
    # label each positive entry as observed with probability 0.3 (selected completely at random)
    obs = (y == 1) & (rng.random((n, 4)) < 0.3)
    scores = np.where(y == 1, rng.beta(8, 2, (n, 4)), rng.beta(2, 8, (n, 4)))
    got = crisp_priors(torch.tensor(scores), torch.tensor(obs.astype(np.int8))).numpy()
    np.testing.assert_allclose(got, priors, atol=0.05)


def test_loss_equals_its_terms():
    rng = np.random.default_rng(1)
    b, c = 8, 3
    z = rng.normal(size=(b, c))
    obs = _observed(b, c, rng)
    pi = np.array([0.2, 0.5, 0.05])
    lam = 0.7
    f = 1 / (1 + np.exp(-(z + lam * np.log(pi / (1 - pi)))))
    want = 0.0
    for j in range(c):
        rows = obs[:, j] == 1
        pos = 2 * pi[j] * np.mean(1 - f[rows, j]) if rows.any() else 0.0
        want += pos + abs(f[:, j].mean() - pi[j])
    want /= c
    got = crisp(torch.tensor(z), torch.tensor(obs), torch.tensor(pi), lam=lam)
    assert float(got) == pytest.approx(want, rel=1e-10)


def test_registered_loss_warms_up_with_an_then_uses_estimated_priors():
    rng = np.random.default_rng(2)
    n, c = 40, 4
    obs = torch.tensor(_observed(n, c, rng))
    train_logits = torch.tensor(rng.normal(size=(1, n, c)), dtype=torch.float32)
    loss = create_loss("crisp", warmup=1)
    loss.setup(obs, n_epochs=3)
    loss.start_epoch(0)
    z = train_logits[0, :8]
    an = torch.where(obs[:8] == 1, torch.nn.functional.softplus(-z),
                     torch.nn.functional.softplus(z)).mean()
    assert float(loss(z, obs[:8], torch.arange(8)).loss) == pytest.approx(float(an))
    loss.end_epoch(0, train_logits)
    want_pi = crisp_priors(torch.sigmoid(train_logits[0]), obs)
    torch.testing.assert_close(loss.priors[0], want_pi)
    loss.start_epoch(1)
    got = loss(z, obs[:8], torch.arange(8)).loss
    torch.testing.assert_close(got, crisp(z, obs[:8], want_pi, lam=1.0))


def test_bad_priors_named():
    with pytest.raises(LossInputError, match="priors"):
        crisp(torch.zeros(4, 3), torch.zeros(4, 3, dtype=torch.int8), torch.zeros(2))
