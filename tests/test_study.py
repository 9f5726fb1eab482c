"""Optuna studies on the real yeast store: SQLite, journal + 2 worker processes, a real
PostgreSQL server + 2 workers, a worker killed mid-trial, Parquet results vs the storage, and
the errors users hit."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from studies.cli import main
from studies.results.rows import read_results, write_batch
from studies.study.run import run_study
from studies.study.settings import StudySettings
from studies.study.storage import StudyError

pytest.importorskip("river", reason="the yeast set ships inside river (extra 'yeast')")

sys.path.insert(0, str(Path(__file__).parent))
from pgserver import find_pg_bin, postgres_server

# small and fast: 3 epochs of bs 32 on 1,547 yeast rows, a learning rate that moves the head
FAST = ["--epochs", "3", "--batch-size", "32", "--lr", "0.01"]


@pytest.fixture(scope="module")
def yeast(yeast_store, tmp_path_factory) -> str:
    """A copy of the session's yeast store: a confirm here adds draw 7 to it, and the session's
    store is read by other modules as it was imported."""
    import shutil

    path = tmp_path_factory.mktemp("study-yeast") / "yeast.zarr"
    shutil.copytree(yeast_store, path)
    return str(path)


def journal_storage(out: Path):
    """The journal storage 'spml study --out OUT' writes by default."""
    from studies.study.storage import open_existing_storage

    return open_existing_storage(out / "study.log")[1]


def _finished_ok(storage, name: str, n_trials: int, out: Path) -> list:
    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials()
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)), "a trial number is duplicated"
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(done) >= n_trials
    paper = [t for t in trials if t.user_attrs.get("spml:paper")]
    assert len(paper) == 1 and paper[0].state == TrialState.COMPLETE
    assert study.best_value >= paper[0].value  # the search is never worse than the paper
    frame = read_results(out / "results")
    by_trial = {row["trial"]: row for row in frame.iter_rows(named=True)}
    for t in done:  # every finished trial is in the Parquet results, with the same outcome
        row = by_trial[t.number]
        assert row["state"] == t.state.name
        assert json.loads(row["params"]) == t.params
        if t.state == TrialState.COMPLETE:
            assert row["value"] == pytest.approx(t.value)
            assert len(row["class_ap"]) == 14
    return trials


@pytest.mark.slow
def test_sqlite_study_then_journal_with_two_workers(yeast, tmp_path):
    out = tmp_path / "sqlite"
    code = main(
        [
            "study",
            yeast,
            "--loss",
            "an_ls",
            "--trials",
            "6",
            "--trials-at-once",
            "3",
            "--out",
            str(out),
            *FAST,
            "--json",
            str(tmp_path / "s.json"),
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["n_complete"] + summary["n_pruned"] >= 6
    _finished_ok(journal_storage(out), "yeast-an_ls", 6, out)

    out = tmp_path / "journal"
    code = main(
        [
            "study",
            yeast,
            "--loss",
            "em",
            "--trials",
            "8",
            "--trials-at-once",
            "2",
            "--workers",
            "2",
            "--storage",
            str(out / "study.log"),
            "--out",
            str(out),
            *FAST,
        ]
    )
    assert code == 0
    from studies.study.storage import open_storage, parse_storage

    storage = open_storage(parse_storage(out / "study.log"))
    trials = _finished_ok(storage, "yeast-em", 8, out)
    # which of the two processes asks first is a race, so how the trials split between them is
    # not asserted; that they were trained in worker processes, each named, is
    workers = {t.system_attrs.get("spml:worker") for t in trials}
    pids = {int(w.rsplit(":", 1)[1]) for w in workers}
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids, workers


@pytest.mark.slow
@pytest.mark.skipif(
    find_pg_bin() is None,
    reason="PostgreSQL server binaries are not installed "
    "(Debian package 'postgresql'; .ci/run installs it)",
)
def test_postgresql_study_with_two_workers(yeast, tmp_path):
    with postgres_server() as url:
        out = tmp_path / "pg"
        code = main(
            [
                "study",
                yeast,
                "--loss",
                "an_ls",
                "--trials",
                "6",
                "--trials-at-once",
                "2",
                "--workers",
                "2",
                "--storage",
                url,
                "--out",
                str(out),
                *FAST,
            ]
        )
        assert code == 0
        from studies.study.storage import open_storage, parse_storage

        _finished_ok(open_storage(parse_storage(url)), "yeast-an_ls", 6, out)


@pytest.mark.slow
def test_killed_worker_trial_is_retried_and_nothing_is_lost(yeast, tmp_path):
    out = tmp_path / "kill"
    log = out / "study.log"
    args = [
        sys.executable,
        "-m",
        "studies.cli",
        "study",
        yeast,
        "--loss",
        "an_ls",
        "--trials",
        "4",
        "--trials-at-once",
        "1",
        "--storage",
        str(log),
        "--out",
        str(out),
        "--epochs",
        "40",
        "--batch-size",
        "8",
        "--lr",
        "0.01",
        "--pruner",
        "none",
        "--heartbeat",
        "0.5",
        "--grace",
        "3",
    ]
    settings = StudySettings(
        store=yeast,
        loss="an_ls",
        storage=str(log),
        out=str(out),
        n_trials=4,
        batch=1,
        epochs=40,
        batch_size=8,
        lr=0.01,
        pruner="none",
        heartbeat_seconds=0.5,
        grace_seconds=3,
    )
    from probe.store import open_store
    from studies.study.create import create_or_join
    from studies.study.storage import open_storage, parse_storage

    create_or_join(settings, open_store(yeast))
    victim = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    storage = open_storage(parse_storage(log))
    deadline = time.time() + 120
    running = []
    while time.time() < deadline and not running:  # wait until the victim is mid-trial
        time.sleep(0.3)
        running = [
            t
            for t in optuna.load_study(study_name="yeast-an_ls", storage=storage).get_trials(
                states=(TrialState.RUNNING,)
            )
            if t.system_attrs.get("spml:worker", "").endswith(f":{victim.pid}")
        ]
    assert running, "the first worker never started a trial"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    survivor = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert survivor.returncode == 0, survivor.stderr[-2000:]
    study = optuna.load_study(study_name="yeast-an_ls", storage=storage)
    killed = study.trials[running[0].number]
    assert killed.state == TrialState.FAIL
    assert killed.system_attrs.get("spml:fail_reason") == "heartbeat lost"
    retries = [t for t in study.trials if t.user_attrs.get("spml:retry_of") == killed.number]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    assert retries[0].params == killed.params
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 4


def test_bad_input_is_one_clear_line(yeast, tmp_path, capsys):
    def err(*argv) -> str:
        assert main(["study", yeast, *argv, "--out", str(tmp_path / "bad"), *FAST]) == 2
        return capsys.readouterr().err

    assert "unknown storage scheme 'redis://'" in err("--loss", "an_ls", "--storage", "redis://h/0")
    assert "cannot reach the PostgreSQL server" in err(
        "--loss", "an_ls", "--storage", "postgresql://u@127.0.0.1:9/db"
    )
    assert "empty or inverted" in err("--loss", "an_ls", "--space", "eps=0.4:0.1")
    assert "search space for an is empty" in err("--loss", "an")
    assert "SQLite file is for one process" in err(
        "--loss", "an_ls", "--workers", "2", "--storage", str(tmp_path / "one.db")
    )
    assert "Traceback" not in capsys.readouterr().err
    # a study name that exists with another loss is refused, saying why
    db = tmp_path / "named.db"
    assert (
        main(
            [
                "study",
                yeast,
                "--loss",
                "an_ls",
                "--trials",
                "1",
                "--trials-at-once",
                "1",
                "--storage",
                str(db),
                "--name",
                "mine",
                "--out",
                str(tmp_path / "n"),
                *FAST,
            ]
        )
        == 0
    )
    capsys.readouterr()
    message = err("--loss", "epr", "--storage", str(db), "--name", "mine")
    assert "exists with a different loss" in message and '"an_ls"' in message


def test_grid_sampler_reproduces_a_sweep(yeast, tmp_path):
    settings = StudySettings(
        store=yeast,
        loss="an_ls",
        sampler="grid",
        n_trials=10,
        batch=3,
        grid={"an_ls.eps": (0.05, 0.2, 0.35)},
        out=str(tmp_path),
        epochs=2,
        batch_size=32,
        lr=0.01,
        pruner="none",
    )
    summary = run_study(settings)
    assert summary.n_complete == 3  # the grid has 3 points; the study stops when it is exhausted
    frame = read_results(tmp_path / "results")
    eps = [json.loads(p)["an_ls.eps"] for p in frame["params"]]
    assert sorted(eps) == [0.05, 0.2, 0.35]


def test_confirm_reports_mean_and_std(yeast, tmp_path, capsys):
    out = tmp_path / "c"
    assert (
        main(
            [
                "study",
                yeast,
                "--loss",
                "an_ls",
                "--trials",
                "3",
                "--trials-at-once",
                "3",
                "--out",
                str(out),
                *FAST,
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "study",
                "confirm",
                "--storage",
                str(out / "study.log"),
                "--store",
                yeast,
                "--top-k",
                "2",
                "--seeds",
                "0,1",
                "--observed-seeds",
                "1200,7",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "±" in printed
    best = json.loads((out / "best.json").read_text())
    assert best["loss"] == "an_ls" and "eps" in best["hparams"]
    # the probe's lr is recorded, but does not become the fine-tune's lr
    assert best["train"] == {} and best["probe_train"]["lr"] == 0.01
    assert best["confirmed"]["n_runs"] == 4
    assert best["study"]["trial"] == best["confirmed"]["trial"]
    # spml finetune reads the same winner straight from the study
    from studies.cli.finetune import winner_from_study

    loss, hparams, train = winner_from_study(str(out))
    study_best = optuna.load_study(study_name="yeast-an_ls", storage=journal_storage(out))
    assert loss == "an_ls" and train == {}
    assert hparams == {"eps": study_best.best_params["an_ls.eps"]}
    import polars as pl

    frame = pl.read_parquet(out / "confirm.parquet")
    assert frame.height == 2 and all(len(x) == 4 for x in frame["test_maps"])
    # the t interval of the mean over the 4 runs (seeds x draws) brackets the mean
    from probe.evaluation.intervals import mean_interval

    for row in frame.iter_rows(named=True):
        iv = mean_interval(row["test_maps"])
        assert row["test_low"] == pytest.approx(iv.low)
        assert row["test_high"] == pytest.approx(iv.high)
        assert row["test_low"] <= row["test_mean"] <= row["test_high"]
    assert "95% interval" in printed
    from probe.store import open_store

    assert 7 in open_store(yeast).observed_seeds()  # the extra draw was added to the store
    with pytest.raises(StudyError, match="no study 'nope'"):
        from studies.results.confirm import load_study

        load_study(str(out / "study.log"), "nope")


def test_interrupted_batch_fails_fast_and_resumes(yeast, tmp_path, monkeypatch):
    """Ctrl-C mid-batch: the batch's trials are failed at once (not left RUNNING), re-enqueued,
    and the next run of the same command finishes the study with nothing lost."""
    import probe.engine.train

    settings = StudySettings(store=yeast, loss="an_ls", n_trials=4, batch=2, out=str(tmp_path),
                             epochs=2, batch_size=32, lr=0.01, pruner="none")
    real = probe.engine.train.train_probe
    calls = {"n": 0}

    def interrupt_second_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(probe.engine.train, "train_probe", interrupt_second_batch)
    with pytest.raises(KeyboardInterrupt):
        run_study(settings)
    storage = journal_storage(tmp_path)
    study = optuna.load_study(study_name="yeast-an_ls", storage=storage)
    assert not study.get_trials(states=(TrialState.RUNNING,))
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert len(failed) == 2
    assert all(t.system_attrs["spml:fail_reason"] == "interrupted (Ctrl-C)" for t in failed)
    assert len(read_results(tmp_path / "results")) == 2  # the first batch's results are kept
    monkeypatch.setattr(probe.engine.train, "train_probe", real)
    summary = run_study(settings)
    assert summary.n_complete == 4
    study = optuna.load_study(study_name="yeast-an_ls", storage=storage)
    retried = {t.user_attrs.get("spml:retry_of") for t in study.trials} - {None}
    assert retried == {t.number for t in failed}
    _finished_ok(storage, "yeast-an_ls", 4, tmp_path)


def _study_cmd(yeast, out, loss="an_ls", trials="3", *extra):
    return ["study", yeast, "--loss", loss, "--trials", trials, "--trials-at-once", "3",
            "--out", str(out), *FAST, *extra]


def test_resuming_with_other_settings_is_refused_and_rows_carry_them(yeast, tmp_path, capsys):
    """A study's fixed training settings are part of its identity."""
    out = tmp_path / "gr"
    assert main(_study_cmd(yeast, out)) == 0
    # another --lr (and batch size): exit 2, one line per setting with both values
    argv = _study_cmd(yeast, out, "an_ls", "6")
    argv[argv.index("--lr") + 1] = "0.001"
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "lr: the study has 0.01, this command gives 0.001" in err
    assert "batch_size" not in err and "--out" in err and "Traceback" not in err
    assert len(read_results(out / "results")) == 3  # nothing was added
    # identical settings still add trials
    assert main(_study_cmd(yeast, out, "an_ls", "6")) == 0
    frame = read_results(out / "results")
    assert frame.height >= 6
    assert set(frame["lr"]) == {0.01} and set(frame["batch_size"]) == {32}
    assert set(frame["epochs"]) == {3}
    assert frame["best_epoch"].min() >= 1 and frame["best_epoch"].max() <= 3
    study = optuna.load_study(study_name="yeast-an_ls", storage=journal_storage(out))
    assert study.user_attrs["spml.training"]["lr"] == 0.01
    # Optuna's steps are epochs too, counted from 1
    assert all(min(t.intermediate_values) == 1 for t in study.trials if t.intermediate_values)


