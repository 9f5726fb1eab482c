"""A synthetic prior for ``spml bench probe --loss NAME`` with a loss that reads one (VLPL,
GPR): written once into the bench store, like the store itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["synthetic_prior"]


def synthetic_prior(path: str | Path, extras: tuple[str, ...], *, seed: int = 0) -> str:
    """The name of a synthetic prior in the bench store ``path`` (written on first use), for
    ``spml bench probe --loss NAME`` with a loss that reads a prior: per row, the softmax at
    temperature 0.01 of CLIP-like similarities (0.25 + 0.05 on the row's positives, plus
    noise 0.02), and each extra in ``extras`` -- DAMP's tile_max / tile_min / tile_mean as the
    max / min / mean over four noisy tiles, any other name one more noisy score."""
    from probe.store import open_store, write_prior

    name = "bench" + "".join(f"-{e}" for e in sorted(extras))
    store = open_store(path)
    if name in store.prior_names():
        return name
    rng = np.random.default_rng(seed + 1)
    labels = store.labels().astype(np.float32)

    def softmax(sim: np.ndarray) -> np.ndarray:
        e = np.exp((sim - sim.max(1, keepdims=True)) / 0.01)
        return (e / e.sum(1, keepdims=True)).astype(np.float32)

    def noisy() -> np.ndarray:
        return 0.25 + 0.05 * labels + 0.02 * rng.standard_normal(labels.shape, dtype=np.float32)

    tiles = np.stack([softmax(noisy()) for _ in range(4)])
    reductions = {"tile_max": tiles.max(0), "tile_min": tiles.min(0), "tile_mean": tiles.mean(0)}
    arrays = {e: reductions[e] if e in reductions else softmax(noisy()) for e in extras}
    write_prior(path, name, softmax(noisy()), {"source": "probe.bench.store.synthetic_prior "
                                                         f"seed {seed}"}, extras=arrays)
    return name
