"""Optuna studies on the stacked probe engine: ask T trials, train them as one model, report
per-epoch val mAP so a pruner can stop bad trials early, tell T results.

One process runs :func:`run_worker`; ``--workers N`` starts N such processes on one machine
(journal file or PostgreSQL storage); the same command on many machines joins one PostgreSQL
study. Crash safety: :mod:`studies.study.heartbeat`. This module runs a study (:func:`run_study`);
its parts are :mod:`studies.study.settings` (settings and the checks before anything is
written), :mod:`studies.study.create` (creating or joining), :mod:`studies.study.worker` (the
worker loop) and :mod:`studies.study.summary` (the end-of-study summary).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import optuna

from probe.errors import SpmlError
from studies.study.create import WORKER_INDEX_ENV, JoinedStudy, create_or_join
from studies.study.settings import (
    SAMPLERS,
    StudySettings,
    check_writable,
    open_study_store,
    preflight,
    resolve_study_name,
)
from studies.study.storage import StudyError, open_storage
from studies.study.summary import StudySummary, grid_exhausted_lines, summarize, with_verdict
from studies.study.worker import run_worker

__all__ = ["SAMPLERS", "JoinedStudy", "StudySettings", "StudySummary", "create_or_join",
           "run_study", "run_worker"]


@contextlib.contextmanager
def _write_errors(settings: StudySettings) -> Iterator[None]:
    """A write that fails (disk full, file-size limit, I/O error) in the study's storage or its
    results folder as one StudyError naming both, instead of a driver's traceback. SQLite and
    PostgreSQL roll the failed transaction back and Parquet batches are written to a
    temporary file renamed into place, so what was written before stays intact."""
    try:
        yield
    except SpmlError:  # the user's input (a missing store is also a FileNotFoundError)
        raise
    except Exception as err:
        chain, e = [], err  # Optuna wraps the driver's error (StorageInternalError)
        while e is not None and len(chain) < 8:
            chain.append(e)
            e = e.__cause__ or e.__context__
        io = [e for e in chain if isinstance(e, OSError) or any(
            s in str(e).lower() for s in ("disk i/o error", "database or disk is full",
                                          "no space left", "file too large",
                                          "could not extend file"))]
        if not io:
            raise
        text = str(io[-1]).strip()
        first = text.splitlines()[0] if text else type(io[-1]).__name__
        raise StudyError(
            f"cannot write to the study storage {settings.storage_spec().display} or its results "
            f"folder {Path(settings.out) / 'results'}: {first}. What was written before is "
            "intact; free space (or raise the file-size limit) and re-run the same command: it "
            "continues the study"
        ) from err


def run_study(settings: StudySettings, *, worker_command: Sequence[str] | None = None,
              log: Callable[[str], None] | None = None, verdict: bool = True) -> StudySummary:
    """Run a study: in this process (``workers == 1``) or in ``workers`` local processes, each
    running ``worker_command`` (the same ``spml study`` command with ``--workers 1``); with
    ``devices``, worker ``i`` gets ``--devices devices[i]`` (one worker per GPU).

    Returns the :class:`StudySummary` that ``spml study`` prints: the counts, the val winner
    and, with ``verdict`` (a worker of several passes False), ``summary.verdict`` -- the
    winner's and the paper values' test mAP with 95% intervals and their paired difference
    (:class:`studies.study.verdict.Verdict`), scored from the heads the trials kept when they
    finished (nothing is re-trained that the study measured)."""
    settings.validate()
    store = open_study_store(settings.store)
    space = preflight(settings, store)  # every input checked before the storage is created
    check_writable(settings)
    if settings.workers == 1:
        with _write_errors(settings):
            summary = run_worker(settings, log=log, store=store, space=space)
        return _finish(summary, settings) if verdict else summary
    if worker_command is None:
        raise StudyError("several workers need the command that starts one worker")
    space = create_or_join(settings, store, space).space  # create once, before the workers race
    for note in space.notes if log is not None else ():
        log(note)
    per_worker = [["--devices", d] for d in settings.devices] or [[]] * settings.workers
    cores = available_cores()
    if settings.workers > cores and log is not None:
        log(f"warning: --workers {settings.workers} on {cores} CPU cores: the workers share "
            "the cores, one thread each, and the study takes longer than with "
            f"--workers {cores}")
    env = worker_env(settings.workers, cores)
    procs = []
    for index, extra in enumerate(per_worker):  # each worker seeds its sampler by its index
        worker_env_i = {**env, WORKER_INDEX_ENV: str(index)}
        procs.append(subprocess.Popen([*worker_command, *extra], env=worker_env_i))
    codes = [p.wait() for p in procs]
    storage = open_storage(settings.storage_spec())
    study = optuna.load_study(study_name=resolve_study_name(settings, store.dataset),
                              storage=storage)
    summary = summarize(study, settings)
    exhausted = bool(grid_exhausted_lines(study, settings))
    if summary.n_complete + summary.n_pruned < settings.n_trials and not exhausted:
        raise StudyError(
            f"the workers stopped (exit codes {codes}) with only "
            f"{summary.n_complete + summary.n_pruned} of {settings.n_trials} trials finished; "
            "run the same command again to finish the study"
        )
    return _finish(summary, settings) if verdict else summary


def _finish(summary: StudySummary, settings: StudySettings) -> StudySummary:
    storage = open_storage(settings.storage_spec())
    study = optuna.load_study(study_name=summary.name, storage=storage)
    return with_verdict(summary, study, settings)


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_env(workers: int, cores: int | None = None,
               base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a local worker process starts with: ``base`` (this process's) with the
    cores shared out, at least one thread each, for torch (OpenMP) and the BLAS libraries (N
    workers that each keep torch's full thread count oversubscribe the cores and run slower
    than one)."""
    cores = available_cores() if cores is None else cores
    n = max(1, cores // max(workers, 1))
    env = dict(os.environ if base is None else base)
    env.update(dict.fromkeys(THREAD_VARS, str(n)))
    return env
