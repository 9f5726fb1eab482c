"""Large Loss Matters — Kim et al., "Large Loss Matters in Weakly Supervised Multi-Label
Classification", CVPR 2022, Sec. 3.2 (LL-R, LL-Ct, LL-Cp); spec: docs/losses.md "Large Loss
Matters", the formulas in each class's ``formula``. Epochs are **1-indexed** here, as in the
paper. With a trial axis Δ may differ per trial, so k is a (T,) count and the selection is done
for all trials at once by ranks (no host sync); ties: by logit, then batch order (row, class).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ._base import HParam, Loss, flat_rows, register
from ._hparams import LossInputError, LossOutput, check_call, check_state_arg, mean_bc, promote
from .prior import rank_desc

__all__ = ["ll_cp", "ll_ct", "ll_r"]

PAPER = (
    "Kim et al., Large Loss Matters in Weakly Supervised Multi-Label Classification, CVPR 2022")

_DELTA = HParam(
    "delta_rel", 0.003,
    "Δ as a fraction of the batch's B·C entries: the rate grows by Δ per epoch (LL-R, LL-Ct) "
    "or is Δ from epoch 2 (LL-Cp); paper grid 0.001–0.005, default = its midpoint",
    low=0.0, high=1.0, search=(0.001, 0.005))

#: the released config.py for every dataset; lr is the backbone's, the head trains at 10 × lr
_TRAIN = {
    ds: {"batch_size": 16, "lr": 1e-5, "epochs": 10, "head_lr_mult": 10}
    for ds in ("voc", "coco", "nus", "cub")}

_NOTES_COMMON = (
    "Epoch numbers are 1-indexed here as in the paper (the trainer's 0-indexed epoch + 1). "
    "k = ⌈B·C·r⌉ is computed in float64 as ⌈(B·C)·((e−1)·Δ)⌉ with a relative slack of 4 "
    "float32 ulps (so a float32 Δ counts like its decimal value); the released code "
    "decrements a running rate 1 − Δ − Δ … and takes ⌈B·C·(1 − rate)⌉, which can be one "
    "higher where B·C·r is an integer (float drift). Ranking ties: by logit, then batch "
    "order (row, class); the released code changes every entry whose loss ties the k-th "
    "(possibly more than k). "
    "Observed negatives (y=−1, partial labels) keep −log(1−p) and are never selected. No "
    "per-dataset Δ presets: the authors grid-searched {0.1,…,0.5}% per dataset and report the "
    "choice only in their supplementary material, which we do not have. The released code "
    "trains the head at lr_mult=10 × the backbone lr (1e-5), i.e. 1e-4 for the head.")


def rank_select(key: Tensor, candidates: Tensor, count: int | Tensor, dim: int,
                largest: bool) -> Tensor:
    """Boolean mask of the ``count`` candidates with the largest (``largest``) or smallest ``key``
    along ``dim`` (all where fewer exist). ``count``: an int or a tensor with size 1 along ``dim``
    (e.g. ``(T, 1)`` per trial), from the stable ranking :func:`~probe.losses.prior.rank_desc`
    (ties: lower index first), no sync."""
    key = torch.where(candidates, key if largest else -key, float("-inf")).movedim(dim, -1)
    return (rank_desc(key).movedim(-1, dim) < count) & candidates


#: relative slack of the selection counts' ⌈·⌉ / ⌊·⌋: 4 float32 ulps, so that a float32 Δ or θ
#: (0.1 as float32 is 0.10000000149…) gives the count of its decimal value; far below any
#: fractional part that a real B·C·r or θ·U/(E − warmup) has.
_COUNT_TOL = 2.0**-22


def selection_count(x: float | Tensor, up: bool) -> int | Tensor:
    """⌈x⌉ (``up``) or ⌊x⌋ with a relative slack of :data:`_COUNT_TOL`; float64 in, same
    arithmetic for Python floats and tensors (so stacked trials count like separate runs)."""
    if isinstance(x, Tensor):
        return torch.ceil(x * (1 - _COUNT_TOL)) if up else torch.floor(x * (1 + _COUNT_TOL))
    return math.ceil(x * (1 - _COUNT_TOL)) if up else math.floor(x * (1 + _COUNT_TOL))


def _count(delta: float | Tensor, epoch: int, permanent: bool, b: int, c: int, z: Tensor
           ) -> int | Tensor:
    """k = ⌈B·C·r_e⌉ clamped to [0, B·C], r_e for 1-indexed epoch e (float64): (e−1)·Δ (LL-R,
    LL-Ct) or Δ from epoch 2 (LL-Cp). A Python int for a float Δ, else (T, 1) / 0-d."""
    if isinstance(delta, Tensor):
        delta = delta.to(torch.float64)
    if permanent:  # LL-Cp: Δ from epoch 2 on
        steps = 1 if epoch >= 2 else 0
    else:  # LL-R, LL-Ct: grows by Δ each epoch
        steps = epoch - 1
    rate = delta * steps
    if isinstance(rate, Tensor):
        k = selection_count((b * c) * rate.to(z.device), up=True).clamp(0, b * c)
        return k.view(-1, 1) if k.ndim == 1 else k
    return min(max(selection_count((b * c) * rate, up=True), 0), b * c)


def _ll_core(z: Tensor, y: Tensor, delta: float | Tensor, epoch: int,
             mode: str) -> tuple[Tensor, Tensor]:
    """Per-trial mean loss and the changed-entry mask (same shape as z). Unchecked."""
    b, c = z.shape[-2:]
    pos = F.softplus(-z)  # −log p
    entries = torch.where(y == 1, pos, F.softplus(z))
    k = _count(delta, epoch, mode == "ll_cp", b, c, z)
    unobserved = torch.broadcast_to(y == 0, z.shape)
    if isinstance(k, int) and k == 0:
        return mean_bc(entries), torch.zeros_like(unobserved)
    changed = rank_select(
        z.detach().flatten(-2), unobserved.flatten(-2), k, dim=-1, largest=True
    ).view(z.shape)
    replacement = torch.zeros_like(entries) if mode == "ll_r" else pos
    return mean_bc(torch.where(changed, replacement, entries)), changed


def _checked(logits, observed, delta_rel, epoch, loss):
    """The LL pure functions' checks: Δ, the inputs, then the 1-indexed ``epoch``."""
    z, y, values, _ = check_call(loss, logits, observed, {_DELTA: delta_rel})
    if epoch is None:
        raise LossInputError(
            f"{loss}: 'epoch' is required: the 1-indexed epoch number (epoch 1 changes nothing, "
            "the rate grows from epoch 2); e.g. epoch=trainer_epoch + 1")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise LossInputError(
            f"{loss}: 'epoch' must be the 1-indexed epoch number (an int >= 1, as in the paper; "
            f"epoch 1 changes nothing); got {epoch!r}")
    return z, y, values["delta_rel"], epoch


