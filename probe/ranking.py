"""Exact average precision, column by column: the ranking kernel shared by the evaluation
metrics (:mod:`probe.metrics`) and the losses that rank (OPML's AP-weighted options).

AP of one column is scikit-learn's ``average_precision_score``: the step-wise sum over the
*distinct* score thresholds in decreasing order, tied scores entering together. A column without
positives gets 0; a column holding a NaN score gets NaN. Pure torch; no input checks (the
callers check): ``scores`` ``(N, C)`` or ``(..., N, C)`` floating, ``targets`` ``(N, C)`` bool on
the scores' device.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["ap_block", "column_ap"]

# Largest number of score elements (rows x columns) ranked in one block. Ranking needs about
# 50 bytes per element (sorted values, indices, targets, counts), so a block peaks near 1 GB;
# COCO test (40,137 x 80) x 64 stacked trials is then ~13 blocks of whole trials.
_CHUNK_ELEMENTS = 1 << 24


def ap_block(scores: Tensor, targets: Tensor) -> Tensor:
    """AP of every column of ``scores`` ``(L, N, c)`` against bool ``targets`` ``(N, c)``.

    One ascending sort per column. For a positive at sorted position i with score s, the tie
    group of s starts at ``start = #{scores < s}``, so the threshold s admits ``N - start`` rows
    of which ``P - #{positives before start}`` are positive: that is sklearn's precision at
    threshold s. Its recall step is 1/P per positive,
    hence ``AP = (1/P) sum_{positive rows} precision(threshold = own score)``, which for a tie
    group with k positives adds ``k/P`` times the precision of the whole group -- exactly
    sklearn's step-wise sum over distinct thresholds.

    Only the positives (~3.6% of COCO's entries) are visited after the sort: ``start`` is the
    positive's own position unless the score before it is equal (then a binary search of its
    row), and the positives before ``start`` are its rank among its column's positives less
    those of its tie group before it. The precisions are scattered back to their sorted
    positions in a zero vector of length N and summed there, so the sum -- and the AP -- is bit
    for bit that of summing over every sorted row (tests/test_metrics.py checks it against that
    all-rows form, with ties, NaN and float64).
    """
    n = scores.shape[-2]
    work = torch.float64 if scores.dtype == torch.float64 or n >= 1 << 24 else torch.float32
    cols = scores.transpose(-1, -2).to(work).contiguous()  # (L, c, N); upcast keeps every tie
    ranked, order = cols.sort(dim=-1)
    del cols
    y = targets.t().expand(ranked.shape).gather(-1, order)
    del order
    flat = ranked.reshape(-1)
    g = y.reshape(-1).nonzero().squeeze(1)  # flat sorted positions of the positives, ascending
    del y
    row = torch.div(g, n, rounding_mode="floor")  # the positive's column (flattened L·c)
    row0 = row * n  # its column's first flat position
    v = flat[g]
    start = _tie_group_starts(flat, g, row0, v) - row0
    before = _positives_before_their_group(row, v).to(work)
    n_pos = torch.bincount(row, minlength=math.prod(ranked.shape[:-1])).to(work)
    precision = torch.zeros_like(flat)
    precision[g] = (n_pos[row] - before) / (n - start).to(work)
    n_pos = n_pos.reshape(ranked.shape[:-1])
    total = precision.reshape(ranked.shape).sum(-1)
    ap = torch.where(n_pos > 0, total / n_pos.clamp_min(1), torch.zeros_like(total))
    # ascending sort puts NaN last: a column with a NaN score has no defined ranking
    return torch.where(ranked[..., -1].isnan(), torch.full_like(ap, math.nan), ap)


def _tie_group_starts(flat: Tensor, g: Tensor, row0: Tensor, v: Tensor) -> Tensor:
    """Flat position of the first element equal to ``flat[g]`` in its sorted column (which
    starts at ``row0``): ``g`` itself unless the element before it is equal, else a binary
    search of ``[row0, g]`` (ties are rare in real logits; a constant head ties a whole column)."""
    start = g.clone()
    tied = (g > row0) & (flat[(g - 1).clamp_min(0)] == v)
    if bool(tied.any()):
        lo, hi, want = row0[tied], g[tied], v[tied]
        while bool((lo < hi).any()):
            mid = torch.div(lo + hi, 2, rounding_mode="floor")
            less = flat[mid] < want
            lo, hi = torch.where(less, mid + 1, lo), torch.where(less, hi, mid)
        start[tied] = lo
    return start


def _positives_before_their_group(row: Tensor, v: Tensor) -> Tensor:
    """For positives listed by column then sorted position (``row``, score ``v``): how many
    positives of the same column have a smaller score (the rank of the first positive of its
    tie group within the column)."""
    idx = torch.arange(row.numel(), device=row.device)
    new_row = torch.ones_like(row, dtype=torch.bool)
    new_row[1:] = row[1:] != row[:-1]
    new_group = new_row.clone()
    new_group[1:] |= v[1:] != v[:-1]
    row_first = torch.where(new_row, idx, 0).cummax(0).values
    return torch.where(new_group, idx, 0).cummax(0).values - row_first


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
