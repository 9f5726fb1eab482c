"""One convention for the public API: every object that turns into a plain dict does so by
``to_dict()`` (the one spelling: there is no ``as_dict()``)."""

from __future__ import annotations

import warnings

import pytest
import torch
from fixtures_datasets import toy_probe_arrays

from probe.engine.config import resolve_training
from probe.evaluation.intervals import Interval
from probe.losses import get_loss_class
from probe.metrics import f1_scores


def _objects():
    settings = resolve_training(get_loss_class("gr"), "coco")
    interval = Interval(41.0, 40.0, 42.5)
    targets = torch.tensor([[1, 0], [0, 1], [1, 1]])
    f1 = f1_scores(targets, logits=torch.tensor([[2.0, -1.0], [-3.0, 0.5], [1.0, -0.2]]))
    from studies.finetune.run import FinetuneConfig

    finetune = FinetuneConfig("voc", "/data/voc", "an", "/runs/an")
    return [settings, interval, f1, finetune]


@pytest.mark.parametrize("index", range(4))
def test_to_dict_is_the_one_spelling(index):
    obj = _objects()[index]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = obj.to_dict()
    assert isinstance(new, dict) and new
    assert not hasattr(obj, "as_dict")


def test_the_documented_dict_shapes():
    settings, interval, f1, finetune = _objects()
    assert "paper preset" in settings.to_dict()["lr_from"]
    assert interval.to_dict("test_map") == {"test_map": 41.0, "test_map_low": 40.0,
                                            "test_map_high": 42.5}
    assert set(f1.to_dict()) == {"OF1", "CF1", "OP", "OR", "CP", "CR"}
    assert finetune.to_dict()["root"] == "/data/voc"


def _tiny_data():
    from probe.engine.data import ProbeData

    return ProbeData.from_arrays(*toy_probe_arrays(1))


def test_best_is_typed_and_still_the_dict_it_was(tmp_path):
    import json
    from dataclasses import asdict

    from probe import BestEpoch, ProbeConfig, SpeedOptions, TrialResult, train_probe

    result = train_probe(_tiny_data(), ProbeConfig(epochs=2, batch_size=8, lr=1e-2,
                                                   test_intervals=50),
                         "an", speed=SpeedOptions(step_threads=1))
    best = result.trials[0].best
    assert isinstance(best, BestEpoch) and isinstance(best, dict)
    assert best.test_map == best["test_map"] and best.val_map == best.get("val_map")
    assert best.test_map_low <= best.test_map <= best.test_map_high
    assert best.test_ap == best["test_ap"] and len(best.test_ap) == 4
    assert 0 <= best.test_map <= 100 and all(0 <= v <= 100 for v in best.test_ap)  # percent
    # the same JSON as a plain dict, and every dict idiom still works
    assert json.loads(json.dumps(asdict(result.trials[0])))["best"] == dict(best)
    assert {**best}["test_map"] == best.test_map and "test_map" in best
    # a run without intervals: the figure it did not measure reads as None
    plain = train_probe(_tiny_data(), ProbeConfig(epochs=1, batch_size=8, lr=1e-2), "an",
                        speed=SpeedOptions(step_threads=1))
    assert plain.trials[0].best.test_map_low is None
    # a plain dict given or assigned becomes typed
    tr = TrialResult(trial=0, seed=0, hparams={}, lr=1e-3, weight_decay=0.0,
                     best={"val_map": 40.0})
    assert isinstance(tr.best, BestEpoch) and tr.best.val_map == 40.0
    tr.best = {"test_map": 39.0}
    assert tr.best.test_map == 39.0 and tr.best.val_map is None
    assert not TrialResult(trial=0, seed=0, hparams={}, lr=1e-3, weight_decay=0.0).best


def test_each_public_name_is_exported_by_one_package_and_resolves():
    """The three packages' tops do not overlap (the store's names live in probe, the store's
    writers together in probe.store), and every exported name imports."""
    import importlib
    import itertools

    tops = {name: importlib.import_module(name) for name in ("probe", "featurize", "studies")}
    for (a, ma), (b, mb) in itertools.combinations(tops.items(), 2):
        assert not set(ma.__all__) & set(mb.__all__), (a, b, set(ma.__all__) & set(mb.__all__))
    for name in ("probe.store", "probe.losses", *tops):
        module = importlib.import_module(name)
        assert list(module.__all__) == sorted(set(module.__all__)) or name == "probe.losses"
        for public in module.__all__:
            assert getattr(module, public) is not None, f"{name}.{public}"
    store = importlib.import_module("probe.store")
    for writer in ("add_observed_seed", "add_biased_draw", "write_prior", "write_feature_store"):
        assert writer in store.__all__