def ll_r(
    logits: Tensor, observed: Tensor, delta_rel: float | Tensor = 0.003, epoch: int | None = None
) -> Tensor:
    """LL-R (Kim et al. CVPR 2022, Sec. 3.2, rejection): AN loss with the ⌈B·C·(e−1)·Δ⌉
    largest-loss unobserved entries of the batch set to 0. ``epoch`` (required) is 1-indexed."""
    return _ll_core(*_checked(logits, observed, delta_rel, epoch, "ll_r"), "ll_r")[0]


def ll_ct(
    logits: Tensor, observed: Tensor, delta_rel: float | Tensor = 0.003, epoch: int | None = None
) -> Tensor:
    """LL-Ct (Kim et al. CVPR 2022, Sec. 3.2, temporary correction): AN loss with the
    ⌈B·C·(e−1)·Δ⌉ largest-loss unobserved entries given −log p instead. ``epoch`` (required)
    is 1-indexed."""
    return _ll_core(*_checked(logits, observed, delta_rel, epoch, "ll_ct"), "ll_ct")[0]


def ll_cp(logits: Tensor, observed: Tensor, flipped: Tensor, delta_rel: float | Tensor = 0.003,
          epoch: int | None = None) -> tuple[Tensor, Tensor]:
    """LL-Cp (Kim et al. CVPR 2022, Sec. 3.2, permanent correction). Stateful: ``flipped``, the
    batch's rows of the state (bool ``(B, C)`` or ``(T, B, C)``, all False at the start), is True
    where an entry was flipped to observed positive earlier. From epoch 2 (``epoch``, required,
    1-indexed) the ⌈B·C·Δ⌉ largest-loss still-unobserved entries get −log p and are flipped.
    Returns ``(loss, flipped_after)``: write the latter back (``state[..., index, :] = …``)."""
    z, y, delta, epoch = _checked(logits, observed, delta_rel, epoch, "ll_cp")
    flipped = check_state_arg("ll_cp", "flipped", flipped, z, "bool",
                              "True = flipped to positive earlier",
                              "torch.zeros_like(observed, dtype=torch.bool)")
    y_eff = torch.where(flipped, torch.ones_like(y), y)
    loss, changed = _ll_core(z, y_eff, delta, epoch, "ll_cp")
    return loss, torch.broadcast_to(flipped, z.shape) | changed


