"""The feature store and the SPML data protocol: the bottom layer every other part reads.

Needs only numpy and zarr (no torch, no torchvision): a user who imports features and trains
heads never loads the backbone code. ``docs/protocol.md`` describes the protocol and the store
format.

* :mod:`probe.store.protocol` -- Cole et al.'s single-positive draw and train/val split, and the
  protocol's constants (:data:`PROTOCOL_SEED`, :data:`VAL_FRACTION`);
* :mod:`probe.store.index` -- :class:`DatasetIndex`, what a dataset adapter hands to the store;
* :mod:`probe.store.store` -- the Zarr v3 store: create, write in resumable blocks, open and read.
"""

from __future__ import annotations

from .index import DatasetIndex, Phase
from .protocol import PROTOCOL_SEED, VAL_FRACTION, single_positive, split_indices, split_pool
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

__all__ = [
    "DTYPES",
    "PROTOCOL_SEED",
    "SCHEMA_VERSION",
    "SPLIT_CODES",
    "VAL_FRACTION",
    "BadFeatureRow",
    "DatasetIndex",
    "Phase",
    "Store",
    "StoreError",
    "StoreNotFoundError",
    "StoreWriter",
    "add_observed_seed",
    "create_store",
    "file_sha256",
    "is_store_dir",
    "open_store",
    "resume_store",
    "single_positive",
    "split_indices",
    "split_pool",
    "write_feature_store",
]
