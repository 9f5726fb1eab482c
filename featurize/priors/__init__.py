"""Where a prior comes from: one :class:`PriorSource` protocol behind ``spml priors`` and
``spml import priors``, and the registry of sources (docs/priors.md, docs/plugins.md).

A source turns a feature store into per-image class scores ``(N, C)`` over every row of the
store (pool then test), with optional extra ``(N, C)`` arrays and provenance. The built-ins:

- ``clip``: an OpenCLIP model's zero-shot scores of the store's images
  (:func:`featurize.priors.clip.compute_clip_prior`, resumable block by block);
- ``file``: scores computed elsewhere, read from a ``.npy`` or CSV file
  (:func:`featurize.priors.files.import_priors`).

Another installed package adds a source through the entry-point group ``spml_probe.priors``:
its :meth:`PriorSource.scores` computes, and the prior is validated and written all or nothing
by :func:`probe.store.write_prior` (the default :meth:`PriorSource.write`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.errors import SpmlError
from probe.registry import Registry, adopt_named_instance, check_named_instance

__all__ = ["PRIOR_SOURCES", "PriorScores", "PriorSource", "get_prior_source",
           "register_prior_source", "write_prior_from"]


@dataclass(frozen=True)
class PriorScores:
    """What a source computes for a store: ``scores`` ``(N, C)`` over every row in the store's
    order and class order, ``extras`` (further ``(N, C)`` arrays by name) and ``provenance``
    (JSON: the model, its settings; docs/priors.md "Priors in the store")."""

    scores: Any
    extras: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)


class PriorSource(ABC):
    """A way to compute a prior. ``name`` is the registry's key (``spml priors STORE --source
    NAME``), ``summary`` one line for listings, ``options`` the keyword options it takes (name →
    one line), given on the command line as ``--source-option KEY=VALUE``."""

    name: str = ""
    summary: str = ""
    options: Mapping[str, str] = {}

    @abstractmethod
    def scores(self, store: Any, **options: Any) -> PriorScores:
        """Compute the prior of every row of ``store`` (a :class:`probe.store.FeatureStore`)."""

    def write(self, store_path: str | Path, name: str, *, overwrite: bool = False,
              **options: Any) -> Any:
        """Compute and store the prior as ``priors/<name>`` (validated, then written all or
        nothing); returns the stored :class:`probe.store.Prior`."""
        from probe.store import open_store, write_prior

        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise SpmlError(
                f"--source-option: prior source '{self.name}' takes no option(s) "
                f"{', '.join(unknown)}; it takes: {', '.join(sorted(self.options)) or 'none'}")
        result = self.scores(open_store(store_path), **options)
        provenance = {"source": f"prior source '{self.name}'", **dict(result.provenance)}
        return write_prior(store_path, name, result.scores, provenance=provenance,
                           extras=dict(result.extras), overwrite=overwrite)


class ClipSource(PriorSource):
    """OpenCLIP zero-shot scores of the store's images (``spml priors``' own flags)."""

    name = "clip"
    summary = ("an OpenCLIP model's zero-shot class scores of the store's images (VLPL, AEVLP); "
               "resumable")
    options = {"model": "open_clip:<arch>/<pretrained>", "weights": "a local checkpoint",
               "prompt": "template with {}", "temperature": "softmax temperature",
               "tiles": "k for a k×k grid", "batch_size": "images per forward",
               "device": "auto, cpu or cuda[:N]", "progress": "a progress bar",
               "root": "where the images are now", "adapter": "the dataset adapter",
               "dataset_options": "the adapter's options"}

    def scores(self, store: Any, **options: Any) -> PriorScores:
        raise SpmlError("prior source 'clip' writes block by block as it computes (resumable); "
                        "call its write(), or spml priors STORE --model ...")

    def write(self, store_path: str | Path, name: str, *, overwrite: bool = False,
              **options: Any) -> Any:
        from featurize.priors.clip import ClipPriorConfig, compute_clip_prior

        where = {key: options.pop(key) for key in ("root", "adapter", "dataset_options")
                 if key in options}
        config = ClipPriorConfig(name=name, overwrite=overwrite, **options)
        return compute_clip_prior(store_path, config, **where)


class FileSource(PriorSource):
    """Scores computed elsewhere, from a file (``spml import priors``)."""

    name = "file"
    summary = "scores computed elsewhere, read from a .npy or CSV file (spml import priors)"
    options = {"from_path": "the scores file", "extras": "NAME → file of each extra",
               "provenance": "what computed them", "class_names_path": "the columns' names"}

    def scores(self, store: Any, **options: Any) -> PriorScores:
        raise SpmlError("prior source 'file' reads and writes in one step; call its write(), or "
                        "spml import priors STORE --from FILE")

    def write(self, store_path: str | Path, name: str, *, overwrite: bool = False,
              **options: Any) -> Any:
        from featurize.priors.files import import_priors

        if "from_path" not in options:
            raise SpmlError("prior source 'file' needs from_path, the scores file (.npy or CSV)")
        return import_priors(store_path, name, overwrite=overwrite, **options)


#: the prior sources by name: the built-ins, the user's own (:func:`register_prior_source`) and
#: the plugins of the entry-point group ``spml_probe.priors``
PRIOR_SOURCES: Registry[PriorSource] = Registry(
    "prior source", "spml_probe.priors", builtin="the built-in source",
    builtin_modules=("featurize.",),
    adopt=adopt_named_instance(PriorSource, "register_prior_source", "prior source"),
    form="one PriorSource (an instance or a subclass) as 'module:object'")


def register_prior_source(source: PriorSource) -> PriorSource:
    """Add ``source`` to the registry; a name already taken is refused."""
    check_named_instance(source, PriorSource, "register_prior_source", "prior source")
    return PRIOR_SOURCES.add(source.name, source, module=type(source).__module__)


def get_prior_source(name: str) -> PriorSource:
    """The registered source ``name`` (a plugin's is imported on first use)."""
    return PRIOR_SOURCES.get(name)


def write_prior_from(source: str, store_path: str | Path, name: str, *,
                     overwrite: bool = False, **options: Any) -> Any:
    """Compute prior ``name`` of a store with the registered source ``source`` and store it;
    returns what the source's ``write`` returns."""
    return get_prior_source(source).write(store_path, name, overwrite=overwrite, **options)


register_prior_source(ClipSource())
register_prior_source(FileSource())
