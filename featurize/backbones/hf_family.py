"""``--backbone hf:<repo id or local folder>``: a transformers vision encoder built from the repo's
``config.json``, its image processor as the preprocessing, a chosen embedding (docs/backbones.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from featurize.backbones.base import (
    Backbone,
    WeightsError,
    WeightsInfo,
    WeightsNotFoundError,
    file_info,
    hub_file,
    local_weights,
    measured,
    package_version,
    seeded,
)
from featurize.extract.images import ImageTransform
from featurize.specs import DEFAULT, FAMILIES, BackboneSpec
from probe.errors import SpmlError

PREFIX = "hf:"
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_RESAMPLE = {2: "bilinear", 3: "bicubic"}  # PIL's codes in preprocessor_config.json
#: the vision encoder of a model type (CLIP's tower with its projection, SigLIP's tower); else
#: the model type's base model (AutoModel)
_VISION_CLASSES = {"clip": "CLIPVisionModelWithProjection", "clip_vision_model": "CLIPVisionModel",
                   "siglip": "SiglipVisionModel"}


_transformers = FAMILIES.get("hf").library  # with safetensors, the hub's weight format


def get_spec(name: str) -> BackboneSpec:
    _transformers()
    if not name[len(PREFIX) :].strip():
        raise SpmlError(
            f"--backbone {name!r}: name a Hugging Face repo or a local folder after 'hf:', e.g. "
            "hf:facebook/dinov2-base or hf:openai/clip-vit-base-patch16")
    return BackboneSpec(name, "hf", 0, default_weights=DEFAULT, note="transformers encoder")


def repo_file(repo: str, names: tuple[str, ...], fix: str, required: bool = True) -> Path | None:
    """A file of ``repo``: from the local folder ``repo``, else the hub cache (fetched there on
    first use)."""
    folder = Path(repo).expanduser()
    if folder.is_dir():
        found = next(((folder / n).resolve() for n in names if (folder / n).is_file()), None)
        if found is not None or not required:
            return found
        raise WeightsNotFoundError(
            f"backbone hf:{repo}: the folder {folder} has no {' or '.join(names)}; {fix}")
    try:
        return hub_file(repo, names, f"backbone hf:{repo}", fix)
    except WeightsNotFoundError:
        if required:
            raise
        return None


def resolve(spec: BackboneSpec, weights: str | None, download: bool = False) -> WeightsInfo:
    """The weights file (None/"default": the repo's own), found or fetched now; the repo's
    config.json must be here too (it builds the network)."""
    repo = spec.name.removeprefix(PREFIX)
    fix = "pass --weights PATH to a checkpoint and name a folder holding config.json"
    repo_file(repo, ("config.json",), fix)
    if local := local_weights(spec.name, weights, "the repo's weights",
                              ".safetensors, .bin, .pth, .pt"):
        return local
    path = repo_file(repo, _WEIGHT_FILES, "pass --weights PATH to a checkpoint")
    return file_info(path, f"hf:{repo}", url=None if Path(repo).is_dir() else f"hf-hub:{repo}")


def build(repo: str, weights_file: str | None = None) -> tuple[nn.Module, Any]:
    """The vision encoder that ``repo``'s config.json describes, and that config: with
    ``weights_file`` loaded by transformers' ``from_pretrained`` (refused if any encoder key is
    missing or of another shape), else default initialisation from the current RNG state."""
    config_file = repo_file(repo, ("config.json",), "name a folder holding config.json")
    config = _transformers().AutoConfig.from_pretrained(str(config_file.parent))
    cls = getattr(_transformers(), _VISION_CLASSES.get(config.model_type, "AutoModel"))
    vision = None  # the vision tower's config, for the towers of a two-tower model
    if cls is not _transformers().AutoModel:
        vision = getattr(config, "vision_config", config)
        if hasattr(config, "projection_dim"):  # CLIP's projection width is the whole model's
            vision.projection_dim = config.projection_dim
    if weights_file is None:
        return (cls.from_config(config) if vision is None else cls(vision)), config
    import tempfile

    weights = Path(weights_file)
    target = "model.safetensors" if weights.suffix == ".safetensors" else "pytorch_model.bin"
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one small bar per load: noise in featurize's output
    with tempfile.TemporaryDirectory(prefix="spml-hf-") as folder:
        (Path(folder) / "config.json").symlink_to(config_file)
        (Path(folder) / target).symlink_to(weights.resolve())
        try:
            options = {"local_files_only": True, "output_loading_info": True}
            if vision is not None:  # a CLIP checkpoint: its vision tower's config
                options["config"] = vision
            model, info = cls.from_pretrained(folder, **options)
        except (OSError, RuntimeError, ValueError, KeyError) as err:
            raise WeightsError(
                f"cannot load weights file {weights} into hf:{repo}: {err}") from None
        finally:
            if bar:
                hf_logging.enable_progress_bar()
    missing = sorted(info.get("missing_keys") or ())
    mismatched = list(info.get("mismatched_keys") or ())
    if missing or mismatched:
        raise WeightsError(
            f"weights file {weights} does not fit backbone 'hf:{repo}': {len(missing)} missing "
            f"keys (e.g. {missing[:3]}), {len(mismatched)} of another shape "
            f"(e.g. {mismatched[:3]})")
    return model, config


def processor_transform(repo: str) -> ImageTransform | None:
    """The repo's image processor (``preprocessor_config.json``) as an :class:`ImageTransform`
    (resize to ``shortest_edge`` or ``height``/``width``, resample, centre crop at offset
    ``(resized - crop) // 2``, mean, std); None without a processor file."""
    path = repo_file(repo, ("preprocessor_config.json",), "", required=False)
    if path is None:
        return None
    cfg = json.loads(path.read_text())

    def refuse(what: str) -> SpmlError:
        return SpmlError(
            f"backbone hf:{repo}: its image processor ({path}) {what}, which the featurizer "
            "does not reproduce; pass --transform protocol")

    size = cfg.get("size")
    if isinstance(size, int):
        size = {"shortest_edge": size}
    if not cfg.get("do_resize", True) or not isinstance(size, dict):
        raise refuse(f"resizes with size={size!r}")
    if "shortest_edge" in size and len(size) == 1:
        side, mode = int(size["shortest_edge"]), "shortest"
    elif set(size) == {"height", "width"} and size["height"] == size["width"]:
        side, mode = int(size["height"]), "square"
    else:
        raise refuse(f"resizes to {size}")
    crop = None
    if cfg.get("do_center_crop", False):
        c = cfg.get("crop_size")
        c = {"height": c, "width": c} if isinstance(c, int) else c
        if not isinstance(c, dict) or c.get("height") != c.get("width"):
            raise refuse(f"crops to {c}")
        crop = int(c["height"])
        mode = "squash" if mode == "square" else mode
    elif mode == "shortest":
        raise refuse("keeps the aspect ratio without a crop")
    resample = _RESAMPLE.get(cfg.get("resample", 3))
    if resample is None:
        raise refuse(f"resamples with PIL filter {cfg.get('resample')}")
    factor = float(cfg.get("rescale_factor", 1 / 255))
    if cfg.get("do_rescale", True) and abs(factor * 255 - 1) > 1e-6:
        raise refuse(f"rescales by {cfg.get('rescale_factor')}")
    if cfg.get("do_normalize", True):
        mean = tuple(float(v) for v in cfg.get("image_mean", (0.5, 0.5, 0.5)))
        std = tuple(float(v) for v in cfg.get("image_std", (0.5, 0.5, 0.5)))
    else:
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    return ImageTransform(size=side, crop=crop, mean=mean, std=std, interpolation=resample,
                          resize=mode, crop_rounding="floor")


class HFEmbedding(nn.Module):
    """A transformers vision encoder returning one ``(B, D)`` embedding (``_EMBEDDING``)."""

    def __init__(self, model: nn.Module, embed: str) -> None:
        super().__init__()
        self.model, self.embed = model, embed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed == "pooled" and hasattr(self.model, "visual_projection"):
            # CLIP's tower with its projection returns image_embeds only: the encoder's output
            return self.model.vision_model(pixel_values=x).pooler_output
        out = self.model(pixel_values=x)
        if self.embed == "projected":
            return out.image_embeds
        if self.embed == "pooled":
            return out.pooler_output
        return out.last_hidden_state[:, 1:].mean(1)


def _embed_choice(model: nn.Module, embed: str | None, name: str) -> str:
    pooled = (getattr(model, "pooler", True) is not None
              and getattr(getattr(model, "config", None), "model_type", "") != "vit_mae")
    can = [e for e, ok in (("projected", hasattr(model, "visual_projection")),
                           ("pooled", pooled), ("mean", True)) if ok]
    if embed in (None, "auto"):
        return can[0]
    if embed not in can:
        raise SpmlError(f"--embed {embed!r}: backbone {name!r} gives {', '.join(can)}")
    return embed


_EMBEDDING = {
    "projected": "image_embeds: CLIP's projected image embedding",
    "pooled": "pooler_output: the encoder's pooled output (before any projection)",
    "mean": "mean of last_hidden_state over the tokens after the first",
}


def load(spec: BackboneSpec, info: WeightsInfo, seed: int = 0, embed: str | None = None
         ) -> Backbone:
    repo = spec.name.removeprefix(PREFIX)
    model, config = seeded(seed, build, repo, None if info.random else info.path)
    chosen = _embed_choice(model, embed, spec.name)
    transform = processor_transform(repo)
    vision = getattr(config, "vision_config", config)
    side = transform.out_size if transform else int(getattr(vision, "image_size", 224))
    details = {"embedding": _EMBEDDING[chosen], "library": package_version("transformers"),
               "model_id": repo, "model_class": type(model).__name__,
               "model_type": config.model_type}
    return measured(spec, HFEmbedding(model, chosen), info, transform, chosen, details, side)
