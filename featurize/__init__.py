"""featurize: dataset adapters, the SPML protocol (Cole et al. 2021), imports of precomputed
features, the backbone runner and the Zarr feature store (docs/design.md "The flow").

The public API is importable from here; names load on first use, so ``import featurize``
stays cheap (torchvision is imported only with the backbones, zarr only with the store)::

    from featurize import FeaturizeConfig, featurize_dataset, import_yeast, load_dataset
    import_yeast("yeast.zarr")                                  # a real multi-label set
    index = load_dataset("voc", "data/VOCdevkit/VOC2012")       # the official layout
    featurize_dataset("voc", "data/VOCdevkit/VOC2012", "voc.zarr", FeaturizeConfig())

The store itself is :mod:`probe.store`, the bottom layer (its names are re-exported here for
convenience: ``from featurize import open_store``).
"""

from __future__ import annotations

from probe._lazy import lazy_exports

_EXPORTS = {
    # featurize: images -> features
    "FeaturizeConfig": "featurize.runner",
    "FeaturizeResult": "featurize.runner",
    "featurize_dataset": "featurize.runner",
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
    # the store (probe.store), re-exported
    "SCHEMA_VERSION": "probe.store",
    "Store": "probe.store",
    "StoreError": "probe.store",
    "StoreWriter": "probe.store",
    "add_observed_seed": "probe.store",
    "create_store": "probe.store",
    "open_store": "probe.store",
    "resume_store": "probe.store",
    "write_feature_store": "probe.store",
    "single_positive": "probe.store.protocol",
    "split_pool": "probe.store.protocol",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
