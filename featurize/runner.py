"""The featurize pipeline: run a frozen backbone once over a dataset into a feature store
(GitHub issue 4; docs/protocol.md steps 6-7 and "The feature store").

Per image: decode → resize to S×S (bilinear, antialias, aspect not kept, no crop) → ``/255`` →
normalise → backbone → pooled features; plus the features of the horizontally flipped input
(``torch.flip(x, dims=[-1])`` on the device, one extra forward), which is exactly the
training-time random flip for a frozen backbone.

Pipeline (the same code on CPU and CUDA)::

    reader threads ──(file bytes / decoded pixels, prefetched N batches ahead)──▶ main thread:
    [GPU: batched nvJPEG decode, resize] → normalise → forward (+ flipped) ─(async D2H copy,
    CUDA events)─▶ block buffers ──(queue)──▶ writer thread: StoreWriter.write_block

On CUDA the forward runs under ``torch.inference_mode`` with bf16 autocast and channels_last;
the host never waits for the batch it just launched (it waits on the event of the batch two
back), and writing to disk happens on its own thread. On CPU the same loop runs in float32.

Resume: blocks (``block_rows`` rows, the store's chunk rows) are written whole and marked done;
re-running the same command continues with the pending blocks. A different backbone, weights or
transform for an existing store is refused. Unreadable images stop the run with an error naming
the file, unless ``skip_bad``: then their features are zero and the store's ``bad_rows``
attribute lists them (``{"row", "image_id", "path", "error"}``; ``n_bad_rows`` counts them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shutil
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from featurize.backbones import DEFAULT_BACKBONE, Backbone, load_backbone
from featurize.images import (
    BadImageError,
    ImageTransform,
    batch_decode,
    cpu_decode,
    normalize,
    nvjpeg_decodable,
    pil_resized,
    read_bytes,
    resize_batch,
)
from featurize.specs import DECODE_CHOICES, PRECISION_CHOICES
from probe.errors import MissingPathError, SpmlError
from probe.io import atomic_write_text
from probe.progress import Progress
from probe.store.index import DatasetIndex

# The GPU fast path (batched nvJPEG decode on the device, bf16 autocast, channels_last) ran on an
# H100 on 2026-11-25: 1,323 vs 199 images/s for the reference path, features within cosine
# 0.999 of the reference (README "On a GPU"). The ``auto`` settings still choose the reference
# path (PIL decode, fp32) on CUDA: whether a probe trained on bf16 features lands within 0.1 mAP
# of the reference needs a real dataset and pretrained weights, and has not been run. The fast
# path is selected with ``--decode torchvision --precision bf16``; set True once that is checked.
GPU_FAST_PATH_MEASURED: bool = False


@dataclass(frozen=True)
class FeaturizeConfig:
    """Settings of one featurize run (``spml featurize`` options)."""

    backbone: str = DEFAULT_BACKBONE  # the protocol's ResNet-50
    weights: str | None = None  # None: the backbone's standard pretrained weights
    weights_seed: int = 0  # seeds weights="random" (tests and benchmarks only)
    download: bool = False  # weights are only fetched when asked: offline machines stay honest
    size: int = 448  # docs/protocol.md step 6: 448×448
    device: str = "auto"  # CUDA when available, else CPU
    batch_size: int | None = None  # None: 256 on CUDA (fills an H100), 16 on CPU (low memory)
    decode: str = "auto"  # auto: pil (the reference) until the GPU path is measured (above)
    precision: str = "auto"  # auto: fp32 (exact) until the GPU path is measured (above)
    with_flip: bool = True  # keep flipped-image features: the protocol's only augmentation
    dtype: str = "float16"  # store dtype (docs/protocol.md store: float16 default)
    block_rows: int = 1024  # rows per store chunk = the unit of resume
    workers: int | None = None  # reader threads; None: min(16, CPU count)
    prefetch_batches: int = 4  # batches the readers run ahead of the model
    skip_bad: bool = False  # unreadable image: error (default) or zero features + bad_rows
    overwrite: bool = False  # never replace an existing store unless asked
    progress: bool = True  # progress on stderr (probe.progress: bar or log lines)


@dataclass(frozen=True)
class Runtime:
    """The concrete choices ``auto`` settings resolve to on this machine."""

    device: torch.device
    decode: str  # "pil" | "torchvision"
    precision: str  # "fp32" | "bf16"
    batch_size: int
    workers: int

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


@dataclass(frozen=True)
class FeaturizeResult:
    """What a run did (``spml featurize`` prints it; ``spml bench featurize`` times it)."""

    store_path: Path
    n_rows: int
    rows_done: int  # rows featurized by this run (resumed blocks excluded)
    blocks_done: int
    blocks_resumed: int  # blocks that were already written before this run
    bad_rows: list[dict] = field(default_factory=list)
    seconds: float = 0.0  # from the first batch to the last block written
    images_per_s: float = 0.0
    device: str = "cpu"
    decode: str = "pil"
    precision: str = "fp32"
    batch_size: int = 0
    backbone: str = DEFAULT_BACKBONE
    weights: str = ""
    world_size: int = 1  # processes of a torch.distributed run (rows/blocks count them all)


def resolve_runtime(config: FeaturizeConfig) -> Runtime:
    """Turn the ``auto`` settings into concrete ones; bad values are a ValueError."""
    if config.decode not in DECODE_CHOICES:
        raise SpmlError(f"--decode must be one of {DECODE_CHOICES}, got {config.decode!r}")
    if config.precision not in PRECISION_CHOICES:
        raise SpmlError(
            f"--precision must be one of {PRECISION_CHOICES}, got {config.precision!r}"
        )
    name = config.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SpmlError(
            f"--device: {config.device!r} is not a device (auto, cpu, cuda, cuda:1)"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpmlError(f"--device {config.device}: CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise SpmlError(f"--device: only cpu and cuda are supported, got {config.device!r}")
    cuda = device.type == "cuda"
    fast = cuda and GPU_FAST_PATH_MEASURED
    decode = config.decode if config.decode != "auto" else ("torchvision" if fast else "pil")
    precision = config.precision if config.precision != "auto" else ("bf16" if fast else "fp32")
    batch_size = config.batch_size or (256 if cuda else 16)
    if batch_size < 1:
        raise SpmlError(f"--batch-size must be >= 1, got {batch_size}")
    workers = config.workers or min(16, os.cpu_count() or 1)
    if workers < 1:
        raise SpmlError(f"--workers must be >= 1, got {workers}")
    return Runtime(device, decode, precision, int(batch_size), int(workers))


def backbone_transform(backbone: Backbone, size: int) -> ImageTransform:
    """The image transform for ``backbone``: protocol size, the weights' own mean/std."""
    return ImageTransform(size=size, mean=backbone.spec.mean, std=backbone.spec.std)


