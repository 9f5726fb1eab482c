"""The GR paper's analyses, computed from the probe engine (``spml analyze …``).

Chen et al., "Boosting Single Positive Multi-label Classification with Generalized Robust Loss",
IJCAI 2024. Each analysis is a plain function that
trains linear probes with :func:`probe.train.train_probe` (or, for the curves, only evaluates a
loss) and returns a result object: numbers, tables and text, no drawing. Its figures are
:mod:`studies.analysis_figures`, whose ``write_outputs`` writes the JSON, Markdown and PNGs.

* :func:`run_ablation` — Table 3: GR with k̂, v and the robust L on and off (``use_k``,
  ``use_v``, ``robust``), the learned-(k̂, v) "◦" row (``learn_kv``) and the AN baseline. The
  switches are structural, so every row is its own run; the seeds of a row stack (T = seeds).
* :func:`run_sensitivity` — Fig. 2: τ = −b/w swept at fixed b_T (w_T = −b_T/τ, Eq. 8), μ_T at
  fixed σ_T (Eq. 11), a q2 × q3 grid (Eq. 14). All points of a sweep (× seeds) train stacked in
  one run: they are float hyperparameters.
* :func:`run_distinguish` — Fig. 3: per epoch, the exact 1-D Wasserstein-1 distance between the
  confidences p of the truly positive and the truly negative *unannotated* entries (ground
  truth: the store's full labels), plus their histograms at chosen epochs.
* :func:`run_calibration` — Fig. 5 / Appendix E.3: among unannotated train entries, the observed
  FN/(FN+TN) (fraction truly positive) per confidence bucket before and after training, against
  k̂ = σ(w·p + b) (Eq. 7) at the schedule's start and final values and Eq. 6's
  (1−a)p/(1−a·p) with a = P(s=1 | y=1) measured on the store.
* :func:`loss_curves` — Fig. 1: loss and gradient w.r.t. the logit (autograd) of any registered
  loss whose entry loss depends on that entry's p and label only, on an unannotated label (y=0)
  and on a positive (y=1), at chosen epochs of the loss's schedule.

Reported mAPs follow docs/protocol.md step 5: the epoch is chosen on val, test mAP is read at that
epoch; several seeds give mean ± sample standard deviation (as ``spml study confirm``).
"""

from __future__ import annotations

import math
import os
import statistics
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from probe.config import TRAINER_KEYS, ProbeConfig
from probe.data import ProbeData
from probe.errors import SpmlError
from probe.intervals import attach_test_intervals, mean_interval
from probe.loop import init_head
from probe.losses import LossInputError, create_loss, get_loss_class
from probe.losses._base import HParam, check_hparams
from probe.progress import Progress
from probe.results import EpochReport, ProbeResult
from probe.train import train_probe
from probe.trials import expand_grid

__all__ = [
    "ABLATION_ROWS",
    "GR_SWITCHES",
    "SWEEPS",
    "AblationResult",
    "AblationRow",
    "AnalyzeError",
    "BucketStats",
    "CalibrationResult",
    "CurvesResult",
    "DistinguishResult",
    "SensitivityResult",
    "Sweep",
    "ablation_hparams",
    "bucket_rates",
    "check_fixed",
    "format_table",
    "hist_epochs_for",
    "k_hat_curve",
    "loss_curves",
    "run_ablation",
    "run_calibration",
    "run_distinguish",
    "run_sensitivity",
    "scar_curve",
    "sweep_hparams",
    "sweep_points",
    "unannotated_truth",
    "wasserstein_1d",
]


class AnalyzeError(SpmlError):
    """Bad input to an analysis: the message names the argument, what was expected and got."""


# --------------------------------------------------------------------------------------------
# numbers: Wasserstein-1, confidence buckets, the k̂ and Eq. 6 curves
# --------------------------------------------------------------------------------------------


def wasserstein_1d(u: Tensor | np.ndarray | Sequence[float],
                   v: Tensor | np.ndarray | Sequence[float]) -> float:
    """Exact Wasserstein-1 distance of two 1-D empirical distributions (paper Fig. 3a).

    W1 = ∫ |F_u(x) − F_v(x)| dx, evaluated exactly between consecutive sorted sample values
    (the sorted-CDF formula; equals ``scipy.stats.wasserstein_distance`` without weights).
    Computed in float64 on the inputs' device.
    """
    a = torch.as_tensor(u).detach().to(torch.float64).flatten()
    b = torch.as_tensor(v).detach().to(device=a.device, dtype=torch.float64).flatten()
    if a.numel() == 0 or b.numel() == 0:
        raise AnalyzeError(
            f"wasserstein_1d needs two non-empty samples; got {a.numel()} and {b.numel()} values"
        )
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise AnalyzeError("wasserstein_1d: the samples contain NaN or inf")
    a, b = a.sort().values, b.sort().values
    both = torch.cat([a, b]).sort().values
    deltas = both.diff()
    cdf_a = torch.searchsorted(a, both[:-1], right=True).to(torch.float64) / a.numel()
    cdf_b = torch.searchsorted(b, both[:-1], right=True).to(torch.float64) / b.numel()
    return float(((cdf_a - cdf_b).abs() * deltas).sum())


@dataclass(frozen=True)
class BucketStats:
    """Entries grouped by confidence into ``n`` equal buckets of [0, 1] (paper Appendix E.3).

    ``rate[i]`` = positives / count of bucket i, i.e. FN/(FN+TN) when the entries are the
    unannotated ones (NaN for an empty bucket); ``mean_p[i]`` the mean confidence inside it.
    """

    edges: np.ndarray  # (n + 1,)
    counts: np.ndarray  # (n,) int
    positives: np.ndarray  # (n,) int
    rate: np.ndarray  # (n,) float, NaN where empty
    mean_p: np.ndarray  # (n,) float, NaN where empty

    def to_dict(self) -> dict[str, list]:
        return {k: _json_floats(v) for k, v in asdict(self).items()}


def bucket_rates(p: Tensor | np.ndarray, truth: Tensor | np.ndarray,
                 n_buckets: int = 100) -> BucketStats:
    """Bucket confidences ``p`` ∈ [0, 1] into ``n_buckets`` equal intervals ([i/n, (i+1)/n),
    the last one closed) and count the entries and the true positives (``truth`` 1/True) in
    each (Fig. 5: FN/(FN+TN) per bucket when the entries are the unannotated ones)."""
    if isinstance(n_buckets, bool) or not isinstance(n_buckets, int) or n_buckets < 1:
        raise AnalyzeError(f"n_buckets must be a positive integer; got {n_buckets!r}")
    pt = torch.as_tensor(p).detach().to(torch.float64).flatten().cpu()
    yt = torch.as_tensor(truth).detach().flatten().cpu().to(torch.float64)
    if pt.shape != yt.shape:
        raise AnalyzeError(
            f"bucket_rates: p has {pt.numel()} values but truth has {yt.numel()}"
        )
    if pt.numel() and (pt.isnan().any() or pt.min() < 0 or pt.max() > 1):
        raise AnalyzeError("bucket_rates: confidences must lie in [0, 1] (no NaN)")
    idx = (pt * n_buckets).floor().clamp(0, n_buckets - 1).long()
    counts = torch.bincount(idx, minlength=n_buckets)
    positives = torch.bincount(idx, weights=yt, minlength=n_buckets)
    sum_p = torch.bincount(idx, weights=pt, minlength=n_buckets)
    denom = counts.to(torch.float64)
    empty = counts == 0
    rate = torch.where(empty, math.nan, positives / denom.clamp_min(1))
    mean_p = torch.where(empty, math.nan, sum_p / denom.clamp_min(1))
    return BucketStats(
        edges=np.linspace(0.0, 1.0, n_buckets + 1),
        counts=counts.numpy().astype(np.int64),
        positives=positives.round().numpy().astype(np.int64),
        rate=rate.numpy(),
        mean_p=mean_p.numpy(),
    )


