"""The featurizer's registries and choices, without torch: what ``spml featurize --help`` lists
and the settings' valid values. :mod:`featurize.backbones` builds the models these names denote.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BACKBONES",
    "DECODE_CHOICES",
    "DEFAULT",
    "DEFAULT_BACKBONE",
    "EMBED_CHOICES",
    "FAMILIES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PRECISION_CHOICES",
    "RANDOM",
    "TRANSFORM_CHOICES",
    "BackboneSpec",
    "Family",
    "family_of",
    "tv_spec",
]

#: ImageNet's per-channel statistics (torchvision's models, docs/protocol.md step 6)
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)
DECODE_CHOICES: tuple[str, ...] = ("auto", "pil", "torchvision")
PRECISION_CHOICES: tuple[str, ...] = ("auto", "fp32", "bf16")

DEFAULT_BACKBONE = "resnet50"
RANDOM = "random"
DEFAULT = "default"  # the backbone's standard pretrained weights
# EfficientNet-Lite ("edge") models were trained with inception-style input scaling:
# (x - 127) / 128 on 0..255 pixels (tensorflow/tpu efficientnet/lite, MEAN_RGB / STDDEV_RGB)
_LITE_MEAN = (127.0 / 255, 127.0 / 255, 127.0 / 255)
_LITE_STD = (128.0 / 255, 128.0 / 255, 128.0 / 255)


@dataclass(frozen=True)
class BackboneSpec:
    """One registry entry."""

    name: str
    family: str  # "torchvision" (any torchvision classifier) or "efficientnet_lite"
    feature_dim: int  # pooled-feature width (the classifier's input)
    mean: tuple[float, float, float] = IMAGENET_MEAN  # the weights' own input normalisation
    std: tuple[float, float, float] = IMAGENET_STD
    default_weights: str = "imagenet1k_v1"  # what pretrained=True meant for these papers
    note: str = ""


def tv_spec(name: str, dim: int, note: str = "") -> BackboneSpec:
    return BackboneSpec(name, "torchvision", dim, note=note)


BACKBONES: dict[str, BackboneSpec] = {
    s.name: s
    for s in (
        tv_spec("resnet50", 2048, "the protocol's backbone (Cole et al. 2021 and followers)"),
        tv_spec("resnet18", 512),
        tv_spec("resnet34", 512),
        tv_spec("resnet101", 2048),
        tv_spec("resnet152", 2048),
        tv_spec("wide_resnet50_2", 2048),
        tv_spec("resnext50_32x4d", 2048),
        tv_spec("convnext_tiny", 768, "pooled + LayerNorm (the classifier's input)"),
        tv_spec("convnext_small", 768, "pooled + LayerNorm (the classifier's input)"),
        tv_spec("convnext_base", 1024, "pooled + LayerNorm (the classifier's input)"),
        tv_spec("efficientnet_b0", 1280),
        tv_spec("mobilenet_v3_large", 1280, "after the classifier's hidden layer"),
        BackboneSpec(
            "efficientnet_lite0",
            "efficientnet_lite",
            1280,
            mean=_LITE_MEAN,
            std=_LITE_STD,
            default_weights="imagenet",
            note="ImageNet weights shipped in a package: works offline (extra 'lite0')",
        ),
    )
}


@dataclass(frozen=True)
class Family:
    """A library-qualified backbone family: ``--backbone <prefix>:<model>`` (docs/backbones.md)."""

    prefix: str  # "timm", "open_clip", "hf"
    modules: tuple[str, ...]  # what must be importable
    extra: str  # pip install -e '.[<extra>]'
    syntax: str  # the name after the prefix
    example: str
    embeds: tuple[str, ...]  # --embed choices, the default first
    note: str


FAMILIES: dict[str, Family] = {
    f.prefix: f
    for f in (
        Family(
            "timm",
            ("timm",),
            "timm",
            "<model>[.<pretrained tag>]",
            "timm:convnext_large.fb_in22k",
            ("pooled",),
            "any timm model; pooled = its classifier's input (forward_head(pre_logits=True))",
        ),
        Family(
            "open_clip",
            ("open_clip",),
            "clip",
            "<arch>/<pretrained>",
            "open_clip:ViT-B-16/openai",
            ("projected", "pooled"),
            "the image tower of an OpenCLIP model; projected = CLIP's image embedding "
            "(encode_image), pooled = the ViT's pooled output before the projection",
        ),
        Family(
            "hf",
            ("transformers", "safetensors"),
            "hf",
            "<repo id or local folder>",
            "hf:facebook/dinov2-base",
            ("pooled", "projected", "mean"),
            "a transformers vision encoder (CLIP vision, DINOv2, ...); pooled = pooler_output, "
            "projected = CLIP's image_embeds, mean = the mean of the patch tokens",
        ),
    )
}
#: --embed: the family's default, or one of its Family.embeds
EMBED_CHOICES: tuple[str, ...] = ("auto", "pooled", "projected", "mean")
#: --transform: auto = the model's own preprocessing for library-qualified backbones, the
#: protocol's for the registry (torchvision) names; model; protocol (docs/protocol.md step 6)
TRANSFORM_CHOICES: tuple[str, ...] = ("auto", "model", "protocol")


def family_of(name: str) -> Family | None:
    """The library family of a qualified backbone name (``timm:...``), None for the registry's
    (torchvision) names."""
    prefix, sep, _ = str(name).partition(":")
    return FAMILIES.get(prefix) if sep else None

