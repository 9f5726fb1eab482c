"""The loss contract as checks a test can call: every built-in loss runs them
(``tests/test_losses_common.py``), and a plugin's own tests can too (docs/plugins.md)::

    from probe.losses.testing import check_loss

    def test_my_loss_keeps_the_contract():
        import my_package.losses  # noqa: F401  (registers "my_loss"; or install the plugin)
        check_loss("my_loss")

Each check raises ``AssertionError`` naming the loss and what broke. They run on the CPU in a
fraction of a second per loss, on small random inputs: a train split of ``N_TRAIN`` rows and
``C`` classes with one positive per row (one row and one class without any), batches of ``B``
rows, ``T`` stacked trials drawn from each hyperparameter's search range. A hyperparameter left
None (one the trainer fills from the data) is set to 2.0. These checks do not replace tests of
the loss's own math: compare it with a hand-computed case and an independent reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._base import Loss, LossInputError, create_loss, get_loss_class

__all__ = ["N_TRAIN", "B", "C", "T", "check_documented", "check_finite", "check_loss",
           "check_no_host_sync", "check_select_trials", "check_state_dict", "check_trial_axis",
           "drive", "give_features", "give_prior", "make_loss", "observed_labels", "trial_values"]

N_TRAIN, C, B, T = 24, 6, 8, 3


def observed_labels(n: int = N_TRAIN, c: int = C, seed: int = 0) -> torch.Tensor:
    """Single positives: one 1 per row (row 1 has none: 'no positive in a row'), class c-1 has
    no positive at all ('no positive in a class')."""
    g = torch.Generator().manual_seed(seed)
    y = torch.zeros(n, c, dtype=torch.int8)
    cols = torch.randint(0, c - 1, (n,), generator=g)
    y[torch.arange(n), cols] = 1
    y[1] = 0
    return y


def trial_values(spec: Any, t: int, seed: int) -> list[float]:
    """``t`` values drawn from ``spec``'s search range (log-uniform where ``spec.log``)."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = spec.search
    u = torch.rand(t, generator=g, dtype=torch.float64).tolist()
    if spec.log:
        return [math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * x) for x in u]
    return [lo + (hi - lo) * x for x in u]


def make_loss(name: str, **hparams: Any) -> Loss:
    """``create_loss(name, **hparams)`` with every hyperparameter left None set to 2.0 (e.g.
    EPR/ROLE's k, which the trainer fills from the data)."""
    loss = create_loss(name, **hparams)
    for spec in loss.hparam_specs:
        if spec.optional and loss.hparam(spec.name) is None:
            loss.set_hparam(spec.name, 2.0)
    return loss