def k_hat_curve(p: np.ndarray | float, w: float, b: float) -> np.ndarray:
    """GR's soft pseudo-label k̂(p) = σ(w·p + b) (paper Eq. 7)."""
    return 1.0 / (1.0 + np.exp(-(w * np.asarray(p, dtype=float) + b)))


def scar_curve(p: np.ndarray | float, a: float) -> np.ndarray:
    """Eq. 6: k(x) = (1−a)·p / (1 − a·p), the probability that an unannotated entry with
    P(y=1 | x) = p is a false negative when labels are selected completely at random with
    a = P(s=1 | y=1)."""
    if not 0 < a <= 1:
        raise AnalyzeError(f"scar_curve: a = P(s=1 | y=1) must lie in (0, 1]; got {a!r}")
    q = np.asarray(p, dtype=float)
    if a == 1:  # every positive observed: no false negative (and no 0/0 at p = 1)
        return np.zeros_like(q)
    return (1 - a) * q / (1 - a * q)


def unannotated_truth(data: ProbeData, split: str = "train") -> tuple[Tensor, Tensor, Tensor]:
    """``(x (N, D+1), mask (N, C) bool, labels (N, C) bool)`` of ``split``'s unflipped rows:
    ``mask`` marks the unannotated entries (observed 0), ``labels`` the store's full labels.

    Raises :class:`AnalyzeError` when the labels hold no positive (or no negative) among the
    unannotated entries: then the store's labels are only the single positives, not the full
    ground truth that distinguish / calibration need.
    """
    if split == "train":
        x, obs, lab = data.train_x[: data.n_train], data.train_observed, data.train_labels
    elif split == "val":
        x, obs, lab = data.val_x, data.val_observed, data.val_labels
    else:
        raise AnalyzeError(f"split must be 'train' or 'val'; got {split!r}")
    mask = obs == 0
    truth = lab.bool()
    n_pos = int((mask & truth).sum())
    n_neg = int((mask & ~truth).sum())
    if n_pos == 0 or n_neg == 0:
        where = data.source.get("path", data.dataset)
        raise AnalyzeError(
            f"store {where}: among the {int(mask.sum())} unannotated {split} entries the labels "
            f"have {n_pos} positives and {n_neg} negatives, so the store has no full ground "
            "truth beyond the single positives (its labels equal the observed ones); this "
            "analysis needs a store built from fully annotated data (e.g. 'spml import yeast', "
            "a VOC/COCO/NUS/CUB featurize, or 'spml import arrays' with full label matrices)"
        )
    return x, mask, truth


# --------------------------------------------------------------------------------------------
# shared helpers: seeds, mean ± std, tables, hyperparameters, training settings
# --------------------------------------------------------------------------------------------


def _seeds(config: ProbeConfig) -> tuple[int, ...]:
    return tuple(config.seeds) if config.seeds is not None else (config.seed,)


def _finite_or_nan(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else math.nan


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value), as ``spml study confirm``."""
    vals = [_finite_or_nan(v) for v in values]
    if not vals:
        return math.nan, math.nan
    mean = statistics.fmean(vals)
    return mean, (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def _pm(mean: float, std: float, n: int) -> str:
    if not math.isfinite(mean):
        return "nan"
    return f"{mean:.2f} ± {std:.2f}" if n > 1 else f"{mean:.2f}"


def _json_floats(values: Any) -> list:
    """NumPy / tensor values as JSON-safe lists (NaN → None)."""
    arr = np.asarray(values.cpu() if isinstance(values, Tensor) else values)
    out = arr.tolist()

    def clean(v: Any) -> Any:
        if isinstance(v, list):
            return [clean(x) for x in v]
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v

    return clean(out)


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                 markdown: bool = False) -> str:
    """A text table: space-aligned columns for the terminal, or a GitHub Markdown table
    (first column left-aligned, the others right-aligned)."""
    if markdown:
        def cell(s: str) -> str:
            return str(s).replace("|", "\\|").replace("\n", " ")

        lines = ["| " + " | ".join(cell(h) for h in header) + " |",
                 "|" + "|".join(":--" if i == 0 else "--:" for i in range(len(header))) + "|"]
        lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
        return "\n".join(lines)
    def width(s: str) -> int:  # combining marks (the hat of k̂) take no column
        return sum(not unicodedata.combining(ch) for ch in s)

    def pad(s: str, w: int, left: bool) -> str:
        fill = " " * (w - width(s))
        return s + fill if left else fill + s

    table = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
    widths = [max(width(r[i]) for r in table) for i in range(len(header))]
    return "\n".join("  ".join(pad(c, w, i == 0) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in table)


#: GR's structural ablation switches (paper Table 3)
GR_SWITCHES = ("use_k", "use_v", "robust", "learn_kv")


def check_fixed(loss: str, hparams: dict[str, Any] | None, forbidden: Iterable[str] = (),
                 why: str = "") -> dict[str, Any]:
    """Validate single-valued hyperparameters for ``loss`` (names, ranges; trainer keys lr /
    weight_decay allowed) and refuse the ones the analysis sets itself."""
    hparams = dict(hparams or {})
    for key in forbidden:
        if key in hparams:
            raise AnalyzeError(f"--set {key}: {why or 'this analysis sets it itself'}")
    for key, value in hparams.items():
        if isinstance(value, list | tuple):
            raise AnalyzeError(
                f"--set {key}: takes one value here; got {len(value)} ({value!r})"
            )
    cls = get_loss_class(loss)
    check_hparams(cls.hparam_specs, {k: v for k, v in hparams.items() if k not in TRAINER_KEYS},
                  cls.name)
    for key in TRAINER_KEYS:
        if key in hparams:
            v = hparams[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or (
                v < 0 or (key == "lr" and v == 0)
            ):
                want = "positive" if key == "lr" else "non-negative"
                raise AnalyzeError(f"--set {key}: must be a {want} number; got {v!r}")
    return hparams


def _pin_training(config: ProbeConfig, result: ProbeResult) -> ProbeConfig:
    """The config with batch size, lr and epochs fixed to what ``result`` resolved, so every
    run of an analysis trains with the same settings (a loss without presets would otherwise
    fall back to the generic ones)."""
    cfg = result.config
    return replace(config, batch_size=int(cfg["batch_size"]), lr=float(cfg["lr"]),
                   epochs=int(cfg["epochs"]))


def _settings(data: ProbeData, result: ProbeResult, seeds: Sequence[int]) -> dict[str, Any]:
    cfg = result.config
    return {
        "store": data.source.get("path", "(arrays)"),
        "dataset": data.dataset,
        "n_train": data.n_train,
        "n_classes": data.n_classes,
        "batch_size": cfg["batch_size"], "batch_size_from": cfg.get("batch_size_from"),
        "lr": cfg["lr"], "lr_from": cfg.get("lr_from"),
        "epochs": cfg["epochs"], "epochs_from": cfg.get("epochs_from"),
        "optimizer": cfg["optimizer"],
        "seeds": list(seeds),
        "observed_seed": cfg["observed_seed"],
        "flip_used": cfg.get("flip_used"),
        "device": cfg.get("device"),
        "use_presets": cfg.get("use_presets"),
    }


def _settings_line(s: dict[str, Any]) -> str:
    return (f"{s['dataset']} ({s['n_train']} train rows, {s['n_classes']} classes), batch "
            f"{s['batch_size']}, lr {s['lr']:g}, {s['epochs']} epochs, {s['optimizer']}, "
            f"seeds {','.join(map(str, s['seeds']))}")


def _trial_scores(result: ProbeResult, trials: Sequence[int]) -> dict[str, Any]:
    """Val / test mAP of one point's trials (its seeds): mean, std, and the test mAP's 95%
    interval (:func:`_test_interval`)."""
    vals = [_finite_or_nan(result.trials[t].best.get("val_map")) for t in trials]
    tests = [_finite_or_nan(result.trials[t].best.get("test_map")) for t in trials]
    vm, vs = _mean_std(vals)
    tm, ts = _mean_std(tests)
    low, high = _test_interval(result, trials, tests)
    return {"val_mean": vm, "val_std": vs, "test_mean": tm, "test_std": ts,
            "test_low": low, "test_high": high, "val_maps": vals, "test_maps": tests,
            "best_epochs": [result.trials[t].best_epoch for t in trials]}


def _test_interval(result: ProbeResult, trials: Sequence[int], tests: list[float]
                   ) -> tuple[float, float]:
    """95% interval of a point's test mAP: of the mean over its seeds (Student t) when it has
    several, else over the test images (paired bootstrap, attached by :func:`_train`)."""
    if len(tests) > 1:
        iv = mean_interval(tests)
        return iv.low, iv.high
    best = result.trials[trials[0]].best
    return (_finite_or_nan(best.get("test_map_low")), _finite_or_nan(best.get("test_map_high")))


def _interval_caption(n_seeds: int) -> str:
    return ("95% interval of the mean over the seeds (Student t)" if n_seeds > 1 else
            "95% interval over the test images (paired bootstrap, 1,000 resamples)")


def _iv(low: float, high: float) -> str:
    return f"[{low:.2f}, {high:.2f}]" if math.isfinite(low) and math.isfinite(high) else "-"


def _train(data: ProbeData, config: ProbeConfig, loss: str, hparams: Sequence[dict],
           seeds: Sequence[int], progress: bool) -> ProbeResult:
    """Every hyperparameter dict × every seed as one stacked run (trial = point·S + seed);
    with one seed, each trial's test mAP gets its bootstrap interval over the test images."""
    trials = [dict(h) for h in hparams for _ in seeds]
    cfg = replace(config, seeds=tuple(s for _ in hparams for s in seeds))
    result = train_probe(data, cfg, loss, trials, progress=progress)
    if len(seeds) == 1:
        attach_test_intervals(result, data)
    return result


