"""VLPL — Xing et al., "Vision-Language Pseudo-Labels for Single-Positive Multi-Label Learning",
CVPRW 2024 (released code mvrl/VLPL, ``loss_EM_PL``). The prior, the loss and the released
code's differences: docs/priors.md and :class:`VLPL`'s ``formula``. The logs are exact
(softplus of the logits); ``log_eps = 1e-5`` gives the released code's −log(x + 1e-5).
``released=True`` is the released ``loss_EM_PL`` on every input, and the loss object ranks each
train row's prior once (:meth:`VLPL.prior_ready`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._base import register
from ._hparams import HParam, LossOutput, check_call, hp, mean_bc, promote
from .prior import PriorMixin, check_scores, rank_desc, rank_dtype, value_with_grad

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
                low=0.0, search=(0.0, 10.0), count=True)
_WARMUP = HParam("warmup_epochs", 0, "epochs of plain EM before the pseudo-labels (0)", kind="int",
                 low=0.0)
_LOG_EPS = HParam("log_eps", 0.0, "ε of −log(x + ε) (0: exact; 1e-5: the released code)",
                  kind="choice", choices=(0.0, 1e-5))
_RELEASED = HParam("released", False, "the released loss_EM_PL on every input: −log(x + 1e-5) "
                   "and a pseudo-negative wins over a pseudo-positive (False: the paper's rule)",
                   kind="bool")
_SPECS = (_ALPHA, _BETA_POS, _BETA_NEG, _THRESHOLD, _K_NEG, _WARMUP, _LOG_EPS, _RELEASED)
#: the released code's ε of −log(x + ε) (losses.py LOG_EPSILON)
RELEASED_LOG_EPS = 1e-5


def vlpl_pseudo_labels(scores: Tensor, observed: Tensor, threshold: float | Tensor = 0.3,
                       k_neg: float | Tensor = 0, released: bool = False,
                       rank_asc: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """VLPL's pseudo-labels on the unobserved entries: ``(positive, negative)`` bool masks.

    ``positive``: s > ``threshold`` (a number or ``(T,)`` tensor, then masks are ``(T, B, C)``);
    ``negative``: of the ``k_neg`` lowest-scoring classes of each row (ties: the lower class
    first; a fraction counts as the next whole number, per trial as ``(T,)``), those not
    pseudo-positive (``released``: all of them, and they are not positive). Both only where
    ``observed == 0``. ``rank_asc``: ``rank_desc(-scores)`` when already known."""
    unknown = observed == 0
    pos = (scores > hp(threshold, scores)) & unknown
    if not _uses(k_neg):
        return pos, torch.zeros_like(pos)
    rank = rank_desc(-scores) if rank_asc is None else rank_asc
    lowest = (rank < hp(k_neg, scores)) & unknown
    if released:
        return pos & ~lowest, lowest
    return pos, lowest & ~pos


def _uses(k: float | Tensor) -> bool:
    """Whether pseudo-negatives may occur: per-trial counts always (no host read), a number
    when positive."""
    return isinstance(k, Tensor) or k > 0


def _vlpl_pick(y: Tensor, pos: Tensor | None, neg: Tensor | None, lp: Tensor, ln: Tensor,
               entropy: Tensor, alpha, beta_pos, beta_neg) -> Tensor:
    """Each entry's term from −log p, −log(1 − p) and H (linear in them: from their derivatives
    the same choice gives the gradient)."""
    out = torch.where(y == 1, lp, torch.where(y == 0, -alpha * entropy, ln))
    if pos is not None:
        out = torch.where(pos, beta_pos * (0.9 * lp + 0.1 * ln), out)
    if neg is not None:
        out = torch.where(neg, beta_neg * (0.1 * lp + 0.9 * ln), out)
    return out


def _vlpl_entries(z: Tensor, y: Tensor, pos: Tensor | None, neg: Tensor | None, alpha, beta_pos,
                  beta_neg, eps: float) -> Tensor:
    p = torch.sigmoid(z)
    if eps == 0:  # −log p, −log(1 − p) exactly, as EM's
        lp, ln = F.softplus(-z), F.softplus(z)
    else:
        lp, ln = -torch.log(p + eps), -torch.log(1 - p + eps)
    return _vlpl_pick(y, pos, neg, lp, ln, p * lp + (1 - p) * ln, alpha, beta_pos, beta_neg)


def _vlpl_value(z: Tensor, y: Tensor, pos: Tensor | None, neg: Tensor | None, alpha, beta_pos,
                beta_neg, eps: float) -> Tensor:
    """:func:`_vlpl_entries`' mean over B·C and its gradient in one pass without autograd
    (value_with_grad; the pure :func:`vlpl` is its reference): with lp = −log(p + ε), ln =
    −log(1 − p + ε), dlp = −p(1−p)/(p + ε), dln = p(1−p)/(1 − p + ε) and H = p·lp + (1−p)·ln,
    dH = p(1−p)(lp − ln) + p·dlp + (1−p)·dln (ε = 0: dlp = −(1−p), dln = p)."""
    with torch.no_grad():
        p, q = torch.sigmoid(z), torch.sigmoid(-z)
        pq = p * q
        if eps == 0:
            lp, ln = F.softplus(-z), F.softplus(z)
            dlp, dln = q.neg(), p
        else:
            lp, ln = -torch.log(p + eps), -torch.log(q + eps)
            dlp, dln = -pq / (p + eps), pq / (q + eps)
        out = _vlpl_pick(y, pos, neg, lp, ln, p * lp + q * ln, alpha, beta_pos, beta_neg)
        grad = _vlpl_pick(y, pos, neg, dlp, dln, pq * (lp - ln) + p * dlp + q * dln, alpha,
                          beta_pos, beta_neg)
    return value_with_grad(z, mean_bc(out), grad / (z.shape[-1] * z.shape[-2]))


def vlpl(logits: Tensor, observed: Tensor, scores: Tensor, alpha: float | Tensor = 0.1,
         beta_pos: float | Tensor = 0.7, beta_neg: float | Tensor = 0.0,
         threshold: float | Tensor = 0.3, k_neg: float | Tensor = 0, log_eps: float = 0.0,
         released: bool = False) -> Tensor:
    """VLPL's ``loss_EM_PL`` (module docstring) on a batch: ``scores`` (B, C) are the batch's
    rows of the prior (softmax of CLIP similarities); mean over B·C, ``(T,)`` with a trial
    axis. ``released=True``: the released code on every input (module docstring)."""
    z, y, values, h = check_call("vlpl", logits, observed, {
        _ALPHA: alpha, _BETA_POS: beta_pos, _BETA_NEG: beta_neg, _THRESHOLD: threshold,
        _K_NEG: k_neg, _LOG_EPS: log_eps, _RELEASED: released})
    s = check_scores(scores, y, "vlpl")
    pos, neg = vlpl_pseudo_labels(s, y, values["threshold"], values["k_neg"], released)
    eps = RELEASED_LOG_EPS if released else values["log_eps"]
    return mean_bc(_vlpl_entries(z, y, pos, neg if _uses(values["k_neg"]) else None, h["alpha"],
                                 h["beta_pos"], h["beta_neg"], eps))


@register
class VLPL(PriorMixin):
    """VLPL (EM + vision-language pseudo-labels from a prior)."""

    name = "vlpl"
    paper = PAPER + " (loss_EM_PL of the released code)"
    formula = (
        "prior s = softmax_c(CLIP sim / 0.01);  on y=0: P = s > θ;  N = k_neg lowest s, not P\n"
        "y=1: −log p;  P: β_pos·(0.9·(−log p) + 0.1·(−log(1−p)));  "
        "N: β_neg·(0.1·(−log p) + 0.9·(−log(1−p)))\n"
        "other y=0: −α·H(p) (EM);  y=−1: −log(1−p);  mean over B·C;  plain EM while "
        "epoch < warmup_epochs")
    hparam_specs = _SPECS
    prior = "class scores (softmax of CLIP image-text similarity, T = 0.01)"
    # per-trial draws: the cached pseudo-labels are per trial (only unobserved entries get one)
    stacks_draws = True
    stacks_seeds = True  # a (T, B) index: the prior's rows are read through prior_rows
    # mvrl/VLPL main_clip.py, per dataset (P['alpha'], P['beta_pos'], P['beta_neg'],
    # P['warmup_epoch']; the CLI defaults --threshold 0.3, --partial 0.0 -> no pseudo-negatives)
    presets = {ds: {"alpha": alpha, "beta_pos": 0.7, "beta_neg": 0.0, "threshold": 0.3,
                    "k_neg": 0.0, "warmup_epochs": 0}
               for ds, alpha in (("voc", 0.2), ("coco", 0.1), ("nus", 0.1), ("cub", 0.01))}
    # main_clip.py: P['bsize'] 8, P['lr'] 1e-5 (CUB 1e-4), P['num_epochs'] 10; one Adam over the
    # whole network at lr (no head multiplier)
    train_presets = {ds: {"batch_size": 8, "lr": 1e-4 if ds == "cub" else 1e-5, "epochs": 10}
                     for ds in ("voc", "coco", "nus", "cub")}
    notes = """\
