"""Search spaces derived from the losses' declared ranges, and storage parsing/opening."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution

from studies.study.space import build_space, parse_range
from studies.study.storage import FileLock, StudyError, open_storage, parse_storage


def test_space_comes_from_declared_ranges_with_paper_defaults():
    space = build_space("an_ls", search_lr=True, batch_sizes=(8, 16))
    assert set(space.distributions) == {"an_ls.eps", "train.lr", "train.batch_size"}
    eps = space.distributions["an_ls.eps"]
    assert isinstance(eps, FloatDistribution) and (eps.low, eps.high) == (0.01, 0.4)
    assert space.defaults["an_ls.eps"] == 0.1  # the signature default is enqueued first
    assert space.split({"an_ls.eps": 0.2, "train.lr": 1e-3}) == ({"eps": 0.2}, {"lr": 1e-3})


def test_space_uses_dataset_preset_and_overrides():
    space = build_space("epr", "coco", overrides=dict([parse_range("k=1:4")]))
    assert space.defaults["epr.k"] == 2.9
    assert space.distributions["epr.k"] == FloatDistribution(1.0, 4.0)
    name, dist = parse_range("train.batch_size=8,16")
    assert name == "train.batch_size" and dist == CategoricalDistribution((8, 16))


@pytest.mark.parametrize(
    "text, message",
    [
        ("k=4:1", "empty or inverted"),
        ("k=0:1:log", "log scale needs low > 0"),
        ("k", "expected NAME=LOW:HIGH"),
        ("k=a:b", "must be numbers"),
    ],
)
def test_bad_space_is_named(text, message):
    with pytest.raises(StudyError, match=message):
        build_space("epr", overrides=dict([parse_range(text)]))


def test_empty_space_and_unknown_params_refused():
    with pytest.raises(StudyError, match="search space for an is empty"):
        build_space("an")
    with pytest.raises(StudyError, match="not a hyperparameter of epr"):
        build_space("epr", overrides={"epr.kk": FloatDistribution(0, 1)})


def test_storage_kinds(tmp_path):
    assert parse_storage(tmp_path / "s.db").kind == "sqlite"
    assert parse_storage(f"sqlite:///{tmp_path}/s.db").kind == "sqlite"
    assert parse_storage(tmp_path / "s.log").kind == "journal"
    assert parse_storage("journal:/x/y").target == "/x/y"
    pg = parse_storage("postgresql://u:secret@h:5/db")
    assert pg.kind == "postgresql" and "secret" not in pg.display
    assert pg.target.startswith("postgresql+psycopg://")
    for spec in ("redis://h", tmp_path / "s.txt"):
        with pytest.raises(StudyError, match="--storage"):
            parse_storage(spec)


def test_journal_and_sqlite_open(tmp_path):
    import optuna

    for name in ("a.db", "b.log"):
        storage = open_storage(parse_storage(tmp_path / "sub" / name))
        study = optuna.create_study(storage=storage, study_name="s")
        study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
        assert len(study.trials) == 2


def test_a_torn_journal_line_is_dropped_and_the_study_goes_on(tmp_path):
    """A write that failed part-way (a full disk) leaves a journal line without its newline;
    the next open cuts it, so the study loads and takes appends again."""
    import optuna

    path = tmp_path / "study.log"
    study = optuna.create_study(storage=open_storage(parse_storage(path)), study_name="s")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    whole = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"op_code": 5, "worker_id": "x", "trial_id": 0, "par')  # the torn remains
    study = optuna.load_study(storage=open_storage(parse_storage(path)), study_name="s")
    assert path.read_bytes() == whole and len(study.trials) == 2
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    again = optuna.load_study(storage=open_storage(parse_storage(path)), study_name="s")
    assert len(again.trials) == 3 and not (tmp_path / "study.log.lock").exists()


def test_a_study_keeps_its_old_sqlite_file(tmp_path):
    """The default storage is OUT/study.log; a study an older spml wrote to OUT/study.db is
    continued there, and an explicit --storage always wins."""
    from studies.study.settings import StudySettings

    settings = StudySettings(store="x.zarr", loss="gr", out=str(tmp_path))
    assert settings.storage_spec() == parse_storage(tmp_path / "study.log")
    (tmp_path / "study.db").write_bytes(b"")
    assert settings.storage_spec() == parse_storage(tmp_path / "study.db")
    given = StudySettings(store="x.zarr", loss="gr", out=str(tmp_path),
                          storage=str(tmp_path / "other.log"))
    assert given.storage_spec().target == str(tmp_path / "other.log")
    several = StudySettings(store="x.zarr", loss="gr", out=str(tmp_path), workers=2)
    assert several.storage_spec().kind == "journal"


def test_unreachable_postgres_is_one_clear_line():
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StudyError, match=f"cannot reach the PostgreSQL server at 127.0.0.1:{port}"):
        open_storage(parse_storage(f"postgresql://u@127.0.0.1:{port}/db"))


def test_option_parameters_are_searched_only_when_their_switch_is_on():
    plain = build_space("opml")
    assert set(plain.distributions) == {"opml.alpha", "opml.beta"}
    with_hr = build_space("opml", fixed={"high_rank": True})
    assert set(with_hr.distributions) == {"opml.alpha", "opml.beta", "opml.hr_lambda"}
    with pytest.raises(StudyError, match="only matters with soft=true"):
        build_space("opml", only=("soft_power",))


def test_a_killed_workers_file_lock_is_freed_at_once(tmp_path):
    """The journal's and the ask lock (studies.study.storage.FileLock) are flocks: held against
    another process while their holder lives, free the moment it is SIGKILLed -- no grace
    period for waiters to break it (Optuna's lock files raced there)."""
    path = str(tmp_path / "study.log.flock")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from studies.study.storage import FileLock; "
         f"FileLock({path!r}).acquire(); print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout.readline().strip() == "held"  # waits for the event, not a time
        fd = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            holder.send_signal(signal.SIGKILL)
            holder.wait()
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free now
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    finally:
        holder.kill()
        holder.wait()
    lock = FileLock(path)
    assert lock.acquire()
    lock.release()
    with pytest.raises(RuntimeError, match="released without being held"):
        lock.release()