# --------------------------------------------------------------------------------------------
# result objects: tables, JSON, Markdown, figures
# --------------------------------------------------------------------------------------------


@dataclass
class _Result(ABC):
    """What every analysis returns: a title, its settings, notes; tables and figures."""

    kind: str = field(init=False, default="")  # names the output files: <kind>.json / .md
    title: str = field(init=False, default="")

    @abstractmethod
    def tables(self) -> list[tuple[str, list[str], list[list[str]]]]:
        """``(caption, header, rows)`` of every table."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """Everything the analysis measured, JSON-ready (the ``<kind>.json`` file)."""

    def subtitle(self) -> str:
        s = getattr(self, "settings", None)
        return _settings_line(s) if s else ""

    def text(self) -> str:
        """The tables as the terminal shows them."""
        parts = [f"{self.title}", self.subtitle()]
        for caption, header, rows in self.tables():
            parts += ["", caption, format_table(header, rows)]
        for note in getattr(self, "notes", []):
            parts.append(f"note: {note}")
        return "\n".join(p for p in parts if p is not None)

    def markdown(self, figures: Sequence[Path] = (), base: Path | None = None) -> str:
        lines = [f"# {self.title}", ""]
        if self.subtitle():
            lines += [f"_{self.subtitle()}_", ""]
        for caption, header, rows in self.tables():
            lines += [f"**{caption}**", "", format_table(header, rows, markdown=True), ""]
        for path in figures:
            rel = os.path.relpath(path, base) if base is not None else str(path)
            lines += [f"![{path.stem}]({rel.replace(os.sep, '/')})", ""]
        for note in getattr(self, "notes", []):
            lines += [f"> **Note:** {note}", ""]
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# ablation (paper Table 3)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AblationRow:
    """One row of Table 3: its loss and switches, and the paper's marks (k̂, v, L)."""

    name: str
    loss: str
    switches: dict[str, bool]
    marks: tuple[str, str, str]  # ✓ on, × off, ◦ learned (Table 3's symbols)


def _gr_row(name: str, k: bool, v: bool, robust: bool, learn: bool = False) -> AblationRow:
    def mark(on: bool) -> str:
        return "◦" if learn else ("✓" if on else "×")

    switches = {"use_k": k, "use_v": v, "robust": robust}
    if learn:
        switches["learn_kv"] = True
    return AblationRow(name, "gr", switches, (mark(k), mark(v), "✓" if robust else "×"))


#: Table 3 in the paper's order: the AN baseline, the 7 combinations of k̂ / v / L, the "◦" row
ABLATION_ROWS: tuple[AblationRow, ...] = (
    AblationRow("AN (baseline)", "an", {}, ("×", "×", "×")),
    _gr_row("k̂", True, False, False),
    _gr_row("v", False, True, False),
    _gr_row("L", False, False, True),
    _gr_row("k̂ + v", True, True, False),
    _gr_row("k̂ + L", True, False, True),
    _gr_row("v + L", False, True, True),
    _gr_row("GR (k̂ + v + L)", True, True, True),
    _gr_row("learned k̂, v + L", True, True, True, learn=True),
)
_REFERENCE_ROW = "GR (k̂ + v + L)"


@dataclass
class AblationResult(_Result):
    """Table 3 on this store: per row val and test mAP (mean ± std over seeds)."""

    rows: list[dict[str, Any]]
    settings: dict[str, Any]
    hparams: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kind, self.title = "ablation", "GR ablation (paper Table 3)"

    def tables(self):
        n = len(self.settings["seeds"])
        header = ["row", "k̂", "v", "L", "loss", "val mAP", "test mAP", "95% interval",
                  "best epoch"]
        rows = [[r["name"], *r["marks"], r["loss"], _pm(r["val_mean"], r["val_std"], n),
                 _pm(r["test_mean"], r["test_std"], n), _iv(r["test_low"], r["test_high"]),
                 ",".join("-" if e is None else str(e) for e in r["best_epochs"])]
                for r in self.rows]
        cap = ("mAP (%) at the best val epoch" + (f", mean ± std over {n} seeds" if n > 1 else "")
               + f"; test mAP's {_interval_caption(n)}"
               + "; ✓ on, × off (k̂ ≡ 0, v ≡ 1, q1 = q2 = q3 = 0.01), ◦ learned by gradient "
               "descent; best epoch counted from 1")
        return [(cap, header, rows)]

    def to_dict(self) -> dict[str, Any]:
        return {"analysis": "ablation", "paper": "GR Loss, IJCAI 2024, Table 3",
                "settings": self.settings, "hparams": self.hparams, "rows": self.rows,
                "notes": self.notes}


