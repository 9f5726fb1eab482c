"""The part of the loss contract that carries a prior (docs/priors.md): a mixin that keeps the
train split's per-image class scores as buffers and gathers a batch's rows of them.

The scores have no trial axis: stacked trials share one prior, so ``select_trials`` has nothing
of it to keep, and a batch's rows are one ``index_select`` per array (no host sync).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._base import LossInputError

__all__ = ["PriorMixin", "rank_desc"]


def rank_desc(s: Tensor) -> Tensor:
    """Each entry's position in its row sorted by decreasing score, from 0 (ties: the lower
    class first); a top-k test is ``rank_desc(s) < k`` for any k, with no host sync."""
    order = torch.argsort(s, dim=-1, descending=True, stable=True)
    return torch.argsort(order, dim=-1, stable=True)


class PriorMixin:
    """For a :class:`~probe.losses.Loss` with ``prior`` set: :meth:`set_prior` validates and
    stores ``prior_scores`` (and ``prior_<extra>``) as non-persistent buffers; subclasses list
    the extras they need in ``prior_extras`` (and those they can use in ``prior_optional``)."""

    prior_extras: tuple[str, ...] = ()
    prior_optional: tuple[str, ...] = ()

    def set_prior(self, scores: Tensor, extras: dict[str, Tensor] | None = None) -> None:
        observed = getattr(self, "observed_train", None)
        if observed is None:
            raise LossInputError(f"{self.name}: call setup(observed_train, n_epochs) before "
                                 "set_prior(scores)")
        extras = dict(extras or {})
        missing = [k for k in self.prior_extras if k not in extras]
        if missing:
            raise LossInputError(
                f"{self.name}: the prior lacks the extra arrays {missing} this loss needs (store "
                f"them with 'spml import priors … --extra {missing[0]}=FILE')"
            )
        want = tuple(observed.shape)
        for key, value in {"scores": scores, **extras}.items():
            if not isinstance(value, Tensor) or not value.is_floating_point():
                raise LossInputError(f"{self.name}: prior array {key!r} must be a float tensor; "
                                     f"got {type(value).__name__}")
            if tuple(value.shape) != want:
                raise LossInputError(
                    f"{self.name}: prior array {key!r} must have the train split's shape "
                    f"(N_train, C) = {want}; got {tuple(value.shape)}"
                )
        self.register_buffer("prior_scores", scores.detach().float().to(observed.device)
                             .contiguous(), persistent=False)
        self._prior_keys = [k for k in (*self.prior_extras, *self.prior_optional) if k in extras]
        for key in self._prior_keys:
            self.register_buffer(f"prior_{key}", extras[key].detach().float()
                                 .to(observed.device).contiguous(), persistent=False)
        self.prior_ready()

    def prior_ready(self) -> None:
        """Called after :meth:`set_prior` stored the buffers (precompute per-row masks here)."""

    def has_prior(self, key: str) -> bool:
        return key in getattr(self, "_prior_keys", ())

    def prior_rows(self, index: Tensor | None, keys: Sequence[str] = ("scores",)
                   ) -> list[Tensor]:
        """The batch's rows of the prior arrays ``keys`` (``(B, C)`` each)."""
        if getattr(self, "prior_scores", None) is None:
            raise LossInputError(
                f"{self.name}: needs a prior (per-image class scores): pass --priors NAME "
                "(from Python: loss.set_prior(scores) after setup)"
            )
        if index is None:
            raise LossInputError(f"{self.name}: forward needs index= (the batch's train rows) to "
                                 "gather the prior's rows")
        return [torch.index_select(getattr(self, f"prior_{k}"), 0, index) for k in keys]
