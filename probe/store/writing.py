"""Writing a feature store: :func:`create_store` and the :class:`StoreWriter` that writes
its feature blocks, :func:`resume_store` / :func:`join_store` to continue or share one,
and :func:`write_feature_store` for in-memory features (the format and its crash safety:
:mod:`probe.store.layout`)."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from probe.store.chunks import FEATURE_ARRAYS, checksum_codecs, group_damage
from probe.store.errors import StoreError
from probe.store.index import DatasetIndex
from probe.store.layout import (
    DTYPES,
    EVERY_CHUNK,
    REQUIRED_PROVENANCE,
    RESUME_KEYS,
    ROW_ARRAYS,
    SCHEMA_VERSION,
    SPLIT_CODES,
    STORE_ARRAYS,
    STORE_ATTRS,
    check_json,
    is_store_dir,
    open_store_group,
    package_versions,
    utc_now,
)
from probe.store.protocol import PROTOCOL_SEED, VAL_FRACTION, split_indices
from probe.store.reading import Store, open_store


class BadFeatureRow(StoreError):
    """A feature row is NaN/inf or overflows the store dtype; ``row`` is its store row."""

    def __init__(self, message: str, row: int, reason: str) -> None:
        super().__init__(message)
        self.row = row
        self.reason = reason


def _check_provenance(provenance: dict, dtype: str) -> dict:
    if not isinstance(provenance, dict):
        raise StoreError(f"provenance must be a dict, got {type(provenance).__name__}")
    missing = [k for k in REQUIRED_PROVENANCE if k not in provenance]
    if missing:
        raise StoreError(
            f"provenance is missing {missing}; it needs at least {list(REQUIRED_PROVENANCE)} "
            f"(backbone name, weights id, transform description)"
        )
    if "dtype" in provenance and provenance["dtype"] != dtype:
        raise StoreError(
            f"provenance says dtype {provenance['dtype']!r} but the store dtype is {dtype!r}"
        )
    return check_json({"weights_sha256": None, "source": None, "source_sha256": None,
                       **provenance, "dtype": dtype, "versions": package_versions(),
                       "created": utc_now()}, "provenance")


def _write_row_arrays(
    group: zarr.Group, index: DatasetIndex, seeds: Sequence[int], only: Sequence[str] | None = None,
    attrs: dict | None = None, val_fraction: float = VAL_FRACTION,
) -> None:
    """Labels, the protocol split, the image ids and the single-positive draws of ``seeds``
    (``observed/<seed>``), each with a CRC-32C per chunk; ``only`` names the ones to (re)write.
    A draw is written as the store's ``attrs`` record it (protocol, label budget or label
    bias: probe.store.draws.draw_observed), so a repaired draw is the draw it was.
    ``val_fraction``: the share of the pool that is val (the protocol's 20%, or what a store's
    ``val_fraction`` attribute records, e.g. the tabular benchmark's 80/10/10 split)."""
    from probe.store.draws import draw_observed
    from probe.store.records import draw_record

    labels_pool = np.asarray(index.pool.labels, dtype=np.uint8)
    labels_test = np.asarray(index.test.labels, dtype=np.uint8)
    n_pool = len(index.pool)
    n_rows = n_pool + len(index.test)

    def want(name: str) -> bool:
        return only is None or name in only

    def put(parent: zarr.Group, name: str, data: np.ndarray | None, **kwargs: Any) -> Any:
        # chunks.small_array, with the codecs and config a test replaces to write an old store
        return parent.create_array(name, data=data, compressors=checksum_codecs(compress=True),
                                   config=EVERY_CHUNK, overwrite=True, **kwargs)

    if want("labels"):
        put(group, "labels", np.concatenate([labels_pool, labels_test]))
    if want("split"):
        train, val = split_indices(n_pool, val_fraction, PROTOCOL_SEED)
        split = np.full(n_rows, SPLIT_CODES["test"], dtype=np.int8)
        split[train] = SPLIT_CODES["train"]
        split[val] = SPLIT_CODES["val"]
        put(group, "split", split)
    if want("image_ids"):
        put(group, "image_ids", None, shape=(n_rows,), dtype=str)[:] = np.asarray(
            [*index.pool.image_ids, *index.test.image_ids], dtype=str)
    if only is None:  # a dataset's boxes: the label-bias draws' weights (probe.store.bias)
        from probe.store.bias import write_bias_weights
        write_bias_weights(group, index.pool, index.test)
    observed = group.require_group("observed")
    for seed in seeds:
        if not want(f"observed/{seed}"):
            continue
        record = draw_record(attrs or {}, seed)
        box = None
        if record["kind"] == "bias" and record["bias"] != "semantic":
            box = group[f"bias/{record['bias']}"][:]  # damaged, it was refused before this
        put(observed, str(seed), draw_observed(record, labels_pool, labels_test, seed, box))


def create_store(
    path: str | Path,
    index: DatasetIndex,
    *,
    feature_dim: int,
    with_flip: bool,
    provenance: dict,
    dtype: str = "float16",
    block_rows: int = 1024,
    seeds: Sequence[int] = (PROTOCOL_SEED,),
    overwrite: bool = False,
    extra_attrs: dict | None = None,
) -> StoreWriter:
    """Create an empty store for ``index`` and return its writer (docs/protocol.md feature store).

    Labels, the protocol split and the draws for ``seeds`` are written now, the features block
    by block through the :class:`StoreWriter`. ``provenance`` needs ``backbone``, ``weights``
    and ``transform`` (where known ``weights_sha256``, ``source``, ``source_sha256``); versions,
    dtype and the creation time are added. ``extra_attrs``: more top-level attributes. An
    existing path is an error unless ``overwrite`` (:func:`_clear_output`).
    """
    path = Path(path)
    seeds = [int(s) for s in seeds]
    prov = _check_create_args(index, feature_dim, dtype, block_rows, seeds, provenance,
                              extra_attrs)
    _clear_output(path, overwrite)
    # created under a hidden name, renamed into place once written: a creation that fails or
    # is killed leaves nothing at `path` (late zarr writes land in the staging folder instead)
    staging = path.with_name(f"{_STAGING_PREFIX}{path.name}.{os.getpid()}")
    for stale in path.parent.glob(f"{_STAGING_PREFIX}{path.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    try:
        group = zarr.open_group(staging, mode="w-")
        _write_row_arrays(group, index, seeds,
                          val_fraction=(extra_attrs or {}).get("val_fraction", VAL_FRACTION))
        n_rows = len(index.pool) + len(index.test)
        for name in FEATURE_ARRAYS if with_flip else FEATURE_ARRAYS[:1]:
            group.create_array(  # raw + CRC-32C: zstd decodes too slowly (docs/protocol.md)
                name, shape=(n_rows, int(feature_dim)), chunks=(int(block_rows), int(feature_dim)),
                dtype=dtype, fill_value=np.nan,  # a never-written row reads as NaN, not as zeros
                compressors=checksum_codecs(compress=False))
        # one chunk per block: concurrent writers of different blocks never collide
        group.create_array("blocks_done", shape=(math.ceil(n_rows / int(block_rows)),),
                           chunks=(1,), dtype=bool, fill_value=False, config=EVERY_CHUNK,
                           compressors=checksum_codecs(compress=False))
        unlabeled = {name: int((np.asarray(phase.labels, dtype=np.uint8).sum(1) == 0).sum())
                     for name, phase in (("pool", index.pool), ("test", index.test))}
        group.attrs.update({  # schema_version last of all: a store without it is unfinished
            **(extra_attrs or {}), "dataset": index.name, "class_names": list(index.class_names),
            "n_pool": len(index.pool), "n_test": len(index.test), "n_unlabeled": unlabeled,
            "n_classes": index.pool.labels.shape[1], "feature_dim": int(feature_dim),
            "has_flip": bool(with_flip), "dtype": dtype, "block_rows": int(block_rows),
            "observed_seeds": sorted(seeds), "split_seed": PROTOCOL_SEED, "provenance": prov,
            "complete": False, "schema_version": SCHEMA_VERSION})
    except OSError as err:  # disk full, file-size limit: nothing reaches `path`
        shutil.rmtree(staging, ignore_errors=True)
        raise StoreError(
            f"cannot create {path}: {err.strerror or err} (the disk is full, or a file-size or "
            "quota limit was reached?); nothing was kept -- free space and re-run the same "
            "command"
        ) from err
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    os.rename(staging, path)
    return StoreWriter(path, zarr.open_group(path, mode="r+"))


_STAGING_PREFIX = ".creating-"  # create_store's hidden folder beside the store being created


def _check_create_args(index: DatasetIndex, feature_dim: int, dtype: str, block_rows: int,
                       seeds: list[int], provenance: dict, extra_attrs: dict | None) -> dict:
    """Refuse what :func:`create_store` cannot write; returns the checked provenance."""
    if dtype not in DTYPES:
        raise StoreError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    for name, value in (("feature_dim", feature_dim), ("block_rows", block_rows)):
        if int(value) < 1:
            raise StoreError(f"{name} must be >= 1, got {value}")
    if not seeds or len(set(seeds)) != len(seeds):
        raise StoreError(f"seeds must be a non-empty list of distinct integers, got {seeds}")
    prov = _check_provenance(provenance, dtype)
    clash = sorted(set(extra_attrs or {}) & {"schema_version", "complete", "provenance",
                                             "class_names"})
    if clash:
        raise StoreError(f"extra_attrs may not set reserved attributes {clash}")
    n_rows = len(index.pool) + len(index.test)
    if n_rows == 0:
        raise StoreError(f"dataset '{index.name}' has no rows to store")
    ids = [*index.pool.image_ids, *index.test.image_ids]
    if len(set(ids)) != n_rows:
        dup = next(i for i, k in Counter(ids).items() if k > 1)
        raise StoreError(f"dataset '{index.name}': image id {dup!r} occurs more than once")
    for phase, y in (("pool", index.pool.labels), ("test", index.test.labels)):
        bad = ~np.isin(y, (0, 1))
        if bad.any():
            r, c = (int(v[0]) for v in np.nonzero(bad))
            raise StoreError(
                f"dataset '{index.name}': {phase} labels must be 0/1, row {r} column {c} is "
                f"{y[r, c].item()!r}"
            )
    return prov


def _clear_output(path: Path, overwrite: bool) -> None:
    """An existing output is an error unless ``overwrite``, which only ever deletes a Zarr
    store or an empty directory."""
    if not path.exists():
        return
    if not overwrite:
        raise StoreError(f"output store {path} already exists; pass --overwrite to replace it")
    if is_store_dir(path):
        shutil.rmtree(path)
    elif path.is_dir() and not any(path.iterdir()):
        path.rmdir()
    else:
        raise StoreError(
            f"{path} exists and is not a Zarr store; refusing to delete it even with "
            f"--overwrite -- choose another output path"
        )


@contextlib.contextmanager
def _writing(path: Path, what: str) -> Iterator[None]:
    """An OSError while writing (disk full, I/O error) as a StoreError naming the store and
    ``what``; zarr's chunk writes are atomic, so the same command resumes once there is room."""
    try:
        yield
    except OSError as err:
        reason = err.strerror or str(err)
        if err.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            reason += " (the disk is full, or a file-size or quota limit was reached)"
        raise StoreError(
            f"cannot write {what} of {path}: {reason}. The blocks written before are intact; "
            "free space and re-run the same command: it resumes where it stopped"
        ) from err


class StoreWriter:
    """Writes the feature blocks of a store created by :func:`create_store` / resumed by
    :func:`resume_store`. Block ``b`` covers rows ``block_slice(b)``; blocks may be written in
    any order (and by several processes, one block each)."""

    def __init__(self, path: Path, group: zarr.Group) -> None:
        self.path = Path(path)
        self._group = group
        attrs = group.attrs
        self.n_rows: int = int(attrs["n_pool"]) + int(attrs["n_test"])
        self.block_rows: int = int(attrs["block_rows"])
        self.n_blocks: int = math.ceil(self.n_rows / self.block_rows)
        self.with_flip: bool = bool(attrs["has_flip"])
        self.feature_dim: int = int(attrs["feature_dim"])
        self.dtype: str = str(attrs["dtype"])
        # damaged row arrays (labels, split, image_ids, observed/<seed>) that check_same_rows
        # rewrites from the index before comparing (set by resume_store)
        self.rewrite_arrays: list[str] = []

    def __repr__(self) -> str:
        return f"StoreWriter({str(self.path)!r}, rows={self.n_rows}, blocks={self.n_blocks})"

    def pending_blocks(self) -> list[int]:
        """Blocks not yet written, ascending."""
        return np.nonzero(~self._group["blocks_done"][:])[0].tolist()

    def block_slice(self, block: int) -> slice:
        """Rows of ``block``: ``[block * block_rows, min((block + 1) * block_rows, N))``."""
        if not 0 <= int(block) < self.n_blocks:
            raise StoreError(
                f"block {block} out of range: this store has blocks 0..{self.n_blocks - 1}"
            )
        start = int(block) * self.block_rows
        return slice(start, min(start + self.block_rows, self.n_rows))

    def _checked(self, name: str, block: int, sl: slice, values: Any) -> np.ndarray:
        arr = np.asarray(values)
        want = (sl.stop - sl.start, self.feature_dim)
        if arr.shape != want:
            raise StoreError(
                f"write_block({block}): {name} must have shape {want} (rows {sl.start}:{sl.stop}),"
                f" got {arr.shape}"
            )
        if not np.issubdtype(arr.dtype, np.floating):
            raise StoreError(
                f"write_block({block}): {name} must be a floating-point array, got {arr.dtype}"
            )
        with np.errstate(over="ignore"):  # overflow is detected and reported just below
            out = arr.astype(self.dtype, copy=False)
        if not np.isfinite(out).all():
            bad = int(np.nonzero(~np.isfinite(out).all(axis=1))[0][0])
            cause = (
                "is NaN/inf"
                if not np.isfinite(arr[bad]).all()
                else f"overflows {self.dtype} (max |value| {np.abs(arr[bad]).max():.4g}); "
                "store as float32"
            )
            raise BadFeatureRow(
                f"write_block({block}): {name} of row {sl.start + bad} {cause}",
                sl.start + bad,
                f"{name} {cause}",
            )
        return out

    def write_block(
        self, block: int, features: np.ndarray, features_flip: np.ndarray | None = None
    ) -> None:
        """Check shapes/dtype, write the block's rows, then mark it done (in that order)."""
        sl = self.block_slice(block)
        feats = self._checked("features", block, sl, features)
        if self.with_flip != (features_flip is not None):
            raise StoreError(f"write_block({block}): " + (
                "this store keeps flipped features; pass features_flip" if self.with_flip else
                "this store was created without flipped features (with_flip=False) but "
                "features_flip was given"))
        flip = None if features_flip is None else self._checked("features_flip", block, sl,
                                                                 features_flip)
        with _writing(self.path, f"block {block} (rows {sl.start}:{sl.stop})"):
            self._group["features"][sl] = feats
            if flip is not None:
                self._group["features_flip"][sl] = flip
            self._group["blocks_done"][int(block)] = True

    def check_same_rows(self, index: DatasetIndex, feature_dim: int, with_flip: bool) -> None:
        """Before resuming: StoreError unless the store was started for the same rows, labels,
        classes, feature dim and flip setting as ``index`` (damaged row arrays are rewritten
        from ``index`` first)."""
        group, attrs = self._group, self._group.attrs
        if self.rewrite_arrays:
            _write_row_arrays(group, index, attrs["observed_seeds"], only=self.rewrite_arrays,
                              attrs=dict(attrs),
                              val_fraction=attrs.get("val_fraction", VAL_FRACTION))
            self.rewrite_arrays = []
        same = (
            attrs["n_pool"] == len(index.pool)
            and attrs["n_test"] == len(index.test)
            and attrs["feature_dim"] == feature_dim
            and attrs["has_flip"] == with_flip
            and list(attrs["class_names"]) == list(index.class_names)
            and [str(s) for s in group["image_ids"][:]]
            == [*index.pool.image_ids, *index.test.image_ids]
            and np.array_equal(
                group["labels"][:], np.concatenate([index.pool.labels, index.test.labels])
            )
        )
        if not same:
            raise StoreError(
                f"cannot resume {self.path}: it was started for other rows, labels, classes or "
                "feature shape than this input; pass --overwrite to start again"
            )

    @property
    def attrs(self) -> dict:
        """The store's top-level attributes as written so far (a copy)."""
        return dict(self._group.attrs)

    def update_attrs(self, values: dict) -> None:
        """Add extra top-level attributes (e.g. rows that failed to decode) through the
        writer's own group, so that :meth:`finalize` keeps them; reserved keys are refused."""
        reserved = {*STORE_ATTRS, "schema_version", "complete", "completed"}
        clash = sorted(set(values) & reserved)
        if clash:
            raise StoreError(f"update_attrs may not set reserved attributes {clash}")
        self._group.attrs.update(values)

    def finalize(self) -> Store:
        """Set ``complete`` (last) once every block is written, and open the store for reading."""
        if self.rewrite_arrays:
            raise StoreError(
                f"cannot finalize {self.path}: damaged arrays {self.rewrite_arrays} were not "
                "rewritten (call check_same_rows with the dataset index first)"
            )
        pending = self.pending_blocks()
        if pending:
            raise StoreError(
                f"cannot finalize {self.path}: {len(pending)} of {self.n_blocks} blocks not "
                f"written yet (first: {pending[:5]})"
            )
        with _writing(self.path, "the completion mark"):
            self._group.attrs.update({"complete": True, "completed": utc_now()})
        return open_store(self.path)


def resume_store(path: str | Path, provenance: dict) -> StoreWriter:
    """Writer for an interrupted or damaged store, to write its pending (or damaged) blocks.

    Refuses (StoreError naming the field) when ``provenance`` differs from the stored one in any
    of :data:`RESUME_KEYS` (``dtype`` only when given). Then every chunk already written is read
    back (probe.store.chunks): a damaged feature chunk's block is unmarked so that it is written
    again, and damaged label/split/id/draw arrays are rewritten from the index by
    :meth:`StoreWriter.check_same_rows`. A complete store with no damage is refused ("already
    complete"); a complete one with damage becomes incomplete until the repair finishes.
    """
    path, group = _writable_group(path)
    stored = group.attrs["provenance"]
    given = json.loads(json.dumps(provenance, default=str))  # compare as stored (JSON)
    for key in (k for k in RESUME_KEYS if k != "dtype" or k in given):
        if stored.get(key) != given.get(key):
            raise StoreError(
                f"cannot resume {path}: provenance field {key!r} differs (store: "
                f"{stored.get(key)!r}, now: {given.get(key)!r}); re-run with the settings "
                "that created it, or pass --overwrite to start again"
            )
    damage = group_damage(path, group)[1]
    if group.attrs.get("complete") and not damage:
        raise StoreError(
            f"{path} is already complete and every chunk reads back as written; nothing to "
            "resume or repair (pass --overwrite to rebuild it)"
        )
    blocks = sorted({d.chunk[0] for d in damage if d.array in (*FEATURE_ARRAYS, "blocks_done")})
    rows = sorted(
        {d.array for d in damage if d.array in ROW_ARRAYS or d.array.startswith("observed/")}
    )
    other = sorted({d.array for d in damage} - set(FEATURE_ARRAYS) - {"blocks_done", *rows})
    if other:
        raise StoreError(
            f"{path}: arrays {other} are damaged and cannot be rewritten from the input; "
            "re-create the store with --overwrite"
        )
    if damage:
        # complete -> False first: a repair killed half-way leaves a store that open_store
        # refuses and the next run repairs again
        group.attrs.update({
            "complete": False,
            "repaired": [*group.attrs.get("repaired", []), {
                "at": utc_now(), "chunks": [[d.array, list(d.chunk), d.reason] for d in damage]}],
        })  # fmt: skip
        done = group["blocks_done"]
        for block in blocks:
            done[block] = False
    group.attrs["resumed"] = [*group.attrs.get("resumed", []), utc_now()]
    writer = StoreWriter(path, group)
    writer.rewrite_arrays = rows
    return writer


def join_store(path: str | Path) -> StoreWriter:
    """Writer for a store that another process of the same run has just created or resumed
    (the other ranks of a distributed ``spml featurize``): it writes its own blocks only and
    changes no attribute, so ranks never rewrite the group's metadata at once. The process
    that created the store checked its provenance; this only checks that it is unfinished."""
    path, group = _writable_group(path)
    if group.attrs.get("complete"):
        raise StoreError(f"{path} is already complete; no block left to write")
    return StoreWriter(path, group)


def _writable_group(path: str | Path) -> tuple[Path, zarr.Group]:
    path, group = open_store_group(path, "r+")
    missing = [a for a in STORE_ARRAYS if a not in group]
    if missing:
        raise StoreError(f"{path} lacks arrays {missing}; re-create it with --overwrite")
    return path, group


def write_feature_store(
    path: str | Path,
    index: DatasetIndex,
    features: np.ndarray | Sequence[np.ndarray],
    features_flip: np.ndarray | Sequence[np.ndarray] | None = None,
    *,
    provenance: dict,
    dtype: str = "float16",
    block_rows: int = 1024,
    seeds: Sequence[int] = (PROTOCOL_SEED,),
    overwrite: bool = False,
    resume: bool = False,
    extra_attrs: dict | None = None,
    progress: bool = True,
    sources: Sequence[str] | None = None,
) -> Store:
    """Build a complete store from in-memory (or memory-mapped) features.

    ``features`` is either one ``(N, D)`` array in store order (pool rows, then test rows) or a
    pair ``(pool_features, test_features)``; ``features_flip`` likewise. With ``resume`` an
    interrupted store at ``path`` (same provenance, same rows and labels) is continued instead
    of being an error. ``sources`` names where each part came from (e.g. file paths), so that
    a NaN/inf or overflowing row is reported as "<source> row <k>". Shows progress on stderr
    (probe.progress) unless ``progress`` is False.
    """
    from probe.progress import track

    n_pool, n_test = len(index.pool), len(index.test)
    parts = _feature_parts("features", features, n_pool, n_test)
    flip_parts = (None if features_flip is None
                  else _feature_parts("features_flip", features_flip, n_pool, n_test))
    dim = parts[0].shape[1]
    if flip_parts is not None and flip_parts[0].shape[1] != dim:
        raise StoreError(
            f"features_flip has {flip_parts[0].shape[1]} columns but features have {dim}"
        )
    path = Path(path)
    if resume and not overwrite and is_store_dir(path):
        writer = resume_store(path, {**provenance, "dtype": dtype})
        writer.check_same_rows(index, dim, flip_parts is not None)
    else:
        writer = create_store(path, index, feature_dim=dim, with_flip=flip_parts is not None,
                              provenance=provenance, dtype=dtype, block_rows=block_rows,
                              seeds=seeds, overwrite=overwrite, extra_attrs=extra_attrs)
    pending = writer.pending_blocks()
    for block in track(pending, len(pending), f"writing {path.name}", "block", enabled=progress):
        sl = writer.block_slice(block)
        flip = None if flip_parts is None else _gather(flip_parts, sl)
        try:
            writer.write_block(block, _gather(parts, sl), flip)
        except BadFeatureRow as err:
            if sources is None:
                raise
            part = int(len(parts) == 2 and err.row >= n_pool)  # (all) or (pool, test)
            row = err.row - part * n_pool
            name = sources[part] if part < len(sources) else f"part {part}"
            raise StoreError(f"{name} row {row}: {err.reason}") from None
    return writer.finalize()


def _feature_parts(name: str, features: Any, n_pool: int, n_test: int) -> list[Any]:
    """Normalise ``features`` to a list of 2-D arrays whose rows concatenate to pool + test."""
    pair = isinstance(features, (tuple, list))
    if pair and len(features) != 2:
        raise StoreError(f"{name}: pass one (N, D) array or a (pool, test) pair of arrays")
    parts, want, labels = (([*features], [n_pool, n_test], ("pool", "test")) if pair
                           else ([features], [n_pool + n_test], ("all",)))
    for part, n, label in zip(parts, want, labels):
        shape = getattr(part, "shape", None)
        if shape is None or len(shape) != 2:
            raise StoreError(f"{name} ({label} rows) must be a 2-D (N, D) array, got shape {shape}")
        if shape[0] != n:
            raise StoreError(f"{name} ({label} rows) has {shape[0]} rows but the dataset has {n}")
    if len(parts) == 2 and parts[0].shape[1] != parts[1].shape[1]:
        raise StoreError(
            f"{name}: pool features have {parts[0].shape[1]} columns, test features "
            f"{parts[1].shape[1]}"
        )
    return parts


def _gather(parts: list[Any], sl: slice) -> np.ndarray:
    """Rows ``sl`` of the concatenation of ``parts`` (which may be memory-mapped)."""
    pieces, offset = [], 0
    for part in parts:
        n = part.shape[0]
        lo, hi = max(sl.start, offset), min(sl.stop, offset + n)
        if lo < hi:
            pieces.append(np.asarray(part[lo - offset : hi - offset]))
        offset += n
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

