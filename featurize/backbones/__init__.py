"""Frozen backbones for the featurizer: one registry of names, honest weights, one embedding per
image (docs/backbones.md; docs/protocol.md step 7 for the protocol's ResNet-50).

Names:

* the registry's and torchvision's names (``resnet50``, ``efficientnet_lite0``, any torchvision
  classifier): :mod:`featurize.backbones.torchvision_family`, the protocol's preprocessing;
* ``timm:<model>[.<tag>]``: :mod:`featurize.backbones.timm_family`;
* ``open_clip:<arch>/<pretrained>``: :mod:`featurize.backbones.open_clip_family` (the image
  tower; :func:`load_clip` gives the whole model, tokenizer and preprocessing);
* ``hf:<repo id or folder>``: :mod:`featurize.backbones.hf_family`.

Weights are real or refused: the library's own cache (downloaded there on first use, except
torchvision's, which only ``--download`` fetches), a local checkpoint (``--weights PATH``), or
``random`` (marked in the store). A missing file offline is an error before any work, naming the
file and the cache it belongs in.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from featurize.backbones.base import (
    Backbone,
    WeightsError,
    WeightsInfo,
    WeightsNotFoundError,
    input_check,
    package_version,
    random_info,
)
from featurize.backbones.torchvision_family import (
    hub_weights_path,
    list_backbones,
    lite0_weights_file,
)
from featurize.specs import (
    BACKBONES,
    DEFAULT,
    DEFAULT_BACKBONE,
    FAMILIES,
    RANDOM,
    BackboneSpec,
    family_of,
)
from probe.errors import SpmlError

__all__ = [
    "BACKBONES",
    "DEFAULT",
    "DEFAULT_BACKBONE",
    "FAMILIES",
    "RANDOM",
    "Backbone",
    "BackboneSpec",
    "WeightsError",
    "WeightsInfo",
    "WeightsNotFoundError",
    "describe_families",
    "family_status",
    "get_spec",
    "hub_weights_path",
    "list_backbones",
    "lite0_weights_file",
    "load_backbone",
    "load_clip",
    "resolve_weights",
]


def _module(spec_or_name: BackboneSpec | str) -> ModuleType:
    name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.name
    family = family_of(name)
    if family is None:
        if ":" in name and not name.startswith(("/", ".")):
            prefix = name.partition(":")[0]
            raise SpmlError(
                f"--backbone {name!r}: unknown library {prefix!r}; the families are "
                f"{', '.join(f + ':' for f in FAMILIES)} or a registry/torchvision name "
                "('spml backbones' lists them)"
            )
        return importlib.import_module("featurize.backbones.torchvision_family")
    return importlib.import_module(f"featurize.backbones.{family.prefix}_family")


def get_spec(name: str) -> BackboneSpec:
    """The registry entry for ``name``: a registry or torchvision name, or a library-qualified
    one (whose ``feature_dim`` is 0 until the model is loaded and measured)."""
    return _module(name).get_spec(name)


def resolve_weights(spec: BackboneSpec, weights: str | None, download: bool = False) -> WeightsInfo:
    """Find (or, where the family does that, fetch into the library's cache) the weights file
    for ``weights`` without building the model: every problem is raised here, before any work."""
    module = _module(spec)
    if module.__name__.endswith("torchvision_family"):
        return module.resolve_weights(spec, weights, download=download)
    return module.resolve(spec, weights, download=download)


def load_backbone(
    name: str = DEFAULT_BACKBONE,
    weights: str | None = None,
    *,
    seed: int = 0,
    download: bool = False,
    size: int | None = None,
    embed: str | None = None,
) -> Backbone:
    """Build backbone ``name`` with ``weights`` (None/"default": its standard pretrained
    weights; a torchvision weights name; a file path; or "random" with ``seed``), in eval mode
    with frozen parameters, returning one embedding per image (``embed``: the family's choice;
    None = its default). ``size`` (pixels) checks that the backbone takes size×size inputs
    (the protocol's transform) before any work."""
    module = _module(name)
    if module.__name__.endswith("torchvision_family"):
        if embed not in (None, "auto", "pooled"):
            raise SpmlError(
                f"--embed {embed!r}: backbone {name!r} gives 'pooled' (global average pool)"
            )
        return module.load(name, weights, seed=seed, download=download, size=size)
    spec = module.get_spec(name)
    info = random_info(seed) if weights == RANDOM else module.resolve(spec, weights, download)
    backbone = module.load(spec, info, seed=seed, embed=embed)
    if size is not None and (backbone.transform is None or backbone.transform.out_size != size):
        input_check(backbone.features, int(size), name, hint="; use --transform model")
    return backbone


def load_clip(name: str, weights: str | None = None, *, seed: int = 0):
    """The whole OpenCLIP model of ``open_clip:<arch>/<pretrained>`` (image and text towers),
    its tokenizer and its preprocessing (:class:`open_clip_family.ClipModel`)."""
    from featurize.backbones.open_clip_family import load_clip as _load

    return _load(name, weights, seed=seed)


def family_status() -> list[dict]:
    """Which backbone families are installed: ``{"family", "installed", "version", "install",
    "syntax", "example", "embeds", "note"}`` each, torchvision first."""
    out = [
        {
            "family": "torchvision",
            "installed": True,
            "version": package_version("torchvision"),
            "install": "(core)",
            "syntax": "<name>",
            "example": DEFAULT_BACKBONE,
            "embeds": ["pooled"],
            "note": "the registry names and any torchvision classifier; protocol preprocessing",
        }
    ]
    dists = {"timm": "timm", "open_clip": "open_clip_torch", "hf": "transformers"}
    for f in FAMILIES.values():
        ok = all(importlib.util.find_spec(m) is not None for m in f.modules)
        out.append(
            {
                "family": f.prefix,
                "installed": ok,
                "version": package_version(dists[f.prefix]) if ok else None,
                "install": f"pip install -e '.[{f.extra}]'",
                "syntax": f"{f.prefix}:{f.syntax}",
                "example": f.example,
                "embeds": list(f.embeds),
                "note": f.note,
            }
        )
    return out


def describe_families() -> str:
    """``spml backbones``: the families, installed or not and how to add them, the registry."""
    lines = ["backbone families (--backbone):"]
    for s in family_status():
        state = s["version"] if s["installed"] else "NOT INSTALLED"
        lines.append(f"  {s['family']:<12} {s['syntax']:<40} {state}")
        if s["install"] != "(core)":
            lines.append(f"  {'':<12} install: {s['install']}")
        lines.append(f"  {'':<12} e.g. --backbone {s['example']}; --embed {'|'.join(s['embeds'])}")
        lines.append(f"  {'':<12} {s['note']}")
    lines.append("registry names (torchvision; the protocol's preprocessing by default):")
    lines += [f"  {n:<20} {spec.feature_dim:>5}-d  {spec.note}" for n, spec in BACKBONES.items()]
    return "\n".join(lines)