def ablation_hparams(hparams: dict[str, Any] | None) -> dict[str, Any]:
    """Validate the GR hyperparameters shared by the ablation's rows (not the switches)."""
    return check_fixed("gr", hparams, GR_SWITCHES, "the ablation sets the switches per row")


def run_ablation(
    data: ProbeData,
    config: ProbeConfig | None = None,
    hparams: dict[str, Any] | None = None,
    *,
    rows: Sequence[AblationRow] = ABLATION_ROWS,
    progress: bool = False,
) -> AblationResult:
    """Train every row of Table 3 (``rows``) on ``data`` and collect val / test mAP.

    ``hparams``: GR hyperparameters for every GR row (single values; the switches are the
    rows'); unset ones come from the paper preset for the store's dataset, else GR's defaults.
    The GR row with everything on trains first; its resolved batch size, lr and epochs are
    then used for every other row (the AN baseline included). The seeds of a row stack.
    """
    config = config or ProbeConfig()
    config.validate()
    hp = ablation_hparams(hparams)
    if not rows:
        raise AnalyzeError("run_ablation: no rows to train")
    seeds = _seeds(config)
    order = sorted(range(len(rows)), key=lambda i: rows[i].name != _REFERENCE_ROW)
    results: dict[int, ProbeResult] = {}
    bar = Progress(len(rows), "ablation rows", "run", enabled=progress)
    for i in order:
        row = rows[i]
        row_hp = {**hp, **row.switches} if row.loss == "gr" else {
            k: v for k, v in hp.items() if k in TRAINER_KEYS}
        results[i] = _train(data, config, row.loss, [row_hp], seeds, progress)
        if len(results) == 1:
            config = _pin_training(config, results[i])
        bar.update(1)
    bar.close()
    out_rows = []
    for i, row in enumerate(rows):
        r = results[i]
        scores = _trial_scores(r, range(len(seeds)))
        out_rows.append({"name": row.name, "loss": row.loss, "marks": list(row.marks),
                         "switches": row.switches, **scores,
                         "hparams": r.trials[0].hparams})
    first = results[order[0]]
    notes = list(first.config.get("notes", []))
    if any(row.loss == "an" for row in rows):
        notes.append("the AN row trains the 'an' loss (−log p, −log(1−p)), the paper's "
                     "baseline; GR with k̂, v and L all off would give (1 − e^(−0.01·a))/0.01 "
                     "of AN's entry loss a (q = 0.01), not exactly AN")
    return AblationResult(out_rows, _settings(data, first, seeds), hp, notes)


# --------------------------------------------------------------------------------------------
# sensitivity (paper Fig. 2)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sweep:
    """One sensitivity analysis of Fig. 2: a swept value × a series value per point."""

    name: str  # tau | mu | q2q3
    x: str  # the swept quantity (tau, mu_T, q2)
    series: str  # the one held fixed per curve (b_T, sigma_T, q3)
    x_default: tuple[float, ...]
    series_default: tuple[float, ...]
    sets: tuple[str, ...]  # the GR hyperparameters a point sets
    needs: dict[str, bool]  # switches that must keep these values for the sweep to mean anything
    figure: str
    x_label: str
    series_label: str


