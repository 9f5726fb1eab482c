"""Label-bias draws (probe.store.bias, spml draw --bias): the weighted draw, COCO's box weights
against the annotations, the draws stored like the others, refusals by name."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from fixtures_datasets import small_coco_store, tree_digest

from probe.store import add_biased_draw, open_store
from probe.store.bias import biased_positive
from probe.store.errors import StoreError
from studies.cli import main


def test_the_draw_follows_the_weights_among_the_positives():
    labels = np.zeros((6000, 4), dtype=np.uint8)
    labels[:, 1] = labels[:, 3] = 1
    labels[0] = 0  # a row without a positive stays empty
    weights = np.tile([50.0, 1.0, 50.0, 3.0], (6000, 1))  # classes 0, 2 are not positive
    obs = biased_positive(labels, weights, seed=7)
    assert obs[0].sum() == 0 and (obs[1:].sum(1) == 1).all()
    assert obs[:, [0, 2]].sum() == 0  # never a negative, whatever its weight
    assert obs[:, 3].mean() == pytest.approx(0.75, abs=0.02)  # 3 : 1
    assert np.array_equal(obs, biased_positive(labels, weights, seed=7))
    assert not np.array_equal(obs, biased_positive(labels, weights, seed=8))
    only = biased_positive(labels, np.tile([0.0, 0.0, 0.0, 1.0], (6000, 1)), seed=1)
    assert only[1:, 3].all()
    uniform = biased_positive(labels, np.zeros((6000, 4)), seed=1)  # all 0: uniform
    assert uniform[:, 1].mean() == pytest.approx(0.5, abs=0.03)
    with pytest.raises(StoreError, match="non-negative"):
        biased_positive(labels, -weights, seed=1)


def _coco_weights_reference(root: Path, split: str, image_ids, n_classes: int):
    """Σ area and Σ 1/d per (image, class), straight from the JSON (d = 0 -> 0.0005)."""
    data = json.loads((root / "annotations" / f"instances_{split}2014.json").read_text())
    dims = {im["id"]: (im["width"], im["height"]) for im in data["images"]}
    col = {c["id"]: j for j, c in enumerate(data["categories"])}
    row = {int(i): r for r, i in enumerate(image_ids)}
    size = np.zeros((len(image_ids), n_classes))
    loc = np.zeros((len(image_ids), n_classes))
    for a in data["annotations"]:
        r, c = row[a["image_id"]], col[a["category_id"]]
        x, y, w, h = a["bbox"]
        width, height = dims[a["image_id"]]
        d = math.hypot(x + w / 2 - width / 2, y + h / 2 - height / 2)
        size[r, c] += a["area"]
        loc[r, c] += 1 / (d if d else 0.0005)
    return size, loc


@pytest.fixture
def coco_store(tmp_path):
    return small_coco_store(tmp_path)


def test_coco_box_weights_match_the_annotations_and_are_stored(coco_store, tmp_path):
    path, index = coco_store
    c = len(index.class_names)
    for phase, split in ((index.pool, "train"), (index.test, "val")):
        size, loc = _coco_weights_reference(tmp_path / "coco", split, phase.image_ids, c)
        np.testing.assert_allclose(phase.bias_weights["size"], size, rtol=1e-6)
        np.testing.assert_allclose(phase.bias_weights["location"], loc, rtol=1e-6)
    store = open_store(path)
    stored = store.read("bias/size")
    assert np.array_equal(stored, np.concatenate([index.pool.bias_weights["size"],
                                                  index.test.bias_weights["size"]]))


@pytest.mark.parametrize("bias", ["size", "location"])
def test_a_box_biased_draw_is_stored_like_the_others(coco_store, bias):
    path, index = coco_store
    add_biased_draw(path, 5, bias)
    store = open_store(path)
    assert 5 in store.observed_seeds()
    assert store.attrs["observed_bias"]["5"] == {"bias": bias}
    obs = store.observed(5)
    n_pool = len(index.pool)
    want = np.concatenate([
        biased_positive(index.pool.labels, index.pool.bias_weights[bias], 5),
        biased_positive(index.test.labels, index.test.bias_weights[bias], 5)])
    assert np.array_equal(obs, want)  # each phase re-seeded, the phase's own weights
    labels = store.labels()
    assert ((obs == 1) <= (labels == 1)).all()
    assert (obs.sum(1) == (labels.sum(1) > 0)).all()
    add_biased_draw(path, 5, bias)  # the same draw again: left alone
    other = "location" if bias == "size" else "size"
    with pytest.raises(StoreError, match="already holds draw 5"):
        add_biased_draw(path, 5, other)
    assert n_pool > 0



def test_cli_bias_draws_on_a_store_without_boxes(yeast_store, tmp_path, capsys):
    store = tmp_path / "y.zarr"
    shutil.copytree(yeast_store, store)
    before = tree_digest(store)
    assert main(["draw", str(store), "--seeds", "7", "--bias", "size"]) == 2
    assert "needs the dataset's object boxes" in capsys.readouterr().err
    assert main(["draw", str(store), "--seeds", "7", "--bias", "semantic"]) == 2
    assert "--class-weights" in capsys.readouterr().err
    weights = tmp_path / "w.txt"
    weights.write_text("1\n2\n")
    assert main(["draw", str(store), "--seeds", "7", "--bias", "semantic",
                 "--class-weights", str(weights)]) == 2
    assert "14 finite non-negative numbers" in capsys.readouterr().err
    assert tree_digest(store) == before
    names = open_store(store).class_names
    weights.write_text("".join(f"{n} {i + 1}\n" for i, n in enumerate(names)))
    assert main(["draw", str(store), "--seeds", "7", "--bias", "semantic",
                 "--class-weights", str(weights)]) == 0
    s = open_store(store)
    labels = s.labels()
    n_pool = int(s.attrs["n_pool"])
    w = np.broadcast_to(np.arange(1.0, 15.0), labels.shape)
    assert np.array_equal(s.observed(7), np.concatenate([
        biased_positive(labels[:n_pool], w[:n_pool], 7),
        biased_positive(labels[n_pool:], w[n_pool:], 7)]))
    assert main(["probe", str(store), "--loss", "an", "--observed-seed", "7", "--epochs", "1",
                 "--batch-size", "64", "--quiet"]) == 0
