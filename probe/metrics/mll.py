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
logits or probabilities (every metric but Hamming depends only on their order); all inputs are
numpy arrays ``(N, C)``. Values are fractions in [0, 1], as the papers report them.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MLL_METRICS", "average_precision", "coverage", "hamming_loss", "macro_auc",
           "mll_metrics", "one_error", "ranking_loss", "tuned_threshold"]

#: the metrics :func:`mll_metrics` returns, in the order tables print them
MLL_METRICS = ("ranking_loss", "one_error", "coverage", "average_precision", "hamming_loss",
               "hamming_loss_tuned", "macro_auc")


def _positions(keys: np.ndarray, axis: int) -> np.ndarray:
    """Each entry's 0-based position when ``keys`` are sorted ascending along ``axis``, ties in
    index order (a stable sort, as SMILE's code)."""
    return _positions_of(np.argsort(keys, axis=axis, kind="stable"), axis)


def _positions_of(index: np.ndarray, axis: int) -> np.ndarray:
    """The inverse of a sort ``index`` along ``axis``: each entry's position in the sorted order."""
    ranks = np.empty_like(index)
    shape = [1, 1]
    shape[axis] = index.shape[axis]
    positions = np.broadcast_to(np.arange(index.shape[axis]).reshape(shape), index.shape)
    np.put_along_axis(ranks, index, positions, axis=axis)
    return ranks


def _descending_order(scores: np.ndarray) -> np.ndarray:
    """(N, C) int: each row's classes, highest score first, ties in class order."""
    return np.argsort(-scores, axis=1, kind="stable")


def _descending_ranks(scores: np.ndarray) -> np.ndarray:
    """(N, C) int: each class's 0-based position when the row is sorted by score, highest
    first, ties in class order."""
    return _positions_of(_descending_order(scores), axis=1)


def _mean_pair_share(ranks: np.ndarray, targets: np.ndarray, axis: int) -> float:
    """Along ``axis``, each line's share of (positive, negative) pairs whose negative is ranked
    before the positive -- the positives' rank sum beyond the first m ranks 0..m-1, over m·n --
    averaged over the lines that have both (NaN where none has)."""
    has = targets.astype(bool)
    m = has.sum(axis)
    n = has.shape[axis] - m
    lines = (m > 0) & (n > 0)
    if not lines.any():
        return float("nan")
    rank_sum = np.where(has, ranks, 0).sum(axis)
    share = (rank_sum[lines] - m[lines] * (m[lines] - 1) / 2.0) / (m[lines] * n[lines])
    return float(share.mean())


def ranking_loss(scores: np.ndarray, targets: np.ndarray) -> float:
    """Mean over rows with positives and negatives of the wrongly ordered pairs' fraction
    (ranked highest first: a negative before a positive is a wrong pair)."""
    return _mean_pair_share(_descending_ranks(scores), targets, axis=1)


def one_error(scores: np.ndarray, targets: np.ndarray) -> float:
    """The fraction of rows whose top-scored class (the first of ties) is not a positive."""
    top = np.argmax(scores, axis=1)
    hit = targets[np.arange(len(top)), top] == 1
    return float(1.0 - hit.mean())


def coverage(scores: np.ndarray, targets: np.ndarray) -> float:
    """SMILE's coverage: (mean over all rows of the deepest positive's 1-based rank, 0 for a row
    without positives) − 1, divided by C."""
    return _coverage(_descending_ranks(scores), targets)


def _coverage(ranks: np.ndarray, targets: np.ndarray) -> float:
    has = targets.astype(bool)
    deepest = np.where(has, ranks + 1, 0).max(1)
    return float((deepest.sum() / ranks.shape[0] - 1.0) / ranks.shape[1])


def average_precision(scores: np.ndarray, targets: np.ndarray) -> float:
    """Example-based average precision: per row with positives, the mean over its positives of
    (positives ranked at or above it) / (its 1-based rank); averaged over those rows."""
    return _average_precision(_descending_order(scores), targets)


def _average_precision(order: np.ndarray, targets: np.ndarray) -> float:
    has = targets.astype(bool)
    rows = has.any(1)
    if not rows.any():
        return float("nan")
    # each row's labels in ranked order (highest score first, ties in class order): at ranked
    # position p, the positives so far over p + 1 is the precision of a positive found there
    ranked = np.take_along_axis(has[rows], order[rows], axis=1)
    precision = np.cumsum(ranked, axis=1) / np.arange(1, ranked.shape[1] + 1)
    per_row = (precision * ranked).sum(1) / ranked.sum(1)
    return float(per_row.mean())


def macro_auc(scores: np.ndarray, targets: np.ndarray) -> float:
    """Mean over classes with positive and negative rows of the ROC AUC (rank-sum form, ties in
    row order, as SMILE's code)."""
    # ranked lowest first: a negative before a positive is a correctly ordered pair
    return _mean_pair_share(_positions(scores, axis=0), targets, axis=0)


def hamming_loss(probabilities: np.ndarray, targets: np.ndarray, threshold: float = 0.5
                 ) -> float:
    """The fraction of entries where ``probabilities > threshold`` disagrees with the labels."""
    predicted = probabilities > threshold
    return float((predicted != targets.astype(bool)).mean())


def tuned_threshold(probabilities: np.ndarray, targets: np.ndarray) -> float:
    """The threshold in 0.01 … 0.99 with the smallest Hamming loss on these (val) rows; of
    equal ones, the nearest to 0.5."""
    candidates = np.round(np.arange(1, 100) / 100.0, 2)
    # the wrong entries at each candidate t by one binary search per entry: an entry with
    # probability p is predicted positive (p > t, as hamming_loss) at the candidates below
    # bins(p), the number of candidates < p
    has = targets.astype(bool)
    bins_pos = np.searchsorted(candidates, probabilities[has], side="left")
    bins_neg = np.searchsorted(candidates, probabilities[~has], side="left")
    # over candidate k: positives with p <= t_k (bins <= k), negatives with p > t_k (bins > k)
    missed = np.cumsum(np.bincount(bins_pos, minlength=len(candidates) + 1))[:-1]
    false = len(bins_neg) - np.cumsum(np.bincount(bins_neg, minlength=len(candidates) + 1))[:-1]
    losses = (missed + false) / probabilities.size
    best = min(range(len(candidates)), key=lambda k: (losses[k], abs(candidates[k] - 0.5)))
    return float(candidates[best])


def mll_metrics(test_logits: np.ndarray, test_targets: np.ndarray,
                threshold: float = 0.5) -> dict[str, float]:
    """Every metric of :data:`MLL_METRICS` of one head's test logits ``(N, C)``;
    ``hamming_loss_tuned`` uses ``threshold`` (from :func:`tuned_threshold` on val)."""
    probabilities = 1.0 / (1.0 + np.exp(-test_logits.astype(np.float64)))
    order = _descending_order(test_logits)  # one sort of the rows serves three metrics
    ranks = _positions_of(order, axis=1)
    return {"ranking_loss": _mean_pair_share(ranks, test_targets, axis=1),
            "one_error": one_error(test_logits, test_targets),
            "coverage": _coverage(ranks, test_targets),
            "average_precision": _average_precision(order, test_targets),
            "hamming_loss": hamming_loss(probabilities, test_targets, 0.5),
            "hamming_loss_tuned": hamming_loss(probabilities, test_targets, threshold),
            "macro_auc": macro_auc(test_logits, test_targets)}
