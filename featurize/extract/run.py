"""The featurize run (docs/protocol.md steps 6-7; docs/design.md): a frozen backbone over a dataset
into a feature store, with the flipped input's features too. Reader threads decode ahead
(:mod:`featurize.extract.reading`), the device loop keeps two batches in flight on CUDA, a writer
thread stores whole blocks (:mod:`featurize.extract.writing`), the unit of resume. Unreadable images
stop the run, or with ``skip_bad`` get zero features and are listed in the store's ``bad_rows``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from featurize.backbones import DEFAULT_BACKBONE, Backbone, load_backbone
from featurize.datasets import ImageSource
from featurize.extract.images import BadImageError, ImageTransform
from featurize.extract.ranks import Ranks, current_ranks
from featurize.extract.reading import (
    Runtime,
    backbone_forward,
    channels_last,
    device_mode,
    model_input,
    prefetch,
)
from featurize.extract.writing import (
    BlockWriter,
    bad_rows_dir,
    collect_block_bad_rows,
    open_writer,
    record_bad_rows,
    stored_bad_rows,
)
from featurize.specs import (
    DECODE_CHOICES,
    EMBED_CHOICES,
    PRECISION_CHOICES,
    TRANSFORM_CHOICES,
    family_of,
)
from probe.devices import inductor_unavailable
from probe.errors import MissingPathError, SpmlError
from probe.progress import Progress
from probe.store import join_store, open_store
from probe.store.index import DatasetIndex

PROTOCOL_SIZE = 448  # docs/protocol.md step 6: 448×448

# The GPU fast path (nvJPEG, bf16, channels_last; docs/performance.md) is chosen by ``auto`` once
# a probe on its features is shown within 0.1 mAP of the reference's (not run yet); until then it
# takes ``--decode torchvision --precision bf16``.
GPU_FAST_PATH_MEASURED: bool = False


@dataclass(frozen=True)
class FeaturizeConfig:
    """Settings of one featurize run (``spml featurize`` options)."""

    backbone: str = DEFAULT_BACKBONE  # the protocol's ResNet-50
    weights: str | None = None  # None: the backbone's standard pretrained weights
    weights_seed: int = 0  # seeds weights="random" (tests and benchmarks only)
    download: bool = False  # weights are only fetched when asked: offline machines stay honest
    size: int | None = None  # the protocol transform's S×S; None: 448 (docs/protocol.md)
    transform: str = "auto"  # auto: the model's own for timm:/open_clip:/hf:, else protocol
    embed: str = "auto"  # which embedding (featurize.specs.FAMILIES); auto: the family's
    device: str = "auto"  # CUDA when available, else CPU
    batch_size: int | None = None  # None: 256 on CUDA (fills an H100), 16 on CPU (low memory)
    decode: str = "auto"  # auto: pil (the reference) until the GPU path is measured (above)
    precision: str = "auto"  # auto: fp32 (exact) until the GPU path is measured (above)
    with_flip: bool = True  # keep flipped-image features: the protocol's only augmentation
    compile: bool = False  # the backbone through torch.compile: faster, equal within tolerance
    dtype: str = "float16"  # store dtype (docs/protocol.md store: float16 default)
    block_rows: int = 1024  # rows per store chunk = the unit of resume
    workers: int | None = None  # reader threads; None: min(16, CPU count)
    prefetch_batches: int = 4  # batches the readers run ahead of the model
    skip_bad: bool = False  # unreadable image: error (default) or zero features + bad_rows
    overwrite: bool = False  # never replace an existing store unless asked
    progress: bool = True  # progress on stderr (probe.progress: bar or log lines)


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
        raise SpmlError(f"--precision must be one of {PRECISION_CHOICES}, got {config.precision!r}")
    name = config.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SpmlError(
            f"--device: {config.device!r} is not a device (auto, cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpmlError(f"--device {config.device}: CUDA is not available on this machine")
    if device.type not in ("cpu", "cuda"):
        raise SpmlError(f"--device: only cpu and cuda are supported; got {config.device}")
    cuda = device.type == "cuda"
    fast = cuda and GPU_FAST_PATH_MEASURED
    # "auto": the GPU fast path where it applies, else the CPU's plain one
    decode = config.decode
    if decode == "auto":
        decode = "torchvision" if fast else "pil"
    precision = config.precision
    if precision == "auto":
        precision = "bf16" if fast else "fp32"
    batch_size = config.batch_size
    if batch_size is None:
        batch_size = 256 if cuda else 16
    if batch_size < 1:
        raise SpmlError(f"--batch-size must be >= 1, got {batch_size}")
    workers = config.workers if config.workers is not None else min(16, os.cpu_count() or 1)
    if workers < 1:
        raise SpmlError(f"--workers must be >= 1, got {workers}")
    why = inductor_unavailable(device) if config.compile else None
    if why:
        warnings.warn(f"--compile: the backbone runs eagerly ({why})", RuntimeWarning,
                      stacklevel=2)
    return Runtime(device, decode, precision, int(batch_size), int(workers),
                   compile=config.compile and not why)


def transform_mode(config: FeaturizeConfig) -> str:
    """``"model"`` (the backbone's own preprocessing) or ``"protocol"`` (S×S, docs/protocol.md
    step 6): ``auto`` is the model's own for a library-qualified backbone (``timm:`` …), the
    protocol's for the registry (torchvision) names, whose meaning it keeps."""
    if config.transform not in TRANSFORM_CHOICES:
        raise SpmlError(
            f"--transform must be one of {', '.join(TRANSFORM_CHOICES)}; got {config.transform!r}")
    if config.embed not in EMBED_CHOICES:
        raise SpmlError(f"--embed must be one of {', '.join(EMBED_CHOICES)}; got {config.embed!r}")
    mode = config.transform
    if mode == "auto":
        mode = "model" if family_of(config.backbone) else "protocol"
    if mode == "model":
        if family_of(config.backbone) is None:
            raise SpmlError(
                f"--transform model: backbone {config.backbone!r} has the protocol's "
                "preprocessing only (its mean/std at --size); use a timm:, open_clip: or hf: "
                "backbone, or --transform protocol")
        if config.size is not None:
            raise SpmlError(
                f"--size {config.size}: the model's own preprocessing fixes its input size; "
                "drop --size, or pass --transform protocol for the S×S protocol resize")
    return mode


