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
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PRECISION_CHOICES",
    "RANDOM",
    "BackboneSpec",
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


