"""Adding a label-bias draw to a complete store (:func:`add_biased_draw`; the draw itself:
:mod:`probe.store.bias`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from probe.store.bias import BIASES, GROUP, biased_positive, class_weights
from probe.store.chunks import checksum_codecs
from probe.store.errors import StoreError
from probe.store.reading import open_store

__all__ = ["add_biased_draw"]


def add_biased_draw(path: str | Path, seed: int, bias: str,
                    weights_by_class: Sequence[float] | None = None) -> dict[str, Any]:
    """Add ``observed/<seed>``: single positives drawn with ``bias`` (module docstring), each
    phase re-seeded. ``weights_by_class``: the ``semantic`` bias's C weights. A seed already
    holding the same draw is left alone; another draw under that seed is an error. The array
    is written first and registered in ``observed_seeds`` last. Returns the draw's record."""
    if bias not in BIASES:
        raise StoreError(f"--bias must be one of {', '.join(BIASES)}; got {bias!r}")
    store = open_store(path)
    seed = int(seed)
    if bias == "semantic":
        if weights_by_class is None:
            raise StoreError("--bias semantic needs --class-weights FILE (one weight per class)")
        w = class_weights(weights_by_class, store.n_classes)
        weights = np.broadcast_to(w, (store.n_rows, store.n_classes))
        record: dict[str, Any] = {"bias": bias, "class_weights": w.tolist()}
    else:
        if weights_by_class is not None:
            raise StoreError(f"--class-weights is for --bias semantic, not {bias}")
        name = f"{GROUP}/{bias}"
        if name not in store._group:
            raise StoreError(
                f"--bias {bias} needs the dataset's object boxes, and {store.path} (dataset "
                f"{store.dataset!r}) holds none: only stores featurized from COCO's instance "
                "annotations have them (spml featurize coco); --bias semantic works on any store"
            )
        weights = store._read(name, None)
        record = {"bias": bias}
    if seed in store.observed_seeds():
        have = store.attrs.get("observed_bias", {}).get(str(seed))
        if have == record:
            return record
        raise StoreError(
            f"{store.path} already holds draw {seed} ({have or 'unbiased'}); a seed names one "
            f"draw, so --bias {bias} needs another seed (e.g. --seeds "
            f"{max(store.observed_seeds()) + 1})"
        )
    labels = store.labels()
    n_pool = int(store.attrs["n_pool"])
    observed = np.concatenate([biased_positive(labels[:n_pool], weights[:n_pool], seed),
                               biased_positive(labels[n_pool:], weights[n_pool:], seed)])
    group = zarr.open_group(store.path, mode="r+")
    group["observed"].create_array(str(seed), data=observed, overwrite=True,
                                   compressors=checksum_codecs(compress=True),
                                   config={"write_empty_chunks": True})
    group.attrs["observed_bias"] = {**group.attrs.get("observed_bias", {}), str(seed): record}
    group.attrs["observed_seeds"] = sorted([*group.attrs["observed_seeds"], seed])
    return record
