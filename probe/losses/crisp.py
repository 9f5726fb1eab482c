"""CRISP, Class-pRiors Induced Single-Positive multi-label learning — Liu, Xu, Wang, Geng, "Can
Class-Priors Help Single-Positive Multi-Label Learning?", NeurIPS 2025 (arXiv 2309.13886).
No released code. Spec: docs/losses.md "crisp".

Two parts:

- The class-prior estimator (Algorithm 1, Theorem 4.1): per class j, over the classifier's
  scores s = σ(z) on the training rows, q̂_j(t) = the fraction of all N rows with s_j ≥ t and
  q̂ᵖ_j(t) = the fraction of the nᵖ_j rows whose observed positive is j with s_j ≥ t; the
  threshold t̂ minimises the upper confidence bound
  q̂_j(t)/q̂ᵖ_j(t) + (1+τ)/q̂ᵖ_j(t)·(√(log(4/δ)/2N) + √(log(4/δ)/2nᵖ_j))
  over the scores (exhaustively), and π̂_j = q̂_j(t̂)/q̂ᵖ_j(t̂). Re-estimated after every epoch
  from the warm-up's last epoch on.
- The risk on the estimated priors (Theorem 4.2's terms): with f = σ(z),
  R_j = 2π_j·mean_{rows labelled j}(1 − f_j) + |mean_rows f_j − π_j|. It is the unbiased
  risk of the loss ℓ(f, 1) = 1 − f, ℓ(f, 0) = f under the SCAR assumption
  (E[y g] = π_j E_{P_j}[g]): R_j = 2π_j E_P[1 − f] + E[f] − π_j, whose second part is made
  non-negative with the absolute value, as the paper's prose says.

**(reconstructed)** The paper's displayed equations did not survive in its available text;
the risk above is derived from the prose and Theorem 4.2's terms, and the λ-weighted
modification for rare classes is reconstructed as a logit adjustment, f = σ(z + λ·logit(π_j))
(Menon et al.'s form: a rare class's logits are lowered during training, so the head learns
larger raw logits for it), λ = 1 by default. The reduction (the mean over classes of R_j, with
the positive term averaged over the batch's rows labelled j, zero where there are none) is also
ours.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._base import HParam, Loss, LossInputError, register
from ._hparams import LossOutput, check_call, hp, mean_bc, promote
from .assume_negative import an_entries

__all__ = ["crisp", "crisp_priors"]

PAPER = ("Liu, Xu, Wang, Geng, Can Class-Priors Help Single-Positive Multi-Label Learning?, "
         "NeurIPS 2025")

_DELTA = HParam("delta", 0.01, "confidence δ of Theorem 4.1's bound (paper: 0.01)",
                low=0.0, high=1.0, low_open=True, high_open=True)
_TAU = HParam("tau", 0.01, "slack τ of Theorem 4.1's bound (paper: 0.01)", low=0.0)
_LAM = HParam("lam", 1.0, "weight λ of the rare-class logit adjustment σ(z + λ·logit(π)) "
              "(reconstructed; 0 turns it off)", low=0.0, search=(0.0, 2.0))
_WARMUP = HParam("warmup", 1, "epochs trained with AN before the priors are first estimated "
                 "(the paper's AN warm-up)", kind="int", low=1)

# a prior is kept in [_PI_MIN, 1 − _PI_MIN] inside the logit adjustment (log(0) guard)
_PI_MIN = 1e-4


def crisp_priors(scores: Tensor, observed: Tensor, delta: float | Tensor = 0.01,
                 tau: float | Tensor = 0.01) -> Tensor:
    """Algorithm 1's class priors from ``scores`` ``(N, C)`` or ``(T, N, C)`` in [0, 1] (the
    classifier's probabilities on the training rows) and ``observed`` ``(N, C)`` (1 = the
    row's observed positive), or ``(T, N, C)`` with ``(T, N, C)`` scores (trial t's own
    draw). Returns ``(C,)`` or ``(T, C)``, each π̂_j in [0, 1].

    Per class the candidate thresholds are the distinct scores; ties in the bound keep the
    highest threshold. A class without observed positives gets π̂ = 0 (no bound is defined).
    ``delta``/``tau``: numbers or ``(T,)`` tensors.
    """
    per_draw = observed.ndim == 3  # trial t's own observed labels
    if scores.ndim not in (2, 3) or tuple(scores.shape[-observed.ndim:]) != tuple(
            observed.shape) or (per_draw and scores.ndim != 3):
        raise LossInputError(
            f"crisp_priors: scores must be (N, C) or (T, N, C) matching observed "
            f"{tuple(observed.shape)}; got {tuple(scores.shape)}")
    squeeze = scores.ndim == 2
    s = scores.detach().to(torch.float64)
    if squeeze:
        s = s.unsqueeze(0)
    t, n, c = s.shape
    pos = (observed == 1).to(s.device)
    if not per_draw:
        pos = pos.unsqueeze(0)  # (1, N, C): one observed matrix for every trial
    s_sorted, order = torch.sort(s, dim=1, descending=True, stable=True)
    pos_sorted = torch.gather(pos.expand(t, n, c), 1, order).to(torch.float64)
    count_all = torch.arange(1, n + 1, dtype=torch.float64, device=s.device).view(1, n, 1)
    count_pos = torch.cumsum(pos_sorted, dim=1)
    n_pos = pos.sum(1, keepdim=True).to(torch.float64)  # (1 or T, 1, C)
    q = (count_all / n).expand(t, n, c)
    qp = count_pos / n_pos.clamp(min=1)
    # a threshold t = s_sorted[i] counts every row scoring >= t: only the last of a tie group
    last = torch.ones_like(s_sorted, dtype=torch.bool)
    last[:, :-1] = s_sorted[:, :-1] > s_sorted[:, 1:]
    d = _per_trial(delta, s)
    ta = _per_trial(tau, s)
    log_term = torch.log(4.0 / d)
    width = torch.sqrt(log_term / (2 * n)) + torch.sqrt(log_term / (2 * n_pos.clamp(min=1)))
    safe_qp = qp.clamp(min=1e-300)
    bound = q / safe_qp + (1 + ta) / safe_qp * width
    bound = torch.where(last & (count_pos > 0), bound, torch.full_like(bound, math.inf))
    best = torch.argmin(bound, dim=1, keepdim=True)  # first minimum: the highest threshold
    pi = (torch.gather(q, 1, best) / torch.gather(safe_qp, 1, best)).squeeze(1)
    pi = torch.where(n_pos.squeeze(1) > 0, pi.clamp(0.0, 1.0), torch.zeros_like(pi))
    pi = pi.to(torch.float32)
    return pi[0] if squeeze else pi


def _per_trial(value: float | Tensor, like: Tensor) -> float | Tensor:
    """A number, or a ``(T,)`` tensor viewed ``(T, 1, 1)`` in ``like``'s dtype."""
    if isinstance(value, Tensor):
        return value.to(device=like.device, dtype=like.dtype).reshape(-1, 1, 1)
    return torch.tensor(float(value), dtype=like.dtype, device=like.device)


