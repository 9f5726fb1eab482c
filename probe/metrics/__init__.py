"""Evaluation metrics of the SPML protocol (``docs/protocol.md``, step 5).

* **AP / mAP.** AP of one class is scikit-learn's ``average_precision_score`` (tied scores form
  one threshold; :mod:`probe.metrics.ranking`). A class with no positive in the evaluated set gets
  AP = 0 and **is kept** in the mean; their number is reported. ``mAP = 100 x mean over all C
  classes``.
* **OF1 / CF1** (the "overall" and "per-class" F1 of the multi-label literature, as reported by
  the SPML papers): a label is predicted positive iff its probability is ``>= threshold``.
  ``OP = sum_c TP_c / sum_c (TP_c + FP_c)``, ``OR = sum_c TP_c / sum_c (TP_c + FN_c)``,
  ``OF1 = 2 OP OR / (OP + OR)`` (= scikit-learn's ``f1_score(average="micro")``);
  ``CP = mean_c TP_c / (TP_c + FP_c)``, ``CR = mean_c TP_c / (TP_c + FN_c)``,
  ``CF1 = 2 CP CR / (CP + CR)`` -- the harmonic mean of the class-averaged precision and recall,
  **not** scikit-learn's ``f1_score(average="macro")`` (which averages per-class F1 values).
  Every 0/0 is 0 (a class never predicted has precision 0, a class without positives recall 0).
  All six are reported x100.

Every metric takes ``logits=`` or ``probs=`` explicitly, never guessing which. Scores are
``(N, C)`` or ``(T, N, C)`` (T stacked trials in one pass); ``targets`` are the full ground truth
``(N, C)``, bool or integer 0/1, shared by all trials. AP ranks logits directly (a float32 sigmoid
saturates to 1.0 and would create ties the model did not make). A column whose scores contain
NaN gets AP = NaN (scikit-learn raises) so one diverged trial does not hide the other T - 1.

Each metric validates its inputs, then calls an unchecked core that :class:`MetricAccumulator`
shares.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from probe.errors import SpmlError
from probe.metrics.ranking import column_ap

__all__ = ["METRIC_DIRECTIONS", "F1Result", "MAPResult", "MetricAccumulator", "MetricInputError",
           "average_precision", "f1_scores", "mean_average_precision"]

#: every metric a run records (``test_<name>`` / ``val_<name>``) -> whether higher is better:
#: the one place tables and comparisons read a metric's direction (probe.metrics.mll)
METRIC_DIRECTIONS: dict[str, bool] = {
    "map": True, "OF1": True, "CF1": True,
    "ranking_loss": False, "one_error": False, "coverage": False, "average_precision": True,
    "hamming_loss": False, "hamming_loss_tuned": False, "macro_auc": True,
}


class MetricInputError(SpmlError):
    """Bad input to a metric: the message names the argument, what was expected and what arrived."""


class MAPResult(NamedTuple):
    """Mean average precision as the protocol reports it (docs/protocol.md step 5).

    ``map``: 100 x mean AP over all C classes, a 0-d tensor, or ``(T,)`` for stacked trials;
    ``ap``: per-class AP in [0, 1], ``(C,)`` or ``(T, C)`` (0 for classes without positives);
    ``n_empty_classes``: how many classes had no positive in the evaluated set.
    """

    map: Tensor
    ap: Tensor
    n_empty_classes: int


class F1Result(NamedTuple):
    """Threshold metrics, all x100; 0-d tensors, or ``(T,)`` for stacked trials (module doc)."""

    overall_f1: Tensor
    class_f1: Tensor
    overall_precision: Tensor
    overall_recall: Tensor
    class_precision: Tensor
    class_recall: Tensor

    def to_dict(self) -> dict[str, Tensor]:
        """The literature's names: ``OF1, CF1, OP, OR, CP, CR``."""
        return dict(zip(("OF1", "CF1", "OP", "OR", "CP", "CR"), self))


def _pick_scores(logits: Tensor | None, probs: Tensor | None) -> tuple[Tensor, str]:
    """Exactly one of ``logits`` / ``probs``; returns it (detached) and its name."""
    if (logits is None) == (probs is None):
        given = "both" if logits is not None else "neither"
        raise MetricInputError(
            f"pass exactly one of logits= or probs= (got {given}); use logits= for raw model "
            "outputs and probs= for sigmoid probabilities")
    scores, name = (logits, "logits") if logits is not None else (probs, "probs")
    if not isinstance(scores, Tensor):
        raise MetricInputError(f"{name} must be a torch.Tensor; got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise MetricInputError(
            f"{name} must be a floating tensor (float16/bfloat16/float32/float64); got "
            f"{scores.dtype}; convert with .float()")
    if scores.dim() not in (2, 3):
        raise MetricInputError(
            f"{name} must have shape (N, C) or (T, N, C) with T stacked trials; got "
            f"{tuple(scores.shape)}")
    return scores.detach(), name


