"""probe.metrics: AP matches scikit-learn column by column (ties, dtypes, edge classes), the
trial axis equals T separate calls, blocking does not change results, OF1/CF1 match hand values
and scikit-learn, the accumulator equals the plain functions, and bad input fails clearly."""

from __future__ import annotations

import math
import warnings
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, f1_score, precision_score, recall_score

import probe.metrics.ranking as ranking
from probe.metrics import (
    MetricAccumulator,
    MetricInputError,
    average_precision,
    f1_scores,
    mean_average_precision,
)


def _sk_ap(targets: torch.Tensor, scores: torch.Tensor) -> np.ndarray:
    """scikit-learn AP per column, with the protocol's 0 for a column without positives."""
    y, s = targets.numpy().astype(int), scores.double().numpy()
    out = []
    for c in range(y.shape[1]):
        if y[:, c].sum() == 0:
            out.append(0.0)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.append(average_precision_score(y[:, c], s[:, c]))
    return np.array(out)


def _data(n: int = 300, c: int = 9, seed: int = 0, decimals: int = 1):
    """Scores rounded to ``decimals`` (many ties); class 0 empty, class 1 all positive,
    class 2 constant scores."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(n, c, generator=g)
    probs = torch.round(probs * 10**decimals) / 10**decimals
    targets = (torch.rand(n, c, generator=g) < 0.3).to(torch.uint8)
    targets[:, 0] = 0
    targets[:, 1] = 1
    probs[:, 2] = 0.4
    targets[0, 2] = 1
    return targets, probs


# --------------------------------------------------------------------------------------------
# AP against scikit-learn and by hand
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ap_matches_sklearn_with_many_ties(seed):
    targets, probs = _data(seed=seed)
    ap = average_precision(targets, probs=probs)
    assert ap.shape == (9,) and ap.dtype == torch.float32
    np.testing.assert_allclose(ap.numpy(), _sk_ap(targets, probs), rtol=0, atol=2e-6)
    assert ap[0] == 0 and ap[1] == 1
    assert ap[2] == pytest.approx(targets[:, 2].sum().item() / 300)  # constant: P / N


@pytest.mark.parametrize(
    "y, s, expected",
    [
        ([1, 0, 0, 1], [0.9, 0.5, 0.5, 0.2], 0.75),  # 1/2*1 + 0 + 1/2*(2/4)
        ([0, 1, 1, 0], [0.9, 0.5, 0.5, 0.1], 2 / 3),  # tie: both positives at precision 2/3
        ([1, 0], [0.5, 0.5], 0.5),  # one tie group: P / N
        ([0, 1, 0, 1], [0.1, 0.2, 0.3, 0.4], (1 + 2 / 3) / 2),
        ([1, 1, 1], [0.3, 0.1, 0.2], 1.0),
        ([0, 0, 0], [0.3, 0.1, 0.2], 0.0),
    ],
)
def test_ap_hand_computed(y, s, expected):
    targets = torch.tensor(y).unsqueeze(1)
    ap = average_precision(targets, probs=torch.tensor(s).unsqueeze(1))
    assert ap.item() == pytest.approx(expected, abs=1e-7)


def test_tie_handling_differs_from_ranking_order():
    """Ties form one threshold: wherever the positives sit inside the tie group, AP is the
    group's precision 2/4 (ranking tied rows one by one would give 0.5 to 0.83)."""
    s = torch.tensor([[0.9], [0.5], [0.5], [0.5], [0.1]])
    for y in ([0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 1, 0, 1, 0]):
        t = torch.tensor(y).unsqueeze(1)
        assert average_precision(t, probs=s).item() == pytest.approx(0.5)


