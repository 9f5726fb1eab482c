"""Chunk-level access to a store's arrays: CRC-32C checksums, the fast feature read path (one
``readinto`` per chunk file, chunks in parallel) and damage reports, each naming the store, the
array and the chunk and how to repair (docs/protocol.md "The feature store": the format, and what
stores written without checksums still detect)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from probe.errors import SpmlError
from probe.store.errors import StoreDamaged

FEATURE_ARRAYS: tuple[str, ...] = ("features", "features_flip")
# reads in flight at once: a page-cache copy runs near memory bandwidth on a couple of cores;
# more threads than cores only add switching (measured with `spml bench store`)
READ_THREADS: int = min(8, os.cpu_count() or 1)


def repair_hint(store: Path | str) -> str:
    return (
        f"the store is damaged: repair it by re-running the same featurize/import command that "
        f"wrote {store} (it rewrites only the damaged blocks); `spml verify {store}` lists "
        "every damaged chunk"
    )


def damage_message(store: Path | str, array: str, chunk: int, reason: str) -> str:
    return f"{store}: array {array!r} chunk {chunk} is damaged ({reason}); {repair_hint(store)}"


def checksum_codecs(compress: bool) -> list[Any]:
    """The ``compressors`` list of a new store array: zstd (small arrays only) then CRC-32C."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    return [ZstdCodec(level=0), Crc32cCodec()] if compress else [Crc32cCodec()]


def small_array(parent: Any, name: str, data: np.ndarray, **kwargs: Any) -> Any:
    """Write ``data`` as array ``name`` of ``parent`` (replacing one there): zstd + CRC-32C,
    a file for every chunk, even an all-zero one (a missing file is then damage)."""
    return parent.create_array(name, data=data, compressors=checksum_codecs(compress=True),
                               config={"write_empty_chunks": True}, overwrite=True, **kwargs)


def has_checksum(array: Any) -> bool:
    return any(type(c).__name__ == "Crc32cCodec" for c in array.metadata.codecs)


def _crc32c(buf: Any) -> bytes:
    import google_crc32c  # zarr's own dependency for its crc32c codec

    return int(google_crc32c.value(np.frombuffer(buf, np.uint8))).to_bytes(4, "little")