def _check_target_meta(targets: Tensor, scores: Tensor, name: str) -> None:
    """Type and shape of ``targets`` against the scores (no host synchronisation)."""
    if not isinstance(targets, Tensor):
        raise MetricInputError(f"targets must be a torch.Tensor; got {type(targets).__name__}")
    if targets.is_floating_point() or targets.is_complex():
        raise MetricInputError(
            f"targets must be bool or integer 0/1 ground truth; got {targets.dtype}; convert "
            "with targets.to(torch.uint8) if it holds exact 0.0/1.0")
    if targets.dim() != 2:
        raise MetricInputError(
            f"targets must have shape (N, C) (shared by all stacked trials); got "
            f"{tuple(targets.shape)}")
    if targets.shape != scores.shape[-2:]:
        raise MetricInputError(
            f"targets shape {tuple(targets.shape)} does not match {name} shape "
            f"{tuple(scores.shape)}: the last two dims of {name} must be (N, C) = targets.shape")
    if targets.shape[0] == 0 or targets.shape[1] == 0:
        raise MetricInputError(
            f"targets has shape {tuple(targets.shape)}; need at least one row and one class")


def _check_values(targets: Tensor, scores: Tensor, name: str) -> Tensor:
    """Values of ``targets`` (0/1 only) and ``probs`` (in [0, 1]); returns bool targets on the
    scores' device. Synchronises with the device once."""
    targets = targets.to(scores.device)
    if targets.dtype != torch.bool:
        bad = (targets != 0) & (targets != 1)
        if bool(bad.any()):
            found = sorted(set(targets[bad].unique()[:5].tolist()))
            hint = (" -1 marks an observed negative in single-positive labels (observed/<seed>); "
                    "metrics need the full ground truth (the store's labels)." if -1 in found
                    else "")
            raise MetricInputError(f"targets must contain only 0 and 1; found {found}.{hint}")
        targets = targets.bool()
    if name == "probs":
        low, high = scores.aminmax()
        if bool(low < 0) or bool(high > 1):
            raise MetricInputError(
                f"probs must lie in [0, 1]; got values in [{float(low):g}, {float(high):g}]; "
                "pass raw model outputs as logits= instead")
    return targets


def _check_threshold(threshold: float) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise MetricInputError(f"threshold must be a number in (0, 1); got {threshold!r}")
    if not 0.0 < float(threshold) < 1.0:
        raise MetricInputError(
            f"threshold is a probability and must lie strictly in (0, 1); got {threshold!r} "
            "(0.5 is the protocol default)")
    return float(threshold)


def _checked(targets: Tensor, logits: Tensor | None,
             probs: Tensor | None) -> tuple[Tensor, Tensor, str]:
    scores, name = _pick_scores(logits, probs)
    _check_target_meta(targets, scores, name)
    return _check_values(targets, scores, name), scores, name


def _map_from_ap(ap: Tensor, targets: Tensor) -> MAPResult:
    n_empty = int((~targets.any(dim=0)).sum())
    return MAPResult(map=100.0 * ap.mean(dim=-1), ap=ap, n_empty_classes=n_empty)


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """num / den with 0/0 (and x/0) = 0."""
    return torch.where(den > 0, num / den.clamp_min(1e-30), torch.zeros_like(num))


def _f1_core(scores: Tensor, targets: Tensor, name: str, threshold: float) -> F1Result:
    """OF1/CF1 family (module doc) for checked inputs; ``threshold`` in probability space.

    For logits the test ``sigmoid(z) >= t`` is done as ``z >= log(t / (1 - t))`` (exact at
    t = 0.5, and free of float saturation of the sigmoid).
    """
    work = torch.float64 if scores.dtype == torch.float64 else torch.float32
    cut = math.log(threshold) - math.log1p(-threshold) if name == "logits" else threshold
    pred = scores.to(work) >= cut  # (..., N, C)
    # exact integer counts; int32 sums of bools run ~2x faster than the default int64 ones
    count = torch.int32 if scores.shape[-2] < 2**31 else torch.int64
    tp = (pred & targets).sum(dim=-2, dtype=count).to(torch.float64)  # (..., C)
    n_pred = pred.sum(dim=-2, dtype=count).to(torch.float64)
    n_true = targets.sum(dim=-2).to(torch.float64).expand_as(tp)
    op = _safe_div(tp.sum(-1), n_pred.sum(-1))
    orc = _safe_div(tp.sum(-1), n_true.sum(-1))
    cp = _safe_div(tp, n_pred).mean(-1)
    cr = _safe_div(tp, n_true).mean(-1)
    of1 = _safe_div(2 * op * orc, op + orc)
    cf1 = _safe_div(2 * cp * cr, cp + cr)
    return F1Result(*(100.0 * v.to(work) for v in (of1, cf1, op, orc, cp, cr)))