@settings(max_examples=60, deadline=None)
@given(data=st.lists(st.tuples(st.integers(0, 1), st.integers(-3, 3)), min_size=1, max_size=25))
def test_ap_property_against_sklearn(data):
    """Arbitrary small columns of integer scores (heavy ties) agree with scikit-learn."""
    y = torch.tensor([d[0] for d in data]).unsqueeze(1)
    s = torch.tensor([float(d[1]) for d in data]).unsqueeze(1)
    np.testing.assert_allclose(average_precision(y, logits=s).numpy(), _sk_ap(y, s), atol=1e-6)


def test_float16_and_float64_inputs():
    targets, probs = _data(seed=3, decimals=3)
    half = probs.half()
    ap16 = average_precision(targets, probs=half)
    assert ap16.dtype == torch.float32
    np.testing.assert_allclose(ap16.numpy(), _sk_ap(targets, half.float()), atol=2e-6)
    ap64 = average_precision(targets, probs=probs.double())
    assert ap64.dtype == torch.float64
    np.testing.assert_allclose(ap64.numpy(), _sk_ap(targets, probs), atol=1e-12)
    bf = average_precision(targets, logits=probs.bfloat16())
    np.testing.assert_allclose(bf.numpy(), _sk_ap(targets, probs.bfloat16().float()), atol=2e-6)


def test_float64_keeps_differences_below_float32_resolution():
    """Scores 1e-12 apart are distinct in float64 (a float32 cast would tie them)."""
    s = torch.tensor([[0.5 + 1e-12], [0.5], [0.1]], dtype=torch.float64)
    t = torch.tensor([[1], [0], [1]])
    expected = average_precision_score([1, 0, 1], s[:, 0].numpy())
    assert expected == pytest.approx((1 + 2 / 3) / 2)
    assert average_precision(t, probs=s).item() == pytest.approx(expected, abs=1e-12)


def test_logits_rank_without_sigmoid_saturation():
    """Logits 20 and 30 both give sigmoid 1.0 in float32, yet they are ranked as logits."""
    z = torch.tensor([[30.0], [20.0], [-1.0]])
    t = torch.tensor([[1], [0], [0]])
    assert average_precision(t, logits=z).item() == 1.0
    assert average_precision(t, probs=torch.sigmoid(z)).item() == pytest.approx(0.5)


def test_logits_and_probs_give_same_ap():
    g = torch.Generator().manual_seed(4)
    z = torch.randn(150, 5, generator=g, dtype=torch.float64)
    t = (torch.rand(150, 5, generator=g) < 0.4).long()
    torch.testing.assert_close(
        average_precision(t, logits=z), average_precision(t, probs=torch.sigmoid(z))
    )


def test_nan_column_gives_nan_and_spares_others():
    targets, probs = _data(seed=5)
    probs[7, 4] = math.nan
    ap = average_precision(targets, logits=probs)
    assert torch.isnan(ap[4]) and not torch.isnan(ap[torch.arange(9) != 4]).any()
    clean = _sk_ap(targets, probs.nan_to_num(0.0))
    np.testing.assert_allclose(ap[5:].numpy(), clean[5:], atol=2e-6)


# --------------------------------------------------------------------------------------------
# mAP, trial axis, blocking
# --------------------------------------------------------------------------------------------


def test_map_keeps_empty_classes_and_counts_them():
    targets, probs = _data(seed=6)
    targets[:, 5] = 0
    res = mean_average_precision(targets, probs=probs)
    ref = _sk_ap(targets, probs)
    assert res.n_empty_classes == 2
    assert res.map.shape == () and res.ap.shape == (9,)
    assert res.map.item() == pytest.approx(100 * ref.mean(), abs=1e-4)  # mean over all 9
    assert res.map.item() < 100 * ref[ref > 0].mean()