def _stacked_hparams(name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """T float64 values per stackable, searched hyperparameter of loss ``name``."""
    stackable = [s for s in get_loss_class(name).hparam_specs if s.stackable and s.search]
    return {s.name: torch.tensor(trial_values(s, T, seed=seed + i), dtype=torch.float64)
            for i, s in enumerate(stackable)}


def give_prior(loss: Loss, observed: torch.Tensor) -> None:
    """A loss that reads a prior (:attr:`Loss.prior`) gets one after setup, as the trainer does:
    softmax class scores over the train rows, and each extra the loss reads
    (``prior_extras``, ``prior_optional``): DAMP's tile_max / tile_min / tile_mean as
    max / min / mean-like arrays, any other name random scores; other losses nothing."""
    cls = type(loss)
    if cls.prior is None:
        return
    g = torch.Generator().manual_seed(5)
    scores = torch.softmax(torch.randn(observed.shape, generator=g) * 2, -1)
    spread = torch.rand(observed.shape, generator=g) * 0.2
    tiles = {"tile_max": scores + spread, "tile_min": scores * 0.5, "tile_mean": scores * 0.8}
    keys = (*getattr(cls, "prior_extras", ()), *getattr(cls, "prior_optional", ()))
    loss.set_prior(scores, {k: tiles[k] if k in tiles else torch.rand(observed.shape, generator=g)
                            for k in keys})


def give_features(loss: Loss, observed: torch.Tensor, d: int = 5) -> None:
    """A loss that reads the train features (:attr:`Loss.needs_features`) gets ``d`` random
    ones per train row after setup and the prior, as the trainer does; others nothing."""
    if not type(loss).needs_features:
        return
    g = torch.Generator().manual_seed(7)
    loss.set_features(torch.randn(observed.shape[0], d, generator=g))


def drive(loss: Loss, logits_seq: Sequence[torch.Tensor], observed: torch.Tensor,
          n_epochs: int = 2, seeds: Sequence[int] = (0,),
          select: tuple[int, list[int]] | None = None
          ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Drive ``loss`` through the trainer's protocol (setup, manual_seed, start_epoch, two
    batches an epoch with ``index``, end_epoch with the train logits where it needs them);
    returns each step's loss values and logits gradients. ``select=(epoch, keep)`` calls
    ``select_trials(keep)`` after that epoch, and the later steps feed the kept trials' rows."""
    stacked = logits_seq[0].ndim == 3
    loss.setup(observed, n_epochs=n_epochs, n_trials=len(seeds) if stacked else None)
    give_prior(loss, observed)
    give_features(loss, observed)
    loss.manual_seed(list(seeds))
    out_vals, out_grads = [], []
    step, rows = 0, None
    for epoch in range(n_epochs):
        loss.start_epoch(epoch)
        for index in (torch.arange(0, B), torch.arange(B, 2 * B)):
            z = logits_seq[step] if rows is None else logits_seq[step][rows]
            z = z.clone().requires_grad_(True)
            out = loss(z, observed[index], index=index)
            out.loss.sum().backward()
            out_vals.append(out.loss.detach())
            out_grads.append(z.grad)
            step += 1
        if loss.needs_epoch_pass:
            full = logits_seq[-1] if rows is None else logits_seq[-1][rows]
            train_logits = full.new_zeros(*full.shape[:-2], N_TRAIN, C)
            train_logits[..., :, :] = torch.linspace(-3, 3, N_TRAIN * C).view(N_TRAIN, C)
            loss.end_epoch(epoch, train_logits if full.ndim == 3 else train_logits.unsqueeze(0))
        if select is not None and select[0] == epoch:
            loss.select_trials(select[1])
            rows = torch.tensor(select[1])
    return out_vals, out_grads


def check_documented(name: str) -> None:
    """The class carries its name, paper and formula, and its card (``spml losses show``)
    names them; every search range is increasing."""
    cls = get_loss_class(name)
    assert cls.name == name, f"{name}: registered under another name than {cls.name!r}"
    assert cls.paper and cls.formula, f"{name}: set 'paper' and 'formula'"
    text = cls.describe()
    assert name in text and cls.formula.strip().splitlines()[0] in text
    for spec in cls.hparam_specs:
        if spec.search is not None:
            assert spec.search[0] < spec.search[1], f"{name}.{spec.name}: inverted search range"


def check_finite(name: str, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> None:
    """Finite scalar values and gradients for logits ``randn · scale`` (clamped to ±100) of
    ``dtype`` (half precision computed in float32), rows and classes without positives
    included."""
    g = torch.Generator().manual_seed(1)
    observed = observed_labels()
    logits_seq = [
        (torch.randn(B, C, generator=g) * scale).clamp(-100, 100).to(dtype) for _ in range(4)]
    vals, grads = drive(make_loss(name), logits_seq, observed)
    for v, gr in zip(vals, grads):
        assert v.dim() == 0 and torch.isfinite(v).all(), f"{name}: loss {v}"
        assert v.dtype == (torch.float64 if dtype == torch.float64 else torch.float32), (
            f"{name}: {dtype} logits gave a {v.dtype} loss")
        assert gr is not None and torch.isfinite(gr).all(), f"{name}: gradient not finite"


def check_trial_axis(name: str) -> None:
    """T stacked trials (per-trial hyperparameters as (T,) tensors) equal T separate runs,
    values and gradients, through setup, epoch hooks, state and per-trial seeds."""
    per_trial = _stacked_hparams(name)
    g = torch.Generator().manual_seed(2)
    observed = observed_labels()
    logits_seq = [torch.randn(T, B, C, generator=g, dtype=torch.float64) * 3 for _ in range(4)]
    seeds = [11, 12, 13]
    vals, grads = drive(make_loss(name, **per_trial), logits_seq, observed, seeds=seeds)
    for t in range(T):
        single = make_loss(name, **{k: v[t].item() for k, v in per_trial.items()})
        vals_t, grads_t = drive(single, [z[t] for z in logits_seq], observed, seeds=[seeds[t]])
        for step, (a, b, ga, gb) in enumerate(zip(vals, vals_t, grads, grads_t)):
            torch.testing.assert_close(a[t], b, msg=f"{name}: trial {t} step {step} value")
            torch.testing.assert_close(ga[t], gb, msg=f"{name}: trial {t} step {step} gradient")


def check_select_trials(name: str, keep: Sequence[int] = (0, 2)) -> None:
    """Pruning: after ``select_trials(keep)`` the kept trials compute exactly what they compute
    without it (so ``trial_state`` names all per-trial state). A loss with ``trial_state =
    None`` must refuse ``select_trials`` (its stopped trials stay in the stack, frozen)."""
    keep = list(keep)
    per_trial = _stacked_hparams(name, seed=5)
    g = torch.Generator().manual_seed(3)
    observed = observed_labels()
    logits_seq = [torch.randn(T, B, C, generator=g, dtype=torch.float64) * 3 for _ in range(6)]
    seeds = [21, 22, 23]

    if get_loss_class(name).trial_state is None:
        loss = make_loss(name, **per_trial)
        loss.setup(observed, n_epochs=2, n_trials=T)
        give_prior(loss, observed)
        give_features(loss, observed)
        assert not loss.can_select_trials, f"{name}: trial_state None but can_select_trials"
        try:
            loss.select_trials(keep)
        except LossInputError:
            return
        raise AssertionError(f"{name}: trial_state is None but select_trials did not refuse")
    vals, grads = drive(make_loss(name, **per_trial), logits_seq, observed, n_epochs=3,
                        seeds=seeds)
    cut_vals, cut_grads = drive(make_loss(name, **per_trial), logits_seq, observed, n_epochs=3,
                                seeds=seeds, select=(0, keep))
    for step in range(2, len(vals)):  # the steps after the selection (epoch 0 has two)
        torch.testing.assert_close(cut_vals[step], vals[step][keep],
                                   msg=f"{name}: step {step} value after select_trials({keep})")
        torch.testing.assert_close(cut_grads[step], grads[step][keep],
                                   msg=f"{name}: step {step} gradient after select_trials({keep})")


def check_state_dict(name: str) -> None:
    """Per-example state lives in buffers/parameters, so it is saved with the rest."""
    observed = observed_labels()
    loss, clone = make_loss(name), make_loss(name)
    for each in (loss, clone):
        each.setup(observed, n_epochs=2)
        give_prior(each, observed)
        give_features(each, observed)
    clone.load_state_dict(loss.state_dict())
    for (k, a), (_, b) in zip(loss.state_dict().items(), clone.state_dict().items()):
        torch.testing.assert_close(a, b, equal_nan=True, msg=f"{name}: {k}")


class _SyncSpy(TorchDispatchMode):
    """Records ops that synchronise with the device (.item(), bool(tensor), nonzero)."""

    SYNC = ("aten._local_scalar_dense", "aten.nonzero", "aten.is_nonzero", "aten.item")

    def __init__(self) -> None:
        super().__init__()
        self.synced: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(self.SYNC):
            self.synced.append(str(func))
        return func(*args, **(kwargs or {}))


def check_no_host_sync(name: str) -> None:
    """The forward and backward, stacked, mid-run (schedules and state active), make no
    device-to-host read (docs/design.md: no host synchronisation inside an epoch)."""
    observed = observed_labels()
    loss = make_loss(name, **{k: v.float() for k, v in _stacked_hparams(name).items()})
    loss.setup(observed, n_epochs=3, n_trials=T)
    give_prior(loss, observed)
    give_features(loss, observed)
    loss.manual_seed([1, 2, 3])
    loss.start_epoch(2)
    index = torch.tensor([3, 7, 1, 0, 9, 12])
    z = torch.randn(T, len(index), C).requires_grad_(True)
    with _SyncSpy() as spy:
        out = loss(z, observed[index], index=index)
        out.loss.sum().backward()
    assert spy.synced == [], f"{name}: forward/backward synchronise via {spy.synced}"


def check_loss(name: str) -> None:
    """Every check of this module for the registered loss ``name``."""
    check_documented(name)
    for dtype in (torch.float32, torch.float64, torch.float16):
        for scale in (1.0, 100.0):
            check_finite(name, dtype, scale)
    check_trial_axis(name)
    check_select_trials(name)
    check_state_dict(name)
    check_no_host_sync(name)
