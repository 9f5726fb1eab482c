"""The SPML benchmark protocol of Cole et al. (2021), "Multi-Label Learning from Single Positive
Labels" (CVPR), as followed by GR Loss, EM/APL and Large-Loss: docs/protocol.md steps 2 and 3.

Both generators reproduce the reference code (``generate_observed_labels.py`` and
``datasets.generate_split`` of Cole et al.) draw for draw: results are only comparable with the
literature if the same rows and the same single positives are used.
"""

from __future__ import annotations

import numpy as np

from probe.errors import SpmlError

PROTOCOL_SEED: int = 1200  # the seed every SPML paper uses for both the draws and the split
VAL_FRACTION: float = 0.2  # docs/protocol.md step 3: 20% of the official train split is val
#: class counts of the benchmark datasets (docs/protocol.md "Official dataset layouts"); the
#: losses' paper presets for a dataset assume its class count
DATASET_CLASSES: dict[str, int] = {"voc": 20, "coco": 80, "nus": 81, "cub": 312}


def single_positive(labels: np.ndarray, seed: int = PROTOCOL_SEED) -> np.ndarray:
    """Observed single-positive labels for one phase (docs/protocol.md step 2).

    Re-seeds ``np.random.RandomState(seed)`` and walks the rows in order: the positives of row
    ``i`` are shuffled and the first is kept as ``1``; then the negatives are shuffled and none
    is kept (Cole et al.'s ``num_neg=0``; the shuffle still consumes the RNG, so it is done).
    Everything else is ``0`` (unknown). Rows without a positive stay all ``0``.

    Call it once per phase (pool, test): each call is re-seeded, as in the reference.
    ``labels``: ``(N, C)`` full ground truth in {0, 1}; ``seed``: 1200 is the literature's
    draw. Returns an ``(N, C)`` int8 matrix with one ``1`` per row that has a positive.
    """
    return _walk(labels, seed, 1, "single_positive")


def _walk(labels: np.ndarray, seed: int, k: int, what: str) -> np.ndarray:
    """The reference's walk over the rows: keep ``k`` of the shuffled positives of each row."""
    y = np.asarray(labels)
    if y.ndim != 2:
        raise SpmlError(f"{what}: labels must be a 2-D (N, C) matrix, got shape {y.shape}")
    rng = np.random.RandomState(seed)
    observed = np.zeros(y.shape, dtype=np.int8)
    for i in range(y.shape[0]):
        pos = np.nonzero(y[i] == 1)[0]
        rng.shuffle(pos)
        observed[i, pos[:k]] = 1
        neg = np.nonzero(y[i] == 0)[0]
        rng.shuffle(neg)  # keeps neg[:0]: nothing, but the draw must be consumed
    return observed


def split_indices(
    n: int, fraction: float, seed: int = PROTOCOL_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """Cole et al.'s ``generate_split``: sorted ``(first, second)`` int64 row indices.

    ``n_2 = int(round(fraction * n))``, ``perm = RandomState(seed).permutation(n)``,
    ``first = sort(perm[:n - n_2])``, ``second = sort(perm[-n_2:])``.
    (With ``n_2 == 0`` the reference's ``perm[-0:]`` would take every row; here the second part
    is then empty, which is what a zero fraction means.)
    """
    if n < 0:
        raise SpmlError(f"split_indices: n must be >= 0, got {n}")
    if not 0.0 <= fraction < 1.0:
        raise SpmlError(f"split_indices: fraction must be in [0, 1), got {fraction}")
    n_second = round(fraction * n)
    perm = np.random.RandomState(seed).permutation(n)
    first = np.sort(perm[: n - n_second]).astype(np.int64)
    second = np.sort(perm[n - n_second :]).astype(np.int64)
    return first, second


def split_pool(n: int, seed: int = PROTOCOL_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Train/val split of the pool (docs/protocol.md step 3): ``(train, val)`` sorted int64
    indices, 20% of the rows validation (COCO's 82,081 pool rows give 65,665 / 16,416)."""
    return split_indices(n, VAL_FRACTION, seed)


def budget_positive(labels: np.ndarray, seed: int = PROTOCOL_SEED, *, k: int = 1,
                    fraction: float = 1.0) -> np.ndarray:
    """Observed labels for one phase under a label budget: ``k`` positives per image, on a
    ``fraction`` of the images (label-budget ablations, beyond the papers).

    The same walk as :func:`single_positive` (re-seeded ``RandomState(seed)``, per row: shuffle
    the positives and keep the first ``k``, shuffle the negatives and keep none), so ``k=1,
    fraction=1`` *is* the protocol's draw and the budgets are nested: the ``k`` positives kept
    include those of every smaller ``k``. The labelled images are the first
    ``round(fraction * N)`` of ``RandomState(seed).permutation(N)`` (drawn after the walk from a
    fresh generator), nested in the same way; an unlabelled image is all ``0`` (unknown).
    """
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise SpmlError(f"budget_positive: k (positives kept per image) must be an int >= 1; "
                         f"got {k!r}")
    if not 0.0 < float(fraction) <= 1.0:
        raise SpmlError(f"budget_positive: fraction (of images labelled) must lie in (0, 1]; "
                         f"got {fraction!r}")
    observed = _walk(labels, seed, k, "budget_positive")
    if fraction < 1.0:
        n = len(observed)
        keep = np.random.RandomState(seed).permutation(n)[: round(fraction * n)]
        observed[np.setdiff1d(np.arange(n), keep)] = 0
    return observed
