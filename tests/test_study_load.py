"""Studies under load and bad input: search spaces checked against each
hyperparameter's valid range before anything is created; many workers started at the same
instant on one journal file and on one fresh PostgreSQL database; a worker SIGKILLed mid-batch."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from pgserver import find_pg_bin, postgres_server

from studies.cli import main
from studies.results.rows import read_results
from studies.study.heartbeat import HEARTBEAT_KEY, WORKER_KEY
from studies.study.space import build_space, parse_range
from studies.study.storage import StudyError, open_storage, parse_storage

FAST = ["--epochs", "2", "--batch-size", "64", "--lr", "0.01"]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("sigma_T=-1:1", "--space gr.sigma_T: the search range [-1, 1] is not inside gr.sigma_T's "
                         "valid range (0, inf) (-1.0 is not valid)"),
        ("train.lr=0:0.1", "train.lr: the search range [0, 0.1] is not inside train.lr's valid "
                           "range (0, inf)"),
        ("train.batch_size=0,16", "train.batch_size: the search range {0, 16} is not inside "
                                  "train.batch_size's valid range [1, inf)"),
        ("train.epochs=1:5", "[1, 5] is a continuous range but train.epochs takes integers"),
        ("q2=-1,0.5", "gr.q2: the search range {-1, 0.5} is not inside gr.q2's valid range"),
    ],
)
def test_space_outside_valid_range_is_refused(spec: str, says: str) -> None:
    name, dist = parse_range(spec)
    with pytest.raises(StudyError) as err:
        build_space("gr", "yeast", overrides={name: dist})
    assert says in str(err.value)


def test_space_inside_valid_range_is_accepted() -> None:
    space = build_space("gr", "yeast", overrides=dict(
        parse_range(s) for s in ("sigma_T=0.1:1", "train.lr=1e-4:1e-2:log", "train.epochs=2,4")))
    assert {"gr.sigma_T", "train.lr", "train.epochs"} <= set(space.distributions)


def test_bad_space_creates_and_saves_nothing(yeast_store, tmp_path, capsys) -> None:
    journal, out = tmp_path / "j.log", tmp_path / "out"
    code = main(["study", yeast_store, "--loss", "gr", "--space", "sigma_T=-1:1", "--storage",
                 str(journal), "--out", str(out), *FAST])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gr.sigma_T" in err and "[-1, 1]" in err and "(0, inf)" in err
    assert not journal.exists() and not out.exists()


# ----------------------------------------------------------------------------- many workers

N_WORKERS, N_TRIALS, BATCH = 8, 64, 8


def _worker(barrier, settings: dict) -> None:
    """One study worker (a spawned process): import everything, wait for all the others at the
    barrier, then create-or-join the study on the empty storage at the same instant."""
    import torch

    torch.set_num_threads(1)
    from studies.study.settings import StudySettings
    from studies.study.worker import run_worker

    config = StudySettings(**settings)
    barrier.wait(timeout=600)
    run_worker(config, log=lambda msg: None)


def _run_workers(
    tmp_path: Path, store: str, storage: str, kill_one: bool
) -> tuple[list[int], int | None]:
    """8 workers released by one barrier; with ``kill_one`` the first worker seen with trials
    RUNNING is SIGKILLed. Returns the exit codes (the killed worker's first) and its pid."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(N_WORKERS)
    settings = dict(store=store, loss="an_ls", n_trials=N_TRIALS, batch=BATCH,
                    storage=storage, out=str(tmp_path / "out"), epochs=3, batch_size=64,
                    lr=0.01, device="cpu", heartbeat_seconds=0.5,
                    # long enough that a live worker on a loaded 2-core machine is never
                    # taken for dead; short enough that the killed one's trials are retried soon
                    grace_seconds=20.0 if kill_one else 120.0)
    procs = [ctx.Process(target=_worker, args=(barrier, settings)) for _ in range(N_WORKERS)]
    for p in procs:
        p.start()
    victim = None
    if kill_one:
        by_pid = {p.pid: p for p in procs}
        storage_obj = open_storage(parse_storage(storage))
        deadline = time.time() + 600
        while victim is None and time.time() < deadline:  # wait on the storage, not on time
            try:
                study = optuna.load_study(study_name="yeast-an_ls", storage=storage_obj)
            except KeyError:  # not created yet
                time.sleep(0.2)
                continue
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                pid = int(t.system_attrs.get(WORKER_KEY, ":0").rsplit(":", 1)[1])
                if pid in by_pid and HEARTBEAT_KEY in t.system_attrs:  # first seen training
                    victim = by_pid[pid]
                    os.kill(pid, signal.SIGKILL)
                    break
            else:
                time.sleep(0.05)
        assert victim is not None, "no worker was ever seen with a RUNNING trial"
    for p in procs:
        p.join(timeout=900)
    codes = [p.exitcode for p in procs]
    if victim is not None:  # the killed worker first
        i = procs.index(victim)
        codes = [codes[i], *codes[:i], *codes[i + 1 :]]
    return codes, (victim.pid if victim is not None else None)


def _check_final_table(storage: str, out: Path, killed_pid: int | None) -> None:
    storage_obj = open_storage(parse_storage(storage))
    study = optuna.load_study(study_name="yeast-an_ls", storage=storage_obj)
    trials = study.get_trials(deepcopy=False)
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)) and sorted(numbers) == list(range(len(numbers)))
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == N_TRIALS, [t.state.name for t in trials]
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    assert sum(bool(t.user_attrs.get("spml:paper")) for t in finished) == 1  # (or its retry)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    if killed_pid is None:
        assert failed == []
    else:
        assert failed, "the killed worker had RUNNING trials"
        for t in failed:  # only the killed worker's trials failed, each retried exactly once
            assert t.system_attrs[WORKER_KEY].endswith(f":{killed_pid}")
            assert t.system_attrs.get("spml:fail_reason") == "heartbeat lost"
            retries = [r for r in trials if r.user_attrs.get("spml:retry_of") == t.number]
            assert len(retries) == 1 and retries[0].params == t.params
            assert retries[0].state in (TrialState.COMPLETE, TrialState.PRUNED)
    frame = read_results(out / "results")
    in_table = frame["trial"].to_list()
    assert len(in_table) == len(set(in_table)), "a trial is twice in the results table"
    assert set(in_table) >= {t.number for t in finished}


