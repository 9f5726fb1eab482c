"""probe.evaluation.intervals: the vectorised paired bootstrap of mAP against a naive
resample-and-rank, its coverage on synthetic scores with a known mAP difference, Holm and the t
interval."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from probe.evaluation.intervals import (
    bootstrap_counts,
    bootstrap_map,
    holm,
    mean_interval,
    paired_differences,
    weighted_column_ap,
)
from probe.metrics.ranking import column_ap

pytestmark = pytest.mark.usefixtures("one_thread")


@torch.no_grad()
def naive_bootstrap_ap(scores: Tensor, targets: Tensor, counts: Tensor) -> Tensor:
    """Reference for weighted_column_ap: materialise each resample's rows and rank them with
    column_ap. Slow (one full AP per resample)."""
    squeeze = scores.dim() == 2
    s3 = scores[None] if squeeze else scores
    out = []
    for b in range(counts.shape[0]):
        idx = torch.repeat_interleave(torch.arange(counts.shape[1], device=counts.device),
                                      counts[b].long())
        idx = idx.to(scores.device)
        out.append(column_ap(s3[:, idx], targets.bool()[idx]))
    res = torch.stack(out, 1)  # (S, B, C)
    return res[0] if squeeze else res


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_ap_equals_naive_resampling(dtype):
    """Heavy ties, an empty class, a class with one positive and a NaN score: every resample's
    AP equals column_ap on the materialised resample (duplicates tie)."""
    g = torch.Generator().manual_seed(0)
    n, c = 70, 6
    scores = torch.randint(0, 6, (3, n, c), generator=g).to(dtype)
    scores[1, :, 5] = torch.randn(n, generator=g).to(dtype)  # no ties in one column
    targets = torch.rand(n, c, generator=g) < 0.25
    targets[:, 0] = False  # empty class: AP 0 in every resample
    targets[:, 1] = False
    targets[7, 1] = True  # one positive: often absent from a resample
    scores[2, 4, 3] = math.nan
    counts = bootstrap_counts(n, 40, seed=3)
    fast = weighted_column_ap(scores, targets, counts)
    slow = naive_bootstrap_ap(scores, targets, counts)
    assert fast.shape == (3, 40, c)
    # a NaN score makes its column NaN in every resample (drawn or not: a diverged system has
    # no interval); naive resampling is NaN only where the row was drawn
    assert torch.isnan(fast[2, :, 3]).all()
    assert (torch.isnan(slow[2, :, 3]) == (counts[:, 4] > 0)).all()
    ok = torch.ones_like(fast, dtype=torch.bool)
    ok[2, :, 3] = False
    assert not torch.isnan(fast[ok]).any()
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    assert torch.allclose(fast[ok].double(), slow[ok].double(), atol=tol, rtol=0)
    assert (fast[:, :, 0] == 0).all()
    assert ((fast[:, :, 1] == 0) == (counts[:, 7] == 0)).all()  # absent positive -> AP 0


def test_replicates_do_not_depend_on_the_thread_count():
    """On the CPU the classes are shared among the intra-op threads; each class's arithmetic is
    the same, so the replicates are equal bit for bit on one thread and on several."""
    g = torch.Generator().manual_seed(4)
    n, c = 500, 12
    scores = torch.randint(0, 40, (2, n, c), generator=g).float()  # ties
    targets = torch.rand(n, c, generator=g) < 0.1
    targets[:, 2] = False  # an empty class
    counts = bootstrap_counts(n, 64, seed=1)
    before = torch.get_num_threads()
    try:
        one = weighted_column_ap(scores, targets, counts)
        torch.set_num_threads(3)
        several = weighted_column_ap(scores, targets, counts)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, several)


def test_unit_weights_give_the_protocol_ap():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 300, 5, generator=g)
    targets = torch.rand(300, 5, generator=g) < 0.3
    one = weighted_column_ap(scores, targets, torch.ones(1, 300))
    assert torch.allclose(one[:, 0], column_ap(scores, targets), atol=1e-6)


def test_counts_are_seeded_resamples():
    a, b = bootstrap_counts(50, 20, seed=5), bootstrap_counts(50, 20, seed=5)
    assert torch.equal(a, b) and not torch.equal(a, bootstrap_counts(50, 20, seed=6))
    assert (a.sum(1) == 50).all() and (a >= 0).all()


def test_holm_matches_the_step_down_definition():
    p = [0.01, 0.04, 0.03, 0.2]
    # sorted 0.01, 0.03, 0.04, 0.2 -> 4*.01=.04, 3*.03=.09, 2*.04=.08 -> .09 (monotone), .2
    assert holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_mean_interval_is_student_t():
    from scipy import stats

    vals = [40.1, 41.3, 40.7]
    iv = mean_interval(vals)
    lo, hi = stats.t.interval(0.95, 2, loc=sum(vals) / 3, scale=stats.sem(vals))
    assert (iv.low, iv.high) == pytest.approx((lo, hi))
    assert math.isnan(mean_interval([40.0]).low)


def _population(seed: int, n_pop: int = 100_000):
    """Two systems on one population; system 1's scores separate the classes better."""
    g = torch.Generator().manual_seed(seed)
    prevalence = torch.tensor([0.1, 0.25, 0.4])
    y = torch.rand(n_pop, 3, generator=g) < prevalence
    strength = torch.tensor([1.0, 1.3])[:, None, None]
    scores = strength * y + torch.randn(2, n_pop, 3, generator=g)
    true = 100 * column_ap(scores, y).double().mean(-1)
    return scores, y, float(true[0] - true[1]), g


