"""Adding a label-bias draw to a complete store (:func:`add_biased_draw`; the draw itself:
:mod:`probe.store.bias`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from probe.store.bias import BIASES, GROUP, biased_positive, class_weights
from probe.store.errors import StoreError
from probe.store.reading import open_store
from probe.store.records import check_draw, write_draw

__all__ = ["add_biased_draw", "bias_draw_weights"]


def bias_draw_weights(store: Any, bias: str, weights_by_class: Sequence[float] | None = None
                      ) -> tuple[dict[str, Any], np.ndarray]:
    """The record of a ``bias`` draw on an open ``store`` and its (N, C) weights, every input
    checked (nothing is written): ``semantic`` needs ``weights_by_class``, ``size`` and
    ``location`` the store's boxes."""
    if bias not in BIASES:
        raise StoreError(f"--bias must be one of {', '.join(BIASES)}; got {bias!r}")
    if bias == "semantic":
        if weights_by_class is None:
            raise StoreError("--bias semantic needs --class-weights FILE (one weight per class)")
        w = class_weights(weights_by_class, store.n_classes)
        weights = np.broadcast_to(w, (store.n_rows, store.n_classes))
        return {"bias": bias, "class_weights": w.tolist()}, weights
    if weights_by_class is not None:
        raise StoreError(f"--class-weights is for --bias semantic, not {bias}")
    name = f"{GROUP}/{bias}"
    if name not in store._group:
        raise StoreError(
            f"--bias {bias} needs the dataset's object boxes, and {store.path} (dataset "
            f"{store.dataset!r}) holds none: only stores featurized from COCO's instance "
            "annotations have them (spml featurize coco); --bias semantic works on any store"
        )
    return {"bias": bias}, store._read(name, None)


def add_biased_draw(path: str | Path, seed: int, bias: str,
                    weights_by_class: Sequence[float] | None = None) -> dict[str, Any]:
    """Add ``observed/<seed>``: single positives drawn with ``bias`` (module docstring), each
    phase re-seeded. ``weights_by_class``: the ``semantic`` bias's C weights. A seed already
    holding the same draw is left alone; a draw of another kind under that seed is refused by
    name (:func:`probe.store.records.check_draw`); written and registered by
    :func:`probe.store.records.write_draw`. Returns the draw's record."""
    store = open_store(path)
    seed = int(seed)
    record, weights = bias_draw_weights(store, bias, weights_by_class)
    if check_draw(store.attrs, seed, {"kind": "bias", **record}, store.path):
        return record
    labels = store.labels()
    n_pool = int(store.attrs["n_pool"])
    observed = np.concatenate([biased_positive(labels[:n_pool], weights[:n_pool], seed),
                               biased_positive(labels[n_pool:], weights[n_pool:], seed)])
    write_draw(store, seed, {"kind": "bias", **record}, observed, "observed_bias", record)
    return record
