"""Where a study lives: a journal file (the default, and the fastest: one or several processes
on one machine or a shared file system), an SQLite file (one process) or a PostgreSQL server
(workers on many machines). :func:`open_storage` drops a journal's torn last line that a failed
write (a full disk) left behind, so the next command can append again; the lock, the ask lock,
and the one rule that ranks a study's trials (:func:`ranked_trials`) are here too.
"""

from __future__ import annotations

import mmap
import os
import socket
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import optuna

from probe.errors import MissingPathError, SpmlError

__all__ = ["PAPER_ATTR", "StorageSpec", "StudyError", "ask_lock", "best_trial", "find_storage",
           "is_paper_trial", "open_existing_storage", "open_storage", "parse_storage",
           "ranked_trials", "reference_kind", "reference_label"]

# PostgreSQL advisory-lock key under which workers create Optuna's tables one at a time
_PG_SCHEMA_LOCK = 0x5350_4D4C  # "SPML"
_PG_ENGINES: dict[str, Any] = {}

SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
JOURNAL_SUFFIXES = (".log", ".journal", ".jsonl")
_FORMS = ("an SQLite file (study.db or sqlite:///study.db), a journal file (study.log or "
          "journal:study.log) or a PostgreSQL URL (postgresql://user@host:5432/db)")


class StudyError(SpmlError):
    """A study cannot be created, joined or run as asked; the message says why and what to do."""


@dataclass(frozen=True)
class StorageSpec:
    kind: str  # "sqlite" | "journal" | "postgresql"
    target: str  # file path, or the SQLAlchemy URL for PostgreSQL
    display: str  # what to print (password removed)


def parse_storage(spec: str | os.PathLike | None, default: Path | None = None) -> StorageSpec:
    """Classify a ``--storage`` value; raises :class:`StudyError` for unknown schemes."""
    if spec is None:
        if default is None:
            raise StudyError("no storage given: pass --storage " + _FORMS)
        spec = str(default)
    text = str(spec)
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if scheme == "sqlite":
            path = text.split("://", 1)[1].removeprefix("/")
            return StorageSpec("sqlite", path, f"sqlite:///{path}")
        if scheme in ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2"):
            url = "postgresql+psycopg://" + text.split("://", 1)[1]
            parts = urlsplit(url)
            shown = text if parts.password is None else text.replace(parts.password, "***")
            return StorageSpec("postgresql", url, shown)
        raise StudyError(
            f"--storage: unknown storage scheme '{scheme}://' in {text!r}; expected " + _FORMS
        )
    if text.startswith("journal:"):
        return StorageSpec("journal", text[len("journal:") :], text)
    suffix = Path(text).suffix.lower()
    if suffix in SQLITE_SUFFIXES:
        return StorageSpec("sqlite", text, text)
    if suffix in JOURNAL_SUFFIXES:
        return StorageSpec("journal", text, text)
    raise StudyError(
        f"--storage: cannot tell the kind of storage from {text!r} (suffix {suffix or 'none'}); "
        "expected " + _FORMS
    )


def _check_postgres_reachable(url: str, timeout: float = 5.0) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "localhost", parts.port or 5432
    try:
        import psycopg  # noqa: F401  (the driver SQLAlchemy will use)
    except ImportError:
        raise StudyError(
            "--storage: a PostgreSQL URL needs the psycopg driver: pip install "
            "'spml-probe[postgres]'"
        ) from None
    if host.startswith("/"):
        return  # a Unix socket directory; SQLAlchemy reports problems itself
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as err:
        raise StudyError(
            f"--storage: cannot reach the PostgreSQL server at {host}:{port} "
            f"({err.strerror or err}); is it running and does it accept TCP connections there?"
        ) from None