def test_study_progress_in_a_log_is_plain_lines(yeast, tmp_path):
    """Stderr not a terminal: a first line at once, k/N lines, never a \\r."""
    log = tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    env.pop("SPML_PROGRESS", None)
    with open(log, "w") as fh:
        code = subprocess.call([sys.executable, "-m", "studies.cli",
                                *_study_cmd(yeast, tmp_path / "s", "an_ls", "4")],
                               stderr=fh, stdout=subprocess.DEVNULL, env=env)
    assert code == 0
    text = log.read_text()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0] == "study yeast-an_ls: starting (4 trials)"  # before the features load
    assert lines[1].startswith("loading the features of ")
    counts = [line for line in lines if "/4 trials" in line]
    assert counts[-1].startswith("study yeast-an_ls: 4/4 trials (100%)")
    assert "best val mAP" in counts[-1] and "pruned" in counts[-1]
    assert any(line.startswith("trial 0: complete") for line in lines)


def test_study_progress_says_where_its_batch_stands(yeast, tmp_path):
    """A batch that trains for minutes is followed epoch by epoch: with a line at every
    refresh (SPML_PROGRESS_INTERVAL=0) each epoch of the batch shows in the log."""
    log = tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]),
           "SPML_PROGRESS": "lines", "SPML_PROGRESS_INTERVAL": "0"}
    with open(log, "w") as fh:
        code = subprocess.call([sys.executable, "-m", "studies.cli",
                                *_study_cmd(yeast, tmp_path / "s", "an_ls", "4")],
                               stderr=fh, stdout=subprocess.DEVNULL, env=env)
    assert code == 0
    text = log.read_text()
    epochs = re.findall(r"batch of (\d+): epoch (\d+)/(\d+)", text)
    assert epochs and {int(e) for _, e, _ in epochs} == set(range(1, int(epochs[0][2]) + 1))
    assert "\r" not in text


