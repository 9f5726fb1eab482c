"""Dataset adapters: each reads one on-disk layout (docs/protocol.md "Official dataset layouts") and
returns a :class:`DatasetIndex` (pool = official train split, test = official val/test split).

>>> index = load_dataset("voc", "/data/pascal")          # doctest: +SKIP
>>> index.pool.labels.shape, index.class_names[:2]        # doctest: +SKIP
((5717, 20), ('aeroplane', 'bicycle'))

Adapters are imported on first use (``DATASETS.get(name).target`` is ``"module:function"``), so
a missing optional adapter module only matters to whoever asks for it. Other packages add
adapters through the entry-point group ``spml_probe.datasets`` (:class:`DatasetAdapter`).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from probe.errors import MissingPathError, SpmlError
from probe.registry import Registry
from probe.store.index import DatasetIndex, Phase

from ._parse import DatasetFormatError

__all__ = ["ALIASES", "DATASETS", "DatasetAdapter", "DatasetEntry", "DatasetFormatError",
           "DatasetIndex", "ImageSource", "Phase", "UnknownDatasetError", "image_source",
           "list_datasets", "load_dataset", "register_dataset", "resolve_name"]


class UnknownDatasetError(SpmlError):
    """A dataset name that is not registered (the message suggests the closest one)."""


@dataclass(frozen=True)
class DatasetEntry:
    """One registered adapter."""

    name: str
    target: str  # "module:function", imported lazily so the registry never needs every module
    summary: str  # one line for ``--help`` and ``list_datasets``

    def loader(self) -> Callable[..., DatasetIndex]:
        """The adapter function (imports its module now)."""
        module_name, func_name = self.target.split(":")
        try:
            return getattr(importlib.import_module(module_name), func_name)
        except ModuleNotFoundError as e:
            raise ImportError(f"dataset '{self.name}' needs the module {module_name}, which could "
                              f"not be imported ({e})") from e


class DatasetAdapter(Protocol):
    """What an adapter is: a function of the dataset's folder and its keyword options that
    returns a :class:`DatasetIndex` (pool = the official train split, test = the official
    val/test split, class names, per-image paths). Its docstring's first line is its summary.
    An installed package adds one through the entry-point group ``spml_probe.datasets``
    (docs/plugins.md)."""

    def __call__(self, root: Path, **options: Any) -> DatasetIndex: ...


def _adopt_adapter(name: str, obj: Any) -> DatasetEntry:
    """What a ``spml_probe.datasets`` entry point names, as the entry to register: a
    :class:`DatasetEntry` named like the entry point, or an adapter function (its docstring's
    first line the summary)."""
    if isinstance(obj, DatasetEntry):
        if obj.name != name:
            raise SpmlError(f"the entry point's name {name!r} must be the adapter's name; the "
                            f"DatasetEntry is named {obj.name!r}")
        return obj
    if not callable(obj) or not hasattr(obj, "__qualname__"):
        raise SpmlError(f"a dataset entry point must name an adapter function (root, **options)"
                        f" -> DatasetIndex, or a DatasetEntry; it names {obj!r}")
    doc = (obj.__doc__ or "").strip().splitlines()
    summary = doc[0] if doc else f"dataset adapter {obj.__qualname__}"
    return DatasetEntry(name, f"{obj.__module__}:{obj.__qualname__}", summary)


#: the dataset adapters by name: the built-ins below (each imported on first use), the user's
#: own (:func:`register_dataset`) and the plugins of the entry-point group spml_probe.datasets
DATASETS: Registry[DatasetEntry] = Registry(
    "dataset adapter", "spml_probe.datasets", builtin="the built-in adapter",
    builtin_modules=("featurize.",), adopt=_adopt_adapter,
    form="one adapter function or DatasetEntry as 'module:object'",
    unknown_error=UnknownDatasetError)


def register_dataset(entry: DatasetEntry) -> DatasetEntry:
    """Add an adapter to the registry: ``spml featurize NAME`` and :func:`load_dataset` read
    with it. A name already taken is refused."""
    if not isinstance(entry, DatasetEntry):
        raise TypeError(f"register_dataset: {entry!r} is not a featurize.datasets.DatasetEntry")
    module = entry.target.partition(":")[0]
    return DATASETS.add(entry.name, entry, module=module)


for _entry in (
    DatasetEntry("voc", "featurize.datasets.voc:load_voc",
                 "PASCAL VOC 2012: VOCdevkit/VOC2012/ImageSets/Main/{class}_{train,val}.txt"),
    DatasetEntry("coco", "featurize.datasets.coco:load_coco",
                 "MS-COCO 2014: annotations/instances_{train,val}2014.json + {train,val}2014/"),
    DatasetEntry(
        "nus", "featurize.datasets.nus:load_nus",
        "NUS-WIDE official release: ImageList/, Groundtruth/TrainTestLabels/, Concepts81.txt"),
    DatasetEntry("cub", "featurize.datasets.cub:load_cub",
                 "CUB-200-2011 attributes: images.txt, train_test_split.txt, attributes/"),
    DatasetEntry("folder", "featurize.datasets.folder:load_folder",
                 "your images + a CSV (path,label1;label2[,split]) or JSON-lines annotation file"),
    DatasetEntry(
        "cole", "featurize.datasets.cole:load_cole_formatted",
        "Cole et al.'s formatted_{train,val}_{labels,images}.npy (option dataset=voc|coco|…)"),
):
    register_dataset(_entry)


#: Other spellings in use (Cole et al.'s code says "pascal" and "nuswide").
ALIASES: dict[str, str] = {"pascal": "voc", "nuswide": "nus", "nus-wide": "nus", "cub200": "cub"}


def list_datasets() -> list[str]:
    """The registered dataset names, in registry order (the built-ins first, then every
    installed plugin that loads)."""
    return DATASETS.names()


def resolve_name(name: str) -> str:
    """The registered name for ``name`` (case-insensitive, aliases allowed), else
    :class:`UnknownDatasetError` with the closest suggestion."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in DATASETS or key in DATASETS.entry_points():
        return DATASETS.get(key).name  # a plugin's entry point is imported here
    known = DATASETS.names()
    close = difflib.get_close_matches(key, [*known, *ALIASES], n=1, cutoff=0.5)
    hint = f"did you mean '{ALIASES.get(close[0], close[0])}'? " if close else ""
    raise UnknownDatasetError(f"unknown dataset {name!r}; {hint}known: {', '.join(known)}")


