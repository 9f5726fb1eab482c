"""Every registered loss, one contract: finite values and gradients (|z| up to 100, float16,
float64, rows/classes without positives), the trial axis (T stacked = T separate runs, values
and gradients, through setup / epoch hooks / per-example state), and clear errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import probe.losses as L
from probe.losses import LossInputError, available, create_loss, get_loss_class

N_TRAIN, C, B, T = 24, 6, 8, 3
NAMES = available()


def _observed(n: int, c: int, seed: int = 0) -> torch.Tensor:
    """Single positives: one 1 per row (row 1 has none: 'no positive in a row'), class c-1 has
    no positive at all ('no positive in a class')."""
    g = torch.Generator().manual_seed(seed)
    y = torch.zeros(n, c, dtype=torch.int8)
    cols = torch.randint(0, c - 1, (n,), generator=g)
    y[torch.arange(n), cols] = 1
    y[1] = 0
    return y


def _trial_values(spec, t: int, seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    lo, hi = spec.search
    u = torch.rand(t, generator=g, dtype=torch.float64).tolist()
    if spec.log:
        return [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * x) for x in u]
    return [lo + (hi - lo) * x for x in u]


def _make(name: str, **hparams):
    loss = create_loss(name, **hparams)
    for spec in loss.hparam_specs:
        if spec.optional and loss.hparam(spec.name) is None:
            loss.set_hparam(spec.name, 2.0)  # e.g. EPR/ROLE's k, normally filled by the trainer
    return loss


def _give_prior(loss, observed):
    """A loss that reads a prior (Loss.prior: VLPL, GPR) gets one after setup, as the trainer
    does: softmax scores over the train rows, with DAMP's tile extras."""
    if type(loss).prior is None:
        return
    g = torch.Generator().manual_seed(5)
    scores = torch.softmax(torch.randn(observed.shape, generator=g) * 2, -1)
    spread = torch.rand(observed.shape, generator=g) * 0.2
    loss.set_prior(scores, {"tile_max": scores + spread, "tile_min": scores * 0.5,
                            "tile_mean": scores * 0.8})


def _run(loss, logits_seq, observed, n_epochs=2, seeds=(0,)):
    """Drive a loss through the trainer protocol; returns the losses and grads of each step."""
    stacked = logits_seq[0].ndim == 3
    loss.setup(observed, n_epochs=n_epochs, n_trials=len(seeds) if stacked else None)
    _give_prior(loss, observed)
    loss.manual_seed(list(seeds))
    out_vals, out_grads = [], []
    step = 0
    for epoch in range(n_epochs):
        loss.start_epoch(epoch)
        for index in (torch.arange(0, B), torch.arange(B, 2 * B)):
            z = logits_seq[step].clone().requires_grad_(True)
            out = loss(z, observed[index], index=index)
            out.loss.sum().backward()
            out_vals.append(out.loss.detach())
            out_grads.append(z.grad)
            step += 1
        if loss.needs_epoch_pass:
            full = logits_seq[-1]
            train_logits = full.new_zeros(*full.shape[:-2], N_TRAIN, C)
            train_logits[..., :, :] = torch.linspace(-3, 3, N_TRAIN * C).view(N_TRAIN, C)
            loss.end_epoch(epoch, train_logits if full.ndim == 3 else train_logits.unsqueeze(0))
    return out_vals, out_grads


@pytest.mark.parametrize("name", NAMES)
def test_registered_loss_is_documented(name):
    cls = get_loss_class(name)
    assert cls.name == name
    assert cls.paper and cls.formula
    text = cls.describe()
    assert name in text and cls.formula.strip().splitlines()[0] in text
    assert hasattr(L, name), f"pure function probe.losses.{name} is missing"
    for spec in cls.hparam_specs:
        if spec.search is not None:
            assert spec.search[0] < spec.search[1], f"{name}.{spec.name}: inverted search range"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_finite_values_and_gradients(name, dtype, scale):
    g = torch.Generator().manual_seed(1)
    observed = _observed(N_TRAIN, C)
    logits_seq = [
        (torch.randn(B, C, generator=g) * scale).clamp(-100, 100).to(dtype) for _ in range(4)
    ]
    vals, grads = _run(_make(name), logits_seq, observed)
    for v, gr in zip(vals, grads):
        assert v.dim() == 0 and torch.isfinite(v).all(), f"{name}: loss {v}"
        assert v.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        assert gr is not None and torch.isfinite(gr).all(), f"{name}: gradient not finite"


