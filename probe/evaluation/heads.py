"""Evaluation: mAP (and OF1/CF1) of many stacked heads on a split, in bounded memory.

The protocol's metric (docs/protocol.md step 5) for every trial at once: the logits of T heads
``(T, D+1, C)`` on a split's features are formed in blocks (at most :data:`EVAL_BLOCK`
elements), ranked column by column (:mod:`probe.metrics.ranking`), and reduced to per-class AP, mAP
and the threshold metrics.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from probe.engine.config import ProbeConfigError
from probe.engine.data import ProbeData, positions_by_fold
from probe.engine.logits import EVAL_BLOCK, stacked_logits
from probe.engine.results import from_linear
from probe.engine.threads import step_threads
from probe.evaluation.intervals import bootstrap_counts, bootstrap_map, head_intervals
from probe.metrics import f1_scores, mean_average_precision
from probe.progress import Progress

__all__ = ["EVAL_BLOCK", "MLL_CPU_BLOCK", "SMALL_EVAL", "Evaluator", "evaluate_head",
           "evaluate_heads", "finite", "stacked_logits"]

# logits elements (T·N·C) below which a CPU evaluation runs on one thread: intra-op threads only
# add waiting to tiny ops (COCO's val at 8 trials, 10.5M elements, gains from two free threads)
SMALL_EVAL = 1 << 20

# logits elements (T·N·C) of a block of the MLL metrics on the CPU: their (T, N, C) float64 and
# int64 intermediates stay at 32 MB, which glibc's allocator reuses; larger ones are mapped
# afresh each time, and the page faults cost more than batching more heads saves (COCO's
# 40,137 test rows: 0.45 s per head one at a time, 0.64 s eight at a time). On a GPU the
# heads go in blocks of EVAL_BLOCK.
MLL_CPU_BLOCK = 1 << 22


def evaluate_heads(x: Tensor, targets: Tensor, w: Tensor, threshold: float,
                   on_logits: Callable[[Tensor, Tensor], None] | None = None) -> dict[str, Tensor]:
    """mAP (T,), per-class AP (T, C), OF1/CF1 (T,) for heads ``w`` (T, D+1, C), in trial
    blocks so the logits stay below :data:`EVAL_BLOCK` elements. ``on_logits(z, ap)`` sees
    each block's logits (t, N, C) and per-class AP (t, C) before they are freed (the test
    intervals reuse them)."""
    t, _, c = w.shape
    per = max(1, EVAL_BLOCK // max(1, x.shape[0] * c))
    out: dict[str, list[Tensor]] = {"map": [], "OF1": [], "CF1": [], "ap": []}
    small = t * x.shape[0] * c < SMALL_EVAL
    with step_threads(w.device, 1 if small else None):
        for t0 in range(0, t, per):
            z = stacked_logits(x, w[t0 : t0 + per])
            m = mean_average_precision(targets, logits=z)
            f = f1_scores(targets, logits=z, threshold=threshold)
            for key, v in zip(out, (m.map, f.overall_f1, f.class_f1, m.ap)):
                out[key].append(v.reshape(-1, c) if key == "ap" else v.reshape(-1))
            if on_logits is not None:
                on_logits(z, out["ap"][-1])
            del z
    return {key: torch.cat(v) for key, v in out.items()}


def evaluate_head(data: ProbeData, head: nn.Linear, threshold: float = 0.5) -> dict[str, Any]:
    """Val (clean) and test mAP / OF1 / CF1 and per-class test AP of one ``nn.Linear`` head."""
    if head.in_features != data.feature_dim or head.out_features != data.n_classes:
        raise ProbeConfigError(
            f"the head maps {head.in_features} features to {head.out_features} classes, the "
            f"data has {data.feature_dim} features and {data.n_classes} classes")
    w = from_linear(head).to(data.device).float()
    out: dict[str, Any] = {}
    for split, x, y in (("val", data.val_x, data.val_labels), ("test", data.test_x,
                                                                data.test_labels)):
        r = evaluate_heads(x, y.bool(), w[None], threshold)  # map, OF1, CF1 (floats), ap (list)
        out.update({f"{split}_{key}": v[0].tolist() for key, v in r.items()})
    return out


class Evaluator:
    """Evaluates the stacked heads on val after an epoch, keeps each trial's best epoch (the
    highest finite val mAP, the first of equals: docs/protocol.md step 5) with its head, val
    metrics and per-class val AP in the trial's :class:`~probe.engine.results.TrialResult`, and
    :meth:`finish` measures test once on those heads. With ``test_curve`` test is also measured
    every evaluated epoch (the same reported figures).
    """

    def __init__(self, data: ProbeData, config: Any, results: list[Any], w: Tensor,
                 progress: bool = False, *, folds: Sequence[ProbeData] | None = None,
                 fold_index: Sequence[int] | None = None) -> None:
        def val_set(d: ProbeData) -> tuple[Tensor, Tensor]:
            targets = d.val_labels.bool() if config.val_labels == "clean" else d.val_observed == 1
            return d.val_x, targets

        # val: one set, or with per-trial folds each fold's (trial t's is val_of[t]); one test
        self.val_sets = [val_set(d) for d in (folds if folds is not None else [data])]
        self.val_of = list(fold_index) if folds is not None and fold_index is not None else (
            [0] * w.shape[0])
        self.test_set = (data.test_x, data.test_labels.bool())
        self.threshold = config.f1_threshold
        self.test_curve = bool(config.test_curve)
        self.n_resamples = int(config.test_intervals)
        self.progress = progress  # a display over the heads while their intervals are formed
        self.intervals: dict[int, Any] = {}  # trial -> its test-mAP Interval (finish)
        self.interval_seconds = 0.0  # of finish's time, spent on the intervals
        self.results = results
        self.n_trials, self.n_classes = w.shape[0], w.shape[2]
        self.best_val = [-math.inf] * self.n_trials
        self.best_w = w.detach().clone()  # on the heads' device; to the CPU once, at the end

    def measure(self, heads: Tensor, trials: list[int], splits: tuple[str, ...],
                on_test_logits: Callable[[Tensor, Tensor], None] | None = None
                ) -> tuple[dict[str, list[float | None]], dict[str, Tensor]]:
        """Metrics of ``heads`` (one row per trial id in ``trials``) on ``splits`` as
        ``{"val_map": [...], …}`` over all T trials (None for the others), and the per-class
        AP ``(len(trials), C)`` per split; ``on_test_logits`` as :func:`evaluate_heads`'s
        ``on_logits``, for the test split."""
        idx = list(trials)
        out: dict[str, list[float | None]] = {}
        aps = {}
        for split in splits:
            if split == "test":
                x, y = self.test_set
                r = evaluate_heads(x, y, heads, self.threshold, on_test_logits)
            else:
                r = self._evaluate_val(heads, idx)
            for k in ("map", "OF1", "CF1"):
                by_trial = dict(zip(idx, r[k].tolist()))
                out[f"{split}_{k}"] = [by_trial.get(j) for j in range(self.n_trials)]
            aps[split] = r["ap"]
        return out, aps

    def _evaluate_val(self, heads: Tensor, idx: list[int]) -> dict[str, Tensor]:
        """:func:`evaluate_heads` of ``heads`` (trials ``idx``) on val: each trial on its own
        fold's val rows, one evaluation per fold; the rows of the result in ``idx``'s order."""
        by_set = positions_by_fold([self.val_of[t] for t in idx])
        if len(by_set) == 1:
            x, y = self.val_sets[next(iter(by_set))]
            return evaluate_heads(x, y, heads, self.threshold)
        out: dict[str, Tensor] = {}
        for k, positions in by_set.items():
            x, y = self.val_sets[k]
            mine = torch.tensor(positions, device=heads.device)
            r = evaluate_heads(x, y, heads.index_select(0, mine), self.threshold)
            for key, v in r.items():
                if key not in out:
                    out[key] = v.new_empty((len(idx), *v.shape[1:]))
                out[key][mine.to(v.device)] = v
        return out

    def __call__(self, heads: Tensor, trials: list[int], epoch: int | None = None
                 ) -> dict[str, list[float | None]]:
        """This epoch's metrics of ``heads`` (trials ``trials``): val, and test too with
        ``test_curve`` or without ``epoch`` (the untrained heads); with ``epoch``, update each
        trial's best epoch."""
        splits = ("val", "test") if self.test_curve or epoch is None else ("val",)
        out, aps = self.measure(heads, trials, splits)
        if epoch is not None:
            self._select(epoch, heads, list(trials), out, aps)
        return out

    def _select(self, epoch: int, w: Tensor, idx: list[int], out: dict[str, list],
                aps: dict[str, Tensor]) -> None:
        improved = [j for j, t in enumerate(idx)
                    if finite(out["val_map"][t]) and out["val_map"][t] > self.best_val[t]]
        if not improved:
            return
        rows = [idx[j] for j in improved]
        sel = torch.tensor(improved, device=w.device)
        # index_copy_, not best_w[rows] = ...: a list index costs ~1 ms per epoch even for three
        # yeast heads on the CPU (and ten times that on a loaded machine)
        self.best_w.index_copy_(0, torch.tensor(rows, device=self.best_w.device),
                                w.index_select(0, sel).detach())
        best_ap = {split: ap[sel].cpu() for split, ap in aps.items()}
        for j, t in enumerate(rows):
            self.best_val[t] = out["val_map"][t]
            result = self.results[t]
            result.best_epoch = epoch
            result.best = {**{k: v[t] for k, v in out.items()},  # per-class AP in percent too
                           **{f"{s}_ap": (100.0 * ap[j]).tolist() for s, ap in best_ap.items()}}

    def finish(self) -> None:
        """Test metrics of every trial's best head, once (with ``test_curve`` they were measured
        at that epoch), and with ``test_intervals`` each one's test-mAP interval from the logits
        of this pass (the figures of :func:`probe.evaluation.intervals.attach_test_intervals`)."""
        idx = [t for t, r in enumerate(self.results) if r.best_epoch is not None]
        if not idx:
            return
        heads = self.best_w if len(idx) == self.n_trials else self.best_w[
            torch.tensor(idx, device=self.best_w.device)]
        self._record_mll(heads, idx)
        if self.test_curve:
            if self.n_resamples:
                x, y = self.test_set
                with self._timing_intervals():
                    boot = head_intervals(x, y, heads, n_resamples=self.n_resamples,
                                          progress=self.progress)
                self.intervals.update(zip(idx, boot.intervals))
            return
        boots: list[Any] = []
        with Progress(len(idx), f"test intervals ({self.n_resamples} resamples)",
                      "heads", enabled=self.progress and self.n_resamples > 0) as bar:
            hook = self._bootstrap_hook(boots, bar.update) if self.n_resamples else None
            out, aps = self.measure(heads, idx, ("test",), hook)
        ap = aps["test"].cpu()
        for j, t in enumerate(idx):  # per-class AP in percent, the scale of mAP
            self.results[t].best.update({k: v[t] for k, v in out.items()},
                                        test_ap=(100.0 * ap[j]).tolist())
        self.intervals.update(zip(idx, [iv for boot in boots for iv in boot.intervals]))

    def _record_mll(self, heads: Tensor, idx: list[int]) -> None:
        """The multi-label-learning metrics (:mod:`probe.metrics.mll`) of each trial's best head
        on val (its fold's) and test, into its best record as ``val_<name>`` / ``test_<name>``;
        the tuned Hamming threshold is chosen on val (``hamming_threshold``). The heads go in
        blocks of trials that share a val set, on the heads' device, their logits per split
        below :data:`EVAL_BLOCK` elements (:data:`MLL_CPU_BLOCK` on the CPU)."""
        from probe.metrics.mll import mll_metrics_stacked, probabilities, tuned_thresholds

        by_set = positions_by_fold([self.val_of[t] for t in idx])
        test_x, test_y = self.test_set
        for k, positions in by_set.items():
            val_x, val_y = self.val_sets[k]
            rows = max(val_x.shape[0], test_x.shape[0])
            limit = EVAL_BLOCK if heads.device.type != "cpu" else min(EVAL_BLOCK, MLL_CPU_BLOCK)
            per = max(1, limit // max(1, rows * self.n_classes))
            for p0 in range(0, len(positions), per):
                block = positions[p0 : p0 + per]
                w = heads.index_select(0, torch.tensor(block, device=heads.device)).float()
                # float32 logits: their order is that of their float64 values (the conversion
                # is exact) and sorts faster; the Hamming probabilities are formed in float64
                val = stacked_logits(val_x, w)
                val_probs = probabilities(val)
                thresholds = tuned_thresholds(val_probs, val_y)
                values = {"val": mll_metrics_stacked(val, val_y, thresholds, probs=val_probs)}
                del val, val_probs
                test = stacked_logits(test_x, w)
                values["test"] = mll_metrics_stacked(test, test_y, thresholds)
                del test
                chosen = thresholds.tolist()
                by_name = {f"{split}_{name}": v.tolist() for split, metrics in values.items()
                           for name, v in metrics.items()}
                for i, j in enumerate(block):
                    record = {"hamming_threshold": chosen[i]}
                    record.update({key: v[i] for key, v in by_name.items()})
                    self.results[idx[j]].best.update(record)

    def _bootstrap_hook(self, boots: list[Any], done: Callable[[int], None]
                        ) -> Callable[[Tensor, Tensor], None]:
        """:func:`evaluate_heads`' hook: each block of test logits bootstrapped (its per-class
        AP the observed value; one draw of the resamples) into ``boots``, its heads ``done``."""
        x, y = self.test_set
        with self._timing_intervals():
            counts = bootstrap_counts(x.shape[0], self.n_resamples, device=x.device)

        def hook(z: Tensor, ap: Tensor) -> None:
            with self._timing_intervals():
                boots.append(bootstrap_map(z, y, n_resamples=self.n_resamples, counts=counts,
                                           observed_ap=ap))
            done(z.shape[0])
        return hook

    @contextlib.contextmanager
    def _timing_intervals(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.interval_seconds += time.perf_counter() - t0

    def best_heads(self) -> Tensor:
        """(T, D+1, C) float32 on the CPU: each trial's best-epoch head (the initial head for
        a trial without a finite val mAP)."""
        return self.best_w.cpu()


def finite(v: Any) -> bool:
    """Whether ``v`` is a finite number (a metric that went NaN or inf is not)."""
    return isinstance(v, int | float) and math.isfinite(v)
