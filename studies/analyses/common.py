"""What the GR paper's analyses share (:mod:`studies.analyses`): their input error, the
numbers (Wasserstein-1, confidence buckets, the k̂ and Eq. 6 curves), seeds, mean ± std,
tables, the training settings and runs, the result objects' base class, and the
confidences of unannotated entries."""

from __future__ import annotations

import math
import os
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from probe.engine.config import TRAINER_KEYS, ProbeConfig
from probe.engine.data import ProbeData
from probe.engine.loop import init_head
from probe.engine.results import ProbeResult
from probe.engine.train import train_probe
from probe.errors import SpmlError, is_int
from probe.evaluation.intervals import attach_test_intervals, mean_interval, mean_std
from probe.losses import check_hparams, get_loss_class


class AnalyzeError(SpmlError):
    """Bad input to an analysis: the message names the argument, what was expected and got."""


def check_int(value: Any, flag: str, low: int, high: int | None = None) -> int:
    """``value`` when it is an integer in [low, high] (no upper bound when None), else an
    :class:`AnalyzeError` naming ``flag``."""
    if not is_int(value, low) or (high is not None and value > high):
        if high is not None:
            want = f"an integer in [{low}, {high}]"
        elif low == 1:
            want = "a positive integer"
        else:
            want = f"an integer >= {low}"
        raise AnalyzeError(f"{flag} must be {want}; got {value!r}")
    return value


def check_losses(losses: Sequence[str], hparams: dict[str, Any] | None, why_not_knn: str
                 ) -> dict[str, Any]:
    """``--loss`` (at least one, not knn) and ``--set`` given only for those losses; returns
    the hyperparameters (``{}`` for None)."""
    if not losses:
        raise AnalyzeError("--loss: give at least one loss")
    hparams = hparams or {}
    unknown = set(hparams) - set(losses)
    if unknown:
        raise AnalyzeError(f"--set: hyperparameters given for {', '.join(sorted(unknown))}, "
                           f"which are not among the losses {', '.join(losses)}")
    if "knn" in losses:
        raise AnalyzeError(f"--loss knn: the kNN baseline {why_not_knn}")
    return hparams


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
        return {k: json_floats(v) for k, v in asdict(self).items()}


def bucket_rates(p: Tensor | np.ndarray, truth: Tensor | np.ndarray,
                 n_buckets: int = 100) -> BucketStats:
    """Bucket confidences ``p`` ∈ [0, 1] into ``n_buckets`` equal intervals ([i/n, (i+1)/n),
    the last one closed) and count the entries and the true positives (``truth`` 1/True) in
    each (Fig. 5: FN/(FN+TN) per bucket when the entries are the unannotated ones)."""
    check_int(n_buckets, "n_buckets", 1)
    pt = torch.as_tensor(p).detach().to(torch.float64).flatten().cpu()
    yt = torch.as_tensor(truth).detach().flatten().cpu().to(torch.float64)
    if pt.shape != yt.shape:
        raise AnalyzeError(f"bucket_rates: p has {pt.numel()} values but truth has {yt.numel()}")
    if pt.numel() and (pt.isnan().any() or pt.min() < 0 or pt.max() > 1):
        raise AnalyzeError("bucket_rates: confidences must lie in [0, 1] (no NaN)")
    idx = (pt * n_buckets).floor().clamp(0, n_buckets - 1).long()
    counts = torch.bincount(idx, minlength=n_buckets)
    positives = torch.bincount(idx, weights=yt, minlength=n_buckets)
    sum_p = torch.bincount(idx, weights=pt, minlength=n_buckets)
    rate, mean_p = (torch.where(counts == 0, math.nan, s / counts.to(torch.float64).clamp_min(1))
                    for s in (positives, sum_p))
    return BucketStats(edges=np.linspace(0.0, 1.0, n_buckets + 1),
                       counts=counts.numpy().astype(np.int64),
                       positives=positives.round().numpy().astype(np.int64),
                       rate=rate.numpy(), mean_p=mean_p.numpy())


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


def run_config(config: ProbeConfig | None) -> tuple[ProbeConfig, tuple[int, ...]]:
    """The validated config (default :class:`ProbeConfig`) and its seeds: ``config.seeds`` when
    set, else the one ``config.seed``."""
    config = config or ProbeConfig()
    config.validate()
    return config, tuple(config.seeds) if config.seeds is not None else (config.seed,)


def load_data(data: ProbeData | str | os.PathLike, config: ProbeConfig) -> ProbeData:
    """``data``, or the store at that path loaded as ``config`` asks (device, draw, flips): an
    analysis checks its arguments first, so a mistake is named before a large store loads."""
    return data if isinstance(data, ProbeData) else ProbeData.from_store(
        data, device=config.device, observed_seed=config.observed_seed, flip=config.flip)