#: Fig. 2a (τ at b_T ∈ {−2, −5, −8}), 2b (μ_T from 0.2 to 1 at σ_T ∈ {0.1, 0.5, 1}), 2c (q2 × q3)
SWEEPS: dict[str, Sweep] = {
    "tau": Sweep("tau", "tau", "b_T", (0.2, 0.4, 0.6, 0.8, 1.0), (-2.0, -5.0, -8.0),
                 ("w_T", "b_T"), {"use_k": True, "learn_kv": False}, "2a",
                 "τ = −b_T / w_T (k̂'s threshold)", "b_T"),
    "mu": Sweep("mu", "mu_T", "sigma_T", (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
                (0.1, 0.5, 1.0), ("mu_T", "sigma_T"), {"use_v": True, "learn_kv": False}, "2b",
                "μ_T (centre of v)", "σ_T"),
    "q2q3": Sweep("q2q3", "q2", "q3", (0.01, 0.1, 0.5, 1.0), (0.01, 0.1, 0.5, 1.0, 1.5),
                  ("q2", "q3"), {"robust": True}, "2c", "q2", "q3"),
}


def sweep_points(param: str, values: Sequence[float] | None = None,
                 series: Sequence[float] | None = None) -> list[dict[str, float]]:
    """The GR hyperparameters of every point of a sweep (series-major: for each series value
    all swept values). ``tau``: ``{"w_T": −b_T/τ, "b_T": b_T}`` (Eq. 8, τ > 0, b_T < 0);
    ``mu``: ``{"mu_T", "sigma_T"}`` (μ_T ∈ [0, 1], σ_T > 0); ``q2q3``: ``{"q2", "q3"}``
    (q ≥ 0). Each point also carries the plotted pair ``x`` / ``series``."""
    if param not in SWEEPS:
        raise AnalyzeError(f"--param must be one of {', '.join(SWEEPS)}; got {param!r}")
    sw = SWEEPS[param]
    xs = tuple(sw.x_default if values is None else values)
    ss = tuple(sw.series_default if series is None else series)
    for name, vals in ((sw.x, xs), (sw.series, ss)):
        if not vals:
            raise AnalyzeError(f"sensitivity {param}: give at least one {name} value")
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise AnalyzeError(f"sensitivity {param}: {name} values must be finite numbers; "
                                   f"got {v!r}")
        if len(set(vals)) != len(vals):
            raise AnalyzeError(f"sensitivity {param}: {name} values repeat: {list(vals)}")

    def bad(name: str, v: float, want: str) -> AnalyzeError:
        return AnalyzeError(f"sensitivity {param}: {name} = {v:g} is out of range; {want}")

    points = []
    for s in ss:
        for x in xs:
            if param == "tau":
                if x <= 0:
                    raise bad("tau", x, "τ = −b_T/w_T must be > 0 (k̂'s threshold on p; the paper "
                              "sweeps it in (0, 1])")
                if s >= 0:
                    raise bad("b_T", s, "b_T must be < 0 so that w_T = −b_T/τ is positive "
                              "(paper Fig. 2a: −2, −5, −8)")
                point = {"w_T": -s / x, "b_T": float(s)}
            elif param == "mu":
                if not 0 <= x <= 1:
                    raise bad("mu_T", x, "μ_T is the centre of v over p ∈ [0, 1] (Fig. 2b: "
                              "0.2 … 1)")
                if s <= 0:
                    raise bad("sigma_T", s, "σ_T (the width of v) must be > 0")
                point = {"mu_T": float(x), "sigma_T": float(s)}
            else:
                for name, q in (("q2", x), ("q3", s)):
                    if q < 0:
                        raise bad(name, q, "q must be >= 0 (0 = the −log limit, 1 = MAE)")
                point = {"q2": float(x), "q3": float(s)}
            points.append({"x": float(x), "series": float(s), "hparams": point})
    return points


@dataclass
class SensitivityResult(_Result):
    """Fig. 2 on this store: val / test mAP at every point of one sweep."""

    param: str
    points: list[dict[str, Any]]
    baseline: dict[str, Any] | None
    settings: dict[str, Any]
    hparams: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        sw = SWEEPS[self.param]
        self.kind = f"sensitivity_{self.param}"
        what = (f"{sw.x} × {sw.series}" if self.param == "q2q3"
                else f"{sw.x} at fixed {sw.series}")
        self.title = f"GR sensitivity to {what} (paper Fig. {sw.figure})"

    def tables(self):
        sw = SWEEPS[self.param]
        n = len(self.settings["seeds"])
        extra = ["w_T"] if self.param == "tau" else []
        header = [sw.series, sw.x, *extra, "val mAP", "test mAP", "95% interval"]
        rows = []
        for p in self.points:
            rows.append([f"{p['series']:g}", f"{p['x']:g}",
                         *[f"{p['hparams'][k]:.4g}" for k in extra],
                         _pm(p["val_mean"], p["val_std"], n),
                         _pm(p["test_mean"], p["test_std"], n),
                         _iv(p["test_low"], p["test_high"])])
        if self.baseline is not None:
            b = self.baseline
            rows.append(["AN baseline", "", *[""] * len(extra), _pm(b["val_mean"], b["val_std"], n),
                         _pm(b["test_mean"], b["test_std"], n), _iv(b["test_low"], b["test_high"])])
        cap = ("mAP (%) at the best val epoch" + (f", mean ± std over {n} seeds" if n > 1 else "")
               + f"; test mAP's {_interval_caption(n)}"
               + f"; all {len(self.points)} points trained stacked in one run")
        return [(cap, header, rows)]

    def to_dict(self) -> dict[str, Any]:
        sw = SWEEPS[self.param]
        return {"analysis": "sensitivity", "param": self.param, "x": sw.x, "series": sw.series,
                "paper": f"GR Loss, IJCAI 2024, Fig. {sw.figure}", "settings": self.settings,
                "hparams": self.hparams, "points": self.points, "baseline": self.baseline,
                "notes": self.notes}


def sweep_hparams(param: str, hparams: dict[str, Any] | None) -> dict[str, Any]:
    """Validate the GR hyperparameters held fixed in a sweep: single values, not the swept
    ones, and no switch that would make the swept ones unused (e.g. use_k=False for τ)."""
    if param not in SWEEPS:
        raise AnalyzeError(f"--param must be one of {', '.join(SWEEPS)}; got {param!r}")
    sw = SWEEPS[param]
    hp = check_fixed("gr", hparams, sw.sets,
                     f"the {param} sweep sets {' and '.join(sw.sets)} itself")
    for key, want in sw.needs.items():
        if key in hp and hp[key] != want:
            raise AnalyzeError(
                f"--set {key}={hp[key]}: the {param} sweep varies {', '.join(sw.sets)}, which "
                f"{key}={hp[key]} makes unused; drop it"
            )
    return hp


def run_sensitivity(
    data: ProbeData,
    config: ProbeConfig | None = None,
    param: str = "tau",
    *,
    values: Sequence[float] | None = None,
    series: Sequence[float] | None = None,
    hparams: dict[str, Any] | None = None,
    baseline: bool = True,
    progress: bool = False,
) -> SensitivityResult:
    """One sweep of Fig. 2 (``param`` ∈ :data:`SWEEPS`): every point × seed trains stacked in
    one GR run; ``baseline`` also trains AN with the same settings (the red line of Fig. 2).

    ``values``: the swept quantity (τ, μ_T or q2; defaults: the paper's ranges), ``series``:
    the one fixed per curve (b_T, σ_T or q3). ``hparams``: the other GR hyperparameters
    (single values; preset for the dataset, else GR's defaults, when not given).
    """
    config = config or ProbeConfig()
    config.validate()
    hp = sweep_hparams(param, hparams)
    points = sweep_points(param, values, series)
    seeds = _seeds(config)
    result = _train(data, config, "gr", [{**hp, **p["hparams"]} for p in points], seeds, progress)
    base = None
    if baseline:
        an = _train(data, _pin_training(config, result), "an",
                    [{k: v for k, v in hp.items() if k in TRAINER_KEYS}], seeds, progress)
        base = _trial_scores(an, range(len(seeds)))
    out = []
    for i, p in enumerate(points):
        trials = range(i * len(seeds), (i + 1) * len(seeds))
        out.append({**p, **_trial_scores(result, trials)})
    return SensitivityResult(param, out, base, _settings(data, result, seeds), hp,
                             list(result.config.get("notes", [])))


# --------------------------------------------------------------------------------------------
# distinguishability (paper Fig. 3)
# --------------------------------------------------------------------------------------------


_ROW_BLOCK = 8192  # rows per product: the float32 copy of a block stays small (COCO: 67 MB)


def _masked_probs(x: Tensor, head: Tensor, mask: Tensor) -> Tensor:
    """σ(x @ head)[mask] for features ``x`` (N, D+1) in their storage dtype and one head
    (D+1, C), computed in float32 row blocks (row-major order of the masked entries)."""
    w = head.to(device=x.device, dtype=torch.float32)
    parts = [torch.sigmoid(x[r0 : r0 + _ROW_BLOCK].float() @ w)[mask[r0 : r0 + _ROW_BLOCK]]
             for r0 in range(0, x.shape[0], _ROW_BLOCK)]
    return torch.cat(parts)


class _DistinguishProbe:
    """Per-epoch W1 and histograms of the confidences of the unannotated entries."""

    def __init__(self, x: Tensor, mask: Tensor, truth: Tensor, bins: int) -> None:
        self.x, self.mask, self.bins = x, mask, bins
        self.pos = truth[mask]
        self.w1: list[list[float]] = []  # per evaluated epoch, per trial
        self.hist_pos: list[list[int]] = []  # per evaluated epoch (pooled over trials)
        self.hist_neg: list[list[int]] = []
        self.epochs: list[int] = []  # completed epochs (0 = before training)

    def measure(self, epoch: int, heads: Tensor) -> None:
        w1, hp, hn = [], torch.zeros(self.bins, dtype=torch.float64), torch.zeros(
            self.bins, dtype=torch.float64)
        for t in range(heads.shape[0]):
            p = _masked_probs(self.x, heads[t], self.mask)
            pp, pn = p[self.pos], p[~self.pos]
            w1.append(wasserstein_1d(pp, pn))
            hp += torch.histc(pp.double(), self.bins, 0, 1).cpu()
            hn += torch.histc(pn.double(), self.bins, 0, 1).cpu()
        self.epochs.append(epoch)
        self.w1.append(w1)
        self.hist_pos.append(hp.round().long().tolist())
        self.hist_neg.append(hn.round().long().tolist())

    def callback(self, report: EpochReport) -> None:
        heads = getattr(report, "heads", None)
        if heads is None:
            raise AnalyzeError(
                "distinguish needs the engine's per-epoch heads (probe.train.EpochReport.heads); "
                "this version of probe.train does not provide them"
            )
        self.measure(report.epoch, heads)  # epochs count from 1; 0 = init


def _init_heads(seeds: Sequence[int], d: int, c: int) -> Tensor:
    """(T, D+1, C): the untrained heads exactly as the engine draws them (probe.train.init_head)."""
    out = []
    for s in seeds:
        weight, bias = init_head(s, d, c)
        out.append(torch.cat([weight.T, bias[None]]))
    return torch.stack(out)


@dataclass
class DistinguishResult(_Result):
    """Fig. 3 on this store: per loss and epoch the W1 distance between the confidences of the
    positive and negative unannotated entries, and their histograms."""

    losses: list[dict[str, Any]]
    split: str
    bins: int
    hist_epochs: dict[str, list[int]]
    settings: dict[str, Any]
    counts: dict[str, int]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kind = "distinguish"
        self.title = "Distinguishability of unannotated labels (paper Fig. 3)"

    def tables(self):
        n = len(self.settings["seeds"])
        names = [r["loss"] for r in self.losses]
        header = ["epoch", *[f"W1 {name}" for name in names]]
        epochs = self.losses[0]["epochs"]
        rows = []
        for j, e in enumerate(epochs):
            row = [str(e) + (" (init)" if e == 0 else "")]
            for r in self.losses:
                m, s = r["w1_mean"][j], r["w1_std"][j]
                mark = " *" if r["best_epoch"] == e else ""
                row.append((f"{m:.4f} ± {s:.4f}" if n > 1 else f"{m:.4f}") + mark)
            rows.append(row)
        cap = (f"Wasserstein-1 distance between the confidences p of the truly positive "
               f"({self.counts['positive']}) and truly negative ({self.counts['negative']}) "
               f"unannotated {self.split} entries after each epoch"
               + (f", mean ± std over {n} seeds" if n > 1 else "")
               + "; * = the best val epoch of the first seed")
        score_rows = [[r["loss"], _pm(r["val_mean"], r["val_std"], n),
                       _pm(r["test_mean"], r["test_std"], n)] for r in self.losses]
        return [(cap, header, rows),
                ("mAP (%) at the best val epoch", ["loss", "val mAP", "test mAP"], score_rows)]

    def to_dict(self) -> dict[str, Any]:
        return {"analysis": "distinguish", "paper": "GR Loss, IJCAI 2024, Fig. 3",
                "split": self.split, "bins": self.bins, "counts": self.counts,
                "hist_epochs": self.hist_epochs, "settings": self.settings,
                "losses": self.losses, "notes": self.notes}


def hist_epochs_for(spec: Sequence[int | str], n_epochs: int | None, best: int | None = None
                    ) -> list[int]:
    """The completed epochs ``spec`` names (numbers 0..n_epochs, 'best', 'last'), in order,
    without repeats; with ``n_epochs`` None only the kinds of the items are checked."""
    out: list[int] = []
    top = "E" if n_epochs is None else str(n_epochs)
    for item in spec:
        if item == "best":
            e = best if best is not None else n_epochs
        elif item == "last":
            e = n_epochs
        elif isinstance(item, int) and not isinstance(item, bool) and (
                item >= 0 and (n_epochs is None or item <= n_epochs)):
            e = item
        else:
            raise AnalyzeError(
                f"--hist-epochs: expected completed-epoch numbers 0..{top} (0 = before "
                f"training), 'best' or 'last'; got {item!r}"
            )
        if e is not None and e not in out:
            out.append(e)
    if not spec:
        raise AnalyzeError("--hist-epochs: give at least one epoch")
    return out


def run_distinguish(
    data: ProbeData,
    config: ProbeConfig | None = None,
    losses: Sequence[str] = ("gr", "an"),
    *,
    hparams: dict[str, dict[str, Any]] | None = None,
    split: str = "train",
    hist_epochs: Sequence[int | str] = (1, "best", "last"),
    bins: int = 50,
    progress: bool = False,
) -> DistinguishResult:
    """Train each loss in turn (its seeds stacked) and measure, before training and after every
    epoch, W1 between the confidences of the truly positive and truly negative unannotated
    entries of ``split`` (train by default; the paper used its validation images), with
    ``bins`` histogram bins over [0, 1] at ``hist_epochs`` (completed epochs, 0 = before
    training, or 'best' / 'last'). ``hparams``: per loss name, single values. All losses train
    with the first loss's resolved batch size, lr and epochs."""
    config = config or ProbeConfig()
    config.validate()
    if not losses:
        raise AnalyzeError("--loss: give at least one loss")
    if len(set(losses)) != len(losses):
        raise AnalyzeError(f"--loss: a loss is listed twice: {list(losses)}")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
        raise AnalyzeError(f"--bins must be an integer >= 2; got {bins!r}")
    hparams = hparams or {}
    unknown = set(hparams) - set(losses)
    if unknown:
        raise AnalyzeError(f"hyperparameters given for {sorted(unknown)}, which are not among "
                           f"the losses {list(losses)}")
    if "knn" in losses:
        raise AnalyzeError("--loss knn: the kNN baseline trains no head; pick a loss")
    fixed = {name: check_fixed(name, hparams.get(name)) for name in losses}
    hist_epochs_for(hist_epochs, config.epochs)
    x, mask, truth = unannotated_truth(data, split)
    seeds = _seeds(config)
    config = replace(config, eval_every=1)
    init = _init_heads(seeds, data.feature_dim, data.n_classes)
    out, first = [], None
    for name in losses:
        probe = _DistinguishProbe(x, mask, truth, bins)
        probe.measure(0, init)
        trials = [dict(fixed[name]) for _ in seeds]
        cfg = replace(config, seeds=tuple(seeds))
        result = train_probe(data, cfg, name, trials, callback=probe.callback, progress=progress)
        if first is None:
            first = result
            config = _pin_training(config, result)
            hist_epochs_for(hist_epochs, config.epochs)  # before the other losses train
        w1 = np.array(probe.w1)  # (epochs + 1, T)
        best = result.trials[0].best_epoch
        scores = _trial_scores(result, range(len(seeds)))
        out.append({
            "loss": name, "hparams": result.trials[0].hparams, "epochs": probe.epochs,
            "w1": _json_floats(w1), "w1_mean": _json_floats(w1.mean(1)),
            "w1_std": _json_floats(w1.std(1, ddof=1) if w1.shape[1] > 1 else 0 * w1.mean(1)),
            "hist_pos": probe.hist_pos, "hist_neg": probe.hist_neg,
            "best_epoch": best, **scores,
        })
    assert first is not None
    n_epochs = int(first.config["epochs"])
    chosen = {r["loss"]: hist_epochs_for(hist_epochs, n_epochs, r["best_epoch"]) for r in out}
    counts = {"unannotated": int(mask.sum()), "positive": int((mask & truth).sum()),
              "negative": int((mask & ~truth).sum())}
    return DistinguishResult(out, split, bins, chosen, _settings(data, first, seeds), counts,
                             list(first.config.get("notes", [])))


# --------------------------------------------------------------------------------------------
# calibration of k̂ (paper Fig. 5, Appendix E.3)
# --------------------------------------------------------------------------------------------


@dataclass
class CalibrationResult(_Result):
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

    def __post_init__(self) -> None:
        self.kind = "calibration"
        self.title = ("Calibration of k̂: FN/(FN+TN) per confidence bucket (paper Fig. 5), "
                      f"{self.loss}")

    def tables(self):
        n = len(self.before.counts)
        header = ["bucket", "n before", "FN rate before", "n after", "FN rate after"]
        if self.k_start is not None:
            header += ["k̂ start", "k̂ final" if self.k_final is not None else ""]
        header += ["Eq. 6"]
        rows = []
        for i in range(n):
            if self.before.counts[i] == 0 and self.after.counts[i] == 0:
                continue
            centre = (i + 0.5) / n
            row = [f"[{self.before.edges[i]:.2f}, {self.before.edges[i + 1]:.2f})",
                   str(self.before.counts[i]), _f3(self.before.rate[i]),
                   str(self.after.counts[i]), _f3(self.after.rate[i])]
            if self.k_start is not None:
                row.append(_f3(float(k_hat_curve(centre, *self.k_start))))
                row.append(_f3(float(k_hat_curve(centre, *self.k_final)))
                           if self.k_final is not None else "")
            row.append(_f3(float(scar_curve(centre, self.a))))
            rows.append(row)
        cap = (f"unannotated train entries per confidence bucket (empty buckets left out); "
               f"FN rate = fraction truly positive; curves at the bucket centre; overall "
               f"FN/(FN+TN) = {self.fn_rate:.4f}; a = P(s=1|y=1) = {self.a:.4f}")
        gap_rows = [[k, "-" if v is None else f"{v:.4f}"] for k, v in self.gaps.items()]
        return [(cap, header, rows),
                ("count-weighted mean |FN rate − curve| over the buckets (after training "
                 "unless named 'before')", ["curve", "gap"], gap_rows)]

    def to_dict(self) -> dict[str, Any]:
        return {"analysis": "calibration", "paper": "GR Loss, IJCAI 2024, Fig. 5 / App. E.3",
                "loss": self.loss, "before": self.before.to_dict(),
                "after": self.after.to_dict(), "k_start": self.k_start, "k_final": self.k_final,
                "a": self.a, "fn_rate": self.fn_rate, "gaps": self.gaps,
                "settings": self.settings, "hparams": self.hparams, "scores": self.scores,
                "notes": self.notes}


def _f3(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:.3f}"


def _gap(stats: BucketStats, curve: Callable[[np.ndarray], np.ndarray]) -> float | None:
    ok = stats.counts > 0
    if not ok.any():
        return None
    diff = np.abs(stats.rate[ok] - curve(stats.mean_p[ok]))
    return float((diff * stats.counts[ok]).sum() / stats.counts[ok].sum())


def _confidences(x: Tensor, heads: Tensor, mask: Tensor, truth: Tensor) -> tuple[Tensor, Tensor]:
    """The masked entries' confidences under every head (trials pooled) and their truth."""
    ps = [_masked_probs(x, heads[t], mask) for t in range(heads.shape[0])]
    return torch.cat(ps), truth[mask].repeat(heads.shape[0])


def run_calibration(
    data: ProbeData,
    config: ProbeConfig | None = None,
    loss: str = "gr",
    *,
    hparams: dict[str, Any] | None = None,
    n_buckets: int = 100,
    progress: bool = False,
) -> CalibrationResult:
    """Train ``loss`` (seeds stacked) and bucket the unannotated train entries by confidence
    before training (the engine's initial heads) and after the last epoch, pooling the seeds;
    per bucket the fraction that is truly positive (Fig. 5). For GR, k̂ = σ(w·p + b) at
    (w_0, b_0) and (w_T, b_T) is drawn against it; for every loss Eq. 6 with a = P(s=1 | y=1)
    = (observed positives) / (true positives) of the train split."""
    config = config or ProbeConfig()
    config.validate()
    if isinstance(n_buckets, bool) or not isinstance(n_buckets, int) or not 2 <= n_buckets <= 1000:
        raise AnalyzeError(f"--buckets must be an integer in [2, 1000]; got {n_buckets!r}")
    if loss == "knn":
        raise AnalyzeError("--loss knn: the kNN baseline trains no head; pick a loss")
    hp = check_fixed(loss, hparams)
    x, mask, truth = unannotated_truth(data, "train")
    seeds = _seeds(config)
    result = _train(data, config, loss, [hp], seeds, progress)
    before = bucket_rates(*_confidences(x, _init_heads(seeds, data.feature_dim, data.n_classes),
                                        mask, truth), n_buckets)
    after = bucket_rates(*_confidences(x, result.final_heads, mask, truth), n_buckets)
    observed_pos = int((data.train_observed == 1).sum())
    true_pos = int(data.train_labels.sum())
    a = observed_pos / max(true_pos, 1)
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
                             _settings(data, result, seeds), trial_hp,
                             _trial_scores(result, range(len(seeds))), notes)


