"""Uncertainty of mAP (docs/protocol.md "Intervals and comparisons"): the paired bootstrap over
test images -- a bias-corrected percentile interval per system (:func:`_bias_corrected`), paired
differences with a p-value from the bootstrap standard error and Holm's correction across pairs
-- and :func:`mean_interval`, the Student-t interval of the mean of runs (seeds, draws).

**Vectorised.** A resample is a vector of counts ``w`` (how often each image was drawn), so
duplicates of a row are tied scores of one threshold and AP is a *weighted* version of
:func:`probe.metrics.ranking.ap_block`: with each column sorted once,

    AP(w) = (1 / P_w) sum_{positive rows i} w_i * TP_w(>= s_i) / N_w(>= s_i),

where ``N_w(>= s)`` is the drawn images scoring at least ``s`` and ``TP_w(>= s)`` the drawn
positives among them. Per column this is one histogram pass over the counts (read in cache-sized
tiles of resamples, :func:`weighted_column_ap`), then work on the positives only. The tests check
it against resampling, then :func:`probe.metrics.ranking.column_ap`.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from statistics import NormalDist

import torch
from torch import Tensor

from probe.engine.logits import stacked_logits
from probe.engine.threads import step_threads
from probe.errors import SpmlError
from probe.metrics.ranking import argsort_rows, column_ap
from probe.progress import Progress

__all__ = [
    "MIN_TEST_IMAGES",
    "BootstrapResult",
    "Interval",
    "PairedDifference",
    "attach_test_intervals",
    "bootstrap_counts",
    "bootstrap_map",
    "count_non_finite",
    "few_test_images",
    "head_intervals",
    "holm",
    "mean_interval",
    "mean_std",
    "paired_differences",
    "prefetch_bootstrap_counts",
    "record_test_intervals",
    "weighted_column_ap",
]


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided interval at ``level`` (mAP units, x100)."""

    value: float
    low: float
    high: float
    level: float = 0.95

    def __str__(self) -> str:
        return f"{self.value:.2f} [{self.low:.2f}, {self.high:.2f}]"

    def to_dict(self, prefix: str = "") -> dict[str, float]:
        """``{prefix: value, prefix_low: low, prefix_high: high}``."""
        return {prefix: self.value, f"{prefix}_low": self.low, f"{prefix}_high": self.high}


@dataclass(frozen=True)
class BootstrapResult:
    """mAP of S systems on the test set with their paired bootstrap replicates.

    ``map`` ``(S,)`` the observed mAP; ``replicates`` ``(S, B)`` the mAP on each resample (the
    same resamples for every system); ``intervals`` the bias-corrected percentile intervals.
    """

    map: Tensor
    replicates: Tensor
    intervals: list[Interval]
    n_resamples: int
    seed: int
    level: float


@dataclass(frozen=True)
class PairedDifference:
    """``a - b`` in mAP with its paired bootstrap interval and p-values (raw and Holm)."""

    a: int
    b: int
    diff: Interval
    p_value: float
    p_holm: float

    @property
    def significant(self) -> bool:
        """Holm-corrected p below 1 - level (the interval's complement, 0.05 by default)."""
        return self.p_holm < 1.0 - self.diff.level


def bootstrap_counts(n: int, n_resamples: int, seed: int = 0,
                     device: str | torch.device = "cpu") -> Tensor:
    """``(B, n)`` float32 counts: row b says how often each of the n images is drawn in the
    b-th resample of n images with replacement. Seeded (CPU generator): every system, device
    and run sees the same resamples for the same seed. Stored resample-minor (an ``(n, B)``
    block seen transposed); taken from :func:`prefetch_bootstrap_counts` when it started them."""
    _check_counts_args(n, n_resamples)
    pending = _PREFETCHED.pop((int(n), int(n_resamples), int(seed)), None)
    counts = pending.result() if pending is not None else _draw_counts(n, n_resamples, seed)
    return counts.to(device)