@pytest.mark.slow
@pytest.mark.parametrize("kill_one", [False, True], ids=["all-live", "one-killed"])
@pytest.mark.parametrize("kind", ["journal", "postgresql"])
def test_eight_workers_at_once(yeast_store, tmp_path, kind: str, kill_one: bool) -> None:
    if kind == "journal":
        storage = str(tmp_path / "study.log")
        codes, killed = _run_workers(tmp_path, yeast_store, storage, kill_one)
        _check(codes, killed)
        _check_final_table(storage, tmp_path / "out", killed)
        return
    if find_pg_bin() is None:
        pytest.skip("PostgreSQL server binaries are not installed (Debian package 'postgresql')")
    with postgres_server() as url:
        codes, killed = _run_workers(tmp_path, yeast_store, url, kill_one)
        _check(codes, killed)
        _check_final_table(url, tmp_path / "out", killed)


def _check(codes: list[int], killed: int | None) -> None:
    if killed is None:
        assert codes == [0] * N_WORKERS
    else:
        assert codes[0] == -signal.SIGKILL and codes[1:] == [0] * (N_WORKERS - 1)



# ----------------------------------------------------------------------------- write failures


@pytest.mark.slow
def test_study_under_a_file_size_limit_fails_clearly_then_continues(yeast_store, tmp_path):
    """The SQLite file outgrows RLIMIT_FSIZE mid-study (as on a full disk): one line naming the
    storage and the results folder, exit 2; the same command afterwards finishes the study with
    every trial counted once, and no results row twice."""
    import resource
    import subprocess
    import sys

    out, db = tmp_path / "out", tmp_path / "out" / "s.db"
    argv = [sys.executable, "-m", "studies.cli", "study", yeast_store, "--loss", "an_ls",
            "--trials", "32", "--trials-at-once", "4", "--storage", str(db), "--out", str(out),
            *FAST,
            # a trial left RUNNING when the write failed is retried after 3 s, not 120
            "--heartbeat", "0.5", "--grace", "3"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "SPML_PROGRESS": "off"}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (120_000, 120_000))

    failed = subprocess.run(argv, capture_output=True, text=True, env=env, preexec_fn=limit,
                            timeout=600)
    assert failed.returncode == 2, failed.stderr[-2000:]
    last = failed.stderr.strip().splitlines()[-1]
    assert f"cannot write to the study storage {db} or its results folder" in last
    assert "re-run the same command" in last and "Traceback" not in failed.stderr
    storage = open_storage(parse_storage(str(db)))
    before = optuna.load_study(study_name="yeast-an_ls", storage=storage).get_trials()
    done_before = [t for t in before if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert 0 < len(done_before) < 32  # it stopped mid-study, with what it had recorded intact
    again = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    trials = optuna.load_study(study_name="yeast-an_ls", storage=storage).get_trials()
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 32 and not [t for t in trials if t.state == TrialState.RUNNING]
    rows = read_results(out / "results")["trial"].to_list()
    assert len(rows) == len(set(rows)) and set(rows) <= {t.number for t in trials}
