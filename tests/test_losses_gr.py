"""GR loss (probe/losses/gr_loss.py; docs/losses.md "Generalized Robust Loss", paper Eqs. 4-18).

Hand-computed cases use logits 0, ±ln 3 (p = 1/2, 3/4, 1/4); the random comparisons use an
independent float64 reference written entry by entry with the math module, (1 − p^q)/q taken
literally (−log for q = 0)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import probe.losses as L
from probe.losses import GRParts, LossInputError, create_loss, get_loss_class

LN3 = math.log(3.0)


def _sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _ref_l(x: float, q: float) -> float:
    """(1 − x^q)/q, −log x at q = 0 — the paper's Eq. 14 read literally."""
    return -math.log(x) if q == 0 else (1 - x**q) / q


def _ref_gr(z, y, w, b, mu, sigma, q1, q2, q3, use_k=True, use_v=True) -> float:
    bsz, c = z.shape
    total = 0.0
    for i in range(bsz):
        for j in range(c):
            p, s = _sig(float(z[i, j])), int(y[i, j])
            if s == 1:
                total += _ref_l(p, q1)
            elif s == -1:
                total += _ref_l(1 - p, q3)
            else:
                k = 1 / (1 + math.exp(-(w * p + b))) if use_k else 0.0
                v = math.exp(-((p - mu) ** 2) / (2 * sigma**2)) if use_v else 1.0
                total += v * (k * _ref_l(p, q2) + (1 - k) * _ref_l(1 - p, q3))
    return total / (bsz * c)


def _data(seed=0, b=5, c=7, t=None, scale=2.5):
    g = torch.Generator().manual_seed(seed)
    shape = (b, c) if t is None else (t, b, c)
    z = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    y = torch.randint(-1, 2, (b, c), generator=g).to(torch.int8)
    y[0, :] = 0  # make sure every kind of entry appears
    y[0, 0], y[1, 1] = 1, -1
    return z, y


TRIALS = [
    dict(w=10.0, b=-8.0, mu=0.8, sigma=0.5, q1=0.01, q2=0.01, q3=1.0),
    dict(w=2.0, b=-2.0, mu=0.3, sigma=1.5, q1=0.0, q2=0.5, q3=0.2),
    dict(w=0.0, b=-2.0, mu=0.5, sigma=2.0, q1=0.3, q2=0.0, q3=0.0),
]


# ------------------------------------------------------------------ hand-computed
def test_hand_computed_case_and_parts():
    z = torch.tensor([[0.0, 0.0, LN3, 0.0]])
    y = torch.tensor([[1, 0, 0, -1]], dtype=torch.int8)
    kw = dict(w=2.0, b=-1.0, mu=0.5, sigma=1.0, q1=0.0, q2=0.0, q3=1.0)
    # y=1, p=1/2: L1 = −log(1/2) = log 2
    # y=0, p=1/2: k̂ = σ(2·½ − 1) = ½, v = 1, L2 = log 2, L3 = 1 − ½ → ½ log 2 + ¼
    # y=0, p=3/4: k̂ = σ(½), v = exp(−(¼)²/2), L2 = log(4/3), L3 = ¾
    # y=−1, p=1/2: L3 = ½
    k2, v2 = _sig(0.5), math.exp(-1 / 32)
    entries = [math.log(2), 0.5 * math.log(2) + 0.25,
               v2 * (k2 * math.log(4 / 3) + (1 - k2) * 0.75), 0.5]
    parts = L.gr(z, y, **kw, return_parts=True)
    assert isinstance(parts, GRParts) and parts._fields == ("loss", "k_hat", "v", "l1", "l2", "l3")
    assert parts.loss.item() == pytest.approx(sum(entries) / 4, rel=1e-6)
    torch.testing.assert_close(parts.k_hat, torch.tensor([[1.0, 0.5, k2, 0.0]]))
    torch.testing.assert_close(parts.v, torch.tensor([[1.0, 1.0, v2, 1.0]]))
    torch.testing.assert_close(parts.l3, torch.tensor([[0.5, 0.5, 0.75, 0.5]]))
    assert L.gr(z, y, **kw).item() == pytest.approx(sum(entries) / 4, rel=1e-6)


