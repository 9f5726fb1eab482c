"""AEVLP's GPR loss with DAMP pseudo-labels — Tran et al., ICCV 2025 (released code
Fsoft-AIC/AEVLP: ``losses.GPR_loss``, ``utils.get_pseudo_labels``). DAMP, the loss and the
released code's differences: docs/priors.md and :class:`GPR`'s ``formula``; GR's k̂, v, L1-L3
and schedules come from :mod:`probe.losses.gr_loss`. ``released=True`` is the released code on
every input; the loss object caches DAMP's scores and rankings per train row.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ._base import HParam, register
from ._hparams import LossInputError, LossOutput, check_call, hp, mean_bc, per_trial, promote
from .assume_negative import EXPECTED_POSITIVES, K_SPEC, epr_penalty, expected_k
from .gr_loss import GR, GR_SPECS, Q_TINY, gauss_coef, gr_core
from .prior import PriorMixin, check_scores, rank_desc, rank_dtype, value_with_grad

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
                search=(1.0, 10.0), count=True)
_THRESHOLD = HParam("threshold", 0.5, "DAMP pseudo-positive where s ≥ θ (0.5; NUS 0.6)", low=0.0,
                    high=1.0, search=(0.1, 0.9))
_NEG_RATIO = HParam("neg_ratio", 0.3, "pseudo-negatives: the ⌊ratio·C⌋ lowest classes of "
                    "(g + tile mean)/2 per row (0.3)", low=0.0, high=1.0, search=(0.0, 0.6))
_PSEUDO_NEG = HParam("pseudo_negatives", True, "use the pseudo-negative term (the paper; False: "
                     "the released train.py, whose pseudo-negatives never reach the loss)",
                     kind="bool")
_RELEASED = HParam("released", False, "the released get_pseudo_labels, GPR_loss and train.py "
                   "schedules on every input (False: the paper's rule)", kind="bool")
#: the released code's ε of −log(x + ε) (losses.py LOG_EPSILON)
RELEASED_LOG_EPS = 1e-7
_Q1_GPR = HParam("q1", 0.0, "robustness q1 of L1 on positives (0 = −log p, the released code)",
                 low=0.0)
_SPECS = (*(_Q1_GPR if s.name == "q1" else s for s in GR_SPECS), _LAM1, _LAM2, _RHO, _REG, _ETA,
          _TOP_K, _THRESHOLD, _NEG_RATIO, _PSEUDO_NEG, _RELEASED,
          replace(K_SPEC, doc="expected positives per image of the regulariser (VOC 1.5, COCO 2.9, "
                  "NUS 1.9, CUB 31.4; else the val split's mean label count)"))


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
                      neg_ratio: float | Tensor = 0.0, released: bool = False,
                      ranks: tuple[Tensor | None, Tensor | None] = (None, None)
                      ) -> tuple[Tensor, Tensor]:
    """DAMP's rule: ``(positive, negative)`` bool masks on the unobserved entries.

    ``positive``: among the ``top_k`` highest ``scores`` of the row (ties: the lower class index
    first) and ``scores ≥ threshold``. ``negative``: among the ⌊``neg_ratio``·C⌋ lowest
    ``negative_scores`` (default: ``scores``; ties: the lower class index first) and not
    positive. ``scores`` may carry a trial axis; ``threshold`` / ``neg_ratio`` may be ``(T,)``.
    ``released``: the count is ``int(neg_ratio * C)`` in float64 (Python's), a positive among
    the lowest is dropped, and ``negative`` is all of them (the released code does not use it).
    ``ranks``: ``(rank_desc(scores), rank_desc(-negative_scores))`` when already known.
    """
    unknown = observed == 0
    rank_pos = rank_desc(scores) if ranks[0] is None else ranks[0]
    pos = (rank_pos < hp(top_k, scores)) & (scores >= hp(threshold, scores)) & unknown
    neg_s = scores if negative_scores is None else negative_scores
    rank_neg = rank_desc(-neg_s) if ranks[1] is None else ranks[1]
    ratio = torch.as_tensor(hp(neg_ratio, neg_s), dtype=torch.float64 if released
                            else neg_s.dtype, device=neg_s.device)
    lowest = (rank_neg < torch.floor(ratio * neg_s.shape[-1])) & unknown
    if released:
        return pos & ~lowest, lowest
    return pos, lowest & ~pos


def _gpr_entries(z: Tensor, y: Tensor, gr_parts: Any, pos: Tensor, neg: Tensor | None, lam1,
                 lam2, rho, released: bool = False) -> Tensor:
    """GPR's per-entry terms with autograd (:func:`gpr`, the reference of the registered loss's
    closed form, :func:`_gpr_value_grad`)."""
    rest = torch.lerp(gr_parts.l3, gr_parts.l2, gr_parts.k_hat)
    if released:  # the code's neg_log: −log(x + 1e-7)
        p = torch.sigmoid(z)
        lp, ln = -torch.log(p + RELEASED_LOG_EPS), -torch.log(1 - p + RELEASED_LOG_EPS)
        base = torch.where(y > 0, lp, gr_parts.v * rest)
    else:
        lp, ln = F.softplus(-z), F.softplus(z)  # −log p, −log(1 − p)
        base = torch.where(y > 0, gr_parts.l1, gr_parts.v * rest)
    # 1 − v clipped to [λ2, λ1] in the released code's order (at most λ1, then at least λ2:
    # λ2 wins where λ2 > λ1)
    weight = torch.clamp(1 - gr_parts.v, max=lam1).clamp(min=lam2)
    out = torch.where(pos, weight * (rho * lp + (1 - rho) * ln), base)
    if neg is not None:
        out = torch.where(neg, gr_parts.v * ln, out)
    return out


def _robust_l(log_x: Tensor, x: Tensor, qv) -> tuple[Tensor, Tensor]:
    """(1 − x^q)/q (GR's L, as −expm1(q·log x)/q; q = 0: −log x; q = 1: 1 − x) and x^q."""
    if isinstance(qv, Tensor):
        qv = qv.clamp_min(Q_TINY)
        m1 = torch.expm1(qv * log_x)
        return m1 / -qv, m1 + 1
    if qv < Q_TINY:
        return -log_x, 1.0
    if qv == 1.0:
        return 1 - x, x
    m1 = torch.expm1(qv * log_x)
    return m1 * (-1.0 / qv), m1 + 1


def _gpr_value_grad(z: Tensor, y: Tensor, pos: Tensor, neg: Tensor | None, sched: list, qs: list,
                    use_k: bool, use_v: bool, h: dict, released: bool) -> tuple[Tensor, Tensor]:
    """GPR's loss and its gradient d loss / d z in one pass, without autograd: GR's k̂, v and
    L1-L3 (:mod:`probe.losses.gr_loss`; k̂, v of sg(p), constants) with dL1/dz = −p^q1·(1−p),
    dL2/dz = −p^q2·(1−p), dL3/dz = p·(1−p)^q3, d(−log p)/dz = −(1−p), d(−log(1−p))/dz = p and
    the regulariser's 2·reg·(m − k)·p(1−p)/(C²·B). :func:`gpr` (autograd) is its reference."""
    w, b, mu, sigma = sched
    nz = -z
    p, q = torch.sigmoid(z), torch.sigmoid(nz)
    log_p, log_q = F.logsigmoid(z), F.logsigmoid(nz)
    pq = p * q
    lp, ln, dlp, dln = log_p.neg(), log_q.neg(), q.neg(), p
    x1 = None
    if not isinstance(qs[0], Tensor) and qs[0] < Q_TINY:  # q1 = 0: L1 = −log p
        l1, g1 = lp, dlp
    else:
        l1, x1 = _robust_l(log_p, p, qs[0])
        g1 = -x1 * q
    if released:  # the code's −log(x + 1e-7) on the positives and the pseudo-positives
        lp, ln = -torch.log(p + RELEASED_LOG_EPS), -torch.log(q + RELEASED_LOG_EPS)
        dlp, dln = -pq / (p + RELEASED_LOG_EPS), pq / (q + RELEASED_LOG_EPS)
        l1, g1 = lp, dlp
    same = not isinstance(qs[0], Tensor) and not isinstance(qs[1], Tensor) and qs[0] == qs[1]
    l2, x2 = (l1, x1) if same and x1 is not None and not released else _robust_l(log_p, p,
                                                                                   qs[1])
    l3, x3 = _robust_l(log_q, q, qs[2])
    g2, g3 = q * x2, p * x3
    if isinstance(x2, Tensor):
        g2 = g2.neg_()
    elif not released:
        g2 = dlp
    else:
        g2 = -q
    if use_k:
        k_hat = torch.sigmoid_(p * w + b)
        rest, rest_g = torch.lerp(l3, l2, k_hat), torch.lerp(g3, g2, k_hat)
    else:
        rest, rest_g = l3, g3
    v = (p - mu).square_().mul_(gauss_coef(sigma)).exp_() if use_v else torch.ones_like(p)
    weight = torch.clamp(1 - v, max=h["lam1"]).clamp_(min=h["lam2"])

    def pick(lp: Tensor, ln: Tensor, rest: Tensor, l1: Tensor, l3: Tensor) -> Tensor:
        # linear in its terms: the same choice among their derivatives is the gradient
        out = torch.where(pos, weight * (h["rho"] * lp + (1 - h["rho"]) * ln), v * rest)
        out = out if neg is None else torch.where(neg, v * ln, out)
        return torch.where(y > 0, l1, torch.where(y < 0, l3, out))

    out, grad = pick(lp, ln, rest, l1, l3), pick(dlp, dln, rest_g, g1, g3)
    bsz, c = z.shape[-2:]
    count = p.sum(-1, keepdim=True).mean(-2, keepdim=True)  # (…, 1, 1): m
    gap = count - h["k"]
    value = mean_bc(out) + per_trial(h["reg"] * gap.square() / (c * c)).reshape(out.shape[:-2])
    return value, grad / (bsz * c) + (2.0 / (c * c * bsz)) * h["reg"] * gap * pq


def gpr(logits: Tensor, observed: Tensor, scores: Tensor, *, w: float | Tensor = 10.0,
        b: float | Tensor = -8.0, mu: float | Tensor = 0.8, sigma: float | Tensor = 0.5,
        q1: float = 0.0, q2: float | Tensor = 0.01, q3: float | Tensor = 1.0,
        lam1: float | Tensor = 0.7, lam2: float | Tensor = 0.5, rho: float | Tensor = 0.9,
        reg: float | Tensor = 1e-3, k: float | Tensor = 2.9, top_k: float | Tensor = 3,
        threshold: float | Tensor = 0.5, negative_scores: Tensor | None = None,
        neg_ratio: float | Tensor = 0.3, pseudo_negatives: bool = True, released: bool = False
        ) -> Tensor:
    """GPR (module docstring) at fixed GR parameters (w, b, μ, σ: the current schedule values)
    on a batch: ``scores`` the batch's DAMP scores (B, C) (:func:`damp_scores`),
    ``negative_scores`` those ranking the pseudo-negatives (default ``scores``).
    ``released=True``: the released ``get_pseudo_labels`` and ``GPR_loss`` (module docstring;
    ``pseudo_negatives`` is then False)."""
    specs = {s.name: s for s in _SPECS}
    given = {"w_T": w, "b_T": b, "mu_T": mu, "sigma_T": sigma, "q1": q1, "q2": q2, "q3": q3,
             "lam1": lam1, "lam2": lam2, "rho": rho, "reg": reg, "k": k, "top_k": top_k,
             "threshold": threshold, "neg_ratio": neg_ratio, "pseudo_negatives": pseudo_negatives,
             "released": released}
    z, y, values, h = check_call("gpr", logits, observed, {specs[n]: v for n, v in given.items()})
    s = check_scores(scores, y, "gpr")
    ns = s if negative_scores is None else check_scores(negative_scores, y, "gpr")
    parts = gr_core(z, y, h["w_T"], h["b_T"], h["mu_T"], h["sigma_T"], h["q1"], h["q2"], h["q3"],
                     True, True)
    pos, neg = gpr_pseudo_labels(s, y, values["top_k"], values["threshold"], ns,
                                 values["neg_ratio"], released)
    out = _gpr_entries(z, y, parts, pos, neg if pseudo_negatives and not released else None,
                       h["lam1"], h["lam2"], h["rho"], released)
    return mean_bc(out) + per_trial(h["reg"]) * epr_penalty(torch.sigmoid(z), h["k"])


def _aevlp(beta: tuple, q2q3: tuple, lam: tuple, reg: float, eta: float, threshold: float,
           negative_ratio: float, top_k: int, dataset: str) -> dict[str, float]:
    """One AEVLP config as hyperparameters (alpha = [0.5, 2, 0.8, 0.5] and rho 0.9 in all
    four files)."""
    return {"w_0": float(beta[0]), "w_T": float(beta[1]), "b_0": float(beta[2]),
            "b_T": float(beta[3]), "mu_0": 0.5, "sigma_0": 2.0, "mu_T": 0.8, "sigma_T": 0.5,
            "q2": float(q2q3[0]), "q3": float(q2q3[1]), "lam1": lam[0], "lam2": lam[1],
            "rho": 0.9, "reg": reg, "eta": eta, "threshold": threshold,
            "neg_ratio": negative_ratio, "top_k": float(top_k), "k": EXPECTED_POSITIVES[dataset]}


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
        "loss = mean over B·C + reg·(mean_b Σ_c p − k)²/C²")
    hparam_specs = _SPECS
    prior = "class scores (CLIP global; extras tile_max, tile_min, tile_mean for DAMP)"
    prior_optional = ("tile_max", "tile_min", "tile_mean")
    trial_state = ()  # the prior's caches have no trial axis (per-trial draws: observed_state)
    # per-trial draws: DAMP's scores and the cached pseudo-labels are per trial
    stacks_draws = True
    stacks_seeds = True  # a (T, B) index: the prior's rows are read through prior_rows
    # Fsoft-AIC/AEVLP configs/<dataset>.json field by field (beta = [w_0, w_T, b_0, b_T], alpha =
    # [mu_0, sigma_0, mu_T, sigma_T], q2q3, lam = [lam1, lam2], rho, reg, eta, threshold,
    # negative_ratio) and config.py's _LOOKUP (top_k, expected_num_pos); tests/test_prior_presets.py
    presets = {
        "coco": _aevlp((0, 10, -2, -8), (0.01, 1), (0.7, 0.5), 0.001, 0.3, 0.5, 0.3, 3, "coco"),
        "voc": _aevlp((0, 2, -2, -2), (0.01, 1), (0.7, 0.4), 0.05, 0.0, 0.5, 0.2, 3, "voc"),
        "nus": _aevlp((0, 10, -2, -8), (0.01, 1), (0.7, 0.5), 0.001, 0.3, 0.6, 0.2, 3, "nus"),
        "cub": _aevlp((0, 10, -2, -8), (0.01, 1.5), (0.8, 0.2), 0.01, 0.005, 0.005, 0.2, 32,
                      "cub")}
    # the same files' bsize, lr, num_epochs, lr_mult (the linear head trains at lr × lr_mult)
    train_presets = {
        "coco": {"batch_size": 16, "lr": 1e-5, "epochs": 8, "head_lr_mult": 10},
        "voc": {"batch_size": 8, "lr": 1e-5, "epochs": 8, "head_lr_mult": 10},
        "nus": {"batch_size": 16, "lr": 1e-5, "epochs": 10, "head_lr_mult": 10},
        "cub": {"batch_size": 8, "lr": 1e-5, "epochs": 10, "head_lr_mult": 10}}
    notes = """\
Needs a prior (spml probe --priors NAME). DAMP from raw CLIP scores: store the global scores as
the prior's scores and the per-class max, min (and mean) over the tiles as extras tile_max,
tile_min (tile_mean) -- CLIP ViT-B/16, softmax at T = 0.01, a 4×4 grid (5×5 CUB); without the
tile extras the prior's scores are taken as DAMP's final s. Pseudo-negatives rank
(g + tile_mean)/2 (the prior's scores without tile_mean). The paper's pseudo-negative term is on
by default; the released train.py uses the pseudo-labels whose negatives are 0, so the term never
runs there: pseudo_negatives=False reproduces that. The code's −log(x + 1e-7) is the exact log
here; q1 = 0 (−log p on the observed positive) as in the code. released=True is the released
code on every input: no pseudo-negative term, a pseudo-positive among the int(neg_ratio * C)
lowest dropped, −log(x + 1e-7), train.py's schedules (docs/priors.md lists every difference).
Presets: AEVLP's configs/*.json and config.py, field by field. Ties in top-k rank the lower class
first. w, b, μ, σ follow GR's linear schedules (docs/losses.md "Generalized Robust Loss";
coco β = [w_0, w_T, b_0, b_T] = [0, 10, −2, −8], α = [μ_0, σ_0, μ_T, σ_T] = [0.5, 2, 0.8, 0.5]);
learn_kv is not supported. Reported (ResNet-50 fine-tuned): VOC 90.46, COCO 73.54, NUS 50.70,
CUB 24.89 mAP."""

    def __init__(self, **hparams: Any) -> None:
        super().__init__(**hparams)
        if self.hparam("learn_kv"):
            raise LossInputError("gpr: learn_kv=True is not supported (AEVLP schedules w, b, "
                                 "mu, sigma as GR does); drop it")

    def _fractions(self) -> dict[str, float]:
        """released: train.py's, at 1-indexed epoch e of E: w, b at (e − 1)/E, μ, σ at e/E (never
        quite w_T, b_T); else GR's."""
        if not self.hparam("released"):
            return super()._fractions()
        e, n = self.epoch, self.n_epochs
        return {"w": e / n, "b": e / n, "mu": (e + 1) / n, "sigma": (e + 1) / n}

    def prior_ready(self) -> None:
        """Once per train row: DAMP's scores s (a fixed η) and its ranking, and the ranking of
        the pseudo-negative scores -- what depends only on the prior and the observed labels."""
        tiles = self.has_prior("tile_max")
        if tiles != self.has_prior("tile_min"):
            raise LossInputError("gpr: DAMP needs both extras tile_max and tile_min (or "
                                 "neither: the scores are then DAMP's final scores)")
        g = self.prior_scores
        neg = (g + self.prior_tile_mean) / 2 if self.has_prior("tile_mean") else g
        dtype = rank_dtype(g.shape[-1])
        self.register_buffer("prior_rank_neg", rank_desc(-neg).to(dtype), persistent=False)
        self.prior_mode = "DAMP (tile_max, tile_min)" if tiles else "scores as DAMP's s"
        self._coded = False  # set_hparam runs this again: the caches follow η's kind
        self._damp_cached = not tiles or not isinstance(self.hparam("eta"), Tensor)
        if self._damp_cached:
            # (N, C); (T, N, C) with tiles on per-trial draws (η's gate reads the observed)
            s = self._damp(g, self.observed_train, None)
            per_draw = s.ndim == 3
            self.observed_state("prior_damp", s.contiguous(), self.observed_train, per_draw)
            self.observed_state("prior_rank_pos", rank_desc(s).to(dtype), self.observed_train,
                                per_draw)
            fixed = [self.hparam(n) for n in ("top_k", "threshold", "neg_ratio")]
            if not any(isinstance(v, Tensor) for v in fixed):
                # every rule parameter fixed: each entry's pseudo-label as one int8 code
                pos, neg = gpr_pseudo_labels(s, self.observed_train, *fixed[:2], None, fixed[2],
                                             self.hparam("released"),
                                             (self.prior_rank_pos, self.prior_rank_neg))
                code = pos.to(torch.int8) + 2 * neg.to(torch.int8)  # per draw: (T, N, C)
                self.observed_state("prior_code", code, self.observed_train)
                self._coded = True

    def _damp(self, g: Tensor, observed: Tensor, index: Tensor | None) -> Tensor:
        """DAMP's s of the train rows (``index`` None) or a batch's; ``g`` without tile extras."""
        if not self.has_prior("tile_max"):
            return g
        tmax, tmin = ((self.prior_tile_max, self.prior_tile_min) if index is None
                      else self.prior_rows(index, ("tile_max", "tile_min")))
        return damp_scores(g, tmax, tmin, observed, self.hparam("eta"))

    def _pseudo_labels(self, observed: Tensor, index: Tensor | None, released: bool
                       ) -> tuple[Tensor, Tensor]:
        """DAMP's masks of the batch from the cached ranks (a per-trial top_k, θ or neg_ratio)
        or, with a per-trial η, from DAMP's scores ranked per batch."""
        if getattr(self, "_damp_cached", False):
            s, rank_pos, rank_neg = self.prior_rows(index, ("damp", "rank_pos", "rank_neg"))
        else:
            g, rank_neg = self.prior_rows(index, ("scores", "rank_neg"))
            s, rank_pos = self._damp(g, observed, index), None
        return gpr_pseudo_labels(s, observed, self.hparam("top_k"), self.hparam("threshold"),
                                 None, self.hparam("neg_ratio"), released, (rank_pos, rank_neg))

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        released = self.hparam("released")
        if getattr(self, "_coded", False):  # the train rows' pseudo-labels, computed once
            (code,) = self.prior_rows(index, ("code",))
            pos, neg = code == 1, code == 2
        else:
            pos, neg = self._pseudo_labels(observed, index, released)
        expected_k(self)
        h = {n: hp(self.hparam(n), z) for n in ("lam1", "lam2", "rho", "reg", "k")}
        neg = neg if self.hparam("pseudo_negatives") and not released else None
        with torch.no_grad():  # the value, and its gradient in closed form (value_with_grad)
            value, grad = _gpr_value_grad(z.detach(), observed, pos, neg, self._current(z),
                                          self._qs(z), self.hparam("use_k"), self.hparam("use_v"),
                                          h, released)
        return LossOutput(value_with_grad(z, value, grad), {})
