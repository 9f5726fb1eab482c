"""Focal, ASL, Hill and SPLC (probe/losses/robust.py; docs/losses.md "Robust losses").

Hand-computed cases use logits ln 3, −ln 3, 0, 1 + ln 3 (p = 3/4, 1/4, 1/2 and
p_m = σ(z − 1) = 3/4), so every number below is a closed form. The random comparisons use an
independent float64 reference written entry by entry with the math module."""

from __future__ import annotations

import math

import pytest
import torch

import probe.losses as L
from probe.losses import LossInputError, create_loss

LN3 = math.log(3.0)
E = math.e


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ------------------------------------------------------------------ independent references
def _ref_entry(name: str, z: float, y: int, h: dict, epoch_on: bool = True) -> float:
    """One entry of each loss, straight from docs/losses.md, in float64 with math.log(sigmoid)."""
    p = _sig(z)
    if name == "focal":
        g = h["gamma"]
        return -((1 - p) ** g) * math.log(p) if y == 1 else -(p**g) * math.log(1 - p)
    if name == "asl":
        if y == 1:
            return -((1 - p) ** h["gamma_pos"]) * math.log(p)
        pm = max(p - h["clip"], 0.0)
        return -(pm ** h["gamma_neg"]) * math.log(1 - pm)
    pm = _sig(z - h["margin"])
    fm = -((1 - pm) ** h["gamma"]) * math.log(pm)
    if name == "hill":
        return fm if y == 1 else (h["lam"] - p) * p * p
    if name == "splc":
        if y == 1 or (y == 0 and epoch_on and p > h["tau"]):
            return fm
        return -(p ** h["gamma"]) * math.log(1 - p)
    raise KeyError(name)


def _ref_loss(name, z: torch.Tensor, y: torch.Tensor, h: dict, epoch_on=True) -> float:
    b, c = z.shape
    total = sum(
        _ref_entry(name, float(z[i, j]), int(y[i, j]), h, epoch_on)
        for i in range(b)
        for j in range(c)
    )
    return total / (b * c)


PARAMS = {
    "focal": [{"gamma": 2.0}, {"gamma": 0.0}, {"gamma": 0.7}],
    "asl": [
        {"gamma_pos": 0.0, "gamma_neg": 4.0, "clip": 0.05},
        {"gamma_pos": 1.0, "gamma_neg": 2.0, "clip": 0.0},
        {"gamma_pos": 0.5, "gamma_neg": 3.0, "clip": 0.15},
    ],
    "hill": [
        {"lam": 1.5, "margin": 1.0, "gamma": 2.0},
        {"lam": 1.2, "margin": 0.5, "gamma": 1.0},
        {"lam": 2.0, "margin": 0.0, "gamma": 0.0},
    ],
    "splc": [
        {"tau": 0.6, "margin": 1.0, "gamma": 2.0},
        {"tau": 0.3, "margin": 0.5, "gamma": 1.0},
        {"tau": 0.8, "margin": 0.0, "gamma": 3.0},
    ],
}


