"""Acknowledging the unknown — Zhou et al., "Acknowledging the Unknown for Multi-label Learning
with Single Positive Labels", ECCV 2022: the entropy-maximisation loss (EM, Eq. 3) and asymmetric
pseudo-labelling (APL, Alg. 1, Eqs. 6–8); spec: docs/losses.md "Acknowledging the unknown", the
formulas in each class's ``formula`` (``spml losses show em_apl``). **The EM total is negative by
design**: maximising the entropy of the unobserved predictions lowers it below zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._base import EntrywiseLoss, HParam, Loss, register
from ._hparams import LossInputError, LossOutput, check_call, check_state_arg, hp, mean_bc, promote
from .large_loss import rank_select, selection_count

__all__ = ["em", "em_apl"]

PAPER = (
    "Zhou et al., Acknowledging the Unknown for Multi-label Learning with Single Positive Labels, "
    "ECCV 2022")

_ALPHA = HParam("alpha", 0.1, "weight α of the entropy term on unobserved labels (COCO/NUS 0.1, "
                "VOC 0.2, CUB 0.01)", low=0.0, low_open=True, search=(0.01, 1.0), log=True)
_BETA = HParam("beta", 0.9, "weight β of the soft pseudo-negative BCE (COCO 0.9, VOC 0.02, "
               "NUS 0.2, CUB 0.4)", low=0.0, low_open=True, search=(0.01, 1.0), log=True)
_THETA = HParam("theta", 0.9, "fraction θ of each class's unobserved entries pseudo-labelled "
                "over the run", low=0.0, high=1.0, search=(0.5, 1.0))
_WARMUP = HParam("warmup", 5, "first (1-indexed) epoch after which APL pseudo-labels (COCO/VOC 5, "
                 "NUS 4, CUB 3)", kind="int", low=0)

#: Zhou et al.'s per-dataset settings (released main.py): (bs, lr, α, θ, warmup, β), 10 epochs
_PAPER_SETTINGS = {
    "voc": (8, 1e-5, 0.2, 0.9, 5, 0.02),
    "coco": (16, 1e-5, 0.1, 0.9, 5, 0.9),
    "nus": (16, 1e-5, 0.1, 0.9, 4, 0.2),
    "cub": (8, 1e-4, 0.01, 0.9, 3, 0.4)}
_TRAIN = {ds: {"batch_size": s[0], "lr": s[1], "epochs": 10} for ds, s in _PAPER_SETTINGS.items()}

_NOTES_COMMON = (
    "Logs are exact (from logits); the released code uses −log(x + 1e-5). The per-dataset "
    "presets were tuned for end-to-end fine-tuning (10 epochs), not for a linear probe. "
    "Observed negatives (y=−1, partial labels) get −log(1−p) (our choice: the released EM "
    "rejects them, and its EM+APL would read −1 as a soft target of 1). Search ranges are "
    "this library's choice (the paper reports no sensitivity ranges).")


def _em_entries(z: Tensor, y: Tensor, alpha) -> Tensor:
    pos, neg = F.softplus(-z), F.softplus(z)  # −log p, −log(1−p)
    p = torch.sigmoid(z)
    entropy = p * pos + (1 - p) * neg
    return torch.where(y == 1, pos, torch.where(y == 0, -alpha * entropy, neg))


def _em_apl_entries(z: Tensor, y: Tensor, soft: Tensor, alpha, beta) -> Tensor:
    pos, neg = F.softplus(-z), F.softplus(z)
    labelled = ~torch.isnan(soft) & (y == 0)
    t = torch.nan_to_num(soft, nan=0.0).to(z.dtype)
    pseudo = beta * (t * pos + (1 - t) * neg)
    return torch.where(labelled, pseudo, _em_entries(z, y, alpha))


def em(logits: Tensor, observed: Tensor, alpha: float | Tensor = 0.1) -> Tensor:
    """EM loss (Zhou et al. ECCV 2022, Eq. 3): −log p on observed positives, −α·H(p) on
    unobserved labels (−log(1−p) on observed negatives). The total is negative by design."""
    z, y, _, h = check_call("em", logits, observed, {_ALPHA: alpha})
    return mean_bc(_em_entries(z, y, h["alpha"]))


def em_apl(logits: Tensor, observed: Tensor, soft_targets: Tensor, alpha: float | Tensor = 0.1,
           beta: float | Tensor = 0.9) -> Tensor:
    """EM + APL loss (Zhou et al. ECCV 2022, Eq. 8). Stateful: ``soft_targets`` is the batch's
    rows of the APL state, a float tensor ``(B, C)`` or ``(T, B, C)`` holding the frozen soft
    pseudo-negative target t ∈ [0, 1] of a pseudo-labelled unobserved entry and NaN elsewhere.
    Pseudo-labelled entries get β·[−t log p − (1−t) log(1−p)]; the rest is :func:`em`."""
    z, y, _, h = check_call("em_apl", logits, observed, {_ALPHA: alpha, _BETA: beta})
    soft = check_state_arg("em_apl", "soft_targets", soft_targets, z, "float",
                           "t in [0, 1] for pseudo-labelled entries, NaN elsewhere",
                           "torch.full(observed.shape, float('nan'))")
    given = ~torch.isnan(soft)
    if bool((given & ((soft < 0) | (soft > 1))).any()):
        raise LossInputError(
            "em_apl: 'soft_targets' must lie in [0, 1] (or be NaN = not pseudo-labelled); got "
            f"values in [{soft[given].min().item():g}, {soft[given].max().item():g}]")
    if bool((given & (y != 0)).any()):
        raise LossInputError(
            "em_apl: 'soft_targets' may only be set (non-NaN) on unobserved entries "
            "(observed == 0); set it to NaN where observed is 1 or -1")
    return mean_bc(_em_apl_entries(z, y, soft, h["alpha"], h["beta"]))


@register
class EM(EntrywiseLoss):
    name = "em"
    stacks_seeds = True  # a (T, B) index: reads no per-example state
    paper = PAPER + ", Eq. 3 (EM)"
    formula = (
        "y=1: −log p;  y=0: −α·H(p), H(p) = −p log p − (1−p) log(1−p);  y=−1: −log(1−p)\n"
        "mean over B·C  (negative by design: the entropy term is maximised)")
    hparam_specs = (_ALPHA,)
    presets = {ds: {"alpha": s[2]} for ds, s in _PAPER_SETTINGS.items()}
    train_presets = _TRAIN
    notes = "Default α=0.1 is the COCO/NUS setting. " + _NOTES_COMMON
    entries = staticmethod(_em_entries)
    stacks_draws = True  # per-trial (T, B, C) observed broadcast entry by entry


@register
class EMAPL(Loss):
    name = "em_apl"
    stacks_seeds = True  # a (T, B) index: its pseudo-labels are read through state_rows
    paper = PAPER + ", Eq. 8 and Alg. 1 (EM + APL)"
    formula = (
        "y=1: −log p;  y=0: −α·H(p);  y=−1: −log(1−p);  pseudo-labelled y=0 entries (soft\n"
        "target t): β·[−t log p − (1−t) log(1−p)] instead of −α·H(p);  mean over B·C\n"
        "APL, end of epoch e ≥ warmup (1-indexed): per class i, the ⌊θ·U_i/(E − warmup)⌋\n"
        "free unobserved entries with the lowest p get t ← p (frozen)")
    hparam_specs = (_ALPHA, _BETA, _THETA, _WARMUP)
    presets = {
        ds: {"alpha": s[2], "theta": s[3], "warmup": s[4], "beta": s[5]}
        for ds, s in _PAPER_SETTINGS.items()}
    train_presets = _TRAIN
    stateful = True
    needs_epoch_pass = True
    trial_state = ("soft_targets",)
    # per-trial draws: the unobserved masks and counts are per trial (observed_state)
    stacks_draws = True
    notes = (
        "State: `soft_targets` (T, N_train, C) float buffer, NaN = not pseudo-labelled. As in "
        "the released code, the pass runs after the epoch's training with the current head, "
        "ranks each class's free unobserved entries by p (we use the unflipped features; the "
        "released pass sees its random-flip augmentation), and m_i = int(θ·U_i/(E − warmup)) "
        "in float64 with a relative slack of 4 float32 ulps (so θ=0.9 as float32 gives the "
        "count of 0.9; the released int() can round an exact integer down by float noise). "
        "Ties: lower row first (the released np.argsort is unstable). When E ≤ warmup the "
        "denominator is taken as 1 (the labels could not be "
        "used anyway). Fewer free entries than m_i: all of them. Defaults (α=0.1, β=0.9, "
        "θ=0.9, warmup=5) are the COCO settings. " + _NOTES_COMMON)

    def setup(self, observed: Tensor, n_epochs: int, n_trials: int | None = None) -> None:
        super().setup(observed, n_epochs, n_trials)
        unobserved = observed == 0  # (N, C), or (T, N, C) per-trial draws
        self.observed_state("unobserved", unobserved, observed)
        self.observed_state("n_unobserved", unobserved.sum(-2).to(torch.int64), observed)
        self.per_example("soft_targets", observed, float("nan"), torch.float32)

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        rows = self.state_rows("soft_targets", index, z, "look up its pseudo-labels")
        alpha, beta = hp(self.hparam("alpha"), z), hp(self.hparam("beta"), z)
        return LossOutput(mean_bc(_em_apl_entries(z, observed, rows, alpha, beta)), {})

    def counts(self) -> Tensor:
        """m_i per trial and class, ``(T, 1, C)`` int64: ⌊θ·U_i / (E − warmup)⌋ in float64
        (with the float32-ulp slack of :func:`~probe.losses.large_loss.selection_count`)."""
        theta = self.hparam("theta")
        u = self.n_unobserved.to(torch.float64).unsqueeze(-2)  # (1, C), per-trial draws (T, 1, C)
        denom = max(self.n_epochs - self.hparam("warmup"), 1)
        if isinstance(theta, Tensor):
            theta = theta.to(device=u.device, dtype=torch.float64).reshape(-1, 1, 1)
        m = selection_count(theta * u / denom, up=False).to(torch.int64)
        return m.expand(self.state("soft_targets").shape[0], 1, -1)

    def end_epoch(self, epoch: int, logits: Tensor | None = None) -> None:
        """APL (Alg. 1): after 0-indexed ``epoch`` with epoch + 1 ≥ warmup, pseudo-label."""
        super().end_epoch(epoch, logits)
        if epoch + 1 < self.hparam("warmup"):
            return
        soft = self.state("soft_targets")
        z = promote(self.epoch_logits(logits, soft.shape).detach())
        with torch.no_grad():  # Eq. 6: per (trial, class) the counts() free (NaN) unobserved
            # entries with the lowest p (by logit; ties: lower row first) get t ← p
            chosen = rank_select(z, self.trial_view(self.unobserved) & torch.isnan(soft),
                                 self.counts(), dim=-2, largest=False)
            soft.copy_(torch.where(chosen, torch.sigmoid(z).to(soft.dtype), soft))