class _LargeLoss(Loss):
    hparam_specs = (_DELTA,)
    trial_state: tuple[str, ...] = ()  # LL-R, LL-Ct: stateless; LL-Cp: its flips
    # per-trial (T, B, C) observed: each trial ranks its own unobserved entries (LL-Cp's flips
    # are per trial already)
    stacks_draws = True
    # a (T, B) index: LL-Cp reads its flips through state_rows and writes them through flat_rows
    stacks_seeds = True
    train_presets = _TRAIN
    _mode = "ll_r"

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        y = observed
        if self.stateful:  # LL-Cp: earlier flips count as observed positives
            rows = self.state_rows("flipped", index, z, "look up its permanent flips")
            y = torch.where(rows, torch.ones_like(observed), observed)
        loss, changed = _ll_core(z, y, self.hparam("delta_rel"), self.epoch + 1, self._mode)
        if self.stateful:  # ... and this step's corrections join them for good
            flips = self.state("flipped")
            if index.ndim == 2:  # each trial's own batch rows (stacks_seeds)
                flat = flips.view(-1, flips.shape[-1])
                flat[flat_rows(index, flips.shape[1])] |= changed.reshape(-1, flips.shape[-1])
            else:
                (flips if z.ndim == 3 else flips[0])[..., index, :] |= changed
        return LossOutput(loss, {"n_changed": changed.sum(dim=(-2, -1)).to(z.dtype)})


@register
class LLR(_LargeLoss):
    name = "ll_r"
    paper = PAPER + ", Sec. 3.2 (LL-R)"
    formula = (
        "ℓ = AN per entry (y=1: −log p; y≤0: −log(1−p))\n"
        "epoch e (1-indexed): r = (e−1)·Δ; the ⌈B·C·r⌉ unobserved entries with the largest ℓ\n"
        "in the batch get ℓ ← 0 (rejected);  mean over B·C")
    notes = _NOTES_COMMON


@register
class LLCt(_LargeLoss):
    name = "ll_ct"
    paper = PAPER + ", Sec. 3.2 (LL-Ct)"
    formula = (
        "ℓ = AN per entry (y=1: −log p; y≤0: −log(1−p))\n"
        "epoch e (1-indexed): r = (e−1)·Δ; the ⌈B·C·r⌉ unobserved entries with the largest ℓ\n"
        "in the batch get ℓ ← −log p (label flipped for this batch);  mean over B·C")
    notes = _NOTES_COMMON
    _mode = "ll_ct"


@register
class LLCp(_LargeLoss):
    name = "ll_cp"
    paper = PAPER + ", Sec. 3.2 (LL-Cp)"
    formula = (
        "ℓ = AN per entry (y=1: −log p; y≤0: −log(1−p)), with earlier flips counted as y=1\n"
        "epoch e ≥ 2 (1-indexed): the ⌈B·C·Δ⌉ still-unobserved entries with the largest ℓ in\n"
        "the batch get ℓ ← −log p and are flipped to observed positive for good;  mean over B·C")
    notes = (
        "The released code's latest losses.py selects LL-Cp with `mode is 'LL-Cp'`, which is "
        "always False for a parsed string, so its 'LL-Cp' runs LL-Ct; we implement the "
        "paper's LL-Cp. (Its earlier version, selected by a flag, flips for good only the "
        "entries whose loss is strictly above the k-th largest, k−1 of them without ties; we "
        "flip exactly the k corrected entries.) State: "
        "`flipped` (T, N_train, C) bool buffer, updated in forward (gathered by `index`). "
        + _NOTES_COMMON)
    stateful = True
    _mode = "ll_cp"
    trial_state = ("flipped",)

    def setup(self, observed: Tensor, n_epochs: int, n_trials: int | None = None) -> None:
        super().setup(observed, n_epochs, n_trials)
        self.per_example("flipped", observed, False, torch.bool)