def prefetch_bootstrap_counts(n: int, n_resamples: int, seed: int = 0) -> None:
    """Start drawing :func:`bootstrap_counts` ``(n, n_resamples, seed)`` on a background
    thread for the next call with those arguments: ``spml probe`` overlaps the draw (~0.3 s for
    COCO's test set) with the epochs. The same values as drawing them then."""
    _check_counts_args(n, n_resamples)
    key = (int(n), int(n_resamples), int(seed))
    if key not in _PREFETCHED:
        worker = ThreadPoolExecutor(1, "spml-bootstrap-counts")
        _PREFETCHED[key] = worker.submit(_draw_counts, *key)
        worker.shutdown(wait=False)  # the thread ends with its one task


_PREFETCHED: dict[tuple[int, int, int], Future[Tensor]] = {}
_DRAW_ROWS = 64  # resamples drawn at once: bounds the index buffer, not the values


def _check_counts_args(n: int, n_resamples: int) -> None:
    if n < 1 or n_resamples < 1:
        raise SpmlError(f"bootstrap needs n >= 1 rows and n_resamples >= 1; got {n}, "
                         f"{n_resamples}")


def _draw_counts(n: int, n_resamples: int, seed: int) -> Tensor:
    # drawn in slices of resamples from one generator: the same stream, hence the same
    # counts, as one (B, n) draw, without its 8-byte indices for all B x n draws at once
    gen = torch.Generator().manual_seed(int(seed))
    counts = torch.zeros(n, n_resamples, dtype=torch.float32).t()
    ones = torch.ones(min(_DRAW_ROWS, n_resamples), n)
    for b0 in range(0, n_resamples, _DRAW_ROWS):
        b1 = min(n_resamples, b0 + _DRAW_ROWS)
        idx = torch.randint(0, n, (b1 - b0, n), generator=gen)
        counts[b0:b1].scatter_add_(1, idx, ones[: b1 - b0])
    return counts


# bytes of one tile of counts (N rows x a range of resamples), read from the cache by every
# class's histogram pass (on COCO's test set, tiles of 64 resamples beat 32, 128 or all at once;
# `spml bench intervals` times it)
TILE_BYTES = 8 << 20
# tile widths are multiples of 64 resamples: torch sums a (P, width) block down its columns in
# groups of vector lanes (up to 64 float32 columns), so a resample's sum rounds as in one pass
TILE_STEP = 64


@torch.no_grad()
def weighted_column_ap(scores: Tensor, targets: Tensor, counts: Tensor,
                       on_system: Callable[[], None] | None = None) -> Tensor:
    """AP ``(S, B, C)`` of scores ``(S, N, C)`` (or ``(N, C)`` -> ``(B, C)``) against bool
    ``targets`` ``(N, C)``, each row counted ``counts[b, i]`` times in resample b (module doc).
    ``on_system`` is called after each system (a progress display's update).

    Equals :func:`probe.metrics.ranking.column_ap` on the resampled rows (duplicates tie); AP = 0
    for a column without drawn positives, NaN for a column holding a NaN score (a diverged system
    gets no interval). The replicates are the same bits on any tiling, thread count or sort
    (docs/design.md "Semantics guarantees").
    """
    squeeze = scores.dim() == 2
    s3 = scores[None] if squeeze else scores
    n_sys, n, c = s3.shape
    work = torch.float64 if scores.dtype == torch.float64 else torch.float32
    n_res = counts.shape[0]
    # (N, B) layout: gathering and summing whole rows of contiguous counts is what makes the
    # per-column pass fast (a no-op for bootstrap_counts, which stores them so)
    w_t = counts.to(device=scores.device, dtype=work).t().contiguous()
    total_w = w_t.sum(0)  # (B,) = n for a bootstrap, any total for general weights
    out = torch.zeros(n_sys, c, n_res, dtype=work, device=scores.device)
    tgt = targets.bool().to(scores.device)
    # columns evaluated at once: on the CPU one per intra-op thread (a column's histogram pass
    # runs on one core; two columns at once use two), else 1
    workers = max(1, torch.get_num_threads()) if scores.device.type == "cpu" else 1
    width = _tile_width(n, n_res, w_t.element_size(), scores.device)
    pool = ThreadPoolExecutor(workers, "spml-bootstrap") if workers > 1 else None

    def each(fn: Callable, items: Sequence) -> list:  # in order; returns once all are done
        return list(pool.map(fn, items)) if pool is not None else [fn(i) for i in items]

    with pool or contextlib.nullcontext():  # the pool shuts down (waits) on leaving
        for s in range(n_sys):
            ranked, order = argsort_rows(s3[s].t().to(work).contiguous())  # (C, N) ascending
            nan_col = ranked[:, -1].isnan().tolist()
            with step_threads(scores.device, 1 if pool is not None else None):
                plans = each(partial(_column_plan, ranked, order, tgt),
                             [j for j in range(c) if not nan_col[j]])
                todo = [p for p in plans if p is not None]
                for b0, b1 in _tiles(n_res, width):
                    tile = w_t if b1 - b0 == n_res else w_t[:, b0:b1].contiguous()
                    aps = each(partial(_weighted_ap_one_column, tile, total_w[b0:b1]), todo)
                    for plan, ap in zip(todo, aps):
                        out[s, plan.j, b0:b1] = ap
            out[s, [j for j in range(c) if nan_col[j]]] = math.nan
            if on_system is not None:
                on_system()
    out = out.transpose(1, 2)  # (S, B, C)
    return out[0] if squeeze else out


