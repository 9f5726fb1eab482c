"""``spml bench featurize``: decode, forward and end-to-end images/s of the featurize pipeline on
synthetic photo-like JPEGs, each after an untimed warm-up (docs/design.md, docs/performance.md).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import platform
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from featurize.backbones import RANDOM, Backbone
from featurize.extract.images import ImageTransform
from featurize.extract.reading import (
    backbone_forward,
    channels_last,
    device_mode,
    model_input,
    prefetch,
)
from featurize.extract.run import (
    FeaturizeConfig,
    Runtime,
    backbone_transform,
    featurize,
    load_configured,
    resolve_runtime,
    transform_mode,
)
from probe.errors import SpmlError
from probe.profiling import Profile
from probe.store.index import DatasetIndex, Phase

#: batches featurized end to end under the profiler (``BenchConfig.profile``)
PROFILED_BATCHES = 4


@dataclass(frozen=True)
class BenchConfig:
    """What ``spml bench featurize`` measures."""

    # random weights: speed does not depend on the weight values
    featurize: FeaturizeConfig = field(
        default_factory=lambda: FeaturizeConfig(weights=RANDOM, progress=False))
    n_images: int | None = None  # None: 4096 on CUDA (a few seconds at target speed), 24 on CPU
    width: int = 640  # COCO's typical photo (640×480, quality 90)
    height: int = 480
    unique_images: int = 64  # distinct JPEG files; rows cycle through them (decode cost is real)
    warmup_batches: int = 2  # untimed: cuDNN autotuning, allocator and decoder start-up
    forward_iters: int | None = None  # timed forward batches; None: 5 on CUDA, 1 on CPU (slow)
    seed: int = 0  # synthetic image content
    # also profile, untimed, a few batches end to end and the forward batches again
    # (probe.profiling): where the images/s target is missed, what takes the time
    profile: bool = False


def synthetic_photos(folder: Path, n: int, width: int, height: int, seed: int = 0) -> list[Path]:
    """Write ``n`` photo-like RGB JPEGs (smooth colour gradients, a few blobs with hard edges,
    noise; quality 90) of ``width``×``height`` into ``folder``; return their paths."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    fx, fy = xx / max(1, width - 1), yy / max(1, height - 1)
    corners = [w[..., None] for w in ((1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy)]
    paths = [folder / f"photo_{k:05d}.jpg" for k in range(n)]
    for path in paths:
        base = rng.uniform(0, 255, size=(4, 3)).astype(np.float32)  # the corners' colours
        img = sum(c * w for c, w in zip(base, corners))  # bilinear between them
        for _ in range(4):
            cx, cy = rng.uniform(0, width), rng.uniform(0, height)
            r = rng.uniform(0.05, 0.3) * min(width, height)
            img[(xx - cx) ** 2 + (yy - cy) ** 2 < r * r] = rng.uniform(0, 255, size=3)
        img += rng.normal(0, 8, size=img.shape)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, quality=90)
    return paths


def synthetic_index(paths: list[Path], n: int, tag: str) -> DatasetIndex:
    """``n`` rows cycling through ``paths``, all in the pool (one dummy class)."""
    rows = [paths[i % len(paths)] for i in range(n)]
    pool = Phase(image_ids=tuple(f"{tag}{i:06d}" for i in range(n)), paths=tuple(rows),
                 labels=np.ones((n, 1), dtype=np.uint8))
    empty = Phase(image_ids=(), paths=(), labels=np.zeros((0, 1), dtype=np.uint8))
    return DatasetIndex(name=f"bench-{tag}", class_names=("photo",), pool=pool, test=empty)


def _sync(rt: Runtime) -> None:
    if rt.cuda:
        torch.cuda.synchronize(rt.device)


def _forward_only(backbone: Backbone, rt: Runtime, size: int, with_flip: bool, batch: int,
                  iters: int, profile: bool = False) -> tuple[float, dict | None]:
    """images/s of the forward passes alone (normalised input already on the device), and with
    ``profile`` a :class:`~probe.profiling.Profile` summary of ``iters`` more, untimed."""
    x = torch.randn(batch, 3, size, size, device=rt.device)
    if channels_last(rt):
        x = x.contiguous(memory_format=torch.channels_last)
    step = functools.partial(backbone_forward(backbone.features, rt, with_flip), x)

    with torch.inference_mode(), device_mode(rt):
        step()  # warm-up
        _sync(rt)
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        _sync(rt)
        images_per_s = iters * batch / (time.perf_counter() - t0)
        if not profile:
            return images_per_s, None
        with Profile(rt.device) as prof:
            for _ in range(iters):
                step()
        return images_per_s, prof.summary