def _finite_or_nan(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else math.nan


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value), as ``spml study confirm``."""
    vals = [_finite_or_nan(v) for v in values]
    return mean_std(vals) if vals else (math.nan, math.nan)


def format_pm(mean: float, std: float, n: int) -> str:
    """``mean ± std`` with two decimals (the mean alone for one value, ``nan`` if undefined)."""
    if not math.isfinite(mean):
        return "nan"
    return f"{mean:.2f} ± {std:.2f}" if n > 1 else f"{mean:.2f}"


def json_floats(values: Any) -> list:
    """NumPy / tensor values as JSON-safe lists (NaN → None)."""
    out = np.asarray(values.cpu() if isinstance(values, Tensor) else values)
    return np.where(np.isfinite(out), out, None).tolist()


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                 markdown: bool = False) -> str:
    """A text table: space-aligned columns for the terminal, or a GitHub Markdown table
    (first column left-aligned, the others right-aligned)."""
    if markdown:
        from studies.report.render import markdown_table

        return "\n".join(markdown_table(list(header), [list(r) for r in rows]))

    def width(s: str) -> int:  # combining marks (the hat of k̂) take no column
        return sum(not unicodedata.combining(ch) for ch in s)

    table = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
    widths = [max(width(r[i]) for r in table) for i in range(len(header))]
    return "\n".join("  ".join((c.ljust if i == 0 else c.rjust)(w + len(c) - width(c))
                               for i, (c, w) in enumerate(zip(r, widths))) for r in table)


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
            raise AnalyzeError(f"--set {key}: takes one value here; got {len(value)} ({value!r})")
    cls = get_loss_class(loss)
    check_hparams(cls.hparam_specs, {k: v for k, v in hparams.items() if k not in TRAINER_KEYS},
                  cls.name)
    for key in (k for k in TRAINER_KEYS if k in hparams):
        v = hparams[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or (
                v < 0 or (key == "lr" and v == 0)):
            want = "positive" if key == "lr" else "non-negative"
            raise AnalyzeError(f"--set {key}: must be a {want} number; got {v!r}")
    return hparams


def pin_training(config: ProbeConfig, result: ProbeResult) -> ProbeConfig:
    """The config with batch size, lr and epochs fixed to what ``result`` resolved, so every
    run of an analysis trains with the same settings (a loss without presets would otherwise
    fall back to the generic ones)."""
    cfg = result.config
    return replace(config, batch_size=int(cfg["batch_size"]), lr=float(cfg["lr"]),
                   epochs=int(cfg["epochs"]))


def run_settings(data: ProbeData, result: ProbeResult, seeds: Sequence[int]) -> dict[str, Any]:
    """The training settings an analysis ran with (store, batch, lr, epochs, seeds, …), as the
    result's ``settings``."""
    cfg = result.config
    return {"store": data.source.get("path", "(arrays)"), "dataset": data.dataset,
            "n_train": data.n_train, "n_classes": data.n_classes,
            **{k: cfg.get(k) for k in ("batch_size", "batch_size_from", "lr", "lr_from", "epochs",
                                       "epochs_from", "optimizer")}, "seeds": list(seeds),
            **{k: cfg.get(k) for k in ("observed_seed", "flip_used", "device", "use_presets")}}


def trial_scores(result: ProbeResult, trials: Sequence[int]) -> dict[str, Any]:
    """Val / test mAP of one point's trials (its seeds): mean, std, and the test mAP's 95%
    interval: of the mean over the seeds (Student t) when there are several, else over the test
    images (paired bootstrap, attached by :func:`train_runs`)."""
    vals = [_finite_or_nan(result.trials[t].best.get("val_map")) for t in trials]
    tests = [_finite_or_nan(result.trials[t].best.get("test_map")) for t in trials]
    (vm, vs), (tm, ts) = _mean_std(vals), _mean_std(tests)
    if len(tests) > 1:
        iv = mean_interval(tests)
        low, high = iv.low, iv.high
    else:
        best = result.trials[trials[0]].best
        low, high = (_finite_or_nan(best.get(k)) for k in ("test_map_low", "test_map_high"))
    return {"val_mean": vm, "val_std": vs, "test_mean": tm, "test_std": ts,
            "test_low": low, "test_high": high, "val_maps": vals, "test_maps": tests,
            "best_epochs": [result.trials[t].best_epoch for t in trials]}


def scores_caption(n_seeds: int) -> str:
    """The caption of a table of :func:`score_cells`: where mAP is read, and what its spread
    and its interval (over seeds when several, else over the test images) mean."""
    return ("mAP (%) at the best val epoch"
            + (f", mean ± std over {n_seeds} seeds" if n_seeds > 1 else "")
            + "; test mAP's " + ("95% interval of the mean over the seeds (Student t)"
                                 if n_seeds > 1 else "95% interval over the test images "
                                 "(paired bootstrap, 1,000 resamples)"))


