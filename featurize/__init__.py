"""featurize: dataset adapters, the SPML protocol (Cole et al. 2021), imports of precomputed
features, the backbone runner and the Zarr feature store (docs/design.md "The flow").

The most used names are importable from here; they load on first use, so ``import featurize``
stays cheap (zarr is only imported with the store)::

    from featurize import open_store
    store = open_store("stores/voc.zarr")
    x, y = store.features(store.split("train")), store.observed(rows=store.split("train"))
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SCHEMA_VERSION": "probe.store",
    "Store": "probe.store",
    "StoreError": "probe.store",
    "StoreWriter": "probe.store",
    "add_observed_seed": "probe.store",
    "create_store": "probe.store",
    "open_store": "probe.store",
    "resume_store": "probe.store",
    "write_feature_store": "probe.store",
    "single_positive": "probe.store.protocol",
    "split_pool": "probe.store.protocol",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'featurize' has no attribute {name!r}")
