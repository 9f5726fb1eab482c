"""Per-trial folds in one stacked run (``train_probe(folds, ..., fold_index=...)``): K replicates
with train and val rows of their own (``--select cv:K``) and one test set train as one stacked
model; trial t with seed s on fold k equals ``train_probe(folds[k], seed s alone)`` -- its
batches drawn from its fold's train block, its targets its fold's, its best epoch chosen on its
fold's val rows, the hyperparameters the data decides (EPR's k) its fold's, and a loss that
reads the train features (SMILE) handed its fold's.

The folds here are a pool of rows split 3 ways into train and val rows of equal sizes (each
with its flipped features) plus one test set, so the folds' val rows, val mAP and val label
cardinality differ.

Tolerance: float32, atol 2e-5 on heads and 1e-4 on val/test mAP (percent), as in
tests/test_stacked_draws_shared.py: batched products and (T, B, C) reductions may differ from
one-trial ones in the last bits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import probe.engine.train as engine_train
from probe import ProbeConfigError, train_probe
from probe.engine.data import DataError, ProbeData, fold_mismatch, stack_folds
from probe.engine.loop import BlockedTrainer, StackedTrainer, make_trainer
from probe.engine.speed import SpeedOptions
from probe.engine.train import _fold_targets
from probe.engine.trials import plan_trials
from probe.evaluation.selection import selection_data, train_replicates
from probe.losses import available, create_loss, get_loss_class
from probe.losses.online_estimation import init_label_logits
from tests.test_stacked_draws_shared import (
    HPARAMS,
    _assert_same,
    _config,
    _stop_at,
    _with_prior,
)

pytestmark = pytest.mark.usefixtures("one_thread")

N_POOL, N_TRAIN, N_TEST, D, C = 64, 40, 24, 6, 5
N_FOLDS = 3
SEEDS = (1, 2)
#: (seed, fold) of each stacked trial: trial t = (SEEDS[t % 2], fold t // 2)
CELLS = [(s, k) for k in range(N_FOLDS) for s in SEEDS]
NEEDS_PRIOR = sorted(n for n in available() if get_loss_class(n).prior is not None)
NO_PRIOR = sorted(n for n in available() if get_loss_class(n).prior is None)


def _folds(dataset: str = "arrays", device: str = "cpu") -> list[ProbeData]:
    """Three folds of one pool: fold k's train and val rows are a permutation (seed k) of the
    pool's rows cut at N_TRAIN, with the flipped features of its train rows; one test set,
    whose tensors every fold shares (as ``selection_data``'s cv folds)."""
    rng = np.random.default_rng(11)
    proto = rng.normal(size=(C, D))
    y = np.zeros((N_POOL + N_TEST, C), dtype=np.uint8)
    for i in range(len(y)):
        y[i, rng.choice(C, size=rng.integers(1, 4), replace=False)] = 1
    x = (y @ proto + 0.5 * rng.normal(size=(len(y), D))).astype(np.float16)
    flipped = (x + 0.1 * rng.normal(size=x.shape)).astype(np.float16)
    test = (x[N_POOL:], y[N_POOL:])
    folds: list[ProbeData] = []
    for k in range(N_FOLDS):
        order = np.random.default_rng(100 + k).permutation(N_POOL)
        train, val = order[:N_TRAIN], order[N_TRAIN:]
        fold = ProbeData.from_arrays((x[train], y[train]), (x[val], y[val]), test,
                                     train_flip=flipped[train], dataset=dataset, device=device)
        if folds:
            fold = replace(fold, test_x=folds[0].test_x, test_labels=folds[0].test_labels)
        folds.append(fold)
    cardinality = [fold.val_label_cardinality() for fold in folds]
    assert len(set(cardinality)) == N_FOLDS, cardinality  # the fixture's premise
    return folds


def _stacked_config(cfg):
    """``cfg`` with one seed per stacked trial (CELLS' order)."""
    return replace(cfg, seeds=tuple(s for s, _ in CELLS))


def _fold_alone(fold, cfg, name, hparams, seed, callback=None):
    """The reference: trial ``seed`` trained alone on ``fold``."""
    return train_probe(fold, replace(cfg, seed=seed, seeds=None), name, dict(hparams),
                       callback=callback)


def _train_stacked(folds, cfg, name, hparams, **kw):
    index = [k for _, k in CELLS]
    return train_probe(folds, _stacked_config(cfg), name, dict(hparams), fold_index=index, **kw)


def _assert_folds_differ(stacked):
    """The same seed on two folds: other rows, so other heads (the check has teeth)."""
    for a, b in ((0, 2), (2, 4)):
        assert not torch.allclose(stacked.final_heads[a], stacked.final_heads[b], atol=1e-3)


@pytest.mark.parametrize("name", NO_PRIOR)
def test_every_loss_folds_times_seeds_equal_a_run_each(name):
    folds = _folds()
    hparams = HPARAMS.get(name, {})
    cfg = _config()
    stacked = _train_stacked(folds, cfg, name, hparams)
    assert len(stacked.trials) == len(CELLS)
    for t, (seed, k) in enumerate(CELLS):
        _assert_same(stacked, t, _fold_alone(folds[k], cfg, name, hparams, seed))
    _assert_folds_differ(stacked)
    # the seeds differ on one fold, so their trials must too
    assert not torch.allclose(stacked.final_heads[0], stacked.final_heads[1], atol=1e-3)


@pytest.mark.parametrize("name", NEEDS_PRIOR)
def test_a_loss_reading_a_prior_trains_one_run_per_fold(monkeypatch, name):
    """A train prior differs by fold: fold_mismatch refuses such folds, train_probe names it,
    and train_replicates falls back to one run per fold -- each trial still its run alone."""
    folds = []
    extra = {}
    for fold in _folds():
        with_prior, extra = _with_prior(fold, name)
        folds.append(with_prior)
    assert "train prior" in fold_mismatch(folds)
    hparams = HPARAMS.get(name, {})
    cfg = _config(seeds=SEEDS, **extra)
    with pytest.raises(ProbeConfigError, match="train prior"):
        train_probe(folds, cfg, name, dict(hparams), fold_index=[0, 1, 2])
    runs = _counting(monkeypatch)
    results = train_replicates(folds, cfg, name, [dict(hparams)] * len(SEEDS))
    assert len(runs) == N_FOLDS and all(isinstance(d, ProbeData) for d in runs)
    for k, result in enumerate(results):
        for t, seed in enumerate(SEEDS):
            _assert_same(result, t, _fold_alone(folds[k], cfg, name, hparams, seed))
    assert not torch.allclose(results[0].final_heads[0], results[1].final_heads[0], atol=1e-3)


def _counting(monkeypatch):
    """Count train_probe's calls (what train_replicates imports at call time): the list of the
    data each call got."""
    calls = []
    real = engine_train.train_probe

    def counted(data, *args, **kw):
        calls.append(data)
        return real(data, *args, **kw)

    monkeypatch.setattr(engine_train, "train_probe", counted)
    return calls