# --------------------------------------------------------------------------------------------
# loss and gradient curves (paper Fig. 1)
# --------------------------------------------------------------------------------------------


@dataclass
class CurvesResult(_Result):
    """Fig. 1: per loss, variant and epoch, the entry loss and its gradient w.r.t. the logit on
    an unannotated label (y=0) and a positive (y=1), as functions of p."""

    p: list[float]
    curves: list[dict[str, Any]]
    n_epochs: int
    classes: int
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kind = "curves"
        self.title = "Loss and gradient curves (paper Fig. 1)"

    def subtitle(self) -> str:
        return (f"per-entry loss ℓ(p) and ∂ℓ/∂z (autograd, z = logit p) over {len(self.p)} "
                f"values of p; schedules over {self.n_epochs} epochs")

    def tables(self):
        probes = [0.1, 0.3, 0.5, 0.7, 0.9]
        p = np.asarray(self.p)
        idx = [int(np.abs(p - q).argmin()) for q in probes]
        header = ["curve", *[f"y=0 ∂ℓ/∂z p={p[i]:.2f}" for i in idx],
                  *[f"y=1 ∂ℓ/∂z p={p[i]:.2f}" for i in idx]]
        rows = [[c["label"], *[f"{c['grad_y0'][i]:.4f}" for i in idx],
                 *[f"{c['grad_y1'][i]:.4f}" for i in idx]] for c in self.curves]
        return [("gradient w.r.t. the logit at a few p (all values in the JSON)", header, rows)]

    def to_dict(self) -> dict[str, Any]:
        return {"analysis": "curves", "paper": "GR Loss, IJCAI 2024, Fig. 1", "p": self.p,
                "n_epochs": self.n_epochs, "classes": self.classes, "curves": self.curves,
                "notes": self.notes}


