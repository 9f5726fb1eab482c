"""More draws of observed labels for a complete store: :func:`add_observed_seed` (the
protocol's single positives, or a label budget), docs/protocol.md step 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

from probe.store.chunks import checksum_codecs
from probe.store.errors import StoreError
from probe.store.layout import _EVERY_CHUNK, _is_protocol, _phase_observed
from probe.store.reading import open_store


def add_observed_seed(path: str | Path, seed: int, *, k: int = 1, fraction: float = 1.0) -> None:
    """Add another draw of observed labels ``observed/<seed>`` to a complete store.

    Each phase is re-seeded with ``seed`` (docs/protocol.md step 2). ``k`` / ``fraction``: a
    label budget (``k`` positives per image on a ``fraction`` of the images,
    :func:`probe.store.protocol.budget_positive`; k = 1 on every image is the protocol's
    single-positive draw), recorded in the ``observed_budgets`` attribute. Every command that
    takes ``--observed-seed`` then trains on it. A seed already present with the same budget is
    left alone; with another budget it is an error (a seed names one draw).

    The array is written first and registered in ``observed_seeds`` last, so an interrupted
    call leaves the store as it was. Not safe against another concurrent
    ``add_observed_seed`` on the same store (readers are fine).
    """
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise StoreError(f"k (observed positives per image, --k) must be an integer >= 1; "
                         f"got {k!r}")
    if not isinstance(fraction, int | float) or not 0.0 < float(fraction) <= 1.0:
        raise StoreError(f"fraction (of images labelled, --fraction) must lie in (0, 1]; got "
                         f"{fraction!r}")
    budget = {"k": int(k), "fraction": float(fraction)}
    store = open_store(path)
    seed = int(seed)
    if seed in store.observed_seeds():
        have = store.observed_budget(seed)
        if have == budget:
            return
        raise StoreError(
            f"{store.path} already holds draw {seed} with {_budget_text(have)}; a seed names one "
            f"draw, so {_budget_text(budget)} needs another seed (e.g. --seeds "
            f"{max(store.observed_seeds()) + 1})"
        )
    group = zarr.open_group(store.path, mode="r+")
    labels = group["labels"][:]
    n_pool = int(group.attrs["n_pool"])
    group["observed"].create_array(
        str(seed), data=_phase_observed(labels[:n_pool], labels[n_pool:], seed, budget),
        overwrite=True, compressors=checksum_codecs(compress=True), config=_EVERY_CHUNK,
    )
    if not _is_protocol(budget):
        group.attrs["observed_budgets"] = {**group.attrs.get("observed_budgets", {}),
                                           str(seed): budget}
    group.attrs["observed_seeds"] = sorted([*group.attrs["observed_seeds"], seed])


def _budget_text(budget: dict) -> str:
    if _is_protocol(budget):
        return "one positive per image (the protocol's draw)"
    return (f"k={budget['k']} positives per image on {100 * float(budget['fraction']):g}% of "
            "the images")