def score_cells(scores: dict[str, Any], n_seeds: int) -> list[str]:
    """Val mAP, test mAP (``mean ± std``) and the test mAP's 95% interval ``[low, high]`` of
    :func:`trial_scores`, as table cells."""
    low, high = scores["test_low"], scores["test_high"]
    return [format_pm(scores["val_mean"], scores["val_std"], n_seeds),
            format_pm(scores["test_mean"], scores["test_std"], n_seeds),
            f"[{low:.2f}, {high:.2f}]" if math.isfinite(low) and math.isfinite(high) else "-"]


def train_runs(data: ProbeData, config: ProbeConfig, loss: str, hparams: Sequence[dict],
               seeds: Sequence[int], progress: bool) -> ProbeResult:
    """Every hyperparameter dict × every seed as one stacked run (trial = point·S + seed);
    with one seed, each trial's test mAP gets its bootstrap interval over the test images."""
    trials = [dict(h) for h in hparams for _ in seeds]
    cfg = replace(config, seeds=tuple(s for _ in hparams for s in seeds))
    result = train_probe(data, cfg, loss, trials, progress=progress)
    if len(seeds) == 1:
        attach_test_intervals(result, data)
    return result


@dataclass
class AnalysisResult(ABC):
    """What every analysis returns: a title, its settings, notes; tables and figures."""

    kind: ClassVar[str] = ""  # names the output files: <kind>.json / .md
    title: ClassVar[str] = ""
    paper: ClassVar[str] = ""  # the paper's table or figure it reproduces

    @abstractmethod
    def tables(self) -> list[tuple[str, list[str], list[list[str]]]]:
        """``(caption, header, rows)`` of every table."""

    def to_dict(self) -> dict[str, Any]:
        """Everything the analysis measured, JSON-ready (the ``<kind>.json`` file): the kind,
        the paper's figure, then every field."""
        out: dict[str, Any] = {"analysis": self.kind,
                               "paper": f"GR Loss, IJCAI 2024, {self.paper}"}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, BucketStats) else value
        return out

    def subtitle(self) -> str:
        """The training settings in one line ("" for an analysis that trains nothing)."""
        if not (s := getattr(self, "settings", None)):
            return ""
        return (f"{s['dataset']} ({s['n_train']} train rows, {s['n_classes']} classes), batch "
                f"{s['batch_size']}, lr {s['lr']:g}, {s['epochs']} epochs, {s['optimizer']}, "
                f"seeds {','.join(map(str, s['seeds']))}")

    def text(self) -> str:
        """The tables as the terminal shows them."""
        parts = [self.title, self.subtitle()]
        for caption, header, rows in self.tables():
            parts += ["", caption, format_table(header, rows)]
        return "\n".join(parts + [f"note: {note}" for note in getattr(self, "notes", [])])

    def markdown(self, figures: Sequence[Path] = (), base: Path | None = None) -> str:
        lines = [f"# {self.title}", ""]
        if self.subtitle():
            lines += [f"_{self.subtitle()}_", ""]
        for caption, header, rows in self.tables():
            lines += [f"**{caption}**", "", format_table(header, rows, markdown=True), ""]
        for path in figures:
            rel = os.path.relpath(path, base) if base is not None else str(path)
            lines += [f"![{path.stem}]({rel.replace(os.sep, '/')})", ""]
        return "\n".join(lines + [line for note in getattr(self, "notes", [])
                                   for line in (f"> **Note:** {note}", "")])


_ROW_BLOCK = 8192  # rows per product: the float32 copy of a block stays small (COCO: 67 MB)


def masked_probs(x: Tensor, head: Tensor, mask: Tensor) -> Tensor:
    """σ(x @ head)[mask] for features ``x`` (N, D+1) in their storage dtype and one head
    (D+1, C), computed in float32 row blocks (row-major order of the masked entries)."""
    w = head.to(device=x.device, dtype=torch.float32)
    parts = [torch.sigmoid(x[r0 : r0 + _ROW_BLOCK].float() @ w)[mask[r0 : r0 + _ROW_BLOCK]]
             for r0 in range(0, x.shape[0], _ROW_BLOCK)]
    return torch.cat(parts)


def seeded_heads(seeds: Sequence[int], d: int, c: int) -> Tensor:
    """(T, D+1, C): the untrained heads exactly as the engine draws them
    (probe.engine.loop.init_head)."""
    return torch.stack([torch.cat([w.T, b[None]]) for w, b in (init_head(s, d, c) for s in seeds)])
