"""Crash safety of a study's trials: heartbeats, retries of dead workers' trials, failing a batch
that stopped with an exception.

Everything goes through Optuna's public storage API and trial *numbers*; what a worker writes
beyond ask/tell (which worker holds a trial, its heartbeat, why it failed) is a trial system
attribute. A background thread refreshes each running trial's heartbeat (:class:`Heartbeat`); a
RUNNING trial silent past the grace period is failed and its parameters enqueued again, once,
by whichever worker's FAIL lands (:func:`reclaim_stale_trials`); a batch whose training raised
fails at once, re-enqueued after Ctrl-C so the same command continues (:func:`abandon`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.trial import TrialState

__all__ = ["FAIL_REASON_KEY", "HEARTBEAT_KEY", "INTERRUPTED", "RETRY_KEY", "WORKER_KEY",
           "Heartbeat", "TrialStorage", "abandon", "is_interrupted", "reclaim_stale_trials"]

#: the failure reason of a trial stopped by Ctrl-C: its parameters run again on resume, and
#: summaries count it as interrupted, not failed (:func:`is_interrupted`)
INTERRUPTED = "interrupted (Ctrl-C)"
HEARTBEAT_KEY = "spml:heartbeat"
WORKER_KEY = "spml:worker"
RETRY_KEY = "spml:retry_of"
FAIL_REASON_KEY = "spml:fail_reason"


class TrialStorage:
    """One study's trials in its storage, addressed by trial number (Optuna's public
    :class:`~optuna.storages.BaseStorage` methods; no private attribute of a study or trial)."""

    def __init__(self, storage: BaseStorage, study_name: str) -> None:
        self.storage = storage
        self.study_id = storage.get_study_id_from_name(study_name)
        self._ids: dict[int, int] = {}

    def trial_id(self, number: int) -> int:
        if number not in self._ids:
            self._ids[number] = self.storage.get_trial_id_from_study_id_trial_number(
                self.study_id, number)
        return self._ids[number]

    def set_attr(self, number: int, key: str, value: Any) -> None:
        """A system attribute of a running trial (raises UpdateFinishedTrialError if done)."""
        self.storage.set_trial_system_attr(self.trial_id(number), key, value)

    def fail(self, number: int, reason: str) -> bool:
        """Mark a running trial FAIL, saying why first; False if it had finished meanwhile (or
        another worker failed it first)."""
        try:
            self.set_attr(number, FAIL_REASON_KEY, reason)
            return bool(self.storage.set_trial_state_values(self.trial_id(number),
                                                            TrialState.FAIL))
        except UpdateFinishedTrialError:
            return False


class Heartbeat:
    """Refresh ``spml:heartbeat`` of the given trials every ``interval`` seconds, in a thread,
    while the ``with`` block trains them."""

    def __init__(self, trials: TrialStorage, numbers: Iterable[int], interval: float) -> None:
        self.trials, self.numbers, self.interval = trials, list(numbers), interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="spml-heartbeat")

    def beat(self) -> None:
        now = time.time()
        for number in list(self.numbers):
            try:
                self.trials.set_attr(number, HEARTBEAT_KEY, now)
            except UpdateFinishedTrialError:
                self.numbers.remove(number)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            # a storage hiccup must not kill training; the next beat retries
            with contextlib.suppress(Exception):
                self.beat()

    def __enter__(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def reclaim_stale_trials(study: optuna.Study, trials: TrialStorage, grace_seconds: float
                         ) -> list[int]:
    """Mark RUNNING trials with no heartbeat for ``grace_seconds`` FAIL and enqueue their
    parameters again. Returns the numbers of the trials reclaimed by this call."""
    now = time.time()
    reclaimed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        last = trial.system_attrs.get(HEARTBEAT_KEY)
        if last is None and trial.datetime_start is not None:
            last = trial.datetime_start.timestamp()
        if last is None or now - float(last) < grace_seconds:
            continue
        if not trials.fail(trial.number, "heartbeat lost"):
            continue  # finished meanwhile, or another worker reclaimed it first
        study.enqueue_trial(trial.params, user_attrs={**trial.user_attrs, RETRY_KEY: trial.number})
        reclaimed.append(trial.number)
    return reclaimed


def is_interrupted(trial: Any) -> bool:
    """Whether a FAIL trial was stopped by Ctrl-C (its parameters were enqueued again)."""
    return (trial.state == TrialState.FAIL
            and trial.system_attrs.get(FAIL_REASON_KEY) == INTERRUPTED)


def abandon(study: optuna.Study, trials: TrialStorage, batch: list[optuna.Trial],
            err: BaseException) -> None:
    """Training stopped with an exception: fail the batch's unfinished trials now (instead of
    leaving them RUNNING until the grace period), saying why. After Ctrl-C their parameters
    are enqueued again, so re-running the command continues the study where it stopped; other
    errors would likely repeat, so those trials stay failed."""
    interrupted = isinstance(err, KeyboardInterrupt)
    reason = INTERRUPTED if interrupted else f"{type(err).__name__}: {err}"[:500]
    for trial in batch:
        if trials.storage.get_trial(trials.trial_id(trial.number)).state != TrialState.RUNNING:
            continue
        try:
            trials.set_attr(trial.number, FAIL_REASON_KEY, reason)
            study.tell(trial, state=TrialState.FAIL)
        except (UpdateFinishedTrialError, ValueError, RuntimeError):
            continue  # reclaimed by another worker meanwhile
        if interrupted:
            study.enqueue_trial(trial.params, user_attrs={**trial.user_attrs,
                                                          RETRY_KEY: trial.number})
