"""featurize: dataset adapters, the SPML protocol (Cole et al. 2021), imports of precomputed
features, the backbone runner and the Zarr feature store (docs/design.md "The flow").

The public API is importable from here; names load on first use, so ``import featurize``
stays cheap (torchvision is imported only with the backbones, zarr only with the store)::

    from featurize import FeaturizeConfig, featurize_dataset, import_yeast, load_dataset
    import_yeast("yeast.zarr")                                  # a real multi-label set
    index = load_dataset("voc", "data/VOCdevkit/VOC2012")       # the official layout
    featurize_dataset("voc", "data/VOCdevkit/VOC2012", "voc.zarr", FeaturizeConfig())

The store itself is :mod:`probe.store`, the bottom layer, and its names are exported there only
(``from probe.store import open_store, add_observed_seed, write_prior``).

Modules: :mod:`featurize.datasets` (the official layouts, the generic folder, Cole et al.'s
arrays; where a store's images came from), :mod:`featurize.backbones` (the ``Family`` protocol
and its registry: torchvision, timm, OpenCLIP, Hugging Face, Lite0),
:mod:`~featurize.extract.images` (decode and the protocol's transform),
:mod:`~featurize.extract.reading`, :mod:`~featurize.extract.writing`,
:mod:`~featurize.extract.ranks` and :mod:`~featurize.extract.run` (one process or ``torchrun``),
:mod:`~featurize.imports` (features people already have), :mod:`~featurize.priors.clip` and
:mod:`~featurize.priors.files` (priors into a store), :mod:`~featurize.bench`, and the
commands in ``cli``, ``import_cli``, ``store_cli`` and ``priors_cli``.
"""

from __future__ import annotations

from probe.lazy import lazy_exports

_EXPORTS = {
    # featurize: images -> features
    "FeaturizeConfig": "featurize.extract.run",
    "FeaturizeResult": "featurize.extract.run",
    "featurize_dataset": "featurize.extract.run",
    "list_backbones": "featurize.backbones",
    "load_backbone": "featurize.backbones",
    "load_clip": "featurize.backbones",  # a whole OpenCLIP model, tokenizer, preprocessing
    # dataset adapters
    "load_dataset": "featurize.datasets",
    "list_datasets": "featurize.datasets",
    "ImageSource": "featurize.datasets",  # where a store's images came from (its provenance)
    "image_source": "featurize.datasets",
    # features people already have
    "import_arrays": "featurize.imports",
    "import_array_files": "featurize.imports",
    "import_cole": "featurize.imports",
    "import_yeast": "featurize.imports",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