def _entry_curves(loss_obj: Any, z: Tensor, y: int, classes: int) -> tuple[Tensor, Tensor]:
    """Per-entry loss and d loss / d z for logits ``z`` (P,) with label ``y``: every entry is
    its own trial (T = P, one sample, ``classes`` identical columns), so the (T,) loss is the
    entry loss and autograd gives its derivative."""
    leaf = z.detach().clone().view(-1, 1, 1).requires_grad_(True)
    logits = leaf.expand(-1, 1, classes)
    observed = torch.full((1, classes), y, dtype=torch.int8)
    with torch.enable_grad():
        out = loss_obj(logits, observed).loss
        (grad,) = torch.autograd.grad(out.sum(), leaf)
    return out.detach().reshape(-1), grad.reshape(-1)


def _entrywise_problem(loss_obj: Any, z: Tensor, y: int, classes: int, value: Tensor,
                       grad: Tensor) -> str | None:
    """Why the loss is not a function of the entry's own p and label (None when it is): the
    same entries as one batch must give the mean of the per-entry losses, and an entry's
    gradient must not change when the other classes of its sample change."""
    tol = {"rtol": 1e-6, "atol": 1e-9}
    p_n = z.numel()
    leaf = z.detach().clone().view(-1, 1).requires_grad_(True)
    observed = torch.full((p_n, classes), y, dtype=torch.int8)
    with torch.enable_grad():
        out = loss_obj(leaf.expand(-1, classes), observed).loss
        (g,) = torch.autograd.grad(out.sum(), leaf)
    if not (torch.allclose(out.detach().reshape(()), value.mean(), **tol)
            and torch.allclose(g.reshape(-1) * p_n, grad, **tol)):
        return "its loss depends on the other entries of the batch"
    if classes > 1:
        leaf = z.detach().clone().view(-1, 1, 1).requires_grad_(True)
        rest = torch.zeros(p_n, 1, classes - 1, dtype=z.dtype)
        observed = torch.zeros(1, classes, dtype=torch.int8)
        observed[0, 0] = y
        with torch.enable_grad():
            out = loss_obj(torch.cat([leaf, rest], dim=2), observed).loss
            (g,) = torch.autograd.grad(out.sum(), leaf)
        if not torch.allclose(g.reshape(-1) * classes, grad, **tol):
            return "an entry's gradient depends on the other classes of its sample"
    return None


