"""A call adding several draws writes all of them or none, also when another process takes one
of its seeds with a draw of another kind while it draws: the interleaving is injected (the
other draw runs at the moment this call draws that seed), not left to timing."""

from __future__ import annotations

import pytest
from fixtures_datasets import toy_feature_store

import probe.store.draws as draws
from probe.store import open_store
from probe.store.errors import StoreError
from probe.store.records import draw_record


def test_a_seed_taken_by_another_kind_meanwhile_refuses_the_whole_call(tmp_path, monkeypatch):
    path = toy_feature_store(tmp_path / "toy.zarr")
    real = draws.phase_observed
    other_drew = []

    def another_process_between(pool, test, seed, budget=None):
        if seed == 8 and not other_drew:  # while this call draws seed 8 ...
            other_drew.append(seed)
            draws.add_draws(path, [8], k=3)  # ... another takes it as a label budget
        return real(pool, test, seed, budget)

    monkeypatch.setattr(draws, "phase_observed", another_process_between)
    with pytest.raises(StoreError, match=r"already holds draw 8 with k=3 positives"):
        draws.add_draws(path, [7, 8])  # protocol draws 7 and 8
    assert other_drew == [8]
    store = open_store(path)
    assert 7 not in store.observed_seeds()  # nothing of the refused call was written
    assert draw_record(dict(store.attrs), 8) == {"kind": "budget", "k": 3, "fraction": 1.0}
    assert (store.observed(8, store.split("train")) == 1).sum(1).max() == 3  # its own data
    monkeypatch.setattr(draws, "phase_observed", real)
    assert draws.add_draws(path, [7, 8], k=3) == [7]  # 8 is there already as this draw
    assert open_store(path).observed_seeds() == [7, 8, 1200]