def describe_transform(transform: ImageTransform, rt: Runtime, with_flip: bool) -> dict:
    """The provenance ``transform`` record: everything between the file and the features that
    can change their values (resume refuses a store made with a different one)."""
    out = transform.describe()
    out["decode"] = (
        "PIL (reference: open, convert RGB, resize BILINEAR)"
        if rt.decode == "pil"
        else (
            "torchvision nvJPEG batched + CPU fallback; torch antialiased bilinear resize"
            if rt.cuda
            else "torchvision libjpeg-turbo/libpng; torch antialiased bilinear resize"
        )
    )
    out["compute"] = "bf16 autocast, channels_last" if rt.precision == "bf16" else "float32"
    out["flip"] = "torch.flip(x, dims=[-1]) of the model input" if with_flip else None
    return out


# ----------------------------------------------------------------------------- reading


def _load_item(path: Path, rt: Runtime, size: int) -> tuple[str, Any]:
    """Reader-thread work for one image: ``("pixels", (S,S,3) uint8)`` on the PIL path,
    ``("jpeg", bytes)`` for the GPU batch decode, ``("image", (3,H,W) uint8 tensor)`` for a CPU
    decode, or ``("bad", message)``."""
    try:
        if rt.decode == "pil":
            return "pixels", pil_resized(path, size)
        data = read_bytes(path)
        if rt.cuda and nvjpeg_decodable(data):
            return "jpeg", data
        image = cpu_decode(data, path)
        # pinned here, so the main thread's upload is truly asynchronous (a copy from pageable
        # memory would first wait for all queued device work)
        return "image", image.pin_memory() if rt.cuda else image
    except BadImageError as err:
        return "bad", str(err)


