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
from probe.engine.data import (
    DataError,
    ProbeData,
    fold_mismatch,
    positions_by_fold,
    stack_folds,
)
from probe.engine.loop import BlockedTrainer, StackedTrainer, make_trainer
from probe.engine.speed import SpeedOptions
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
    """Three folds of one pool: fold k's train and val rows are a permutation (seed 100 + k) of the
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
    """3 folds × 2 seeds in one stacked run: each (fold, seed) trial is that seed's run alone
    on that fold."""
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
        train_probe(folds, cfg, name, dict(hparams), fold_index=[0, 2])
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


def _trainer(folds, cfg, name, hparams, speed):
    """The stacked trainer train_probe builds for CELLS over ``folds`` (and its plan)."""
    index = [k for _, k in CELLS]
    cfg = _stacked_config(cfg)
    data = stack_folds(folds)
    plan = plan_trials(data, cfg, name, [dict(hparams)] * len(CELLS), index, len(folds),
                       folds=folds)
    # the folds' own train targets are the run's draws, one per fold
    targets = torch.stack([fold.train_observed for fold in folds])
    return plan, make_trainer(data, cfg, plan, speed, targets)


def test_a_loss_that_stacks_seeds_is_one_object_over_the_folds():
    """ROLE: one loss object for the six trials, each trial's batch rows offset into its
    fold's train block, its targets and its label estimates Θ (T, N_train, C) its fold's."""
    folds = _folds()
    plan, trainer = _trainer(folds, _config(), "role", {"k": 2.0}, SpeedOptions(trial_block=0))
    assert isinstance(trainer, StackedTrainer)
    assert plan.shared and not plan.one_batch and len(plan.losses) == 1
    assert plan.fold_index == [k for _, k in CELLS]
    rows = folds[0].train_x.shape[0]
    assert rows == 2 * N_TRAIN  # the train rows, then their flipped features
    assert plan.fold_rows == rows
    assert trainer.fold_start.tolist() == [k * rows for _, k in CELLS]
    theta = trainer.groups[0].loss.label_logits
    assert theta.shape == (len(CELLS), N_TRAIN, C)
    for t, (seed, k) in enumerate(CELLS):
        assert torch.equal(theta[t], init_label_logits(folds[k].train_observed, seed))
    # the folds' observed labels differ, so their Θ do
    assert not torch.equal(theta[0], theta[2])
    # each step's targets are the rows of each trial's own fold, and so are its logits
    seen = []
    loss = trainer.groups[0].loss
    forward = loss.forward
    w0 = trainer.w.clone()  # the heads of the first step's logits

    def spy(logits, observed, index=None):
        seen.append((logits.detach().clone(), observed.clone(), index.clone()))
        return forward(logits, observed, index)

    loss.forward = spy
    trainer.train_epoch(0)
    assert len(seen) == trainer.n_steps
    for _, observed, index in seen:
        assert index.shape == (len(CELLS), _config().batch_size)
        for t, (_, k) in enumerate(CELLS):
            assert torch.equal(observed[t], folds[k].train_observed[index[t]])
    logits, _, index = seen[0]
    for t, (_, k) in enumerate(CELLS):
        _assert_logits_of_fold(logits[t], index[t], folds[k], w0[t])


def _assert_logits_of_fold(logits, index, fold, w):
    """Each row of one trial's batch logits (B, C) is its fold's train row ``index`` -- plain
    or flipped -- times the head ``w`` (D+1, C)."""
    plain = fold.train_x[index].float() @ w
    flipped = fold.train_x[fold.n_train + index].float() @ w
    near_plain = torch.isclose(logits, plain, atol=1e-5, rtol=0).all(1)
    near_flipped = torch.isclose(logits, flipped, atol=1e-5, rtol=0).all(1)
    assert bool((near_plain | near_flipped).all())


def test_a_loss_reading_the_features_gets_its_folds_per_trial(monkeypatch):
    """SMILE reads the train features (its feature graph): one loss object per trial, each
    handed its own fold's unflipped train features."""
    folds = _folds()
    smile = get_loss_class("smile")
    handed = {}
    real = smile.set_features

    def spy(self, train_x):
        handed[id(self)] = train_x.clone()
        return real(self, train_x)

    monkeypatch.setattr(smile, "set_features", spy)
    plan, trainer = _trainer(folds, _config(), "smile", {}, SpeedOptions(trial_block=0))
    assert not plan.shared and len(plan.losses) == len(CELLS)
    assert isinstance(trainer, StackedTrainer) and len(trainer.groups) == len(CELLS)
    assert len(handed) == len(CELLS)
    for t, (_, k) in enumerate(CELLS):
        got = handed[id(plan.losses[t])]
        assert torch.equal(got, folds[k].train_x[:N_TRAIN, :-1].float())
    assert not torch.equal(handed[id(plan.losses[0])], handed[id(plan.losses[2])])


