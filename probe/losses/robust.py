"""Robust losses for missing labels — docs/losses.md "Robust losses" (focal, ASL, Hill, SPLC); the
formulas in each class's ``formula`` (``spml losses show hill``). Every log is taken from logits
(log p = logsigmoid(z), log(1−p) = logsigmoid(−z)) and every power p^γ computed as exp(γ·log p).
Reduction: the mean over all B·C entries (the papers sum: a learning-rate factor).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ._base import EntrywiseLoss, register
from ._hparams import HParam, LossInputError, LossOutput, check_call, check_hparam, mean_bc, promote

__all__ = ["asl", "focal", "hill", "splc"]

PAPER_FOCAL = "Lin et al., Focal Loss for Dense Object Detection, ICCV 2017"
PAPER_ASL = "Ridnik et al., Asymmetric Loss For Multi-Label Classification, ICCV 2021"
PAPER_HILL = (
    "Zhang et al., Simple and Robust Loss Design for Multi-Label Learning with Missing Labels, "
    "arXiv:2112.07368, 2021")
_NO_PRESETS = (
    "No per-dataset presets: the papers give one default for every dataset (the signature "
    "defaults), and no SPML-protocol training settings.")

_GAMMA = HParam("gamma", 2.0, "focusing exponent γ (Lin et al. study γ ∈ [0, 5])", low=0.0,
                search=(0.0, 5.0))
_GAMMA_POS = HParam("gamma_pos", 0.0, "focusing exponent γ+ on positives", low=0.0,
                    search=(0.0, 2.0))
_GAMMA_NEG = HParam("gamma_neg", 4.0, "focusing exponent γ− on negatives", low=0.0,
                    search=(0.0, 6.0))
_CLIP = HParam("clip", 0.05, "probability margin c of the shifted p_m = max(p − c, 0)", low=0.0,
               high=1.0, high_open=True, search=(0.0, 0.2))
_LAM = HParam("lam", 1.5, "Hill's λ in (λ − p)·p² (1.5 makes the gradient 3p²(1−p)²)", low=0.0,
              low_open=True, search=(1.0, 2.0))
_MARGIN = HParam("margin", 1.0, "logit margin m of the focal-margin positive p_m = σ(z − m) "
                 "(recommended 0.5–1)", low=0.0, search=(0.5, 1.0))
_TAU = HParam("tau", 0.6, "SPLC threshold: unobserved entries with σ(z) > τ count as positive",
              low=0.0, high=1.0, search=(0.5, 0.9))
_CHANGE_EPOCH = HParam("change_epoch", 1, "first 0-indexed epoch with SPLC's label correction",
                       kind="int", low=0.0)


def _pow_exp(gamma, log_x: Tensor) -> Tensor:
    """x^γ as exp(γ·log x): finite value and gradient at x → 0 for every γ ≥ 0 (0^0 = 1)."""
    return torch.exp(gamma * log_x)


def _focal(z: Tensor, gamma) -> Tensor:
    """−(1−p)^γ log p, p = σ(z): the focal positive term; the negative term −p^γ log(1−p) is
    ``_focal(−z)``, the focal-margin positive −(1−p_m)^γ log p_m (Hill paper) ``_focal(z − m)``."""
    return -_pow_exp(gamma, F.logsigmoid(-z)) * F.logsigmoid(z)


def _focal_entries(z: Tensor, y: Tensor, gamma) -> Tensor:
    log_p, log_1mp = F.logsigmoid(z), F.logsigmoid(-z)  # once for both terms (the hot path)
    return torch.where(y > 0, -_pow_exp(gamma, log_1mp) * log_p, -_pow_exp(gamma, log_p) * log_1mp)


def _asl_entries(z: Tensor, y: Tensor, gamma_pos, gamma_neg, clip) -> Tensor:
    log_p, log_1mp = F.logsigmoid(z), F.logsigmoid(-z)
    # log(1 − p_m) = log((1 − p) + min(c, p)) = logaddexp(log(1−p), min(log c, log p)): exact for
    # every c in [0, 1), finite with a finite gradient even where 1 − p underflows.
    if isinstance(clip, Tensor):  # log 0 = −inf where a per-trial c is 0
        log_1mpm = torch.logaddexp(log_1mp, log_p.minimum(torch.log(clip)))
    elif clip == 0:
        log_1mpm = log_1mp
    else:
        log_1mpm = torch.logaddexp(log_1mp, log_p.clamp_max(math.log(clip)))
    with torch.no_grad():  # asymmetric focusing weights under stop-gradient (docs/losses.md)
        w_pos = _pow_exp(gamma_pos, log_1mp)
        p_m = (torch.sigmoid(z) - clip).clamp_min(0.0)
        w_neg = p_m.pow(gamma_neg) if isinstance(gamma_neg, Tensor) else p_m**gamma_neg
    return torch.where(y > 0, -w_pos * log_p, -w_neg * log_1mpm)


def _hill_entries(z: Tensor, y: Tensor, lam, margin, gamma) -> Tensor:
    p = torch.sigmoid(z)
    return torch.where(y > 0, _focal(z - margin, gamma), (lam - p) * p * p)


def _splc_entries(z: Tensor, y: Tensor, correct: bool, tau, margin, gamma) -> tuple[Tensor, Tensor]:
    """Per-entry SPLC loss and the mask of unobserved entries corrected to positive."""
    corrected = (y == 0) & (torch.sigmoid(z.detach()) > tau) if correct else torch.zeros_like(y > 0)
    positive = (y > 0) | corrected
    entries = torch.where(positive, _focal(z - margin, gamma), _focal(-z, gamma))
    return entries, corrected


def focal(logits: Tensor, observed: Tensor, gamma: float | Tensor = 2.0) -> Tensor:
    """Focal loss (Lin et al. 2017, Eq. 4, no α): −(1−p)^γ log p on y=1, −p^γ log(1−p) on
    y≤0; mean over B·C (the paper sums). The focusing weight carries its gradient."""
    z, y, _, h = check_call("focal", logits, observed, {_GAMMA: gamma})
    return mean_bc(_focal_entries(z, y, h["gamma"]))


def asl(logits: Tensor, observed: Tensor, gamma_pos: float | Tensor = 0.0,
        gamma_neg: float | Tensor = 4.0, clip: float | Tensor = 0.05) -> Tensor:
    """Asymmetric loss (Ridnik et al. 2021, Sec. 3): −(1−p)^γ+ log p on y=1 and
    −p_m^γ− log(1−p_m), p_m = max(p − clip, 0), on y≤0, with the focusing weights under
    stop-gradient; mean over B·C (the paper sums)."""
    z, y, _, h = check_call("asl", logits, observed,
                            {_GAMMA_POS: gamma_pos, _GAMMA_NEG: gamma_neg, _CLIP: clip})
    return mean_bc(_asl_entries(z, y, h["gamma_pos"], h["gamma_neg"], h["clip"]))


def hill(logits: Tensor, observed: Tensor, lam: float | Tensor = 1.5, margin: float | Tensor = 1.0,
         gamma: float | Tensor = 2.0) -> Tensor:
    """Hill loss (Zhang et al. 2021): focal margin −(1−p_m)^γ log p_m, p_m = σ(z − margin), on
    y=1; (λ − p)·p² on y≤0 (with λ = 1.5 its gradient w.r.t. z is 3p²(1−p)², GR paper Eq. 33);
    mean over B·C (the paper sums)."""
    z, y, _, h = check_call("hill", logits, observed, {_LAM: lam, _MARGIN: margin, _GAMMA: gamma})
    return mean_bc(_hill_entries(z, y, h["lam"], h["margin"], h["gamma"]))


def splc(logits: Tensor, observed: Tensor, epoch: int | None = None, tau: float | Tensor = 0.6,
         margin: float | Tensor = 1.0, gamma: float | Tensor = 2.0,
         change_epoch: int = 1) -> Tensor:
    """Self-paced loss correction with focal margin (Zhang et al. 2021; GR paper Eq. 25).

    ``epoch`` is the current 0-indexed epoch: from ``epoch >= change_epoch`` on, unobserved
    entries with σ(z) > τ take the focal-margin positive loss (label correction); all other
    non-positive entries take the focal negative −p^γ log(1−p). ``epoch=None`` (the default)
    means "after the warm-up": the correction is on. Mean over B·C (the paper sums).
    """
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0):
        raise LossInputError(
            f"splc: 'epoch' must be a 0-indexed integer >= 0 or None; got {epoch!r}")
    change_epoch = check_hparam(_CHANGE_EPOCH, change_epoch, "splc")
    z, y, _, h = check_call("splc", logits, observed, {_TAU: tau, _MARGIN: margin, _GAMMA: gamma})
    correct = epoch is None or epoch >= change_epoch
    entries, _ = _splc_entries(z, y, correct, h["tau"], h["margin"], h["gamma"])
    return mean_bc(entries)


@register
class Focal(EntrywiseLoss):
    name = "focal"
    stacks_seeds = True  # a (T, B) index: reads no per-example state
    paper = PAPER_FOCAL + ", Eq. 4 (FL without the α-balancing of Eq. 5)"
    formula = "y=1: −(1−p)^γ log p;  y≤0: −p^γ log(1−p);  mean over B·C"
    hparam_specs = (_GAMMA,)
    notes = (
        "Mean over B·C instead of the paper's sum (a learning-rate factor). No α-balancing term. "
        "The focusing weight keeps its gradient, as in Lin et al. (the Hill/SPLC repository's "
        "'Focal' is ASL with γ+ = γ− = 2, clip 0 and weights under no_grad). " + _NO_PRESETS)
    entries = staticmethod(_focal_entries)
    stacks_draws = True  # per-trial (T, B, C) observed broadcast entry by entry


@register
class ASL(EntrywiseLoss):
    name = "asl"
    stacks_seeds = True  # a (T, B) index: reads no per-example state
    paper = PAPER_ASL + ", Sec. 3 (asymmetric focusing and probability shifting)"
    formula = (
        "p_m = max(p − clip, 0)\n"
        "y=1: −sg((1−p)^γ+) log p;  y≤0: −sg(p_m^γ−) log(1−p_m);  mean over B·C")
    hparam_specs = (_GAMMA_POS, _GAMMA_NEG, _CLIP)
    notes = (
        "Focusing weights under stop-gradient (docs/losses.md; the reference's "
        "disable_torch_grad_focal_loss=True). Later versions of Alibaba-MIIL/ASL comment the "
        "no_grad out in AsymmetricLoss; we keep the stop-gradient. The reference clamps "
        "probabilities at eps=1e-8 before the log; we compute log(1−p_m) exactly from logits. "
        "Mean over B·C instead of the sum. " + _NO_PRESETS)
    entries = staticmethod(_asl_entries)
    stacks_draws = True  # per-trial (T, B, C) observed broadcast entry by entry


@register
class Hill(EntrywiseLoss):
    name = "hill"
    stacks_seeds = True  # a (T, B) index: reads no per-example state
    paper = PAPER_HILL + " (Hill loss); GR paper Eqs. 24, 33"
    formula = (
        "p_m = σ(z − margin)\n"
        "y=1: −(1−p_m)^γ log p_m;  y≤0: (λ − p)·p²;  mean over B·C\n"
        "(λ = 1.5: ∂/∂z of the negative term = 3p²(1−p)²)")
    hparam_specs = (_LAM, _MARGIN, _GAMMA)
    notes = (
        "As the reference (xinyu1205/robust-loss-mlml Hill): the focal weight and λ − p keep "
        "their gradients. Mean over B·C instead of the sum. The GR paper's Table 1 writes Hill's "
        "positive term as −log p (the GR repository's hill_loss); we follow the Hill paper's "
        "focal margin. " + _NO_PRESETS)
    entries = staticmethod(_hill_entries)
    stacks_draws = True  # per-trial (T, B, C) observed broadcast entry by entry


@register
class SPLC(EntrywiseLoss):
    name = "splc"
    stacks_seeds = True  # a (T, B) index: reads no per-example state
    paper = PAPER_HILL + " (SPLC with focal margin); GR paper Eq. 25"
    formula = (
        "p_m = σ(z − margin);  FM = −(1−p_m)^γ log p_m;  FN = −p^γ log(1−p)\n"
        "y=1: FM;  y=0: FM if epoch ≥ change_epoch and σ(z) > τ, else FN;  y=−1: FN\n"
        "mean over B·C")
    hparam_specs = (_TAU, _MARGIN, _GAMMA, _CHANGE_EPOCH)
    stacks_draws = True  # per-trial (T, B, C) observed broadcast entry by entry
    notes = (
        "Epochs are 0-indexed (start_epoch), as the reference's loop. Corrected entries take the "
        "focal-margin loss (docs/losses.md, the paper's loss⁺); the reference subtracts the margin "
        "before the correction, so its corrected entries get focal loss without margin. The "
        "threshold compares σ(z) (no margin) with τ, as the reference. Observed negatives (−1) are "
        "never corrected. parts['corrected']: the fraction of the batch's B·C entries corrected. "
        "Mean over B·C instead of the sum. The reference README uses τ = 0.65 for COCO with 75% "
        "labels left. " + _NO_PRESETS)

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        correct = self.epoch >= self.hparam("change_epoch")
        entries, corrected = _splc_entries(
            z, observed, correct, self._h("tau", z), self._h("margin", z), self._h("gamma", z))
        frac = mean_bc(corrected.to(z.dtype)).expand(entries.shape[:-2])  # (T,) even uncorrected
        return LossOutput(mean_bc(entries), {"corrected": frac})
