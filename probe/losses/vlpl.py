"""VLPL — Xing et al., "Vision-Language Pseudo-Labels for Single-Positive Multi-Label Learning",
CVPRW 2024 (released code mvrl/VLPL, ``loss_EM_PL``; docs/priors.md).

A prior ``s`` (N, C): per image, the softmax over classes of CLIP's image-text similarities at
temperature 0.01. With p = σ(z), y ∈ {1, 0, −1}, on the unobserved entries (y = 0):

    pseudo-positive  P = s > θ                      (θ = 0.3)
    pseudo-negative  N = the k_neg lowest-s classes, not in P   (k_neg = 0: none)

    ℓ = −log p                                       on y = 1
        β_pos·(0.9·(−log p) + 0.1·(−log(1−p)))       on P
        β_neg·(0.1·(−log p) + 0.9·(−log(1−p)))       on N
        −α·H(p),  H(p) = −p log p − (1−p) log(1−p)   on the other y = 0 (EM, Zhou et al. Eq. 3)
        −log(1−p)                                    on y = −1
    loss = mean over B·C;  plain EM (no P, no N) while the 0-indexed epoch < warmup_epochs.

The logs are exact (softplus of the logits); ``log_eps = 1e-5`` gives the released code's
−log(x + 1e-5) (its ``neg_log``) instead.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ._base import (
    HParam,
    Loss,
    LossInputError,
    LossOutput,
    check_hparam,
    check_inputs,
    hp,
    mean_bc,
    promote,
    register,
)
from ._prior import PriorMixin, rank_desc

__all__ = ["vlpl", "vlpl_pseudo_labels"]

PAPER = ("Xing et al., Vision-Language Pseudo-Labels for Single-Positive Multi-Label Learning, "
         "CVPRW 2024")

_ALPHA = HParam("alpha", 0.1, "weight α of the entropy term on the other unknowns (VOC 0.2, "
                "COCO/NUS 0.1, CUB 0.01)", low=0.0, search=(0.001, 1.0), log=True)
_BETA_POS = HParam("beta_pos", 0.7, "weight β_pos of the pseudo-positive term (0.7)", low=0.0,
                   search=(0.05, 2.0), log=True)
_BETA_NEG = HParam("beta_neg", 0.0, "weight β_neg of the pseudo-negative term (0: the released "
                   "code comments it out)", low=0.0, search=(0.0, 1.0))
_THRESHOLD = HParam("threshold", 0.3, "pseudo-positive where the prior's score s > θ (0.3)",
                    low=0.0, high=1.0, search=(0.05, 0.9))
_K_NEG = HParam("k_neg", 0.0, "pseudo-negatives: the k lowest-scoring classes per image (0: "
                "none, the released default; a fraction counts as the next whole number)",
                low=0.0, search=(0.0, 10.0))
_WARMUP = HParam("warmup_epochs", 0, "epochs of plain EM before the pseudo-labels (0)", kind="int",
                 low=0.0)
_LOG_EPS = HParam("log_eps", 0.0, "ε of −log(x + ε) (0: exact; 1e-5: the released code)",
                  kind="choice", choices=(0.0, 1e-5))
_SPECS = (_ALPHA, _BETA_POS, _BETA_NEG, _THRESHOLD, _K_NEG, _WARMUP, _LOG_EPS)


def vlpl_pseudo_labels(scores: Tensor, observed: Tensor, threshold: float | Tensor = 0.3,
                       k_neg: float | Tensor = 0) -> tuple[Tensor, Tensor]:
    """VLPL's pseudo-labels on the unobserved entries: ``(positive, negative)`` bool masks.

    ``positive``: s > ``threshold`` (a number or ``(T,)`` tensor, then masks are ``(T, B, C)``);
    ``negative``: of the ``k_neg`` lowest-scoring classes of each row (ties: the lower class
    first; a fraction counts as the next whole number, per trial as ``(T,)``), those not
    pseudo-positive. Both only where ``observed == 0``."""
    unknown = observed == 0
    pos = (scores > hp(threshold, scores)) & unknown
    if not _uses(k_neg):
        return pos, torch.zeros_like(pos)
    return pos, (rank_desc(-scores) < hp(k_neg, scores)) & unknown & ~pos


def _uses(k: float | Tensor) -> bool:
    """Whether pseudo-negatives may occur: per-trial counts always (no host read), a number
    when positive."""
    return isinstance(k, Tensor) or k > 0


def _neg_log(log_x: Tensor, x: Tensor, eps: float) -> Tensor:
    """−log x exactly (from ``log_x``), or −log(x + eps) as the released code computes it."""
    return -log_x if eps == 0 else -torch.log(x + eps)


def _vlpl_entries(z: Tensor, y: Tensor, pos: Tensor | None, neg: Tensor | None, alpha, beta_pos,
                  beta_neg, eps: float) -> Tensor:
    p = torch.sigmoid(z)
    lp = _neg_log(F.logsigmoid(z), p, eps)  # −log p
    ln = _neg_log(F.logsigmoid(-z), 1 - p, eps)  # −log(1 − p)
    entropy = p * lp + (1 - p) * ln
    out = torch.where(y == 1, lp, torch.where(y == 0, -alpha * entropy, ln))
    if pos is not None:
        out = torch.where(pos, beta_pos * (0.9 * lp + 0.1 * ln), out)
    if neg is not None:
        out = torch.where(neg, beta_neg * (0.1 * lp + 0.9 * ln), out)
    return out


def vlpl(logits: Tensor, observed: Tensor, scores: Tensor, alpha: float | Tensor = 0.1,
         beta_pos: float | Tensor = 0.7, beta_neg: float | Tensor = 0.0,
         threshold: float | Tensor = 0.3, k_neg: float | Tensor = 0, log_eps: float = 0.0
         ) -> Tensor:
    """VLPL's ``loss_EM_PL`` (module docstring) on a batch: ``scores`` (B, C) are the batch's
    rows of the prior (softmax of CLIP similarities); mean over B·C, ``(T,)`` with a trial
    axis."""
    values = {s.name: check_hparam(s, v, "vlpl") for s, v in (
        (_ALPHA, alpha), (_BETA_POS, beta_pos), (_BETA_NEG, beta_neg), (_THRESHOLD, threshold),
        (_K_NEG, k_neg), (_LOG_EPS, log_eps))}
    z, y = check_inputs(logits, observed, values, loss="vlpl")
    s = _check_scores(scores, y, "vlpl")
    h = {k: hp(v, z) for k, v in values.items()}
    pos, neg = vlpl_pseudo_labels(s, y, values["threshold"], values["k_neg"])
    return mean_bc(_vlpl_entries(z, y, pos, neg if _uses(values["k_neg"]) else None, h["alpha"],
                                 h["beta_pos"], h["beta_neg"], values["log_eps"]))


def _check_scores(scores: Any, y: Tensor, loss: str) -> Tensor:
    if not isinstance(scores, Tensor) or not scores.is_floating_point() or (
            tuple(scores.shape) != tuple(y.shape[-2:])):
        raise LossInputError(
            f"{loss}: 'scores' must be a float tensor of the batch's (B, C) = "
            f"{tuple(y.shape[-2:])} prior scores; got "
            f"{tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__}"
        )
    return scores.to(y.device).float()


@register
class VLPL(PriorMixin, Loss):
    """VLPL (EM + vision-language pseudo-labels from a prior)."""

    name = "vlpl"
    paper = PAPER + " (loss_EM_PL of the released code)"
    formula = (
        "prior s = softmax_c(CLIP sim / 0.01);  on y=0: P = s > θ;  N = k_neg lowest s, not P\n"
        "y=1: −log p;  P: β_pos·(0.9·(−log p) + 0.1·(−log(1−p)));  "
        "N: β_neg·(0.1·(−log p) + 0.9·(−log(1−p)))\n"
        "other y=0: −α·H(p) (EM);  y=−1: −log(1−p);  mean over B·C;  plain EM while "
        "epoch < warmup_epochs"
    )
    hparam_specs = _SPECS
    prior = "class scores (softmax of CLIP image-text similarity, T = 0.01)"
    trial_state = ()
    stateful = True  # reads the train rows' prior: needs setup, set_prior and index=
    presets = {"voc": {"alpha": 0.2}, "coco": {"alpha": 0.1}, "nus": {"alpha": 0.1},
               "cub": {"alpha": 0.01}}
    # main_clip.py: one Adam over the whole network at lr (no head multiplier), batch 8
    train_presets = {ds: {"batch_size": 8, "lr": 1e-4 if ds == "cub" else 1e-5, "epochs": 10}
                     for ds in ("voc", "coco", "nus", "cub")}
    notes = """\
