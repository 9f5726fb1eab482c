"""AEVLP's GPR loss with DAMP pseudo-labels — Tran et al., ICCV 2025 (released code
Fsoft-AIC/AEVLP: ``losses.GPR_loss``, ``utils.get_pseudo_labels``; docs/priors.md).

DAMP (pseudo-labels from CLIP on the whole image and a grid of tiles; per image i, class c):
``g`` the global score, ``a``/``β`` the max/min over tiles, η_i = min(g[i, observed class], η):

    s = (g + (a if a > η_i else β)) / 2
    pseudo-positive  P = c among the top_k of s in its row and s ≥ θ        (on y = 0)
    pseudo-negative  N = c among the ⌊neg_ratio·C⌋ lowest of (g + mean over tiles)/2, not P

GPR (GR's k̂ = σ(w·sg(p) + b), v = exp(−(sg(p) − μ)²/2σ²) and L1-L3 with GR's linear schedules,
:mod:`probe.losses.gr_loss`), p = σ(z):

    ℓ = L1 (q1 = 0: −log p)                              on y = 1
        clip(1 − v, λ2, λ1)·[ρ(−log p) + (1−ρ)(−log(1−p))]  on P
        v·(−log(1−p))                                      on N
        v·[k̂·L2 + (1−k̂)·L3]                               on the other y = 0 (GR)
        L3                                                 on y = −1 (GR)
    loss = mean over B·C + reg·(mean over the batch of Σ_c p − k)² / C²

k is the expected number of positives per image (Cole et al.'s values; the val split's mean label
count elsewhere), as EPR's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ._base import (
    HParam,
    LossInputError,
    LossOutput,
    check_hparam,
    check_inputs,
    hp,
    mean_bc,
    per_trial,
    promote,
    register,
)
from ._prior import PriorMixin, rank_desc
from .assume_negative import _K, EXPECTED_POSITIVES
from .gr_loss import _Q_NOT_ROBUST, GR, _gr_core
from .gr_loss import _SPECS as _GR_SPECS

__all__ = ["damp_scores", "gpr", "gpr_pseudo_labels"]

PAPER = ("Tran et al., AEVLP: GPR loss with DAMP pseudo-labels for single-positive multi-label "
         "learning, ICCV 2025")

_LAM1 = HParam("lam1", 0.7, "upper bound λ1 of a pseudo-positive's weight 1 − v (0.7)", low=0.0,
               high=1.0, search=(0.5, 1.0))
_LAM2 = HParam("lam2", 0.5, "lower bound λ2 of a pseudo-positive's weight 1 − v (0.5; λ2 > λ1 "
               "gives λ2)", low=0.0, high=1.0, search=(0.0, 0.5))
_RHO = HParam("rho", 0.9, "ρ: a pseudo-positive's share of −log p against −log(1−p) (0.9)",
              low=0.0, high=1.0, search=(0.5, 1.0))
_REG = HParam("reg", 1e-3, "weight of the expected-positives regulariser (COCO 1e-3, VOC 0.05)",
              low=0.0, search=(1e-4, 0.1), log=True)
_ETA = HParam("eta", 0.3, "DAMP's gate η: a tile's max counts where it beats min(g[observed], η) "
              "(0.3)", low=0.0, high=1.0, search=(0.05, 0.9))
_TOP_K = HParam("top_k", 3.0, "DAMP pseudo-positives among the top k of each row (3; CUB 32; "
                "a fraction counts as the next whole number)", low=0.0, low_open=True,
                search=(1.0, 10.0))
_THRESHOLD = HParam("threshold", 0.5, "DAMP pseudo-positive where s ≥ θ (0.5; NUS 0.6)", low=0.0,
                    high=1.0, search=(0.1, 0.9))
_NEG_RATIO = HParam("neg_ratio", 0.3, "pseudo-negatives: the ⌊ratio·C⌋ lowest classes of "
                    "(g + tile mean)/2 per row (0.3)", low=0.0, high=1.0, search=(0.0, 0.6))
_PSEUDO_NEG = HParam("pseudo_negatives", True, "use the pseudo-negative term (the paper; False: "
                     "the released train.py, whose pseudo-negatives never reach the loss)",
                     kind="bool")
_Q1_GPR = HParam("q1", 0.0, "robustness q1 of L1 on positives (0 = −log p, the released code)",
                 low=0.0)
_SPECS = (*(_Q1_GPR if s.name == "q1" else s for s in _GR_SPECS), _LAM1, _LAM2, _RHO, _REG, _ETA,
          _TOP_K, _THRESHOLD, _NEG_RATIO, _PSEUDO_NEG,
          replace(_K, doc="expected positives per image of the regulariser (VOC 1.5, COCO 2.9, "
                  "NUS 1.9, CUB 31.4; else the val split's mean label count)"))


# ----------------------------------------------------------------------------- pseudo-labels
def damp_scores(global_scores: Tensor, tile_max: Tensor, tile_min: Tensor, observed: Tensor,
                eta: float | Tensor = 0.3) -> Tensor:
    """DAMP's score per (image, class) from CLIP's global and tile scores (module docstring):
    ``(g + (a if a > η_i else β)) / 2`` with η_i = min(g at the image's observed positive, η)
    (no observed positive: g counts 0 there, as in the released code). ``eta`` a number or a
    ``(T,)`` tensor (then the result is ``(T, B, C)``)."""
    g = global_scores
    observed_score = torch.where(observed == 1, g, torch.zeros_like(g)).amax(-1, keepdim=True)
    gate = torch.minimum(observed_score, torch.as_tensor(hp(eta, g), dtype=g.dtype,
                                                         device=g.device))
    return (g + torch.where(tile_max > gate, tile_max, tile_min)) / 2


def gpr_pseudo_labels(scores: Tensor, observed: Tensor, top_k: float | Tensor = 3,
                      threshold: float | Tensor = 0.5, negative_scores: Tensor | None = None,
                      neg_ratio: float | Tensor = 0.0) -> tuple[Tensor, Tensor]:
    """DAMP's rule: ``(positive, negative)`` bool masks on the unobserved entries.

    ``positive``: among the ``top_k`` highest ``scores`` of the row (ties: the lower class index
    first) and ``scores ≥ threshold``. ``negative``: among the ⌊``neg_ratio``·C⌋ lowest
    ``negative_scores`` (default: ``scores``; ties: the lower class index first) and not
    positive. ``scores`` may carry a trial axis; ``threshold`` / ``neg_ratio`` may be ``(T,)``.
    """
    unknown = observed == 0
    pos = (rank_desc(scores) < hp(top_k, scores)) & (scores >= hp(threshold, scores)) & unknown
    neg_s = scores if negative_scores is None else negative_scores
    n_neg = torch.floor(torch.as_tensor(hp(neg_ratio, neg_s), dtype=neg_s.dtype,
                                        device=neg_s.device) * neg_s.shape[-1])
    neg = (rank_desc(-neg_s) < n_neg) & unknown & ~pos
    return pos, neg


# ----------------------------------------------------------------------------- loss core
def _gpr_entries(z: Tensor, y: Tensor, gr_parts: Any, use_k: bool, pos: Tensor,
                 neg: Tensor | None, lam1, lam2, rho) -> Tensor:
    rest = torch.lerp(gr_parts.l3, gr_parts.l2, gr_parts.k_hat) if use_k else gr_parts.l3
    base = torch.where(y > 0, gr_parts.l1, gr_parts.v * rest)
    lp, ln = F.softplus(-z), F.softplus(z)  # −log p, −log(1 − p)
    # 1 − v clipped to [λ2, λ1] in the released code's order (at most λ1, then at least λ2:
    # λ2 wins where λ2 > λ1)
    weight = torch.where(1 - gr_parts.v > lam1, lam1, 1 - gr_parts.v)
    weight = torch.where(weight < lam2, lam2, weight)
    out = torch.where(pos, weight * (rho * lp + (1 - rho) * ln), base)
    if neg is not None:
        out = torch.where(neg, gr_parts.v * ln, out)
    return out


def _expected_positives(z: Tensor, k, reg) -> Tensor:
    count = torch.sigmoid(z).sum(-1).mean(-1)  # (T,) or ()
    return per_trial(reg) * (count - per_trial(k)).square() / z.shape[-1] ** 2


def gpr(logits: Tensor, observed: Tensor, scores: Tensor, *, w: float | Tensor = 10.0,
        b: float | Tensor = -8.0, mu: float | Tensor = 0.8, sigma: float | Tensor = 0.5,
        q1: float = 0.0, q2: float | Tensor = 0.01, q3: float | Tensor = 1.0,
        lam1: float | Tensor = 0.7, lam2: float | Tensor = 0.5, rho: float | Tensor = 0.9,
        reg: float | Tensor = 1e-3, k: float | Tensor = 2.9, top_k: float | Tensor = 3,
        threshold: float | Tensor = 0.5, negative_scores: Tensor | None = None,
        neg_ratio: float | Tensor = 0.3, pseudo_negatives: bool = True) -> Tensor:
    """GPR (module docstring) at fixed GR parameters (w, b, μ, σ: the current schedule values)
    on a batch: ``scores`` the batch's DAMP scores (B, C) (:func:`damp_scores`),
    ``negative_scores`` those ranking the pseudo-negatives (default ``scores``)."""
    specs = {s.name: s for s in _SPECS}
    given = {"w_T": w, "b_T": b, "mu_T": mu, "sigma_T": sigma, "q1": q1, "q2": q2, "q3": q3,
             "lam1": lam1, "lam2": lam2, "rho": rho, "reg": reg, "k": k, "top_k": top_k,
             "threshold": threshold, "neg_ratio": neg_ratio, "pseudo_negatives": pseudo_negatives}
    values = {n: check_hparam(specs[n], v, "gpr") for n, v in given.items()}
    z, y = check_inputs(logits, observed, values, loss="gpr")
    from .vlpl import _check_scores

    s = _check_scores(scores, y, "gpr")
    ns = s if negative_scores is None else _check_scores(negative_scores, y, "gpr")
    h = {n: hp(v, z) for n, v in values.items()}
    parts = _gr_core(z, y, h["w_T"], h["b_T"], h["mu_T"], h["sigma_T"], h["q1"], h["q2"], h["q3"],
                     True, True)
    pos, neg = gpr_pseudo_labels(s, y, values["top_k"], values["threshold"], ns,
                                 values["neg_ratio"])
    out = _gpr_entries(z, y, parts, True, pos, neg if pseudo_negatives else None, h["lam1"],
                       h["lam2"], h["rho"])
    return mean_bc(out) + _expected_positives(z, h["k"], h["reg"])


# ----------------------------------------------------------------------------- registered object
@register
class GPR(PriorMixin, GR):
    """GPR loss (GR's schedules and terms on the unknowns) with DAMP pseudo-labels."""

    name = "gpr"
    paper = PAPER + " (GPR_loss, get_pseudo_labels of the released code)"
    formula = (
        "DAMP: s = (g + (max_tiles if max_tiles > min(g[obs], η) else min_tiles))/2;  "
        "P = top_k of s with s ≥ θ;  N = ⌊neg_ratio·C⌋ lowest (g + mean_tiles)/2\n"
        "y=1: L1;  P: clip(1−v, λ2, λ1)·[ρ(−log p) + (1−ρ)(−log(1−p))];  N: v·(−log(1−p))\n"
        "other y=0: v·[k̂·L2 + (1−k̂)·L3] (GR, its schedules);  y=−1: L3\n"
        "loss = mean over B·C + reg·(mean_b Σ_c p − k)²/C²"
    )
    hparam_specs = _SPECS
    prior = "class scores (CLIP global; extras tile_max, tile_min, tile_mean for DAMP)"
    prior_optional = ("tile_max", "tile_min", "tile_mean")
    trial_state = ()
    stateful = True  # reads the train rows' prior: needs setup, set_prior and index=
    _GR_COCO = {"w_T": 10.0, "b_T": -8.0, "mu_T": 0.8, "sigma_T": 0.5, "q2": 0.01, "q3": 1.0,
                "lam1": 0.7, "lam2": 0.5, "rho": 0.9, "reg": 1e-3, "eta": 0.3, "threshold": 0.5,
                "top_k": 3.0, "neg_ratio": 0.3}
    presets = {
        "coco": {**_GR_COCO, "k": EXPECTED_POSITIVES["coco"]},
        "voc": {**_GR_COCO, "w_T": 2.0, "b_T": -2.0, "reg": 0.05, "k": EXPECTED_POSITIVES["voc"]},
        "nus": {**_GR_COCO, "threshold": 0.6, "k": EXPECTED_POSITIVES["nus"]},
        "cub": {**_GR_COCO, "q3": 1.5, "top_k": 32.0, "k": EXPECTED_POSITIVES["cub"]},
    }
    train_presets = GR.train_presets  # AEVLP's configs are GR's (lr_mult 10 on the head)
    notes = """\
Needs a prior (spml probe --priors NAME). DAMP from raw CLIP scores: store the global scores as
the prior's scores and the per-class max, min (and mean) over the tiles as extras tile_max,
tile_min (tile_mean) -- CLIP ViT-B/16, softmax at T = 0.01, a 4×4 grid (5×5 CUB); without the
tile extras the prior's scores are taken as DAMP's final s. Pseudo-negatives rank
(g + tile_mean)/2 (the prior's scores without tile_mean). The paper's pseudo-negative term is on
by default; the released train.py uses the pseudo-labels whose negatives are 0, so the term never
runs there: pseudo_negatives=False reproduces that. The code's −log(x + 1e-7) is the exact log
here; q1 = 0 (−log p on the observed positive) as in the code. Ties in top-k rank the lower class
first. w, b, μ, σ follow GR's linear schedules (docs/losses.md "Generalized Robust Loss";
coco β = [w_0, w_T, b_0, b_T] = [0, 10, −2, −8], α = [μ_0, σ_0, μ_T, σ_T] = [0.5, 2, 0.8, 0.5]);
learn_kv is not supported. Reported (ResNet-50 fine-tuned): VOC 90.46, COCO 73.54, NUS 50.70,
CUB 24.89 mAP."""

    def __init__(self, **hparams: Any) -> None:
        super().__init__(**hparams)
        if self.hparam("learn_kv"):
            raise LossInputError("gpr: learn_kv=True is not supported (AEVLP schedules w, b, "
                                 "mu, sigma as GR does); drop it")

    def setup(self, observed: Tensor, n_epochs: int, n_trials: int | None = None) -> None:
        super().setup(observed, n_epochs, n_trials)
        self.register_buffer("observed_train", observed.to(torch.int8), persistent=False)

    def prior_ready(self) -> None:
        if self.has_prior("tile_max") != self.has_prior("tile_min"):
            raise LossInputError("gpr: DAMP needs both extras tile_max and tile_min (or "
                                 "neither: the scores are then DAMP's final scores)")
        g = self.prior_scores
        neg = (g + self.prior_tile_mean) / 2 if self.has_prior("tile_mean") else g
        self.register_buffer("prior_negative", neg.contiguous(), persistent=False)

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        damp = self.has_prior("tile_max")
        keys = ("scores", "negative", "tile_max", "tile_min") if damp else ("scores", "negative")
        rows = self.prior_rows(index, keys)
        s = damp_scores(rows[0], rows[2], rows[3], observed, self.hparam("eta")) if damp \
            else rows[0]
        w, b, mu, sigma = self._current(z)
        if self.hparam("robust"):
            qs = [hp(self.hparam(q), z) for q in ("q1", "q2", "q3")]
        else:
            qs = [_Q_NOT_ROBUST] * 3
        use_k = self.hparam("use_k")
        parts = _gr_core(z, observed, w, b, mu, sigma, *qs, use_k, self.hparam("use_v"))
        pos, neg = gpr_pseudo_labels(s, observed, self.hparam("top_k"), self.hparam("threshold"),
                                     rows[1], self.hparam("neg_ratio"))
        if self.hparam("k") is None:
            raise LossInputError("gpr: hyperparameter 'k' (expected positives per image) is not "
                                 "set; pass k=… or let the trainer fill it from the dataset")
        h = {n: hp(self.hparam(n), z) for n in ("lam1", "lam2", "rho", "reg", "k")}
        out = _gpr_entries(z, observed, parts, use_k, pos,
                           neg if self.hparam("pseudo_negatives") else None, h["lam1"], h["lam2"],
                           h["rho"])
        return LossOutput(mean_bc(out) + _expected_positives(z, h["k"], h["reg"]), {})
