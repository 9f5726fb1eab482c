"""GPR and VLPL rank each train row's prior once (when the prior is set): their values and
gradients equal the per-batch computation of the pure functions on the batch's rows."""

from __future__ import annotations

import pytest
import torch

from probe.losses import LossInputError, create_loss, damp_scores, gpr, vlpl


def _setup(n=30, c=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.zeros(n, c, dtype=torch.int8)
    y[torch.arange(n), torch.randint(0, c, (n,), generator=g)] = 1
    y[3] = 0  # a row without a positive
    scores = torch.softmax(torch.randn(n, c, generator=g) * 2, -1)
    tiles = {"tile_max": scores + torch.rand(n, c, generator=g) * 0.2,
             "tile_min": scores * torch.rand(n, c, generator=g),
             "tile_mean": scores * 0.8}
    return g, y, scores, tiles


@pytest.mark.parametrize("released", [False, True])
@pytest.mark.parametrize("tiles", [True, False])
def test_gpr_cached_ranks_equal_the_per_batch_computation(released, tiles):
    g, y, scores, extras = _setup()
    extras = extras if tiles else {}
    hparams = {"eta": 0.2, "top_k": 4.0, "threshold": 0.05, "neg_ratio": 0.4, "k": 2.0,
               "released": released}
    loss = create_loss("gpr", **hparams)
    loss.setup(y, n_epochs=3)
    loss.set_prior(scores, extras)
    loss.start_epoch(2)  # the final schedule values (not released: w_T, b_T, mu_T, sigma_T)
    for index in (torch.tensor([0, 5, 3, 17, 29, 8]), torch.arange(10, 20)):
        z = (torch.randn(len(index), 12, generator=g, dtype=torch.float64) * 3)
        z1, z2 = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
        got = loss(z1, y[index], index=index).loss
        got.backward()
        s = scores[index]
        if tiles:
            s = damp_scores(s, extras["tile_max"][index], extras["tile_min"][index], y[index],
                            0.2)
        neg = (scores[index] + extras["tile_mean"][index]) / 2 if tiles else scores[index]
        now = loss.schedule_values()
        ref = gpr(z2, y[index], s, w=now["w"], b=now["b"], mu=now["mu"], sigma=now["sigma"],
                  top_k=4.0, threshold=0.05, negative_scores=neg, neg_ratio=0.4, k=2.0,
                  released=released)
        ref.backward()
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(z1.grad, z2.grad, rtol=1e-12, atol=1e-14)
    assert loss.prior_mode == ("DAMP (tile_max, tile_min)" if tiles else "scores as DAMP's s")


@pytest.mark.parametrize("released", [False, True])
def test_vlpl_cached_ranks_equal_the_per_batch_computation(released):
    g, y, scores, _ = _setup(seed=1)
    loss = create_loss("vlpl", k_neg=3.0, beta_neg=0.4, threshold=0.1, released=released)
    loss.setup(y, n_epochs=1)
    loss.set_prior(scores)
    index = torch.tensor([2, 9, 3, 21, 14])
    z = torch.randn(len(index), 12, generator=g, dtype=torch.float64) * 3
    z1, z2 = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    got = loss(z1, y[index], index=index).loss
    got.backward()
    ref = vlpl(z2, y[index], scores[index], k_neg=3.0, beta_neg=0.4, threshold=0.1,
               released=released)
    ref.backward()
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(z1.grad, z2.grad, rtol=1e-12, atol=1e-14)


def test_a_per_trial_eta_ranks_per_batch_and_equals_single_trials():
    """η varies per trial: DAMP's ranking stays per batch (no (T, N, C) cache), and each trial
    equals the cached single-trial loss."""
    g, y, scores, extras = _setup(seed=2)
    etas = [0.05, 0.3, 0.7]
    stacked = create_loss("gpr", eta=torch.tensor(etas), k=2.0, top_k=3.0, threshold=0.05)
    stacked.setup(y, n_epochs=2, n_trials=3)
    stacked.set_prior(scores, extras)
    assert not hasattr(stacked, "prior_damp")
    index = torch.arange(0, 30, 3)
    z = torch.randn(3, len(index), 12, generator=g, dtype=torch.float64)
    values = stacked(z, y[index], index=index).loss
    for t, eta in enumerate(etas):
        one = create_loss("gpr", eta=eta, k=2.0, top_k=3.0, threshold=0.05)
        one.setup(y, n_epochs=2)
        one.set_prior(scores, extras)
        assert one.prior_damp.shape == (30, 12) and one.prior_rank_pos.dtype == torch.int16
        torch.testing.assert_close(values[t], one(z[t], y[index], index=index).loss)


def test_unknown_extras_are_refused_by_name():
    _, y, scores, extras = _setup()
    loss = create_loss("gpr", k=2.0)
    loss.setup(y, n_epochs=1)
    with pytest.raises(LossInputError, match=r"global.*not read.*tile_max, tile_min, tile_mean"):
        loss.set_prior(scores, {"global": scores, **extras})
    v = create_loss("vlpl")
    v.setup(y, n_epochs=1)
    with pytest.raises(LossInputError, match=r"--priors.*tile_max.*extras it reads: none"):
        v.set_prior(scores, {"tile_max": extras["tile_max"]})


@pytest.mark.parametrize("flags", [{}, {"use_k": False}, {"use_v": False}, {"robust": False},
                                   {"q1": 0.3, "q3": 0.5}, {"q2": 0.0, "q3": 0.0}])
def test_gpr_closed_form_gradient_equals_gr_autograd_without_pseudo_labels(flags):
    """No pseudo-labels (θ = 1, neg_ratio 0) and reg 0: GPR is GR (autograd), so the two
    gradients agree for every GR switch; stacked trials too."""
    g, y, scores, extras = _setup(seed=4)
    common = {"w_T": torch.tensor([2.0, 10.0]), "q1": 0.0, **flags}
    gpr_loss = create_loss("gpr", threshold=1.0, neg_ratio=0.0, reg=0.0, k=2.0, **common)
    gr_loss = create_loss("gr", **common)
    for loss in (gpr_loss, gr_loss):
        loss.setup(y, n_epochs=3, n_trials=2)
        loss.start_epoch(1)
    gpr_loss.set_prior(scores, extras)
    index = torch.arange(5, 25)
    z = torch.randn(2, len(index), 12, generator=g, dtype=torch.float64) * 3
    z1, z2 = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    a = gpr_loss(z1, y[index], index=index).loss
    b = gr_loss(z2, y[index]).loss
    (a * torch.tensor([1.0, -2.0], dtype=torch.float64)).sum().backward()
    (b * torch.tensor([1.0, -2.0], dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(z1.grad, z2.grad, rtol=1e-9, atol=1e-14)


def test_vlpl_closed_form_gradient_equals_autograd_with_warmup_and_eps():
    g, y, scores, _ = _setup(seed=5)
    for kw in ({"warmup_epochs": 2}, {"log_eps": 1e-5, "k_neg": 2.0, "beta_neg": 0.5}):
        loss = create_loss("vlpl", threshold=0.1, **kw)
        loss.setup(y, n_epochs=3)
        loss.set_prior(scores)
        loss.start_epoch(0)
        index = torch.arange(0, 30, 2)
        z = torch.randn(len(index), 12, generator=g, dtype=torch.float64) * 4
        z1, z2 = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
        got = loss(z1, y[index], index=index).loss
        got.backward()
        if "warmup_epochs" in kw:
            ref = create_loss("em", alpha=0.1)(z2, y[index]).loss  # warmup: plain EM
        else:
            ref = vlpl(z2, y[index], scores[index], threshold=0.1, **kw)
        ref.backward()
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(z1.grad, z2.grad, rtol=1e-9, atol=1e-14)


def test_set_hparam_refreshes_the_cached_pseudo_labels():
    _, y, scores, extras = _setup(seed=6)
    loss = create_loss("gpr", k=2.0, top_k=1.0, threshold=0.0)
    loss.setup(y, n_epochs=1)
    loss.set_prior(scores, extras)
    before = (loss.prior_code == 1).sum(1)
    loss.set_hparam("top_k", 4.0)
    after = (loss.prior_code == 1).sum(1)
    assert (before <= 1).all() and (after > before).any()


def test_register_checks_the_prior_contract():
    from probe.losses import Loss, LossContractError, LossOutput, PriorMixin, register

    def forward(self, logits, observed, index=None):
        return LossOutput(logits.mean(), {})

    base = {"paper": "p", "formula": "f", "forward": forward, "__module__": "user_code"}
    with pytest.raises(LossContractError, match=r"does not derive from probe\.losses\.PriorMixin"):
        register(type("NoMixin", (Loss,), {**base, "name": "no_mixin", "prior": "scores"}))
    with pytest.raises(LossContractError, match="sets no prior"):
        register(type("NoPrior", (PriorMixin,), {**base, "name": "no_prior"}))
    with pytest.raises(LossContractError, match="distinct names"):
        register(type("BadExtra", (PriorMixin,), {**base, "name": "bad_extra", "prior": "s",
                                                  "prior_optional": ("scores",)}))
