"""``spml probe`` end to end through the real entry point (studies.cli.main) on a small store:
stacked trials from --set, the results file, heads saved and evaluated, kNN, one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures_datasets import toy_feature_store

from probe.cli.args import parse_sets, parse_value
from studies.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A 6-class store written through the real writer: 150 pool rows + 40 test rows, flips."""
    return toy_feature_store(tmp_path_factory.mktemp("cli") / "toy.zarr")


def test_set_values_are_parsed_into_trials():
    assert parse_value("3") == 3 and parse_value("1e-3") == 1e-3
    assert parse_value("True") is True and parse_value("mean") == "mean"
    assert parse_sets(["w_T=2,5", "use_k=false"]) == {"w_T": [2, 5], "use_k": [False]}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_sets(["w_T"])
    with pytest.raises(ValueError, match="given twice"):
        parse_sets(["a=1", "a=2"])


def test_probe_stacked_trials_json_and_head(store, tmp_path, capsys):
    out = tmp_path / "run.json"
    head = tmp_path / "head.pt"
    rc = main(["probe", str(store), "--loss", "gr", "--set", "w_T=2,10", "--set", "lr=1e-2,1e-3",
               "--epochs", "2", "--batch-size", "8", "--json", str(out), "--save-head",
               str(head), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "4 trials" in text and "<- best" in text and "lr per trial" in text
    payload = json.loads(out.read_text())
    assert payload["n_trials"] == 4 and payload["config"]["batch_size"] == 8
    assert [(t["hparams"]["w_T"], t["lr"]) for t in payload["trials"]] == [
        (2.0, 0.01), (2.0, 0.001), (10.0, 0.01), (10.0, 0.001)]
    assert payload["data"]["path"].endswith("toy.zarr") and payload["config"]["flip_used"]
    assert payload["data"]["provenance"]["backbone"] == "none"
    best = payload["best_trial"]
    rc = main(["probe", str(store), "--eval-head", str(head), "--head-trial", str(best)])
    assert rc == 0
    line = capsys.readouterr().out
    want = payload["trials"][best]["best"]["test_map"]
    assert f"test mAP {want:.2f}" in line


def test_probe_zip_seeds_and_knn(store, tmp_path, capsys):
    out = tmp_path / "zip.json"
    assert main(["probe", str(store), "--loss", "an_ls", "--set", "eps=0.1,0.2", "--set",
                 "weight_decay=0,0.01", "--zip", "--trials-seeds", "3,4", "--epochs", "1",
                 "--json", str(out), "--quiet"]) == 0
    trials = json.loads(out.read_text())["trials"]
    assert [(t["hparams"]["eps"], t["weight_decay"], t["seed"]) for t in trials] == [
        (0.1, 0.0, 3), (0.1, 0.0, 4), (0.2, 0.01, 3), (0.2, 0.01, 4)]
    assert main(["probe", str(store), "--loss", "knn", "--set", "k=3,10",
                 "--knn-backend", "torch"]) == 0
    text = capsys.readouterr().out
    assert "knn baseline" in text and text.count("\n") >= 4
    # seeds with the kNN baseline (which has no hyperparameter check) train, not crash
    assert main(["probe", str(store), "--loss", "knn", "--trials-seeds", "0,1",
                 "--knn-backend", "torch"]) == 0
    assert "knn baseline" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["--set", "w_t=3", "--loss", "gr"], "unknown hyperparameter 'w_t'; did you mean 'w_T'"),
    (["--batch-size", "100000"], "larger than the train split"),
    (["--loss", "nope"], "unknown loss 'nope'"),
    (["--observed-seed", "5"], "no single-positive draw for seed 5"),
    (["--trials-seeds", "a,b"], "--trials-seeds must be a comma list"),
    (["--loss", "knn", "--save-head", "x.pt"], "no trained head"),
    (["--loss", "knn", "--priors", "clip"], "the kNN baseline uses no prior"),
    (["--loss", "an", "--priors", "clip"], "an uses no prior, but --priors clip was given"),
    (["--intervals", "-1"], "--intervals must be >= 0"),
])
def test_errors_are_one_line(store, capsys, argv, message):
    assert main(["probe", str(store), "--epochs", "1", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spml probe: error:") and message in err[0]


def test_missing_store_and_gpu(tmp_path, capsys, store):
    assert main(["probe", str(tmp_path / "none.zarr")]) == 2
    assert "does not exist" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["probe", str(store), "--device", "cuda"]) == 2
        assert "no usable CUDA GPU" in capsys.readouterr().err


def test_help_answers_questions(capsys):
    with pytest.raises(SystemExit):
        main(["probe", "--help"])
    text = capsys.readouterr().out
    for needle in ("--set", "--zip", "--trials-seeds", "examples:", "Defaults:", "--json"):
        assert needle in text


def test_probe_json_counts_epochs_from_1_and_logs_plain_lines(store, tmp_path):
    """Every epoch number in the record is in 1..E, the best epoch of a head whose
    best is the last is E; progress in a log is plain lines (no \\r), the first one at once."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    out, log = tmp_path / "run.json", tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    env.pop("SPML_PROGRESS", None)
    with open(log, "w") as fh:
        code = subprocess.call(
            [sys.executable, "-m", "studies.cli", "probe", str(store), "--loss", "an",
             "--set", "lr=0.05,0.001", "--epochs", "3", "--batch-size", "16",
             "--json", str(out)], stderr=fh, stdout=subprocess.DEVNULL, env=env)
    assert code == 0
    text = log.read_text()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0] == "probe an ×2: starting (3 epochs)"
    assert [ln.split(":")[0] for ln in lines if ln.startswith("epoch")] == [
        "epoch 1/3", "epoch 2/3", "epoch 3/3"]
    # the test intervals after training are followed too (a second or two per head on COCO),
    # then, on this small store, the one warning that they rest on few test images
    assert lines[-3] == "test intervals (1000 resamples): starting (2 heads)"
    assert lines[-2].startswith("test intervals (1000 resamples): 2/2 heads (100%)")
    assert lines[-1].startswith("warning: the intervals and marks rest on ")
    record = json.loads(out.read_text())
    assert record["spml_version"]
    for tr in record["trials"]:
        epochs = [e["epoch"] for e in tr["epochs"]]
        assert epochs == [1, 2, 3] and 1 <= tr["best_epoch"] <= 3
        vals = [e["val_map"] for e in tr["epochs"]]
        if vals[-1] > max(vals[:-1]):  # its best is the last epoch
            assert tr["best_epoch"] == 3
        assert tr["best_epoch"] == 1 + vals.index(max(vals))