@torch.no_grad()
def average_precision(targets: Tensor, *, logits: Tensor | None = None,
                      probs: Tensor | None = None) -> Tensor:
    """Per-class AP (scikit-learn's ``average_precision_score``, ties as one threshold).

    ``targets`` ``(N, C)`` bool/integer 0/1; exactly one of ``logits`` / ``probs``, shaped
    ``(N, C)`` or ``(T, N, C)``. Returns AP in [0, 1], ``(C,)`` or ``(T, C)``, float32 (float64
    for float64 scores); 0 for a class without positives, NaN for a column with a NaN score.
    """
    targets, scores, _ = _checked(targets, logits, probs)
    return column_ap(scores, targets)


@torch.no_grad()
def mean_average_precision(targets: Tensor, *, logits: Tensor | None = None,
                           probs: Tensor | None = None) -> MAPResult:
    """mAP of docs/protocol.md step 5: 100 x mean AP over **all** C classes (empty classes count 0).

    Same inputs as :func:`average_precision`; returns :class:`MAPResult` (``map`` 0-d or ``(T,)``).
    """
    targets, scores, _ = _checked(targets, logits, probs)
    return _map_from_ap(column_ap(scores, targets), targets)


@torch.no_grad()
def f1_scores(targets: Tensor, *, logits: Tensor | None = None, probs: Tensor | None = None,
              threshold: float = 0.5) -> F1Result:
    """OF1, CF1, OP, OR, CP, CR (x100) at ``threshold`` in probability space (module doc).

    A label is predicted positive iff ``prob >= threshold`` (``sigmoid(logit) >= threshold``).
    Same inputs as :func:`average_precision`; fields are 0-d or ``(T,)``.
    """
    threshold = _check_threshold(threshold)
    targets, scores, name = _checked(targets, logits, probs)
    return _f1_core(scores, targets, name, threshold)


class MetricAccumulator:
    """Collects evaluation batches on their device and computes the metrics once at the end.

    ``update`` checks shapes only (it never waits for the device); values are checked at the
    first compute. Scores may carry a trial axis ``(T, B, C)`` with targets ``(B, C)``::

        acc = MetricAccumulator()
        for x, y in batches:
            acc.update(y, logits=head(x))
        result = acc.mean_average_precision()   # MAPResult
        f1 = acc.f1_scores(threshold=0.5)        # F1Result
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every batch."""
        self._scores: list[Tensor] = []
        self._targets: list[Tensor] = []
        self._kind: str | None = None
        self._cache: tuple[Tensor, Tensor] | None = None

    @property
    def n_rows(self) -> int:
        """Rows collected so far."""
        return sum(t.shape[0] for t in self._targets)

    def update(self, targets: Tensor, *, logits: Tensor | None = None,
               probs: Tensor | None = None) -> None:
        """Add one batch: ``targets`` ``(B, C)``, scores ``(B, C)`` or ``(T, B, C)``."""
        scores, name = _pick_scores(logits, probs)
        _check_target_meta(targets, scores, name)
        if self._scores:
            first = self._scores[0]
            if name != self._kind:
                raise MetricInputError(
                    f"this accumulator holds {self._kind}; got {name} in a later batch; "
                    f"pass {self._kind}= for every batch (or use a new MetricAccumulator)")
            if scores.shape[:-2] != first.shape[:-2] or scores.shape[-1] != first.shape[-1]:
                want = (*first.shape[:-2], "B", first.shape[-1])
                raise MetricInputError(
                    f"{name} batch shape {tuple(scores.shape)} does not match earlier batches "
                    f"{want} (same trial count T and class count C in every batch)")
            if scores.device != first.device:
                raise MetricInputError(
                    f"{name} batch is on {scores.device}, earlier batches on {first.device}")
        self._kind = name
        self._scores.append(scores)
        self._targets.append(targets.to(scores.device))
        self._cache = None

    def _collected(self) -> tuple[Tensor, Tensor]:
        if not self._scores:
            raise MetricInputError("MetricAccumulator is empty: call update() before computing")
        if self._cache is None:
            scores = torch.cat(self._scores, dim=-2)
            targets = _check_values(torch.cat(self._targets, dim=0), scores, str(self._kind))
            self._scores, self._targets = [scores], [targets]
            self._cache = (scores, targets)
        return self._cache

    @torch.no_grad()
    def average_precision(self) -> Tensor:
        """Per-class AP over all batches, as :func:`average_precision`."""
        scores, targets = self._collected()
        return column_ap(scores, targets)

    @torch.no_grad()
    def mean_average_precision(self) -> MAPResult:
        """mAP over all batches, as :func:`mean_average_precision`."""
        scores, targets = self._collected()
        return _map_from_ap(column_ap(scores, targets), targets)

    @torch.no_grad()
    def f1_scores(self, threshold: float = 0.5) -> F1Result:
        """OF1/CF1 family over all batches, as :func:`f1_scores`."""
        threshold = _check_threshold(threshold)
        scores, targets = self._collected()
        return _f1_core(scores, targets, str(self._kind), threshold)
