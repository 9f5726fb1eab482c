"""The torchvision family: the registry names and any torchvision classifier, pooled features with
the protocol's preprocessing (docs/protocol.md step 6). Weights come from the torch hub cache
(their sha256 prefix checked; fetched only with ``--download``), a file, or ``random``.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from featurize.backbones.base import (
    Backbone,
    WeightsError,
    WeightsInfo,
    WeightsNotFoundError,
    as_weights_path,
    check_fit,
    did_you_mean,
    load_into,
    pooled_only,
    read_state,
    seeded,
)
from featurize.specs import BACKBONES, DEFAULT, RANDOM, BackboneSpec, tv_spec  # torch-free
from probe.errors import SpmlError

_HASH_IN_NAME = re.compile(r"-([a-f0-9]{6,})\.[a-z]+$")  # torch.hub's convention


def list_backbones() -> list[str]:
    """Registry names; any other torchvision classification model name works too."""
    return list(BACKBONES)


def get_spec(name: str) -> BackboneSpec:
    """The registry entry for ``name``, or one built from another torchvision classifier (width
    = its classifier's input); an unknown name is refused with the closest known names."""
    if name in BACKBONES:
        return BACKBONES[name]
    import torchvision

    tv_names = torchvision.models.list_models(module=torchvision.models)
    if name in tv_names:
        try:
            with torch.device("meta"):
                model = torchvision.models.get_model(name, weights=None)
        except NotImplementedError:  # a builder that computes on tensors while building
            model = torchvision.models.get_model(name, weights=None)
        _, head = _strip_head(model, name)
        return tv_spec(name, int(head.in_features), "torchvision classifier, head removed")
    hint = did_you_mean(name, [*BACKBONES, *tv_names])
    raise SpmlError(
        f"unknown backbone {name!r}.{hint} Known: {', '.join(BACKBONES)}, or any torchvision "
        "classification model name (torchvision.models.list_models())")


def _strip_head(model: nn.Module, name: str) -> tuple[nn.Module, nn.Linear]:
    """Replace the final classifier Linear with Identity; return (model, removed Linear): ``fc``
    (ResNet, RegNet, …), ``classifier`` (a Linear, or a Sequential ending in one: ConvNeXt,
    EfficientNet, MobileNet, DenseNet, VGG), ``heads.head`` (ViT) or ``head`` (Swin, MaxViT)."""
    for attr in ("fc", "classifier", "heads", "head"):
        part = getattr(model, attr, None)
        if isinstance(part, nn.Linear):
            setattr(model, attr, nn.Identity())
            return model, part
        if isinstance(part, nn.Sequential):
            linears = [i for i, m in enumerate(part) if isinstance(m, nn.Linear)]
            if linears:
                head, part[linears[-1]] = part[linears[-1]], nn.Identity()
                return model, head
    raise SpmlError(
        f"backbone {name!r}: cannot find its classifier layer to take pooled features from "
        "(no Linear 'fc', 'classifier', 'heads' or 'head'); use a registry backbone")


def _architecture(spec: BackboneSpec) -> nn.Module:
    """The untrained network (default initialisation from the current RNG state)."""
    import torchvision

    return torchvision.models.get_model(spec.name, weights=None)


def hub_weights_path(name: str, weights: str) -> tuple[Path, str]:
    """``(cache path, url)`` of torchvision's weights ``weights`` (e.g. ``imagenet1k_v1``) for
    model ``name``: ``torch.hub.get_dir()/checkpoints/<file name of the url>``, where
    torchvision's own loader looks (``$TORCH_HOME`` moves it)."""
    import torchvision

    enum = torchvision.models.get_model_weights(name)
    key = weights.upper()
    if key not in enum.__members__:
        raise WeightsError(
            f"backbone {name!r} has no torchvision weights {weights!r}; available: "
            f"{', '.join(m.lower() for m in enum.__members__)}, 'random', or a file path")
    url = enum[key].url
    return Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1], url


def resolve(spec: BackboneSpec, weights: str | None, download: bool = False) -> WeightsInfo:
    """Find the weights file for ``weights`` (None/"default" = the backbone's standard ones)
    without loading it; every problem is raised here, before any work is done."""
    weights, path = chosen_weights(spec, weights)
    if path is not None:
        return hub_convention_info(path, f"file:{path.name}", None)
    path, url = hub_weights_path(spec.name, weights)
    if not path.is_file():
        if not download:
            raise WeightsNotFoundError(
                f"the {weights.lower()} weights of {spec.name} are not on this machine: expected "
                f"{path} (torch.hub cache; set TORCH_HOME to move it). Fetch {url} on a "
                f"connected machine and copy it there (e.g. curl -L -o {path.name} {url}), "
                "or re-run with --download where there is internet, or pass "
                "--weights PATH_TO_FILE")
        path.parent.mkdir(parents=True, exist_ok=True)
        match = _HASH_IN_NAME.search(path.name)
        torch.hub.download_url_to_file(url, str(path), hash_prefix=match and match.group(1))
    return hub_convention_info(path, weights.lower(), url)