def _prefetch(
    pool: ThreadPoolExecutor,
    batches: Sequence[tuple[int, int, int]],
    paths: Sequence[Path],
    rt: Runtime,
    size: int,
    depth: int,
) -> Iterator[tuple[tuple[int, int, int], list[tuple[str, Any]]]]:
    """Yield ``(batch, items)`` in order while the reader threads work ``depth`` batches ahead."""
    ahead: deque[tuple[tuple[int, int, int], list[Future]]] = deque()
    todo = iter(batches)

    def submit() -> None:
        batch = next(todo, None)
        if batch is not None:
            _, start, stop = batch
            ahead.append(
                (batch, [pool.submit(_load_item, paths[r], rt, size) for r in range(start, stop)])
            )

    for _ in range(max(1, depth)):
        submit()
    while ahead:
        batch, futures = ahead.popleft()
        submit()
        yield batch, [f.result() for f in futures]


# ----------------------------------------------------------------------------- the device


def _model_input(
    items: list[tuple[str, Any]], paths: Sequence[Path], rt: Runtime, transform: ImageTransform
) -> tuple[torch.Tensor, dict[int, str]]:
    """Normalised ``(B, 3, S, S)`` float32 input on the device, and ``{batch index: error}``
    of the images that could not be read or decoded (their pixels are zero)."""
    size, dev = transform.size, rt.device
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
    batch = resize_batch(images, size)
    if _channels_last(rt):
        batch = batch.contiguous(memory_format=torch.channels_last)
    return normalize(batch, transform), dict(sorted(bad.items()))


def _channels_last(rt: Runtime) -> bool:
    """channels_last memory format: part of the CUDA bf16 fast path (tensor cores want NHWC)."""
    return rt.cuda and rt.precision == "bf16"


@contextlib.contextmanager
def _device_mode(rt: Runtime):
    """cuDNN autotuning on CUDA; with fp32 also no TF32, so fp32 means fp32. Restored after."""
    if not rt.cuda:
        yield
        return
    saved = (
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.matmul.allow_tf32,
    )
    torch.backends.cudnn.benchmark = True
    if rt.precision == "fp32":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.cuda.device(rt.device):
            yield
    finally:
        (
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cuda.matmul.allow_tf32,
        ) = saved


# ----------------------------------------------------------------------------- writing


class _BlockWriter:
    """Writer thread: takes finished blocks from a queue and writes them through the store's
    crash-safe writer, so disk I/O never holds up the device loop. ``bad_rows`` are recorded
    before the block is marked done: in the store's attributes, or with ``per_block`` (the
    ranks of a distributed run, which must not rewrite the shared attributes at once) in a
    small JSON file per block that rank 0 merges into the attributes at the end."""

    def __init__(
        self, writer: Any, bad_rows: dict[int, dict], maxsize: int = 4, per_block: bool = False
    ) -> None:
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
                        atomic_write_text(
                            _bad_rows_dir(self.writer) / f"block-{block:08d}.json",
                            json.dumps(bad),
                        )
                    else:
                        _record_bad_rows(self.writer, self.bad_rows)
                self.writer.write_block(block, feats, flips)
                self.blocks_written += 1
            except BaseException as err:  # re-raised on the main thread
                self.error = err

    def put(self, item: tuple) -> None:
        while True:
            if self.error is not None:
                raise self.error
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """Write every queued block, stop the thread; re-raise a write error."""
        self._queue.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error


def _record_bad_rows(writer: Any, bad_rows: dict[int, dict]) -> None:
    # The store writer's own zarr group, so finalize() (which rewrites the attributes from
    # the same in-memory group) keeps them.
    rows = [bad_rows[r] for r in sorted(bad_rows)]
    writer.update_attrs({"bad_rows": rows, "n_bad_rows": len(rows)})


