"""The featurizer's writing step (the run itself is :mod:`featurize.extract.run`): a writer thread
stores finished blocks through the store's crash-safe writer; the unreadable images (bad rows)
are recorded before their block is marked done; a store is created, or an interrupted one
resumed when it was started the same way.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from pathlib import Path
from typing import Any

from featurize.backbones import Backbone
from probe.io import atomic_write_text
from probe.store.index import DatasetIndex


class BlockWriter:
    """Writer thread: takes finished blocks from a queue and writes them through the store's
    crash-safe writer, so disk I/O never holds up the device loop. ``bad_rows`` are recorded
    before the block is marked done: in the store's attributes, or with ``per_block`` (the
    ranks of a distributed run, which must not rewrite the shared attributes at once) in a
    small JSON file per block that rank 0 merges into the attributes at the end."""

    def __init__(self, writer: Any, bad_rows: dict[int, dict], maxsize: int = 4,
                 per_block: bool = False) -> None:
        self.writer = writer
        self.bad_rows = bad_rows
        self.per_block = per_block
        self.error: BaseException | None = None
        self.blocks_written = 0
        self._queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self._thread = threading.Thread(target=self._run, name="spml-store-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self.error is not None:
                continue  # drain without writing after a failure
            block, feats, flips, bad = item
            try:
                if bad:
                    self.bad_rows.update({b["row"]: b for b in bad})
                    if self.per_block:
                        atomic_write_text(bad_rows_dir(self.writer) / f"block-{block:08d}.json",
                                          json.dumps(bad))
                    else:
                        record_bad_rows(self.writer, self.bad_rows)
                self.writer.write_block(block, feats, flips)
                self.blocks_written += 1
            except BaseException as err:  # re-raised on the main thread
                self.error = err

    def put(self, item: tuple) -> None:
        while self.error is None:
            with contextlib.suppress(queue.Full):
                self._queue.put(item, timeout=0.2)
                return
        raise self.error

    def close(self) -> None:
        """Write every queued block, stop the thread; re-raise a write error."""
        self._queue.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error


def record_bad_rows(writer: Any, bad_rows: dict[int, dict]) -> None:
    """Record the unreadable rows (``{row: record}``) in the store's attributes (the writer's
    own group, so that finalize(), which rewrites them from it, keeps them)."""
    rows = [bad_rows[r] for r in sorted(bad_rows)]
    writer.update_attrs({"bad_rows": rows, "n_bad_rows": len(rows)})


def open_writer(out: Path, index: DatasetIndex, backbone: Backbone, provenance: dict,
                config: Any, extra_attrs: dict) -> Any:  # config: runner.FeaturizeConfig
    """A fresh store, or the interrupted one at ``out`` when it was started the same way."""
    from probe.store import StoreError, create_store, is_store_dir, resume_store

    if out.exists() and not config.overwrite and is_store_dir(out):
        _explain_transform_change(
            out, backbone.name, provenance["transform"], provenance.get("embed"))
        writer = resume_store(out, provenance)
        if writer.dtype != config.dtype:
            raise StoreError(
                f"cannot resume {out}: it stores {writer.dtype} features, this run asks for "
                f"{config.dtype}; use the same --dtype or pass --overwrite")
        writer.check_same_rows(index, backbone.feature_dim, config.with_flip)
        return writer
    return create_store(out, index, feature_dim=backbone.feature_dim, with_flip=config.with_flip,
                        provenance=provenance, dtype=config.dtype, block_rows=config.block_rows,
                        overwrite=config.overwrite, extra_attrs=extra_attrs)


def _explain_transform_change(out: Path, backbone: str, transform: dict,
                              embed: str | None = None) -> None:
    """Name the transform entries that differ (decode path, precision, size, …) or another
    embedding (``--embed``) before the store's generic refusal, with the options that select
    them."""
    import zarr

    from probe.store import StoreError

    provenance = zarr.open_group(out, mode="r").attrs.get("provenance", {})
    if provenance.get("backbone") == backbone and provenance.get("embed") != embed:
        raise StoreError(
            f"cannot resume {out}: it holds the {provenance.get('embed')!r} embedding of "
            f"{backbone}, this run asks for {embed!r}; pass the same --embed, or --overwrite to "
            "start again, or choose another --out")
    stored = provenance.get("transform")
    now = json.loads(json.dumps(transform))
    if provenance.get("backbone") != backbone or not isinstance(stored, dict) or stored == now:
        return  # another backbone: the store's own refusal names that field
    keys = sorted(k for k in set(stored) | set(now) if stored.get(k) != now.get(k))
    diffs = "; ".join(f"{k}: store {stored.get(k)!r}, now {now.get(k)!r}" for k in keys)
    raise StoreError(
        f"cannot resume {out}: it was featurized with another transform ({diffs}). Re-run with "
        "the options that made it (--size, --decode, --precision, --compile, --no-flip, "
        "--backbone), or pass --overwrite to start again, or choose another --out")


def bad_rows_dir(writer: Any) -> Path:
    """Where the ranks of a distributed run keep their per-block bad-row records (merged into
    the attributes at the end)."""
    return Path(writer.path) / "spml-bad-rows"


def collect_block_bad_rows(writer: Any) -> dict[int, dict]:
    """The bad rows that the ranks of a distributed run recorded per block (``{row: record}``)."""
    return {int(b["row"]): dict(b) for path in sorted(bad_rows_dir(writer).glob("block-*.json"))
            for b in json.loads(path.read_text())}


def stored_bad_rows(writer: Any) -> dict[int, dict]:
    """Bad rows of the blocks written so far: the store's attribute plus, for an interrupted
    distributed run, the per-block records of its ranks."""
    return {**{int(b["row"]): dict(b) for b in writer.attrs.get("bad_rows", [])},
            **collect_block_bad_rows(writer)}


