"""The multi-label-learning metrics of the tabular SPML benchmark (SMILE, NeurIPS 2022; CRISP,
NeurIPS 2025; Zhang & Zhou's review), beside mAP: ranking loss, one-error, coverage,
example-based average precision, Hamming loss and macro-averaged AUC.

Each is defined as palm-ml/smile's ``metrics.py`` computes it (``tests/test_mll_metrics.py``
checks equality with a transcription of that code, ties included, and with scikit-learn where
the two coincide):

* **ranking loss** (lower is better): over the rows with at least one positive and one
  negative label, the fraction of (positive, negative) pairs ranked wrongly; averaged over
  those rows (scikit-learn's ``label_ranking_loss`` counts the other rows as 0 instead);
* **one-error** (lower): the fraction of rows whose top-scored class is not a positive (a row
  without positives always errs);
* **coverage** (lower): how far down the ranking one must go to cover every positive, averaged
  over all rows (0 for a row without positives), minus one, divided by the number of classes
  C -- SMILE's normalisation; with every row labelled it is ``(coverage_error - 1) / C``;
* **average precision** (higher; example-based, not mAP): per row, the mean over its positives
  of the fraction of positives ranked at or above it; averaged over rows with a positive
  (scikit-learn's ``label_ranking_average_precision_score`` when there are no ties);
* **Hamming loss** (lower): the fraction of (row, class) entries predicted wrongly at a
  threshold on the probability -- 0.5 as the papers, or one tuned on val
  (:func:`tuned_threshold`);
* **macro AUC** (higher): the ROC AUC of each class with both kinds of rows, averaged.

Ties are broken as SMILE's code breaks them: by class (or row) index, a stable sort. Scores are
logits or probabilities (every metric but Hamming depends only on their order). Values are
fractions in [0, 1], as the papers report them; NaN where a metric has nothing to measure.

One torch implementation, batched over heads: :func:`mll_metrics_stacked` and
:func:`tuned_thresholds` take the scores of T heads ``(T, N, C)`` (any float dtype, on any
device) with the labels ``(N, C)`` they share and return ``(T,)`` float64 tensors on that
device; the single-head functions (:func:`ranking_loss` … :func:`mll_metrics`) take numpy
arrays or tensors ``(N, C)`` and return python floats, as the same computation with T = 1.
Memory: a few ``(T, N, C)`` int64 / float64 intermediates, so callers block over heads.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from probe.metrics import MetricInputError

__all__ = ["MLL_METRICS", "average_precision", "coverage", "hamming_loss", "macro_auc",
           "mll_metrics", "mll_metrics_stacked", "one_error", "probabilities", "ranking_loss",
           "tuned_threshold", "tuned_thresholds"]

#: the metrics :func:`mll_metrics` returns, in the order tables print them
MLL_METRICS = ("ranking_loss", "one_error", "coverage", "average_precision", "hamming_loss",
               "hamming_loss_tuned", "macro_auc")

#: the thresholds :func:`tuned_thresholds` chooses from: 0.01 … 0.99
_CANDIDATES = np.round(np.arange(1, 100) / 100.0, 2)


# ----------------------------------------------------------------------------- inputs


#: what a scores argument of 3 or 2 axes must be, and where the other shape goes
_SHAPES = {3: ("(T heads, N rows, C classes)",
               "pass one head's (N, C) scores to the single-head functions, or add a leading axis"),
           2: ("one head's (N rows, C classes)",
               "use mll_metrics_stacked / tuned_thresholds for (T, N, C)")}


def _as_heads(scores: Any, name: str = "scores", axes: int = 3) -> Tensor:
    """``scores`` as a (T, N, C) float tensor (a float dtype kept; others as float64): T heads'
    ``(T, N, C)`` with ``axes`` 3, one head's ``(N, C)`` as T = 1 with ``axes`` 2."""
    s = torch.as_tensor(scores)
    if s.dim() != axes:
        expected, instead = _SHAPES[axes]
        raise MetricInputError(f"{name} must be {expected}, got shape {tuple(s.shape)}; "
                               f"{instead}")
    if axes == 2:
        s = s[None]
    return s if s.is_floating_point() else s.double()


def _labels(targets: Any, scores: Tensor) -> Tensor:
    """``targets`` (N, C), 0/1, as a bool tensor on the scores' device, checked against them."""
    y = torch.as_tensor(targets)
    if tuple(y.shape) != tuple(scores.shape[1:]):
        raise MetricInputError(f"targets must be (N, C) = {tuple(scores.shape[1:])} like the "
                               f"scores' rows and classes, got shape {tuple(y.shape)}")
    return y.to(scores.device).bool()


def _thresholds(thresholds: Any, t: int, device: torch.device) -> Tensor:
    """``thresholds`` (one float, or one per head) as a (T,) float64 tensor."""
    th = torch.as_tensor(thresholds, dtype=torch.float64, device=device)
    if th.dim() == 0:
        th = th.expand(t)
    if tuple(th.shape) != (t,):
        raise MetricInputError(f"thresholds must be one float or one per head ({t},), got shape "
                               f"{tuple(th.shape)}")
    return th


