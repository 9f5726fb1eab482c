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

    One ascending sort per column. For the row at sorted position i with score s, the tie group
    of s starts at ``start = #{scores < s}`` (the running maximum of the positions where the
    sorted value changes: one linear pass, no search), so the threshold s admits ``N - start``
    rows of which ``P - #{positives before start}`` are positive: that is sklearn's precision
    at threshold s. Its recall step is 1/P per positive,
    hence ``AP = (1/P) sum_{positive rows} precision(threshold = own score)``, which for a tie
    group with k positives adds ``k/P`` times the precision of the whole group -- exactly
    sklearn's step-wise sum over distinct thresholds.
    """
    n = scores.shape[-2]
    work = torch.float64 if scores.dtype == torch.float64 or n >= 1 << 24 else torch.float32
    cols = scores.transpose(-1, -2).to(work).contiguous()  # (L, c, N); upcast keeps every tie
    ranked, order = cols.sort(dim=-1)
    del cols
    y = targets.t().expand(ranked.shape).gather(-1, order)
    del order
    yw = y.to(work)
    before = yw.cumsum(-1)  # positives up to each sorted position (exact integers)
    n_pos = before[..., -1].clone()
    before -= yw  # positives strictly before each sorted position
    del yw
    # first position of each row's tie group: the running maximum of the positions where the
    # sorted value changes (one linear pass; NaN != NaN, but a NaN column is NaN anyway)
    new = torch.ones(ranked.shape, dtype=torch.bool, device=ranked.device)
    torch.ne(ranked[..., 1:], ranked[..., :-1], out=new[..., 1:])
    pos = torch.arange(n, device=ranked.device).expand(ranked.shape)
    start = torch.where(new, pos, 0).cummax(-1).values
    del new
    admitted = (n - start).to(work)
    tp_at = n_pos.unsqueeze(-1) - before.gather(-1, start)
    del before, start
    total = torch.where(y, tp_at / admitted, 0).sum(-1)
    ap = torch.where(n_pos > 0, total / n_pos.clamp_min(1), torch.zeros_like(total))
    # ascending sort puts NaN last: a column with a NaN score has no defined ranking
    return torch.where(ranked[..., -1].isnan(), torch.full_like(ap, math.nan), ap)


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