def test_stacked_trials_equal_separate_calls():
    g = torch.Generator().manual_seed(7)
    t_, n, c = 4, 120, 6
    logits = torch.round(torch.randn(t_, n, c, generator=g) * 4) / 4
    targets = (torch.rand(n, c, generator=g) < 0.3).to(torch.int8)
    targets[:, 0] = 0
    res = mean_average_precision(targets, logits=logits)
    assert res.map.shape == (t_,) and res.ap.shape == (t_, c) and res.n_empty_classes == 1
    f1 = f1_scores(targets, logits=logits, threshold=0.4)
    for i in range(t_):
        one = mean_average_precision(targets, logits=logits[i])
        torch.testing.assert_close(res.ap[i], one.ap, rtol=0, atol=0)
        torch.testing.assert_close(res.map[i], one.map, rtol=0, atol=0)
        one_f1 = f1_scores(targets, logits=logits[i], threshold=0.4)
        for a, b in zip(f1, one_f1, strict=True):
            torch.testing.assert_close(a[i], b, rtol=0, atol=0)


@pytest.mark.parametrize("chunk", [7, 300, 900, 2000])
def test_blocking_does_not_change_results(monkeypatch, chunk):
    """Blocks of classes (chunk < N), of single trials and of several trials give the same AP."""
    g = torch.Generator().manual_seed(8)
    logits = torch.round(torch.randn(5, 300, 4, generator=g) * 3) / 3
    targets = (torch.rand(300, 4, generator=g) < 0.3).bool()
    whole = average_precision(targets, logits=logits)
    monkeypatch.setattr(ranking, "_CHUNK_ELEMENTS", chunk)
    torch.testing.assert_close(average_precision(targets, logits=logits), whole, rtol=0, atol=0)


def _all_rows_ap_block(scores: torch.Tensor, targets: torch.Tensor,
                       canonical: bool = True) -> torch.Tensor:
    """The all-rows form of probe.metrics.ranking.ap_block (the reference: every sorted row's
    precision, zeros at the negatives, summed over N). ``canonical``: ranked ascending with a
    negative before a positive of the same score (two stable sorts: target, then score), as
    ap_block ranks; False: the previous kernel, whose ties between a
    positive and a negative fell in ``torch.sort``'s (unstable) order."""
    n = scores.shape[-2]
    work = torch.float64 if scores.dtype == torch.float64 or n >= 1 << 24 else torch.float32
    cols = scores.transpose(-1, -2).to(work).contiguous()
    y0 = targets.t().expand(cols.shape)
    if canonical:
        by_target = y0.to(torch.int8).sort(dim=-1, stable=True).indices
        ranked, order = cols.gather(-1, by_target).sort(dim=-1, stable=True)
        order = by_target.gather(-1, order)
    else:
        ranked, order = cols.sort(dim=-1)
    y = y0.gather(-1, order)
    yw = y.to(work)
    before = yw.cumsum(-1)
    n_pos = before[..., -1].clone()
    before -= yw
    new = torch.ones(ranked.shape, dtype=torch.bool)
    torch.ne(ranked[..., 1:], ranked[..., :-1], out=new[..., 1:])
    pos = torch.arange(n).expand(ranked.shape)
    start = torch.where(new, pos, 0).cummax(-1).values
    admitted = (n - start).to(work)
    tp_at = n_pos.unsqueeze(-1) - before.gather(-1, start)
    total = torch.where(y, tp_at / admitted, 0).sum(-1)
    ap = torch.where(n_pos > 0, total / n_pos.clamp_min(1), torch.zeros_like(total))
    return torch.where(ranked[..., -1].isnan(), torch.full_like(ap, math.nan), ap)


@pytest.mark.parametrize("kind", ["normal", "ties", "constant", "half_nan", "float64_ties",
                                  "coco_like"])