def test_confirm_refuses_a_missing_storage_and_writes_beside_the_study(yeast, tmp_path, capsys):
    """A mistyped storage is not created; confirm's default output is where
    'spml report STUDY_DIR' reads it."""
    missing = tmp_path / "missing.db"
    assert main(["study", "confirm", "--storage", str(missing), "--store", yeast]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spml study confirm: error: --storage ") and str(missing) in err
    assert not missing.exists()
    out = tmp_path / "s"
    assert main(_study_cmd(yeast, out)) == 0
    capsys.readouterr()
    typo = out / "studyy.log"
    assert main(["study", "confirm", "--storage", str(typo), "--store", yeast]) == 2
    assert "holds study.log" in capsys.readouterr().err and not typo.exists()
    assert main(["report", str(out), "--storage", str(typo), "--no-baseline"]) == 2
    assert not typo.exists()
    # no --out: beside the study
    assert main(["study", "confirm", "--storage", str(out / "study.log"), "--store", yeast,
                 "--top-k", "1", "--seeds", "0"]) == 0
    assert (out / "confirm.parquet").is_file() and (out / "best.json").is_file()
    import polars as pl

    conf = pl.read_parquet(out / "confirm.parquet").row(0, named=True)
    assert (conf["lr"], conf["batch_size"], conf["epochs"]) == (0.01, 32, 3)
    # confirm re-trains each trial with what its results row records it trained with
    frame = read_results(out / "results").with_columns(pl.lit(0.05).alias("lr"))
    for f in (out / "results").glob("batch-*.parquet"):
        f.unlink()
    write_batch(out / "results", frame.to_dicts())
    assert main(["study", "confirm", "--storage", str(out / "study.log"), "--store", yeast,
                 "--top-k", "1", "--seeds", "0"]) == 0
    assert pl.read_parquet(out / "confirm.parquet")["lr"].to_list() == [0.05]
    assert not Path("spml-study").exists() or Path("spml-study").stat().st_mtime < time.time() - 60
    assert json.loads((out / "best.json").read_text())["spml_version"]


def test_export_two_studies_of_different_losses(yeast, tmp_path, capsys):
    """spml export STUDY_GR STUDY_AN --out all.csv, one row per trial."""

    gr, an = tmp_path / "gr", tmp_path / "an"
    old = os.umask(0o022)
    try:
        _export_two(yeast, tmp_path, gr, an)
    finally:
        os.umask(old)


def _export_two(yeast, tmp_path, gr, an):
    import polars as pl

    assert main(_study_cmd(yeast, gr, "gr", "3")) == 0
    assert main(_study_cmd(yeast, an, "an_ls", "3")) == 0
    n = len(read_results(gr / "results")) + len(read_results(an / "results"))
    for suffix in ("csv", "parquet"):
        path = tmp_path / f"all.{suffix}"
        assert main(["export", str(gr), str(an), "--out", str(path)]) == 0
        frame = pl.read_csv(path) if suffix == "csv" else pl.read_parquet(path)
        assert frame.height == n and set(frame["loss"]) == {"gr", "an_ls"}
        assert frame["lr"].null_count() == 0 and frame["batch_size"].null_count() == 0
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # the umask's mode, not 0600
    for f in (gr / "results").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o644