def _tile_width(n: int, n_res: int, itemsize: int, device: torch.device) -> int:
    """Resamples per tile (all of them on a GPU: no cache to fit)."""
    if device.type != "cpu":
        return n_res
    fit = TILE_BYTES // (itemsize * max(n, 1))
    return min(n_res, max(TILE_STEP, fit - fit % TILE_STEP))


def _tiles(n_res: int, width: int) -> list[tuple[int, int]]:
    """``[b0, b1)`` ranges of ``width`` resamples; a partial last range joins the one before
    it, so every tile but a lone one is at least ``width`` wide and its leftover columns are
    the one pass's (a few columns alone are summed another way)."""
    edges = list(range(0, n_res, width))[1:]
    if edges and n_res - edges[-1] < width:
        edges.pop()
    return list(pairwise([0, *edges, n_res]))


@dataclass(frozen=True)
class _ColumnPlan:
    """What a column's pass needs besides the counts: ``gap`` (N,) for every row the number of
    positives' tie groups starting at or below its sorted position (the histogram bin it falls
    in), ``first`` (P,) for every positive (in sorted order) the number of positives' group
    starts below its own, ``rows`` (P,) the positives' row indices, ``j`` the column."""

    j: int
    gap: Tensor
    first: Tensor
    rows: Tensor


def _column_plan(ranked_all: Tensor, order_all: Tensor, targets_all: Tensor, j: int
                 ) -> _ColumnPlan | None:
    """The plan of column ``j`` from the columns' ascending sort (values ``ranked_all`` and
    row indices ``order_all``, both (C, N)) and the bool targets (N, C); None when the column
    has no positive (AP 0 in every resample: the protocol's empty-class rule)."""
    ranked, order = ranked_all[j], order_all[j]
    pos = targets_all[:, j][order].nonzero().squeeze(1)  # sorted positions of the positives
    if pos.numel() == 0:
        return None
    start = torch.searchsorted(ranked, ranked[pos])  # first position of each one's tie group
    # #{starts <= position} for every sorted position, one pass (not a search per row)
    marks = torch.zeros(ranked.numel(), dtype=torch.int64, device=ranked.device)
    marks.index_add_(0, start, torch.ones_like(start))
    gap = torch.empty_like(marks)
    gap[order] = marks.cumsum_(0)
    # positives tied with each other in row order: the sort leaves ties in no defined order,
    # and the final sum adds the positives in this order (nothing else here depends on it)
    rows, by_row = order[pos].sort()
    rows = rows[torch.sort(ranked[pos][by_row], stable=True).indices]
    # rank_i < start_k  <=>  #{starts <= rank_i} <= #{starts < start_k}
    return _ColumnPlan(j, gap, torch.searchsorted(start, start), rows)


