"""The logits of stacked heads on a split's features, in bounded memory: the one product the
trainer's epoch pass (:mod:`probe.engine.loop`), the evaluation (:mod:`probe.evaluation.heads`) and
the test intervals (:mod:`probe.evaluation.intervals`) share."""

from __future__ import annotations

import torch
from torch import Tensor

from probe.engine.threads import step_threads

__all__ = ["EVAL_BLOCK", "stacked_logits"]

EVAL_BLOCK = 1 << 25  # logits elements (T·N·C) evaluated at once, bounds eval memory


def stacked_logits(x: Tensor, w: Tensor) -> Tensor:
    """(T, N, C) float32 logits of features ``x`` (N, D+1) under heads ``w`` (T, D+1, C)."""
    t, _, c = w.shape
    n = x.shape[0]
    out = torch.empty(t, n, c, dtype=torch.float32, device=w.device)
    step = max(1, min(8192, EVAL_BLOCK // max(1, t * c)))  # rows per product
    # a batched product rounds each head alike on any thread count, a one-head product does
    # so only on one thread: a head's logits (hence its reported figures) never depend on
    # how many heads were evaluated with it; the conversion to float32 is exact on any count
    # and keeps torch's threads
    for r0 in range(0, n, step):
        rows = x[r0 : r0 + step].float()
        with step_threads(w.device, 1 if t == 1 else None):
            torch.matmul(rows, w, out=out[:, r0 : r0 + step])
    return out