@pytest.mark.parametrize("name", ["epr", "role"])
def test_hyperparameters_from_the_data_are_each_folds_own(name):
    """EPR's (ROLE's) k left unset, no presets, a dataset without a published k: each trial's
    k is its fold's val label cardinality, as in its fold's run alone, and the notes say which
    fold."""
    folds = _folds(dataset="folds_without_a_preset")
    cfg = _config(use_presets=False)
    stacked = _train_stacked(folds, cfg, name, {})
    ks = []
    for t, (seed, k) in enumerate(CELLS):
        alone = _fold_alone(folds[k], cfg, name, {}, seed)
        assert stacked.trials[t].hparams["k"] == alone.trials[0].hparams["k"]
        assert stacked.trials[t].hparams["k"] == pytest.approx(folds[k].val_label_cardinality())
        _assert_same(stacked, t, alone)
        ks.append(stacked.trials[t].hparams["k"])
    assert len(set(ks)) == N_FOLDS  # the folds' val rows differ, so their k do
    notes = stacked.config["notes"]
    for k in range(N_FOLDS):
        mine = [n for n in notes if n.startswith(f"fold {k}: k=")]
        assert len(mine) == 1 and "val split" in mine[0], notes


def _assert_same_record(mine, ref):
    """Two best-epoch records: the same metrics, each within float rounding."""
    assert set(mine) == set(ref)
    for key, value in ref.items():
        if isinstance(value, list):
            assert mine[key] == pytest.approx(value, abs=1e-4), key
        else:
            assert mine[key] == pytest.approx(value, abs=1e-4), key


@pytest.mark.parametrize(("name", "settings"), [("an", {}), ("an", {"val_labels": "observed"}),
                                                ("role", {"labels": "full"}),
                                                ("epr", {"val_labels": "observed",
                                                         "labels": "full"})])
def test_each_trial_is_scored_on_its_folds_val_rows(name, settings):
    """The best-epoch record -- val mAP, the val MLL metrics, the val-tuned hamming threshold,
    test mAP -- is the fold-alone run's; with val scored on the observed labels and with the
    full-label oracle too."""
    folds = _folds()
    hparams = HPARAMS.get(name, {})
    cfg = _config(**settings)
    stacked = _train_stacked(folds, cfg, name, hparams)
    for t, (seed, k) in enumerate(CELLS):
        alone = _fold_alone(folds[k], cfg, name, hparams, seed)
        _assert_same(stacked, t, alone)
        mine = stacked.trials[t].best
        assert "val_ranking_loss" in mine and "hamming_threshold" in mine
        _assert_same_record(mine, alone.trials[0].best)
    # the folds' val rows differ: so do their val figures
    val = [stacked.trials[t].best["val_map"] for t in (0, 2, 4)]
    assert len({round(v, 3) for v in val}) == N_FOLDS, val


def test_folds_of_other_val_sizes_with_test_intervals():
    """The folds' val rows may differ in number (fold 1 has 3 fewer), and test is measured
    every epoch with bootstrap intervals: still each trial its fold's run alone."""
    folds = _folds()
    short = folds[1]
    folds[1] = replace(short, val_x=short.val_x[:-3], val_labels=short.val_labels[:-3],
                       val_observed=short.val_observed[:-3])
    assert fold_mismatch(folds) is None
    cfg = _config(test_curve=True, test_intervals=20)
    stacked = _train_stacked(folds, cfg, "an", {})
    for t, (seed, k) in enumerate(CELLS):
        alone = _fold_alone(folds[k], cfg, "an", {}, seed)
        _assert_same(stacked, t, alone)
        _assert_same_record(stacked.trials[t].best, alone.trials[0].best)


def test_one_trial_on_each_fold():
    """One trial, fold_index [0, 1, 2]: that trial (its one seed) on each fold."""
    folds = _folds()
    cfg = _config()
    stacked = train_probe(folds, cfg, "role", {"k": 2.0}, fold_index=[0, 1, 2])
    assert [tr.seed for tr in stacked.trials] == [cfg.seed] * N_FOLDS
    for k in range(N_FOLDS):
        _assert_same(stacked, k, train_probe(folds[k], cfg, "role", {"k": 2.0}))
    assert not torch.allclose(stacked.final_heads[0], stacked.final_heads[1], atol=1e-3)


def _stop_trials(at):
    """A callback stopping, after each epoch in ``at``, the trials it lists there."""
    def callback(report):
        return at.get(report.epoch)
    return callback