def load_configured(config: FeaturizeConfig) -> Backbone:
    """The backbone ``config`` names, checked against the input size it will get."""
    protocol = transform_mode(config) == "protocol"
    return load_backbone(config.backbone, config.weights, seed=config.weights_seed,
                         download=config.download, embed=config.embed,
                         size=(config.size or PROTOCOL_SIZE) if protocol else None)


def backbone_transform(backbone: Backbone, size: int | None = None, mode: str = "protocol"
                       ) -> ImageTransform:
    """The image transform for ``backbone``: ``protocol``, S×S (default 448) with the weights'
    own mean/std; ``model``, the backbone's own preprocessing."""
    if mode == "protocol":
        return ImageTransform(size=size or PROTOCOL_SIZE, mean=backbone.spec.mean,
                              std=backbone.spec.std)
    if backbone.transform is None:
        raise SpmlError(f"backbone {backbone.name!r} brings no preprocessing of its own (no image "
                        "processor); pass --transform protocol")
    return backbone.transform


def describe_transform(transform: ImageTransform, rt: Runtime, with_flip: bool) -> dict:
    """The provenance ``transform`` record: everything between the file and the features that
    can change their values (resume refuses a store made with a different one)."""
    out = transform.describe()
    how = transform.interpolation
    crop = "" if transform.crop is None else ", centre crop"
    codec = "nvJPEG batched + CPU fallback" if rt.cuda else "libjpeg-turbo/libpng"
    out["decode"] = (f"PIL (reference: open, convert RGB, resize {how.upper()}{crop})"
                     if rt.decode == "pil"
                     else f"torchvision {codec}; torch antialiased {how} resize{crop}")
    out["compute"] = ("bf16 autocast, channels_last" if rt.precision == "bf16" else "float32"
                      ) + (", torch.compile (inductor)" if rt.compile else "")
    out["flip"] = "torch.flip(x, dims=[-1]) of the model input" if with_flip else None
    return out