def _crisp_parts(z: Tensor, y: Tensor, pi: Tensor, lam) -> tuple[Tensor, Tensor]:
    """(positive term, alignment) per trial; ``pi`` broadcasts as ``(..., 1, C)``."""
    pi = pi.to(z.dtype)
    clamped = pi.clamp(_PI_MIN, 1 - _PI_MIN)
    f = torch.sigmoid(z + lam * torch.log(clamped / (1 - clamped)))
    pos = (y == 1).to(z.dtype)
    n_pos = pos.sum(-2, keepdim=True).clamp(min=1)
    pos_term = (2 * pi * pos * (1 - f) / n_pos).sum(-2)
    align = (f.mean(-2) - pi.squeeze(-2)).abs()
    return pos_term.mean(-1), align.mean(-1)


def crisp(logits: Tensor, observed: Tensor, priors: Tensor, lam: float | Tensor = 1.0) -> Tensor:
    """CRISP's risk on class priors ``priors`` (``(C,)``, or ``(T, C)`` for ``(T, B, C)``
    logits; estimate them with :func:`crisp_priors`): per class
    2π_j·mean_{rows labelled j}(1 − f_j) + |mean f_j − π_j|, f = σ(z + λ·logit(π_j)), averaged
    over classes (module doc; the λ part and the reduction are reconstructed)."""
    z, y, _, h = check_call("crisp", logits, observed, {_LAM: lam})
    want = (z.shape[-1],) if z.ndim == 2 else (z.shape[0], z.shape[-1])
    if not isinstance(priors, Tensor) or tuple(priors.shape) != want:
        got = tuple(priors.shape) if isinstance(priors, Tensor) else type(priors).__name__
        raise LossInputError(
            f"crisp: priors must be a tensor of shape {want} (one prior per class"
            f"{', per trial' if z.ndim == 3 else ''}); got {got}; estimate them with "
            "crisp_priors(scores, observed_train)")
    pi = priors.to(z.device).unsqueeze(-2)
    return sum(_crisp_parts(z, y, pi, h["lam"]))