def load_dataset(name: str, root: str | Path, **options: Any) -> DatasetIndex:
    """Read dataset ``name`` from ``root`` with the adapter's keyword ``options`` (e.g.
    ``check_images=False``); unknown options are refused, listing the accepted ones."""
    entry = DATASETS.get(resolve_name(name))
    root = Path(root).expanduser()
    if not root.exists():
        raise MissingPathError(f"dataset root for '{entry.name}' not found: {root}")
    loader = entry.loader()
    params = list(inspect.signature(loader).parameters.values())[1:]  # after root
    names = [p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
    unknown = sorted(set(options) - set(names))
    if unknown and all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in params):
        raise SpmlError(
            f"dataset '{entry.name}' does not take option(s) {', '.join(unknown)}; it accepts: "
            f"{', '.join(names) or 'none'}")
    missing = [p.name for p in params if p.default is inspect.Parameter.empty
               and p.name in names and p.name not in options]
    if missing:
        raise SpmlError(f"dataset '{entry.name}' needs the option(s): {', '.join(missing)}")
    index = loader(root, **options)
    if not isinstance(index, DatasetIndex):  # a plugin's adapter that breaks the protocol
        raise SpmlError(f"dataset adapter '{entry.name}' ({entry.target}) returned "
                        f"{type(index).__name__}, not a featurize.datasets.DatasetIndex")
    return index


#: the sentence older stores record instead of the fields (read for them only)
_SOURCE_SENTENCE = re.compile(r"^images of dataset '(?P<name>[^']*)' under (?P<root>.+)$")


def _recorded(value: Any, is_path: bool) -> Any:
    """An option as the provenance records it: a path option naming an existing file absolute
    and resolved (it reads the same from any directory); lists item by item; JSON values as
    they are, anything else as str()."""
    if is_path and isinstance(value, str | Path) and str(value) and os.path.exists(value):
        return str(Path(value).expanduser().resolve())
    if isinstance(value, list | tuple):
        return [_recorded(v, False) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


@dataclass(frozen=True)
class ImageSource:
    """Where a feature store's images came from, as its provenance records it: the dataset's
    name, the image root (absolute), the adapter (``None`` for older stores) and its options."""

    dataset: str
    root: str
    adapter: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, dataset: str, root: str | Path, adapter: str | None = None,
           options: Mapping[str, Any] | None = None) -> ImageSource:
        """The record of a dataset read from ``root`` (made absolute and resolved here)."""
        loader = DATASETS.get(adapter).loader() if adapter in DATASETS else None
        paths = {p.name for p in list(inspect.signature(loader).parameters.values())[1:]
                 if "Path" in str(p.annotation)} if loader else set()  # options naming a file
        return cls(dataset, str(Path(root).expanduser().resolve()), adapter,
                   {k: _recorded(v, k in paths) for k, v in sorted(dict(options or {}).items())})

    def to_provenance(self) -> dict[str, Any]:
        """The store provenance's fields: ``dataset``, ``image_root``, ``adapter``,
        ``adapter_options``, and the human-readable ``source`` sentence."""
        return {"source": f"images of dataset '{self.dataset}' under {self.root}",
                "dataset": self.dataset, "image_root": self.root, "adapter": self.adapter,
                "adapter_options": dict(self.options)}


def image_source(provenance: Mapping[str, Any]) -> ImageSource | None:
    """The :class:`ImageSource` a store's provenance records: its fields, or for an older store
    the sentence "images of dataset '…' under …"; ``None`` for imported features (no images)."""
    root = provenance.get("image_root")
    if isinstance(root, str) and root:
        options = provenance.get("adapter_options")
        return ImageSource(str(provenance.get("dataset", "")), root,
                           provenance.get("adapter"),
                           dict(options) if isinstance(options, Mapping) else {})
    sentence = provenance.get("source")
    match = _SOURCE_SENTENCE.match(sentence) if isinstance(sentence, str) else None
    if match is None:
        return None
    return ImageSource(match.group("name"), match.group("root"))