def featurize(index: DatasetIndex, out: str | Path, config: FeaturizeConfig | None = None, *,
              backbone: Backbone | None = None, ranks: Ranks | None = None,
              source: ImageSource | None = None) -> FeaturizeResult:
    """Featurize every image of ``index`` (pool rows, then test rows) into the store ``out``.

    Weights are resolved before anything is written. An incomplete store made the same way is
    resumed; a complete one, or one made differently, is refused (``overwrite``). ``backbone``:
    a loaded one (it must match ``config.backbone``). ``ranks`` (default: the initialised
    ``torch.distributed`` group, if any) splits the blocks between processes; the result counts
    all ranks'. ``source``: where the images come from, for the provenance (default: the
    index's name and root)."""
    config = config or FeaturizeConfig()
    ranks = ranks or current_ranks()
    if ranks.distributed and config.device in ("auto", "cuda") and torch.cuda.is_available():
        config = dataclasses.replace(config, device=f"cuda:{ranks.local_rank}")
    rt = resolve_runtime(config)
    out = Path(out)
    mode = transform_mode(config)
    if backbone is None:
        backbone = load_configured(config)
    elif backbone.name != config.backbone:
        raise SpmlError(f"backbone {backbone.name!r} given but the config says {config.backbone!r}")
    transform = backbone_transform(backbone, config.size, mode)
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
                f"(listed in the store's bad_rows):{shown}")
    run = {"device": str(rt.device), "batch_size": rt.batch_size, "tool": "spml featurize"}
    if ranks.distributed:
        run["world_size"] = ranks.world
    if source is None and index.root is None:  # an index built in memory: no folder to record
        where = {"source": f"images of dataset '{index.name}'", "dataset": index.name}
    else:
        where = (source or ImageSource.of(index.name, index.root)).to_provenance()
    provenance = {**backbone.provenance(),
                  "transform": describe_transform(transform, rt, config.with_flip),
                  **where, "run": run}
    extra = {"weights_random": True} if backbone.weights.random else {}
    writer, error, pending = None, None, None
    if ranks.rank == 0:
        try:
            writer = open_writer(out, index, backbone, provenance, config, extra)
            pending = writer.pending_blocks()
        except Exception as err:
            error = err
    # the other ranks join only a store that rank 0 opened, and take its list of pending
    # blocks (read before anyone writes: a list read later would miss rank 0's new blocks)
    pending = ranks.agree(error, pending)
    if writer is None:
        writer = join_store(out)
    blocks_resumed = writer.n_blocks - len(pending)
    mine = pending[ranks.rank :: ranks.world]
    batches = []  # (block, first row, end row) of each forward pass
    for b in mine:
        block = writer.block_slice(b)
        for start in range(block.start, block.stop, rt.batch_size):
            batches.append((b, start, min(start + rt.batch_size, block.stop)))
    rows_todo = sum(stop - start for _, start, stop in batches)
    bad_rows = stored_bad_rows(writer)
    backbone.to(rt.device, channels_last=channels_last(rt))
    where = f"{rt.device}, rank {ranks.rank}/{ranks.world}" if ranks.distributed else rt.device
    bar = Progress(rows_todo, f"featurize {index.name} ({backbone.name}, {where})", "img",
                   enabled=config.progress)
    block_writer = BlockWriter(writer, bad_rows, per_block=ranks.distributed)
    t0 = time.perf_counter()
    error = None
    try:
        with device_mode(rt), ThreadPoolExecutor(rt.workers, "spml-reader") as pool:
            try:
                _run_batches(batches, paths, ids, rt, transform, backbone, writer, block_writer,
                             config, pool, bar)
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
            bad_rows.update(collect_block_bad_rows(writer))
            if bad_rows:
                record_bad_rows(writer, bad_rows)
            writer.finalize()
            shutil.rmtree(bad_rows_dir(writer), ignore_errors=True)
        except Exception as err:
            error = err
    ranks.agree(error)  # every rank returns once the store is complete
    if ranks.rank != 0:  # rank 0 merged every rank's bad rows into the store's attributes
        bad_rows = stored_bad_rows(open_store(out))
    bad = [bad_rows[r] for r in sorted(bad_rows)]
    return FeaturizeResult(store_path=out, n_rows=writer.n_rows, rows_done=int(rows_all),
                           blocks_done=int(blocks_all), blocks_resumed=blocks_resumed, bad_rows=bad,
                           seconds=seconds, images_per_s=rows_all / seconds if seconds > 0 else 0.0,
                           device=str(rt.device), decode=rt.decode, precision=rt.precision,
                           batch_size=rt.batch_size, backbone=backbone.name,
                           weights=backbone.weights.id, world_size=ranks.world)


