"""Fig. 5 / Appendix E.3 of the GR paper: the observed fraction of truly positive
unannotated entries per confidence bucket against k̂ and Eq. 6
(:func:`run_calibration`, ``spml analyze calibration``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from probe.engine.config import ProbeConfig
from probe.engine.data import ProbeData

from .common import (
    AnalysisResult,
    BucketStats,
    bucket_rates,
    check_fixed,
    check_int,
    check_losses,
    k_hat_curve,
    load_data,
    masked_probs,
    run_config,
    run_settings,
    scar_curve,
    seeded_heads,
    train_runs,
    trial_scores,
    unannotated_truth,
)


@dataclass
class CalibrationResult(AnalysisResult):
    """Fig. 5 on this store: FN/(FN+TN) per confidence bucket before and after training."""

    loss: str
    before: BucketStats
    after: BucketStats
    k_start: tuple[float, float] | None  # (w_0, b_0)
    k_final: tuple[float, float] | None  # (w_T, b_T)
    a: float  # P(s=1 | y=1) measured on the train split
    fn_rate: float  # #{y=1, s=0} / #{s=0}: Assumption 1's constant
    gaps: dict[str, float | None]
    settings: dict[str, Any]
    hparams: dict[str, Any]
    scores: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    kind, paper = "calibration", "Fig. 5 / App. E.3"

    def __post_init__(self) -> None:
        self.title = ("Calibration of k̂: FN/(FN+TN) per confidence bucket (paper Fig. 5), "
                      f"{self.loss}")

    def tables(self):
        n, b, a = len(self.before.counts), self.before, self.after
        ks = []  # GR's k̂ curve: at the start, and at the end when learned
        if self.k_start is not None:
            final = "k̂ final" if self.k_final is not None else ""
            ks = [("k̂ start", self.k_start), (final, self.k_final)]
        header = ["bucket", "n before", "FN rate before", "n after", "FN rate after",
                  *[name for name, _ in ks], "Eq. 6"]
        rows = []
        for i in range(n):
            if b.counts[i] == 0 and a.counts[i] == 0:
                continue  # an empty bucket
            centre = (i + 0.5) / n
            curves = ["" if k is None else _f3(k_hat_curve(centre, *k)) for _, k in ks]
            rows.append([f"[{b.edges[i]:.2f}, {b.edges[i + 1]:.2f})", str(b.counts[i]),
                         _f3(b.rate[i]), str(a.counts[i]), _f3(a.rate[i]), *curves,
                         _f3(scar_curve(centre, self.a))])
        cap = (f"unannotated train entries per confidence bucket (empty buckets left out); "
               f"FN rate = fraction truly positive; curves at the bucket centre; overall "
               f"FN/(FN+TN) = {self.fn_rate:.4f}; a = P(s=1|y=1) = {self.a:.4f}")
        gap_rows = [[k, "-" if v is None else f"{v:.4f}"] for k, v in self.gaps.items()]
        return [(cap, header, rows),
                ("count-weighted mean |FN rate − curve| over the buckets (after training "
                 "unless named 'before')", ["curve", "gap"], gap_rows)]


def _f3(v: Any) -> str:
    value = float(v)
    return f"{value:.3f}" if math.isfinite(value) else "-"


def _gap(stats: BucketStats, curve: Callable[[np.ndarray], np.ndarray]) -> float | None:
    ok = stats.counts > 0
    if not ok.any():
        return None
    diff = np.abs(stats.rate[ok] - curve(stats.mean_p[ok]))
    return float((diff * stats.counts[ok]).sum() / stats.counts[ok].sum())


def _confidences(x: Tensor, heads: Tensor, mask: Tensor, truth: Tensor) -> tuple[Tensor, Tensor]:
    """The masked entries' confidences under every head (trials pooled) and their truth."""
    ps = [masked_probs(x, heads[t], mask) for t in range(heads.shape[0])]
    return torch.cat(ps), truth[mask].repeat(heads.shape[0])


def run_calibration(
    data: ProbeData | str,
    config: ProbeConfig | None = None,
    loss: str = "gr",
    *,
    hparams: dict[str, Any] | None = None,
    n_buckets: int = 100,
    progress: bool = False,
) -> CalibrationResult:
    """Train ``loss`` (seeds stacked) on ``data`` (or a store path) and bucket the unannotated
    train entries by confidence before training (the engine's initial heads) and after the last
    epoch, pooling the seeds; per bucket the fraction that is truly positive (Fig. 5). For GR,
    k̂ = σ(w·p + b) at (w_0, b_0) and (w_T, b_T) is drawn against it; for every loss Eq. 6 with
    a = P(s=1 | y=1) = (observed positives) / (true positives) of the train split."""
    config, seeds = run_config(config)
    check_int(n_buckets, "--buckets", 2, 1000)
    check_losses([loss], None, "trains no head; pick a loss")
    hp = check_fixed(loss, hparams)
    data = load_data(data, config)
    x, mask, truth = unannotated_truth(data, "train")
    result = train_runs(data, config, loss, [hp], seeds, progress)
    before = bucket_rates(*_confidences(x, seeded_heads(seeds, data.feature_dim, data.n_classes),
                                        mask, truth), n_buckets)
    after = bucket_rates(*_confidences(x, result.final_heads, mask, truth), n_buckets)
    a = int((data.train_observed == 1).sum()) / max(int(data.train_labels.sum()), 1)
    fn_rate = float((mask & truth).sum()) / float(mask.sum())
    notes = list(result.config.get("notes", []))
    trial_hp = result.trials[0].hparams
    k_start = k_final = None
    if loss == "gr" and trial_hp.get("use_k", True):
        k_start = (float(trial_hp["w_0"]), float(trial_hp["b_0"]))
        if trial_hp.get("learn_kv"):
            notes.append("learn_kv=True: (w, b) were learned; the engine does not report their "
                         "final values, so only the start curve is drawn")
        else:
            k_final = (float(trial_hp["w_T"]), float(trial_hp["b_T"]))
    elif loss == "gr":
        notes.append("use_k=False: k̂ ≡ 0, no k̂ curve")
    gaps: dict[str, float | None] = {
        "Eq. 6 (1−a)p/(1−ap)": _gap(after, lambda p: scar_curve(p, a)),
        f"constant {fn_rate:.4f} (before)": _gap(before, lambda p: np.full_like(p, fn_rate)),
    }
    if k_start is not None:
        gaps["k̂ start (before)"] = _gap(before, lambda p: k_hat_curve(p, *k_start))
    if k_final is not None:
        gaps["k̂ final"] = _gap(after, lambda p: k_hat_curve(p, *k_final))
    return CalibrationResult(loss, before, after, k_start, k_final, a, fn_rate, gaps,
                             run_settings(data, result, seeds), trial_hp,
                             trial_scores(result, range(len(seeds))), notes)