def chosen_weights(spec: BackboneSpec, weights: str | None) -> tuple[str, Path | None]:
    """``weights`` (None/"default": the spec's standard ones) and the file it names, if it
    names one; "random" is refused (it has no file)."""
    weights = spec.default_weights if weights in (None, DEFAULT) else str(weights)
    if weights == RANDOM:
        raise WeightsError("random weights have no file; use load_backbone(..., weights='random')")
    return weights, as_weights_path(weights)


def hub_convention_info(path: Path, wid: str, url: str | None) -> WeightsInfo:
    """The :class:`WeightsInfo` of a weights file, its sha256 taken now and checked against the
    prefix in torch.hub's file names (``name-<sha256 prefix>.pth``: torchvision's and the Lite0
    package's; a user's own ``file:`` is not checked)."""
    from probe.store import file_sha256

    sha = file_sha256(path)
    match = _HASH_IN_NAME.search(path.name)
    if not wid.startswith("file:") and match and not sha.startswith(match.group(1)):
        fix = f"delete it and fetch {url} again" if url else "reinstall the package"
        raise WeightsError(
            f"weights file {path} is corrupt or incomplete: its sha256 {sha[:12]}… does not "
            f"start with {match.group(1)} as its name says; {fix}")
    return WeightsInfo(id=wid, sha256=sha, path=str(path), random=False, url=url)


def load_state(model: nn.Module, info: WeightsInfo, name: str) -> None:
    """Load ``info``'s file into ``model``, every key fitting (:func:`base.check_fit`)."""
    state = read_state(info.path)
    check_fit(load_into(model, state, info.path, name), info.path, name)


def check_size(spec: BackboneSpec, size: int) -> bool:
    """Run a (1, 3, size, size) input through the architecture on the meta device (no memory, no
    compute): a backbone that cannot take this size (ViT at 448) or a wrong feature width is
    refused before any work. The registry's names take any size."""
    if spec.name in BACKBONES:
        return True
    try:
        with torch.device("meta"):
            features, _ = _strip_head(_architecture(spec), spec.name)
            with torch.no_grad():
                out = features.eval()(torch.empty(1, 3, size, size))
    except NotImplementedError:  # an op or builder without meta support: nothing learned
        return True
    except (RuntimeError, AssertionError, ValueError) as err:
        raise SpmlError(f"backbone {spec.name!r} cannot take {size}x{size} images: {err}") from None
    if tuple(out.shape) != (1, spec.feature_dim):
        raise SpmlError(
            f"backbone {spec.name!r}: pooled features have shape {tuple(out.shape)[1:]}, "
            f"expected ({spec.feature_dim},)")
    return True


def load(spec: BackboneSpec, info: WeightsInfo, *, seed: int = 0, embed: str | None = None
         ) -> Backbone:
    """Build ``spec``'s network (seeded), load ``info``'s weights, remove the classifier (kept
    as ``head``, to classify with), frozen in eval mode: pooled features."""
    pooled_only(embed, f"backbone {spec.name!r} gives 'pooled' (global average pool)")
    model = seeded(seed, _architecture, spec)
    if not info.random:
        load_state(model, info, spec.name)
    features, head = _strip_head(model, spec.name)
    return frozen_backbone(spec, features, head, info)


def frozen_backbone(spec: BackboneSpec, features: nn.Module, head: nn.Linear,
                    info: WeightsInfo, details: dict | None = None) -> Backbone:
    """The :class:`Backbone` of a network whose classifier ``head`` was removed, both frozen in
    eval mode; the classifier's input width must be the registry's."""
    if int(head.in_features) != spec.feature_dim:
        raise SpmlError(
            f"backbone {spec.name!r}: its classifier takes {head.in_features} features, the "
            f"registry says {spec.feature_dim}")
    features.eval().requires_grad_(False)
    head.eval().requires_grad_(False)
    return Backbone(spec=spec, features=features, head=head, weights=info,
                    details=dict(details or {}))
