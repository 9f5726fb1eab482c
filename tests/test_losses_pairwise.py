"""ZLPR and OPML (+ high_rank / soft / correct): hand-computed cases, an independent float64
reference written from the formulas, gradient identities, edge cases, the AP-based state and the
trial axis with every option on."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from probe.losses import LossInputError, create_loss, opml, opml_correct_labels, zlpr


# ----------------------------------------------------------------------------- references
def _ref_pairwise(z, y, alpha=1.0, beta=1.0, eps=None):
    """Float64 loop over samples: log(α + Σ (1−y_j)e^{z_j}) + log(β + Σ y_j e^{−z_j}), with
    y = 1 on positives, ε on unobserved (0 without ``eps``), 0 on observed negatives."""
    z = z.double().tolist()
    y = y.tolist()
    total = 0.0
    for b, (zr, yr) in enumerate(zip(z, y)):
        neg, pos = alpha, beta
        for c, (zi, yi) in enumerate(zip(zr, yr)):
            target = 1.0 if yi == 1 else (eps[b][c] if (eps is not None and yi == 0) else 0.0)
            neg += (1 - target) * math.exp(zi)
            pos += target * math.exp(-zi)
        total += math.log(neg) + math.log(pos)
    return total / len(z)


def _ref_high_rank(z, delta):
    p = 1.0 / (1.0 + np.exp(-z.double().numpy()))
    sv = np.linalg.svd(p, compute_uv=False)
    return -np.log(sv**2 + delta).sum() / p.shape[-1]


def _labels(b, c, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1, 2, (b, c), generator=g).to(torch.int8)


# ----------------------------------------------------------------------------- hand-computed
def test_zlpr_hand_computed():
    # row 1: z = 0, one positive, two negatives: log(1 + 1 + 1) + log(1 + 1) = log 6
    # row 2: no positive, z = (ln 2, 0, 0): log(1 + 2 + 1 + 1) + log(1) = log 5
    z = torch.tensor([[0.0, 0.0, 0.0], [math.log(2.0), 0.0, 0.0]])
    y = torch.tensor([[1, 0, 0], [0, -1, 0]], dtype=torch.int8)
    assert zlpr(z, y).item() == pytest.approx((math.log(6) + math.log(5)) / 2)


def test_opml_hand_computed():
    z = torch.zeros(1, 3)
    y = torch.tensor([[1, 0, 0]], dtype=torch.int8)
    # log(α + 2) + log(β + 1): α = 2, β = 0.5 → log 4 + log 1.5 = log 6 (= ZLPR's value here)
    assert opml(z, y, alpha=2.0, beta=0.5).item() == pytest.approx(math.log(6))
    # α = 3, β = 1: log 5 + log 2
    assert opml(z, y, alpha=3.0, beta=1.0).item() == pytest.approx(math.log(10))


def test_high_rank_hand_computed():
    # z = 0 → P = ½·ones(2, 2): rank 1, σ1 = ½·√(2·2) = 1, σ2 = 0
    # reg = −(1/2)·(log(1 + δ) + log δ)
    z = torch.zeros(2, 2, dtype=torch.float64)
    y = torch.tensor([[1, 0], [0, 1]], dtype=torch.int8)
    d, lam = 1e-2, 0.3
    reg = -(math.log(1 + d) + math.log(d)) / 2
    data = 2 * math.log(2)  # each row: log(1 + 1) + log(1 + 1)
    out = opml(z, y, high_rank=True, hr_lambda=lam, hr_delta=d)
    assert out.item() == pytest.approx(data + lam * reg)


def test_soft_hand_computed():
    # z = 0 (p = ½), y = (1, 0), AP = (·, 0.5), g = 1 → ε = ½·0.5 = 0.25 on the unobserved entry
    # neg = log(1 + (1 − 0.25)·1), pos = log(1 + 1 + 0.25·1)
    z = torch.zeros(1, 2)
    y = torch.tensor([[1, 0]], dtype=torch.int8)
    ap = torch.tensor([0.9, 0.5])
    want = math.log(1.75) + math.log(2.25)
    assert opml(z, y, soft=True, soft_power=1.0, ap=ap).item() == pytest.approx(want)
    # g = 2 → ε = ½·0.25 = 0.125
    want2 = math.log(1.875) + math.log(2.125)
    assert opml(z, y, soft=True, soft_power=2.0, ap=ap).item() == pytest.approx(want2)
    # AP not computed yet (NaN) → ε = 0: plain OPML
    nan_ap = torch.full((2,), math.nan)
    torch.testing.assert_close(opml(z, y, soft=True, ap=nan_ap), opml(z, y))


def test_correct_hand_computed():
    # class 0: observed positives rows 0, 1 (N_0 = 2); AP_0 = 0.5, r = 1 → k_0 = round(2·0.5) = 1
    #   eligible (unobserved) rows 2..5 with logits 3, 5, 5, −1 → rows 3 and 4 tie at 5: the lower
    #   row index (3) wins
    # class 1: one positive (row 5), AP_1 = 0.25, r = 1 → k_1 = round(0.75) = 1; row 0 is an
    #   observed negative (not eligible) despite the top logit 9 → row 1 (logit 4)
    y = torch.tensor([[1, -1], [1, 0], [0, 0], [0, 0], [0, 0], [0, 1]], dtype=torch.int8)
    z = torch.tensor([[0.0, 9.0], [0.0, 4.0], [3.0, 1.0], [5.0, 2.0], [5.0, 3.0], [-1.0, 0.0]])
    ap = torch.tensor([0.5, 0.25])
    out = opml_correct_labels(z, y, correct_ratio=1.0, ap=ap)
    want = torch.zeros(6, 2, dtype=torch.bool)
    want[3, 0] = True
    want[1, 1] = True
    assert torch.equal(out, want)
    # second step: flipped entries are no longer eligible → the next ones (row 4; row 4)
    out2 = opml_correct_labels(z, y, out, correct_ratio=1.0, ap=ap)
    want[4, 0] = True
    want[4, 1] = True
    assert torch.equal(out2, want)
    # k larger than the eligible count flips all of them; r = 0 flips nothing
    all_ = opml_correct_labels(z, y, correct_ratio=100.0, ap=torch.zeros(2))
    assert torch.equal(all_, y == 0)
    assert not opml_correct_labels(z, y, correct_ratio=0.0, ap=ap).any()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correct_against_brute_force(seed):
    """Per trial and class: sort eligible rows by (−score, row) and flip the first k."""
    g = torch.Generator().manual_seed(seed)
    t, n, c = 2, 40, 5
    z = torch.randint(-3, 4, (t, n, c), generator=g).double()  # many ties
    y = _labels(n, c, seed)
    flipped = torch.rand(t, n, c, generator=g) < 0.1
    flipped &= y == 0
    ap = torch.rand(t, c, generator=g, dtype=torch.float64)
    ratio = torch.tensor([0.7, 3.0], dtype=torch.float64)
    got = opml_correct_labels(z, y, flipped, correct_ratio=ratio, ap=ap)
    want = flipped.clone()
    for ti in range(t):
        for ci in range(c):
            n_pos = int((y[:, ci] == 1).sum())
            k = round(float(ratio[ti]) * n_pos * (1 - float(ap[ti, ci])))
            rows = [r for r in range(n) if y[r, ci] == 0 and not flipped[ti, r, ci]]
            rows.sort(key=lambda r: (-float(z[ti, r, ci]), r))
            for r in rows[:k]:
                want[ti, r, ci] = True
    assert torch.equal(got, want)


def test_correct_default_ap_is_sklearn_ap_of_observed():
    g = torch.Generator().manual_seed(3)
    z = torch.randn(30, 4, generator=g, dtype=torch.float64)
    y = torch.zeros(30, 4, dtype=torch.int8)
    y[torch.arange(30), torch.randint(0, 4, (30,), generator=g)] = 1
    ap = np.array([average_precision_score(y[:, c].numpy() == 1, z[:, c].numpy())
                   for c in range(4)])
    a = opml_correct_labels(z, y, correct_ratio=0.5)
    b = opml_correct_labels(z, y, correct_ratio=0.5, ap=torch.from_numpy(ap))
    assert torch.equal(a, b) and a.any()


# ----------------------------------------------------------------------------- random vs reference
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_inputs_against_reference(seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(6, 5, generator=g, dtype=torch.float64) * 3
    y = _labels(6, 5, seed)
    torch.testing.assert_close(zlpr(z, y).item(), _ref_pairwise(z, y))
    a, b = 10 ** (6 * torch.rand(2, generator=g).double() - 3).numpy()
    torch.testing.assert_close(opml(z, y, alpha=float(a), beta=float(b)).item(),
                               _ref_pairwise(z, y, float(a), float(b)))
    # soft targets ε = p·AP^g on unobserved entries
    ap = torch.rand(5, generator=g, dtype=torch.float64)
    power = 1.7
    p = torch.sigmoid(z)
    eps = (p * ap**power).tolist()
    torch.testing.assert_close(
        opml(z, y, alpha=float(a), beta=float(b), soft=True, soft_power=power, ap=ap).item(),
        _ref_pairwise(z, y, float(a), float(b), eps))
    # high rank against numpy's SVD
    lam, d = 0.05, 1e-3
    torch.testing.assert_close(
        opml(z, y, high_rank=True, hr_lambda=lam, hr_delta=d).item(),
        _ref_pairwise(z, y) + lam * _ref_high_rank(z, d))


def test_alpha_beta_one_is_zlpr():
    g = torch.Generator().manual_seed(5)
    z = torch.randn(3, 7, 6, generator=g) * 4
    y = _labels(7, 6, 5)
    torch.testing.assert_close(opml(z, y, 1.0, 1.0), zlpr(z, y))
    torch.testing.assert_close(create_loss("opml")(z, y).loss, create_loss("zlpr")(z, y).loss)


@pytest.mark.parametrize(("b", "c"), [(9, 4), (4, 9), (5, 5)])
def test_high_rank_equals_singular_value_form(b, c):
    # the implementation takes a log-det; the definition is Σ_i over min(B, C) singular values
    g = torch.Generator().manual_seed(7)
    z = torch.randn(2, b, c, generator=g, dtype=torch.float64) * 2
    y = _labels(b, c, 7)
    d = torch.tensor([1e-4, 0.5], dtype=torch.float64)
    sv = torch.linalg.svdvals(torch.sigmoid(z))
    reg = -torch.log(sv**2 + d[:, None]).sum(-1) / c
    got = opml(z, y, high_rank=True, hr_lambda=1.0, hr_delta=d) - opml(z, y)
    torch.testing.assert_close(got, reg, rtol=1e-9, atol=1e-12)


def test_high_rank_gradient_matches_svd_closed_form():
    """∂/∂z of −(λ/C)·Σ log(σ_i² + δ) = −(λ/C)·[U diag(2σ/(σ² + δ)) Vᵀ] ⊙ p(1 − p)."""
    g = torch.Generator().manual_seed(8)
    z = (torch.randn(6, 4, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    lam, d = 0.7, 1e-3
    y = torch.zeros(6, 4, dtype=torch.int8)
    (opml(z, y, high_rank=True, hr_lambda=lam, hr_delta=d) - opml(z, y)).backward()
    p = torch.sigmoid(z.detach()).numpy()
    u, sv, vt = np.linalg.svd(p, full_matrices=False)
    dp = u @ np.diag(2 * sv / (sv**2 + d)) @ vt
    want = -lam / 4 * dp * p * (1 - p)
    np.testing.assert_allclose(z.grad.numpy(), want, rtol=1e-7, atol=1e-12)


# ----------------------------------------------------------------------------- gradients
def test_gradient_identity_hard():
    """∂ℓ/∂z_j = e^{z_j}/(α + Σ_{Ω−} e^{z}) on Ω−, −e^{−z_i}/(β + Σ_{Ω+} e^{−z}) on Ω+, ÷B."""
    g = torch.Generator().manual_seed(11)
    z = (torch.randn(5, 6, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    y = _labels(5, 6, 11)
    y[0] = 1  # a row of positives only
    y[1] = 0  # a row without positives
    a, b = 0.3, 4.0
    opml(z, y, alpha=a, beta=b).backward()
    zd = z.detach()
    pos = y == 1
    ez, emz = zd.exp(), (-zd).exp()
    neg_den = a + torch.where(pos, 0, ez).sum(-1, keepdim=True)
    pos_den = b + torch.where(pos, emz, 0).sum(-1, keepdim=True)
    want = torch.where(pos, -emz / pos_den, ez / neg_den) / z.shape[0]
    torch.testing.assert_close(z.grad, want)


def test_gradient_identity_soft_targets_under_stop_gradient():
    """With ε = sg(p)·a the soft loss differentiates as if ε were a constant."""
    g = torch.Generator().manual_seed(12)
    z = (torch.randn(4, 5, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    y = _labels(4, 5, 12)
    ap = torch.rand(5, generator=g, dtype=torch.float64)
    opml(z, y, soft=True, soft_power=1.0, ap=ap).backward()
    zd = z.detach()
    eps = torch.sigmoid(zd) * ap
    t = torch.where(y == 1, 1.0, torch.where(y == 0, eps, 0.0)).double()
    ez, emz = zd.exp(), (-zd).exp()
    neg_den = 1 + ((1 - t) * ez).sum(-1, keepdim=True)
    pos_den = 1 + (t * emz).sum(-1, keepdim=True)
    want = ((1 - t) * ez / neg_den - t * emz / pos_den) / z.shape[0]
    torch.testing.assert_close(z.grad, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_high_rank_gradient_finite_with_repeated_singular_values(dtype):
    cases = [
        torch.zeros(4, 6),  # P = ½·ones: one σ, the rest repeated zeros
        torch.full((4, 6), 100.0),  # saturated: P = ones
        torch.eye(6)[:4] * 50,  # σ = ½ repeated three times
        torch.cat([torch.full((4, 3), 100.0), torch.full((4, 3), -100.0)], -1),
        torch.zeros(1, 6),  # one row
    ]
    for z in cases:
        z = z.to(dtype).requires_grad_(True)
        y = torch.zeros(z.shape, dtype=torch.int8)
        out = opml(z, y, high_rank=True, hr_lambda=1.0, hr_delta=1e-4)
        out.backward()
        assert torch.isfinite(out) and torch.isfinite(z.grad).all()


# ----------------------------------------------------------------------------- edge cases
def test_extreme_logits_and_dtypes():
    z = torch.tensor([[100.0, -100.0, 100.0], [-100.0, -100.0, -100.0]])
    y = torch.tensor([[1, 0, 0], [0, 0, 0]], dtype=torch.int8)
    out = opml(z, y)
    # row 1: neg ≈ log(e^{100}) = 100, pos ≈ log(1 + e^{−100}) ≈ 0; row 2: ≈ log 1 + log 1 = 0
    assert out.item() == pytest.approx(50.0, rel=1e-6)
    for dt in (torch.float16, torch.float32, torch.float64):
        zz = (torch.randn(6, 5) * 100).clamp(-100, 100).to(dt).requires_grad_(True)
        yy = _labels(6, 5, 0)
        v = opml(zz, yy, alpha=1e-3, beta=1e3, high_rank=True, soft=True,
                 ap=torch.rand(5))
        v.backward()
        assert v.dtype == (torch.float64 if dt == torch.float64 else torch.float32)
        assert torch.isfinite(v) and torch.isfinite(zz.grad).all()


def test_trial_axis_pure_function():
    g = torch.Generator().manual_seed(21)
    z = torch.randn(3, 6, 5, generator=g, dtype=torch.float64) * 3
    y = _labels(6, 5, 21)
    alpha = torch.tensor([0.01, 1.0, 50.0], dtype=torch.float64)
    beta = torch.tensor([2.0, 0.5, 1e-3], dtype=torch.float64)
    lam = torch.tensor([0.0, 0.1, 1.0], dtype=torch.float64)
    power = torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)
    ap = torch.rand(3, 5, generator=g, dtype=torch.float64)
    out = opml(z, y, alpha, beta, high_rank=True, hr_lambda=lam, soft=True, soft_power=power,
               ap=ap)
    assert out.shape == (3,)
    for t in range(3):
        one = opml(z[t], y, float(alpha[t]), float(beta[t]), high_rank=True,
                   hr_lambda=float(lam[t]), soft=True, soft_power=float(power[t]), ap=ap[t])
        torch.testing.assert_close(out[t], one)


# ----------------------------------------------------------------------------- the registered loss
def _drive(loss, logits_seq, train_logits_seq, observed, b, stacked):
    """setup → per epoch: two batches (forward/backward) → end_epoch; returns values, grads."""
    loss.setup(observed, n_epochs=len(train_logits_seq))
    vals, grads = [], []
    step = 0
    for epoch, train_logits in enumerate(train_logits_seq):
        loss.start_epoch(epoch)
        for index in (torch.arange(0, b), torch.arange(b, 2 * b)):
            z = logits_seq[step].clone().requires_grad_(True)
            out = loss(z, observed[index], index=index)
            out.loss.sum().backward()
            vals.append(out.loss.detach())
            grads.append(z.grad)
            step += 1
        loss.end_epoch(epoch, train_logits if stacked else train_logits.unsqueeze(0))
    return vals, grads


def _observed(n, c, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.zeros(n, c, dtype=torch.int8)
    y[torch.arange(n), torch.randint(0, c, (n,), generator=g)] = 1
    return y


@pytest.mark.filterwarnings("ignore:No positive class found:UserWarning")  # a class w/o positive
def test_object_state_matches_pure_functions():
    """end_epoch stores sklearn's AP of the observed positives and the flips of
    opml_correct_labels; forward then equals the pure function on the corrected labels."""
    n, c, b = 12, 4, 6
    y = _observed(n, c, 1)
    g = torch.Generator().manual_seed(1)
    train = torch.randn(1, n, c, generator=g, dtype=torch.float64)
    loss = create_loss("opml", alpha=0.5, soft=True, soft_power=2.0, correct=True,
                       correct_ratio=1.0)
    assert loss.stateful and loss.needs_epoch_pass
    plain = create_loss("opml")
    assert not plain.needs_epoch_pass and not plain.stateful
    plain.set_hparam("correct", True)  # switching an option later updates the protocol flags
    assert plain.needs_epoch_pass and plain.stateful
    loss.setup(y, n_epochs=2)
    assert torch.isnan(loss.ap).all() and not loss.flipped.any()
    # before the first epoch ends: ε = 0, no flips → plain OPML
    z = torch.randn(b, c, generator=g, dtype=torch.float64)
    idx = torch.arange(b)
    torch.testing.assert_close(loss(z, y[idx], index=idx).loss, opml(z, y[idx], alpha=0.5))
    loss.end_epoch(0, train)
    sk = [average_precision_score(y[:, k].numpy() == 1, train[0, :, k].numpy()) for k in range(c)]
    torch.testing.assert_close(loss.ap[0], torch.tensor(sk, dtype=loss.ap.dtype))
    flips = opml_correct_labels(train[0], y, correct_ratio=1.0)
    assert torch.equal(loss.flipped[0], flips) and flips.any()
    corrected = torch.where(flips, torch.ones_like(y), y)
    want = opml(z, corrected[idx], alpha=0.5, soft=True, soft_power=2.0, ap=loss.ap[0])
    torch.testing.assert_close(loss(z, y[idx], index=idx).loss, want)
    # state survives a state_dict round trip
    clone = create_loss("opml", alpha=0.5, soft=True, soft_power=2.0, correct=True,
                        correct_ratio=1.0)
    clone.setup(y, n_epochs=2)
    clone.load_state_dict(loss.state_dict())
    assert torch.equal(clone.flipped, loss.flipped)
    torch.testing.assert_close(clone.ap, loss.ap)


def test_stacked_options_equal_separate_runs():
    """Per-trial α, β, λ, g, r with high_rank + soft + correct: T stacked = T separate runs
    (values, gradients, AP and flip state) over 3 epochs."""
    n, c, b, t = 16, 5, 8, 3
    y = _observed(n, c, 2)
    per_trial = {
        "alpha": [0.01, 1.0, 30.0], "beta": [5.0, 1.0, 0.02], "hr_lambda": [1e-3, 0.0, 0.1],
        "soft_power": [0.5, 1.0, 4.0], "correct_ratio": [0.05, 0.5, 1.0],
    }
    opts = {"high_rank": True, "soft": True, "correct": True}
    g = torch.Generator().manual_seed(3)
    logits_seq = [torch.randn(t, b, c, generator=g, dtype=torch.float64) * 2 for _ in range(6)]
    train_seq = [torch.randn(t, n, c, generator=g, dtype=torch.float64) * 2 for _ in range(3)]
    stacked = create_loss("opml", **opts, **{k: torch.tensor(v, dtype=torch.float64)
                                              for k, v in per_trial.items()})
    vals, grads = _drive(stacked, logits_seq, train_seq, y, b, stacked=True)
    assert stacked.flipped.shape == (t, n, c) and stacked.flipped.any()
    for i in range(t):
        single = create_loss("opml", **opts, **{k: v[i] for k, v in per_trial.items()})
        v1, g1 = _drive(single, [z[i] for z in logits_seq], [z[i] for z in train_seq], y, b,
                        stacked=False)
        for a, b_ in zip(vals, v1):
            torch.testing.assert_close(a[i], b_)
        for a, b_ in zip(grads, g1):
            torch.testing.assert_close(a[i], b_)
        assert torch.equal(stacked.flipped[i], single.flipped[0])
        torch.testing.assert_close(stacked.ap[i], single.ap[0])


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": 0.0}, r"'alpha' must lie in \(0, inf\)"),
        ({"beta": -1.0}, r"'beta' must lie in \(0, inf\)"),
        ({"high_rank": True, "hr_delta": 0.0}, r"'hr_delta' must lie in \[1e-08, inf\)"),
        ({"high_rank": True, "hr_lambda": -1.0}, r"'hr_lambda' must lie in \[0, inf\)"),
        ({"soft": True, "soft_power": -0.5, "ap": torch.ones(3)}, r"'soft_power' must lie"),
        ({"soft": True}, r"soft=True needs 'ap'"),
        ({"soft": True, "ap": torch.ones(4)}, r"'ap' must have shape \(3,\)"),
        ({"high_rank": 1}, r"'high_rank' must be true or false"),
        ({"alpha": torch.ones(2)}, r"'alpha' has one value per trial"),
    ],
)
def test_errors_name_the_argument(kwargs, match):
    z = torch.zeros(2, 3)
    y = torch.tensor([[1, 0, 0], [0, 1, 0]], dtype=torch.int8)
    with pytest.raises(LossInputError, match=match):
        opml(z, y, **kwargs)


def test_object_errors():
    y = _observed(8, 3, 0)
    with pytest.raises(LossInputError, match=r"'correct_ratio' must lie in \[0, inf\)"):
        create_loss("opml", correct=True, correct_ratio=-0.1)
    loss = create_loss("opml", correct=True)
    with pytest.raises(LossInputError, match="call setup"):
        loss(torch.zeros(4, 3), y[:4], index=torch.arange(4))
    loss.setup(y, n_epochs=1)
    with pytest.raises(LossInputError, match="pass index="):
        loss(torch.zeros(4, 3), y[:4])
    with pytest.raises(LossInputError, match=r"shape \(1, 8, 3\)"):
        loss.end_epoch(0, torch.zeros(8, 3))
    with pytest.raises(LossInputError, match="observed"):
        create_loss("opml", soft=True).setup(torch.full((8, 3), 2, dtype=torch.int8), 1)
    with pytest.raises(LossInputError, match="'flipped' must be a bool tensor"):
        opml_correct_labels(torch.zeros(8, 3), y, torch.zeros(8, 3))