def test_positives_only_ap_is_bit_identical_to_the_all_rows_sum(kind):
    """ap_block (values-only sorts, then the positives alone) is bit for bit the all-rows sum
    over the canonical ranking."""
    g = torch.Generator().manual_seed(zlib.crc32(kind.encode()))  # str hash() varies by run
    for _ in range(40 if kind != "coco_like" else 1):
        n, c, lead = (int(torch.randint(1, 400, (), generator=g)),
                      int(torch.randint(1, 7, (), generator=g)),
                      int(torch.randint(1, 4, (), generator=g)))
        if kind == "coco_like":
            n, c, lead = 16_416, 80, 2
        s = torch.randn(lead, n, c, generator=g)
        if kind == "ties":
            s = torch.randint(0, 4, (lead, n, c), generator=g).float()
        elif kind == "constant":
            s = torch.full((lead, n, c), 0.25)
        elif kind == "half_nan":
            s = s.half().float()
            s[0, int(torch.randint(0, n, (), generator=g)), 0] = math.nan
        elif kind == "float64_ties":
            s = s.double().round(decimals=1)
        rate = 0.036 if kind == "coco_like" else float(torch.rand((), generator=g))
        t = torch.rand(n, c, generator=g) < rate
        got, want = ranking.ap_block(s, t), _all_rows_ap_block(s, t)
        assert got.dtype == want.dtype
        assert torch.equal(got.nan_to_num(-1.0), want.nan_to_num(-1.0)), (n, c, lead)
        assert torch.equal(got.isnan(), want.isnan())