@pytest.mark.parametrize("name", NAMES)
def test_trial_axis_equals_separate_runs(name):
    """T stacked trials (per-trial hyperparameters as (T,) tensors) equal T separate runs."""
    cls = get_loss_class(name)
    stackable = [s for s in cls.hparam_specs if s.stackable and s.search is not None]
    per_trial = {s.name: _trial_values(s, T, seed=i) for i, s in enumerate(stackable)}
    g = torch.Generator().manual_seed(2)
    observed = _observed(N_TRAIN, C)
    logits_seq = [torch.randn(T, B, C, generator=g, dtype=torch.float64) * 3 for _ in range(4)]
    seeds = [11, 12, 13]
    stacked = _make(name, **{k: torch.tensor(v, dtype=torch.float64) for k, v in per_trial.items()})
    vals, grads = _run(stacked, logits_seq, observed, seeds=seeds)
    for t in range(T):
        single = _make(name, **{k: v[t] for k, v in per_trial.items()})
        vals_t, grads_t = _run(single, [z[t] for z in logits_seq], observed, seeds=[seeds[t]])
        for step, (a, b) in enumerate(zip(vals, vals_t)):
            torch.testing.assert_close(a[t], b, msg=f"{name}: trial {t} step {step} value")
        for step, (a, b) in enumerate(zip(grads, grads_t)):
            torch.testing.assert_close(a[t], b, msg=f"{name}: trial {t} step {step} gradient")


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip(name):
    """Per-example state lives in buffers/parameters, so it is saved with the rest."""
    observed = _observed(N_TRAIN, C)
    loss = _make(name)
    loss.setup(observed, n_epochs=2)
    clone = _make(name)
    clone.setup(observed, n_epochs=2)
    clone.load_state_dict(loss.state_dict())
    for (k, a), (_, b) in zip(loss.state_dict().items(), clone.state_dict().items()):
        torch.testing.assert_close(a, b, equal_nan=True, msg=k)


# stateful losses' pure functions take their state as an argument (ROLE's Θ, APL's soft
# targets, LL-Cp's flips); their own test files check those functions' bad-input errors
STATELESS = [n for n in NAMES if not get_loss_class(n).stateful]


@pytest.mark.parametrize("name", STATELESS)
def test_pure_function_rejects_bad_observed(name):
    fn = getattr(L, name)
    z = torch.zeros(B, C)
    bad = torch.full((B, C), 2, dtype=torch.int8)
    kwargs = {"k": 2.0} if any(s.name == "k" for s in get_loss_class(name).hparam_specs) else {}
    with pytest.raises(LossInputError, match="observed"):
        fn(z, bad, **kwargs)
    with pytest.raises(LossInputError, match="observed"):
        fn(z, torch.zeros(B, C + 1, dtype=torch.int8), **kwargs)
    with pytest.raises(LossInputError, match="logits"):
        fn(torch.zeros(C), torch.zeros(C, dtype=torch.int8), **kwargs)


def test_unknown_loss_name_suggests_closest():
    with pytest.raises(LossInputError, match="unknown loss 'a_n'; did you mean 'an'"):
        create_loss("a_n")
    with pytest.raises(LossInputError, match="unknown loss 'nope'"):
        create_loss("nope")


def test_unknown_and_out_of_range_hparams_are_named():
    with pytest.raises(LossInputError, match=r"unknown hyperparameter 'epps'.*did you mean 'eps'"):
        create_loss("an_ls", epps=0.1)
    with pytest.raises(LossInputError, match=r"'eps' must lie in \[0, 0.5\).*got 0.7"):
        create_loss("an_ls", eps=0.7)
    with pytest.raises(LossInputError, match=r"'eps' must have shape \(2,\)"):
        create_loss("an_ls", eps=torch.tensor([0.1, 0.2])).set_hparam("eps", torch.tensor([0.1]))


class _SyncSpy(TorchDispatchMode):
    """Records ops that synchronise with the device (.item(), bool(tensor), nonzero)."""

    SYNC = ("aten._local_scalar_dense", "aten.nonzero", "aten.is_nonzero", "aten.item")

    def __init__(self):
        super().__init__()
        self.synced: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(self.SYNC):
            self.synced.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", NAMES)
def test_training_step_does_not_synchronise(name):
    """docs/design.md: no host synchronisation inside an epoch — the forward and backward of every
    registered loss, stacked, mid-run (schedules and state active), make no device→host read."""
    observed = _observed(N_TRAIN, C)
    stackable = [s for s in get_loss_class(name).hparam_specs if s.stackable and s.search]
    loss = _make(name, **{s.name: torch.tensor(_trial_values(s, T, seed=0)) for s in stackable})
    loss.setup(observed, n_epochs=3, n_trials=T)
    _give_prior(loss, observed)
    loss.manual_seed([1, 2, 3])
    loss.start_epoch(2)
    index = torch.tensor([3, 7, 1, 0, 9, 12])
    z = torch.randn(T, len(index), C).requires_grad_(True)
    with _SyncSpy() as spy:
        out = loss(z, observed[index], index=index)
        out.loss.sum().backward()
    assert spy.synced == [], f"{name}: forward/backward synchronise via {spy.synced}"