def _weighted_ap_one_column(w_t: Tensor, total_w: Tensor, plan: _ColumnPlan) -> Tensor:
    """Weighted AP ``(B,)`` of one column with positives (:class:`_ColumnPlan`) under the
    counts ``w_t`` (N, B) of B resamples with totals ``total_w`` (B,)."""
    n_res, p = w_t.shape[1], plan.first.numel()
    # drawn rows below a positive's tie group, via a histogram of the rows over the
    # P + 1 gaps between the positives' group starts (one pass over the counts)
    hist = torch.zeros(p + 1, n_res, dtype=w_t.dtype, device=w_t.device)
    hist.index_add_(0, plan.gap, w_t)
    # drawn rows scoring >= the positive's score: total - those before its group
    admitted = hist.cumsum_(0).index_select(0, plan.first).neg_().add_(total_w
                                                                     ).clamp_min_(1e-30)
    wp = w_t.index_select(0, plan.rows)  # (P, B) weight of each positive
    cp = torch.zeros(p + 1, n_res, dtype=w_t.dtype, device=w_t.device)
    torch.cumsum(wp, 0, out=cp[1:])
    p_w = cp[-1]
    # drawn positives scoring >= s_k: all minus those before the tie group
    tot = cp.index_select(0, plan.first).neg_().add_(p_w).mul_(wp).div_(admitted).sum(0)
    return torch.where(p_w > 0, tot / p_w.clamp_min(1e-30), torch.zeros_like(tot))


def _bias_corrected(reps: Tensor, observed: float, level: float) -> Interval:
    """Efron's bias-corrected percentile interval (Efron 1981; Efron & Tibshirani 1993,
    sec. 14.3): percentiles ``Phi(2 z0 +- z)`` with ``z0 = Phi^-1(P*(rep < observed))``.
    Resampled AP runs high (a duplicated positive ranks next to itself); the correction
    re-centres the interval (docs/protocol.md)."""
    if not math.isfinite(observed) or not bool(torch.isfinite(reps).all()):
        return Interval(observed, math.nan, math.nan, level)
    normal = NormalDist()
    n = reps.numel()
    frac = (float((reps < observed).sum()) + 0.5 * float((reps == observed).sum())) / n
    frac = min(max(frac, 0.5 / n), 1.0 - 0.5 / n)
    z0, z = normal.inv_cdf(frac), normal.inv_cdf(0.5 + level / 2)
    q = torch.tensor([normal.cdf(2 * z0 - z), normal.cdf(2 * z0 + z)], dtype=torch.float64)
    low, high = torch.quantile(reps.to(torch.float64).cpu(), q).tolist()
    return Interval(observed, low, high, level)


def _check_level(level: float) -> float:
    if not 0.0 < float(level) < 1.0:
        raise SpmlError(f"level must lie in (0, 1), e.g. 0.95; got {level!r}")
    return float(level)


@torch.no_grad()
def bootstrap_map(scores: Tensor, targets: Tensor, *, n_resamples: int = 1000, seed: int = 0,
                  level: float = 0.95, progress: bool = False, counts: Tensor | None = None,
                  observed_ap: Tensor | None = None) -> BootstrapResult:
    """Paired bootstrap of mAP over test images for S systems scored on the same images.

    ``scores`` ``(N, C)`` or ``(S, N, C)`` (logits or probabilities: AP is rank-based);
    ``targets`` ``(N, C)`` bool / 0-1 full ground truth. Returns the observed mAP ``(S,)``, the
    replicates ``(S, B)`` (the same resamples for every system, so differences are paired) and
    bias-corrected percentile intervals at ``level``. ``progress``: a display over the systems
    on stderr. ``counts`` (``bootstrap_counts(N, n_resamples, seed)`` drawn once) and
    ``observed_ap`` ``(S, C)`` (per-class AP already computed) spare callers that bootstrap in
    blocks the work; the result is the same as without them.
    """
    level = _check_level(level)
    s3 = scores[None] if scores.dim() == 2 else scores
    if s3.dim() != 3 or s3.shape[-2:] != targets.shape:
        raise SpmlError(
            f"scores must be (N, C) or (S, N, C) matching targets (N, C) = "
            f"{tuple(targets.shape)}; got {tuple(scores.shape)}")
    n_sys, n = s3.shape[:2]
    if counts is not None and tuple(counts.shape) != (n_resamples, n):
        raise SpmlError(f"counts must be bootstrap_counts(N, n_resamples) of shape "
                         f"({n_resamples}, {n}); got {tuple(counts.shape)}")
    if observed_ap is not None and tuple(observed_ap.shape) != (n_sys, targets.shape[1]):
        raise SpmlError(f"observed_ap must be the per-class AP (S, C) = "
                         f"({n_sys}, {targets.shape[1]}); got {tuple(observed_ap.shape)}")
    tgt = targets.to(s3.device).bool()
    ap = column_ap(s3, tgt) if observed_ap is None else observed_ap
    observed = 100.0 * ap.to(torch.float64).mean(-1)  # (S,)
    if counts is None:
        counts = bootstrap_counts(n, n_resamples, seed, device=s3.device)
    with Progress(s3.shape[0], f"test intervals ({n_resamples} resamples)", "heads",
                  enabled=progress) as bar:
        reps = 100.0 * weighted_column_ap(s3, tgt, counts, on_system=bar.update
                                          ).to(torch.float64).mean(-1)  # (S, B)
    intervals = [_bias_corrected(reps[i], float(observed[i]), level)
                 for i in range(s3.shape[0])]
    return BootstrapResult(map=observed.cpu(), replicates=reps.cpu(), intervals=intervals,
                           n_resamples=int(n_resamples), seed=int(seed), level=level)


