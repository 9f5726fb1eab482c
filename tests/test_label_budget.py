"""Label-budget draws (probe.store.protocol.budget_positive) and spml analyze label-budget."""

from __future__ import annotations

import json

import numpy as np
import pytest

from probe.store.protocol import budget_positive, single_positive
from studies.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def labels():
    rng = np.random.default_rng(0)
    y = (rng.random((300, 12)) < 0.3).astype(np.uint8)
    y[:5] = 0  # rows without a positive
    return y


def test_k1_on_all_images_is_the_protocol_draw(labels):
    for seed in (1200, 7):
        assert np.array_equal(budget_positive(labels, seed), single_positive(labels, seed))


def test_budgets_are_nested_and_sized(labels):
    n_pos = labels.sum(1)
    prev = None
    for k in (1, 2, 3, 5):
        obs = budget_positive(labels, 1200, k=k)
        assert np.array_equal(obs.sum(1), np.minimum(n_pos, k))
        assert ((obs == 1) <= (labels == 1)).all()  # only true positives are observed
        if prev is not None:
            assert ((prev == 1) <= (obs == 1)).all()  # a larger k keeps the smaller k's labels
        prev = obs
    full = budget_positive(labels, 1200, k=2)
    half = budget_positive(labels, 1200, k=2, fraction=0.5)
    quarter = budget_positive(labels, 1200, k=2, fraction=0.25)
    labelled = lambda o: set(np.nonzero(o.any(1))[0])  # noqa: E731
    assert labelled(quarter) <= labelled(half) <= labelled(full)
    assert len(labelled(half)) <= 150 and len(labelled(quarter)) <= 75  # round(f N) images
    kept = half.any(1)
    assert np.array_equal(half[kept], full[kept]) and not half[~kept].any()


@pytest.mark.parametrize("kwargs,words", [({"k": 0}, r"k \(positives"),
                                          ({"fraction": 0.0}, "fraction"),
                                          ({"fraction": 1.5}, "fraction")])
def test_bad_budgets_are_named(labels, kwargs, words):
    with pytest.raises(ValueError, match=words):
        budget_positive(labels, **kwargs)


def test_analyze_label_budget_on_yeast(yeast_store, tmp_path, capsys):
    train = ["--epochs", "3", "--batch-size", "32", "--lr", "0.01", "--device", "cpu"]
    assert main(["analyze", "label-budget", yeast_store, "--losses", "an", "--k", "1,2",
                 "--fractions", "1,0.5", "--out", str(tmp_path), "--quiet", *train]) == 0
    printed = capsys.readouterr().out
    assert "k=1, 100% imgs" in printed and "k=2, 50% imgs" in printed
    rows = json.loads((tmp_path / "label_budget.json").read_text())["rows"]
    assert len(rows) == 4 and (tmp_path / "label_budget.png").stat().st_size > 10_000
    by = {(r["k"], r["fraction"]): r for r in rows}
    # more labels, more observed positives
    assert by[(2, 1.0)]["train_positives"] > by[(1, 1.0)]["train_positives"] > \
        by[(1, 0.5)]["train_positives"]
    for r in rows:
        assert r["test_map_low"] <= r["test_map"] <= r["test_map_high"]
    # k=1 on every image is the protocol: the same head as 'spml probe' with the same settings
    assert main(["probe", yeast_store, "--loss", "an", "--quiet", "--intervals", "0",
                 "--json", str(tmp_path / "p.json"), *train]) == 0
    probe = json.loads((tmp_path / "p.json").read_text())["trials"][0]["best"]
    assert by[(1, 1.0)]["test_map"] == pytest.approx(probe["test_map"], abs=1e-9)


# ----------------------------------------------------------------------------- stored draws


def test_a_budget_draw_stored_in_the_store_is_one_observed_seed(tmp_path, capsys):
    """``spml draw --k --fraction`` stores a label-budget draw under its seed: per phase, the
    same walk as budget_positive; any --observed-seed command trains on it and records the
    budget; a seed names one draw; bad budgets name their option."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_store import PROV, make_features, make_index

    from probe.engine.data import ProbeData
    from probe.store import StoreError, add_observed_seed, open_store, write_feature_store

    index = make_index()
    path = tmp_path / "s.zarr"
    write_feature_store(path, index, make_features(), provenance=PROV, progress=False)
    assert main(["draw", str(path), "--seeds", "20", "--k", "2", "--fraction", "0.5"]) == 0
    assert "draw 20: k=2 positives per image on 50% of the images" in capsys.readouterr().out
    store = open_store(path)
    pool, test = np.asarray(index.pool.labels), np.asarray(index.test.labels)
    want = np.concatenate([budget_positive(pool, 20, k=2, fraction=0.5),
                           budget_positive(test, 20, k=2, fraction=0.5)])
    assert np.array_equal(store.observed(20), want)
    assert store.observed_budget(20) == {"k": 2, "fraction": 0.5}
    assert store.observed_budget(1200) == {"k": 1, "fraction": 1.0}
    assert store.summary()["observed_budgets"] == {"20": {"k": 2, "fraction": 0.5}}
    data = ProbeData.from_store(store, observed_seed=20)
    assert data.source["label_budget"] == {"k": 2, "fraction": 0.5}
    assert torch_equal(data.train_observed, want[store.split("train")])
    assert "label_budget" not in ProbeData.from_store(store).source
    add_observed_seed(path, 20, k=2, fraction=0.5)  # the same draw again: nothing to do
    with pytest.raises(StoreError, match=r"already holds draw 20 with k=2 .* needs another seed"):
        add_observed_seed(path, 20, k=3)
    with pytest.raises(StoreError, match="already holds draw 1200 with one positive per image"):
        add_observed_seed(path, 1200, fraction=0.5)
    assert main(["draw", str(path), "--seeds", "21", "--fraction", "0"]) == 2
    assert "--fraction" in capsys.readouterr().err
    assert open_store(path).observed_seeds() == [20, 1200]
    assert main(["info", str(path)]) == 0
    assert ("draw 20: k=2 positives per image on 50% of the images (a label budget"
            in capsys.readouterr().out)


def torch_equal(tensor, array) -> bool:
    return bool(np.array_equal(tensor.cpu().numpy(), array))