def loss_curves(
    losses: Sequence[str],
    hparams: dict[str, dict[str, Any]] | None = None,
    *,
    n_epochs: int = 8,
    at: Sequence[int] | None = None,
    points: int = 199,
    classes: int = 20,
) -> CurvesResult:
    """Entry loss ℓ and ∂ℓ/∂z (autograd) of each registered loss on y=0 and y=1 over p ∈
    (0, 1) (Fig. 1). ``hparams``: per loss, values or lists of values (lists give one curve per
    combination, e.g. q3 = 0.001, 0.5, 1 for Fig. 1a). ``at``: epochs of the schedule counted
    from 1 (default: first and last of ``n_epochs``); a loss whose curve does not change over
    them is drawn once. ``classes``: the sample's class count (WAN weights by 1/(C − 1)).

    Only losses whose entry loss depends on that entry's p and label alone can be drawn so;
    stateful losses and ones that depend on the batch or the sample's other classes (EPR, ROLE,
    vPU, ZLPR/OPML, LL after its first epoch, …) raise :class:`AnalyzeError` naming the reason.
    """
    if not losses:
        raise AnalyzeError("--loss: give at least one loss")
    if isinstance(n_epochs, bool) or not isinstance(n_epochs, int) or n_epochs < 1:
        raise AnalyzeError(f"--epochs must be a positive integer; got {n_epochs!r}")
    if isinstance(points, bool) or not isinstance(points, int) or not 3 <= points <= 100_000:
        raise AnalyzeError(f"--points must be an integer in [3, 100000]; got {points!r}")
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
        raise AnalyzeError(f"--classes must be a positive integer; got {classes!r}")
    at = list(at) if at is not None else sorted({1, n_epochs})
    for e in at:
        if isinstance(e, bool) or not isinstance(e, int) or not 1 <= e <= n_epochs:
            raise AnalyzeError(f"--at: epochs are counted from 1 to --epochs {n_epochs}; got {e!r}")
    hparams = hparams or {}
    unknown = set(hparams) - set(losses)
    if unknown:
        raise AnalyzeError(f"hyperparameters given for {sorted(unknown)}, which are not among "
                           f"the losses {list(losses)}")
    p = torch.linspace(0.002, 0.998, points, dtype=torch.float64)
    z = torch.logit(p)
    curves: list[dict[str, Any]] = []
    for name in losses:
        if name == "knn":
            raise AnalyzeError("--loss knn: the kNN baseline is not a loss")
        cls = get_loss_class(name)
        if cls.stateful:
            raise AnalyzeError(
                f"--loss {name}: keeps per-example state over the train split, so its loss is "
                "not a function of p alone; curves draw losses without state"
            )
        given = {k: (list(v) if isinstance(v, list | tuple) else [v])
                 for k, v in hparams.get(name, {}).items()}
        specs = {s.name: s for s in cls.hparam_specs}
        for key in given:
            if key not in specs:
                check_hparams(cls.hparam_specs, {key: None}, cls.name)  # raises with a hint
        varied = [k for k, v in given.items() if len(v) > 1]
        for variant in expand_grid(given):
            _fill_optional(cls.name, specs, variant)
            try:
                obj = create_loss(name, **variant)
            except LossInputError as err:
                raise AnalyzeError(f"--set for {name}: {err}") from None
            obj.setup(torch.zeros(1, classes, dtype=torch.int8), n_epochs=n_epochs)
            previous = None
            for e in at:
                obj.start_epoch(e - 1)
                entry = {}
                for y in (0, 1):
                    value, grad = _entry_curves(obj, z, y, classes)
                    if not (torch.isfinite(value).all() and torch.isfinite(grad).all()):
                        raise AnalyzeError(
                            f"--loss {name}: non-finite loss or gradient on y={y} with "
                            f"{variant or 'its defaults'} and {classes} classes"
                        )
                    why = _entrywise_problem(obj, z, y, classes, value, grad)
                    if why:
                        raise AnalyzeError(
                            f"--loss {name} at epoch {e}: not a per-entry function of p ({why}); "
                            "curves draw losses whose entry loss depends on that entry's p and "
                            "label only"
                        )
                    entry[f"loss_y{y}"] = value.tolist()
                    entry[f"grad_y{y}"] = grad.tolist()
                if previous is not None and entry == previous["data"]:
                    previous["epochs"].append(e)
                    continue
                label = name + "".join(f" {k}={variant[k]:g}" if isinstance(variant[k], float)
                                       else f" {k}={variant[k]}" for k in varied)
                previous = {"loss": name, "hparams": dict(variant), "epochs": [e],
                            "data": entry, "base": label}
                curves.append(previous)
    for c in curves:
        data = c.pop("data")
        base = c.pop("base")
        ep = c["epochs"]
        c["label"] = f"{base} @ epoch {','.join(map(str, ep))}" if _epoch_dependent(
            curves, c) else base
        c.update(data)
    return CurvesResult(p.tolist(), curves, n_epochs, classes)


def _epoch_dependent(curves: list[dict[str, Any]], c: dict[str, Any]) -> bool:
    """True when another curve has the same loss and hyperparameters (so epochs must be named)."""
    return any(o is not c and o["loss"] == c["loss"] and o["hparams"] == c["hparams"]
               for o in curves)


def _fill_optional(loss: str, specs: dict[str, HParam], variant: dict[str, Any]) -> None:
    for spec in specs.values():
        if spec.optional and variant.get(spec.name) is None:
            raise AnalyzeError(
                f"--loss {loss}: hyperparameter '{spec.name}' has no default ({spec.doc}); set "
                f"it with --set {loss}.{spec.name}=VALUE"
            )
