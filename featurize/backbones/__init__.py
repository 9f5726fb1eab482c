"""Frozen backbones for the featurizer: one registry of names, honest weights, one embedding per
image (docs/backbones.md; docs/protocol.md step 7 for the protocol's ResNet-50).

Every family implements :class:`Family` and sits in one registry (:func:`register_family`,
:func:`list_families`, :func:`family_for`): ``torchvision`` (the registry's names and any
torchvision classifier), ``lite0`` (``efficientnet_lite0``, weights in a package: works offline),
``timm:<model>[.<tag>]``, ``open_clip:<arch>/<pretrained>`` (:func:`load_clip` gives the whole
model) and ``hf:<repo id or folder>``, each in ``featurize.backbones.<name>_family``. Weights are
real or refused: the library's cache (torchvision's fetched only with ``--download``), a local
checkpoint, or ``random`` (marked in the store); a missing file is an error before any work.
"""

from __future__ import annotations

from featurize.backbones.base import (
    Backbone,
    WeightsError,
    WeightsInfo,
    WeightsNotFoundError,
    input_check,
    random_info,
)
from featurize.backbones.open_clip_family import load_clip
from featurize.backbones.torchvision_family import hub_weights_path, list_backbones
from featurize.specs import (
    BACKBONES,
    DEFAULT,
    DEFAULT_BACKBONE,
    FAMILIES,
    RANDOM,
    BackboneSpec,
    Family,
    family_for,
    list_families,
    register_family,
)
from probe.errors import SpmlError

__all__ = ["BACKBONES", "DEFAULT", "DEFAULT_BACKBONE", "FAMILIES", "RANDOM", "Backbone",
           "BackboneSpec", "Family", "WeightsError", "WeightsInfo", "WeightsNotFoundError",
           "describe_families", "family_for", "family_status", "get_spec", "hub_weights_path",
           "list_backbones", "list_families", "load_backbone", "load_clip", "register_family",
           "resolve_weights"]


def get_spec(name: str) -> BackboneSpec:
    """The registry entry for ``name``: a registry or torchvision name, or a library-qualified
    one (whose ``feature_dim`` is 0 until the model is loaded and measured)."""
    return family_for(name).get_spec(name)


def resolve_weights(spec: BackboneSpec, weights: str | None, download: bool = False) -> WeightsInfo:
    """Find (or, where the family does that, fetch into the library's cache) the weights file
    for ``weights`` without building the model: every problem is raised here, before any work."""
    return family_for(spec.name).resolve(spec, weights, download)


def load_backbone(name: str = DEFAULT_BACKBONE, weights: str | None = None, *, seed: int = 0,
                  download: bool = False, size: int | None = None, embed: str | None = None
                  ) -> Backbone:
    """Build backbone ``name`` with ``weights`` (None/"default": its standard pretrained
    weights; a torchvision weights name; a file path; or "random" with ``seed``), in eval mode
    with frozen parameters, returning one embedding per image (``embed``: the family's choice;
    None = its default). ``size`` (pixels) checks that the backbone takes size×size inputs
    (the protocol's transform) before any work."""
    family = family_for(name)
    spec = family.get_spec(name)
    checked = size is not None and family.check_size(spec, int(size))
    info = random_info(seed) if weights == RANDOM else family.resolve(spec, weights, download)
    backbone = family.load(spec, info, seed=seed, embed=embed)
    if not isinstance(backbone, Backbone):
        raise SpmlError(f"backbone family {family.name!r}: load() returned "
                        f"{type(backbone).__name__}, not a featurize.backbones.Backbone")
    if (size is not None and not checked
            and (backbone.transform is None or backbone.transform.out_size != size)):
        input_check(backbone.features, int(size), name, hint="; use --transform model")
    return backbone


def family_status() -> list[dict]:
    """Which backbone families are registered and installed: ``{"family", "installed",
    "version", "install", "syntax", "example", "embeds", "note"}`` each, in registration order
    (the built-ins first)."""
    status = []
    for f in list_families():
        installed = f.installed()
        syntax = f"{f.name}:{f.syntax}" if f.qualified else f.syntax
        status.append({"family": f.name, "installed": installed,
                       "version": f.version() if installed else None, "install": f.install,
                       "syntax": syntax, "example": f.example, "embeds": list(f.embeds),
                       "note": f.note})
    return status


def describe_families() -> str:
    """``spml backbones``: the families, installed or not and how to add them, the registry."""
    lines = ["backbone families (--backbone):"]
    for s in family_status():
        state = (s["version"] or "installed") if s["installed"] else "NOT INSTALLED"
        lines.append(f"  {s['family']:<12} {s['syntax']:<40} {state}")
        if s["install"] != "(core)":
            lines.append(f"  {'':<12} install: {s['install']}")
        lines.append(f"  {'':<12} e.g. --backbone {s['example']}; --embed {'|'.join(s['embeds'])}")
        lines.append(f"  {'':<12} {s['note']}")
    for failure in FAMILIES.failures():
        lines.append(f"  {failure.entry_point:<12} FAILED TO LOAD: {failure}")
    lines.append("registry names (torchvision; the protocol's preprocessing by default):")
    lines += [f"  {n:<20} {spec.feature_dim:>5}-d  {spec.note}" for n, spec in BACKBONES.items()]
    return "\n".join(lines)
