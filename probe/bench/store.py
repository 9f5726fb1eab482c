"""``spml bench store``: how fast a COCO-sized feature store loads, and what its format costs.

On the COCO-shaped synthetic store of ``spml bench probe`` (about 1 GB of float16 features with
flips), from the page cache, medians over ``repeats``:

* ``load``: :meth:`probe.engine.data.ProbeData.from_store` through the store's read path (parallel
chunk
  reads straight into the tensors, a CRC-32C check per chunk);
* ``load_via_zarr``: the same tensors through zarr's read path, gather and concatenation;
* ``crc32c``: the checksum alone over all feature bytes, one thread;
* the features' bytes on disk, and zstd's ratio and decode speed on ``zstd_chunks`` chunks (the
  trade docs/protocol.md "The feature store" states).
"""

from __future__ import annotations

import os
import platform
import statistics
import timeit
from pathlib import Path
from typing import Any

import numpy as np

from probe.errors import SpmlError

__all__ = ["format_store_report", "run_store_bench"]


def _load_via_zarr(path: Path) -> Any:
    """The pre-checksum read path, kept here only as the bench's reference."""
    import torch
    import zarr

    from probe.store import open_store

    store = open_store(path)
    group = zarr.open_group(path, mode="r")

    def rows_of(name: str, rows: np.ndarray) -> torch.Tensor:
        lo, hi = int(rows.min()), int(rows.max())
        x = torch.from_numpy(group[name][lo : hi + 1][rows - lo])
        return torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], dim=1)

    train = store.split("train")
    out = torch.cat([rows_of("features", train), rows_of("features_flip", train)])
    return out, rows_of("features", store.split("val")), rows_of("features", store.split("test"))


def run_store_bench(*, repeats: int = 5, zstd_chunks: int = 8, cache_dir: str | Path | None = None,
                    progress: bool = True) -> dict[str, Any]:
    """Measure what the module docstring lists; returns the report (also printed as JSON)."""
    import google_crc32c
    import torch
    import zarr
    from numcodecs import Zstd
    from zarr.codecs import ZstdCodec

    from probe.bench.engine import synthetic_store
    from probe.engine.data import ProbeData
    from probe.store import open_store, verify_store

    if repeats < 1 or zstd_chunks < 1:
        raise SpmlError(f"--repeats and --zstd-chunks must be >= 1; got {repeats}, {zstd_chunks}")
    path = synthetic_store(cache_dir=cache_dir, progress=progress)
    store = open_store(path)
    report_v = verify_store(path)
    feature_arrays = [a for a in ("features", "features_flip") if a in report_v.arrays]
    feature_bytes = sum(
        f.stat().st_size for a in feature_arrays for f in (path / a).rglob("*") if f.is_file())
    raw_bytes = len(feature_arrays) * store.n_rows * store.feature_dim * 2

    def timed(fn: Any) -> list[float]:
        fn()  # page cache, lazy imports
        return timeit.repeat(fn, repeat=repeats, number=1)

    load = timed(lambda: ProbeData.from_store(path))
    via_zarr = timed(lambda: _load_via_zarr(path))
    a, b = ProbeData.from_store(path), _load_via_zarr(path)
    same = all(torch.equal(x, y) for x, y in zip((a.train_x, a.val_x, a.test_x), b))
    feats = store.features()
    crc = timed(lambda: google_crc32c.value(feats.view(np.uint8)))

    # zstd on a few chunks: ratio and decode speed (what compressing the features would cost)
    group = zarr.open_group(path, mode="r")
    rows = min(store.n_rows, zstd_chunks * int(store.attrs["block_rows"]))
    sample = group["features"][:rows]
    tmp = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    z = tmp.create_array("f", shape=sample.shape, chunks=group["features"].chunks,
                         dtype=sample.dtype, compressors=[ZstdCodec(level=0)])
    z[:] = sample
    block = int(store.attrs["block_rows"])
    zstd_bytes = sum(len(Zstd(level=0).encode(np.ascontiguousarray(sample[r : r + block])))
                     for r in range(0, rows, block))
    zstd_read = timed(lambda: z[:])
    return {
        "machine": {"platform": platform.platform(), "cpu": platform.processor()
                    or platform.machine(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "loadavg": os.getloadavg()},
        "store": {"path": str(path), "rows": store.n_rows, "dim": store.feature_dim,
                  "dtype": store.dtype, "flip": store.has_flip,
                  "checksummed": not report_v.unchecksummed},
        "repeats": repeats, "load_s": statistics.median(load), "load_all_s": load,
        "load_via_zarr_s": statistics.median(via_zarr), "load_via_zarr_all_s": via_zarr,
        "same_tensors": same, "load_gb_per_s": raw_bytes / 1e9 / statistics.median(load),
        "crc32c_s": statistics.median(crc), "features_disk_bytes": feature_bytes,
        "features_raw_bytes": raw_bytes, "zstd_sample_chunks": zstd_chunks,
        "zstd_size_ratio": zstd_bytes / sample.nbytes,
        "zstd_read_mb_per_s": sample.nbytes / 1e6 / statistics.median(zstd_read)}


def format_store_report(r: dict[str, Any]) -> str:
    m, s = r["machine"], r["store"]
    load1, load5, _ = m["loadavg"]
    return "\n".join([
        f"store bench on {m['cpu']} ({m['cpus']} CPUs, {m['torch_threads']} torch threads), "
        f"load average {load1:.2f} / {load5:.2f} (1 / 5 min)",
        f"store: {s['rows']} rows x {s['dim']} {s['dtype']}, flip={s['flip']}, "
        f"checksummed={s['checksummed']}; median of {r['repeats']} loads from the page cache",
        "",
        f"load (ProbeData.from_store, checksums checked) {r['load_s']:8.3f} s  "
        f"({r['load_gb_per_s']:.2f} GB/s of features)",
        f"load the previous way (zarr read path)         {r['load_via_zarr_s']:8.3f} s  "
        f"(same tensors: {r['same_tensors']})",
        f"CRC-32C of all features, one thread            {r['crc32c_s']:8.3f} s",
        f"features on disk {r['features_disk_bytes'] / 1e6:.0f} MB (values "
        f"{r['features_raw_bytes'] / 1e6:.0f} MB; the last chunk padded, 4 B of CRC a chunk); "
        "zstd would store "
        f"{r['zstd_size_ratio']:.0%} of that and decode at {r['zstd_read_mb_per_s']:.0f} MB/s "
        f"(measured on {r['zstd_sample_chunks']} chunks)"])

