"""Per-trial observed-label draws through ONE shared loss object (``Loss.stacks_draws``): trials
that share a seed but differ in their draw train as one stacked run with one batch order and one
loss object fed ``(T, B, C)`` targets; every trial equals a run of that seed alone on data whose
train_observed is its draw.

Every loss in the registry that declares ``stacks_draws`` is checked (a wrongly declared loss
fails here); a loss that does not declare it keeps one loss object per trial.

Tolerance: float32, atol 2e-5 on heads and 1e-4 on val/test mAP (percent): batched products and
(T, B, C) reductions may differ from one-trial ones in the last bits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from probe import ProbeConfig, train_probe
from probe.engine.loop import BlockedTrainer, StackedTrainer, make_trainer
from probe.engine.speed import SpeedOptions
from probe.engine.train import draw_stack
from probe.engine.trials import plan_trials
from probe.losses import LossInputError, available, create_loss, get_loss_class
from probe.store.priors import Prior
from probe.store.protocol import single_positive
from tests.test_train import _data

pytestmark = pytest.mark.usefixtures("one_thread")

DRAW_SEEDS = (1200, 7, 8)
#: settings that make each loss's draw-dependent parts act within a 3-epoch run: LL's
#: corrections from epoch 2, APL's pseudo-labels from epoch 1, CRISP's priors, SPLC's correction
HPARAMS = {
    "role": {"k": 2.0},
    "epr": {"k": 2.0},
    "em_apl": {"warmup": 1, "theta": 0.5},
    "ll_r": {"delta_rel": 0.1},
    "ll_ct": {"delta_rel": 0.1},
    "ll_cp": {"delta_rel": 0.1},
    "crisp": {"warmup": 1},
    "splc": {"change_epoch": 1, "tau": 0.3},
    "opml": {"correct": True, "soft": True, "correct_ratio": 0.5},
    "vlpl": {"threshold": 0.25, "k_neg": 2.0, "beta_neg": 0.5},
    "gpr": {"k": 2.0, "threshold": 0.2, "eta": 0.5, "neg_ratio": 0.4},
}
DECLARING = sorted(n for n in available() if get_loss_class(n).stacks_draws)


def _with_prior(data, name):
    """``(data, config settings)`` for loss ``name``: a prior "t" (noisy train labels, rows
    summing to 1, with DAMP's tile extras for a loss that reads them: GPR) and ``priors="t"``
    for a loss that reads one (VLPL, GPR), else as given."""
    cls = get_loss_class(name)
    if cls.prior is None:
        return data, {}
    gen = torch.Generator().manual_seed(3)
    noisy = data.train_labels.float() * 0.5 + torch.rand(data.train_labels.shape, generator=gen)
    scores = (noisy / noisy.sum(1, keepdim=True)).numpy().astype(np.float32)
    tiles = {"tile_max": scores + 0.1, "tile_min": scores * 0.3, "tile_mean": scores * 0.7}
    extras = {k: v for k, v in tiles.items() if k in (*cls.prior_extras, *cls.prior_optional)}
    return replace(data, train_prior=Prior("t", scores, extras)), {"priors": "t"}


def _draws(data):
    labels = data.train_labels.cpu().numpy()
    return [single_positive(labels, s) for s in DRAW_SEEDS]


def _config(**kw):
    values = {"epochs": 3, "batch_size": 8, "lr": 1e-2, "use_presets": False, "seed": 5}
    values.update(kw)
    return ProbeConfig(**values)


def _alone(data, draw, cfg, loss, hparams, callback=None):
    own = replace(data, train_observed=torch.as_tensor(draw))
    return train_probe(own, cfg, loss, hparams, callback=callback)


def _assert_same(stacked, t, alone):
    torch.testing.assert_close(stacked.final_heads[t], alone.final_heads[0], atol=2e-5, rtol=0)
    torch.testing.assert_close(stacked.best_heads[t], alone.best_heads[0], atol=2e-5, rtol=0)
    assert stacked.trials[t].best_epoch == alone.trials[0].best_epoch
    mine, ref = stacked.trials[t].best, alone.trials[0].best
    assert mine["val_map"] == pytest.approx(ref["val_map"], abs=1e-4)
    assert mine["test_map"] == pytest.approx(ref["test_map"], abs=1e-4)


BUILT_IN = ("an", "an_ls", "wan", "epr", "em", "em_apl", "gr", "gpr", "role", "ll_r", "ll_ct",
            "ll_cp", "hill", "focal", "asl", "splc", "zlpr", "opml", "crisp", "vpu", "vlpl",
            "smile")


def test_the_built_in_losses_that_declare_it():
    """The list this module checks (a loss dropping its declaration shows here): every
    built-in loss declares it."""
    for name in BUILT_IN:
        assert name in DECLARING, name


@pytest.mark.parametrize("name", DECLARING)
def test_declaring_loss_one_object_equals_a_run_per_draw(name):
    data, extra = _with_prior(_data(), name)
    draws = _draws(data)
    hparams = HPARAMS.get(name, {})
    cfg = _config(**extra)
    plan = plan_trials(data, cfg, name, [dict(hparams)], [0, 1, 2], len(draws))
    assert plan.shared and plan.stacked_draws and len(plan.losses) == 1
    stacked = train_probe(data, cfg, name, dict(hparams), draws=draws, draw_index=[0, 1, 2])
    assert stacked.shared_batch_order
    for t, draw in enumerate(draws):
        _assert_same(stacked, t, _alone(data, draw, cfg, name, dict(hparams)))
    # the draws differ, so the trials (one seed) must too
    assert not torch.allclose(stacked.final_heads[0], stacked.final_heads[1])


def test_the_shared_trainer_holds_one_loss_object_and_the_draws_once():
    data = _data()
    draws = _draws(data)
    cfg = _config()
    plan = plan_trials(data, cfg, "role", [{"k": 2.0}], [2, 0, 2], len(draws))
    stack = draw_stack(draws, data)
    trainer = make_trainer(data, cfg, plan, SpeedOptions(trial_block=0), stack)
    assert isinstance(trainer, StackedTrainer)
    assert len(trainer.groups) == 1 and trainer.groups[0].loss is plan.losses[0]
    assert trainer.train_y is stack  # (K, N, C), not one copy per trial
    assert trainer.draw_rows.tolist() == [2, 0, 2]
    # ROLE's per-trial state starts from each trial's own draw
    theta = trainer.groups[0].loss.label_logits
    assert theta.shape == (3, data.n_train, data.n_classes)
    for t, d in enumerate((2, 0, 2)):
        positive = torch.as_tensor(draws[d]) == 1
        assert bool((theta[t][positive] > 5).all())


@pytest.mark.parametrize(("name", "base"), [("an", {}), ("gr", {"learn_kv": True}),
                                            ("role", {"k": 2.0}), ("em_apl", HPARAMS["em_apl"]),
                                            ("ll_cp", HPARAMS["ll_cp"]),
                                            ("vlpl", HPARAMS["vlpl"])])
def test_hparam_trials_times_draws(name, base):
    """2 learning rates × 2 draws, one seed: four trials of one loss object."""
    data, extra = _with_prior(_data(), name)
    draws = _draws(data)
    cells = [(lr, d) for d in (2, 0) for lr in (1e-2, 3e-2)]
    trials = [{**base, "lr": lr} for lr, _ in cells]
    cfg = _config(**extra)
    plan = plan_trials(data, cfg, name, trials, [d for _, d in cells], len(draws))
    assert plan.stacked_draws and len(plan.losses) == 1
    stacked = train_probe(data, cfg, name, trials, draws=draws, draw_index=[d for _, d in cells])
    for t, (lr, d) in enumerate(cells):
        _assert_same(stacked, t, _alone(data, draws[d], cfg, name, {**base, "lr": lr}))


def _stop_at(trial, epoch):
    def callback(report):
        return [trial] if report.epoch == epoch else None
    return callback


@pytest.mark.parametrize(("name", "hparams"), [("an", {}), ("role", {"k": 2.0}),
                                               ("em_apl", HPARAMS["em_apl"]),
                                               ("ll_cp", HPARAMS["ll_cp"]),
                                               ("crisp", HPARAMS["crisp"]),
                                               ("opml", HPARAMS["opml"]), ("vpu", {}),
                                               ("vlpl", HPARAMS["vlpl"]),
                                               ("gpr", HPARAMS["gpr"])])
def test_pruning_a_trial_keeps_the_others_and_their_draws(name, hparams):
    """Trial 1 stops after epoch 1 of 3: it leaves the stack (its row of the draw index and of
    the loss's per-trial state with it; OPML and vPU, trial_state None: it stays, frozen); the
    others go on, each on its own draw."""
    data, extra = _with_prior(_data(), name)
    draws = _draws(data)
    cfg = _config(**extra)
    stacked = train_probe(data, cfg, name, dict(hparams), draws=draws, draw_index=[0, 1, 2],
                          callback=_stop_at(1, 1))
    assert stacked.trials[1].stopped_at == 1
    for t, draw in enumerate(draws):
        callback = _stop_at(0, 1) if t == 1 else None
        _assert_same(stacked, t, _alone(data, draw, cfg, name, dict(hparams), callback))


@pytest.mark.parametrize(("name", "hparams"), [("an", {}), ("role", {"k": 2.0}),
                                               ("em_apl", HPARAMS["em_apl"])])
def test_forced_trial_blocks(name, hparams):
    """One trial per block: each block is a shared plan of one trial on its own draw."""
    data = _data()
    draws = _draws(data)
    cfg = _config()
    speed = SpeedOptions(trial_block=1)
    plan = plan_trials(data, cfg, name, [dict(hparams)], [0, 1, 2], len(draws))
    trainer = make_trainer(data, cfg, plan, speed, draw_stack(draws, data))
    assert isinstance(trainer, BlockedTrainer)
    assert [b.draw_rows.tolist() for _, b in trainer.blocks] == [[0], [1], [2]]
    stacked = train_probe(data, cfg, name, dict(hparams), draws=draws, draw_index=[0, 1, 2],
                          speed=speed)
    assert stacked.timing["trial_blocks"] == [1, 1, 1]
    for t, draw in enumerate(draws):
        _assert_same(stacked, t, _alone(data, draw, cfg, name, dict(hparams)))


@pytest.mark.parametrize(("name", "hparams"), [("role", {"k": 2.0}),
                                               ("em_apl", HPARAMS["em_apl"])])
def test_a_loss_without_the_capability_keeps_one_object_per_trial(monkeypatch, name, hparams):
    """A loss that does not declare stacks_draws (here a stateful built-in with its declaration
    taken away, as a plugin that never made one) trains per-trial draws through one loss
    object per trial, correctly."""
    monkeypatch.setattr(get_loss_class(name), "stacks_draws", False)
    data = _data()
    draws = _draws(data)
    cfg = _config()
    plan = plan_trials(data, cfg, name, [dict(hparams)], [0, 1, 2], len(draws))
    assert not plan.shared and not plan.stacked_draws and len(plan.losses) == 3
    assert plan.one_order
    stacked = train_probe(data, cfg, name, dict(hparams), draws=draws, draw_index=[0, 1, 2])
    assert stacked.shared_batch_order  # one seed: one order, even with one object per trial
    for t, draw in enumerate(draws):
        _assert_same(stacked, t, _alone(data, draw, cfg, name, dict(hparams)))


@pytest.mark.parametrize("name", ["an", "role", "vlpl"])
def test_setup_refuses_per_trial_draws_without_the_capability(monkeypatch, name):
    monkeypatch.setattr(get_loss_class(name), "stacks_draws", False)
    loss = create_loss(name)
    with pytest.raises(LossInputError, match="stacks_draws"):
        loss.setup(torch.zeros(2, 10, 4, dtype=torch.int8), n_epochs=1, n_trials=2)


def test_vlpl_per_trial_thresholds_on_per_trial_draws():
    """VLPL with a per-trial θ (pseudo-labels formed per batch, not cached) × draws."""
    data, extra = _with_prior(_data(), "vlpl")
    draws = _draws(data)
    cells = [(theta, d) for d in (1, 2) for theta in (0.2, 0.3)]
    trials = [{**HPARAMS["vlpl"], "threshold": theta} for theta, _ in cells]
    cfg = _config(**extra)
    stacked = train_probe(data, cfg, "vlpl", trials, draws=draws,
                          draw_index=[d for _, d in cells])
    for t, (_, d) in enumerate(cells):
        _assert_same(stacked, t, _alone(data, draws[d], cfg, "vlpl", trials[t]))


@pytest.mark.parametrize("varied", ["eta", "threshold"])
def test_gpr_per_trial_rule_parameters_on_per_trial_draws(varied):
    """GPR with a per-trial η (DAMP's scores formed per batch from each trial's observed
    labels) or θ (DAMP's scores cached per draw, pseudo-labels per batch) × draws."""
    data, extra = _with_prior(_data(), "gpr")
    draws = _draws(data)
    cells = [(v, d) for d in (0, 2) for v in (0.2, 0.6)]
    trials = [{**HPARAMS["gpr"], varied: v} for v, _ in cells]
    cfg = _config(**extra)
    stacked = train_probe(data, cfg, "gpr", trials, draws=draws,
                          draw_index=[d for _, d in cells])
    for t, (_, d) in enumerate(cells):
        _assert_same(stacked, t, _alone(data, draws[d], cfg, "gpr", trials[t]))


def test_setup_refuses_draws_for_another_number_of_trials():
    loss = create_loss("role", k=2.0)
    with pytest.raises(LossInputError, match="3 per-trial draws"):
        loss.setup(torch.zeros(3, 10, 4, dtype=torch.int8), n_epochs=1, n_trials=2)


def test_seeds_that_differ_keep_one_object_per_trial_without_stacks_seeds(monkeypatch):
    """Per-trial seeds mean per-trial batch orders: no shared object for a loss that stacks
    draws but not seeds (here LL-Cp with that declaration taken away, as SMILE, which encodes
    each batch's graph neighbourhood); tests/test_stacked_seeds_shared.py has the losses that
    stack both."""
    monkeypatch.setattr(get_loss_class("ll_cp"), "stacks_seeds", False)
    assert not get_loss_class("smile").stacks_seeds
    data = _data()
    draws = _draws(data)
    cfg = _config(seed=0, seeds=(1, 2, 3))
    plan = plan_trials(data, cfg, "ll_cp", [dict(HPARAMS["ll_cp"])] * 3, [0, 1, 2], len(draws))
    assert not plan.shared and not plan.one_order and len(plan.losses) == 3


def test_crisp_priors_of_per_trial_draws_equal_one_call_per_draw():
    from probe.losses import crisp_priors

    gen = torch.Generator().manual_seed(0)
    scores = torch.rand(3, 40, 5, generator=gen)
    observed = (torch.rand(3, 40, 5, generator=gen) < 0.2).to(torch.int8)
    observed[1, :, 2] = 0  # a class without positives in one draw: its prior is 0 there only
    got = crisp_priors(scores, observed)
    want = torch.stack([crisp_priors(scores[t], observed[t]) for t in range(3)])
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert got[1, 2] == 0 and got[0, 2] > 0
    with pytest.raises(LossInputError, match="crisp_priors"):
        crisp_priors(scores[0], observed)  # per-trial draws need per-trial scores


@pytest.mark.slow
def test_compiled_step_over_per_trial_draws_equals_the_eager_step():
    """--compile traces the shared step with its (T, B, C) target gather: the same heads as
    the eager step to float rounding (inductor fuses the loss differently)."""
    data = _data()
    draws = _draws(data)
    cfg = _config(epochs=2, eval_every=0, device="cpu", compile=True)
    compiled = train_probe(data, cfg, "an", draws=draws, draw_index=[0, 1, 2])
    eager = train_probe(data, replace(cfg, compile=False), "an", draws=draws,
                        draw_index=[0, 1, 2])
    assert compiled.timing["compiled"] and not eager.timing["compiled"]
    torch.testing.assert_close(compiled.final_heads, eager.final_heads, atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "hparams"), [("an", {}), ("gr", {}),
                                               ("ll_cp", HPARAMS["ll_cp"])])
def test_cuda_graph_over_per_trial_draws_equals_the_eager_step(name, hparams):
    """The captured step gathers each trial's targets on the device (index_select, no host
    synchronisation): the same heads bit for bit as the eager step, and each trial as its own
    draw's run."""
    data = _data()
    draws = _draws(data)
    cfg = _config(device="cuda")
    eager = train_probe(data, replace(cfg, cuda_graph=False), name, dict(hparams), draws=draws,
                        draw_index=[0, 1, 2])
    graph = train_probe(data, replace(cfg, cuda_graph=True), name, dict(hparams), draws=draws,
                        draw_index=[0, 1, 2])
    assert graph.timing["cuda_graph"] and not eager.timing["cuda_graph"]
    assert torch.equal(graph.final_heads, eager.final_heads)
    for t, draw in enumerate(draws):
        _assert_same(graph, t, _alone(data, draw, replace(cfg, cuda_graph=False), name,
                                      dict(hparams)))
