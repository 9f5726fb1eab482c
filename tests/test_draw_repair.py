"""A damaged draw is repaired as the draw its record says: a label-bias or label-budget draw
is never rewritten as the protocol's single positives under its own record."""

from __future__ import annotations

import numpy as np
import pytest
from test_reliability import build, chunk_file, flip_byte
from test_store import make_features

from probe.store import add_biased_draw, add_observed_seed, open_store, verify_store
from probe.store.records import draw_record

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_repaired_draw_is_the_draw_its_record_names(tmp_path):
    path = tmp_path / "s.zarr"
    feats = make_features()
    build(path, feats)
    store = open_store(path)
    add_biased_draw(path, 5, "semantic", np.linspace(0.1, 5.0, store.n_classes))
    add_observed_seed(path, 6, k=2)
    before = {seed: open_store(path).observed(seed).copy() for seed in (5, 6)}
    for seed in (5, 6):
        flip_byte(chunk_file(path, f"observed/{seed}", 0), at=-6)
    repaired = build(path, feats, resume=True)  # the same import command, run again
    assert verify_store(path).ok
    assert draw_record(dict(repaired.attrs), 5)["kind"] == "bias"
    assert draw_record(dict(repaired.attrs), 6)["kind"] == "budget"
    for seed in (5, 6):
        np.testing.assert_array_equal(repaired.observed(seed), before[seed])