def _coverage(n_sim: int, n_test: int, n_resamples: int) -> float:
    scores, y, true_diff, g = _population(0)
    hits = 0
    for r in range(n_sim):
        idx = torch.randint(0, y.shape[0], (n_test,), generator=g)
        boot = bootstrap_map(scores[:, idx], y[idx], n_resamples=n_resamples, seed=r)
        (d,) = paired_differences(boot)
        hits += d.diff.low <= true_diff <= d.diff.high
    return hits / n_sim


def _binomial_band(p: float, n: int, z: float = 3.3) -> tuple[float, float]:
    half = z * math.sqrt(p * (1 - p) / n)
    return p - half, p + half


def test_difference_interval_covers_the_true_difference():
    """Repeated test sets drawn from a population whose mAP difference is known (~-10 points):
    the paired 95% interval covers it in ~95% of simulations (3.3 binomial sd: a false failure
    about once in a thousand seeds; the simulation is seeded, so the test is deterministic)."""
    n_sim = 150
    low, high = _binomial_band(0.95, n_sim)
    assert low <= _coverage(n_sim, n_test=150, n_resamples=300) <= high


@pytest.mark.slow
def test_difference_interval_coverage_many_simulations():
    n_sim = 600
    low, high = _binomial_band(0.95, n_sim)
    assert low <= _coverage(n_sim, n_test=300, n_resamples=1000) <= high


def test_planted_difference_is_found_and_identical_systems_are_not_different():
    scores, y, _, g = _population(2, n_pop=600)
    same = torch.stack([scores[0], scores[0] + 1e-3 * torch.randn(600, 3, generator=g)])
    boot = bootstrap_map(torch.cat([scores, same]), y, n_resamples=500, seed=0)
    pairs = {(p.a, p.b): p for p in paired_differences(boot)}
    assert pairs[(0, 1)].significant and pairs[(0, 1)].diff.high < 0  # system 1 is better
    d = boot.replicates[0] - boot.replicates[1]
    z = abs(float(boot.map[0] - boot.map[1])) / float(d.std())
    assert pairs[(0, 1)].p_value == pytest.approx(math.erfc(z / math.sqrt(2)))  # 2 Phi(-z)
    assert not pairs[(2, 3)].significant
    assert pairs[(2, 3)].diff.low <= 0 <= pairs[(2, 3)].diff.high


