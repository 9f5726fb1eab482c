"""Label-bias draws (Cole et al.'s ``spml-bias`` branch; docs/priors.md "Label-bias draws"):
the single observed positive drawn with probability by the class's object ``size`` or box
``location`` (from the dataset's boxes, stored at featurize time as ``bias/<kind>`` (N, C)
float32) or fixed ``semantic`` class weights. This module holds the draw and the weights (read
by the store's writer); :func:`probe.store.draws.add_biased_draw` adds a draw.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr

from probe.store.chunks import small_array
from probe.store.errors import StoreError

__all__ = ["BIASES", "BOX_BIASES", "biased_positive", "class_weights", "write_bias_weights"]

BIASES: tuple[str, ...] = ("size", "location", "semantic")
BOX_BIASES: tuple[str, ...] = ("size", "location")
GROUP = "bias"  # the store group of the box weights


def biased_positive(labels: np.ndarray, weights: np.ndarray, seed: int) -> np.ndarray:
    """One observed positive per row with a positive, drawn among the row's positives with
    probability proportional to ``weights`` there (uniformly where they are all 0).

    Re-seeds ``np.random.RandomState(seed)`` and walks the rows in order, one uniform number
    per row with a positive (the inverse of the weights' cumulative sum): call it once per phase.
    Returns an ``(N, C)`` int8 matrix."""
    y = np.asarray(labels)
    w = np.asarray(weights, dtype=np.float64)
    if y.ndim != 2 or w.shape != y.shape:
        raise StoreError(f"biased_positive: labels {y.shape} and weights {w.shape} must be the "
                         "same (N, C) shape")
    if not np.isfinite(w).all() or (w < 0).any():
        raise StoreError("biased_positive: weights must be finite and non-negative")
    rng = np.random.RandomState(seed)
    observed = np.zeros(y.shape, dtype=np.int8)
    for i in range(y.shape[0]):
        pos = np.nonzero(y[i] == 1)[0]
        if pos.size == 0:
            continue
        p = w[i, pos]
        p = np.ones(pos.size) if p.sum() <= 0 else p
        cum = np.cumsum(p)
        j = int(np.searchsorted(cum, rng.random_sample() * cum[-1], side="right"))
        observed[i, pos[min(j, pos.size - 1)]] = 1
    return observed


def write_bias_weights(group: zarr.Group, pool: Any, test: Any) -> None:
    """``bias/<kind>`` (pool rows, then test rows) where both phases carry the weights (a
    dataset with boxes; ``Phase.bias_weights``). Called when a store is created."""
    kinds = [k for k in BOX_BIASES if k in pool.bias_weights and k in test.bias_weights]
    if not kinds:
        return
    parent = group.require_group(GROUP)
    for kind in kinds:
        small_array(parent, kind, np.concatenate([pool.bias_weights[kind],
                                                  test.bias_weights[kind]]).astype(np.float32))


def class_weights(values: Any, n_classes: int) -> np.ndarray:
    try:
        w = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise StoreError(f"--class-weights must be {n_classes} numbers (one per class, in the "
                         f"store's order); got {values!r}") from None
    if w.shape != (n_classes,) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise StoreError(
            f"--class-weights must be {n_classes} finite non-negative numbers, not all 0 (one per "
            f"class, in the store's order: 'spml info'); got {w.size} values"
        )
    return w
