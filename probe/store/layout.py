"""The feature store's format: one Zarr v3 group per dataset x backbone (docs/protocol.md "The
feature store"); its constants, the provenance helpers, and opening a group of this
schema (read by :mod:`probe.store.reading`, written by :mod:`probe.store.writing`,
:mod:`probe.store.draws` adds draws).

Layout (rows are the pool -- the official train split -- first, then the test phase)::

    features        (N, D) float16 | float32, chunks (block_rows, D), uncompressed, NaN where
                    never written
    features_flip   (N, D) the same for horizontally flipped images (optional)
    labels          (N, C) uint8 full ground truth
    observed/<seed> (N, C) int8 single positives, drawn per phase (probe.store.protocol)
    split           (N,)   int8 0=train 1=val 2=test (train/val: split_pool over the pool rows)
    image_ids       (N,)   strings
    blocks_done     (n_blocks,) bool, one chunk per block
    attrs           schema_version, dataset, class_names, n_pool, n_test, n_unlabeled,
                    block_rows, observed_seeds, provenance, complete (set last, by finalize)

Crash safety: a block is marked in ``blocks_done`` only after its data is written (each file
atomically), ``complete`` only by :meth:`StoreWriter.finalize` once every block is marked: a
killed writer leaves a store :func:`resume_store` continues and :func:`open_store` refuses.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from probe.store.errors import StoreError, StoreNotFoundError
from probe.store.protocol import budget_positive

SCHEMA_VERSION: int = 1
SPLIT_CODES: dict[str, int] = {"train": 0, "val": 1, "test": 2}
DTYPES: tuple[str, ...] = ("float16", "float32")
# provenance fields that must agree before an interrupted store may be resumed
RESUME_KEYS: tuple[str, ...] = ("backbone", "weights", "weights_sha256", "transform", "dtype",
                                "source_sha256")
REQUIRED_PROVENANCE: tuple[str, ...] = ("backbone", "weights", "transform")
_VERSIONED_PACKAGES: tuple[str, ...] = ("torch", "torchvision", "numpy", "zarr")
#: the arrays every store holds (a store missing one is refused on open)
STORE_ARRAYS: tuple[str, ...] = ("features", "labels", "split", "image_ids", "blocks_done")
#: the attributes every finished store carries (checked by :func:`open_store_group`)
STORE_ATTRS: tuple[str, ...] = (
    "dataset", "class_names", "n_pool", "n_test", "n_unlabeled", "feature_dim", "has_flip",
    "dtype", "block_rows", "observed_seeds", "provenance",
)  # fmt: skip


def file_sha256(path: str | Path, *, progress: bool = False, chunk_bytes: int = 8 << 20) -> str:
    """Hex sha256 of a file (weights, imported source files) for the provenance record; a
    byte counter on stderr with ``progress`` (for files over 256 MiB; probe.progress)."""
    from probe.progress import Progress

    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as fh, Progress(
        size, f"sha256 {path.name}", "B", enabled=progress and size >= 256 << 20
    ) as bar:
        while chunk := fh.read(chunk_bytes):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def check_json(value: Any, what: str, error: type[StoreError] = StoreError) -> Any:
    """``value`` when JSON can hold it (an attribute of the store), else ``error`` naming
    ``what``."""
    try:
        json.dumps(value)
    except TypeError as err:
        raise error(f"{what} must be JSON-serialisable: {err}") from None
    return value


def utc_now() -> str:
    """The current UTC time as an ISO 8601 string to the second (provenance time stamps)."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def package_versions() -> dict[str, str]:
    """Installed versions, read from package metadata (no heavy imports such as torch)."""
    out = dict.fromkeys(_VERSIONED_PACKAGES, "not installed")
    for name in _VERSIONED_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


def is_store_dir(path: str | Path) -> bool:
    """Whether ``path`` is a Zarr directory (finished or not) -- i.e. something to resume or
    to replace with ``overwrite``, never a user's other directory."""
    path = Path(path)
    return path.is_dir() and (path / "zarr.json").is_file()


def open_store_group(path: str | Path, mode: str) -> tuple[Path, zarr.Group]:
    """Open ``path`` as a store group of this schema in ``mode``, refusing a missing, foreign,
    unfinished or other-version store; returns the path and the group."""
    path = Path(path)
    if not path.exists():
        raise StoreNotFoundError(f"feature store {path} does not exist")
    if not is_store_dir(path):
        raise StoreError(f"{path} is not a Zarr feature store (no zarr.json in it)")
    try:
        group = zarr.open_group(path, mode=mode)
    except Exception as err:  # zarr raises several types for unreadable metadata
        raise StoreError(f"cannot open {path} as a Zarr v3 group: {err}") from None
    version = group.attrs.get("schema_version")
    if version is None:
        raise StoreError(
            f"{path} is not a finished spml-probe store (no schema_version attribute): its "
            "creation was interrupted or it was written by another tool; re-create it with "
            "--overwrite"
        )
    if version != SCHEMA_VERSION:
        raise StoreError(
            f"{path} has store schema version {version}; this spml-probe reads version "
            f"{SCHEMA_VERSION}. Re-create the store with this version (featurize or import with "
            "--overwrite) or use the spml-probe version that wrote it"
        )
    missing = [a for a in STORE_ATTRS if a not in group.attrs]
    if missing:
        raise StoreError(f"{path} lacks store attributes {missing}; re-create it with --overwrite")
    return path, group


def phase_observed(labels_pool: np.ndarray, labels_test: np.ndarray, seed: int,
                   budget: dict | None = None) -> np.ndarray:
    """``observed/<seed>``: single positives drawn per phase, each phase re-seeded; with a
    label ``budget`` (``{"k", "fraction"}``), ``k`` positives on a ``fraction`` of the images
    (:func:`probe.store.protocol.budget_positive`, the same walk)."""
    budget = budget or PROTOCOL_BUDGET  # k = 1 on every image: single_positive's walk
    return np.concatenate([budget_positive(y, seed, k=int(budget["k"]),
                                           fraction=float(budget["fraction"]))
                           for y in (labels_pool, labels_test)])


PROTOCOL_BUDGET: dict = {"k": 1, "fraction": 1.0}  # one positive per image, every image


def is_protocol_budget(budget: dict) -> bool:
    """Whether a label ``budget`` is the protocol's (one positive per image, every image)."""
    return int(budget["k"]) == 1 and float(budget["fraction"]) == 1.0


#: every chunk of a small array gets a file, even an all-zero one: a missing file is then damage
EVERY_CHUNK: dict = {"write_empty_chunks": True}
# the arrays that follow from the DatasetIndex alone (rewritten when found damaged)
ROW_ARRAYS: tuple[str, ...] = ("labels", "split", "image_ids")