@register
class CRISP(Loss):
    name = "crisp"
    paper = PAPER + ", Algorithm 1, Theorems 4.1 and 4.2 (CRISP)"
    formula = (
        "epochs < warmup: AN.  After each epoch e ≥ warmup − 1, per class j over the train "
        "rows' s = σ(z):\n"
        "t̂ = argmin_t q̂(t)/q̂ᵖ(t) + (1+τ)/q̂ᵖ(t)·(√(log(4/δ)/2N) + √(log(4/δ)/2nᵖ)),  "
        "π̂_j = q̂(t̂)/q̂ᵖ(t̂)\n"
        "loss: f = σ(z + λ·logit(π̂_j)) (reconstructed);  per class "
        "2π̂_j·mean_{y_j=1}(1 − f_j) + |mean f_j − π̂_j|;  mean over C")
    hparam_specs = (_DELTA, _TAU, _LAM, _WARMUP)
    stateful = True
    needs_epoch_pass = True
    trial_state = ("priors",)
    # per-trial draws: each trial's priors are estimated from its own draw (observed_state)
    stacks_draws = True
    stacks_seeds = True  # a (T, B) index: forward reads no state by batch row
    version = "1"
    notes = (
        "(reconstructed) The paper's equations are lost in its available text: the risk is "
        "derived from its prose and Theorem 4.2's terms (the unbiased risk of ℓ(f,1) = 1 − f, "
        "ℓ(f,0) = f under SCAR, the alignment made non-negative with |·|); the rare-class "
        "λ-modification is reconstructed as the logit adjustment σ(z + λ·logit(π̂)), λ = 1; the "
        "reduction (positive term averaged over the batch's rows labelled j, then the mean over "
        "classes) is ours. The prior estimator (Algorithm 1, Theorem 4.1) survives in prose "
        "and is implemented as stated: thresholds over the distinct train scores, ties in the "
        "bound keep the highest threshold, π̂ clipped to [0, 1], a class without observed "
        "positives gets π̂ = 0. State: `priors` (T, C) float32, re-estimated after every epoch "
        "from the warm-up's last one on (needs_epoch_pass); observed negatives (y = −1) are "
        "not used after the warm-up. δ = τ = 0.01 as the paper. No released code.")

    def setup(self, observed: Tensor, n_epochs: int, n_trials: int | None = None) -> None:
        super().setup(observed, n_epochs, n_trials)
        self.observed_state("observed_train", observed.to(torch.int8), observed)
        self.register_buffer("priors", torch.zeros(self.n_trials or 1, observed.shape[-1],
                                                   device=observed.device))

    def end_epoch(self, epoch: int, logits: Tensor | None = None) -> None:
        """Re-estimate the priors (Algorithm 1) from the train rows' logits after 0-indexed
        ``epoch`` once ``epoch + 1 >= warmup``."""
        super().end_epoch(epoch, logits)
        if epoch + 1 < self.hparam("warmup"):
            return
        priors = self.state("priors")
        shape = (priors.shape[0], *self.observed_train.shape[-2:])
        z = promote(self.epoch_logits(logits, shape).detach())
        with torch.no_grad():
            priors.copy_(crisp_priors(torch.sigmoid(z), self.observed_train,
                                      self.hparam("delta"), self.hparam("tau")))

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        if self.epoch < self.hparam("warmup"):  # the AN warm-up
            an = mean_bc(an_entries(z, observed))
            return LossOutput(an, {"warmup_an": an})
        priors = self.state("priors")
        pi = priors.unsqueeze(-2) if z.ndim == 3 else priors[0].unsqueeze(0)
        pos_term, align = _crisp_parts(z, observed, pi, hp(self.hparam("lam"), z))
        return LossOutput(pos_term + align, {"positive": pos_term, "align": align})
