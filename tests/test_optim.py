"""Stacked Adam / SGD (probe.engine.optim): trial t of a stacked optimizer makes exactly the updates
torch.optim makes on that trial's slice alone, with per-trial lr and weight decay; stopped
trials freeze; bad settings are named."""

from __future__ import annotations

import pytest
import torch

from probe.engine.optim import (
    OptimizerConfigError,
    StackedAdam,
    StackedSGD,
    TrialParam,
    make_optimizer,
)

T, SHAPE, STEPS = 3, (4, 5), 6
LRS = [1e-2, 3e-3, 1e-2]
WDS = [0.0, 0.1, 0.05]


pytestmark = pytest.mark.usefixtures("one_thread")


def _grads(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(T, *SHAPE, generator=g, dtype=torch.float64) for _ in range(STEPS)]


def _start() -> torch.Tensor:
    return torch.randn(T, *SHAPE, generator=torch.Generator().manual_seed(1),
                       dtype=torch.float64)


def _reference(kind: str, t: int, grads, **kw) -> torch.Tensor:
    p = torch.nn.Parameter(_start()[t].clone())
    if kind == "adam":
        opt = torch.optim.Adam([p], lr=LRS[t], weight_decay=WDS[t], foreach=False, **kw)
    else:
        opt = torch.optim.SGD([p], lr=LRS[t], weight_decay=WDS[t], foreach=False, **kw)
    for g in grads:
        p.grad = g[t].clone()
        opt.step()
    return p.detach()


@pytest.mark.parametrize("fused", [False, True])
def test_stacked_adam_equals_torch_adam_per_trial(fused):
    grads = _grads()
    param = _start()
    opt = StackedAdam([TrialParam(param, LRS, WDS)], betas=(0.8, 0.99), eps=1e-6, fused=fused)
    for g in grads:
        opt.step([g.clone()])
    for t in range(T):
        torch.testing.assert_close(param[t], _reference("adam", t, grads, betas=(0.8, 0.99),
                                                        eps=1e-6))


def test_adam_with_one_lr_updates_whole_tensor_like_torch():
    grads = _grads(3)
    param = _start()
    opt = make_optimizer("adam", [TrialParam(param, 1e-2, 0.0)])
    for g in grads:
        opt.step([g.clone()])
    for t in range(T):
        p = torch.nn.Parameter(_start()[t].clone())
        ref = torch.optim.Adam([p], lr=1e-2)
        for g in grads:
            p.grad = g[t].clone()
            ref.step()
        torch.testing.assert_close(param[t], p.detach())


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_stacked_sgd_equals_torch_sgd_per_trial(momentum):
    grads = _grads(1)
    param = _start()
    opt = StackedSGD([TrialParam(param, LRS, WDS)], momentum=momentum)
    for g in grads:
        opt.step([g.clone()])
    for t in range(T):
        torch.testing.assert_close(param[t], _reference("sgd", t, grads, momentum=momentum))


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_stopped_trial_freezes_and_others_continue(kind):
    grads = _grads(2)
    param = _start()
    opt = make_optimizer(kind, [TrialParam(param, LRS, WDS)], momentum=0.5)
    for step, g in enumerate(grads):
        if step == 2:
            frozen = param[1].clone()
            opt.stop_trials([1])
        opt.step([g.clone()])
    assert torch.equal(param[1], frozen)
    assert opt.stopped == frozenset({1})
    kw = {} if kind == "adam" else {"momentum": 0.5}
    for t in (0, 2):
        torch.testing.assert_close(param[t], _reference(kind, t, grads, **kw))


def test_none_gradient_skips_the_parameter_and_several_params():
    a, b = _start(), _start()[:, 0].contiguous()
    b0 = b.clone()
    opt = StackedAdam([TrialParam(a, LRS, 0.0), TrialParam(b, [x * 10 for x in LRS])])
    opt.step([torch.ones_like(a), None])
    assert torch.equal(b, b0) and not torch.equal(a, _start())
    opt.step([torch.ones_like(a), torch.ones_like(b)])
    # b's first Adam step: |update| = lr (bias-corrected m / sqrt(v) = 1)
    torch.testing.assert_close((b0 - b), torch.tensor(LRS, dtype=b.dtype)[:, None] * 10
                               * torch.ones_like(b))


def test_trial_ids_map_slices_to_the_runs_trials():
    """A parameter owned by trial 2 alone (leading axis 1) freezes when trial 2 stops."""
    head, own = _start(), _start()[2:].clone()
    opt = StackedAdam([TrialParam(head, 1e-2), TrialParam(own, 1e-2, trial_ids=[2])])
    opt.stop_trials([0])  # trial 0: only the head's first slice freezes
    before = own.clone()
    opt.step([torch.ones_like(head), torch.ones_like(own)])
    assert not torch.equal(own, before) and torch.equal(head[0], _start()[0])
    opt.stop_trials([2])
    before = own.clone()
    opt.step([torch.ones_like(head), torch.ones_like(own)])
    assert torch.equal(own, before)
    with pytest.raises(OptimizerConfigError, match="one id per slice"):
        StackedAdam([TrialParam(own, 1e-2, trial_ids=[0, 1])])


def test_errors_name_the_setting():
    p = _start()
    with pytest.raises(OptimizerConfigError, match="lr: one value per trial expected"):
        StackedAdam([TrialParam(p, [1e-3, 1e-3])])
    with pytest.raises(OptimizerConfigError, match="lr must be a finite number >= 0"):
        StackedAdam([TrialParam(p, -1.0)])
    with pytest.raises(OptimizerConfigError, match="contiguous"):
        StackedAdam([TrialParam(p.transpose(1, 2), 1e-3)])
    with pytest.raises(OptimizerConfigError, match="betas"):
        StackedAdam([TrialParam(p, 1e-3)], betas=(1.0, 0.9))
    with pytest.raises(OptimizerConfigError, match="optimizer must be one of"):
        make_optimizer("rmsprop", [TrialParam(p, 1e-3)])
    with pytest.raises(OptimizerConfigError, match="one gradient per parameter"):
        StackedSGD([TrialParam(p, 1e-3)]).step([])
    with pytest.raises(OptimizerConfigError, match="trial 7 is not one of"):
        StackedSGD([TrialParam(p, 1e-3)]).stop_trials([7])


@pytest.mark.parametrize("fused", [False, True])
def test_several_parameters_and_lr_groups_each_equal_torch_adam(fused):
    """Two parameters of different shapes (a head and a loss's own), per-trial lr and weight
    decay, the second stepping at 10× the lr and skipping one step: every trial's slice of each
    equals torch.optim.Adam on it alone, each parameter with its own step count."""
    head = _start()
    own = torch.randn(T, 7, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    start_own = own.clone()
    opt = StackedAdam([TrialParam(head, LRS, WDS), TrialParam(own, [x * 10 for x in LRS])],
                      fused=fused)
    grads = _grads(5)
    own_grads = [torch.randn(T, 7, generator=torch.Generator().manual_seed(10 + s),
                             dtype=torch.float64) for s in range(STEPS)]
    for s, g in enumerate(grads):
        opt.step([g.clone(), None if s == 1 else own_grads[s].clone()])
    for t in range(T):
        torch.testing.assert_close(head[t], _reference("adam", t, grads))
        p = torch.nn.Parameter(start_own[t].clone())
        ref = torch.optim.Adam([p], lr=LRS[t] * 10, foreach=False)
        for s in range(STEPS):
            if s == 1:
                continue  # a None gradient: torch.optim skips the parameter
            p.grad = own_grads[s][t].clone()
            ref.step()
        torch.testing.assert_close(own[t], p.detach())
