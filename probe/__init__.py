"""spml-probe's engine: the feature store, the SPML loss library, metrics, and the stacked
linear-probe trainer. Needs torch, numpy and zarr (faiss for the kNN baseline, scipy for
intervals over seeds).

The public API, importable from here (names load on first use, so ``import probe`` is cheap)::

    from probe import load_store, train_probe, ProbeConfig, create_loss
    data = load_store("yeast.zarr")                       # device-resident train/val/test
    result = train_probe(data, ProbeConfig(epochs=10), "gr", [{"w_T": 2.0}, {"w_T": 10.0}])
    result.trials[1].best["test_map"]

Layers (docs/design.md "Layers"): :mod:`probe.store` ← :mod:`probe.losses`, :mod:`probe.metrics`
← the engine (:mod:`probe.engine.config`, :mod:`probe.engine.data`, :mod:`probe.engine.trials`,
:mod:`probe.engine.loop`,
:mod:`probe.evaluation.heads`, :mod:`probe.engine.results`, :mod:`probe.engine.train`).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from probe.lazy import lazy_exports

try:
    __version__ = version("spml-probe")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

# each public name by the module that defines it
_EXPORTS = {name: module for module, names in {
    "probe.errors": ("SpmlError", "MissingPathError"),  # every input error is an SpmlError
    "probe.engine.train": ("train_probe",),
    "probe.engine.config": ("ProbeConfig", "ProbeConfigError", "TrainingSettings",
                            "resolve_training"),
    "probe.engine.speed": ("SpeedOptions",),
    "probe.engine.trials": ("expand_grid",),
    "probe.engine.data": ("ProbeData", "DataError", "load_store"),
    "probe.devices": ("resolve_device",),
    "probe.engine.results": ("ProbeResult", "TrialResult", "BestEpoch", "EpochReport",
                             "save_head", "load_head"),
    "probe.evaluation.heads": ("evaluate_head", "evaluate_heads"),
    "probe.losses": ("Loss", "HParam", "LossInputError", "available_losses", "create_loss",
                     "get_loss_class"),
    "probe.metrics": ("average_precision", "mean_average_precision", "f1_scores"),
    "probe.store": ("Store", "StoreError", "open_store", "write_feature_store", "PROTOCOL_SEED"),
    "probe.knn": ("run_knn",),  # the training-free baseline
}.items() for name in names}

__all__ = sorted([*_EXPORTS, "__version__"])


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(),
                                    aliases={"available_losses": "available"})
