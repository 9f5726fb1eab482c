"""``spml priors``: CLIP zero-shot class scores of a store's images as a prior (docs/priors.md):
``softmax_c(v · t_c / T)`` of each view ``v`` (the whole image, then its k×k tiles) against the
L2-normalised prompt embeddings ``t_c``; the whole image's are the ``scores``, the tiles' per-class
max, min and mean the extras. Blocks of rows wait beside the store until the prior is written, so
an interrupted run of the same settings (:func:`resume_fingerprint`) resumes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from probe.errors import MissingPathError, SpmlError, is_int, plain
from probe.io import atomic_write, atomic_write_text

__all__ = ["ClipPriorConfig", "ClipPriorResult", "compute_clip_prior", "image_paths_of_store",
           "resume_fingerprint"]

BLOCK_ROWS = 512  # rows per resumable block (a block's 17 views of ViT-B/16 take ~1 min on a CPU)


class ClipPriorError(SpmlError):
    """``spml priors`` cannot run as asked (the message names the option and the fix)."""


@dataclass(frozen=True)
class ClipPriorConfig:
    """What ``spml priors`` computes; each default is the papers' value."""

    model: str  # open_clip:<arch>/<pretrained> (VLPL: ViT-L-14-336/openai, AEVLP: ViT-B-16/openai)
    weights: str | None = None  # None: the pretrained tag's weights (library cache); or a file
    name: str = "clip"  # the prior's name in the store (priors/<name>)
    prompt: str = "a photo of a {}."  # CLIP's standard zero-shot template
    temperature: float = 0.01  # VLPL's and AEVLP's softmax temperature
    tiles: int = 0  # k for a k×k grid of tiles (DAMP: 4; CUB 5); 0 = the whole image only
    batch_size: int = 32  # images per forward (each brings 1 + k² views)
    device: str = "auto"  # auto (CUDA when available), cpu or cuda[:N], as every command
    overwrite: bool = False  # replace an existing prior of that name
    progress: bool = True  # a progress bar with ETA on stderr

    def validate(self) -> None:
        def bad(option: str, expected: str, got: Any) -> ClipPriorError:
            return ClipPriorError(f"{option}: expected {expected}; got {got!r}")

        if not isinstance(self.model, str) or not self.model.startswith("open_clip:"):
            raise bad("--model", "an OpenCLIP model open_clip:<arch>/<pretrained>, e.g. "
                      "open_clip:ViT-B-16/openai (the prior needs CLIP's text tower)", self.model)
        if not isinstance(self.prompt, str) or self.prompt.count("{}") != 1:
            raise bad("--prompt-template", "a template with one {} for the class name, e.g. "
                      "'a photo of a {}.'", self.prompt)
        if not (isinstance(self.temperature, int | float) and 0 < self.temperature <= 100):
            raise bad("--temperature", "a number in (0, 100], e.g. 0.01", self.temperature)
        if not (is_int(self.tiles, 0) and self.tiles <= 8):
            raise bad("--tiles", "an integer k in [0, 8] for a k×k grid (DAMP: 4)", self.tiles)
        if not is_int(self.batch_size, 1):
            raise bad("--batch-size", "an integer >= 1", self.batch_size)
        from probe.store.prior_writer import check_prior_name

        check_prior_name(self.name, "--name")
        self.torch_device()

    def torch_device(self) -> Any:
        """``device`` resolved (``auto``: CUDA when available, else CPU); refused naming
        ``--device`` before any image is read."""
        from probe.devices import resolve_device

        try:
            return resolve_device(self.device)
        except SpmlError as err:
            raise ClipPriorError(f"--device {self.device}: {err}") from None

    def fingerprint(self) -> dict[str, Any]:
        """What decides the numbers (a resumed run must match it)."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k not in ("batch_size", "device", "overwrite", "progress")}


@dataclass(frozen=True)
class ClipPriorResult:
    store: Path
    name: str
    rows: int
    classes: int
    views_per_image: int
    blocks_resumed: int
    provenance: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "store": str(self.store)}


def image_paths_of_store(store: Any, root: str | Path | None = None,
                         dataset_options: dict[str, Any] | None = None,
                         adapter: str | None = None) -> list[Path]:
    """The image file of every store row, in row order, matched by image id: the store's dataset
    read again from ``root`` with ``adapter`` and ``dataset_options`` (defaults: those its
    provenance records, :func:`featurize.image_source`; for an older store the adapter of its
    dataset name, else ``folder``). Refused by name for imported features (no images), an
    unreadable dataset or missing images (the first 20 named)."""
    from featurize.datasets import DATASETS, image_source, load_dataset, resolve_name

    source = image_source(store.provenance)
    recorded = dict(source.options) if source is not None else {}
    if root is not None and source is not None:  # moved: the options' paths under the old root
        old, new = source.root.rstrip(os.sep) + os.sep, str(Path(root).expanduser().resolve())
        recorded = {k: new + os.sep + v[len(old):] if isinstance(v, str) and v.startswith(old)
                    else v for k, v in recorded.items()}
    if root is None:
        if source is None:
            sentence = store.provenance.get("source")
            raise ClipPriorError(
                f"store {store.path} holds imported features (source: "
                f"{json.dumps(sentence)[:200]}), so spml priors cannot find its images: pass "
                f"--root DIR with the images of dataset '{store.dataset}', or compute the scores "
                "elsewhere and bring them with 'spml import priors'")
        root = source.root
    name = source.dataset if source else store.dataset
    if source is not None and source.adapter is not None and adapter in (None, source.adapter):
        adapter = source.adapter  # its recorded options, under those given
        dataset_options = {**recorded, **dict(dataset_options or {})}
    if adapter is None:
        try:
            adapter = resolve_name(name)
        except SpmlError:
            adapter = "folder"
    elif adapter not in DATASETS:
        adapter = resolve_name(adapter)  # an unknown name: refused with the known ones
    root = Path(root).expanduser()
    if not root.is_dir():
        raise MissingPathError(
            f"--root: the images of store {store.path} (dataset '{name}') are not reachable: "
            f"{root} is not a directory; pass --root DIR where the dataset now lives")
    index = load_dataset(adapter, root, **dict(dataset_options or {}))
    by_id = dict(zip((*index.pool.image_ids, *index.test.image_ids),
                     (*index.pool.paths, *index.test.paths)))
    absent = [i for i in store.image_ids if i not in by_id]
    if absent:
        raise ClipPriorError(
            f"--root {root}: {len(absent)} of the store's {store.n_rows} image ids are not in "
            f"dataset '{name}' there, e.g. {', '.join(absent[:5])}; is it the dataset this store "
            "was featurized from?")
    paths = [Path(by_id[i]) for i in store.image_ids]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
        raise MissingPathError(
            f"--root {root}: {len(missing)} image files of the store's rows are missing: "
            f"{', '.join(missing[:20])}{more}")
    return paths


def _tiles(image: Any, k: int) -> list[Any]:
    """The k×k grid of an image (PIL), row by row; edges from integer division of the size."""
    w, h = image.size
    xs = [round(i * w / k) for i in range(k + 1)]
    ys = [round(j * h / k) for j in range(k + 1)]
    return [image.crop((xs[i], ys[j], xs[i + 1], ys[j + 1])) for j in range(k) for i in range(k)]


def view_scores(clip: Any, images: list[Any], text: Any, tiles: int, temperature: float,
                device: Any) -> np.ndarray:
    """``(B, 1 + k², C)`` softmax class scores of each image's views (whole, then its tiles)."""
    import torch

    views = []
    for img in images:
        views.append(img)  # the whole image first, then its k×k tiles
        if tiles:
            views.extend(_tiles(img, tiles))
    batch = torch.stack([clip.preprocess(v) for v in views]).to(device)
    with torch.inference_mode():
        feats = clip.model.encode_image(batch)
        feats = feats / feats.norm(dim=-1, keepdim=True)
        scores = torch.softmax(feats.float() @ text.T / temperature, dim=-1)
    return scores.view(len(images), 1 + tiles * tiles, -1).cpu().numpy()


