"""What a new user meets on the command line, through ``spml`` itself: inputs checked before
anything is written, a summary that states what was measured, hints that run as printed,
options that mean one thing, worker threads, and errors that name the real cause."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from studies.cli import main
from studies.results.rows import read_results, write_batch

pytest.importorskip("river", reason="the yeast set ships inside river (extra 'yeast')")

# one epoch of bs 64 at a learning rate that moves the head: seconds per study
FAST = ["--epochs", "1", "--batch-size", "64", "--lr", "0.01"]


def _study(store: str, out: Path, *extra: str, loss: str = "gr", trials: str = "3") -> list[str]:
    return ["study", store, "--loss", loss, "--trials", trials, "--trials-at-once", "3",
            "--out", str(out), *FAST, *extra]


def _storage(out: Path):
    from studies.study.storage import open_existing_storage

    return open_existing_storage(out / "study.log")[1]


def _commands(text: str) -> list[str]:
    """Every command the output tells the user to run: ``next: spml …`` and indented
    ``  spml …`` lines."""
    return [m.group(1) for m in re.finditer(r"^(?:next: |\s+)(spml .+)$", text, re.M)]


def _run(cmd: str) -> int:
    argv = shlex.split(cmd)
    assert argv[0] == "spml"
    return main(argv[1:])


# --------------------------------------------------------------------------------------------
# 1. validate, then create
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, says", [
    (["--set", "w_t=2"], "unknown hyperparameter 'w_t'; did you mean 'w_T'?"),
    (["--set", "sigma_T=-1"], "sigma_T"),
    (["--epochs", "0"], "--epochs must be a positive integer"),
    (["--batch-size", "100000"], "at most 1547"),
    (["--lr", "-1"], "--lr must be a positive number"),
    (["--observed-seed", "5"], "spml draw"),
    (["--device", "tpu"], "--device"),
])
def test_a_refused_study_leaves_out_as_it_was(yeast_store, tmp_path, capsys, bad, says):
    out = tmp_path / "pz"
    assert main(_study(yeast_store, out, *bad)) == 2
    err = capsys.readouterr().err
    assert says in err and err.startswith("spml study: error: ")
    assert not out.exists()
    # an existing folder is left exactly as it was
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(_study(yeast_store, out, *bad)) == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_the_corrected_command_runs_after_a_refused_one(yeast_store, tmp_path, capsys):
    out = tmp_path / "pz"
    assert main(_study(yeast_store, out, "--set", "w_t=2")) == 2
    assert main(_study(yeast_store, out, "--set", "w_T=2")) == 0
    study = optuna.load_study(study_name="yeast-gr", storage=_storage(out))
    assert study.user_attrs["spml.fixed"] == {"w_T": 2}


def test_probe_and_import_refuse_before_writing(yeast_store, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["probe", yeast_store, "--loss", "gr", "--set", "w_t=2", *FAST,
                 "--json", str(out / "p.json"), "--save-head", str(out / "h.pt")]) == 2
    assert "did you mean 'w_T'" in capsys.readouterr().err
    assert not out.exists()
    store = tmp_path / "y.zarr"
    assert main(["import", "yeast", "--out", str(store), "--seeds", "x"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert not store.exists()


def _failed_start(store: str, out: Path, **changes) -> None:
    """A study whose only trial failed, as a start that broke in training leaves it."""
    from probe.store import open_store
    from studies.study.create import create_or_join
    from studies.study.settings import StudySettings

    settings = StudySettings(store=store, loss="gr", n_trials=3, batch=3, out=str(out),
                             epochs=1, batch_size=64, lr=0.01, **changes)
    study = create_or_join(settings, open_store(store)).study
    trial = study.ask()
    study.tell(trial, state=TrialState.FAIL)
    write_batch(out / "results", [{"trial": trial.number, "study": "yeast-gr", "state": "FAIL"}])
    write_batch(out / "results", [{"trial": 0, "study": "another", "state": "COMPLETE"}])


def test_a_study_of_only_failed_trials_is_replaced_by_the_corrected_command(
        yeast_store, tmp_path, capsys):
    out = tmp_path / "pz"
    _failed_start(yeast_store, out, fixed={"w_T": 3.0})  # other settings than the command's
    assert main(_study(yeast_store, out)) == 0
    err = capsys.readouterr().err
    assert "held only failed trials" in err and "replaced" in err
    study = optuna.load_study(study_name="yeast-gr", storage=_storage(out))
    assert study.user_attrs["spml.fixed"] == {}
    assert all(t.state != TrialState.FAIL for t in study.trials)
    assert len(optuna.get_all_study_names(_storage(out))) == 1
    rows = read_results(out / "results")  # the failed start's rows went with it; others stay
    assert "FAIL" not in rows.filter(rows["study"] == "yeast-gr")["state"].to_list()
    assert rows.filter(rows["study"] == "another").height == 1


def test_a_failed_study_is_replaced_under_the_ask_lock(yeast_store, tmp_path, monkeypatch):
    """Replacing happens while the ask lock is held (two machines starting the corrected
    command at once replace it once), and its new identity is set before the lock is freed."""
    import contextlib

    import studies.study.create as sc

    out = tmp_path / "pz"
    _failed_start(yeast_store, out, fixed={"w_T": 3.0})
    held, seen = [], []
    real_lock, real_delete, real_label = sc.ask_lock, optuna.delete_study, sc._label_new

    @contextlib.contextmanager
    def lock(*a, **k):
        with real_lock(*a, **k):
            held.append(True)
            try:
                yield
            finally:
                held.pop()

    def delete(*a, **k):
        seen.append(("delete", bool(held)))
        return real_delete(*a, **k)

    def label(*a, **k):
        seen.append(("label", bool(held)))
        return real_label(*a, **k)

    monkeypatch.setattr(sc, "ask_lock", lock)
    monkeypatch.setattr(optuna, "delete_study", delete)
    monkeypatch.setattr(sc, "_label_new", label)
    assert main(_study(yeast_store, out)) == 0
    assert seen == [("delete", True), ("label", True)]


def test_a_study_with_measured_trials_is_never_replaced(yeast_store, tmp_path, capsys):
    out = tmp_path / "pz"
    assert main(_study(yeast_store, out)) == 0
    before = len(optuna.load_study(study_name="yeast-gr", storage=_storage(out)).trials)
    assert main(_study(yeast_store, out, "--set", "w_T=3")) == 2
    assert "exists with a different" in capsys.readouterr().err
    after = optuna.load_study(study_name="yeast-gr", storage=_storage(out))
    assert len(after.trials) == before and after.user_attrs["spml.fixed"] == {}


# --------------------------------------------------------------------------------------------
# 2-4, 7: one study (with --set on a searched parameter and the old --batch), its summary and
# its hints
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def study_run(yeast_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("study") / "pz"
    argv = ["study", yeast_store, "--loss", "gr", "--trials", "4", "--trials-at-once", "2",
            "--out", str(out), *FAST, "--set", "w_T=2", "--json", str(out.parent / "s.json")]
    with pytest.MonkeyPatch.context() as mp:
        import io
        import sys

        stdout, stderr = io.StringIO(), io.StringIO()
        mp.setattr(sys, "stdout", stdout)
        mp.setattr(sys, "stderr", stderr)
        assert main(argv) == 0
    return out, stdout.getvalue(), stderr.getvalue()


def test_set_on_a_searched_parameter_fixes_it_and_narrows_the_search(study_run):
    out, _, err = study_run
    assert "--set w_T=2: held fixed instead of searched; the search narrows to gr.b_T" in err
    study = optuna.load_study(study_name="yeast-gr", storage=_storage(out))
    assert "gr.w_T" not in study.user_attrs["spml.space"] and "gr.b_T" in \
        study.user_attrs["spml.space"]
    assert all("gr.w_T" not in t.params for t in study.trials)
    for row in read_results(out / "results").iter_rows(named=True):
        assert json.loads(row["params"]).get("w_T", 2) == 2


def test_the_old_batch_option_is_gone(yeast_store, tmp_path, capsys):
    out = tmp_path / "b"
    with pytest.raises(SystemExit) as exc:  # argparse refuses an unknown option
        main(["study", yeast_store, "--loss", "gr", "--batch", "2", "--out", str(out)])
    assert exc.value.code == 2
    assert "--batch" in capsys.readouterr().err
    assert not out.exists()


def test_summary_states_val_and_test_of_the_winner_and_the_paper_values(study_run):
    out, text, _ = study_run
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("on the test split"))
    tail = lines[start:]
    study = optuna.load_study(study_name="yeast-gr", storage=_storage(out))
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    best = max(complete, key=lambda t: (t.value, -t.number))
    paper = next(t for t in complete if t.user_attrs.get("spml:paper"))
    rows = {int(m.group(1)): m for ln in tail for m in [re.search(
        r"trial (\d+)\s+val mAP\s+([\d.]+)\s+test mAP\s+([\d.]+) \[([\d.]+), ([\d.]+)\]", ln)]
        if m}
    assert set(rows) == {best.number, paper.number}
    # the printed numbers are the study's own: val from the storage, test from its results
    tests = {r["trial"]: r["test_map"] for r in read_results(out / "results").iter_rows(
        named=True)}
    for t in {best.number: best, paper.number: paper}.values():
        m = rows[t.number]
        assert float(m.group(2)) == pytest.approx(t.value, abs=0.006)
        assert float(m.group(3)) == pytest.approx(tests[t.number], abs=0.011)
        assert float(m.group(4)) <= float(m.group(3)) <= float(m.group(5))
    if best.number != paper.number:
        verdict = next(ln for ln in tail if ln.startswith("the val winner is"))
        d = re.search(r"([+-][\d.]+) \[([+-][\d.]+), ([+-][\d.]+)\]", verdict)
        diff, low, high = (float(x) for x in d.groups())
        assert diff == pytest.approx(tests[best.number] - tests[paper.number], abs=0.03)
        says = "better than" if low > 0 else "WORSE" if high < 0 else "NOT shown better"
        assert says in verdict
    # the last lines are the commands that settle it
    assert tail[-2].startswith("  spml study confirm --storage ")
    assert tail[-1] == f"  spml compare {out}"
    record = json.loads((out.parent / "s.json").read_text())
    assert record["verdict"]["winner"]["trial"] == best.number
    assert "fixed (--set): w_T=2" in text and "trained with: epochs 1, batch size 64" in text


def test_every_printed_hint_runs_as_printed(study_run, capsys):
    _, text, _ = study_run
    commands = _commands(text)
    assert {c.split()[1] for c in commands} == {"report", "study", "compare"}
    for cmd in commands:
        assert _run(cmd) == 0, cmd
    printed = capsys.readouterr().out
    for cmd in _commands(printed):  # what those commands print in turn
        if cmd.split()[1] in ("report", "finetune"):
            continue  # the report's own hints need its files; finetune needs images
        assert _run(cmd) == 0, cmd


def test_compare_takes_name_for_a_folder_of_several_studies(yeast_store, study_run, capsys):
    out, _, _ = study_run
    assert main(_study(yeast_store, out, "--name", "other", loss="an_ls", trials="2")) == 0
    text = capsys.readouterr().out
    hints = _commands(text)
    assert any("--name other" in h for h in hints)
    for cmd in hints:
        if cmd.startswith("spml compare") or cmd.startswith("spml report"):
            assert _run(cmd) == 0, cmd
    capsys.readouterr()
    assert main(["compare", str(out)]) == 2
    err = capsys.readouterr().err
    hint = re.search(r"e\.g\. (--name \S+)", err)
    assert hint and "holds 2 studies" in err
    assert _run(f"spml compare {out} {hint.group(1)}") == 0
    assert main(["compare", f"{out}:other"]) == 0
    assert "other trial" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# 5. worker threads
# --------------------------------------------------------------------------------------------


class _FakeWorker:
    started: list[dict] = []

    def __init__(self, argv, env=None, **_):
        _FakeWorker.started.append({"argv": argv, "env": env})

    def wait(self) -> int:
        return 0


@pytest.mark.parametrize("cores, workers, threads, warns", [
    (2, 2, "1", False), (8, 2, "4", False), (2, 3, "1", True), (3, 2, "1", False)])
def test_each_worker_gets_its_share_of_the_cores(yeast_store, tmp_path, capsys, monkeypatch,
                                                 cores, workers, threads, warns):
    import studies.study.run

    _FakeWorker.started = []
    monkeypatch.setattr(studies.study.run.subprocess, "Popen", _FakeWorker)
    monkeypatch.setattr(studies.study.run, "available_cores", lambda: cores)
    # the fake workers train nothing: the study then stops short, which is fine here
    assert main(_study(yeast_store, tmp_path / "w", "--workers", str(workers))) == 2
    err = capsys.readouterr().err
    assert "the workers stopped" in err
    assert len(_FakeWorker.started) == workers
    for w in _FakeWorker.started:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            assert w["env"][var] == threads
        assert w["env"]["PATH"] == os.environ["PATH"]  # the rest of the environment is kept
        assert w["argv"][-5:] == ["--workers", "1", "--storage",
                                  f"journal:{tmp_path / 'w' / 'study.log'}", "--as-worker"]
    assert (f"--workers {workers} on {cores} CPU cores" in err) == warns


# --------------------------------------------------------------------------------------------
# 6. errors that name the real cause
# --------------------------------------------------------------------------------------------


def test_a_missing_store_is_called_missing(tmp_path, capsys):
    assert main(["study", str(tmp_path / "missing.zarr"), "--loss", "gr",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"no store at {tmp_path / 'missing.zarr'}" in err
    assert "space" not in err and "file-size" not in err
    assert not (tmp_path / "o").exists()
    hint = re.search(r"e\.g\. '(spml import [^']+)'", err).group(1)  # runs as printed
    assert _run(hint) == 0 and (tmp_path / "missing.zarr").is_dir()


def test_an_unwritable_out_is_not_blamed_on_the_disk(yeast_store, tmp_path, capsys):
    assert main(_study(yeast_store, Path("/proc/x"))) == 2
    err = capsys.readouterr().err
    assert "virtual file system" in err and "space" not in err
    assert main(["import", "yeast", "--out", "/proc/x.zarr"]) == 2
    err = capsys.readouterr().err
    assert "--out /proc/x.zarr" in err and "virtual file system" in err and "full" not in err
    if os.geteuid() == 0:
        return  # root writes anywhere: no permission to test
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert main(_study(yeast_store, locked / "pz")) == 2
        err = capsys.readouterr().err
        assert "permission denied" in err and "space" not in err
    finally:
        locked.chmod(0o755)


# --------------------------------------------------------------------------------------------
# 7. no option abbreviations
# --------------------------------------------------------------------------------------------


def _parsers():
    import argparse

    from studies.cli import build_parser
    from studies.cli.study import confirm_parser

    todo, seen = [build_parser(), confirm_parser()], []
    while todo:
        p = todo.pop()
        seen.append(p)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += list(action.choices.values())
    return seen


def test_no_parser_expands_an_abbreviated_option(yeast_store, capsys):
    parsers = _parsers()
    assert len(parsers) > 20 and all(not p.allow_abbrev for p in parsers)
    with pytest.raises(SystemExit) as stop:
        main(["probe", yeast_store, "--loss", "an", "--batch", "100"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --batch" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# 8. what a wrong file is, in words
# --------------------------------------------------------------------------------------------


def test_compare_says_what_a_wrong_file_is(yeast_store, tmp_path, capsys):
    head, record = tmp_path / "an.pt", tmp_path / "an.json"
    assert main(["probe", yeast_store, "--loss", "an", *FAST, "--intervals", "0",
                 "--json", str(record), "--save-head", str(head)]) == 0
    capsys.readouterr()
    assert main(["compare", str(record), str(head)]) == 2
    err = capsys.readouterr().err
    assert "results JSON of a probe run" in err and "--save-head" in err
    assert "Unpickler" not in err and "weights_only" not in err
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n")
    assert main(["compare", str(table), str(head)]) == 2
    err = capsys.readouterr().err
    assert "is a CSV file, not a readable spml-probe head file" in err and "Unpickler" not in err


def test_import_arrays_says_a_csv_is_not_a_npy(tmp_path, capsys):
    feats, labels = tmp_path / "x.csv", tmp_path / "y.npy"
    feats.write_text("0.1,0.2\n0.3,0.4\n")
    np.save(labels, np.eye(2, dtype=np.uint8))
    assert main(["import", "arrays", "--features", str(feats), "--labels", str(labels),
                 "--name", "mine", "--out", str(tmp_path / "m.zarr")]) == 2
    err = capsys.readouterr().err
    assert "is a text/CSV file; expected a .npy array" in err and "np.loadtxt" in err
    assert "allow_pickle" not in err
    assert not (tmp_path / "m.zarr").exists()


# --------------------------------------------------------------------------------------------
# 10. featurize: every bad image listed; labels.csv described
# --------------------------------------------------------------------------------------------


def test_featurize_help_describes_labels_csv(capsys):
    with pytest.raises(SystemExit):
        main(["featurize", "folder", "--help"])
    text = capsys.readouterr().out
    for needle in ("labels.csv", "path,labels[,split]", "joined by ';'", "img/001.jpg,cat;dog",
                   "labels.jsonl", "--option annotations=PATH"):
        assert needle in text


def test_featurize_lists_every_bad_image(tmp_path, capsys):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from fixtures_datasets import make_folder

    root = tmp_path / "photos"
    make_folder(root, n_images=26)
    gone = sorted((root / "img").glob("*.jpg"))[:23]
    for p in gone:
        p.unlink()
    argv = ["featurize", "folder", "--root", str(root), "--out", str(tmp_path / "s.zarr"),
            "--backbone", "resnet18", "--weights", "random", "--size", "32", "--quiet"]
    assert main(argv) == 2  # without --skip-bad: the first 20 named, the rest counted
    err = capsys.readouterr().err
    assert "23 of 26 image files are missing" in err
    assert sum(f"{p} (listed in" in err for p in gone) == 20
    assert "... and 3 more" in err and "--skip-bad" in err
    assert not (tmp_path / "s.zarr").exists()
    assert main([*argv, "--skip-bad"]) == 0
    out = capsys.readouterr().out
    assert "23 unreadable images got zero features" in out
    listed = [ln for ln in out.splitlines() if ln.startswith("  ") and "img/" in ln]
    assert len(listed) == 20 and sum(f"  {p}: " in out for p in gone) == 20
    assert "... and 3 more" in out


def test_a_study_made_with_a_fixed_lr_continues_with_it(yeast_store, tmp_path, capsys):
    """A study made before the lr was searched by default (no --lr, a store without a preset)
    continues with the same command; a new one searches the lr."""
    out = tmp_path / "old"
    base = ["study", yeast_store, "--loss", "an_ls", "--trials-at-once", "2", "--epochs", "1",
            "--batch-size", "64"]
    assert main([*base, "--trials", "2", "--out", str(out), "--no-search-lr"]) == 0
    assert main([*base, "--trials", "4", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "made with a fixed lr: continued with it" in err
    study = optuna.load_study(study_name="yeast-an_ls", storage=_storage(out))
    assert len([t for t in study.trials if t.state.is_finished()]) >= 4
    assert all("train.lr" not in t.params for t in study.trials)
    new = tmp_path / "new"
    assert main([*base, "--trials", "2", "--out", str(new)]) == 0
    assert "no paper gives an_ls's learning rate on yeast: train.lr is searched" in \
        capsys.readouterr().err
    study = optuna.load_study(study_name="yeast-an_ls", storage=_storage(new))
    assert "train.lr" in study.user_attrs["spml.space"]