def _decode_only(paths: list[Path], rt: Runtime, transform: ImageTransform, n: int, depth: int
                 ) -> float:
    """images/s of reading + decoding + resizing + normalising ``n`` rows (cycling ``paths``)
    through the run's reader threads and decode path, batch by batch (the first batch untimed)."""
    rows = [paths[i % len(paths)] for i in range(n + rt.batch_size)]
    batches = [(0, a, min(a + rt.batch_size, len(rows)))
               for a in range(0, len(rows), rt.batch_size)]
    with ThreadPoolExecutor(rt.workers, "spml-bench-reader") as pool, device_mode(rt):
        t0, done = None, 0
        for (_, start, stop), items in prefetch(pool, batches, rows, rt, transform, depth):
            x, _ = model_input(items, rows[start:stop], rt, transform)
            if t0 is None:  # the first batch warms the decoder up
                _sync(rt)
                t0 = time.perf_counter()
            else:
                done += stop - start
        _sync(rt)
        del x
    return done / (time.perf_counter() - t0) if done else 0.0


def bench_featurize(config: BenchConfig | None = None) -> dict:
    """Run the benchmark; returns the measurements as a JSON-able dict."""
    config = config or BenchConfig()
    fc = config.featurize
    rt = resolve_runtime(fc)
    n = config.n_images or (4096 if rt.cuda else 24)
    if n < 1 or config.unique_images < 1:
        raise SpmlError(f"--images must be >= 1, got {n}")
    backbone = load_configured(fc)
    with tempfile.TemporaryDirectory(prefix="spml-bench-") as tmp:
        tmp_path = Path(tmp)
        t0 = time.perf_counter()
        photos = synthetic_photos(tmp_path / "images", min(n, config.unique_images), config.width,
                                  config.height, config.seed)
        write_s = time.perf_counter() - t0
        cfg = dataclasses.replace(fc, overwrite=True)
        # CUDA: whole batches (cuDNN autotunes per shape); CPU: one image (start-up only)
        warm = max(1, config.warmup_batches) * rt.batch_size if rt.cuda else 1
        featurize(synthetic_index(photos, warm, "warmup"), tmp_path / "warmup.zarr",
                  dataclasses.replace(cfg, progress=False), backbone=backbone)
        result = featurize(
            synthetic_index(photos, n, "timed"), tmp_path / "timed.zarr", cfg, backbone=backbone)
        transform = backbone_transform(backbone, fc.size, transform_mode(fc))
        decode = _decode_only(photos, rt, transform, n, fc.prefetch_batches)
        profiles: dict[str, dict | None] = {}
        if config.profile:  # a few batches end to end, after the timed run
            rows = min(n, PROFILED_BATCHES * rt.batch_size)
            with Profile(rt.device) as prof:
                featurize(synthetic_index(photos, rows, "profiled"), tmp_path / "profiled.zarr",
                          cfg, backbone=backbone)
            profiles["end_to_end"] = prof.summary
    iters = config.forward_iters or (5 if rt.cuda else 1)
    forward, profiles["forward"] = _forward_only(backbone, rt, transform.out_size,
                                                 fc.with_flip, rt.batch_size, iters,
                                                 config.profile)
    device_name = (torch.cuda.get_device_name(rt.device) if rt.cuda
                   else platform.processor() or platform.machine())
    report = {"images": n, "unique_files": len(photos),
              "image_size": f"{config.width}x{config.height}", "input_size": transform.out_size,
              "seconds": round(result.seconds, 3), "images_per_s": round(result.images_per_s, 1),
              "decode_images_per_s": round(decode, 1), "forward_images_per_s": round(forward, 1),
              "with_flip": fc.with_flip, "backbone": backbone.name, "weights": backbone.weights.id,
              "device": str(rt.device), "device_name": device_name, "decode": rt.decode,
              "precision": rt.precision, "compile": rt.compile, "batch_size": rt.batch_size,
              "workers": rt.workers, "torch_threads": torch.get_num_threads(),
              "torch": torch.__version__, "torchvision": importlib.metadata.version("torchvision"),
              "cuda": torch.version.cuda if rt.cuda else None,
              "driver": _nvidia_driver() if rt.cuda else None,
              "load_avg_1m": round(os.getloadavg()[0], 2),  # timings on a busy machine are noisy
              "cpu_count": os.cpu_count(), "synthetic_write_s": round(write_s, 2)}
    if config.profile:
        report["profile"] = profiles
    return report


def _nvidia_driver() -> str | None:
    """The NVIDIA driver version (nvidia-smi), for the README's record of a GPU figure."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