Needs a prior (spml probe --priors NAME): the per-image softmax over classes of CLIP ViT-L/14-336
image-text similarities at temperature 0.01 (VLPL's models.py); any (N, C) score in [0, 1] works.
Pseudo-labels only on unobserved entries; the observed positive keeps −log p. The released code
computes −log(x + 1e-5) (log_eps=1e-5); the default is the exact log (softplus of the logits).
Its pseudo-negative term is commented out (beta_neg = 0, k_neg = 0 by default); k_neg > 0 with
beta_neg > 0 turns it on. warmup_epochs counts 0-indexed epochs (the code's epoch ≤ warmup_epoch
with 1-indexed epochs). Reported (ResNet-50 fine-tuned): VOC 89.10, COCO 71.45, NUS 49.55,
CUB 24.02 mAP."""

    def setup(self, observed: Tensor, n_epochs: int, n_trials: int | None = None) -> None:
        super().setup(observed, n_epochs, n_trials)
        self.register_buffer("observed_train", observed.to(torch.int8), persistent=False)

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        (s,) = self.prior_rows(index)
        h = {n: hp(self.hparam(n), z) for n in ("alpha", "beta_pos", "beta_neg")}
        eps = self.hparam("log_eps")
        if self.epoch < self.hparam("warmup_epochs"):
            return LossOutput(mean_bc(_vlpl_entries(z, observed, None, None, h["alpha"], 0.0, 0.0,
                                                    eps)), {})
        k = self.hparam("k_neg")
        pos, neg = vlpl_pseudo_labels(s, observed, self.hparam("threshold"), k)
        out = _vlpl_entries(z, observed, pos, neg if _uses(k) else None, h["alpha"], h["beta_pos"],
                            h["beta_neg"], eps)
        return LossOutput(mean_bc(out), {})
