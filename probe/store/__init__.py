"""The feature store and the SPML data protocol: the bottom layer every other part reads.

Needs only numpy and zarr (no torch, no torchvision): a user who imports features and trains
heads never loads the backbone code. ``docs/protocol.md`` describes the protocol and the store
format.

* :mod:`probe.store.protocol` -- Cole et al.'s single-positive draw and train/val split, and the
  protocol's constants (:data:`PROTOCOL_SEED`, :data:`VAL_FRACTION`);
* :mod:`probe.store.index` -- :class:`DatasetIndex`, what a dataset adapter hands to the store;
* :mod:`probe.store.layout` -- the Zarr v3 store's format: its constants and arrays, opening a
  group of this schema;
* :mod:`probe.store.writing` -- create a store and write it in resumable blocks, resume or
  join one, or write in-memory features at once;
* :mod:`probe.store.reading` -- open a finished store, read it, verify every chunk;
* :mod:`probe.store.draws` -- add another draw of observed labels (protocol, label budget or
  label bias) to a finished store;
* :mod:`probe.store.records` -- what each draw is, and the root attributes changed under a lock;
* :mod:`probe.store.chunks` -- per-chunk checksums, the fast feature read path, damage reports.
"""

from __future__ import annotations

from probe.lazy import lazy_exports

# names load on first use: importing the protocol alone does not load zarr
_EXPORTS = {
    **dict.fromkeys(("DatasetIndex", "Phase"), "probe.store.index"),
    **dict.fromkeys(("PROTOCOL_SEED", "VAL_FRACTION", "DATASET_CLASSES", "single_positive",
                     "split_indices", "split_pool"), "probe.store.protocol"),
    **dict.fromkeys(("DTYPES", "SCHEMA_VERSION", "SPLIT_CODES", "file_sha256", "is_store_dir"),
                    "probe.store.layout"),
    **dict.fromkeys(("BadFeatureRow", "StoreWriter", "create_store", "join_store", "resume_store",
                     "write_feature_store"), "probe.store.writing"),
    **dict.fromkeys(("Store", "identity_fingerprint", "open_store", "verify_store"),
                    "probe.store.reading"),
    **dict.fromkeys(("add_biased_draw", "add_draws", "add_observed_seed"), "probe.store.draws"),
    **dict.fromkeys(("StoreDamaged", "StoreError", "StoreNotFoundError"), "probe.store.errors"),
    "VerifyReport": "probe.store.chunks",
    **dict.fromkeys(("Prior", "PriorError"), "probe.store.priors"),
    "write_prior": "probe.store.prior_writer",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
