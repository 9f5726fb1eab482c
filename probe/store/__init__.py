"""The feature store and the SPML data protocol: the bottom layer every other part reads.

Needs only numpy and zarr (no torch, no torchvision): a user who imports features and trains
heads never loads the backbone code. ``docs/protocol.md`` describes the protocol and the store
format.

* :mod:`probe.store.protocol` -- Cole et al.'s single-positive draw and train/val split, and the
  protocol's constants (:data:`PROTOCOL_SEED`, :data:`VAL_FRACTION`);
* :mod:`probe.store.index` -- :class:`DatasetIndex`, what a dataset adapter hands to the store;
* :mod:`probe.store.store` -- the Zarr v3 store: create, write in resumable blocks, open and read;
* :mod:`probe.store.chunks` -- per-chunk checksums, the fast feature read path, damage reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from probe._lazy import lazy_exports

# names load on first use: importing the protocol alone does not load zarr
_EXPORTS = {
    **dict.fromkeys(("DatasetIndex", "Phase"), "probe.store.index"),
    **dict.fromkeys(("PROTOCOL_SEED", "VAL_FRACTION", "DATASET_CLASSES", "single_positive",
                     "split_indices", "split_pool"), "probe.store.protocol"),
    **dict.fromkeys(("DTYPES", "SCHEMA_VERSION", "SPLIT_CODES", "BadFeatureRow", "Store",
                     "StoreError", "StoreNotFoundError", "StoreWriter", "add_observed_seed",
                     "create_store", "file_sha256", "is_store_dir", "join_store", "open_store",
                     "resume_store",
                     "write_feature_store"), "probe.store.store"),
    **dict.fromkeys(("StoreDamaged",), "probe.store.errors"),
    "VerifyReport": "probe.store.chunks",
    **dict.fromkeys(("Prior", "PriorError"), "probe.store.priors"),
    "write_prior": "probe.store.prior_writer",
    "add_biased_draw": "probe.store.biased_draws",
    "verify_store": "probe.store.store",
}

__all__ = [
    "DATASET_CLASSES",
    "DTYPES",
    "PROTOCOL_SEED",
    "SCHEMA_VERSION",
    "SPLIT_CODES",
    "VAL_FRACTION",
    "BadFeatureRow",
    "DatasetIndex",
    "Phase",
    "Prior",
    "PriorError",
    "Store",
    "StoreDamaged",
    "StoreError",
    "StoreNotFoundError",
    "StoreWriter",
    "VerifyReport",
    "add_biased_draw",
    "add_observed_seed",
    "create_store",
    "file_sha256",
    "is_store_dir",
    "join_store",
    "open_store",
    "resume_store",
    "single_positive",
    "split_indices",
    "split_pool",
    "verify_store",
    "write_feature_store",
    "write_prior",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


if TYPE_CHECKING:
    from .biased_draws import add_biased_draw
    from .chunks import VerifyReport
    from .errors import StoreDamaged
    from .index import DatasetIndex, Phase
    from .prior_writer import write_prior
    from .priors import Prior, PriorError
    from .protocol import (
        DATASET_CLASSES,
        PROTOCOL_SEED,
        VAL_FRACTION,
        single_positive,
        split_indices,
        split_pool,
    )
    from .store import (
        DTYPES,
        SCHEMA_VERSION,
        SPLIT_CODES,
        BadFeatureRow,
        Store,
        StoreError,
        StoreNotFoundError,
        StoreWriter,
        add_observed_seed,
        create_store,
        file_sha256,
        is_store_dir,
        open_store,
        resume_store,
        write_feature_store,
    )