def test_hand_computed_gce_values():
    """(1 − p^q)/q at p = 1/4, q = ½: (1 − ½)/½ = 1; L3 at p = 3/4, q3 = ½: same; q = 1 is MAE."""
    y = torch.tensor([[1, -1]], dtype=torch.int8)
    z = torch.tensor([[-LN3, LN3]])
    assert L.gr(z, y, q1=0.5, q3=0.5).item() == pytest.approx(1.0, rel=1e-6)
    assert L.gr(z, y, q1=1.0, q3=1.0).item() == pytest.approx(0.75, rel=1e-6)  # 1 − p, p


# ------------------------------------------------------------------ random vs reference
def test_random_against_reference():
    z, y = _data(seed=1)
    for kw in TRIALS:
        for use_k, use_v in [(True, True), (False, True), (True, False), (False, False)]:
            got = L.gr(z, y, **kw, use_k=use_k, use_v=use_v).item()
            want = _ref_gr(z, y, **kw, use_k=use_k, use_v=use_v)
            assert got == pytest.approx(want, rel=1e-9), (kw, use_k, use_v)


def test_trial_axis_against_reference():
    z, y = _data(seed=2, t=3)
    stacked = {k: torch.tensor([kw[k] for kw in TRIALS], dtype=torch.float64) for k in TRIALS[0]}
    parts = L.gr(z, y, **stacked, return_parts=True)
    assert parts.loss.shape == (3,)
    for name in ("k_hat", "v", "l1", "l2", "l3"):
        assert getattr(parts, name).shape == (3, 5, 7), name
    for t, kw in enumerate(TRIALS):
        assert parts.loss[t].item() == pytest.approx(_ref_gr(z[t], y, **kw), rel=1e-9)


def test_robust_false_uses_q_001():
    z, y = _data(seed=3)
    got = L.gr(z, y, q1=0.7, q2=0.4, q3=2.0, robust=False).item()
    want = _ref_gr(z, y, 10.0, -8.0, 0.8, 0.5, 0.01, 0.01, 0.01)
    assert got == pytest.approx(want, rel=1e-9)


# ------------------------------------------------------------------ q → 0, AN
def _an_entries(z, y):
    """AN as docs/losses.md defines it: −log p on y=1, −log(1−p) on y≤0 (float64, log(sigmoid))."""
    p = torch.sigmoid(z)
    return torch.where(y == 1, -torch.log(p), -torch.log(1 - p))


def test_q_zero_is_the_exact_log_limit_and_switches_off_give_an():
    z, y = _data(seed=4)
    off = dict(use_k=False, use_v=False)
    exact = L.gr(z, y, q1=0.0, q2=0.0, q3=0.0, **off)
    torch.testing.assert_close(exact, _an_entries(z, y).mean(), rtol=1e-12, atol=0)
    torch.testing.assert_close(exact, L.an(z, y), rtol=1e-12, atol=0)
    # continuity: tiny q and per-trial tensors holding 0 agree with the limit
    for q in (1e-7, 1e-13):
        torch.testing.assert_close(L.gr(z, y, q1=q, q2=q, q3=q, **off), exact, rtol=1e-6, atol=0)
    q_t = torch.tensor([0.0, 1e-9], dtype=torch.float64)
    stacked = L.gr(z.expand(2, -1, -1), y, q1=q_t, q2=q_t, q3=q_t, **off)
    torch.testing.assert_close(stacked, exact.expand(2), rtol=1e-8, atol=0)


