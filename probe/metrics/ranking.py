"""Exact average precision, column by column: the ranking kernel shared by the evaluation
metrics (:mod:`probe.metrics`) and the losses that rank (OPML's AP-weighted options).

AP of one column is scikit-learn's ``average_precision_score``: the step-wise sum over the
*distinct* score thresholds in decreasing order, tied scores entering together. A column without
positives gets 0; a column holding a NaN score gets NaN. No input checks (the callers check):
``scores`` ``(N, C)`` or ``(..., N, C)`` floating, ``targets`` ``(N, C)`` bool on the scores'
device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor

__all__ = ["ap_block", "argsort_rows", "column_ap"]

# score elements ranked in one block: ~20 bytes each, so a block peaks near 400 MB
_CHUNK_ELEMENTS = 1 << 24
# sort CPU columns with NumPy (False: torch.sort, as on CUDA; the sorted values are the same,
# tests/test_metrics.py checks both)
_NUMPY_SORT = True


def ap_block(scores: Tensor, targets: Tensor) -> Tensor:
    """AP of every column of ``scores`` ``(L, N, c)`` against bool ``targets`` ``(N, c)``.

    Each column is ranked ascending by score, a negative before a positive of the same score
    (the *canonical* order: whatever tie order a sort would pick, every AP bit is then fixed by
    the scores, the targets and the device's summation -- NumPy's sort and torch's give the
    same bits on the CPU, on any thread count; CUDA sums in its own order). For a
    positive with score s the tie group of s starts at ``start = #{scores < s}``, so the
    threshold s admits ``N - start`` rows of which ``P - #{positives below s}`` are positive:
    that is sklearn's precision at threshold s. Its recall step is 1/P per positive, hence
    ``AP = (1/P) sum_{positive rows} precision(threshold = own score)``, which for a tie group
    with k positives adds ``k/P`` times the precision of the whole group -- exactly sklearn's
    step-wise sum over distinct thresholds.

    How: the columns are sorted as values only (:func:`_sort_rows`); per class the positives'
    scores of all L trials are sorted and binary-searched into their columns for ``start``
    (:func:`_class_precisions`). The group's positives take its last k positions in the
    canonical order; their precisions are scattered into a zero vector of length N per column
    and summed, so the AP is bit for bit the sum over every sorted row (tests/test_metrics.py).
    """
    lead, n, c = scores.shape[:-2], scores.shape[-2], scores.shape[-1]
    rows = math.prod(lead)
    work = torch.float64 if scores.dtype == torch.float64 or n >= 1 << 24 else torch.float32
    # (c, L, N): a class's columns of every trial are one block; + 0.0 turns -0.0 into 0.0
    cols = torch.empty(c, rows, n, dtype=work, device=scores.device)
    torch.add(scores.reshape(rows, n, c).permute(2, 0, 1), 0.0, out=cols)
    nan_col = cols.isnan().any(-1)  # (c, L)
    has_nan = bool(nan_col.any())
    if has_nan:  # NaN ranks as +inf (its column's AP is NaN anyway)
        cols.nan_to_num_(nan=math.inf, posinf=math.inf, neginf=-math.inf)
    by_class = [t.nonzero().squeeze(1) for t in targets.t()]
    positives = [cols[j][:, i] for j, i in enumerate(by_class)]  # (L, P_j), before the sort
    _sort_rows(cols.view(c * rows, n))
    precision = torch.zeros(rows, c, n, dtype=work, device=scores.device)
    for j, v in enumerate(positives):
        if v.shape[1]:
            slot, value = _class_precisions(cols[j], v, n)
            precision[:, j].scatter_(-1, slot, value)
    total = precision.sum(-1)  # (L, c)
    n_pos = targets.sum(0).to(device=scores.device, dtype=work)
    ap = torch.where(n_pos > 0, total / n_pos.clamp_min(1), torch.zeros_like(total))
    if has_nan:
        ap = torch.where(nan_col.t(), torch.full_like(ap, math.nan), ap)
    return ap.reshape(*lead, c)


def _class_precisions(ranked: Tensor, v: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """One class in every trial: ``ranked`` ``(L, N)`` the sorted columns, ``v`` ``(L, P)`` the
    positives' scores. Returns each positive's position in the canonical order and its
    precision at its own score, both ``(L, P)``."""
    n_lead, p = v.shape
    _sort_rows(v)  # a fresh (L, P) copy: sorted in place
    idx = torch.arange(p, device=v.device).expand(n_lead, p)
    # tie groups among the positives (rare): first and one-past-last index of each value
    new = torch.ones(n_lead, p, dtype=torch.bool, device=v.device)
    torch.ne(v[:, 1:], v[:, :-1], out=new[:, 1:])
    first = torch.where(new, idx, 0).cummax(-1).values
    last = torch.ones_like(new)
    last[:, :-1] = new[:, 1:]
    past = torch.where(last, idx + 1, p).flip(-1).cummin(-1).values.flip(-1)
    start = torch.searchsorted(ranked, v)  # #{scores < v}
    end = start + (past - first)  # the group's end if no negative ties it
    tied = end < n
    tied &= ranked.gather(-1, end.clamp_max(n - 1)) == v
    if bool(tied.any()):
        end = torch.where(tied, torch.searchsorted(ranked, v, right=True), end)
    precision = (float(p) - first.to(ranked.dtype)) / (n - start).to(ranked.dtype)
    return end - past + idx, precision


def _sort_rows(rows: Tensor) -> None:
    """Sort every row of the contiguous 2-D ``rows`` in place, values only: NumPy's sort on
    the CPU, the rows shared among the intra-op threads (it releases the GIL); torch's else."""
    if rows.device.type != "cpu" or not _NUMPY_SORT:
        rows.copy_(rows.sort(dim=-1).values)
        return
    a = rows.numpy()
    _by_row_ranges(a.shape[0], a.size, lambda lo, hi: a[lo:hi].sort(axis=-1))