#: what each resume-fingerprint field is set by (named when a resume is refused)
_FINGERPRINT_FLAGS = {
    "model": "--model", "weights": "--weights", "weights_sha256": "--weights",
    "name": "--name", "prompt": "--prompt-template", "temperature": "--temperature",
    "tiles": "--tiles", "dataset": "--dataset", "options": "--option", "root": "--root",
    "images_sha256": "--root/--dataset/--option", "rows": "STORE", "classes": "STORE",
    "scratch_format": "the version of spml",
}
_SCRATCH_FORMAT = 2  # 2: blocks hold the reductions (global, tile max, min, mean) only


def resume_fingerprint(config: ClipPriorConfig, store: Any, paths: list[Path],
                       dataset_options: dict[str, Any] | None, adapter: str | None,
                       weights_sha256: str | None) -> dict[str, Any]:
    """What decides a block's numbers (a resumed run must match it all): the config's settings,
    the store's shape, the dataset adapter and options, the image root and every image path."""
    import hashlib

    digest = hashlib.sha256("\n".join(str(p.resolve()) for p in paths).encode()).hexdigest()
    root = Path(os.path.commonpath([str(p.resolve()) for p in paths])) if paths else None
    return {**config.fingerprint(), "rows": store.n_rows, "classes": store.n_classes,
            "weights_sha256": weights_sha256, "dataset": adapter or store.dataset,
            "options": {str(k): str(v) for k, v in sorted((dataset_options or {}).items())},
            "root": str(root), "images_sha256": digest, "scratch_format": _SCRATCH_FORMAT}