@dataclass
class RowChunks:
    """Fast reader of a 2-D array chunked by whole rows with raw (bytes [+ crc32c]) chunks."""

    store: Path
    name: str
    array: Any
    n_rows: int
    dim: int
    chunk_rows: int
    dtype: np.dtype
    checksum: bool
    _local: threading.local = field(default_factory=threading.local, repr=False)

    @classmethod
    def of(cls, store: Path, name: str, array: Any) -> RowChunks | None:
        """The reader, or None when ``array`` is not laid out for it (then zarr reads it)."""
        codecs = array.metadata.codecs
        names = [type(c).__name__ for c in codecs]
        if (names not in (["BytesCodec"], ["BytesCodec", "Crc32cCodec"]) or array.ndim != 2
                or array.chunks[1] != array.shape[1] or type(array.store).__name__ != "LocalStore"
                or getattr(getattr(codecs[0], "endian", None), "value", "little") != "little"):
            return None
        return cls(Path(store), name, array, int(array.shape[0]), int(array.shape[1]),
                   int(array.chunks[0]), np.dtype(array.dtype), len(names) == 2)

    @property
    def n_chunks(self) -> int:
        return -(-self.n_rows // self.chunk_rows)

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_rows * self.dim * self.dtype.itemsize

    def path(self, chunk: int) -> Path:
        return self.store / self.array.path / self.array.metadata.encode_chunk_key((chunk, 0))

    def _damaged(self, chunk: int, reason: str) -> StoreDamaged:
        err = StoreDamaged(damage_message(self.store, self.name, chunk, reason))
        err.reason = reason  # what verify lists
        return err

    def read_chunk_into(self, chunk: int, dest: np.ndarray) -> None:
        """Read the whole of ``chunk`` (``chunk_rows`` rows, the last one padded) into the
        C-contiguous ``dest`` and check its length and checksum; StoreDamaged otherwise."""
        want = self.chunk_bytes + (4 if self.checksum else 0)
        try:
            with open(self.path(chunk), "rb", buffering=0) as fh:
                size = os.fstat(fh.fileno()).st_size
                if size != want:
                    raise self._damaged(chunk, f"its file is {size} bytes, expected {want}")
                view = memoryview(dest).cast("B")
                got = 0
                while got < self.chunk_bytes:
                    n = fh.readinto(view[got:])
                    if not n:
                        raise self._damaged(chunk, f"its file ended after {got} bytes")
                    got += n
                stored = fh.read(4) if self.checksum else b""
        except FileNotFoundError:
            raise self._damaged(chunk, "its file is missing") from None
        except OSError as err:
            raise self._damaged(chunk, f"reading it failed: {err}") from None
        if self.checksum and _crc32c(view) != stored:
            raise self._damaged(chunk, "checksum mismatch")

    def read_many(
        self, targets: list[tuple[np.ndarray | None, np.ndarray | None]]
    ) -> list[np.ndarray]:
        """Several ``(rows, out)`` reads at once, each chunk read once however many targets want
        rows of it (e.g. the train and val rows of the pool). ``rows``: int indices, sorted or
        not, repeats allowed (None: all); ``out``: allocated when None, else filled (it may be a
        strided view such as ``x[:, :D]`` of a wider array)."""
        outs = []  # per target: out; per chunk: [(target, positions, chunk rows)]
        per_chunk: dict[int, list[tuple[int, np.ndarray, np.ndarray]]] = {}
        for t, (idx, out) in enumerate(targets):
            n = self.n_rows if idx is None else len(idx)
            if out is None:
                out = np.empty((n, self.dim), self.dtype)
            elif out.shape != (n, self.dim) or out.dtype != self.dtype:
                raise SpmlError(
                    f"read {self.name}: out must be {self.dtype} of shape {(n, self.dim)}, got "
                    f"{out.dtype} {out.shape}"
                )
            outs.append(out)
            if n == 0:
                continue
            if idx is None:
                idx = np.arange(self.n_rows, dtype=np.int64)
            chunk_of = idx // self.chunk_rows
            order = np.argsort(chunk_of, kind="stable")
            for pos in np.split(order, np.flatnonzero(np.diff(chunk_of[order])) + 1):
                chunk = int(chunk_of[pos[0]])
                per_chunk.setdefault(chunk, []).append((t, pos, idx[pos] - chunk * self.chunk_rows))
        wants = list(per_chunk.items())

        def one(item: tuple[int, list[tuple[int, np.ndarray, np.ndarray]]]) -> None:
            chunk, parts = item
            full = min(self.chunk_rows, self.n_rows - chunk * self.chunk_rows)
            if len(parts) == 1:
                t, pos, rows = parts[0]
                out = outs[t]
                if (
                    out.flags.c_contiguous and full == self.chunk_rows and len(pos) == full
                    and (np.diff(pos) == 1).all() and (rows == np.arange(full)).all()
                ):  # the whole chunk, in order, to consecutive output rows: straight into out
                    self.read_chunk_into(chunk, out[pos[0] : pos[0] + full])
                    return
            buf = getattr(self._local, "buf", None)  # one buffer per thread, reused
            if buf is None:
                buf = self._local.buf = np.empty((self.chunk_rows, self.dim), self.dtype)
            self.read_chunk_into(chunk, buf)
            for t, pos, rows in parts:
                if (np.diff(pos) == 1).all() and (np.diff(rows) == 1).all():
                    outs[t][pos[0] : pos[-1] + 1] = buf[rows[0] : rows[-1] + 1]
                else:
                    outs[t][pos] = buf[rows]

        if len(wants) <= 1 or READ_THREADS == 1:
            for item in wants:
                one(item)
        else:
            with ThreadPoolExecutor(min(READ_THREADS, len(wants))) as pool:
                list(pool.map(one, wants))  # re-raises the first worker error
        return outs


@dataclass(frozen=True)
class Damage:
    """One damaged chunk found by :func:`verify_store`."""

    array: str
    chunk: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify_store` found: every array, its chunk count, whether it carries
    checksums, and the damaged chunks."""

    path: Path
    arrays: dict[str, dict]
    damaged: list[Damage]

    @property
    def ok(self) -> bool:
        return not self.damaged

    @property
    def unchecksummed(self) -> list[str]:
        return [name for name, a in self.arrays.items() if not a["checksum"]]


def damaged_chunks(store: Path, name: str, array: Any, expect_all: bool = True) -> list[Damage]:
    """Read every chunk of one array and return those that cannot be read back as written
    (with ``expect_all``, a checksummed array's missing chunk file counts as damage)."""
    reader = RowChunks.of(store, name, array)
    out = []
    if reader is not None:
        buf = np.empty((reader.chunk_rows, reader.dim), reader.dtype)
        for chunk in range(reader.n_chunks):
            if not expect_all and not reader.path(chunk).is_file():
                continue  # not written yet (an unfinished store)
            try:
                reader.read_chunk_into(chunk, buf)
            except StoreDamaged as err:
                out.append(Damage(name, (chunk, 0), getattr(err, "reason", str(err))))
        return out
    checked = has_checksum(array) and type(array.store).__name__ == "LocalStore"
    for coords in np.ndindex(*array.cdata_shape):
        if checked and not (
            Path(store) / array.path / array.metadata.encode_chunk_key(coords)
        ).is_file():
            # written with write_empty_chunks: every chunk of a finished array has a file
            if expect_all:
                out.append(Damage(name, coords, "its file is missing"))
            continue
        try:
            array.blocks[coords]
        except Exception as err:  # zarr raises ValueError (checksum), codec errors, OSError
            out.append(Damage(name, coords, _reason(err)))
    return out


def _reason(err: BaseException) -> str:
    return ("checksum mismatch" if "checksum" in str(err).lower()
            else f"{type(err).__name__}: {err}"[:200])


def chunk_label(coords: tuple[int, ...]) -> str:
    return str(coords[0]) if len(coords) == 1 or all(c == 0 for c in coords[1:]) else str(coords)


def group_damage(path: Path, group: Any) -> tuple[dict[str, dict], list[Damage]]:
    """Every array of a store group (chunk count, checksummed or not) and its damaged chunks.
    An unfinished store's missing feature chunks are not damage: their blocks are pending."""
    complete = bool(group.attrs.get("complete"))
    arrays: dict[str, dict] = {}
    damaged: list[Damage] = []
    # every array, nested ones (observed/<seed>) as parent/name
    for name in [k for k, node in sorted(group.members(max_depth=None)) if hasattr(node, "shape")]:
        try:
            array = group[name]
        except Exception as err:  # unreadable array metadata
            damaged.append(Damage(name, (), f"its metadata cannot be read: {_reason(err)}"))
            continue
        arrays[name] = {"chunks": int(np.prod(array.cdata_shape)), "checksum": has_checksum(array)}
        expect_all = complete or name not in (*FEATURE_ARRAYS, "blocks_done")
        damaged += damaged_chunks(path, name, array, expect_all)
    return arrays, damaged
