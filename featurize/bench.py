"""``spml bench featurize``: images/s of the featurize pipeline on this machine (docs/design.md
"What fast means": ≥ 2,500 images/s at 448² on one H100 with bf16, channels_last and GPU JPEG
decode).

Synthetic photo-like JPEGs (default 500×375, the typical VOC/COCO size: smooth colour fields,
edges and sensor noise, quality 90) are written to a temporary folder and featurized through
the real pipeline -- reader threads, decode, resize, forward + flipped forward, store writer --
into a temporary store. A short warm-up run (cuDNN autotuning, allocator, nvJPEG start-up) is
not timed. Random weights are used by default: speed does not depend on the weight values.
On CUDA, ``model_only_images_per_s`` times the forward passes alone on an already-normalised
batch (the run's batch size, 5 iterations), to tell a decode/IO bottleneck from a compute one;
on a CPU it is not measured (None): there the forward dominates anyway.
"""

from __future__ import annotations

import dataclasses
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from featurize.backbones import RANDOM, Backbone, load_backbone
from featurize.runner import (
    FeaturizeConfig,
    Runtime,
    backbone_transform,
    featurize,
    resolve_runtime,
)
from probe.store.index import DatasetIndex, Phase


@dataclass(frozen=True)
class BenchConfig:
    """What ``spml bench featurize`` measures."""

    # random weights: speed does not depend on the weight values
    featurize: FeaturizeConfig = field(
        default_factory=lambda: FeaturizeConfig(weights=RANDOM, progress=False)
    )
    n_images: int | None = None  # None: 4096 on CUDA (a few seconds at target speed), 24 on CPU
    width: int = 500  # typical VOC / COCO photo
    height: int = 375
    unique_images: int = 64  # distinct JPEG files; rows cycle through them (decode cost is real)
    warmup_batches: int = 2  # untimed: cuDNN autotuning, allocator and decoder start-up
    seed: int = 0  # synthetic image content


def synthetic_photos(folder: Path, n: int, width: int, height: int, seed: int = 0) -> list[Path]:
    """Write ``n`` photo-like RGB JPEGs (smooth colour gradients, a few blobs with hard edges,
    noise; quality 90) of ``width``×``height`` into ``folder``; return their paths."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    paths = []
    for k in range(n):
        base = rng.uniform(0, 255, size=(2, 2, 3)).astype(np.float32)
        fx, fy = xx / max(1, width - 1), yy / max(1, height - 1)
        img = (
            base[0, 0] * ((1 - fx) * (1 - fy))[..., None]
            + base[0, 1] * (fx * (1 - fy))[..., None]
            + base[1, 0] * ((1 - fx) * fy)[..., None]
            + base[1, 1] * (fx * fy)[..., None]
        )
        for _ in range(4):
            cx, cy = rng.uniform(0, width), rng.uniform(0, height)
            r = rng.uniform(0.05, 0.3) * min(width, height)
            mask = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
            img[mask] = rng.uniform(0, 255, size=3)
        img += rng.normal(0, 8, size=img.shape)
        path = folder / f"photo_{k:05d}.jpg"
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(path)
    return paths


def _index(paths: list[Path], n: int, tag: str) -> DatasetIndex:
    """``n`` rows cycling through ``paths``, all in the pool (one dummy class)."""
    rows = [paths[i % len(paths)] for i in range(n)]
    pool = Phase(
        image_ids=tuple(f"{tag}{i:06d}" for i in range(n)),
        paths=tuple(rows),
        labels=np.ones((n, 1), dtype=np.uint8),
    )
    empty = Phase(image_ids=(), paths=(), labels=np.zeros((0, 1), dtype=np.uint8))
    return DatasetIndex(name=f"bench-{tag}", class_names=("photo",), pool=pool, test=empty)


def _model_only(
    backbone: Backbone, rt: Runtime, size: int, with_flip: bool, batch: int, iters: int
) -> float:
    """images/s of the forward passes alone (normalised input already on the device)."""
    x = torch.randn(batch, 3, size, size, device=rt.device)
    if rt.cuda:
        x = x.contiguous(memory_format=torch.channels_last)
    autocast = torch.autocast(rt.device.type, dtype=torch.bfloat16, enabled=rt.precision == "bf16")

    def step() -> None:
        with autocast:
            backbone.features(x)
            if with_flip:
                backbone.features(torch.flip(x, dims=[-1]))

    with torch.inference_mode():
        step()  # warm-up
        if rt.cuda:
            torch.cuda.synchronize(rt.device)
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        if rt.cuda:
            torch.cuda.synchronize(rt.device)
        return iters * batch / (time.perf_counter() - t0)


def bench_featurize(config: BenchConfig | None = None) -> dict:
    """Run the benchmark; returns the measurements as a JSON-able dict."""
    config = config or BenchConfig()
    fc = config.featurize
    rt = resolve_runtime(fc)
    n = config.n_images or (4096 if rt.cuda else 24)
    if n < 1 or config.unique_images < 1:
        raise ValueError(f"--images must be >= 1, got {n}")
    backbone = load_backbone(
        fc.backbone, fc.weights, seed=fc.weights_seed, download=fc.download, size=fc.size
    )
    with tempfile.TemporaryDirectory(prefix="spml-bench-") as tmp:
        tmp_path = Path(tmp)
        t0 = time.perf_counter()
        photos = synthetic_photos(
            tmp_path / "images",
            min(n, config.unique_images),
            config.width,
            config.height,
            config.seed,
        )
        write_s = time.perf_counter() - t0
        cfg = dataclasses.replace(fc, overwrite=True)
        # CUDA: whole batches (cuDNN autotunes per shape); CPU: one image (start-up only)
        warm = max(1, config.warmup_batches) * rt.batch_size if rt.cuda else 1
        featurize(
            _index(photos, warm, "warmup"),
            tmp_path / "warmup.zarr",
            dataclasses.replace(cfg, progress=False),
            backbone=backbone,
        )
        result = featurize(
            _index(photos, n, "timed"), tmp_path / "timed.zarr", cfg, backbone=backbone
        )
    transform = backbone_transform(backbone, fc.size)
    model_only = (
        round(_model_only(backbone, rt, transform.size, fc.with_flip, rt.batch_size, 5), 1)
        if rt.cuda
        else None  # a CPU run is compute-bound anyway (~10 ms decode vs ~1 s forward)
    )
    return {
        "images": n,
        "unique_files": len(photos),
        "image_size": f"{config.width}x{config.height}",
        "input_size": fc.size,
        "seconds": round(result.seconds, 3),
        "images_per_s": round(result.images_per_s, 1),
        "model_only_images_per_s": model_only,
        "with_flip": fc.with_flip,
        "backbone": backbone.name,
        "weights": backbone.weights.id,
        "device": str(rt.device),
        "device_name": torch.cuda.get_device_name(rt.device)
        if rt.cuda
        else platform.processor() or platform.machine(),
        "decode": rt.decode,
        "precision": rt.precision,
        "batch_size": rt.batch_size,
        "workers": rt.workers,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "synthetic_write_s": round(write_s, 2),
    }
