"""``--backbone open_clip:<arch>/<pretrained>``: an OpenCLIP image tower, its eval preprocessing,
the projected or pooled embedding (docs/backbones.md); :func:`load_clip`: the whole model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    local_weights,
    measured,
    package_version,
    random_info,
    seeded,
)
from featurize.extract.images import ImageTransform
from featurize.specs import DEFAULT, FAMILIES, RANDOM, BackboneSpec
from probe.errors import SpmlError

PREFIX = "open_clip:"
_HUB_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


_open_clip = FAMILIES.get("open_clip").library


def parse(name: str) -> tuple[str, str | None]:
    """``open_clip:<arch>[/<pretrained>]`` → ``(arch, pretrained or None)``."""
    arch, _, tag = name.removeprefix(PREFIX).partition("/")
    return arch, tag or None


def get_spec(name: str) -> BackboneSpec:
    open_clip = _open_clip()
    arch, tag = parse(name)
    check_model(name, "OpenCLIP", "architecture", arch, arch in open_clip.list_models(),
                open_clip.list_models, tag, lambda: open_clip.list_pretrained_tags_by_model(arch),
                "open_clip.list_pretrained() lists (arch, pretrained) pairs, e.g. "
                "open_clip:ViT-B-16/openai")
    return BackboneSpec(name, "open_clip", 0, default_weights=DEFAULT, note="OpenCLIP image tower")


def resolve(spec: BackboneSpec, weights: str | None, download: bool = False) -> WeightsInfo:
    """The weights file for ``weights`` (None/"default": the pretrained tag's), found in the
    Hugging Face hub cache or fetched into it now."""
    open_clip = _open_clip()
    arch, tag = parse(spec.name)
    if local := local_weights(spec.name, weights, "the pretrained tag's weights",
                              ".pt, .pth, .bin, .safetensors"):
        return local
    fix = f"pass --weights PATH to a {arch} checkpoint"
    if tag is None:
        raise WeightsError(
            f"--backbone {spec.name}: name the pretrained weights (open_clip:{arch}/<tag>; "
            f"tags: {', '.join(open_clip.list_pretrained_tags_by_model(arch)) or 'none'}), or "
            "pass --weights PATH or --weights random")
    cfg = open_clip.get_pretrained_cfg(arch, tag)
    hub = (cfg.get("hf_hub") or "").strip("/")
    what = f"OpenCLIP {arch}/{tag}"
    if hub:
        repo, names = hub, _HUB_FILES
        parts = hub.split("/")
        if len(parts) > 2:  # "org/repo/file name"
            repo, names = "/".join(parts[:2]), ("/".join(parts[2:]),)
        path = hub_file(repo, names, what, fix)
        return file_info(path, f"open_clip:{arch}/{tag}", url=f"hf-hub:{repo}")
    url = cfg.get("url")
    if not url:
        raise WeightsError(f"{what} names no source for its weights; {fix}")
    cache = Path.home() / ".cache" / "clip"
    path = fetch_once(url, cache / url.rsplit("/", 1)[-1], what, f"OpenCLIP's cache {cache}", fix,
                      lambda: open_clip.download_pretrained_from_url(url, cache_dir=str(cache)))
    return file_info(path, f"open_clip:{arch}/{tag}", url=url)


_PREPROCESS_KEYS = ("mean", "std", "interpolation", "resize_mode")


def build(arch: str, tag: str | None = None) -> nn.Module:
    """The whole CLIP model ``arch`` (default initialisation) with the tag's QuickGELU and
    preprocessing (``visual.preprocess_cfg``), as ``create_model(arch, pretrained=tag)`` sets."""
    open_clip = _open_clip()
    cfg = open_clip.get_pretrained_cfg(arch, tag) if tag else {}
    return open_clip.create_model(
        arch, pretrained=None, force_quick_gelu=bool(cfg.get("quick_gelu", False)),
        force_preprocess_cfg={k: cfg[k] for k in _PREPROCESS_KEYS if k in cfg})


def model_transform(model: nn.Module) -> ImageTransform:
    """OpenCLIP's eval transform of ``model`` (its ``visual.preprocess_cfg``) as an
    :class:`ImageTransform`: the shorter side to S, the centre S×S crop ("shortest"), or an
    S×S resize ("squash"); bicubic or bilinear; the model's mean and std."""
    cfg = dict(getattr(model.visual, "preprocess_cfg", {}) or {})
    size = cfg.get("size", getattr(model.visual, "image_size", 224))
    size = (size, size) if isinstance(size, int) else tuple(size)
    mode = cfg.get("resize_mode", "shortest")
    interpolation = cfg.get("interpolation", "bicubic")
    if (size[0] != size[1] or mode not in ("shortest", "squash")
            or interpolation not in ("bicubic", "bilinear")):
        raise SpmlError(
            f"OpenCLIP's preprocessing of this model (size {size}, {mode}, {interpolation}) is "
            "not one the featurizer reproduces; pass --transform protocol")
    mean = tuple(float(v) for v in cfg.get("mean", (0.48145466, 0.4578275, 0.40821073)))
    std = tuple(float(v) for v in cfg.get("std", (0.26862954, 0.26130258, 0.27577711)))
    side, shortest = int(size[0]), mode == "shortest"
    return ImageTransform(size=side, crop=side if shortest else None, mean=mean, std=std,
                          interpolation=interpolation, resize="shortest" if shortest else "square")


def _loaded(name: str, info: WeightsInfo, seed: int) -> nn.Module:
    """The whole CLIP model of ``name`` (seeded) with ``info``'s weights, every key fitting."""
    model = seeded(seed, build, *parse(name))
    if not info.random:
        try:
            result = _open_clip().load_checkpoint(model, info.path, strict=False)
        except (RuntimeError, KeyError, ValueError) as err:
            raise WeightsError(f"weights file {info.path} does not fit backbone {name!r}: {err}"
                               ) from None
        check_fit(result, info.path, name)
    return model


@dataclass
class ClipModel:
    """A whole OpenCLIP model (both towers, eval mode, frozen), its tokenizer, its eval
    preprocessing (PIL image → tensor) and the same as an :class:`ImageTransform`."""

    name: str  # "open_clip:<arch>[/<pretrained>]"
    model: nn.Module
    tokenizer: Any
    preprocess: Any
    transform: ImageTransform
    weights: WeightsInfo

    def provenance(self) -> dict:
        arch, tag = parse(self.name)
        return {"library": package_version("open_clip_torch"),
                "model_id": f"{arch}/{tag}" if tag else arch, "weights": self.weights.id,
                "weights_sha256": self.weights.sha256, "weights_file": self.weights.path,
                "weights_random": self.weights.random}


def load_clip(name: str, weights: str | None = None, *, seed: int = 0) -> ClipModel:
    """The whole CLIP model of ``open_clip:<arch>[/<pretrained>]`` with ``weights`` (None: the
    tag's, from the hub cache or fetched; a checkpoint path; "random" with ``seed``), plus its
    tokenizer and preprocessing. Missing weights offline are refused before anything is built."""
    name = name if name.startswith(PREFIX) else PREFIX + name
    spec = get_spec(name)
    info = random_info(seed) if weights == RANDOM else resolve(spec, weights)
    open_clip = _open_clip()
    model = _loaded(name, info, seed)
    model.eval().requires_grad_(False)
    transform = model_transform(model)
    from open_clip.transform import PreprocessCfg, image_transform_v2

    preprocess = image_transform_v2(PreprocessCfg(**model.visual.preprocess_cfg), is_train=False)
    tokenizer = open_clip.get_tokenizer(parse(name)[0])
    return ClipModel(name, model, tokenizer, preprocess, transform, info)


_EMBEDDING = {
    "projected": "OpenCLIP encode_image (normalize=False): CLIP's projected image embedding",
    "pooled": "OpenCLIP ViT pooled output before the projection (visual.proj)",
}


def load(spec: BackboneSpec, info: WeightsInfo, seed: int = 0, embed: str | None = None
         ) -> Backbone:
    arch, tag = parse(spec.name)
    embed = "projected" if embed in (None, "auto") else embed
    if embed not in _EMBEDDING:
        raise SpmlError(f"--embed {embed!r}: an OpenCLIP backbone gives projected or pooled")
    model = _loaded(spec.name, info, seed)
    visual = model.visual
    if embed == "pooled":
        if not isinstance(getattr(visual, "proj", None), torch.Tensor):
            raise SpmlError(
                f"--embed pooled: {arch}'s image tower has no separate final projection "
                "(only OpenCLIP's ViTs do); use --embed projected")
        visual.proj = None  # this model's own tower: the pooled output is returned
    details = {"embedding": _EMBEDDING[embed], "library": package_version("open_clip_torch"),
               "model_id": f"{arch}/{tag}" if tag else arch}
    return measured(spec, visual, info, model_transform(model), embed, details)