Needs a prior (spml probe --priors NAME): the per-image softmax over classes of CLIP ViT-L/14-336
image-text similarities at temperature 0.01 (VLPL's models.py); any (N, C) score in [0, 1] works.
Pseudo-labels only on unobserved entries; the observed positive keeps −log p. The released code
computes −log(x + 1e-5) (log_eps=1e-5); the default is the exact log (softplus of the logits).
released=True is the released code on every input (−log(x + 1e-5), and its scatter_ order: a
class among the k_neg lowest is a pseudo-negative even where its score passes θ).
Its pseudo-negative term is commented out (beta_neg = 0, k_neg = 0 by default); k_neg > 0 with
beta_neg > 0 turns it on. warmup_epochs counts 0-indexed epochs (the code's epoch ≤ warmup_epoch
with 1-indexed epochs). Reported (ResNet-50 fine-tuned): VOC 89.10, COCO 71.45, NUS 49.55,
CUB 24.02 mAP."""

    def prior_ready(self) -> None:
        """Once per train row: its classes ranked by increasing score (the k_neg test), and
        with θ and k_neg fixed (numbers, not per trial) its pseudo-labels as one int8 code."""
        s = self.prior_scores
        self.register_buffer("prior_rank_asc", rank_desc(-s).to(rank_dtype(s.shape[-1])),
                             persistent=False)
        threshold, k = self.hparam("threshold"), self.hparam("k_neg")
        self._coded = not isinstance(threshold, Tensor) and not isinstance(k, Tensor)
        if self._coded:
            pos, neg = vlpl_pseudo_labels(s, self.observed_train, threshold, k,
                                          self.hparam("released"), self.prior_rank_asc)
            # (N, C), or (T, N, C) from per-trial draws
            self.observed_state("prior_code", pos.to(torch.int8) + 2 * neg.to(torch.int8),
                                self.observed_train)

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        k, released = self.hparam("k_neg"), self.hparam("released")
        if self.epoch < self.hparam("warmup_epochs"):  # plain EM
            pos = neg = None
        elif getattr(self, "_coded", False):  # the train rows' pseudo-labels, computed once
            (code,) = self.prior_rows(index, ("code",))
            pos, neg = code == 1, code == 2
        else:
            s, rank = (self.prior_rows(index, ("scores", "rank_asc")) if _uses(k)
                       else [*self.prior_rows(index), None])
            pos, neg = vlpl_pseudo_labels(s, observed, self.hparam("threshold"), k, released,
                                          rank)
        weights = [hp(self.hparam(n), z) for n in ("alpha", "beta_pos", "beta_neg")]
        eps = RELEASED_LOG_EPS if released else self.hparam("log_eps")
        return LossOutput(_vlpl_value(z, observed, pos, neg if _uses(k) else None, *weights, eps),
                          {})