@pytest.mark.parametrize(("name", "hparams"), [("an", {}), ("role", {"k": 2.0}),
                                               ("em_apl", HPARAMS["em_apl"]),
                                               ("ll_cp", HPARAMS["ll_cp"]),
                                               ("opml", HPARAMS["opml"]), ("vpu", {}),
                                               ("smile", {})])
def test_stopping_trials_keeps_the_others_on_their_folds(name, hparams):
    """Trial 1 (fold 0) stops after epoch 1 and trial 4 (fold 2) after epoch 2: the others go
    on, each on its own fold's rows, targets and val rows."""
    folds = _folds()
    cfg = _config()
    stacked = _train_stacked(folds, cfg, name, hparams, callback=_stop_trials({1: [1], 2: [4]}))
    assert [tr.stopped_at for tr in stacked.trials] == [None, 1, None, None, 2, None]
    for t, (seed, k) in enumerate(CELLS):
        callback = {1: _stop_at(0, 1), 4: _stop_at(0, 2)}.get(t)
        _assert_same(stacked, t, _fold_alone(folds[k], cfg, name, hparams, seed, callback))


@pytest.mark.parametrize(("name", "hparams"), [("an", {}), ("role", {"k": 2.0}),
                                               ("em_apl", HPARAMS["em_apl"]), ("smile", {})])
def test_one_trial_per_block(name, hparams):
    """SpeedOptions(trial_block=1): each block one trial on its own fold's block of rows."""
    folds = _folds()
    cfg = _config()
    speed = SpeedOptions(trial_block=1)
    _, trainer = _trainer(folds, cfg, name, hparams, speed)
    assert isinstance(trainer, BlockedTrainer)
    rows = 2 * N_TRAIN
    assert [b.fold_start.tolist() for _, b in trainer.blocks] == [[k * rows] for _, k in CELLS]
    stacked = _train_stacked(folds, cfg, name, hparams, speed=speed)
    assert stacked.timing["trial_blocks"] == [1] * len(CELLS)
    for t, (seed, k) in enumerate(CELLS):
        _assert_same(stacked, t, _fold_alone(folds[k], cfg, name, hparams, seed))
    _assert_folds_differ(stacked)


def _assert_same_trial(a, i, b, j):
    """Trial ``i`` of result ``a`` is trial ``j`` of ``b`` within float rounding."""
    torch.testing.assert_close(a.final_heads[i], b.final_heads[j], atol=2e-5, rtol=0)
    torch.testing.assert_close(a.best_heads[i], b.best_heads[j], atol=2e-5, rtol=0)
    assert a.trials[i].best_epoch == b.trials[j].best_epoch
    for key in ("val_map", "test_map"):
        assert a.trials[i].best[key] == pytest.approx(b.trials[j].best[key], abs=1e-4), key


def _drop_train_row(fold):
    """``fold`` without its last train row (and that row's flipped features)."""
    n = fold.n_train - 1
    x = fold.train_x[:n]
    if fold.has_flip:
        x = torch.cat([x, fold.train_x[fold.n_train : fold.n_train + n]])
    return replace(fold, train_x=x, train_labels=fold.train_labels[:n],
                   train_observed=fold.train_observed[:n], n_train=n)


def test_cv_replicates_of_a_store_train_as_one_run(monkeypatch, yeast_store):
    """``selection_data(store, "cv:3")`` folds share the test tensors and train as one stacked
    run (one train_probe call) equal to a run per replicate; folds of unequal train sizes fall
    back to a run per replicate."""
    folds = selection_data(yeast_store, "cv:3")
    assert len(folds) == 3 and fold_mismatch(folds) is None
    for fold in folds[1:]:
        assert fold.test_x is folds[0].test_x and fold.test_labels is folds[0].test_labels
    cfg = _config(seeds=SEEDS, epochs=2, batch_size=128)
    reference = train_replicates(folds, cfg, "an", [{}, {}], stack=False)
    runs = _counting(monkeypatch)
    stacked = train_replicates(folds, cfg, "an", [{}, {}])
    assert len(runs) == 1 and isinstance(runs[0], list)
    assert len(stacked) == len(reference) == 3
    for got, want in zip(stacked, reference):
        assert len(got.trials) == 2
        for t in range(2):
            _assert_same_trial(got, t, want, t)
    assert not torch.allclose(stacked[0].final_heads[0], stacked[1].final_heads[0], atol=1e-3)
    # a fold of another train size: a run per replicate, still the same trials
    uneven = [folds[0], _drop_train_row(folds[1]), folds[2]]
    assert "fold 1" in fold_mismatch(uneven)
    runs.clear()
    again = train_replicates(uneven, cfg, "an", [{}, {}])
    assert len(runs) == 3 and all(isinstance(d, ProbeData) for d in runs)
    for j in (0, 2):
        for t in range(2):
            _assert_same_trial(again[j], t, reference[j], t)
    alone = train_probe(uneven[1], cfg, "an", [{}, {}])
    for t in range(2):
        _assert_same_trial(again[1], t, alone, t)


