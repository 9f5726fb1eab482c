"""Optuna studies on the real yeast store: SQLite, journal + 2 worker processes, a real
PostgreSQL server + 2 workers, a worker killed mid-trial, Parquet results vs the storage, and
the errors users hit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from studies.cli import main
from studies.results import read_results
from studies.storage import StudyError
from studies.study import StudySettings, run_study

pytest.importorskip("river", reason="the yeast set ships inside river (extra 'yeast')")

sys.path.insert(0, str(Path(__file__).parent))
from pgserver import find_pg_bin, postgres_server

# small and fast: 3 epochs of bs 32 on 1,547 yeast rows, a learning rate that moves the head
FAST = ["--epochs", "3", "--batch-size", "32", "--lr", "0.01"]


@pytest.fixture(scope="module")
def yeast(yeast_store) -> str:
    return yeast_store


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
            "--batch",
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
    _finished_ok(f"sqlite:///{out}/study.db", "yeast-an_ls", 6, out)

    out = tmp_path / "journal"
    code = main(
        [
            "study",
            yeast,
            "--loss",
            "em",
            "--trials",
            "8",
            "--batch",
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
    from studies.storage import open_storage, parse_storage

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
                "--batch",
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
        from studies.storage import open_storage, parse_storage

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
        "--batch",
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
    from studies.storage import open_storage, parse_storage
    from studies.study import create_or_join

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
                "--batch",
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
    assert sorted(frame["param.an_ls.eps"].to_list()) == [0.05, 0.2, 0.35]


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
                "--batch",
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
                str(out / "study.db"),
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
    study_best = optuna.load_study(study_name="yeast-an_ls", storage=f"sqlite:///{out}/study.db")
    assert loss == "an_ls" and train == {}
    assert hparams == {"eps": study_best.best_params["an_ls.eps"]}
    import polars as pl

    frame = pl.read_parquet(out / "confirm.parquet")
    assert frame.height == 2 and all(len(x) == 4 for x in frame["test_maps"])
    # the t interval of the mean over the 4 runs (seeds x draws) brackets the mean
    from probe.intervals import mean_interval

    for row in frame.iter_rows(named=True):
        iv = mean_interval(row["test_maps"])
        assert row["test_low"] == pytest.approx(iv.low) and row["test_high"] == pytest.approx(iv.high)
        assert row["test_low"] <= row["test_mean"] <= row["test_high"]
    assert "95% interval" in printed
    from probe.store import open_store

    assert 7 in open_store(yeast).observed_seeds()  # the extra draw was added to the store
    with pytest.raises(StudyError, match="no study 'nope'"):
        from studies.confirm import load_study

        load_study(str(out / "study.db"), "nope")


def test_interrupted_batch_fails_fast_and_resumes(yeast, tmp_path, monkeypatch):
    """Ctrl-C mid-batch: the batch's trials are failed at once (not left RUNNING), re-enqueued,
    and the next run of the same command finishes the study with nothing lost."""
    import probe.train

    settings = StudySettings(store=yeast, loss="an_ls", n_trials=4, batch=2, out=str(tmp_path),
                             epochs=2, batch_size=32, lr=0.01, pruner="none")
    real = probe.train.train_probe
    calls = {"n": 0}

    def interrupt_second_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(probe.train, "train_probe", interrupt_second_batch)
    with pytest.raises(KeyboardInterrupt):
        run_study(settings)
    storage = f"sqlite:///{tmp_path}/study.db"
    study = optuna.load_study(study_name="yeast-an_ls", storage=storage)
    assert not study.get_trials(states=(TrialState.RUNNING,))
    failed = study.get_trials(states=(TrialState.FAIL,))
    assert len(failed) == 2
    assert all(t.system_attrs["spml:fail_reason"] == "interrupted (Ctrl-C)" for t in failed)
    assert len(read_results(tmp_path / "results")) == 2  # the first batch's results are kept
    monkeypatch.setattr(probe.train, "train_probe", real)
    summary = run_study(settings)
    assert summary.n_complete == 4
    study = optuna.load_study(study_name="yeast-an_ls", storage=storage)
    retried = {t.user_attrs.get("spml:retry_of") for t in study.trials} - {None}
    assert retried == {t.number for t in failed}
    _finished_ok(storage, "yeast-an_ls", 4, tmp_path)
