"""Kept heads are their own study's, and the heads scored are of the store they were made on:
two studies of one name and settings in two storages but one folder each read only the heads
their trials kept; ``spml compare`` refuses, by the one "same store" rule (the store's
identity), a store that is not the heads' or the study's."""

from __future__ import annotations

import shutil

import pytest
import torch

from studies.cli import main


def _run(store, out, storage, seed):
    from studies.results.confirm import load_study
    from studies.study.run import run_study
    from studies.study.settings import StudySettings

    settings = StudySettings(store=store, loss="an_ls", n_trials=3, batch=3, epochs=2,
                             batch_size=32, lr=0.01, pruner="none", out=str(out), name="s",
                             storage=str(storage), seed=seed)
    run_study(settings, log=lambda m: None, verdict=False)
    return load_study(str(storage), "s")


def test_one_name_and_settings_in_two_storages_each_read_their_own_heads(yeast_store, tmp_path):
    from studies.results.rows import read_trial_heads, study_tag

    out = tmp_path / "shared"
    results = out / "results"
    first = _run(yeast_store, out, tmp_path / "a.log", seed=0)
    (a_file,) = results.glob("heads-*.pt")
    second = _run(yeast_store, out, tmp_path / "b.log", seed=1)  # another sampler seed
    (b_file,) = set(results.glob("heads-*.pt")) - {a_file}
    assert study_tag(first) != study_tag(second)
    for study, path in ((first, a_file), (second, b_file)):
        kept = torch.load(path, map_location="cpu", weights_only=True)
        read = read_trial_heads(results, study_tag(study))
        assert sorted(read) == sorted(kept["trials"])
        for i, n in enumerate(kept["trials"]):
            assert torch.equal(read[n][0], kept["heads"][i])
    # the two studies' sampled trials trained different heads: reading the other's would show
    a_heads = torch.load(a_file, weights_only=True)["heads"]
    b_heads = torch.load(b_file, weights_only=True)["heads"]
    assert not torch.equal(a_heads, b_heads)
    _each_reads_its_own_rows(out, {tmp_path / "a.log": first, tmp_path / "b.log": second})


def _each_reads_its_own_rows(out, studies):
    """The results rows too: each study's report reads only the rows its own trials wrote (the
    same trial numbers, other parameters) and says what it left out."""
    import json

    from studies.report.data import open_study_view
    from studies.results.rows import read_results, rows_of_study

    results = out / "results"
    frame = read_results(results)
    assert frame.height == 6 and set(frame["study"]) == {"s"}
    for storage, study in studies.items():
        view = open_study_view(out, str(storage), "s")
        assert sorted(view.results) == [t.number for t in study.trials] == [0, 1, 2]
        for t in study.trials:
            assert json.loads(view.results[t.number]["params"]) == t.params
            assert view.results[t.number]["val_map"] == pytest.approx(t.value)
        assert f"3 results rows in {results} are of another study named 's' (made in another " \
               "storage, or made again): left out" in view.notes
    first, second = studies.values()
    # a row written before rows carried their study's tag is read by the study's name
    untagged = frame.head(1).with_columns(study_tag=None)
    assert rows_of_study(untagged, second).height == 1
    assert rows_of_study(frame.head(1), first).height + rows_of_study(
        frame.head(1), second).height == 1


@pytest.fixture(scope="module")
def heads(yeast_store, tmp_path_factory):
    path = tmp_path_factory.mktemp("heads") / "an.pt"
    assert main(["probe", yeast_store, "--loss", "an", "--trials-seeds", "0,1", "--epochs", "2",
                 "--lr", "0.01", "--batch-size", "32", "--device", "cpu", "--quiet",
                 "--save-head", str(path)]) == 0
    return path


def test_heads_of_another_store_identity_are_refused_on_this_store(heads, tmp_path, capsys):
    """Both heads claim a store made with other weights: paired with each other they are, but
    scoring them on this store (same build time and split) is refused, naming what differs."""
    payload = torch.load(heads, map_location="cpu", weights_only=True)
    payload["data"]["identity"]["weights_sha256"] = "another-backbone"
    other = tmp_path / "other.pt"
    torch.save(payload, other)
    capsys.readouterr()
    assert main(["compare", f"{other}:0", f"{other}:1"]) == 2
    err = capsys.readouterr().err
    assert "--store" in err and "not the store the heads were made from" in err
    assert "weights_sha256 'another-backbone'" in err


def test_compare_of_a_study_refuses_another_store_before_training(yeast_store, tmp_path,
                                                                 capsys):
    """A study whose heads must be re-trained (none kept): --store of another build of the
    dataset is refused by name, not trained on."""
    from featurize.imports import import_yeast

    out = tmp_path / "st"
    _run(yeast_store, out, out / "study.log", seed=0)
    for f in (out / "results").glob("heads-*.pt"):
        f.unlink()
    other = tmp_path / "other.zarr"
    import_yeast(other, test_fraction=0.3, progress=False)
    capsys.readouterr()
    assert main(["compare", str(out), "--store", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"--store {other}: not the store study 's' trained on" in err
    assert "re-trained" not in err
    copy = tmp_path / "copy.zarr"  # the same store elsewhere is the same store
    shutil.copytree(yeast_store, copy)
    assert main(["compare", str(out), "--store", str(copy), "--resamples", "200"]) == 0


def test_confirm_on_a_copy_without_the_studys_draw_adds_it_as_the_study_drew_it(yeast_store,
                                                                               tmp_path):
    """A study trained on a label-budget draw; confirmed on a copy of its store made before
    that draw was added (the same store by identity), the missing draw is added as the
    study's label budget (its results rows say so), not as the protocol's."""
    from probe.store import add_observed_seed, open_store
    from probe.store.records import draw_record
    from studies.results.confirm import confirm_study

    plain = tmp_path / "plain.zarr"
    shutil.copytree(yeast_store, plain)
    mine = tmp_path / "mine.zarr"
    shutil.copytree(yeast_store, mine)
    add_observed_seed(mine, 5, k=2)
    from studies.results.confirm import load_study
    from studies.study.run import run_study
    from studies.study.settings import StudySettings

    out = tmp_path / "st"
    run_study(StudySettings(store=str(mine), loss="an_ls", n_trials=2, batch=2, epochs=2,
                            batch_size=32, lr=0.01, pruner="none", out=str(out), name="s",
                            observed_seed=5), log=lambda m: None, verdict=False)
    study = load_study(str(out / "study.log"), "s")
    rows = confirm_study(study, str(plain), top_k=1, seeds=(0,), results=out / "results")
    assert rows and rows[0].observed_seeds == [5]
    assert draw_record(dict(open_store(plain).attrs), 5) == {"kind": "budget", "k": 2,
                                                             "fraction": 1.0}