def probabilities(logits: Tensor) -> Tensor:
    """The float64 probabilities ``1 / (1 + exp(-z))`` of logits ``z`` that Hamming loss
    thresholds."""
    return 1.0 / (1.0 + torch.exp(-logits.double()))


# ----------------------------------------------------------------------------- the batched core


def _ranked_labels(scores: Tensor, has: Tensor) -> Tensor:
    """(T, N, C) bool: each row's labels in ranked order -- highest score first, ties in class
    order (a stable sort, as SMILE's code)."""
    order = torch.sort(scores, dim=2, descending=True, stable=True).indices
    return has.expand(scores.shape[0], -1, -1).gather(2, order)


def _mean_pair_share(ranked: Tensor) -> Tensor:
    """(T,): over lines of ``ranked`` (T, L, K) -- each line's labels in ranked order -- each
    line's share of (positive, negative) pairs whose negative is ranked before the positive (the
    positives' rank sum beyond the first m ranks 0..m-1, over m·n), averaged over the lines that
    have both (NaN where none has)."""
    m = ranked[0].sum(1).double()  # the lines' labels are the same in every head's ranking
    n = ranked.shape[2] - m
    lines = (m > 0) & (n > 0)
    if not bool(lines.any()):
        return torch.full((ranked.shape[0],), float("nan"), dtype=torch.float64,
                          device=ranked.device)
    # the positives' 0-based ranks summed: integers below 2^53, exact in float64
    positions = torch.arange(ranked.shape[2], dtype=torch.float64, device=ranked.device)
    rank_sum = ranked[:, lines].double() @ positions
    share = (rank_sum - m[lines] * (m[lines] - 1) / 2.0) / (m[lines] * n[lines])
    return share.mean(1)


def _one_error(ranked: Tensor) -> Tensor:
    hit = ranked[:, :, 0]  # (T, N): whether each row's first top-scored class is a positive
    return 1.0 - hit.sum(1).double() / hit.shape[1]


def _coverage(ranked: Tensor) -> Tensor:
    _, n, c = ranked.shape
    depth = torch.arange(1, c + 1, device=ranked.device)
    deepest = (ranked * depth).amax(2)  # (T, N) 1-based; 0 for a row without positives
    return (deepest.sum(1).double() / n - 1.0) / c


def _average_precision(ranked: Tensor) -> Tensor:
    rows = ranked[0].any(1)
    if not bool(rows.any()):
        return torch.full((ranked.shape[0],), float("nan"), dtype=torch.float64,
                          device=ranked.device)
    ranked = ranked[:, rows]
    # at ranked position p, the positives so far over p + 1 is the precision of a positive
    # found there
    depth = torch.arange(1, ranked.shape[2] + 1, dtype=torch.float64, device=ranked.device)
    precision = ranked.cumsum(2) / depth
    per_row = torch.where(ranked, precision, 0.0).sum(2) / ranked[0].sum(1)
    return per_row.mean(1)


def _macro_auc(scores: Tensor, has: Tensor) -> Tensor:
    # each class's rows ranked lowest first, ties in row order: a negative before a positive is
    # a correctly ordered pair
    by_class = scores.transpose(1, 2).contiguous()  # (T, C, N): a contiguous sort is faster
    order = torch.sort(by_class, dim=2, stable=True).indices
    ranked = has.T.expand(scores.shape[0], -1, -1).gather(2, order)
    return _mean_pair_share(ranked)


def _hamming(probs: Tensor, has: Tensor, thresholds: Tensor) -> Tensor:
    wrong = (probs > thresholds[:, None, None]) != has
    return wrong.sum((1, 2)).double() / (has.shape[0] * has.shape[1])


def mll_metrics_stacked(logits: Tensor, targets: Tensor, thresholds: Any = 0.5, *,
                        probs: Tensor | None = None) -> dict[str, Tensor]:
    """Every metric of :data:`MLL_METRICS` of T heads' logits ``(T, N, C)`` on the labels
    ``targets`` (N, C) they share, each a (T,) float64 tensor on the logits' device;
    ``hamming_loss_tuned`` uses ``thresholds`` (one per head, from :func:`tuned_thresholds` on
    val, or one float). ``probs``: the logits' :func:`probabilities`, where the caller formed
    them already (to tune the thresholds on these rows); formed here otherwise."""
    z = _as_heads(logits, "logits")
    has = _labels(targets, z)
    th = _thresholds(thresholds, z.shape[0], z.device)
    if probs is not None and tuple(probs.shape) != tuple(z.shape):
        raise MetricInputError(f"probs must be the logits' probabilities, {tuple(z.shape)}; got "
                               f"shape {tuple(probs.shape)}")
    ranked = _ranked_labels(z, has)  # one sort of the rows serves four metrics
    out = {"ranking_loss": _mean_pair_share(ranked),
           "one_error": _one_error(ranked),
           "coverage": _coverage(ranked),
           "average_precision": _average_precision(ranked)}
    del ranked
    if probs is None:  # formed after the ranking's intermediates are freed
        probs = probabilities(z)
    out["hamming_loss"] = _hamming(probs, has, th.new_full(th.shape, 0.5))
    out["hamming_loss_tuned"] = _hamming(probs, has, th)
    del probs
    out["macro_auc"] = _macro_auc(z, has)
    return {name: out[name] for name in MLL_METRICS}