def open_existing_storage(storage: str | os.PathLike, flag: str = "--storage"
                          ) -> tuple[StorageSpec, optuna.storages.BaseStorage]:
    """Open the storage of a study that must exist already (what confirm, report and fine-tune
    read): a file storage that is not there is refused, naming ``flag``, and never created."""
    spec = parse_storage(storage)
    if spec.kind != "postgresql":
        path = Path(spec.target).expanduser()
        if not path.is_file():
            near = (sorted(p.name for p in path.parent.iterdir()
                           if p.suffix.lower() in SQLITE_SUFFIXES + JOURNAL_SUFFIXES)
                    if path.parent.is_dir() else [])
            hint = f" ({path.parent} holds {', '.join(near)})" if near else ""
            raise MissingPathError(
                f"{flag} {storage}: no such file{hint}; pass the storage 'spml study' wrote "
                "(STUDY_DIR/study.log by default, or study.db)"
            )
    return spec, open_storage(spec)


def open_storage(spec: StorageSpec) -> optuna.storages.BaseStorage:
    """Open (creating if needed) the Optuna storage a :class:`StorageSpec` names; for a study
    that must already exist use :func:`open_existing_storage`."""
    if spec.kind == "sqlite":
        Path(spec.target).expanduser().parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.RDBStorage(f"sqlite:///{Path(spec.target).expanduser()}",
                                          engine_kwargs={"connect_args": {"timeout": 60}})
    if spec.kind == "journal":
        from optuna.storages.journal import JournalFileBackend

        path = Path(spec.target).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(f"{path}.flock")
        drop_torn_tail(path, lock)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path), lock_obj=lock))
    _check_postgres_reachable(spec.target)
    try:
        # Optuna creates its tables (and the version row) on first use; several workers doing
        # that at once on an empty database collide (duplicate pg_type / version rows), so
        # they take turns under an advisory lock -- the first creates, the others find them
        with _pg_advisory_lock(spec.target, _PG_SCHEMA_LOCK):
            return optuna.storages.RDBStorage(
                spec.target,
                engine_kwargs={"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}},
            )
    except Exception as err:  # SQLAlchemy's OperationalError: bad credentials, missing database
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise StudyError(f"--storage: cannot open {spec.display}: {first}") from None


def drop_torn_tail(path: Path, lock: Any) -> int:
    """Cut a journal's last line if it lacks its newline: the remains of an append that failed
    part-way (a full disk); left in place, the next append would be glued to it and the journal
    would no longer load. Done under the journal's own lock; returns the bytes removed."""
    if not path.is_file() or path.stat().st_size == 0:
        return 0
    with lock, open(path, "r+b") as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            size = len(m)
            if m[-1:] == b"\n":
                return 0
            keep = m.rfind(b"\n") + 1  # after the last complete line (0: none is)
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return size - keep


@contextmanager
def _pg_advisory_lock(url: str, key: int) -> Iterator[None]:
    """Hold PostgreSQL advisory lock ``key`` (released by the server if this process dies)."""
    import sqlalchemy

    engine = _PG_ENGINES.get(url)
    if engine is None:
        engine = _PG_ENGINES[url] = sqlalchemy.create_engine(
            url, poolclass=sqlalchemy.pool.NullPool, connect_args={"connect_timeout": 10})
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
        try:
            yield
        finally:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.commit()


class FileLock:
    """An exclusive ``flock`` on a lock file that stays in place: the journal's lock (Optuna's
    ``BaseJournalFileLock`` interface) and the ask lock. The kernel frees it when its holder
    dies (Optuna's own lock files are broken by waiters after a grace period, and two waiters
    could then each break a lock a third had just taken). Every ``acquire`` opens its own
    descriptor, so threads of one process exclude each other too; on NFS Linux maps ``flock``
    to POSIX locks."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None  # set by the holder only, after the lock is taken

    def acquire(self) -> bool:
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        import fcntl

        fd, self._fd = self._fd, None
        if fd is None:
            raise RuntimeError(f"{self.path}: released without being held")
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextmanager
def ask_lock(spec: StorageSpec, study_name: str) -> Iterator[None]:
    """Let one worker at a time count a study's trials and ask its next batch, so that workers
    started together never ask more than ``n_trials`` between them (Optuna has no atomic
    "ask while under budget"). Journal: a :class:`FileLock` beside the journal (freed by the
    kernel when its holder dies). PostgreSQL: an advisory lock per study (freed by the server
    when its holder dies). SQLite: one process, no lock."""
    if spec.kind == "journal":
        with FileLock(f"{Path(spec.target).expanduser()}.ask.flock"):
            yield
    elif spec.kind == "postgresql":
        with _pg_advisory_lock(spec.target, zlib.crc32(study_name.encode())):
            yield
    else:
        yield


def find_storage(study_dir: str | os.PathLike) -> str:
    """The storage ``spml study --out STUDY_DIR`` wrote: ``study.log`` (the journal) or
    ``study.db`` (SQLite). Raises FileNotFoundError naming the folder when it holds neither."""
    d = Path(study_dir)
    if not d.is_dir():
        raise MissingPathError(
            f"STUDY_DIR {d} is not a folder; pass the folder given to 'spml study --out'"
        )
    found = [d / n for n in ("study.db", "study.log") if (d / n).is_file()]
    if not found:
        raise MissingPathError(
            f"STUDY_DIR {d} holds no study: expected study.log (the journal 'spml study --out' "
            "writes by default) or study.db (SQLite); for another storage (e.g. PostgreSQL) "
            "pass --storage"
        )
    if len(found) > 1:
        raise StudyError(f"STUDY_DIR {d} holds both study.db and study.log; say which with "
                         "--storage")
    return str(found[0])


# ----------------------------------------------------------------------------- a study's trials

#: the user attribute that marks the trial enqueued with the paper's (or the loss's default) values
PAPER_ATTR = "spml:paper"


def reference_kind(loss: str | None, dataset: str | None) -> tuple[str, str | None]:
    """What a study's first trial is, in one word, and why where it is not a paper's:
    ``("paper values", None)`` where the loss's paper gives values for the dataset (or one
    setting for all), else ``("defaults", why)`` -- the loss's defaults (data-derived values
    filled as ``spml probe`` fills them), or a plugin's defaults. The one decision behind
    "paper" and "defaults" in the study, report, compare, confirm and table."""
    try:
        from probe.engine.results import loss_package
        from probe.losses import get_loss_class

        presets = get_loss_class(loss).presets
    except Exception:  # a loss gone since: say nothing rather than guess
        return "paper values", None
    package = (loss_package(loss) or {}).get("name")
    if package not in (None, "spml-probe"):  # a plugin: its defaults are its author's
        return "defaults", (f"{loss} is a plugin loss (from {package}): spml-probe knows no "
                            "paper values for it, so the first trial ran its defaults; the "
                            "comparison is with those defaults, not with a paper")
    if not presets or presets.get(dataset):  # one paper setting for all, or this dataset's
        return "paper values", None
    return "defaults", (f"{loss} has no paper values for dataset '{dataset}' (its presets: "
                        f"{', '.join(sorted(presets))}), so the first trial ran its defaults, "
                        "data-derived values filled as 'spml probe' fills them; the comparison "
                        "is with those defaults, not with a paper")


def reference_label(study: Any) -> str:
    """The short word for a study's first trial in labels and tables: "paper" or "defaults"
    (:func:`reference_kind`, from the loss and the dataset the study recorded)."""
    loss = study.user_attrs.get("spml.loss")
    dataset = (study.user_attrs.get("spml.store") or {}).get("dataset")
    kind, _ = reference_kind(loss, dataset)
    return "paper" if kind == "paper values" else "defaults"


def is_paper_trial(trial: Any) -> bool:
    """Whether ``trial`` is the one enqueued with the paper's values (:data:`PAPER_ATTR`)."""
    return bool(trial.user_attrs.get(PAPER_ATTR))


_T = TypeVar("_T")  # an Optuna FrozenTrial or anything with its value and number


def _best_first(trial: Any) -> tuple[float, int]:
    # the one rule by which every command ranks a study's trials
    return -trial.value, trial.number


def ranked_trials(trials: Iterable[_T]) -> list[_T]:
    """``trials`` (each with a value) best first: the highest value, and among equal values the
    lowest trial number."""
    return sorted(trials, key=_best_first)


def best_trial(trials: Iterable[_T]) -> _T | None:
    """The first of :func:`ranked_trials` (``trials`` each with a value); None when empty."""
    return min(trials, key=_best_first, default=None)
