"""``--backbone timm:<model>[.<tag>]``: any timm model, its data config as the preprocessing and
the classifier's input as the embedding (docs/backbones.md).
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path

import torch
from torch import nn

from featurize.backbones.base import (
    Backbone,
    WeightsError,
    WeightsInfo,
    check_fit,
    check_model,
    fetch_once,
    file_info,
    hub_file,
    load_into,
    local_weights,
    measured,
    package_version,
    pooled_only,
    read_state,
    seeded,
)
from featurize.extract.images import ImageTransform
from featurize.specs import DEFAULT, FAMILIES, BackboneSpec
from probe.errors import SpmlError

PREFIX = "timm:"
_HUB_FILES = ("model.safetensors", "pytorch_model.bin")


_timm = FAMILIES.get("timm").library


def get_spec(name: str) -> BackboneSpec:
    """The spec of ``timm:<model>[.<tag>]`` (its width is measured when it is loaded)."""
    timm = _timm()
    arch, _, tag = name[len(PREFIX) :].partition(".")
    check_model(name, "timm", "model", arch, timm.is_model(arch), timm.list_models, tag,
                lambda: [n.partition(".")[2] for n in timm.list_pretrained(f"{arch}.*")],
                "timm.list_models() lists them (e.g. timm:resnet50.a1_in1k, "
                "timm:convnext_large.fb_in22k)")
    return BackboneSpec(name, "timm", 0, default_weights=DEFAULT, note="timm model")


def resolve(spec: BackboneSpec, weights: str | None, download: bool = False) -> WeightsInfo:
    """The weights file for ``weights`` (None/"default": the tag's), found or fetched now."""
    model = spec.name[len(PREFIX) :]
    if local := local_weights(spec.name, weights, "the pretrained tag's weights",
                              ".pth, .pt, .safetensors"):
        return local
    if (cfg := _timm().models.get_pretrained_cfg(model)) is None:
        raise WeightsError(f"timm model {model!r} has no pretrained weights; pass --weights PATH "
                           "or --weights random")
    tagged = f"{cfg.architecture}.{cfg.tag}" if cfg.tag else model
    fix = f"pass --weights PATH to a {tagged} checkpoint"
    if cfg.hf_hub_id:
        names = (cfg.hf_hub_filename,) if cfg.hf_hub_filename else _HUB_FILES
        path = hub_file(cfg.hf_hub_id, names, f"timm model {tagged}", fix)
        return file_info(path, f"timm:{tagged}", url=f"hf-hub:{cfg.hf_hub_id}")
    if cfg.url:
        path = Path(torch.hub.get_dir()) / "checkpoints" / cfg.url.rsplit("/", 1)[-1]
        fetch_once(cfg.url, path, f"timm model {tagged}",
                   f"the torch hub cache {path.parent} (TORCH_HOME moves it)", fix,
                   lambda: torch.hub.download_url_to_file(cfg.url, str(path)))
        return file_info(path, f"timm:{tagged}", url=cfg.url)
    raise WeightsError(f"timm model {tagged} names no source for its weights; {fix}")


def _load_state(model: nn.Module, path: str, name: str) -> None:
    """Load a checkpoint without the classifier, in timm's layout or (converted by the model's
    ``checkpoint_filter_fn``) the original one; every key must fit."""
    names = model.pretrained_cfg.get("classifier") or ()
    drop = {f"{n}.{p}" for n in ((names,) if isinstance(names, str) else names)
            for p in ("weight", "bias")}
    state = {k: v for k, v in read_state(path).items() if k not in drop}
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError:  # tensors of other shapes: maybe the original layout, tried below
        result = None
    if result is None or result.missing_keys or result.unexpected_keys:
        convert = getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None)
        with contextlib.suppress(Exception):  # no converter, or not that layout: report below
            state = {k: v for k, v in convert(state, model).items() if k not in drop}
        result = load_into(model, state, path, name)
    check_fit(result, path, name)


def data_transform(model: nn.Module, name: str) -> ImageTransform:
    """timm's resolved eval data config as an :class:`ImageTransform` (timm's
    ``create_transform(**resolve_data_config(model=model))``: resize to ``floor(S / crop_pct)``,
    the shorter side (crop_mode "center") or both ("squash"), then the centre S×S crop)."""
    from timm.data import resolve_data_config

    cfg = resolve_data_config({}, model=model)
    _, h, w = cfg["input_size"]
    mode = cfg.get("crop_mode") or "center"
    interpolation = cfg.get("interpolation") or "bilinear"
    if h != w or mode not in ("center", "squash") or interpolation not in ("bilinear", "bicubic"):
        raise SpmlError(
            f"backbone {name!r}: timm's preprocessing (input {h}x{w}, crop_mode {mode}, "
            f"{interpolation}) is not one the featurizer reproduces; pass --transform protocol")
    crop_pct = cfg.get("crop_pct") or 1.0
    return ImageTransform(size=math.floor(h / crop_pct), crop=h,
                          mean=tuple(float(v) for v in cfg["mean"]),
                          std=tuple(float(v) for v in cfg["std"]), interpolation=interpolation,
                          resize="shortest" if mode == "center" else "squash")


def build(model: str, num_classes: int = 0) -> nn.Module:
    """The timm network ``model`` (default initialisation from the current RNG state)."""
    return _timm().create_model(model, pretrained=False, num_classes=num_classes)


def load(spec: BackboneSpec, info: WeightsInfo, seed: int = 0, embed: str | None = None
         ) -> Backbone:
    """Build ``spec``'s model without its classifier, load ``info``'s weights, measure the
    embedding width on one image of the model's input size."""
    pooled_only(embed, "a timm backbone gives 'pooled' (its classifier's input)")
    model_name = spec.name[len(PREFIX) :]
    model = seeded(seed, build, model_name)
    if not info.random:
        _load_state(model, info.path, spec.name)
    cfg = model.pretrained_cfg
    tag = f".{cfg['tag']}" if cfg.get("tag") else ""
    details = {"embedding": "timm forward_head(pre_logits=True): the classifier's input",
               "library": package_version("timm"),
               "model_id": f"{cfg.get('architecture', model_name)}{tag}",
               "hf_hub_id": cfg.get("hf_hub_id")}
    return measured(spec, model, info, data_transform(model, spec.name), "pooled", details)
