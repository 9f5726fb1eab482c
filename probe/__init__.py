"""spml-probe's engine: the feature store, the SPML loss library, metrics, and the stacked
linear-probe trainer. Needs torch, numpy and zarr (faiss for the kNN baseline, scipy for
intervals over seeds).

The public API, importable from here (names load on first use, so ``import probe`` is cheap)::

    from probe import load_store, train_probe, ProbeConfig, create_loss
    data = load_store("yeast.zarr")                       # device-resident train/val/test
    result = train_probe(data, ProbeConfig(epochs=10), "gr", [{"w_T": 2.0}, {"w_T": 10.0}])
    result.trials[1].best["test_map"]

Layers (docs/design.md "Layers"): :mod:`probe.store` ← :mod:`probe.losses`, :mod:`probe.metrics`
← the engine (:mod:`probe.config`, :mod:`probe.data`, :mod:`probe.trials`, :mod:`probe.loop`,
:mod:`probe.evaluate`, :mod:`probe.results`, :mod:`probe.train`).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from ._lazy import lazy_exports

try:
    __version__ = version("spml-probe")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

_EXPORTS = {
    # errors: every input error of probe, featurize and studies is an SpmlError
    "SpmlError": "probe.errors",
    "MissingPathError": "probe.errors",
    # training
    "train_probe": "probe.train",
    "ProbeConfig": "probe.config",
    "ProbeConfigError": "probe.config",
    "SpeedOptions": "probe.speed",
    "TrainingSettings": "probe.config",
    "resolve_training": "probe.config",
    "expand_grid": "probe.trials",
    # data
    "ProbeData": "probe.data",
    "DataError": "probe.data",
    "load_store": "probe.data",
    "resolve_device": "probe.data",
    # results
    "ProbeResult": "probe.results",
    "TrialResult": "probe.results",
    "BestEpoch": "probe.results",
    "EpochReport": "probe.results",
    "save_head": "probe.results",
    "load_head": "probe.results",
    "evaluate_head": "probe.evaluate",
    "evaluate_heads": "probe.evaluate",
    # losses
    "Loss": "probe.losses",
    "HParam": "probe.losses",
    "LossInputError": "probe.losses",
    "available_losses": "probe.losses",
    "create_loss": "probe.losses",
    "get_loss_class": "probe.losses",
    # metrics
    "average_precision": "probe.metrics",
    "mean_average_precision": "probe.metrics",
    "f1_scores": "probe.metrics",
    # the store
    "Store": "probe.store",
    "StoreError": "probe.store",
    "open_store": "probe.store",
    "write_feature_store": "probe.store",
    "PROTOCOL_SEED": "probe.store",
    # the training-free baseline
    "run_knn": "probe.knn"}

__all__ = sorted([*_EXPORTS, "__version__"])


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(),
                                   aliases={"available_losses": "available"})