def _open_writer(
    out: Path,
    index: DatasetIndex,
    backbone: Backbone,
    provenance: dict,
    config: FeaturizeConfig,
    extra_attrs: dict,
) -> Any:
    """A fresh store, or the interrupted one at ``out`` when it was started the same way."""
    from probe.store import (
        StoreError,
        create_store,
        is_store_dir,
        resume_store,
    )

    if out.exists() and not config.overwrite and is_store_dir(out):
        _explain_transform_change(out, backbone.name, provenance["transform"])
        writer = resume_store(out, provenance)
        if writer.dtype != config.dtype:
            raise StoreError(
                f"cannot resume {out}: it stores {writer.dtype} features, this run asks for "
                f"{config.dtype}; use the same --dtype or pass --overwrite"
            )
        writer.check_same_rows(index, backbone.feature_dim, config.with_flip)
        return writer
    return create_store(
        out,
        index,
        feature_dim=backbone.feature_dim,
        with_flip=config.with_flip,
        provenance=provenance,
        dtype=config.dtype,
        block_rows=config.block_rows,
        overwrite=config.overwrite,
        extra_attrs=extra_attrs,
    )


def _explain_transform_change(out: Path, backbone: str, transform: dict) -> None:
    """Name the transform entries that differ (decode path, precision, size, …) before the
    store's generic refusal, with the options that select them."""
    import zarr

    from probe.store import StoreError

    provenance = zarr.open_group(out, mode="r").attrs.get("provenance", {})
    stored = provenance.get("transform")
    now = json.loads(json.dumps(transform))
    if provenance.get("backbone") != backbone or not isinstance(stored, dict) or stored == now:
        return  # another backbone: the store's own refusal names that field
    keys = sorted(k for k in set(stored) | set(now) if stored.get(k) != now.get(k))
    diffs = "; ".join(f"{k}: store {stored.get(k)!r}, now {now.get(k)!r}" for k in keys)
    raise StoreError(
        f"cannot resume {out}: it was featurized with another transform ({diffs}). Re-run with "
        "the options that made it (--size, --decode, --precision, --no-flip, --backbone), or "
        "pass --overwrite to start again, or choose another --out"
    )


# ----------------------------------------------------------------------------- the run


class RankFailed(SpmlError):
    """Another rank of a distributed featurize run failed (its message is included)."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in a ``torch.distributed`` featurize run (``torchrun``; issue 13).

    Every rank runs the same command; rank 0 creates (or resumes) the store, then rank ``r`` of
    ``world`` featurizes the pending blocks ``r, r + world, …`` (disjoint row blocks of one
    store) and rank 0 marks the store complete once every rank is done. The store is shared
    through the file system (one machine, or a network file system across machines).
    """

    rank: int = 0
    world: int = 1
    local_rank: int = 0  # picks cuda:<local_rank> on a machine with several GPUs

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def agree(self, error: BaseException | None, value: Any = None) -> Any:
        """Collective: every rank reports how its part went; raise on every rank if any failed
        (so no rank waits forever for one that stopped with an error). Returns rank 0's
        ``value`` on every rank."""
        reports = self.gather((None if error is None else f"{error}", value))
        if error is not None:
            raise error
        failed = [(r, msg) for r, (msg, _) in enumerate(reports) if msg is not None]
        if failed:
            r, msg = failed[0]
            advice = ("" if "resum" in msg else
                      ". The blocks finished so far are kept: re-run the same command to resume")
            raise RankFailed(f"featurize rank {r} of {self.world} failed: {msg}{advice}")
        return reports[0][1]

    def gather(self, value: Any) -> list[Any]:
        """Collective: ``value`` of every rank, in rank order."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist

        reports: list[Any] = [None] * self.world
        dist.all_gather_object(reports, value)
        return reports


def current_ranks() -> Ranks:
    """The ranks of the initialised default process group, or a single process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return Ranks()
    return Ranks(
        rank=dist.get_rank(),
        world=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", dist.get_rank())),
    )