def _mixed_tie_columns(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(L, C) bool: the columns where a positive's score equals a negative's."""
    out = torch.zeros(scores.shape[0], scores.shape[-1], dtype=torch.bool)
    for i in range(scores.shape[0]):
        for j in range(scores.shape[-1]):
            col, pos = scores[i, :, j], targets[:, j]
            out[i, j] = bool(torch.isin(col[pos], col[~pos]).any())
    return out


@pytest.mark.parametrize("kind", ["coco_like", "ties"])
def test_canonical_ranking_moves_the_old_kernels_ap_by_rounding_only(kind):
    """In the previous kernel a positive tying a negative sat where torch's unstable sort put it,
    which moved the sum's rounding. Columns without such a tie keep every bit; the others
    move by at most a few float32 ulps (the same precisions, summed in other positions)."""
    g = torch.Generator().manual_seed(11)
    n, c = (16_416, 80) if kind == "coco_like" else (500, 6)
    s = torch.randn(2, n, c, generator=g)
    if kind == "ties":
        s = torch.randint(0, 5, (2, n, c), generator=g).float()
    t = torch.rand(n, c, generator=g) < (0.036 if kind == "coco_like" else 0.3)
    new, old = ranking.ap_block(s, t), _all_rows_ap_block(s, t, canonical=False)
    mixed = _mixed_tie_columns(s, t)
    assert mixed.any()  # float32 logits of 16k rows do tie a positive and a negative
    assert torch.equal(new[~mixed], old[~mixed])
    torch.testing.assert_close(new, old, rtol=4e-7, atol=0)


def test_numpy_and_torch_sorts_give_the_same_bits(monkeypatch):
    """CPU columns are sorted by NumPy, CUDA's by torch.sort: on the CPU both give the same
    bits (the canonical order leaves a sort no choice that shows)."""
    g = torch.Generator().manual_seed(12)
    for s in (torch.randn(3, 2000, 9, generator=g),
              torch.randint(0, 3, (3, 2000, 9), generator=g).double()):
        t = torch.rand(2000, 9, generator=g) < 0.2
        with_numpy = ranking.ap_block(s, t)
        monkeypatch.setattr(ranking, "_NUMPY_SORT", False)
        with_torch = ranking.ap_block(s, t)
        monkeypatch.setattr(ranking, "_NUMPY_SORT", True)
        assert torch.equal(with_numpy, with_torch)


def test_signed_zeros_are_one_threshold():
    """-0.0 and 0.0 compare equal: one tie group, as in scikit-learn."""
    s = torch.tensor([[-0.0], [0.0], [0.0], [-0.0], [1.0], [-1.0]])
    t = torch.tensor([[True], [False], [True], [False], [False], [True]])
    assert average_precision(t, logits=s).item() == pytest.approx(_sk_ap(t, s)[0], abs=1e-7)
    assert torch.equal(ranking.ap_block(s[None], t), _all_rows_ap_block((s + 0.0)[None], t))


# --------------------------------------------------------------------------------------------
# OF1 / CF1
# --------------------------------------------------------------------------------------------


def test_f1_hand_computed():
    # class 0: TP 1 FP 1 FN 1; class 1: TP 2 FP 0 FN 0; class 2: no positive, 1 FP
    probs = torch.tensor([[0.9, 0.8, 0.1], [0.6, 0.7, 0.2], [0.2, 0.1, 0.5], [0.4, 0.3, 0.3]])
    targets = torch.tensor([[1, 1, 0], [0, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    r = f1_scores(targets, probs=probs)  # 0.5 is a positive prediction (>=)
    op, orc = 3 / 5, 3 / 4
    cp, cr = (1 / 2 + 1 + 0) / 3, (1 / 2 + 1 + 0) / 3
    assert r.overall_precision.item() == pytest.approx(100 * op)
    assert r.overall_recall.item() == pytest.approx(100 * orc)
    assert r.overall_f1.item() == pytest.approx(100 * 2 * op * orc / (op + orc))
    assert r.class_precision.item() == pytest.approx(100 * cp)
    assert r.class_recall.item() == pytest.approx(100 * cr)
    assert r.class_f1.item() == pytest.approx(100 * 2 * cp * cr / (cp + cr))
    assert set(r.to_dict()) == {"OF1", "CF1", "OP", "OR", "CP", "CR"}


@pytest.mark.parametrize("threshold", [0.5, 0.3, 0.75])
def test_f1_against_sklearn(threshold):
    targets, probs = _data(seed=9, decimals=2)
    probs = probs.double()
    r = f1_scores(targets, probs=probs, threshold=threshold)
    y, p = targets.numpy(), (probs.numpy() >= threshold).astype(int)
    assert r.overall_f1.item() == pytest.approx(100 * f1_score(y, p, average="micro"))
    cp = precision_score(y, p, average="macro", zero_division=0)
    cr = recall_score(y, p, average="macro", zero_division=0)
    assert r.class_precision.item() == pytest.approx(100 * cp)
    assert r.class_recall.item() == pytest.approx(100 * cr)
    assert r.class_f1.item() == pytest.approx(100 * 2 * cp * cr / (cp + cr))
    # CF1 is the harmonic mean of CP and CR, not the mean of per-class F1
    macro = 100 * f1_score(y, p, average="macro", zero_division=0)
    assert r.class_f1.item() != pytest.approx(macro)
    lg = f1_scores(targets, logits=torch.logit(probs), threshold=threshold)
    boundary = (probs - threshold).abs().min()
    if boundary > 1e-9:
        for a, b in zip(r, lg, strict=True):
            assert a.item() == pytest.approx(b.item())


def test_f1_threshold_boundary_and_nothing_predicted():
    t = torch.tensor([[1, 0], [0, 1]])
    at = f1_scores(t, logits=torch.tensor([[0.0, -1.0], [-1.0, -1.0]]))
    assert at.overall_precision.item() == 100 and at.overall_recall.item() == 50
    none = f1_scores(t, probs=torch.full((2, 2), 0.1))
    assert all(v.item() == 0 for v in none)


# --------------------------------------------------------------------------------------------
# accumulator
# --------------------------------------------------------------------------------------------


def test_accumulator_equals_functions():
    g = torch.Generator().manual_seed(10)
    logits = torch.round(torch.randn(3, 100, 5, generator=g) * 2) / 2
    targets = (torch.rand(100, 5, generator=g) < 0.3).to(torch.uint8)
    acc = MetricAccumulator()
    for lo in range(0, 100, 32):
        acc.update(targets[lo : lo + 32], logits=logits[:, lo : lo + 32])
    assert acc.n_rows == 100
    res, ref = acc.mean_average_precision(), mean_average_precision(targets, logits=logits)
    torch.testing.assert_close(res.ap, ref.ap, rtol=0, atol=0)
    assert res.n_empty_classes == ref.n_empty_classes
    torch.testing.assert_close(acc.average_precision(), ref.ap, rtol=0, atol=0)
    for a, b in zip(
        acc.f1_scores(0.6), f1_scores(targets, logits=logits, threshold=0.6), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # more batches after a compute are included; reset forgets everything
    acc.update(targets[:10], logits=logits[:, :10])
    assert acc.n_rows == 110
    more = mean_average_precision(
        torch.cat([targets, targets[:10]]), logits=torch.cat([logits, logits[:, :10]], dim=1)
    )
    torch.testing.assert_close(acc.mean_average_precision().ap, more.ap, rtol=0, atol=0)
    acc.reset()
    with pytest.raises(MetricInputError, match="empty"):
        acc.mean_average_precision()


def test_accumulator_errors():
    acc = MetricAccumulator()
    acc.update(torch.zeros(4, 3, dtype=torch.long), probs=torch.rand(4, 3))
    with pytest.raises(MetricInputError, match="holds probs"):
        acc.update(torch.zeros(4, 3, dtype=torch.long), logits=torch.rand(4, 3))
    with pytest.raises(MetricInputError, match="earlier batches"):
        acc.update(torch.zeros(4, 2, dtype=torch.long), probs=torch.rand(4, 2))
    acc.update(torch.full((4, 3), -1), probs=torch.rand(4, 3))  # values checked at compute
    with pytest.raises(MetricInputError, match="observed negative"):
        acc.mean_average_precision()


# --------------------------------------------------------------------------------------------
# clear errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "exactly one of logits= or probs= \\(got neither\\)"),
        ({"logits": torch.rand(3, 2), "probs": torch.rand(3, 2)}, "got both"),
        ({"probs": torch.rand(3)}, "\\(N, C\\) or \\(T, N, C\\)"),
        ({"probs": torch.ones(3, 2, dtype=torch.long)}, "floating tensor"),
        ({"probs": torch.rand(4, 2)}, "does not match probs shape"),
        ({"probs": torch.tensor([[0.5, 1.5]] * 3)}, "\\[0, 1\\].*logits="),
        ({"logits": [[0.1, 0.2]] * 3}, "must be a torch.Tensor"),
    ],
)
def test_bad_scores(kwargs, match):
    with pytest.raises(MetricInputError, match=match):
        mean_average_precision(torch.zeros(3, 2, dtype=torch.long), **kwargs)


@pytest.mark.parametrize(
    "targets, match",
    [
        (torch.tensor([[1, -1], [0, 1]]), "found \\[-1\\].*observed negative.*labels"),
        (torch.tensor([[2, 0], [0, 1]]), "only 0 and 1; found \\[2\\]"),
        (torch.tensor([[1.0, 0.0], [0.0, 1.0]]), "bool or integer.*torch.uint8"),
        (torch.zeros(2, 2, 1, dtype=torch.long), "targets must have shape \\(N, C\\)"),
        (torch.zeros(0, 2, dtype=torch.long), "at least one row"),
    ],
)
def test_bad_targets(targets, match):
    scores = torch.rand(*targets.shape[:2]) if targets.dim() >= 2 else torch.rand(2, 2)
    with pytest.raises(MetricInputError, match=match):
        average_precision(targets, logits=scores)


@pytest.mark.parametrize("threshold", [0, 1.0, -0.1, True, "0.5", math.nan])
def test_bad_threshold(threshold):
    with pytest.raises(MetricInputError, match="threshold"):
        f1_scores(torch.zeros(2, 2, dtype=torch.long), probs=torch.rand(2, 2), threshold=threshold)


def test_errors_are_value_errors():
    assert issubclass(MetricInputError, ValueError)
