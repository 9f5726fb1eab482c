"""The fine-tune's configuration, results and file formats (:mod:`studies.finetune.run` runs it):
:class:`FinetuneConfig`, a study winner's JSON, :class:`FinetuneResult`, atomic torch writes of
the run directory's files. Importing it imports no torch (``spml finetune --help``)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from probe.errors import MissingPathError, SpmlError, is_int, plain
from probe.io import atomic_write
from probe.store.protocol import PROTOCOL_SEED

#: ``auto``: bf16 on CUDA when supported, else fp16 (+ GradScaler) on CUDA; ``off`` on CPU.
AMP_MODES = ("auto", "bf16", "fp16", "off")

#: Keys a ``--from-json`` file's ``"train"`` object may set (FinetuneConfig fields).
TRAIN_JSON_KEYS = ("batch_size", "lr", "epochs", "seed", "observed_seed", "val_labels")

CHECKPOINT_NAME = "checkpoint.pt"
RESULTS_NAME = "results.json"
BEST_MODEL_NAME = "best_model.pt"
CHECKPOINT_FORMAT = "spml-finetune-checkpoint/1"
_RESULTS_FORMAT = "spml-finetune-results/1"
WARMUP_STEPS = 10  # steps excluded from the steady-state images/s (cudnn autotune, workers)


class FinetuneError(SpmlError):
    """Bad fine-tuning input: the message names the option, what was expected and what came."""


@dataclass(frozen=True)
class FinetuneConfig:
    """Everything that defines one fine-tuning run (the loss hyperparameters come separately).

    ``None`` for ``batch_size`` / ``lr`` / ``epochs`` means "the paper's value for this loss and
    dataset" (``train_presets``), else :data:`probe.engine.config.GENERIC_FINETUNE`.
    """

    dataset: str  # adapter name: voc, coco, nus, cub, folder (featurize.datasets)
    root: str | Path  # the dataset as the user holds it on disk
    loss: str  # registry name (probe.losses.available())
    out: str | Path  # run directory: checkpoint.pt, results.json, best_model.pt
    dataset_options: Mapping[str, Any] = field(default_factory=dict)  # adapter keyword options
    preset: str | None = "auto"  # loss hparam preset; auto = the dataset's paper values if any
    batch_size: int | None = None  # None: the paper's (train_presets), else 8
    lr: float | None = None  # None: the paper's, else 1e-5 (one lr for backbone and head)
    epochs: int | None = None  # None: the paper's, else 10
    backbone: str = "resnet50"  # the protocol's backbone (docs/protocol.md step 7)
    weights: str | None = "imagenet1k_v1"  # what pretrained=True meant for the papers; or
    # random, PATH, None (the backbone's default: a timm:/open_clip: tag's, an hf: repo's)
    weights_seed: int = 0  # initialisation seed for weights="random" only
    size: int = 448  # the protocol's 448×448 resize; smaller only for smoke tests
    transform: str = "auto"  # auto: the model's own for timm:/open_clip:/hf:, else protocol
    embed: str = "auto"  # which embedding the head reads (featurize.specs.FAMILIES)
    weights_sha256: str | None = None  # the weights file must have this sha256 (a store's)
    seed: int = 0  # head init, batch order, flips, the loss's own randomness
    observed_seed: int = PROTOCOL_SEED  # the single-positive draw (docs/protocol.md step 2)
    val_labels: str = "clean"  # docs/protocol.md step 4: clean val by default, or "observed"
    threshold: float = 0.5  # probability threshold of OF1/CF1 (docs/protocol.md step 5)
    device: str = "auto"  # auto = cuda when available, else cpu
    amp: str = "auto"  # see AMP_MODES
    channels_last: bool | None = None  # None = on CUDA only (faster convolutions there)
    num_workers: int | None = None  # decoding processes; None = CPUs - 1 (<= 16) on CUDA, 0 on CPU
    eval_batch_size: int | None = None  # None = max(2 × batch_size, 32): no grads, more fits
    max_steps: int | None = None  # stop after this many optimiser steps (smoke runs)
    checkpoint_every: int = 0  # also checkpoint every N steps (0: only at epoch ends)
    resume: bool = False  # continue the run whose checkpoint is in `out`
    overwrite: bool = False  # discard an existing run in `out` and start over
    save_best: bool = True  # keep the best-val-epoch weights in best_model.pt
    progress: bool = True  # progress on stderr (probe.progress: a bar, or lines in a log)

    def __post_init__(self) -> None:
        def bad(name: str, expected: str, got: Any) -> FinetuneError:
            flag = {"num_workers": "--workers"}.get(name, "--" + name.replace("_", "-"))
            return FinetuneError(f"finetune: {flag} must be {expected}; got {plain(got)}")

        for name in ("batch_size", "epochs", "max_steps", "eval_batch_size"):
            value = getattr(self, name)
            if value is not None and not is_int(value, 1):
                raise bad(name, "a positive integer (or left out for the default)", value)
        if self.lr is not None and (
            isinstance(self.lr, bool) or not isinstance(self.lr, int | float)
            or not math.isfinite(self.lr) or self.lr <= 0
        ):
            raise bad("lr", "a positive number (or left out for the paper's value)", self.lr)
        if not is_int(self.size, 16):
            raise bad("size", "an integer >= 16 (pixels; the protocol uses 448)", self.size)
        from featurize.specs import EMBED_CHOICES, TRANSFORM_CHOICES

        for name, choices in (("transform", TRANSFORM_CHOICES), ("embed", EMBED_CHOICES),
                              ("amp", AMP_MODES)):
            if getattr(self, name) not in choices:
                raise bad(name, f"one of {', '.join(choices)}", getattr(self, name))
        if self.val_labels not in ("clean", "observed"):
            raise bad("val_labels", "clean or observed", self.val_labels)
        if not 0.0 < float(self.threshold) < 1.0:
            raise bad("threshold", "a probability in (0, 1)", self.threshold)
        if not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 0:
            raise bad("checkpoint_every", "an integer >= 0 (0 = only at epoch ends)",
                      self.checkpoint_every)
        if self.num_workers is not None and (
            not isinstance(self.num_workers, int) or self.num_workers < 0
        ):
            raise bad("num_workers", "an integer >= 0 (or left out: automatic)", self.num_workers)
        if self.resume and self.overwrite:
            raise FinetuneError("finetune: --resume and --overwrite exclude each other; pick one")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able copy (paths as strings)."""
        return jsonable({**asdict(self), "dataset_options": dict(self.dataset_options)})