def _check_resume(scratch: Path, fingerprint: dict[str, Any]) -> None:
    """Refuse to mix blocks of another run's settings into this one, naming what differs."""
    meta = scratch / "meta.json"
    try:
        old = json.loads(meta.read_text()) if meta.is_file() else None
    except ValueError:
        old = None
    if old == fingerprint:
        return
    if old is None:
        differs = "its settings are unreadable"
    else:
        keys = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
        differs = "; ".join(
            f"{_FINGERPRINT_FLAGS.get(k, k)} ({k}): {plain(old.get(k))} then, "
            f"{plain(fingerprint.get(k))} now" for k in keys)
    raise ClipPriorError(
        f"an unfinished spml priors run of other settings is in {scratch} ({differs}); rerun "
        "with that run's settings to resume it, or remove that folder to start over")


def _reduce(views: np.ndarray, tiles: int) -> np.ndarray:
    """``(B, 1 + k², C)`` view scores → ``(B, 4, C)`` (whole image, tile max, min, mean) with
    tiles, ``(B, 1, C)`` without."""
    if not tiles:
        return views[:, :1]
    t = views[:, 1:]
    return np.stack([views[:, 0], t.max(axis=1), t.min(axis=1), t.mean(axis=1)], axis=1)


def compute_clip_prior(store_path: str | Path, config: ClipPriorConfig,
                       root: str | Path | None = None,
                       dataset_options: dict[str, Any] | None = None,
                       adapter: str | None = None) -> ClipPriorResult:
    """Compute the CLIP prior of every row of the store at ``store_path`` and store it; the
    options, the store, the name (an existing one only with ``overwrite``), every image file and
    the weights are checked before anything is written."""
    import torch
    from PIL import Image

    from featurize.backbones import load_clip
    from probe.progress import Progress
    from probe.store import open_store, write_prior

    config.validate()  # --device included: refused before any image is read
    device = config.torch_device()
    store_path = Path(store_path)
    store = open_store(store_path)
    if config.name in store.prior_names() and not config.overwrite:
        raise ClipPriorError(
            f"--name: store {store_path} already holds a prior '{config.name}'; pass "
            "--overwrite to replace it, or choose another --name")
    paths = image_paths_of_store(store, root, dataset_options, adapter)
    clip = load_clip(config.model, config.weights)
    clip.model.to(device)
    with torch.inference_mode():
        prompts = [config.prompt.format(c.replace("_", " ")) for c in store.class_names]
        text = clip.model.encode_text(clip.tokenizer(prompts).to(device)).float()
        text = text / text.norm(dim=-1, keepdim=True)

    scratch = store_path.with_name(f"{store_path.name}.priors-{config.name}.partial")
    fingerprint = resume_fingerprint(config, store, paths, dataset_options, adapter,
                                     clip.weights.sha256)
    if scratch.exists():
        _check_resume(scratch, fingerprint)
    scratch.mkdir(parents=True, exist_ok=True)
    atomic_write_text(scratch / "meta.json", json.dumps(fingerprint, sort_keys=True))

    k2 = config.tiles * config.tiles
    n_blocks = -(-store.n_rows // BLOCK_ROWS)
    done = {b for b in range(n_blocks) if (scratch / f"block-{b}.npy").is_file()}
    todo = store.n_rows - sum(min(BLOCK_ROWS, store.n_rows - b * BLOCK_ROWS) for b in done)
    bar = Progress(todo, f"priors {config.name} ({config.model}, {1 + k2} views, {device})",
                   "img", enabled=config.progress)
    with bar:
        for b in sorted(set(range(n_blocks)) - done):
            rows = range(b * BLOCK_ROWS, min((b + 1) * BLOCK_ROWS, store.n_rows))
            parts = []
            for start in range(rows.start, rows.stop, config.batch_size):
                chunk = paths[start:min(start + config.batch_size, rows.stop)]
                images = [Image.open(p).convert("RGB") for p in chunk]
                parts.append(_reduce(view_scores(clip, images, text, config.tiles,
                                                 config.temperature, device), config.tiles))
                bar.update(len(chunk))
            block = np.concatenate(parts).astype(np.float32)
            atomic_write(scratch / f"block-{b}.npy", lambda f, a=block: np.save(f, a))

    reduced = np.concatenate([np.load(scratch / f"block-{b}.npy") for b in range(n_blocks)])
    extras = ({k: reduced[:, i] for i, k in enumerate(("tile_max", "tile_min", "tile_mean"), 1)}
              if config.tiles else None)
    provenance = {"model": config.model, "prompt_template": config.prompt,
                  "temperature": config.temperature,
                  "tiles": f"{config.tiles}x{config.tiles}" if config.tiles else None,
                  "source": f"spml priors: OpenCLIP zero-shot softmax over the store's "
                            f"{store.n_classes} classes, {1 + k2} views per image",
                  **clip.provenance()}
    write_prior(store_path, config.name, reduced[:, 0, :], provenance, extras=extras,
                overwrite=config.overwrite, class_names=store.class_names)
    shutil.rmtree(scratch, ignore_errors=True)
    return ClipPriorResult(store_path, config.name, store.n_rows, store.n_classes, 1 + k2,
                           len(done), provenance)
