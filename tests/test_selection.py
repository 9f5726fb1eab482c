"""Selection modes: ``spml study --select val | cv:K | draws:N`` and
``spml analyze selection``, on the real yeast store.

What is checked: the replicates are what :mod:`probe.evaluation.selection` says (re-splits of the
pool with the protocol's generator, or the protocol's draw with other seeds; replicate 0 is the
protocol's own), a study scores each trial by exactly the mean of the runs a plain loop would
make on each replicate, the mode is part of the study's identity, and the analysis writes its
table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch

from probe.engine.config import ProbeConfig
from probe.engine.data import ProbeData
from probe.engine.train import train_probe
from probe.evaluation.selection import (
    Selection,
    SelectionError,
    mean_over_replicates,
    selection_data,
)
from probe.store import open_store
from probe.store.protocol import PROTOCOL_SEED, single_positive, split_indices

pytest.importorskip("river", reason="the yeast set ships inside river (extra 'yeast')")

FAST = dict(epochs=2, batch_size=64, lr=0.01)
TENSORS = ("train_x", "train_labels", "train_observed", "val_x", "val_labels", "val_observed",
           "test_x", "test_labels")


@pytest.mark.parametrize(("text", "mode", "k"), [("val", "val", 1), ("cv:5", "cv", 5),
                                                 (" Draws:3 ", "draws", 3)])
def test_parse(text, mode, k) -> None:
    s = Selection.parse(text)
    assert (s.mode, s.k, s.replicates) == (mode, k, k)
    assert Selection.parse(str(s)) == s


@pytest.mark.parametrize(("text", "words"), [
    ("cv", "--select must be 'val', 'cv:K' or 'draws:N'"),
    ("kfold:3", "got 'kfold:3'"),
    ("cv:1", "at least 2 replicates"),
    ("draws:0", "at least 2 replicates"),
])
def test_bad_modes_name_the_argument(text, words) -> None:
    with pytest.raises(SelectionError, match="--select") as err:
        Selection.parse(text)
    assert words in str(err.value)


def _same(a: ProbeData, b: ProbeData) -> bool:
    return all(torch.equal(getattr(a, n), getattr(b, n)) for n in TENSORS)


def test_cv_replicates_resplit_the_pool(yeast_store) -> None:
    store = open_store(yeast_store)
    protocol = ProbeData.from_store(store)
    reps = selection_data(store, "cv:3")
    assert len(reps) == 3 and _same(reps[0], protocol)  # replicate 0: the protocol's split
    train, val = store.split("train"), store.split("val")
    pool = np.sort(np.concatenate([train, val]))
    labels, observed = store.labels(), store.observed(PROTOCOL_SEED)
    for j, rep in enumerate(reps[1:], start=1):
        first, second = split_indices(len(pool), len(val) / len(pool), PROTOCOL_SEED + j)
        tr, va = pool[first], pool[second]
        assert len(va) == len(val) and not set(tr) & set(va) and len(tr) + len(va) == len(pool)
        assert torch.equal(rep.train_labels, torch.from_numpy(labels[tr]))
        assert torch.equal(rep.val_labels, torch.from_numpy(labels[va]))
        # the study's draw, read at the re-split's rows
        assert torch.equal(rep.train_observed, torch.from_numpy(observed[tr]))
        assert torch.equal(rep.val_x[:, :-1], torch.from_numpy(store.features(va)))
        assert torch.equal(rep.test_x, protocol.test_x)
        assert rep.source["replicate"] == {"select": "cv:3", "index": j}
    assert not _same(reps[1], reps[2])
    assert all(_same(a, b) for a, b in zip(reps, selection_data(store, "cv:3")))  # seeded


def _draw_of(store, seed: int) -> np.ndarray:
    """Draw ``seed`` for every store row, as the protocol makes it per phase (pool, test)."""
    labels, n_pool = store.labels(), int(store.attrs["n_pool"])
    return np.concatenate([single_positive(labels[:n_pool], seed),
                           single_positive(labels[n_pool:], seed)])


def test_draws_replicates_redraw_the_single_positives(yeast_store) -> None:
    store = open_store(yeast_store)
    reps = selection_data(store, "draws:3", observed_seed=PROTOCOL_SEED)
    assert _same(reps[0], ProbeData.from_store(store))
    n_pool = int(store.attrs["n_pool"])
    pool_labels = store.labels()[:n_pool]
    for j, rep in enumerate(reps):
        draw = single_positive(pool_labels, PROTOCOL_SEED + j)  # the protocol's generator
        assert torch.equal(rep.train_observed, torch.from_numpy(draw[store.split("train")]))
        assert torch.equal(rep.val_observed, torch.from_numpy(draw[store.split("val")]))
        assert rep.train_x is reps[0].train_x  # the same split, loaded once
        assert rep.test_x is reps[0].test_x
        assert rep.source["observed_seed"] == PROTOCOL_SEED + j
        # what a load of this draw alone gives: its source as well as its labels
        alone = ProbeData.from_store(store, observed_seed=PROTOCOL_SEED + j,
                                     observed=_draw_of(store, PROTOCOL_SEED + j),
                                     replicate={"select": "draws:3", "index": j})
        assert rep.source == alone.source
        assert torch.equal(rep.val_observed, alone.val_observed)
    assert not torch.equal(reps[1].train_observed, reps[2].train_observed)


def test_the_mean_over_replicates_is_the_plain_runs_mean(yeast_store) -> None:
    reps = selection_data(yeast_store, "draws:2")
    hparams = [{"w_T": 10.0}, {"w_T": 2.0, "b_T": -4.0}]
    runs = [train_probe(d, ProbeConfig(**FAST), "gr", hparams) for d in reps]
    merged = mean_over_replicates(runs, "draws:2")
    assert merged.config["select"] == "draws:2"
    assert merged.source["replicates"]["observed_seeds"] == [PROTOCOL_SEED, PROTOCOL_SEED + 1]
    for i, trial in enumerate(merged.trials):
        curves = [[e["val_map"] for e in r.trials[i].epochs] for r in runs]
        mean = [(a + b) / 2 for a, b in zip(*curves)]
        assert [e["val_map"] for e in trial.epochs] == mean
        assert trial.best_epoch == int(np.argmax(mean)) + 1
        assert trial.best["val_map"] == max(mean)
        a, b = runs[0].trials[i].best, runs[1].trials[i].best
        assert trial.best["test_map"] == (a["test_map"] + b["test_map"]) / 2
        assert trial.best["test_ap"] == [(x + y) / 2 for x, y in zip(a["test_ap"], b["test_ap"])]
    with pytest.raises(SelectionError, match="3 replicates"):
        mean_over_replicates(runs, "cv:3")


def test_a_study_scores_trials_by_the_replicates_mean(yeast_store, tmp_path) -> None:
    """The value Optuna holds for every trial is the mean-curve maximum of plain runs on each
    replicate with the trial's parameters; its intermediate values are the mean curve; the
    Parquet rows say which mode scored them; nothing is pruned."""
    from studies.results.rows import read_results
    from studies.study.run import run_study
    from studies.study.settings import StudySettings
    from studies.study.storage import StudyError, open_existing_storage

    settings = StudySettings(store=yeast_store, loss="gr", n_trials=3, batch=3, out=str(tmp_path),
                             select="cv:2", seed=1, **FAST)
    summary = run_study(settings)
    assert summary.n_complete == 3 and summary.n_pruned == 0
    study = optuna.load_study(study_name="yeast-gr",
                              storage=open_existing_storage(tmp_path / "study.log")[1])
    trials = sorted(study.trials, key=lambda t: t.number)
    params = [{k.split(".", 1)[1]: v for k, v in t.params.items()} for t in trials]
    reps = selection_data(yeast_store, "cv:2")
    runs = [train_probe(d, ProbeConfig(seed=0, **FAST), "gr", params) for d in reps]
    merged = mean_over_replicates(runs, "cv:2")
    # the study trains the re-splits as one stacked run: equal to one run per re-split within
    # float rounding (val mAP in points)
    for t, m in zip(trials, merged.trials):
        assert t.value == pytest.approx(m.best["val_map"], abs=1e-4)
        assert [t.intermediate_values[e] for e in sorted(t.intermediate_values)] == pytest.approx(
            [e["val_map"] for e in m.epochs], abs=1e-4)
    frame = read_results(tmp_path / "results")
    assert set(frame["select"]) == {"cv:2"}
    assert study.user_attrs["spml.training"]["select"] == "cv:2"
    # the mode is part of the study: adding trials scored another way is refused
    with pytest.raises(StudyError, match="select: the study has 'cv:2', this command gives 'val'"):
        run_study(StudySettings(store=yeast_store, loss="gr", n_trials=4, batch=1,
                                out=str(tmp_path), seed=1, **FAST))


def test_study_cli_rejects_a_bad_mode(yeast_store, tmp_path, capsys) -> None:
    from studies.cli import main

    assert main(["study", yeast_store, "--loss", "gr", "--select", "cv:1",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--select cv:1" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())


def test_analyze_selection_writes_its_table(yeast_store, tmp_path, capsys) -> None:
    from studies.cli import main

    out = tmp_path / "sel"
    argv = ["analyze", "selection", yeast_store, "--modes", "val,draws:2", "--study-seeds", "3",
            "--trials", "2", "--trials-at-once", "2", "--eval-seeds", "0", "--epochs", "1",
            "--batch-size", "64", "--lr", "0.01", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| val | 1 |" in printed and "| draws:2 | 1 |" in printed
    record = json.loads((out / "selection.json").read_text())
    rows = record["rows"]
    assert [r["mode"] for r in rows] == ["val", "draws:2"]
    for r in rows:
        assert r["difference"] == pytest.approx(r["winner_test_map"] - r["paper_test_map"])
    assert [s["mode"] for s in record["summary"]] == ["val", "draws:2"]
    assert (out / "selection.png").stat().st_size > 0 and (out / "selection.md").exists()
    assert Path(out / "studies" / "draws2-seed3" / "study.log").exists()
    # the same command resumes the finished studies: the same rows
    assert main(argv) == 0
    again = json.loads((out / "selection.json").read_text())["rows"]
    assert again == rows


def test_a_small_val_split_is_pointed_out(yeast_store, tmp_path, capsys) -> None:
    from studies.cli import main

    fast = ["--epochs", "1", "--batch-size", "64", "--lr", "0.01", "--trials", "2",
            "--trials-at-once", "2"]
    assert main(["study", yeast_store, "--loss", "an_ls", *fast, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "note: the val split has 387 rows" in out and "docs/selection.md" in out
    assert main(["study", yeast_store, "--loss", "an_ls", *fast, "--select", "cv:2",
                 "--out", str(tmp_path / "b")]) == 0
    assert "val split has" not in capsys.readouterr().out