def test_all_switches_off_is_gce_of_an_entries():
    """docs/losses.md: "all three off is AN". With robust=False q1 = q2 = q3 = 0.01, so what holds
    exactly is: every entry is (1 − e^{−0.01·a})/0.01 of AN's entry a = −log p or −log(1−p) (a
    strictly increasing transform of AN, below it by at most 0.01·a²/2) — equal to AN only in the
    limit q → 0 (previous test). That is the paper's Table 3 "AN assumption" row."""
    z, y = _data(seed=5)
    parts = L.gr(z, y, use_k=False, use_v=False, robust=False, return_parts=True)
    a = _an_entries(z, y)
    entries = torch.where(y == 1, parts.l1, parts.l3)
    torch.testing.assert_close(entries, (1 - torch.exp(-0.01 * a)) / 0.01)
    torch.testing.assert_close(parts.loss, entries.mean())
    gap = a - entries
    assert (gap >= 0).all() and (gap <= 0.01 * a**2 / 2 + 1e-12).all()
    assert gap.max() > 1e-4  # and it is not AN itself


# ------------------------------------------------------------------ gradients (Eq. 18)
@pytest.mark.parametrize(("q2", "q3"), [(0.01, 1.0), (0.0, 0.0), (0.5, 1.5), (1.0, 0.2)])
def test_eq18_gradient_per_entry(q2, q3):
    """v = 1: ∂ℓ/∂z = (1−k̂)(1−p)^q3·p − k̂·p^q2·(1−p) on y=0, per entry before the mean."""
    z, _ = _data(seed=6)
    y = torch.zeros(z.shape, dtype=torch.int8)
    z.requires_grad_(True)
    parts = L.gr(z, y, w=6.0, b=-3.0, q2=q2, q3=q3, use_v=False, return_parts=True)
    (parts.loss * z.numel()).backward()  # loss = Σ entries / (B·C): per-entry gradients
    p, k = torch.sigmoid(z.detach()), parts.k_hat
    torch.testing.assert_close(z.grad, (1 - k) * (1 - p) ** q3 * p - k * p**q2 * (1 - p))


def test_gradient_with_v_is_v_times_eq18_and_positive_gradient():
    """v and k̂ are stop-gradient: with v on, the y=0 gradient is v·Eq.18; on y=1 it is
    −p^q1·(1−p), on y=−1 (1−p)^q3·p."""
    z, y = _data(seed=7)
    z.requires_grad_(True)
    q1, q2, q3 = 0.3, 0.01, 1.0
    parts = L.gr(z, y, w=4.0, b=-2.0, mu=0.6, sigma=0.4, q1=q1, q2=q2, q3=q3,
                 return_parts=True)
    (parts.loss * z.numel()).backward()
    p, k, v = torch.sigmoid(z.detach()), parts.k_hat, parts.v
    eq18 = (1 - k) * (1 - p) ** q3 * p - k * p**q2 * (1 - p)
    expected = torch.where(y == 1, -(p**q1) * (1 - p), torch.where(y == 0, v * eq18, eq18))
    torch.testing.assert_close(z.grad, expected)


