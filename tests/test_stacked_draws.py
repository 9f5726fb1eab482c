"""Per-trial observed-label draws in the stacked trainer: every (seed, draw) trial of one
stacked run equals a run of that seed alone on data whose train_observed is that draw, and
the plain PyTorch loop (tests/test_train.py's reference) on that draw.

Tolerance: float32, atol 2e-5 on heads and 1e-5 on val/test mAP (batched matmuls may differ
from one-trial products in the last bits)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from probe import ProbeConfig, train_probe
from probe.engine.config import ProbeConfigError
from probe.engine.data import ProbeData
from probe.evaluation.selection import mean_over_replicates, train_cells, train_replicates
from probe.store.protocol import single_positive
from tests.test_train import _data, _reference

pytestmark = pytest.mark.usefixtures("one_thread")

SEEDS = (1, 2)
DRAW_SEEDS = (1200, 1, 2)
# stateless, scheduled (GR's epoch schedule), stateful (ROLE's per-example estimates)
LOSSES = [("an", {}), ("gr", {}), ("role", {"k": 2.0})]


def _draws(data):
    labels = data.train_labels.cpu().numpy()
    return [single_positive(labels, s) for s in DRAW_SEEDS]


@pytest.mark.parametrize(("loss_name", "hparams"), LOSSES)
def test_each_seed_and_draw_equals_its_own_run(loss_name, hparams):
    data = _data()
    draws = _draws(data)
    cells = [(s, d) for d in range(len(draws)) for s in SEEDS]
    cfg = ProbeConfig(epochs=2, batch_size=8, lr=1e-2, use_presets=False,
                      seeds=tuple(s for s, _ in cells))
    stacked = train_probe(data, cfg, loss_name, [dict(hparams) for _ in cells],
                          draws=draws, draw_index=[d for _, d in cells])
    assert len(stacked.trials) == len(cells)
    for t, (seed, d) in enumerate(cells):
        own = replace(data, train_observed=torch.as_tensor(draws[d]))
        alone = train_probe(own, replace(cfg, seeds=None, seed=seed), loss_name, dict(hparams))
        torch.testing.assert_close(stacked.final_heads[t], alone.final_heads[0],
                                   atol=2e-5, rtol=0)
        torch.testing.assert_close(stacked.best_heads[t], alone.best_heads[0],
                                   atol=2e-5, rtol=0)
        assert stacked.trials[t].best_epoch == alone.trials[0].best_epoch
        mine, ref = stacked.trials[t].best, alone.trials[0].best
        assert mine["val_map"] == pytest.approx(ref["val_map"], abs=1e-5)
        assert mine["test_map"] == pytest.approx(ref["test_map"], abs=1e-5)


def test_a_draw_equals_the_plain_loop_on_that_draw():
    data = _data()
    draws = _draws(data)
    cfg = ProbeConfig(epochs=2, batch_size=8, lr=1e-2, seeds=(3, 3), use_presets=False)
    stacked = train_probe(data, cfg, "role", [{"k": 2.0}, {"k": 2.0}], draws=draws,
                          draw_index=[2, 1])
    for t, d in enumerate((2, 1)):
        own = replace(data, train_observed=torch.as_tensor(draws[d]))
        ref = _reference(own, "role", {"k": 2.0}, seed=3, lr=1e-2, epochs=2, batch=8)
        head = torch.cat([ref.weight.detach().T, ref.bias.detach()[None]])
        torch.testing.assert_close(stacked.final_heads[t], head, atol=2e-5, rtol=0)
    # the two draws differ, so the two trials (same seed) must too
    assert not torch.allclose(stacked.final_heads[0], stacked.final_heads[1])


def test_one_trial_over_several_draws():
    data = _data()
    draws = _draws(data)
    cfg = ProbeConfig(epochs=1, batch_size=8, lr=1e-2, seed=4, use_presets=False)
    result = train_probe(data, cfg, "an", draws=draws, draw_index=[0, 1, 2])
    assert [r.seed for r in result.trials] == [4, 4, 4]
    first = train_probe(replace(data, train_observed=torch.as_tensor(draws[1])), cfg, "an")
    torch.testing.assert_close(result.final_heads[1], first.final_heads[0], atol=2e-5, rtol=0)


def test_bad_draws_are_named():
    data = _data()
    draws = _draws(data)
    cfg = ProbeConfig(epochs=1, batch_size=8, use_presets=False)
    with pytest.raises(ProbeConfigError, match="draw_index"):
        train_probe(data, cfg, "an", draws=draws)
    with pytest.raises(ProbeConfigError, match="draw_index: 3"):
        train_probe(data, cfg, "an", draws=draws, draw_index=[3])
    with pytest.raises(ProbeConfigError, match="draws: expected"):
        train_probe(data, cfg, "an", draws=np.zeros((2, 3, 4), np.int8), draw_index=[0])


def _replicates():
    """draws:3-like replicates: one split, three train draws (tests/test_train.py's arrays)."""
    from tests.test_train import _arrays

    arrays, flipped = _arrays()
    out = []
    for s in DRAW_SEEDS:
        observed = single_positive(arrays["train"][1], s)
        out.append(ProbeData.from_arrays(arrays["train"], arrays["val"], arrays["test"],
                                         train_flip=flipped, train_observed=observed))
    return out


# two trials per replicate: per-trial seeds (GR), one seed and two hyperparameters (ROLE)
@pytest.mark.parametrize(("loss_name", "hparams", "seeds"),
                         [("gr", [{}, {}], (1, 2)), ("role", [{"k": 2.0}, {"k": 3.0}], None)])
def test_train_replicates_stacked_equals_one_run_per_replicate(loss_name, hparams, seeds):
    data = _replicates()
    cfg = ProbeConfig(epochs=2, batch_size=8, lr=1e-2, use_presets=False, seeds=seeds)
    stacked = train_replicates(data, cfg, loss_name, hparams)
    plain = train_replicates(data, cfg, loss_name, hparams, stack=False)
    assert stacked[0].timing["stacked_replicates"] == 3
    for mine, ref in zip(stacked, plain):
        torch.testing.assert_close(mine.final_heads, ref.final_heads, atol=2e-5, rtol=0)
        torch.testing.assert_close(mine.best_heads, ref.best_heads, atol=2e-5, rtol=0)
        assert mine.source == ref.source
        assert mine.shared_batch_order == ref.shared_batch_order
        assert mine.config == ref.config
        for a, b in zip(mine.trials, ref.trials):
            assert (a.trial, a.seed, a.best_epoch) == (b.trial, b.seed, b.best_epoch)
            for e, f in zip(a.epochs, b.epochs):
                assert e["val_map"] == pytest.approx(f["val_map"], abs=1e-5)
    merged = mean_over_replicates(stacked, "draws:3")
    reference = mean_over_replicates(plain, "draws:3")
    for a, b in zip(merged.trials, reference.trials):
        assert a.best["val_map"] == pytest.approx(b.best["val_map"], abs=1e-5)
        assert a.best["test_map"] == pytest.approx(b.best["test_map"], abs=1e-5)


@pytest.mark.parametrize(("loss_name", "hparams"), LOSSES)
def test_train_cells_equals_one_run_per_cell(loss_name, hparams):
    """A table column: three draws x two seeds of one loss, stacked vs one run per cell."""
    data = _replicates()
    base = ProbeConfig(epochs=2, batch_size=8, lr=1e-2, use_presets=False)
    cells = [(replace(base, seed=s), d) for d in data for s in SEEDS]
    stacked = train_cells(cells, loss_name, hparams)
    plain = train_cells(cells, loss_name, hparams, stack=False)
    assert stacked[0].timing["stacked_cells"] == len(cells)
    for mine, ref in zip(stacked, plain):
        torch.testing.assert_close(mine.final_heads, ref.final_heads, atol=2e-5, rtol=0)
        torch.testing.assert_close(mine.best_heads, ref.best_heads, atol=2e-5, rtol=0)
        assert mine.config == ref.config and mine.source == ref.source
        assert mine.trials[0].seed == ref.trials[0].seed
        assert mine.trials[0].best_epoch == ref.trials[0].best_epoch
        assert mine.trials[0].best["test_map"] == pytest.approx(ref.trials[0].best["test_map"],
                                                                abs=1e-5)


def test_with_draw_is_from_store_on_that_draw_without_reading_the_features(yeast_store,
                                                                          tmp_path):
    """A table's column loads the features once and the other draws beside them: equal to a
    fresh load of each draw (observed labels, source), the features shared, not copied."""
    import shutil

    from probe.errors import DataError
    from probe.store.draws import add_draws

    path = tmp_path / "y.zarr"
    shutil.copytree(yeast_store, path)
    add_draws(path, [1, 2])
    first = ProbeData.from_store(path, observed_seed=1200)
    for seed in (1, 2):
        other = first.with_draw(path, seed)
        fresh = ProbeData.from_store(path, observed_seed=seed)
        assert torch.equal(other.train_observed, fresh.train_observed)
        assert torch.equal(other.val_observed, fresh.val_observed)
        assert other.source == fresh.source
        assert other.train_x.data_ptr() == first.train_x.data_ptr()  # shared
        assert not torch.equal(other.train_observed, first.train_observed)
    with pytest.raises(DataError, match="with_draw"):
        _data().with_draw(path, 1)  # arrays, not a store
