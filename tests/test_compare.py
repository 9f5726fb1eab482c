"""spml compare on the real yeast store: a planted difference is found, two runs of one
configuration are not told apart, heads of different stores / splits are refused, and heads of
different draws are paired with a note."""

from __future__ import annotations

import json

import pytest
import torch

from studies.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def heads(yeast_store, tmp_path_factory):
    """Two runs of one AN configuration (training seeds 0 and 1), one file."""
    out = tmp_path_factory.mktemp("heads")
    path = out / "an.pt"
    rc = main(["probe", yeast_store, "--loss", "an", "--trials-seeds", "0,1", "--epochs", "4",
               "--lr", "0.01", "--batch-size", "32", "--device", "cpu", "--quiet",
               "--save-head", str(path)])
    assert rc == 0
    return path


def _variant(src, dst, edit):
    payload = torch.load(src, map_location="cpu", weights_only=True)
    edit(payload)
    torch.save(payload, dst)
    return dst


def test_two_runs_of_one_configuration_do_not_differ(heads, tmp_path, capsys):
    capsys.readouterr()
    rc = main(["compare", str(heads), "--json", str(tmp_path / "c.json"),
               "--figure", str(tmp_path / "c.png"), "--resamples", "500"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "95% interval" in text and "no clear difference" in text and "better" not in \
        text.split("Differences")[1].split("'better'")[0]
    doc = json.loads((tmp_path / "c.json").read_text())
    (pair,) = doc["pairs"]
    assert not pair["significant"] and pair["diff_low"] <= 0 <= pair["diff_high"]
    for s in doc["systems"]:
        assert s["test_map_low"] < s["test_map"] < s["test_map_high"]
    assert (tmp_path / "c.png").stat().st_size > 10_000


def test_planted_difference_is_found(heads, tmp_path, capsys):
    """Trial 0 against itself with a fifth of its classes' weights scrambled."""
    def scramble(p):
        g = torch.Generator().manual_seed(0)
        p["weight"][:, :3] = torch.randn(p["weight"][:, :3].shape, generator=g)

    worse = _variant(heads, tmp_path / "worse.pt", scramble)
    capsys.readouterr()
    assert main(["compare", f"{heads}:0", f"{worse}:0", "--label", "good", "--label",
                 "scrambled", "--json", str(tmp_path / "c.json")]) == 0
    text = capsys.readouterr().out
    assert "A is better" in text
    (pair,) = json.loads((tmp_path / "c.json").read_text())["pairs"]
    assert pair["significant"] and pair["diff_low"] > 0 and pair["p_holm"] < 0.05


@pytest.mark.parametrize("key,value,words", [
    ("identity.created", "another build", "different store"),
    ("rows", {"train": 1, "val": 1, "test": 1}, "different split"),
])
def test_refuses_results_that_are_not_paired(heads, tmp_path, capsys, key, value, words):
    def edit(p):
        if key.startswith("identity."):  # the store's identity: the one "same store" rule
            p["data"]["identity"][key.partition(".")[2]] = value
        else:
            p["data"][key] = value

    other = _variant(heads, tmp_path / "other.pt", edit)
    capsys.readouterr()
    assert main(["compare", str(heads), str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "HEADS" in err


def test_heads_of_different_draws_are_paired_with_a_note(heads, tmp_path, capsys):
    def edit(p):
        p["data"]["observed_seed"] = 7
        p["data"]["draw"] = {"kind": "bias", "bias": "size"}

    other = _variant(heads, tmp_path / "other.pt", edit)
    capsys.readouterr()
    assert main(["compare", f"{heads}:0", f"{other}:1", "--json",
                 str(tmp_path / "c.json")]) == 0
    text = capsys.readouterr().out
    assert "Differences (paired on the same images" in text
    assert "note: the heads were trained on different draws" in text
    assert "draw 7, label bias 'size'" in text
    record = json.loads((tmp_path / "c.json").read_text())
    assert len(record["pairs"]) == 1 and record["notes"]
    assert main(["compare", f"{heads}:0", f"{heads}:1"]) == 0  # one draw: no note
    assert "different draws" not in capsys.readouterr().out


def test_a_single_head_is_refused(heads, capsys):
    assert main(["compare", f"{heads}:0"]) == 2
    assert "at least two heads" in capsys.readouterr().err


def test_a_study_folder_stands_for_its_retrained_winners(yeast_store, tmp_path, capsys):
    """The study's paper point, re-trained by compare, is the same head as 'spml probe' with
    the paper's values and the same settings: their difference is exactly 0."""
    train = ["--epochs", "3", "--batch-size", "32", "--lr", "0.01", "--device", "cpu"]
    out = tmp_path / "study"
    assert main(["study", yeast_store, "--loss", "an_ls", "--trials", "3", "--trials-at-once", "3",
                 "--out", str(out), *train]) == 0
    head = tmp_path / "defaults.pt"
    assert main(["probe", yeast_store, "--loss", "an_ls", "--quiet", "--intervals", "0",
                 "--save-head", str(head), *train]) == 0
    capsys.readouterr()
    assert main(["compare", str(out), str(head), "--json", str(tmp_path / "c.json")]) == 0
    doc = json.loads((tmp_path / "c.json").read_text())
    labels = [s["label"] for s in doc["systems"]]
    assert len(labels) == 4 and sum("trial 0 paper" in lab for lab in labels) == 1
    paper = next(lab for lab in labels if "trial 0 paper" in lab)
    (same,) = [p for p in doc["pairs"] if {p["a"], p["b"]} == {paper, labels[-1]}]
    assert same["diff"] == 0 and same["diff_low"] == 0 == same["diff_high"]
    assert not same["significant"]
