"""The featurizer's reading and device steps (docs/design.md "The flow"; the run itself is
:mod:`featurize.extract.run`): reader threads load each image as the decode path wants it,
prefetched batches ahead; the main thread makes the normalised model input on the device.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from featurize.extract.images import (
    BadImageError,
    ImageTransform,
    batch_decode,
    cpu_decode,
    normalize,
    nvjpeg_decodable,
    pil_transformed,
    read_bytes,
    resize_batch,
)


@dataclass(frozen=True)
class Runtime:
    """The concrete choices ``auto`` settings resolve to on this machine."""

    device: torch.device
    decode: str  # "pil" | "torchvision"
    precision: str  # "fp32" | "bf16"
    batch_size: int
    workers: int
    compile: bool = False  # the backbone through torch.compile (--compile, where inductor runs)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def load_item(path: Path, rt: Runtime, transform: ImageTransform) -> tuple[str, Any]:
    """Reader-thread work for one image: ``("pixels", (S,S,3) uint8)`` on the PIL path,
    ``("jpeg", bytes)`` for the GPU batch decode, ``("image", (3,H,W) uint8 tensor)`` for a CPU
    decode, or ``("bad", message)``."""
    try:
        if rt.decode == "pil":
            return "pixels", pil_transformed(path, transform)
        data = read_bytes(path)
        if rt.cuda and nvjpeg_decodable(data):
            return "jpeg", data
        image = cpu_decode(data, path)
        # pinned here, so the main thread's upload is truly asynchronous (a copy from pageable
        # memory would first wait for all queued device work)
        return "image", image.pin_memory() if rt.cuda else image
    except BadImageError as err:
        return "bad", str(err)


def prefetch(pool: ThreadPoolExecutor, batches: Sequence[tuple[int, int, int]],
             paths: Sequence[Path], rt: Runtime, transform: ImageTransform, depth: int
             ) -> Iterator[tuple[tuple[int, int, int], list[tuple[str, Any]]]]:
    """Yield ``(batch, items)`` in order while the reader threads work ``depth`` batches ahead."""
    ahead: deque[tuple[tuple[int, int, int], list[Future]]] = deque()
    todo = iter(batches)

    def submit() -> None:
        batch = next(todo, None)
        if batch is not None:
            _, start, stop = batch
            ahead.append((batch, [pool.submit(load_item, paths[r], rt, transform)
                                  for r in range(start, stop)]))

    for _ in range(max(1, depth)):
        submit()
    while ahead:
        batch, futures = ahead.popleft()
        submit()
        yield batch, [f.result() for f in futures]


def model_input(items: list[tuple[str, Any]], paths: Sequence[Path], rt: Runtime,
                transform: ImageTransform) -> tuple[torch.Tensor, dict[int, str]]:
    """Normalised ``(B, 3, S, S)`` float32 input on the device, and ``{batch index: error}``
    of the images that could not be read or decoded (their pixels are zero)."""
    size, dev = transform.out_size, rt.device
    bad = {i: value for i, (kind, value) in enumerate(items) if kind == "bad"}
    if rt.decode == "pil":
        host = torch.empty((len(items), size, size, 3), dtype=torch.uint8, pin_memory=rt.cuda)
        view = host.numpy()
        for i, (kind, value) in enumerate(items):
            view[i] = value if kind == "pixels" else 0
        # NHWC → NCHW view: already channels_last in memory, as the CUDA model wants it
        batch = host.to(dev, non_blocking=True).permute(0, 3, 1, 2)
        return normalize(batch, transform), bad
    images: list[torch.Tensor | None] = [None] * len(items)
    jpeg_idx = [i for i, (kind, _) in enumerate(items) if kind == "jpeg"]
    if jpeg_idx:
        decoded = batch_decode([items[i][1] for i in jpeg_idx], [paths[i] for i in jpeg_idx], dev)
        for i, img in zip(jpeg_idx, decoded):
            if isinstance(img, BadImageError):
                bad[i] = str(img)
            else:
                images[i] = img
    for i, (kind, value) in enumerate(items):
        if kind == "image":
            images[i] = value.to(dev, non_blocking=True)
        elif i in bad:
            images[i] = torch.zeros((3, size, size), dtype=torch.uint8, device=dev)
    batch = resize_batch(images, transform)
    if channels_last(rt):
        batch = batch.contiguous(memory_format=torch.channels_last)
    return normalize(batch, transform), dict(sorted(bad.items()))


def backbone_forward(features: torch.nn.Module, rt: Runtime, with_flip: bool
                     ) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]:
    """``x -> (features, the flipped image's features or None)`` as a run computes them: bf16
    autocast with ``--precision bf16``, one ``torch.compile``-d module with ``--compile`` (fixed
    shapes: each batch size compiles once)."""
    model = torch.compile(features, dynamic=False) if rt.compile else features
    autocast = torch.autocast(rt.device.type, dtype=torch.bfloat16, enabled=rt.precision == "bf16")

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        with autocast:
            return model(x), model(torch.flip(x, dims=[-1])) if with_flip else None
    return forward


def channels_last(rt: Runtime) -> bool:
    """channels_last memory format: part of the CUDA bf16 fast path (tensor cores want NHWC)."""
    return rt.cuda and rt.precision == "bf16"


@contextlib.contextmanager
def device_mode(rt: Runtime):
    """cuDNN autotuning on CUDA; with fp32 also no TF32, so fp32 means fp32. Restored after."""
    if not rt.cuda:
        yield
        return
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32)
    cudnn.benchmark = True
    if rt.precision == "fp32":
        cudnn.allow_tf32 = matmul.allow_tf32 = False
    try:
        with torch.cuda.device(rt.device):
            yield
    finally:
        cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = saved