def argsort_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """Every row of the 2-D ``rows`` sorted ascending (NaN last): ``(values, indices)``, by
    NumPy's argsort on the CPU (rows shared among the intra-op threads), else torch's sort.
    Ties come in no defined order: a caller that needs one imposes it."""
    if rows.device.type != "cpu" or not _NUMPY_SORT:
        return rows.sort(dim=-1)
    a = rows.contiguous().numpy()
    order = np.empty(a.shape, dtype=np.int64)

    def part(lo: int, hi: int) -> None:
        order[lo:hi] = np.argsort(a[lo:hi], axis=-1)

    _by_row_ranges(a.shape[0], a.size, part)
    idx = torch.from_numpy(order)
    return torch.gather(rows, -1, idx), idx


def _by_row_ranges(n_rows: int, size: int, work: Callable[[int, int], None]) -> None:
    """``work(lo, hi)`` over row ranges covering ``n_rows``: one range per intra-op thread, run
    at once (NumPy's sorts release the GIL), or a single range for small arrays (< 64k
    elements, where threads cost more than they save)."""
    workers = min(torch.get_num_threads(), n_rows)
    if workers <= 1 or size < 1 << 16:
        work(0, n_rows)
        return
    bounds = np.linspace(0, n_rows, workers + 1).astype(int)
    with ThreadPoolExecutor(workers, "spml-rank") as pool:
        list(pool.map(lambda i: work(bounds[i], bounds[i + 1]), range(workers)))


@torch.no_grad()
def column_ap(scores: Tensor, targets: Tensor) -> Tensor:
    """AP ``(C,)`` / ``(T, C)`` for scores ``(N, C)`` / ``(T, N, C)`` and bool targets ``(N, C)``.

    Columns are ranked in blocks of whole trials (and, for very tall sets, of classes) holding at
    most ``_CHUNK_ELEMENTS`` scores, to bound memory; usually one block.
    """
    stacked = scores.reshape(-1, *scores.shape[-2:])  # (L, N, C)
    n_lead, n, c = stacked.shape
    c_step = max(1, min(c, _CHUNK_ELEMENTS // n))
    l_step = max(1, _CHUNK_ELEMENTS // (n * c_step))
    out_dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    ap = torch.empty(n_lead, c, dtype=out_dtype, device=scores.device)
    for l0 in range(0, n_lead, l_step):
        for c0 in range(0, c, c_step):
            block = stacked[l0 : l0 + l_step, :, c0 : c0 + c_step]
            ap[l0 : l0 + l_step, c0 : c0 + c_step] = ap_block(block, targets[:, c0 : c0 + c_step])
    return ap.reshape(*scores.shape[:-2], c)