#: below this many test images an interval or a mark says little (a bootstrap over a handful of
#: images is mostly the handful): every command that prints one warns, once
MIN_TEST_IMAGES = 50


def few_test_images(n_images: int) -> str | None:
    """The warning for intervals or marks resting on ``n_images`` test images, or None where
    there are :data:`MIN_TEST_IMAGES` or more."""
    if n_images >= MIN_TEST_IMAGES:
        return None
    return (f"warning: the intervals and marks rest on {n_images} test images (fewer than "
            f"{MIN_TEST_IMAGES}): they cannot separate much at this size; use a larger test "
            "split where the data allows")


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the input order; each <= 1.

    A NaN p-value is a comparison that could not be made (a diverged row): it is no member of
    the family -- it stays NaN, and the others are corrected over the finite ones only. A
    p-value outside [0, 1] (or infinite) is refused."""
    finite = []
    for i, p in enumerate(p_values):
        p = float(p)
        if math.isnan(p):
            continue
        if not 0.0 <= p <= 1.0:
            raise SpmlError(f"holm: p-values must be in [0, 1] (NaN: no comparison); got {p} "
                            f"at position {i}")
        finite.append(i)
    m = len(finite)
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, i in enumerate(sorted(finite, key=lambda i: float(p_values[i]))):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted


def paired_differences(boot: BootstrapResult,
                       pairs: Sequence[tuple[int, int]] | None = None, *,
                       alternative: str = "two-sided") -> list[PairedDifference]:
    """Every pairwise difference ``a - b`` (all pairs a < b by default) with its paired
    percentile interval, p-value (bootstrap standard error, :func:`_wald_p`) and Holm-corrected
    p-value (module doc). ``alternative``: ``"two-sided"`` (a and b differ) or ``"greater"``
    (one-sided: a - b > 0, as when asking whether a row is worse than the best). A pair with a
    non-finite difference gets NaN p-values and is left out of the Holm family."""
    if alternative not in ("two-sided", "greater"):
        raise SpmlError(f"alternative: 'two-sided' or 'greater'; got {alternative!r}")
    n_sys = boot.replicates.shape[0]
    if pairs is None:
        pairs = [(a, b) for a in range(n_sys) for b in range(a + 1, n_sys)]
    alpha = (1.0 - boot.level) / 2.0
    q = torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64)
    rows = []
    for a, b in pairs:
        d = boot.replicates[a] - boot.replicates[b]
        low, high = torch.quantile(d.to(torch.float64), q.to(d.device)).tolist()  # NaN stays NaN
        observed = float(boot.map[a] - boot.map[b])
        p = _wald_p(observed, float(d.std()), alternative)
        rows.append((a, b, Interval(observed, low, high, boot.level), p))
    adjusted = holm([r[3] for r in rows])
    return [PairedDifference(a, b, diff, p, ph) for (a, b, diff, p), ph in zip(rows, adjusted)]


def _wald_p(diff: float, se: float, alternative: str = "two-sided") -> float:
    """The p of ``diff`` against 0 with its bootstrap standard error (normal approximation; a
    tail count of B replicates cannot go below ~2/B, module doc): two-sided, or one-sided for
    ``diff > 0`` (``alternative="greater"``). NaN where ``diff`` or ``se`` is not finite."""
    if not (math.isfinite(diff) and math.isfinite(se)):
        return math.nan
    if se <= 0.0:
        if alternative == "greater":
            return 0.0 if diff > 0.0 else 1.0
        return 1.0 if diff == 0.0 else 0.0
    if alternative == "greater":
        return NormalDist().cdf(-diff / se)
    return min(1.0, 2.0 * NormalDist().cdf(-abs(diff) / se))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation of runs (0 for one run): how a result over seeds is
    reported beside :func:`mean_interval`."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def mean_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean of runs (seeds, single-positive draws) with its Student-t interval; a single run
    has an undefined (NaN) interval. A non-finite run (a diverged one) makes the mean and the
    interval NaN: a mean over the survivors would hide it (:func:`count_non_finite` says how
    many to report)."""
    level = _check_level(level)
    vals = [math.nan if v is None else float(v) for v in values]
    if not vals or count_non_finite(vals):
        return Interval(math.nan, math.nan, math.nan, level)
    mean = sum(vals) / len(vals)
    if len(vals) < 2:
        return Interval(mean, math.nan, math.nan, level)
    from scipy.stats import t as student_t

    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
    half = float(student_t.ppf(0.5 + level / 2, len(vals) - 1)) * sd / math.sqrt(len(vals))
    return Interval(mean, mean - half, mean + half, level)