def tuned_thresholds(probs: Tensor, targets: Tensor) -> Tensor:
    """(T,) float64: for each head's probabilities ``(T, N, C)`` on these (val) rows, the
    threshold in 0.01 … 0.99 with the smallest Hamming loss; of equal ones, the nearest to 0.5
    (the first of equally near)."""
    p = _as_heads(probs, "probabilities")
    has = _labels(targets, p)
    t = p.shape[0]
    k = len(_CANDIDATES)
    candidates = torch.as_tensor(_CANDIDATES, device=p.device)
    # the wrong entries at each candidate by one binary search per entry: an entry with
    # probability p is predicted positive (p > t, as hamming_loss) at the candidates below
    # bins(p), the number of candidates < p
    bins = torch.bucketize(p.double(), candidates, right=False)  # (T, N, C) in 0 … 99
    # one count per (head, label, bin): key = (head · 2 + label) · (k + 1) + bin
    key = bins + (torch.arange(t, device=p.device)[:, None, None] * 2 + has) * (k + 1)
    counts = torch.bincount(key.reshape(-1), minlength=t * 2 * (k + 1)).reshape(t, 2, k + 1)
    # over candidate j: positives with p <= t_j (bins <= j), negatives with p > t_j (bins > j)
    missed = counts[:, 1].cumsum(1)[:, :-1]
    false = counts[:, 0].sum(1, keepdim=True) - counts[:, 0].cumsum(1)[:, :-1]
    wrong = missed + false  # (T, k): the loss times N·C, exact in integers
    distance = (candidates - 0.5).abs().expand(t, -1)
    fewest = wrong == wrong.amin(1, keepdim=True)
    best = torch.where(fewest, distance, float("inf")).argmin(1)  # the first of the nearest
    return candidates[best]


# ----------------------------------------------------------------------------- one head


def ranking_loss(scores: np.ndarray | Tensor, targets: np.ndarray | Tensor) -> float:
    """Mean over rows with positives and negatives of the wrongly ordered pairs' fraction
    (ranked highest first: a negative before a positive is a wrong pair)."""
    s = _as_heads(scores, axes=2)
    return float(_mean_pair_share(_ranked_labels(s, _labels(targets, s)))[0])


def one_error(scores: np.ndarray | Tensor, targets: np.ndarray | Tensor) -> float:
    """The fraction of rows whose top-scored class (the first of ties) is not a positive."""
    s = _as_heads(scores, axes=2)
    return float(_one_error(_ranked_labels(s, _labels(targets, s)))[0])


def coverage(scores: np.ndarray | Tensor, targets: np.ndarray | Tensor) -> float:
    """SMILE's coverage: (mean over all rows of the deepest positive's 1-based rank, 0 for a row
    without positives) − 1, divided by C."""
    s = _as_heads(scores, axes=2)
    return float(_coverage(_ranked_labels(s, _labels(targets, s)))[0])


def average_precision(scores: np.ndarray | Tensor, targets: np.ndarray | Tensor) -> float:
    """Example-based average precision: per row with positives, the mean over its positives of
    (positives ranked at or above it) / (its 1-based rank); averaged over those rows."""
    s = _as_heads(scores, axes=2)
    return float(_average_precision(_ranked_labels(s, _labels(targets, s)))[0])


def macro_auc(scores: np.ndarray | Tensor, targets: np.ndarray | Tensor) -> float:
    """Mean over classes with positive and negative rows of the ROC AUC (rank-sum form, ties in
    row order, as SMILE's code)."""
    s = _as_heads(scores, axes=2)
    return float(_macro_auc(s, _labels(targets, s))[0])


def hamming_loss(probabilities: np.ndarray | Tensor, targets: np.ndarray | Tensor,
                 threshold: float = 0.5) -> float:
    """The fraction of entries where ``probabilities > threshold`` disagrees with the labels."""
    p = _as_heads(probabilities, "probabilities", axes=2).double()
    return float(_hamming(p, _labels(targets, p), _thresholds(threshold, 1, p.device))[0])


def tuned_threshold(probabilities: np.ndarray | Tensor, targets: np.ndarray | Tensor) -> float:
    """The threshold in 0.01 … 0.99 with the smallest Hamming loss on these (val) rows; of
    equal ones, the nearest to 0.5."""
    p = _as_heads(probabilities, "probabilities", axes=2)
    return float(tuned_thresholds(p, targets)[0])


def mll_metrics(test_logits: np.ndarray | Tensor, test_targets: np.ndarray | Tensor,
                threshold: float = 0.5) -> dict[str, float]:
    """Every metric of :data:`MLL_METRICS` of one head's test logits ``(N, C)``;
    ``hamming_loss_tuned`` uses ``threshold`` (from :func:`tuned_threshold` on val)."""
    logits = _as_heads(test_logits, "test_logits", axes=2)
    values = mll_metrics_stacked(logits, test_targets, threshold)
    return {name: float(v[0]) for name, v in values.items()}