# ------------------------------------------------------------------ edge cases
EXTREME = torch.tensor([[-100.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 100.0]] * 3)
Y_EXTREME = torch.tensor([[1] * 7, [0] * 7, [-1] * 7], dtype=torch.int8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_extreme_logits_finite(dtype):
    for kw in TRIALS:
        z = EXTREME.to(dtype).clone().requires_grad_(True)
        loss = L.gr(z, Y_EXTREME, **kw)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(z.grad).all(), kw
        assert loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    zt = EXTREME.expand(2, -1, -1).to(dtype).clone().requires_grad_(True)
    q = torch.tensor([0.0, 0.5])
    loss = L.gr(zt, Y_EXTREME, q1=q, q2=q, q3=q)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(zt.grad).all()


def test_rows_and_classes_without_positives():
    z, _ = _data(seed=8)
    y = torch.zeros(z.shape, dtype=torch.int8)
    y[2, 3] = 1
    for kw in TRIALS:
        assert L.gr(z, y, **kw).item() == pytest.approx(_ref_gr(z, y, **kw), rel=1e-9)


# ------------------------------------------------------------------ the registered object
def test_defaults_are_coco_and_presets_follow_table6():
    cls = get_loss_class("gr")
    defaults = {s.name: s.default for s in cls.hparam_specs}
    assert {k: defaults[k] for k in cls.presets["coco"]} == cls.presets["coco"]
    assert (defaults["w_0"], defaults["b_0"], defaults["mu_0"], defaults["sigma_0"]) == (
        0.0, -2.0, 0.5, 2.0)
    voc = create_loss("gr", preset="voc")
    assert (voc.hparam("w_T"), voc.hparam("b_T"), voc.hparam("q3")) == (2.0, -2.0, 1.0)
    assert create_loss("gr", preset="cub").hparam("q3") == 1.5
    assert cls.train_presets["coco"] == {
        "batch_size": 16, "lr": 1e-5, "epochs": 8, "head_lr_mult": 10}
    assert cls.train_presets["nus"]["epochs"] == 10 and cls.train_presets["cub"]["lr"] == 5e-5
    assert cls.train_presets["voc"]["batch_size"] == 8


def test_schedule_values_at_each_epoch():
    """v_e = v_0 + (v_T − v_0)·e/(E−1); E = 8 (COCO): (w, b, μ, σ) from (0, −2, ½, 2) to
    (10, −8, 0.8, 0.5)."""
    loss = create_loss("gr")
    y = torch.zeros(4, 3, dtype=torch.int8)
    loss.setup(y, n_epochs=8)
    for e in range(8):
        loss.start_epoch(e)
        now = loss.schedule_values()
        assert now["w"] == pytest.approx(10 * e / 7)
        assert now["b"] == pytest.approx(-2 - 6 * e / 7)
        assert now["mu"] == pytest.approx(0.5 + 0.3 * e / 7)
        assert now["sigma"] == pytest.approx(2 - 1.5 * e / 7)
    assert loss.schedule_values() == pytest.approx({"w": 10, "b": -8, "mu": 0.8, "sigma": 0.5})
    loss.setup(y, n_epochs=1)  # E = 1: the final values from the start
    loss.start_epoch(0)
    assert loss.schedule_values() == pytest.approx({"w": 10, "b": -8, "mu": 0.8, "sigma": 0.5})


def test_stacked_schedule_and_forward_use_it():
    w_t = torch.tensor([2.0, 10.0, 6.0], dtype=torch.float64)
    loss = create_loss("gr", w_T=w_t, sigma_0=torch.tensor([2.0, 1.0, 3.0], dtype=torch.float64))
    z, y = _data(seed=9, t=3)
    loss.setup(y, n_epochs=3, n_trials=3)
    for e in range(3):
        loss.start_epoch(e)
        now = loss.schedule_values()
        torch.testing.assert_close(now["w"], w_t * e / 2)
        torch.testing.assert_close(
            now["sigma"], torch.tensor([2.0, 1.0, 3.0], dtype=torch.float64) * (1 - e / 2)
            + 0.5 * e / 2)
        out = loss(z, y, index=torch.arange(5))
        for t in range(3):
            want = L.gr(z[t], y, w=float(now["w"][t]), b=now["b"], mu=now["mu"],
                        sigma=float(now["sigma"][t]))
            torch.testing.assert_close(out.loss[t], want)
        assert set(out.parts) == {"k_hat", "v", "l1", "l2", "l3"}
        for name, part in out.parts.items():
            assert part.shape == (3, 5, 7) and not part.requires_grad, name


def test_schedule_follows_set_hparam_and_state_dict():
    loss = create_loss("gr")
    loss.setup(torch.zeros(4, 3, dtype=torch.int8), n_epochs=3, n_trials=2)
    loss.start_epoch(1)
    loss.set_hparam("w_T", torch.tensor([4.0, 8.0]))
    torch.testing.assert_close(loss.schedule_values()["w"], torch.tensor([2.0, 4.0]))
    other = create_loss("gr", w_T=torch.tensor([0.0, 0.0]))
    other.setup(torch.zeros(4, 3, dtype=torch.int8), n_epochs=3, n_trials=2)
    other.start_epoch(1)
    other.load_state_dict(loss.state_dict())
    torch.testing.assert_close(other.schedule_values()["w"], torch.tensor([2.0, 4.0]))
    assert not any(k.startswith("now_") for k in loss.state_dict())


def test_unstacked_forward_parts_shapes_and_switches():
    z, y = _data(seed=10)
    loss = create_loss("gr", use_k=False, use_v=False, robust=False)
    loss.setup(y, n_epochs=2)
    loss.start_epoch(1)
    out = loss(z, y)
    assert out.loss.shape == () and all(p.shape == (5, 7) for p in out.parts.values())
    torch.testing.assert_close(out.loss, L.gr(z, y, use_k=False, use_v=False, robust=False))
    torch.testing.assert_close(out.parts["k_hat"], (y == 1).to(z.dtype))
    torch.testing.assert_close(out.parts["v"], torch.ones_like(z))


def test_learn_kv_parameters():
    z, y = _data(seed=11, t=2)
    loss = create_loss("gr", learn_kv=True, b_0=torch.tensor([-2.0, -1.0]))
    assert loss.extra_parameters() == []
    with pytest.raises(LossInputError, match="learn_kv=True creates"):
        loss(z, y)
    loss.setup(y, n_epochs=4, n_trials=2)
    params = loss.extra_parameters()
    assert [m for _, m in params] == [1.0] * 4
    w, b, mu, sigma = (prm for prm, _ in params)
    assert all(isinstance(prm, torch.nn.Parameter) and prm.shape == (2,) for prm, _ in params)
    torch.testing.assert_close(torch.stack([w, b, mu, sigma]).detach(),
                               torch.tensor([[0.0, 0.0], [-2.0, -1.0], [0.5, 0.5], [2.0, 2.0]]))
    loss.start_epoch(3)  # the schedule does not move learned values
    out = loss(z, y)
    out.loss.sum().backward()
    for prm in (w, b, mu, sigma):
        assert prm.grad is not None and (prm.grad != 0).all()
    assert (sigma.grad > 0).all()  # descent shrinks σ, hence v: the degenerate direction
    # trial t equals an unstacked learned run started at trial t's values, gradients included
    for t, b0 in enumerate([-2.0, -1.0]):
        single = create_loss("gr", learn_kv=True, b_0=b0)
        single.setup(y, n_epochs=4)
        zt = z[t].clone().requires_grad_(True)
        single(zt, y).loss.backward()
        torch.testing.assert_close(out.loss[t].detach(), single(z[t], y).loss.detach())
        for (prm, _), (prm_t, _) in zip(params, single.extra_parameters()):
            torch.testing.assert_close(prm.grad[t], prm_t.grad[0])
    # values equal the pure function at the learned values
    torch.testing.assert_close(out.loss[1], L.gr(z[1], y, w=0.0, b=-1.0, mu=0.5, sigma=2.0))
    with pytest.raises(LossInputError, match="no trial axis"):
        loss(z[0], y)


def test_state_dict_carries_learned_parameters():
    y = torch.zeros(4, 3, dtype=torch.int8)
    a = create_loss("gr", learn_kv=True)
    a.setup(y, n_epochs=2)
    with torch.no_grad():
        a.extra_parameters()[0][0].fill_(3.0)
    b = create_loss("gr", learn_kv=True)
    b.setup(y, n_epochs=2)
    b.load_state_dict(a.state_dict())
    assert b.extra_parameters()[0][0].item() == 3.0


# ------------------------------------------------------------------ gr_framework
def _focal_margin(z, m=1.0, g=2.0):
    return -torch.exp(g * F.logsigmoid(-(z - m))) * F.logsigmoid(z - m)


def test_framework_reproduces_gr_hill_and_splc():
    z, y = _data(seed=12)
    w, b, mu, sigma, q1, q2, q3 = 4.0, -3.0, 0.7, 0.6, 0.01, 0.2, 1.0

    def gce(q, neg=False):
        return lambda x: (1 - torch.sigmoid(-x if neg else x) ** q) / q

    gr_fw = L.gr_framework(
        k_hat=lambda p: torch.sigmoid(w * p + b),
        v=lambda p: torch.exp(-((p - mu) ** 2) / (2 * sigma**2)),
        l1=gce(q1), l2=gce(q2), l3=gce(q3, neg=True),
    )
    torch.testing.assert_close(gr_fw(z, y), L.gr(z, y, w=w, b=b, mu=mu, sigma=sigma, q1=q1,
                                                  q2=q2, q3=q3))
    # Hill (Table 1): k̂ = 0, v = 1, L2 undefined, L3 = (λ − p)p²; L1 = the Hill paper's focal
    # margin (Table 1 writes −log p, the GR repository's simplification)
    hill_fw = L.gr_framework(k_hat=0.0, v=1.0, l1=_focal_margin, l2=None,
                             l3=lambda x: (1.5 - torch.sigmoid(x)) * torch.sigmoid(x) ** 2)
    hill_y = y.clone()
    torch.testing.assert_close(hill_fw(z, hill_y), L.hill(z, hill_y))
    # SPLC (Table 1): k̂ = 1[p > τ], v = 1, L1 = L2 = focal margin, L3 = focal negative
    splc_fw = L.gr_framework(
        k_hat=lambda p: (p > 0.6).to(p.dtype), v=1.0, l1=_focal_margin, l2=_focal_margin,
        l3=lambda x: -torch.sigmoid(x) ** 2 * F.logsigmoid(-x),
    )
    torch.testing.assert_close(splc_fw(z, y), L.splc(z, y, epoch=1))


def test_framework_errors():
    z, y = _data(seed=13)
    undefined = L.gr_framework(k_hat=0.5, v=1.0, l1=lambda x: x, l2=None, l3=lambda x: x)
    with pytest.raises(LossInputError, match="'l2' is None"):
        undefined(z, y)
    with pytest.raises(LossInputError, match="'l1' must be a callable"):
        L.gr_framework(k_hat=0.0, v=1.0, l1=1.0, l2=None, l3=lambda x: x)
    with pytest.raises(LossInputError, match="'k_hat' must be a callable or a number"):
        L.gr_framework(k_hat="x", v=1.0, l1=lambda x: x, l2=None, l3=lambda x: x)
    with pytest.raises(LossInputError, match="observed"):
        undefined(z, torch.full((5, 7), 3, dtype=torch.int8))


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sigma": 0.0}, r"'sigma' must lie in \(0, inf\)"),
        ({"sigma": -1.0}, "'sigma' must lie in"),
        ({"q1": -0.1}, r"'q1' must lie in \[0, inf\)"),
        ({"q3": torch.tensor([0.5, -0.5])}, "'q3' must lie in"),
        ({"w": float("inf")}, "'w' must lie in"),
        ({"use_k": 1}, "'use_k' must be true or false"),
        ({"return_parts": "yes"}, "'return_parts' must be True or False"),
    ],
)
def test_pure_function_errors(kwargs, match):
    stacked = any(isinstance(v, torch.Tensor) for v in kwargs.values())
    z = torch.zeros(2, 3, 4) if stacked else torch.zeros(3, 4)
    with pytest.raises(LossInputError, match=match):
        L.gr(z, torch.zeros(3, 4, dtype=torch.int8), **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sigma_T": 0.0}, "'sigma_T' must lie in"),
        ({"sigma_0": -2.0}, "'sigma_0' must lie in"),
        ({"q2": -1.0}, "'q2' must lie in"),
        ({"learn_kv": "no"}, "'learn_kv' must be true or false"),
        ({"sigma": 0.5}, "unknown hyperparameter 'sigma'; did you mean"),
    ],
)
def test_registered_errors(kwargs, match):
    with pytest.raises(LossInputError, match=match):
        create_loss("gr", **kwargs)