def read_winner_json(path: str | Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Read a study winner ``{"loss": name, "hparams": {...}, "train": {...}}``.

    Returns ``(loss, hparams, train)``; ``train`` may only hold :data:`TRAIN_JSON_KEYS`
    (FinetuneConfig fields). Other top-level keys (provenance, scores) are ignored. Hyperparameter
    values must be single values (a winner is one configuration), validated later by the loss.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise MissingPathError(f"--from-json: file {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise FinetuneError(
            f"--from-json {path}: not valid JSON (line {err.lineno}, column {err.colno}: "
            f"{err.msg})"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("loss"), str):
        raise FinetuneError(
            f"--from-json {path}: expected an object {{\"loss\": NAME, \"hparams\": {{...}}, "
            f"\"train\": {{...}}}} with a string 'loss'; got {str(data)[:80]!r}"
        )
    hparams, train = data.get("hparams") or {}, data.get("train") or {}
    if not isinstance(hparams, dict) or not isinstance(train, dict):
        raise FinetuneError(f"--from-json {path}: 'hparams' and 'train' must be JSON objects")
    for name, value in hparams.items():
        if isinstance(value, list | dict):
            raise FinetuneError(
                f"--from-json {path}: hyperparameter '{name}' must be a single value (one "
                f"winning configuration); got {value!r}"
            )
    unknown = sorted(set(train) - set(TRAIN_JSON_KEYS))
    if unknown:
        raise FinetuneError(
            f"--from-json {path}: unknown 'train' key(s) {', '.join(unknown)}; accepted: "
            f"{', '.join(TRAIN_JSON_KEYS)}"
        )
    return data["loss"], dict(hparams), dict(train)


@dataclass
class FinetuneResult:
    """What a run produced (also written to ``out/results.json``): ``epochs``, one dict per
    completed epoch (from 1); ``best_epoch``, the best val epoch (None before the first ends),
    where ``test_map`` / ``test_ap`` / ``test_f1`` are read; ``images_per_s``: ``train``
    (image loading included), ``train_steady`` (without this process's first 10 steps), ``eval``.
    """

    config: dict[str, Any]
    loss: str
    hparams: dict[str, Any]
    train: dict[str, Any]
    data: dict[str, Any]
    model: dict[str, Any]
    epochs: list[dict[str, Any]]
    best_epoch: int | None
    best_val_map: float | None
    test_map: float | None
    test_ap: dict[str, float] | None
    test_f1: dict[str, float] | None
    global_step: int
    completed: bool
    stopped: str | None  # "max_steps" when cut short, else None
    images_per_s: dict[str, float | None]
    paths: dict[str, str | None]

    def to_dict(self) -> dict[str, Any]:
        return {"format": _RESULTS_FORMAT, **jsonable(asdict(self))}


def jsonable(value: Any) -> Any:
    """Plain JSON values: NaN/inf become None, tensors/arrays lists, paths strings."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    torch = sys.modules.get("torch")  # a tensor means torch is loaded: nothing imported here
    if isinstance(value, np.ndarray) or (torch is not None and isinstance(value, torch.Tensor)):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    return value


def save_torch(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path`` atomically (a temporary file, then a rename)."""
    import torch

    atomic_write(path, lambda fh: torch.save(obj, fh))


def store_backbone(path: str | Path) -> dict[str, Any]:
    """The :class:`FinetuneConfig` fields that rebuild the backbone of the feature store at
    ``path`` as its provenance records it: ``backbone``, ``weights`` (the recorded file while it
    is there, else the name's default; random weights with their seed), ``weights_sha256``
    (checked when the file is loaded), ``transform``, ``size`` and ``embed``."""
    from probe.store import open_store

    prov = open_store(path).provenance
    backbone = prov.get("backbone")
    if not backbone:
        raise FinetuneError(
            f"--store {path}: its provenance names no backbone (a store imported from "
            "precomputed features?); give --backbone and --weights instead"
        )
    out: dict[str, Any] = {"backbone": backbone, "embed": prov.get("embed", "auto")}
    if prov.get("weights_random"):
        seed = str(prov.get("weights", "")).removeprefix("random(seed=").rstrip(")")
        out.update(weights="random", weights_seed=int(seed) if seed.isdigit() else 0)
    else:
        file = prov.get("weights_file")
        if file and Path(file).is_file():
            out["weights"] = file
        elif str(prov.get("weights", "")).startswith("file:"):
            raise MissingPathError(
                f"--store {path}: its weights file {file} is not on this machine; copy it "
                f"there (sha256 {prov.get('weights_sha256')}) or pass --weights PATH"
            )
        else:
            out["weights"] = None  # the name's default weights, checked by their sha256
        out["weights_sha256"] = prov.get("weights_sha256")
    transform = prov.get("transform") or {}
    if transform.get("crop") is None and isinstance(transform.get("resize"), list):
        out.update(transform="protocol", size=int(transform.get("size", 448)))
    else:
        out["transform"] = "model"
    return out


def store_images(path: str | Path) -> dict[str, Any]:
    """The :class:`FinetuneConfig` fields that read the images of the feature store at ``path``
    again, as its provenance records them (:func:`featurize.image_source`): ``dataset`` (the
    adapter; for an older store, its dataset's registered name, else ``folder``), ``root``
    (absolute) and ``dataset_options``. Refused for a store of imported features."""
    from featurize.datasets import image_source, resolve_name
    from probe.store import open_store

    store = open_store(path)
    source = image_source(store.provenance)
    if source is None:
        raise FinetuneError(
            f"--store {path}: it holds imported features, so its provenance names no images; "
            "give the dataset and --root DIR"
        )
    adapter = source.adapter
    if adapter is None:
        try:
            adapter = resolve_name(source.dataset)
        except SpmlError:
            adapter = "folder"
    return {"dataset": adapter, "root": source.root, "dataset_options": dict(source.options)}