def test_bench_intervals_reports_the_machine(capsys):
    from studies.cli import main

    assert main(["bench", "intervals", "--rows", "300", "--classes", "4", "--resamples", "100",
                 "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "100 resamples of 300 x 4" in out and "load" in out
    import json

    report = json.loads(out[out.index("{"):])
    assert len(report["seconds"]) == 1 and report["machine_before"]["cpus"] >= 1


def test_counts_are_the_draw_of_one_generator_in_any_slicing_and_prefetched_alike():
    """The counts are drawn in slices of resamples: the same values as one (B, n) draw of the
    seeded generator (the definition), stored resample-minor; prefetched counts are the same."""
    from probe.evaluation import intervals

    n, b = 300, 150  # more resamples than one slice
    gen = torch.Generator().manual_seed(9)
    idx = torch.randint(0, n, (b, n), generator=gen)
    reference = torch.zeros(b, n).scatter_add_(1, idx, torch.ones(b, n))
    drawn = bootstrap_counts(n, b, seed=9)
    assert torch.equal(drawn, reference)
    assert drawn.t().is_contiguous()  # the (n, B) layout weighted_column_ap reads
    intervals.prefetch_bootstrap_counts(n, b, seed=9)
    assert (n, b, 9) in intervals._PREFETCHED
    assert torch.equal(bootstrap_counts(n, b, seed=9), reference)
    assert (n, b, 9) not in intervals._PREFETCHED  # taken once, not kept
    with pytest.raises(ValueError, match="n_resamples >= 1"):
        intervals.prefetch_bootstrap_counts(n, 0)


def test_tiles_and_threads_give_the_replicates_of_one_pass():
    """Resamples taken in tiles (64 and 64 + the 5 left) equal one pass over all of them, bit
    for bit, on one thread and on several: counts and histograms are whole numbers, and each
    resample's sum runs in the same order and vector lane (widths are multiples of 64, the
    leftover joins the last tile: 5 columns summed alone round differently)."""
    from probe.evaluation import intervals

    g = torch.Generator().manual_seed(11)
    n, c = 400, 7
    scores = torch.randint(0, 25, (2, n, c), generator=g).float()  # ties
    scores[1, :, 4] = torch.randn(n, generator=g)
    targets = torch.rand(n, c, generator=g) < 0.15
    targets[:, 3] = False  # an empty class
    counts = bootstrap_counts(n, 133, seed=2)
    cpu = torch.device("cpu")
    assert intervals._tile_width(n, 133, 4, cpu) == 133  # small: one tile
    whole = weighted_column_ap(scores, targets, counts)
    before = (intervals.TILE_BYTES, torch.get_num_threads())
    try:
        intervals.TILE_BYTES = 4 * n * 100  # room for 100 resamples: tiles of 64
        assert intervals._tile_width(n, 133, 4, cpu) == 64
        assert intervals._tiles(133, 64) == [(0, 64), (64, 133)]
        for threads in (1, 3):
            torch.set_num_threads(threads)
            assert torch.equal(weighted_column_ap(scores, targets, counts), whole)
    finally:
        intervals.TILE_BYTES = before[0]
        torch.set_num_threads(before[1])
    assert torch.allclose(whole, naive_bootstrap_ap(scores, targets, counts), atol=1e-6)
    # COCO's test set: 64 resamples of 40,137 rows, a 10 MB tile; never a width off the step
    assert intervals._tile_width(40_137, 1000, 4, cpu) == 64
    widths = {intervals._tile_width(m, 1000, 4, cpu) for m in range(1000, 90_000, 997)}
    assert 1000 in widths and all(w == 1000 or w % 64 == 0 for w in widths)
    assert intervals._tile_width(40_137, 1000, 4, torch.device("meta")) == 1000


def test_replicates_do_not_depend_on_the_sorts_tie_order():
    """Positives tied with each other enter the sum in row order, whatever order the sort left
    them in: NumPy's argsort (the CPU's) and torch's sort give the same bits on heavy ties."""
    from probe.metrics import ranking

    g = torch.Generator().manual_seed(12)
    n, c = 600, 6
    scores = torch.randint(0, 8, (2, n, c), generator=g).float()  # ~75 rows per score
    targets = torch.rand(n, c, generator=g) < 0.3
    counts = bootstrap_counts(n, 70, seed=4)
    numpy_sort = weighted_column_ap(scores, targets, counts)
    try:
        ranking._NUMPY_SORT = False
        torch_sort = weighted_column_ap(scores, targets, counts)
        # a different tie order in the sort itself: rows reversed, then scored the same
        flipped = weighted_column_ap(scores.flip(1), targets.flip(0), counts.flip(1))
    finally:
        ranking._NUMPY_SORT = True
    assert torch.equal(numpy_sort, torch_sort)
    assert torch.allclose(numpy_sort, flipped, atol=1e-6, rtol=0)
    assert torch.allclose(numpy_sort, naive_bootstrap_ap(scores, targets, counts), atol=1e-6)
