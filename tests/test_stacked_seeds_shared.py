"""Per-trial training seeds through ONE shared loss object (``Loss.stacks_seeds``): trials with
different seeds -- hence their own initial heads and batch orders -- train as one stacked run
whose loss object is called once per step with ``(T, B, C)`` logits and targets and each
trial's own batch rows ``index`` ``(T, B)``; every trial equals a run of its seed alone (and,
with per-trial draws too, on its own draw).

Every loss in the registry that declares ``stacks_seeds`` is checked (a wrongly declared loss
fails here); a loss that does not declare it keeps one loss object per trial.

Tolerance: float32, atol 2e-5 on heads and 1e-4 on val/test mAP (percent), as in
tests/test_stacked_draws_shared.py: batched products and (T, B, C) reductions may differ from
one-trial ones in the last bits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from probe import train_probe
from probe.engine.loop import BlockedTrainer, StackedTrainer, make_trainer
from probe.engine.speed import SpeedOptions
from probe.engine.trials import plan_trials
from probe.losses import (
    Loss,
    LossContractError,
    LossOutput,
    available,
    create_loss,
    get_loss_class,
    per_trial_rows,
    register,
)
from tests.test_stacked_draws_shared import (
    HPARAMS,
    _alone,
    _assert_same,
    _config,
    _draws,
    _stop_at,
    _with_prior,
)
from tests.test_train import _data

pytestmark = pytest.mark.usefixtures("one_thread")

SEEDS = (1, 2, 3)
DECLARING = sorted(n for n in available() if get_loss_class(n).stacks_seeds)
#: built-in losses that stack seeds, and the one that does not: SMILE encodes each batch's
#: neighbourhood of the feature graph
STACKS_SEEDS = ("an", "an_ls", "wan", "epr", "em", "em_apl", "gr", "gpr", "role", "ll_r", "ll_ct",
                "ll_cp", "hill", "focal", "asl", "splc", "zlpr", "opml", "vpu", "vlpl", "crisp")
ONE_OBJECT_PER_SEED = ("smile",)


def _seed_alone(data, cfg, name, hparams, seed, draw=None, callback=None):
    """Trial of ``seed`` trained alone (on ``draw`` when given, else the data's own labels)."""
    own = replace(cfg, seed=seed, seeds=None)
    if draw is None:
        return train_probe(data, own, name, dict(hparams), callback=callback)
    return _alone(data, draw, own, name, dict(hparams), callback)


def test_the_built_in_losses_that_declare_it():
    """The lists this module checks: a loss gaining or dropping its declaration shows here."""
    assert sorted(STACKS_SEEDS) == [n for n in DECLARING if n in STACKS_SEEDS + ONE_OBJECT_PER_SEED]
    for name in ONE_OBJECT_PER_SEED:
        assert not get_loss_class(name).stacks_seeds, name


@pytest.mark.parametrize("name", DECLARING)
def test_declaring_loss_one_object_equals_a_run_per_seed(name):
    data, extra = _with_prior(_data(), name)
    hparams = HPARAMS.get(name, {})
    cfg = _config(seeds=SEEDS, **extra)
    plan = plan_trials(data, cfg, name, [dict(hparams)] * 3)
    assert plan.shared and not plan.one_order and not plan.one_batch and len(plan.losses) == 1
    stacked = train_probe(data, cfg, name, dict(hparams))
    assert not stacked.shared_batch_order
    for t, seed in enumerate(SEEDS):
        _assert_same(stacked, t, _seed_alone(data, cfg, name, hparams, seed))
    # the seeds differ, so the trials must too
    assert not torch.allclose(stacked.final_heads[0], stacked.final_heads[1])


@pytest.mark.parametrize(("name", "hparams"), [("an", {}), ("gr", {"learn_kv": True}),
                                               ("role", {"k": 2.0}),
                                               ("em_apl", HPARAMS["em_apl"]),
                                               ("ll_cp", HPARAMS["ll_cp"])])
def test_seeds_times_draws_one_object(name, hparams):
    """2 seeds × 2 draws (a confirmation's replicates): four trials of one loss object, each
    on its own seed's batches and its own draw -- stateless, scheduled and stateful losses."""
    data = _data()
    draws = _draws(data)
    cells = [(s, d) for d in (2, 0) for s in (4, 9)]
    cfg = _config(seeds=tuple(s for s, _ in cells))
    index = [d for _, d in cells]
    plan = plan_trials(data, cfg, name, [dict(hparams)] * 4, index, len(draws))
    assert plan.shared and plan.stacked_draws and len(plan.losses) == 1
    stacked = train_probe(data, cfg, name, dict(hparams), draws=draws, draw_index=index)
    for t, (seed, d) in enumerate(cells):
        _assert_same(stacked, t, _seed_alone(data, cfg, name, hparams, seed, draws[d]))


@pytest.mark.parametrize(("name", "hparams"), [("an", {}), ("role", {"k": 2.0}),
                                               ("em_apl", HPARAMS["em_apl"]),
                                               ("ll_cp", HPARAMS["ll_cp"]),
                                               ("opml", HPARAMS["opml"]), ("vpu", {})])
def test_pruning_a_trial_keeps_the_others_and_their_orders(name, hparams):
    """Trial 1 stops after epoch 1 of 3: it leaves the stack with its batch order and its rows
    of the loss's per-trial state (OPML and vPU, trial_state None: it stays, frozen); the
    others go on,
    each on its own seed's batches."""
    data = _data()
    cfg = _config(seeds=SEEDS)
    stacked = train_probe(data, cfg, name, dict(hparams), callback=_stop_at(1, 1))
    assert stacked.trials[1].stopped_at == 1
    for t, seed in enumerate(SEEDS):
        callback = _stop_at(0, 1) if t == 1 else None
        _assert_same(stacked, t, _seed_alone(data, cfg, name, hparams, seed, callback=callback))


@pytest.mark.parametrize(("name", "hparams"), [("an", {}), ("role", {"k": 2.0})])
def test_forced_trial_blocks(name, hparams):
    """Two blocks (2 + 1 trials): each a shared plan over its own seeds."""
    data = _data()
    cfg = _config(seeds=SEEDS)
    speed = SpeedOptions(trial_block=2)
    plan = plan_trials(data, cfg, name, [dict(hparams)] * 3)
    trainer = make_trainer(data, cfg, plan, speed)
    assert isinstance(trainer, BlockedTrainer)
    assert [len(b.groups) for _, b in trainer.blocks] == [1, 1]
    assert [len(b.order_gens) for _, b in trainer.blocks] == [2, 1]
    stacked = train_probe(data, cfg, name, dict(hparams), speed=speed)
    assert stacked.timing["trial_blocks"] == [2, 1]
    for t, seed in enumerate(SEEDS):
        _assert_same(stacked, t, _seed_alone(data, cfg, name, hparams, seed))


def test_the_shared_trainer_calls_the_loss_once_per_step_with_each_trials_rows():
    """One object, one call per step: index (T, B) holds each trial's own batch rows, and the
    targets are those rows of the train labels."""
    data = _data()
    cfg = _config(seeds=SEEDS, epochs=1)
    plan = plan_trials(data, cfg, "an", [{}] * 3)
    trainer = make_trainer(data, cfg, plan, SpeedOptions(trial_block=0))
    assert isinstance(trainer, StackedTrainer) and len(trainer.groups) == 1
    seen = []
    loss = trainer.groups[0].loss
    forward = loss.forward

    def spy(logits, observed, index=None):
        seen.append((logits.shape, observed.clone(), index.clone()))
        return forward(logits, observed, index)

    loss.forward = spy
    trainer.train_epoch(0)
    assert len(seen) == trainer.n_steps
    for shape, observed, index in seen:
        assert shape == (3, cfg.batch_size, data.n_classes) and index.shape == (3, cfg.batch_size)
        assert torch.equal(observed, data.train_observed[index])
    assert not torch.equal(seen[0][2][0], seen[0][2][1])  # the seeds' orders differ


@pytest.mark.parametrize(("name", "hparams"), [("role", {"k": 2.0}),
                                               ("ll_cp", HPARAMS["ll_cp"])])
def test_a_loss_without_the_capability_keeps_one_object_per_seed(monkeypatch, name, hparams):
    """A loss that does not declare stacks_seeds (here a stateful built-in with its declaration
    taken away, as a plugin that never made one) trains per-trial seeds through one loss
    object per trial, correctly."""
    monkeypatch.setattr(get_loss_class(name), "stacks_seeds", False)
    data = _data()
    cfg = _config(seeds=SEEDS)
    plan = plan_trials(data, cfg, name, [dict(hparams)] * 3)
    assert not plan.shared and len(plan.losses) == 3
    stacked = train_probe(data, cfg, name, dict(hparams))
    for t, seed in enumerate(SEEDS):
        _assert_same(stacked, t, _seed_alone(data, cfg, name, hparams, seed))


def test_a_given_loss_object_is_never_shared_over_seeds():
    data = _data()
    plan = plan_trials(data, _config(), create_loss("an"), None)
    assert plan.shared and plan.one_batch
    with pytest.raises(Exception, match="one loss object per trial"):
        plan_trials(data, _config(seeds=SEEDS), create_loss("an"), None)


def test_register_refuses_stacks_seeds_without_stacks_draws():
    class Odd(Loss):
        name = "odd_seeds_only"
        stacks_seeds = True

        def forward(self, logits, observed, index=None):
            return LossOutput(logits.sum(), {})

    with pytest.raises(LossContractError, match="stacks_seeds but not stacks_draws"):
        register(Odd)


def test_per_trial_rows_equals_indexing_trial_by_trial():
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(4, 10, 3, generator=gen, requires_grad=True)
    index = torch.randint(0, 10, (3, 5), generator=gen)
    of = torch.tensor([2, 0, 2])
    got = per_trial_rows(values, index, of=of)
    want = torch.stack([values[of[t], index[t]] for t in range(3)])
    assert torch.equal(got, want)
    own = per_trial_rows(values[:3], index)  # of None: trial t's own rows
    assert torch.equal(own, torch.stack([values[t, index[t]] for t in range(3)]))
    # the gradient reaches exactly the rows gathered (ROLE's trainable label estimates)
    (g,) = torch.autograd.grad(got.sum(), values)
    (h,) = torch.autograd.grad(want.sum(), values)
    assert torch.equal(g, h)


def test_state_rows_takes_a_per_trial_index():
    loss = create_loss("role", k=2.0)
    observed = (torch.rand(3, 12, 4, generator=torch.Generator().manual_seed(1)) < 0.3)
    loss.setup(observed.to(torch.int8), n_epochs=1, n_trials=3)
    index = torch.tensor([[0, 5], [7, 1], [11, 11]])
    z = torch.zeros(3, 2, 4)
    rows = loss.state_rows("label_logits", index, z, "test")
    state = loss.label_logits
    assert isinstance(state, nn.Parameter)
    for t in range(3):
        assert torch.equal(rows[t], state[t, index[t]])


@pytest.mark.slow
def test_compiled_step_over_per_trial_seeds_equals_the_eager_step():
    """--compile traces the shared step with each trial's own batch (bmm) and its (T, B)
    target gather: the same heads as the eager step to float rounding."""
    data = _data()
    cfg = _config(seeds=SEEDS, epochs=2, eval_every=0, device="cpu", compile=True)
    compiled = train_probe(data, cfg, "an")
    eager = train_probe(data, replace(cfg, compile=False), "an")
    assert compiled.timing["compiled"] and not eager.timing["compiled"]
    torch.testing.assert_close(compiled.final_heads, eager.final_heads, atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "hparams"), [("an", {}), ("gr", {}), ("role", {"k": 2.0})])
def test_cuda_graph_over_per_trial_seeds_equals_the_eager_step(name, hparams):
    """The captured step gathers each trial's own batch and targets on the device: the same
    heads bit for bit as the eager step, and each trial as its seed's run alone."""
    data = _data()
    cfg = _config(seeds=SEEDS, device="cuda")
    eager = train_probe(data, replace(cfg, cuda_graph=False), name, dict(hparams))
    graph = train_probe(data, replace(cfg, cuda_graph=True), name, dict(hparams))
    assert graph.timing["cuda_graph"] and not eager.timing["cuda_graph"]
    assert torch.equal(graph.final_heads, eager.final_heads)
    for t, seed in enumerate(SEEDS):
        _assert_same(graph, t, _seed_alone(data, replace(cfg, cuda_graph=False), name, hparams,
                                           seed))
