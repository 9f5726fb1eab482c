"""Reading a finished feature store: :func:`open_store` validates it and returns the
read-only :class:`Store`; :func:`verify_store` reads every chunk back (the format:
:mod:`probe.store.layout`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from probe.store.chunks import (
    FEATURE_ARRAYS,
    RowChunks,
    VerifyReport,
    chunk_label,
    damage_message,
    damaged_chunks,
    group_damage,
    repair_hint,
)
from probe.store.errors import StoreDamaged, StoreError
from probe.store.layout import (
    PROTOCOL_BUDGET,
    SPLIT_CODES,
    STORE_ARRAYS,
    STORE_ATTRS,
    is_protocol_budget,
    open_store_group,
)
from probe.store.protocol import PROTOCOL_SEED
from probe.store.records import draw_record


def _row_indices(rows: Any, n_rows: int, what: str) -> np.ndarray | None:
    """``rows`` (None: all, a slice, a boolean mask of length N, or integer indices in any
    order, repeats allowed) as int64 indices, or None for all rows."""
    if rows is None:
        return None
    if isinstance(rows, slice):
        return np.arange(n_rows, dtype=np.int64)[rows]
    idx = np.asarray(rows)
    if idx.dtype == bool:
        if idx.shape != (n_rows,):
            raise StoreError(
                f"{what}: a boolean row mask must have shape ({n_rows},), got {idx.shape}"
            )
        idx = np.nonzero(idx)[0]
    if idx.ndim != 1 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
        raise StoreError(
            f"{what}: rows must be None, a slice, a boolean mask or 1-D integer indices; "
            f"got an array of dtype {idx.dtype} and shape {idx.shape}"
        )
    idx = idx.astype(np.int64)
    if idx.size:
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= n_rows:
            raise StoreError(f"{what}: row index out of range [0, {n_rows}): min {lo}, max {hi}")
    return idx


def _read_rows(array: Any, rows: Any, n_rows: int, what: str) -> np.ndarray:
    """Rows of a zarr array in the order asked for (``rows`` as in :func:`_row_indices`): a
    dense index set reads its covering range at once, a sparse one the unique sorted rows."""
    if isinstance(rows, slice):
        return array[rows]
    idx = _row_indices(rows, n_rows, what)
    if idx is None:
        return array[:]
    if idx.size == 0:
        return np.empty((0, *array.shape[1:]), dtype=array.dtype)
    lo, hi = int(idx.min()), int(idx.max())
    if hi - lo + 1 <= 4 * idx.size:  # dense enough: one contiguous read, then gather in memory
        return array[lo : hi + 1][idx - lo]
    uniq = np.unique(idx)
    return array.oindex[uniq][np.searchsorted(uniq, idx)]


def _guarded(path: Path, group: zarr.Group, name: str, read: Any) -> Any:
    """``read()`` of array ``name``; a failure that is damage becomes a :class:`StoreDamaged`
    naming the store, the array and the (first) damaged chunk, and how to repair."""
    try:
        return read()
    except StoreError:
        raise
    except Exception as err:  # zarr/codec errors: checksum mismatch, truncated zstd, …
        damage = damaged_chunks(path, name, group[name])
        if damage:
            first = damage[0]
            more = f"; {len(damage) - 1} more damaged chunks" if len(damage) > 1 else ""
            raise StoreDamaged(
                damage_message(path, name, chunk_label(first.chunk), first.reason + more)
            ) from None
        raise StoreDamaged(
            f"{path}: reading array {name!r} failed ({type(err).__name__}: {err}); "
            f"{repair_hint(path)}"
        ) from None


def open_store(path: str | Path) -> Store:
    """Open a finished store read-only, after validating it.

    Checks: the path exists, the schema version is known, ``complete`` is set, every block is
    written, the arrays agree in N (and in C with ``class_names``), and the split puts the pool
    rows first. Each failure is a :class:`StoreError` saying what is wrong and what to do.
    """
    path, group = open_store_group(path, "r")
    attrs = dict(group.attrs)
    features = FEATURE_ARRAYS if attrs.get("has_flip") else FEATURE_ARRAYS[:1]
    draws = [f"observed/{s}" for s in attrs.get("observed_seeds", [])]
    missing = [a for a in (*STORE_ARRAYS, *features[1:], *draws) if a not in group]
    if missing:
        raise StoreError(f"{path} lacks arrays {missing}; re-create it with --overwrite")
    n_rows = int(attrs["n_pool"]) + int(attrs["n_test"])
    block_rows = int(attrs["block_rows"])
    n_blocks = math.ceil(n_rows / block_rows)
    done = _guarded(path, group, "blocks_done", lambda: group["blocks_done"][:])
    if not attrs.get("complete"):
        raise StoreError(
            f"{path} is incomplete ({int(done.sum())} of {len(done)} feature blocks written): "
            "the featurize/import writing it was interrupted or is still running. Re-run the "
            "same command to resume it, or pass --overwrite to start again"
        )
    n_classes = len(attrs["class_names"])
    per_row = (n_rows, int(attrs["feature_dim"]))
    shapes = {"features": per_row, "labels": (n_rows, n_classes), "split": (n_rows,),
              "image_ids": (n_rows,), "blocks_done": (n_blocks,),
              **dict.fromkeys(features[1:], per_row), **dict.fromkeys(draws, (n_rows, n_classes))}
    for name in features:
        if str(group[name].dtype) != attrs["dtype"]:
            raise StoreError(
                f"{path}: array {name!r} is {group[name].dtype} but the store says "
                f"{attrs['dtype']}; the store is corrupt -- re-create it"
            )
    for name, want in shapes.items():
        got = tuple(group[name].shape)
        if got != want:
            raise StoreError(
                f"{path}: array {name!r} has shape {got}, expected {want} (N={n_rows} rows, "
                f"C={n_classes} classes from class_names); the store is corrupt -- re-create it"
            )
    if not done.all():
        raise StoreError(
            f"{path} is marked complete but blocks {np.nonzero(~done)[0][:5].tolist()} were "
            "never written; the store is corrupt -- re-create it with --overwrite"
        )
    split = _guarded(path, group, "split", lambda: group["split"][:])
    n_pool = int(attrs["n_pool"])
    if not (np.isin(split[:n_pool], (0, 1)).all() and (split[n_pool:] == 2).all()):
        raise StoreError(f"{path}: the split array does not put the pool rows first; corrupt store")
    return Store(path, group, attrs, split)


def identity_fingerprint(identity: dict[str, Any]) -> str:
    """A short hash of a store's :meth:`Store.identity` (equal identities, equal prints)."""
    import hashlib
    import json

    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Store:
    """Read-only view of a complete feature store (open it with :func:`open_store`)."""

    def __init__(self, path: Path, group: zarr.Group, attrs: dict, split: np.ndarray) -> None:
        self.path = Path(path)
        self._group = group
        self._split = split
        self.attrs: dict = attrs
        self.provenance: dict = dict(attrs["provenance"])
        self.dataset: str = attrs["dataset"]
        self.class_names: list[str] = list(attrs["class_names"])
        self.n_rows: int = int(split.shape[0])
        self.n_classes: int = len(self.class_names)
        self.feature_dim: int = int(attrs["feature_dim"])
        self.has_flip: bool = bool(attrs["has_flip"])
        self.dtype: str = str(attrs["dtype"])
        ids = _guarded(self.path, group, "image_ids", lambda: group["image_ids"][:])
        self.image_ids: list[str] = [str(s) for s in ids]

    def __repr__(self) -> str:
        return (
            f"Store({str(self.path)!r}, dataset={self.dataset!r}, rows={self.n_rows}, "
            f"classes={self.n_classes}, dim={self.feature_dim}, flip={self.has_flip})"
        )

    def identity(self) -> dict[str, Any]:
        """What makes this store this store, wherever it is mounted or copied: its dataset,
        shape (rows, its train/val/test split, classes, feature width), when it was made, and
        the backbone and weights that made its features. The one "same store" rule: studies
        record it, and confirm, compare and the table check it (:func:`identity_fingerprint`)."""
        prov = self.provenance or {}
        created = prov.get("created") or self.attrs.get("created")
        return {"dataset": self.dataset, "rows": int(self.n_rows),
                "splits": {name: len(self.split(name)) for name in SPLIT_CODES},
                "classes": int(self.n_classes), "feature_dim": int(self.feature_dim),
                "created": created, "backbone": prov.get("backbone"),
                "weights_sha256": prov.get("weights_sha256")}

    def differs_from(self, identity: dict[str, Any]) -> list[str]:
        """The keys of a recorded :meth:`identity` that this store does not match, each as
        ``"key A (recorded) vs B (here)"`` (empty: the same store). Keys an older record lacks
        are not checked."""
        import json

        have = json.loads(json.dumps(self.identity(), default=str))
        return [f"{key} {identity[key]!r} vs {have.get(key)!r}" for key in sorted(identity)
                if identity[key] != have.get(key)]

    def labels(self, rows: Any = None) -> np.ndarray:
        """Full ground truth, uint8 ``(len(rows), C)``."""
        return self.read("labels", rows)

    def observed_seeds(self) -> list[int]:
        """Seeds of the single-positive draws this store holds."""
        return sorted(int(s) for s in self.attrs["observed_seeds"])

    def observed_budget(self, seed: int) -> dict:
        """The label budget of draw ``seed``: ``{"k": 1, "fraction": 1.0}`` for the protocol's
        single positives, else what ``add_observed_seed(…, k=, fraction=)`` stored."""
        return dict(self.attrs.get("observed_budgets", {}).get(str(int(seed)), PROTOCOL_BUDGET))

    def observed(self, seed: int = PROTOCOL_SEED, rows: Any = None) -> np.ndarray:
        """Single-positive labels of draw ``seed``, int8 ``(len(rows), C)``."""
        if int(seed) not in self.observed_seeds():
            raise StoreError(
                f"{self.path} has no single-positive draw for seed {seed}; it has seeds "
                f"{', '.join(map(str, self.observed_seeds()))} (add one with 'spml draw "
                f"{self.path} --seeds {seed}')"
            )
        return self.read(f"observed/{int(seed)}", rows)

    def prior_names(self) -> list[str]:
        """Names of the priors (per-image class scores, probe.store.priors) this store holds."""
        from probe.store.priors import prior_names
        return prior_names(self)

    def prior(self, name: str, rows: Any = None) -> Any:
        """Prior ``name`` at ``rows``: a :class:`probe.store.priors.Prior` (scores, extras)."""
        from probe.store.priors import read_prior
        return read_prior(self, name, rows)

    def shape(self, name: str) -> tuple[int, ...] | None:
        """Shape of the array at path ``name`` inside the store (None: it holds none)."""
        return tuple(self._group[name].shape) if name in self._group else None

    def read(self, name: str, rows: Any = None) -> np.ndarray:
        """Rows ``rows`` of the array at path ``name`` inside the store, its chunks checked
        against their checksums (a damaged one is named)."""
        array = self._group[name]
        return _guarded(self.path, self._group, name,
                        lambda: _read_rows(array, rows, self.n_rows, name))

    def split(self, name: str) -> np.ndarray:
        """Sorted int64 row indices of ``"train"``, ``"val"`` or ``"test"``."""
        if name not in SPLIT_CODES:
            raise StoreError(f"unknown split {name!r}; expected one of {list(SPLIT_CODES)}")
        return np.nonzero(self._split == SPLIT_CODES[name])[0].astype(np.int64)

    def features(
        self, rows: Any = None, flip: bool = False, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Features (store dtype) ``(len(rows), D)``; ``flip`` reads the flipped-image ones.

        Chunks are read in parallel straight into the result (or into ``out``, e.g. the
        ``[:, :D]`` view of a wider tensor's numpy array), each checked against its checksum;
        a damaged chunk raises :class:`StoreDamaged` naming it (probe.store.chunks)."""
        return self.features_into([(rows, out)], flip)[0]

    def features_into(
        self, targets: Sequence[tuple[Any, np.ndarray | None]], flip: bool = False
    ) -> list[np.ndarray]:
        """Several :meth:`features` reads ``(rows, out)`` at once, each chunk read once however
        many targets want rows of it (the train and val rows share the pool's chunks)."""
        if flip and not self.has_flip:
            raise StoreError(f"{self.path} holds no flipped features (it was written without them)")
        name = "features_flip" if flip else "features"
        array = self._group[name]
        reader = RowChunks.of(self.path, name, array)
        if reader is not None:
            return reader.read_many(
                [(_row_indices(rows, self.n_rows, name), out) for rows, out in targets]
            )
        results = []
        for rows, out in targets:  # another layout (not written by this package): zarr
            values = self.read(name, rows)
            if out is not None:
                out[...] = values
            results.append(values if out is None else out)
        return results

    def summary(self) -> dict:
        """What ``spml info`` prints: shapes, sizes and label statistics per split, provenance."""
        labels = self.labels()
        splits = {}
        for name in SPLIT_CODES:
            y = labels[self.split(name)]
            per_row = y.sum(1)
            empty = np.nonzero(y.sum(0) == 0)[0]
            splits[name] = {
                "rows": int(y.shape[0]),
                "label_cardinality": round(float(per_row.mean()), 4) if len(y) else 0.0,
                "rows_without_positive": int((per_row == 0).sum()),
                "classes_without_positive": int(empty.size),
                "classes_without_positive_names": [self.class_names[c] for c in empty],
            }
        from probe.store.priors import prior_summary

        known = {*STORE_ATTRS, "schema_version", "n_classes", "observed_budgets", "observed_bias",
                 "split_seed", "complete", "completed", "resumed", "priors"}
        disk = sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())
        return {
            "path": str(self.path), "dataset": self.dataset,
            "schema_version": self.attrs["schema_version"],
            "complete": bool(self.attrs["complete"]), "completed": self.attrs.get("completed"),
            "rows": self.n_rows, "classes": self.n_classes, "feature_dim": self.feature_dim,
            "dtype": self.dtype, "has_flip": self.has_flip,
            "block_rows": int(self.attrs["block_rows"]), "observed_seeds": self.observed_seeds(),
            "observed_budgets": {str(s): self.observed_budget(s) for s in self.observed_seeds()
                                 if not is_protocol_budget(self.observed_budget(s))},
            # every draw that is not the protocol's, with its kind (probe.store.records)
            "draws": {str(s): draw_record(self.attrs, s) for s in self.observed_seeds()
                      if draw_record(self.attrs, s)["kind"] != "protocol"},
            "n_unlabeled": dict(self.attrs["n_unlabeled"]), "splits": splits,
            "disk_bytes": int(disk), "class_names": self.class_names,
            "priors": prior_summary(self),
            "other_attrs": {k: v for k, v in self.attrs.items() if k not in known},
            "provenance": self.provenance,
        }


def verify_store(path: str | Path) -> VerifyReport:
    """Read every chunk of every array of a store (finished or not) and report the damaged
    ones; the store must at least open as a Zarr group with its schema attributes."""
    path, group = open_store_group(path, "r")
    return VerifyReport(path, *group_damage(path, group))