def _unreadable(bad: dict[int, str], start: int, stop: int,
                batches: list[tuple[int, int, int]], paths: list[Path], ids: list[str]
                ) -> BadImageError:
    """The error for a run without --skip-bad that met unreadable images in the batch at rows
    ``start:stop``: every one of that batch, and every one of the run's rows still to do whose
    file cannot even be opened (:func:`featurize.extract.images.header_error`), the first 20
    named."""
    from featurize.extract.images import header_error

    found = [(start + i, bad[i]) for i in sorted(bad)]
    later = [r for _, lo, hi in batches if lo >= stop for r in range(lo, hi)]
    for r in later:
        err = header_error(paths[r])
        if err is not None:
            found.append((r, err))
    row, error = found[0]
    listed = "".join(f"\n  row {r}, image id {ids[r]!r}: {e}" for r, e in found[:20])
    more = f"\n  ... and {len(found) - 20} more" if len(found) > 20 else ""
    return BadImageError(
        f"{error} (row {row}, image id {ids[row]!r}); {len(found)} unreadable image(s) in this "
        f"run (the {len(later)} images still to do were checked by their header only):{listed}"
        f"{more}\nfix or remove the files, or pass --skip-bad to store zero features for every "
        "unreadable image (all listed at the end of the run and in the store's bad_rows). "
        "Blocks finished so far are kept: re-running the same command resumes")


def _run_batches(batches: list[tuple[int, int, int]], paths: list[Path], ids: list[str],
                 rt: Runtime, transform: ImageTransform, backbone: Backbone, writer: Any,
                 block_writer: BlockWriter, config: FeaturizeConfig, pool: ThreadPoolExecutor,
                 bar: Any) -> None:
    """The device loop: at most two batches in flight, results gathered into blocks."""
    dim = backbone.feature_dim
    blocks: dict[int, dict] = {}  # block -> {"feats", "flips", "missing", "bad", "start"}
    in_flight: deque[tuple] = deque()
    forward = backbone_forward(backbone.features, rt, config.with_flip)

    def land(entry: tuple) -> None:
        block, start, stop, event, feats, flips, bad = entry
        if event is not None:
            event.synchronize()
        info = blocks[block]
        lo, hi = start - info["start"], stop - info["start"]
        for key, values in (("feats", feats), ("flips", flips)):
            if values is not None:
                info[key][lo:hi] = values.numpy()
                info[key][[lo + i for i in bad]] = 0.0
        info["missing"] -= stop - start
        bar.update(stop - start)
        if info["missing"] == 0:
            done = blocks.pop(block)
            block_writer.put((block, done["feats"], done["flips"], done["bad"]))

    with torch.inference_mode():
        for (block, start, stop), items in prefetch(pool, batches, paths, rt, transform,
                                                    config.prefetch_batches):
            if block not in blocks:
                sl = writer.block_slice(block)
                n = sl.stop - sl.start
                blocks[block] = {"start": sl.start, "missing": n, "bad": [],
                                 "feats": np.empty((n, dim), dtype=np.float32),
                                 "flips": np.empty((n, dim), dtype=np.float32)
                                 if config.with_flip else None}
            x, bad = model_input(items, paths[start:stop], rt, transform)
            if bad and not config.skip_bad:
                raise _unreadable(bad, start, stop, batches, paths, ids)
            blocks[block]["bad"] += [{"row": start + i, "image_id": ids[start + i],
                                      "path": str(paths[start + i]), "error": error}
                                     for i, error in bad.items()]
            feats, flips = forward(x)
            in_flight.append((block, start, stop, *_to_host(feats, flips, rt), list(bad)))
            while len(in_flight) > (2 if rt.cuda else 0):
                land(in_flight.popleft())
        while in_flight:
            land(in_flight.popleft())


def _to_host(feats: torch.Tensor, flips: torch.Tensor | None, rt: Runtime
             ) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
    """Start the copy of a batch's features to (pinned) host memory; on CUDA return the event
    to wait on later instead of waiting now."""
    if not rt.cuda:
        return None, feats.float(), None if flips is None else flips.float()
    host = [torch.empty(t.shape, dtype=torch.float32, pin_memory=True).copy_(t.float(),
                                                                                non_blocking=True)
            for t in (feats, flips) if t is not None]
    event = torch.cuda.Event()
    event.record()
    return event, host[0], host[1] if flips is not None else None


def featurize_dataset(name: str, root: str | Path, out: str | Path,
                      config: FeaturizeConfig | None = None, **dataset_options: Any
                      ) -> FeaturizeResult:
    """Load dataset ``name`` from ``root`` with the registered adapter, then :func:`featurize`
    (the backbone and its weights first: a missing weights file is reported before parsing)."""
    from featurize.datasets import load_dataset, resolve_name

    config = config or FeaturizeConfig()
    backbone = load_configured(config)
    index = load_dataset(name, root, **dataset_options)
    source = ImageSource.of(index.name, root, resolve_name(name), dataset_options)
    return featurize(index, out, config, backbone=backbone, source=source)
