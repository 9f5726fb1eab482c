"""One record per draw (probe.store.records): a draw of another kind on a taken seed is refused
by name both ways, `spml draw` checks every seed before writing, `spml info` and the probe
JSON say what each draw is, and the root attributes change under a lock (a prior and a draw
written at the same time are both kept)."""

from __future__ import annotations

import json
import multiprocessing as mp

import numpy as np
import pytest

from probe.store import open_store
from probe.store.records import draw_record
from studies.cli import main


@pytest.fixture
def small_store(tmp_path):
    from fixtures_datasets import small_coco_store

    return small_coco_store(tmp_path)[0]


def _disk(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_a_biased_seed_refuses_a_protocol_draw_and_the_other_way(small_store, capsys):
    path = small_store
    assert main(["draw", str(path), "--seeds", "5", "--bias", "size"]) == 0
    assert "draw 5: label bias 'size'" in capsys.readouterr().out
    assert main(["draw", str(path), "--seeds", "5"]) == 2
    err = capsys.readouterr().err
    assert "already holds draw 5 with label bias 'size'" in err and "--seeds 1201" in err
    assert main(["draw", str(path), "--seeds", "6"]) == 0
    assert main(["draw", str(path), "--seeds", "6", "--bias", "location"]) == 2
    assert "already holds draw 6 with one positive per image" in capsys.readouterr().err
    assert main(["draw", str(path), "--seeds", "5", "--bias", "size"]) == 0  # the same: kept
    assert "(already there)" in capsys.readouterr().out
    attrs = open_store(path).attrs
    assert draw_record(attrs, 5) == {"kind": "bias", "bias": "size"}
    assert draw_record(attrs, 6) == {"kind": "protocol"}
    assert main(["info", str(path)]) == 0
    assert "  draw 5: label bias 'size'" in capsys.readouterr().out
    assert main(["info", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["draws"] == {"5": {"kind": "bias",
                                                                  "bias": "size"}}


def test_draw_checks_every_seed_before_writing(small_store, tmp_path, capsys):
    path = small_store
    (tmp_path / "w.txt").write_text("\n".join(["1"] * len(open_store(path).class_names)))
    before = _disk(path)
    assert main(["draw", str(path), "--seeds", "21,22,1200", "--bias", "semantic",
                 "--class-weights", str(tmp_path / "w.txt")]) == 2
    assert "already holds draw 1200" in capsys.readouterr().err
    assert _disk(path) == before
    assert open_store(path).observed_seeds() == [1200]
    assert main(["draw", str(path), "--seeds", "21,22,1200", "--k", "2"]) == 2
    assert _disk(path) == before


def test_the_probe_json_names_the_draw(small_store, tmp_path):
    path = small_store
    assert main(["draw", str(path), "--seeds", "5", "--bias", "size"]) == 0
    out = tmp_path / "p.json"
    assert main(["probe", str(path), "--loss", "an", "--observed-seed", "5", "--epochs", "1",
                 "--batch-size", "16", "--json", str(out), "--quiet"]) == 0
    data = json.loads(out.read_text())["data"]
    assert data["observed_seed"] == 5
    assert data["draw"] == {"kind": "bias", "bias": "size"}


def _import_prior(path, name, scores, barrier):
    barrier.wait()
    assert main(["import", "priors", str(path), "--name", name, "--from", str(scores),
                 "--model", "m"]) == 0


def _draw(path, seed, barrier):
    barrier.wait()
    assert main(["draw", str(path), "--seeds", str(seed)]) == 0


def test_a_prior_and_a_draw_written_together_are_both_kept(small_store, tmp_path):
    path = small_store
    s = open_store(path)
    scores = np.random.default_rng(1).random((s.n_rows, s.n_classes)).astype(np.float32)
    np.save(tmp_path / "scores.npy", scores / scores.sum(1, keepdims=True))
    ctx = mp.get_context("fork")
    rounds = 8
    for i in range(rounds):
        barrier = ctx.Barrier(2)
        procs = [ctx.Process(target=_import_prior,
                             args=(path, f"p{i}", tmp_path / "scores.npy", barrier)),
                 ctx.Process(target=_draw, args=(path, 30 + i, barrier))]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        assert [p.exitcode for p in procs] == [0, 0]
    store = open_store(path)
    assert store.observed_seeds() == sorted([1200, *(30 + i for i in range(rounds))])
    assert sorted(store.prior_names()) == sorted(f"p{i}" for i in range(rounds))