def count_non_finite(values: Sequence[float | None]) -> int:
    """How many of ``values`` are missing or not finite (diverged runs)."""
    return sum(1 for v in values if v is None or not math.isfinite(float(v)))


@torch.no_grad()
def head_intervals(test_x: Tensor, test_labels: Tensor, heads: Tensor, *,
                   n_resamples: int = 1000, seed: int = 0, level: float = 0.95,
                   progress: bool = False) -> BootstrapResult:
    """Test-mAP intervals of trained heads ``(T, D+1, C)`` (bias in the last row) on test
    features ``(N, D+1)`` (bias column included) and full labels ``(N, C)``: the heads' logits,
    then :func:`bootstrap_map` (paired: every head sees the same resamples)."""
    w = heads.to(device=test_x.device, dtype=torch.float32)
    return bootstrap_map(stacked_logits(test_x, w), test_labels.bool(), n_resamples=n_resamples,
                         seed=seed, level=level, progress=progress)


def attach_test_intervals(result, data, *, n_resamples: int = 1000, seed: int = 0,
                          level: float = 0.95, progress: bool = False) -> BootstrapResult | None:
    """Add ``test_map_low`` / ``test_map_high`` to every evaluated trial's ``best`` record of a
    :class:`probe.engine.results.ProbeResult` (:func:`record_test_intervals`); returns the
    bootstrap, or None when the run has no heads."""
    if result.best_heads is None or n_resamples <= 0:
        return None
    boot = head_intervals(data.test_x, data.test_labels, result.best_heads,
                          n_resamples=n_resamples, seed=seed, level=level, progress=progress)
    record_test_intervals(result, dict(enumerate(boot.intervals)), n_resamples=n_resamples,
                          seed=seed, level=level)
    return boot


def record_test_intervals(result, intervals: dict[int, Interval], *, n_resamples: int,
                          seed: int = 0, level: float = 0.95) -> None:
    """Write each trial's test-mAP interval (``{trial: Interval}``) into its ``best`` record
    (trials without one are left alone) and the bootstrap's settings into ``result.config``."""
    for t, iv in intervals.items():
        best = result.trials[t].best
        if best:
            best["test_map_low"], best["test_map_high"] = iv.low, iv.high
    result.config["test_interval"] = {
        "method": ("paired bootstrap over test images, bias-corrected percentile interval "
                   "(docs/protocol.md)"),
        "n_resamples": int(n_resamples), "seed": int(seed), "level": float(level)}