@contextlib.contextmanager
def distributed_from_env() -> Iterator[Ranks]:
    """Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) join the process group for
    the run (gloo: only a few small messages are exchanged, so CPU and GPU machines alike);
    otherwise one process. The group is left again at the end."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    import torch.distributed as dist

    if world <= 1 or dist.is_initialized():
        yield current_ranks()
        return
    dist.init_process_group("gloo")
    try:
        yield current_ranks()
    finally:
        dist.destroy_process_group()


def featurize(
    index: DatasetIndex,
    out: str | Path,
    config: FeaturizeConfig | None = None,
    *,
    backbone: Backbone | None = None,
    ranks: Ranks | None = None,
) -> FeaturizeResult:
    """Featurize every image of ``index`` (pool rows, then test rows) into the store ``out``.

    Weights are resolved before anything is written (a missing file is an error naming where to
    put it). An existing incomplete store made the same way is resumed; a complete one, or one
    made differently, is an error suggesting ``overwrite``. ``backbone`` reuses a loaded
    backbone (it must match ``config.backbone``). ``ranks`` (default: the initialised
    ``torch.distributed`` group, if any) splits the blocks between processes (:class:`Ranks`);
    the result then counts the rows and blocks of all ranks.
    """
    config = config or FeaturizeConfig()
    ranks = ranks or current_ranks()
    if ranks.distributed and config.device in ("auto", "cuda") and torch.cuda.is_available():
        config = dataclasses.replace(config, device=f"cuda:{ranks.local_rank}")
    rt = resolve_runtime(config)
    out = Path(out)
    if backbone is None:
        backbone = load_backbone(
            config.backbone,
            config.weights,
            seed=config.weights_seed,
            download=config.download,
            size=config.size,
        )
    elif backbone.name != config.backbone:
        raise SpmlError(
            f"backbone {backbone.name!r} given but the config says {config.backbone!r}"
        )
    transform = backbone_transform(backbone, config.size)
    paths = [Path(p) for p in (*index.pool.paths, *index.test.paths)]
    ids = [*index.pool.image_ids, *index.test.image_ids]
    if not config.skip_bad:
        missing = [p for p in paths if not os.path.isfile(p)]  # os.path: fast for 100k files
        if missing:
            shown = "".join(f"\n  {p}" for p in missing[:20]) + (
                f"\n  ... and {len(missing) - 20} more" if len(missing) > 20 else "")
            raise MissingPathError(
                f"{len(missing)} of {len(paths)} image files of dataset '{index.name}' are "
                "missing; restore them, or pass --skip-bad to store zero features for them "
                f"(listed in the store's bad_rows):{shown}"
            )
    run = {"device": str(rt.device), "batch_size": rt.batch_size, "tool": "spml featurize"}
    if ranks.distributed:
        run["world_size"] = ranks.world
    provenance = {
        **backbone.provenance(),
        "transform": describe_transform(transform, rt, config.with_flip),
        "source": f"images of dataset '{index.name}' under {index.root}",
        "run": run,
    }
    extra = {"weights_random": True} if backbone.weights.random else {}
    writer, error, pending = None, None, None
    if ranks.rank == 0:
        try:
            writer = _open_writer(out, index, backbone, provenance, config, extra)
            pending = writer.pending_blocks()
        except Exception as err:
            error = err
    # the other ranks join only a store that rank 0 opened, and take its list of pending
    # blocks (read before anyone writes: a list read later would miss rank 0's new blocks)
    pending = ranks.agree(error, pending)
    if writer is None:
        from probe.store import join_store

        writer = join_store(out)
    blocks_resumed = writer.n_blocks - len(pending)
    mine = pending[ranks.rank :: ranks.world]
    batches = [
        (b, start, min(start + rt.batch_size, sl.stop))
        for b in mine
        for sl in [writer.block_slice(b)]
        for start in range(sl.start, sl.stop, rt.batch_size)
    ]
    rows_todo = sum(stop - start for _, start, stop in batches)
    bad_rows = _stored_bad_rows(writer)
    backbone.to(rt.device, channels_last=_channels_last(rt))
    where = f"{rt.device}, rank {ranks.rank}/{ranks.world}" if ranks.distributed else rt.device
    bar = Progress(
        rows_todo,
        f"featurize {index.name} ({backbone.name}, {where})",
        "img",
        enabled=config.progress,
    )
    block_writer = _BlockWriter(writer, bad_rows, per_block=ranks.distributed)
    t0 = time.perf_counter()
    error = None
    try:
        with _device_mode(rt), ThreadPoolExecutor(rt.workers, "spml-reader") as pool:
            try:
                _run_batches(
                    batches,
                    paths,
                    ids,
                    rt,
                    transform,
                    backbone,
                    writer,
                    block_writer,
                    config,
                    pool,
                    bar,
                )
            finally:
                pool.shutdown(wait=False, cancel_futures=True)
    except Exception as err:  # told to the other ranks first (Ctrl-C / kill: torchrun's job)
        error = err
    finally:
        bar.close()
        try:
            block_writer.close()  # blocks finished before an error or Ctrl-C are still saved
        except Exception as err:
            error = error or err
    seconds = time.perf_counter() - t0
    ranks.agree(error)
    counts = ranks.gather((rows_todo, block_writer.blocks_written, seconds))
    rows_all, blocks_all = (sum(c[i] for c in counts) for i in (0, 1))
    seconds = max(c[2] for c in counts)  # the run lasts as long as its slowest rank
    error = None
    if ranks.rank == 0:
        try:
            bad_rows.update(_collect_block_bad_rows(writer))
            if bad_rows:
                _record_bad_rows(writer, bad_rows)
            writer.finalize()
            shutil.rmtree(_bad_rows_dir(writer), ignore_errors=True)
        except Exception as err:
            error = err
    ranks.agree(error)  # every rank returns once the store is complete
    if ranks.rank != 0:  # rank 0 merged every rank's bad rows into the store's attributes
        from probe.store import open_store

        bad_rows = {int(b["row"]): dict(b) for b in open_store(out).attrs.get("bad_rows", [])}
    bad = [bad_rows[r] for r in sorted(bad_rows)]
    return FeaturizeResult(
        store_path=out,
        n_rows=writer.n_rows,
        rows_done=int(rows_all),
        blocks_done=int(blocks_all),
        blocks_resumed=blocks_resumed,
        bad_rows=bad,
        seconds=seconds,
        images_per_s=rows_all / seconds if seconds > 0 else 0.0,
        device=str(rt.device),
        decode=rt.decode,
        precision=rt.precision,
        batch_size=rt.batch_size,
        backbone=backbone.name,
        weights=backbone.weights.id,
        world_size=ranks.world,
    )


_BAD_ROWS_DIR = "spml-bad-rows"  # per-block records of a distributed run, merged at the end


def _bad_rows_dir(writer: Any) -> Path:
    return Path(writer.path) / _BAD_ROWS_DIR


def _collect_block_bad_rows(writer: Any) -> dict[int, dict]:
    """The bad rows that the ranks of a distributed run recorded per block (``{row: record}``)."""
    out: dict[int, dict] = {}
    folder = _bad_rows_dir(writer)
    for path in sorted(folder.glob("block-*.json")) if folder.is_dir() else ():
        out.update({int(b["row"]): dict(b) for b in json.loads(path.read_text())})
    return out


def _stored_bad_rows(writer: Any) -> dict[int, dict]:
    """Bad rows of the blocks written so far: the store's attribute plus, for an interrupted
    distributed run, the per-block records of its ranks."""
    stored = {int(b["row"]): dict(b) for b in writer.attrs.get("bad_rows", [])}
    return {**stored, **_collect_block_bad_rows(writer)}


def _run_batches(
    batches: list[tuple[int, int, int]],
    paths: list[Path],
    ids: list[str],
    rt: Runtime,
    transform: ImageTransform,
    backbone: Backbone,
    writer: Any,
    block_writer: _BlockWriter,
    config: FeaturizeConfig,
    pool: ThreadPoolExecutor,
    bar: Any,
) -> None:
    """The device loop: at most two batches in flight, results gathered into blocks."""
    dim = backbone.feature_dim
    blocks: dict[int, dict] = {}  # block -> {"feats", "flips", "missing", "bad", "start"}
    in_flight: deque[tuple] = deque()
    autocast = torch.autocast(rt.device.type, dtype=torch.bfloat16, enabled=rt.precision == "bf16")

    def land(entry: tuple) -> None:
        block, start, stop, event, feats, flips, bad = entry
        if event is not None:
            event.synchronize()
        info = blocks[block]
        lo, hi = start - info["start"], stop - info["start"]
        info["feats"][lo:hi] = feats.numpy()
        if flips is not None:
            info["flips"][lo:hi] = flips.numpy()
        for i in bad:
            info["feats"][lo + i] = 0.0
            if flips is not None:
                info["flips"][lo + i] = 0.0
        info["missing"] -= stop - start
        bar.update(stop - start)
        if info["missing"] == 0:
            done = blocks.pop(block)
            block_writer.put((block, done["feats"], done["flips"], done["bad"]))

    with torch.inference_mode():
        for (block, start, stop), items in _prefetch(
            pool, batches, paths, rt, transform.size, config.prefetch_batches
        ):
            if block not in blocks:
                sl = writer.block_slice(block)
                n = sl.stop - sl.start
                blocks[block] = {
                    "start": sl.start,
                    "missing": n,
                    "bad": [],
                    "feats": np.empty((n, dim), dtype=np.float32),
                    "flips": np.empty((n, dim), dtype=np.float32) if config.with_flip else None,
                }
            x, bad = _model_input(items, paths[start:stop], rt, transform)
            for i, error in bad.items():
                row = start + i
                if not config.skip_bad:
                    raise BadImageError(
                        f"{error} (row {row}, image id {ids[row]!r}); fix or remove the file, "
                        "or pass --skip-bad to store zero features for it and every other "
                        "unreadable image (all listed at the end of the run and in the "
                        "store's bad_rows). Blocks finished so far are kept: re-running the "
                        "same command resumes"
                    )
                blocks[block]["bad"].append(
                    {"row": row, "image_id": ids[row], "path": str(paths[row]), "error": error}
                )
            with autocast:
                feats = backbone.features(x)
                flips = backbone.features(torch.flip(x, dims=[-1])) if config.with_flip else None
            in_flight.append((block, start, stop, *_to_host(feats, flips, rt), list(bad)))
            while len(in_flight) > (2 if rt.cuda else 0):
                land(in_flight.popleft())
        while in_flight:
            land(in_flight.popleft())


def _to_host(
    feats: torch.Tensor, flips: torch.Tensor | None, rt: Runtime
) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
    """Start the copy of a batch's features to (pinned) host memory; on CUDA return the event
    to wait on later instead of waiting now."""
    if not rt.cuda:
        return None, feats.float(), None if flips is None else flips.float()
    host = [
        torch.empty(t.shape, dtype=torch.float32, pin_memory=True).copy_(
            t.float(), non_blocking=True
        )
        for t in (feats, flips)
        if t is not None
    ]
    event = torch.cuda.Event()
    event.record()
    return event, host[0], host[1] if flips is not None else None


def featurize_dataset(
    name: str,
    root: str | Path,
    out: str | Path,
    config: FeaturizeConfig | None = None,
    **dataset_options: Any,
) -> FeaturizeResult:
    """Load dataset ``name`` from ``root`` with the registered adapter, then :func:`featurize`.

    The backbone (and its weights file) is resolved first, so a missing weights file is
    reported before the dataset is even parsed.
    """
    from featurize.datasets import load_dataset

    config = config or FeaturizeConfig()
    backbone = load_backbone(
        config.backbone,
        config.weights,
        seed=config.weights_seed,
        download=config.download,
        size=config.size,
    )
    index = load_dataset(name, root, **dataset_options)
    return featurize(index, out, config, backbone=backbone)
