"""The prior contract (docs/plugins.md "Reading a prior", docs/priors.md): :class:`PriorMixin`,
the base of every loss that reads per-image class scores from a vision-language model
(``Loss.prior``), and the helpers such losses share. The scores have no trial axis: stacked
trials share one prior, and a batch's rows are one ``index_select`` per array (no host sync).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from ._base import Loss, LossInputError, per_trial_rows

__all__ = ["PriorMixin", "check_scores", "rank_desc", "rank_dtype", "value_with_grad"]


def rank_desc(s: Tensor) -> Tensor:
    """Each entry's position in its row sorted by decreasing score, from 0 (ties: the lower
    class first); a top-k test is ``rank_desc(s) < k`` for any k, with no host sync."""
    order = torch.argsort(s, dim=-1, descending=True, stable=True)
    positions = torch.arange(s.shape[-1], device=s.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, positions)


def rank_dtype(n_classes: int) -> torch.dtype:
    """The smallest integer dtype that holds a rank among ``n_classes`` (int16 up to 32,767)."""
    return torch.int16 if n_classes <= torch.iinfo(torch.int16).max else torch.int32


class PriorMixin(Loss):
    """Base of a loss that reads a prior: ``class MyLoss(PriorMixin)`` (or ``(PriorMixin, GR)``
    to extend another loss). Set ``prior`` (what it reads, e.g. "class scores"), list the extra
    arrays it needs in ``prior_extras`` and those it can use in ``prior_optional``; read a
    batch's rows in ``forward`` with :meth:`prior_rows`. Any other extra is refused by name.

    A loss whose extras are optional records which mode ran in :attr:`prior_mode` (set by
    :meth:`set_prior`: the extras it received, or "scores only")."""

    prior_extras: ClassVar[tuple[str, ...]] = ()
    prior_optional: ClassVar[tuple[str, ...]] = ()
    stateful = True  # reads the train rows' prior: needs setup, set_prior and index=
    trial_state: ClassVar[tuple[str, ...] | None] = ()  # the prior is shared by all trials

    def setup(self, observed: Tensor, n_epochs: int, n_trials: int | None = None) -> None:
        """The :class:`Loss` setup, plus the train split's observed labels as the buffer
        ``observed_train`` (int8, ``(N_train, C)``, or ``(T, N_train, C)`` per-trial draws of a
        loss that :attr:`~Loss.stacks_draws`), which :meth:`set_prior` checks against."""
        super().setup(observed, n_epochs, n_trials)
        self.observed_state("observed_train", observed.to(torch.int8), observed)

    def set_prior(self, scores: Tensor, extras: dict[str, Tensor] | None = None) -> None:
        """Validate and keep the train rows' prior (after :meth:`setup`): ``scores`` and each
        extra ``(N_train, C)`` float; then :meth:`prior_ready`."""
        observed = getattr(self, "observed_train", None)
        if observed is None:
            raise LossInputError(f"{self.name}: call setup(observed_train, n_epochs) before "
                                 "set_prior(scores)")
        extras = dict(extras or {})
        known = (*self.prior_extras, *self.prior_optional)
        unknown = sorted(k for k in extras if k not in known)
        if unknown:
            reads = ", ".join(known) if known else "none"
            raise LossInputError(
                f"{self.name}: the prior given with --priors holds the extra arrays "
                f"{', '.join(unknown)}, which this loss does not read (extras it reads: {reads}); "
                "import the prior again with the extras named as the loss reads them ('spml "
                "import priors … --extra NAME=FILE'), or choose a prior without them")
        missing = [k for k in self.prior_extras if k not in extras]
        if missing:
            raise LossInputError(
                f"{self.name}: the prior given with --priors lacks the extra arrays "
                f"{', '.join(missing)} this loss needs; store them with 'spml import priors … "
                f"--extra {missing[0]}=FILE'")
        want = tuple(observed.shape[-2:])  # the train rows' (N, C), shared by the trials
        for key, value in {"scores": scores, **extras}.items():
            if not isinstance(value, Tensor) or not value.is_floating_point():
                raise LossInputError(f"{self.name}: prior array {key!r} must be a float tensor; "
                                     f"got {type(value).__name__}")
            if tuple(value.shape) != want:
                raise LossInputError(
                    f"{self.name}: prior array {key!r} must have the train split's shape "
                    f"(N_train, C) = {want}; got {tuple(value.shape)}")
        for key, value in {"scores": scores, **extras}.items():
            self.register_buffer(f"prior_{key}", value.detach().float().to(observed.device)
                                 .contiguous(), persistent=False)
        self._prior_keys = [k for k in known if k in extras]
        self.prior_mode = ("scores and " + ", ".join(self._prior_keys) if self._prior_keys
                           else "scores only")
        self.prior_ready()

    def set_hparam(self, name: str, value: Any) -> None:
        """:meth:`Loss.set_hparam`, then :meth:`prior_ready` again once the prior is set (the
        caches follow the hyperparameters)."""
        super().set_hparam(name, value)
        if getattr(self, "prior_scores", None) is not None:
            self.prior_ready()

    def prior_ready(self) -> None:
        """Called after :meth:`set_prior` stored the buffers: precompute here, once per train
        row, what depends only on the prior and ``observed_train`` (kept as buffers without a
        trial axis, or named in ``trial_state`` when per trial; a cache derived from
        ``observed_train`` of per-trial draws is registered by :meth:`~Loss.observed_state`)."""

    def has_prior(self, key: str) -> bool:
        """Whether the prior carried the extra ``key``."""
        return key in getattr(self, "_prior_keys", ())

    def prior_rows(self, index: Tensor | None, keys: Sequence[str] = ("scores",)) -> list[Tensor]:
        """The batch's rows of the prior arrays ``keys`` (``(B, C)`` each): "scores", an extra,
        or any buffer ``prior_<key>`` that :meth:`prior_ready` registered (``(T, B, C)`` for a
        per-trial ``(T, N, C)`` cache). A ``(T, B)`` index (each trial's own batch,
        :attr:`~probe.losses.Loss.stacks_seeds`) gives ``(T, B, C)`` rows of every array."""
        if getattr(self, "prior_scores", None) is None:
            raise LossInputError(
                f"{self.name}: needs a prior (per-image class scores): pass --priors NAME "
                "(from Python: loss.set_prior(scores) after setup)")
        if index is None:
            raise LossInputError(f"{self.name}: forward needs index= (the batch's train rows) to "
                                 "gather the prior's rows")
        rows = []
        for k in keys:
            value = getattr(self, f"prior_{k}")
            if index.ndim == 2 and value.ndim == 3:  # trial t's rows of its own cache
                rows.append(per_trial_rows(value, index))
            elif index.ndim == 2:  # trial t's rows of the shared (N, C) prior
                rows.append(value.index_select(0, index.reshape(-1)).view(*index.shape, -1))
            else:
                rows.append(torch.index_select(value, value.ndim - 2, index))  # the row axis
        return rows


def check_scores(scores: Any, y: Tensor, loss: str) -> Tensor:
    """A batch's prior scores as float32 on ``y``'s device, refused unless a float ``(B, C)``
    tensor like the observed labels ``y`` (the pure prior losses' check)."""
    if not isinstance(scores, Tensor) or not scores.is_floating_point() or (
            tuple(scores.shape) != tuple(y.shape[-2:])):
        raise LossInputError(
            f"{loss}: 'scores' must be a float tensor of the batch's (B, C) = "
            f"{tuple(y.shape[-2:])} prior scores; got "
            f"{tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__}")
    return scores.to(y.device).float()


class _ValueWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: Tensor, value: Tensor, grad: Tensor) -> Tensor:
        ctx.save_for_backward(grad)
        return value.clone()

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:
        (grad,) = ctx.saved_tensors
        return grad * (g.view(-1, 1, 1) if g.ndim else g), None, None


def value_with_grad(z: Tensor, value: Tensor, grad: Tensor) -> Tensor:
    """``value`` (the loss, ``()`` or ``(T,)``, computed without autograd) as a function of the
    logits ``z`` whose gradient is ``grad`` (``z``'s shape, d value_t / d z): one saved tensor
    instead of an autograd graph over every elementwise step -- what makes GPR's and VLPL's
    step as cheap as GR's and EM's. Test a loss that uses it against autograd."""
    return _ValueWithGrad.apply(z, value.detach(), grad.detach())