def _data(seed=0, b=5, c=7, t=None, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    shape = (b, c) if t is None else (t, b, c)
    z = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    y = torch.randint(-1, 2, (b, c), generator=g).to(torch.int8)
    return z, y


# ------------------------------------------------------------------ hand-computed cases
def test_focal_hand_computed():
    z = torch.tensor([[LN3, -LN3, 0.0]])
    y = torch.tensor([[1, 0, -1]], dtype=torch.int8)
    # y=1, p=3/4: −(1/4)² log(3/4);  y=0, p=1/4: −(1/4)² log(3/4);  y=−1, p=1/2: −(1/2)² log(1/2)
    expected = (2 * (1 / 16) * math.log(4 / 3) + 0.25 * math.log(2)) / 3
    assert L.focal(z, y).item() == pytest.approx(expected, rel=1e-6)
    # γ = 0 is BCE: (log(4/3) + log(4/3) + log 2) / 3
    assert L.focal(z, y, gamma=0.0).item() == pytest.approx(
        (2 * math.log(4 / 3) + math.log(2)) / 3, rel=1e-6
    )


def test_asl_hand_computed_and_stop_gradient():
    z = torch.tensor([[-LN3, LN3, 0.0, math.log(0.04 / 0.96)]], requires_grad=True)
    y = torch.tensor([[1, 0, 0, 0]], dtype=torch.int8)
    loss = L.asl(z, y)  # γ+ = 0, γ− = 4, clip 0.05
    # y=1, p=1/4: −log(1/4);  y=0, p=3/4 → p_m = 0.7: 0.7⁴·(−log 0.3);
    # y=0, p=1/2 → p_m = 0.45: 0.45⁴·(−log 0.55);  y=0, p=0.04 < clip: 0
    expected = (math.log(4) + 0.7**4 * -math.log(0.3) + 0.45**4 * -math.log(0.55) + 0.0) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # weights under stop-gradient: ∂/∂z of −w·log(1−p_m) = w·p(1−p)/(1−p_m) for p > clip
    expected_grad = [-(1 - 0.25), 0.7**4 * 0.75 * 0.25 / 0.3, 0.45**4 * 0.25 / 0.55, 0.0]
    torch.testing.assert_close(z.grad[0] * 4, torch.tensor(expected_grad), rtol=1e-5, atol=1e-7)


def test_hill_hand_computed():
    z = torch.tensor([[1 + LN3, 0.0, LN3]])
    y = torch.tensor([[1, 0, -1]], dtype=torch.int8)
    # y=1: p_m = σ(ln 3) = 3/4 → (1/4)²·(−log 3/4);  y=0, p=1/2: (1.5 − 0.5)·(1/2)² = 0.25;
    # y=−1, p=3/4: (1.5 − 0.75)·(3/4)² = 0.421875
    expected = ((1 / 16) * math.log(4 / 3) + 0.25 + 0.421875) / 3
    assert L.hill(z, y).item() == pytest.approx(expected, rel=1e-6)


def test_splc_hand_computed_epochs():
    z = torch.tensor([[1 + LN3, 1 + LN3, 0.0, 1 + LN3]])
    y = torch.tensor([[1, 0, 0, -1]], dtype=torch.int8)
    fm = (1 / 16) * math.log(4 / 3)  # focal margin at p_m = 3/4
    q = 3 * E / (1 + 3 * E)  # σ(1 + ln 3) ≈ 0.891 > τ = 0.6
    fn_q = q**2 * math.log(1 + 3 * E)  # focal negative −q² log(1 − q)
    fn_half = 0.25 * math.log(2)  # p = 1/2 ≤ τ: never corrected
    before = (fm + fn_q + fn_half + fn_q) / 4
    after = (fm + fm + fn_half + fn_q) / 4  # the unobserved p = q entry becomes positive; −1 not
    assert L.splc(z, y, epoch=0).item() == pytest.approx(before, rel=1e-6)
    assert L.splc(z, y, epoch=1).item() == pytest.approx(after, rel=1e-6)
    assert L.splc(z, y).item() == pytest.approx(after, rel=1e-6)  # epoch=None: correction on
    assert L.splc(z, y, epoch=1, change_epoch=2).item() == pytest.approx(before, rel=1e-6)
    assert L.splc(z, y, epoch=5, tau=0.95).item() == pytest.approx(before, rel=1e-6)


def test_splc_object_switches_at_change_epoch():
    """start_epoch(e) is 0-indexed: epoch 0 uncorrected, from change_epoch on corrected."""
    z = torch.tensor([[1 + LN3, 1 + LN3, 0.0, 1 + LN3]])
    y = torch.tensor([[1, 0, 0, -1]], dtype=torch.int8)
    loss = create_loss("splc", change_epoch=2)
    loss.setup(y, n_epochs=4)
    seen = []
    for epoch in range(4):
        loss.start_epoch(epoch)
        out = loss(z, y, index=torch.tensor([0]))
        torch.testing.assert_close(out.loss, L.splc(z, y, epoch=epoch, change_epoch=2))
        seen.append(out.parts["corrected"].item())
    assert seen == [0.0, 0.0, 0.25, 0.25]  # one of the four entries is corrected


# ------------------------------------------------------------------ random vs reference
@pytest.mark.parametrize("name", ["focal", "asl", "hill", "splc"])
def test_random_against_reference(name):
    fn = getattr(L, name)
    z, y = _data(seed=1)
    for h in PARAMS[name]:
        got = fn(z, y, **h).item()
        assert got == pytest.approx(_ref_loss(name, z, y, h), rel=1e-10, abs=1e-12), h
    if name == "splc":
        h = PARAMS[name][0]
        assert fn(z, y, epoch=0, **h).item() == pytest.approx(
            _ref_loss(name, z, y, h, epoch_on=False), rel=1e-10
        )


@pytest.mark.parametrize("name", ["focal", "asl", "hill", "splc"])
def test_trial_axis_against_reference(name):
    """(T,) hyperparameters with (T, B, C) logits: trial t = the reference with trial t's values."""
    fn = getattr(L, name)
    z, y = _data(seed=2, t=3)
    trials = PARAMS[name]
    stacked = {k: torch.tensor([h[k] for h in trials], dtype=torch.float64) for k in trials[0]}
    got = fn(z, y, **stacked)
    assert got.shape == (3,)
    for t, h in enumerate(trials):
        assert got[t].item() == pytest.approx(_ref_loss(name, z[t], y, h), rel=1e-10, abs=1e-12)


def test_registered_objects_equal_pure_functions():
    z, y = _data(seed=3, t=3)
    for name, trials in PARAMS.items():
        stacked = {k: torch.tensor([h[k] for h in trials]) for k in trials[0]}
        loss = create_loss(name, **stacked)
        loss.setup(y, n_epochs=3, n_trials=3)
        loss.start_epoch(2)
        extra = {"epoch": 2} if name == "splc" else {}
        torch.testing.assert_close(loss(z, y).loss, getattr(L, name)(z, y, **stacked, **extra))


# ------------------------------------------------------------------ gradient identities
@pytest.mark.parametrize("lam", [1.5, 1.0, 2.0])
def test_hill_negative_gradient(lam):
    """∂/∂z (λ − p)p² = p²(2λ − 3p)(1 − p); with λ = 1.5 that is 3p²(1−p)² (GR paper Eq. 33)."""
    z, _ = _data(seed=4)
    y = torch.zeros(z.shape, dtype=torch.int8)
    z.requires_grad_(True)
    (L.hill(z, y, lam=lam) * z.numel()).backward()  # undo the mean: per-entry gradients
    p = torch.sigmoid(z.detach())
    torch.testing.assert_close(z.grad, p**2 * (2 * lam - 3 * p) * (1 - p))
    if lam == 1.5:
        torch.testing.assert_close(z.grad, 3 * p**2 * (1 - p) ** 2)


def test_focal_gradient_closed_form():
    """Lin et al. appendix: ∂FL/∂z on a positive = γ(1−p)^γ p log p − (1−p)^(γ+1)."""
    z, _ = _data(seed=5)
    y = torch.ones(z.shape, dtype=torch.int8)
    z.requires_grad_(True)
    (L.focal(z, y, gamma=2.0) * z.numel()).backward()
    p = torch.sigmoid(z.detach())
    torch.testing.assert_close(z.grad, 2 * (1 - p) ** 2 * p * torch.log(p) - (1 - p) ** 3)


def test_asl_weights_are_stop_gradient():
    """With sg weights: ∂/∂z = −sg((1−p)^γ+)(1−p) on positives, sg(p_m^γ−)·p(1−p)/(1−p_m) on
    negatives (the full derivative would add the weights' own terms)."""
    z, y = _data(seed=6)
    z.requires_grad_(True)
    (L.asl(z, y, gamma_pos=1.0, gamma_neg=4.0, clip=0.05) * z.numel()).backward()
    p = torch.sigmoid(z.detach())
    pm = (p - 0.05).clamp_min(0)
    expected = torch.where(y > 0, -(1 - p) * (1 - p), pm**4 * p * (1 - p) / (1 - pm))
    torch.testing.assert_close(z.grad, expected)


# ------------------------------------------------------------------ edge cases
EXTREME = torch.tensor([[-100.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 100.0]] * 3)
Y_EXTREME = torch.tensor([[1] * 7, [0] * 7, [-1] * 7], dtype=torch.int8)


@pytest.mark.parametrize("name", ["focal", "asl", "hill", "splc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_extreme_logits_finite(name, dtype):
    fn = getattr(L, name)
    for h in PARAMS[name]:
        z = EXTREME.to(dtype).clone().requires_grad_(True)
        loss = fn(z, Y_EXTREME, **h)
        loss.backward()
        assert torch.isfinite(loss), (h, loss)
        assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        assert torch.isfinite(z.grad).all(), (h, z.grad)


def test_asl_clip_zero_in_a_trial_tensor_is_exact_and_finite():
    z = EXTREME.unsqueeze(0).expand(2, -1, -1).clone().requires_grad_(True)
    clip = torch.tensor([0.0, 0.05])
    loss = L.asl(z, Y_EXTREME, clip=clip, gamma_neg=2.0)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(z.grad).all()
    torch.testing.assert_close(loss[0], L.asl(EXTREME, Y_EXTREME, clip=0.0, gamma_neg=2.0))
    torch.testing.assert_close(loss[1], L.asl(EXTREME, Y_EXTREME, clip=0.05, gamma_neg=2.0))


def test_rows_and_classes_without_positives():
    z, _ = _data(seed=7)
    y = torch.zeros(z.shape, dtype=torch.int8)
    y[0, 0] = 1  # one positive; every other row and class has none
    for name, trials in PARAMS.items():
        for h in trials:
            assert getattr(L, name)(z, y, **h).item() == pytest.approx(
                _ref_loss(name, z, y, h), rel=1e-10
            )


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("focal", {"gamma": -1.0}, "'gamma' must lie in"),
        ("asl", {"gamma_neg": -0.5}, "'gamma_neg' must lie in"),
        ("asl", {"gamma_pos": torch.tensor([0.0, -1.0])}, "'gamma_pos' must lie in"),
        ("asl", {"clip": 1.0}, r"'clip' must lie in \[0, 1\)"),
        ("asl", {"clip": -0.1}, "'clip' must lie in"),
        ("hill", {"lam": 0.0}, r"'lam' must lie in \(0, inf\)"),
        ("hill", {"margin": -1.0}, "'margin' must lie in"),
        ("splc", {"tau": 1.5}, r"'tau' must lie in \[0, 1\]"),
        ("splc", {"change_epoch": -1}, "'change_epoch' must lie in"),
        ("splc", {"change_epoch": 1.5}, "'change_epoch' must be an integer"),
        ("splc", {"epoch": -1}, "'epoch' must be a 0-indexed integer"),
        ("splc", {"epoch": 1.0}, "'epoch' must be a 0-indexed integer"),
        ("focal", {"gamma": float("nan")}, "'gamma' must lie in"),
    ],
)
def test_bad_hyperparameters_are_named(name, kwargs, match):
    z = torch.zeros(2, 3)
    y = torch.zeros(2, 3, dtype=torch.int8)
    with pytest.raises(LossInputError, match=match):
        getattr(L, name)(z, y, **kwargs)
    kwargs.pop("epoch", None)
    if kwargs:
        with pytest.raises(LossInputError, match=match):
            create_loss(name, **kwargs)


def test_trial_count_mismatch_is_named():
    with pytest.raises(LossInputError, match=r"'gamma' must have shape \(2,\)"):
        L.focal(torch.zeros(2, 3, 4), torch.zeros(3, 4, dtype=torch.int8),
                gamma=torch.tensor([1.0, 2.0, 3.0]))