def test_cv_replicates_of_a_loss_without_one_object_train_one_run_each(monkeypatch):
    """SMILE reads each fold's train features, so its trials cannot share one object across
    folds: a cv study trains it one run per replicate (not one object per (trial, fold), each
    holding its own feature graph), with the same results."""
    folds = _folds()
    cfg = _config(seeds=SEEDS, epochs=2)
    runs = _counting(monkeypatch)
    got = train_replicates(folds, cfg, "smile", [{}, {}])
    assert len(runs) == 3 and all(isinstance(d, ProbeData) for d in runs)
    for j, fold in enumerate(folds):
        alone = train_probe(fold, cfg, "smile", [{}, {}])
        for t in range(2):
            _assert_same_trial(got[j], t, alone, t)


def test_errors_name_the_argument():
    folds = _folds()
    cfg = _config(seeds=SEEDS)
    with pytest.raises(ProbeConfigError, match="fold_index needs folds"):
        train_probe(folds[0], cfg, "an", fold_index=[0, 0])
    with pytest.raises(ProbeConfigError, match="fold_index is missing"):
        train_probe(folds, cfg, "an")
    with pytest.raises(ProbeConfigError, match="draws and folds cannot be combined"):
        train_probe(folds, cfg, "an", draws=[folds[0].train_observed], fold_index=[0, 1])
    with pytest.raises(ProbeConfigError, match=r"fold_index: 3 is not a fold number; "
                                                r"expected 0\.\.2"):
        train_probe(folds, cfg, "an", fold_index=[0, 3])
    with pytest.raises(ProbeConfigError, match="fold_index has 3 entries for 2 trials"):
        train_probe(folds, cfg, "an", fold_index=[0, 1, 2])
    with pytest.raises(ProbeConfigError, match="empty list of folds"):
        train_probe([], cfg, "an", fold_index=[0])
    uneven = [folds[0], folds[1], _drop_train_row(folds[2])]
    with pytest.raises(ProbeConfigError, match=f"fold 2 has {N_TRAIN - 1} train rows, fold 0 "
                                                f"has {N_TRAIN}"):
        train_probe(uneven, cfg, "an", fold_index=[0, 2])
    with pytest.raises(DataError, match="fold 2 has"):
        stack_folds(uneven)
    other_test = [folds[0], replace(folds[1], test_x=folds[1].test_x.clone() + 1)]
    with pytest.raises(ProbeConfigError, match="fold 1 has another test set"):
        train_probe(other_test, cfg, "an", fold_index=[0, 1])
    # a ready Loss object was set up for one train split: by name instead
    with pytest.raises(ProbeConfigError, match=r"fold.*by name|by name.*fold"):
        train_probe(folds, _config(), create_loss("an"), fold_index=[1])


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "hparams"), [("an", {}), ("role", {"k": 2.0}),
                                               ("em_apl", HPARAMS["em_apl"])])
def test_cuda_graph_over_folds_equals_the_eager_step(name, hparams):
    """The captured step offsets each trial's batch rows into its fold's block on the device:
    the same heads bit for bit as the eager step, and each trial as its fold's run alone."""
    folds = _folds(device="cuda")
    cfg = _config(device="cuda")
    eager = _train_stacked(folds, replace(cfg, cuda_graph=False), name, hparams)
    graph = _train_stacked(folds, replace(cfg, cuda_graph=True), name, hparams)
    assert graph.timing["cuda_graph"] and not eager.timing["cuda_graph"]
    assert torch.equal(graph.final_heads, eager.final_heads)
    for t, (seed, k) in enumerate(CELLS):
        _assert_same(graph, t, _fold_alone(folds[k], replace(cfg, cuda_graph=False), name,
                                           hparams, seed))
    _assert_folds_differ(graph)


def test_trials_are_grouped_by_fold_in_order_of_first_appearance():
    """The one grouping the trainer's epoch pass, the val pass and the MLL metrics share."""
    assert positions_by_fold([2, 0, 2, 1, 0]) == {2: [0, 2], 0: [1, 4], 1: [3]}
    assert list(positions_by_fold([2, 0, 2, 1, 0])) == [2, 0, 1]
    assert positions_by_fold(torch.tensor([5, 5]).tolist()) == {5: [0, 1]}
    assert positions_by_fold([]) == {}

