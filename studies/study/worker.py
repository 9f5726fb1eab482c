"""The worker loop of a study: ask a batch of trials, train it stacked as one model, report
per-epoch val mAP to the pruner, tell the results, write them to the batch's Parquet file;
until the study has its trials (:func:`run_worker`).
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from probe.evaluation.convergence import best_is_last
from probe.evaluation.selection import Selection, mean_over_replicates
from probe.progress import Progress
from studies.results.rows import probe_rows, study_tag, write_batch, write_trial_heads
from studies.study.create import create_or_join, prune_rule
from studies.study.heartbeat import (
    FAIL_REASON_KEY,
    WORKER_KEY,
    Heartbeat,
    abandon,
    reclaim_stale_trials,
)
from studies.study.pruning import BatchPruner
from studies.study.settings import StudySettings, open_study_store
from studies.study.space import SearchSpace
from studies.study.storage import ask_lock, best_trial, is_paper_trial
from studies.study.summary import StudySummary, summarize

__all__ = ["DEVICE_KEY", "run_worker"]

DEVICE_KEY = "spml:device"  # trial system attribute: the device its worker trained it on


def _counts(study: optuna.Study) -> Counter[TrialState]:
    return Counter(t.state for t in study.get_trials(deepcopy=False))


def _train_group(settings, data, study, storage, space, trials, probe_config, log,
                 tick: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Train one group of trials sharing batch size and epochs, stacked; tell their results.

    ``data``: the replicates of the study's ``--select`` mode (:func:`probe.evaluation.selection.
    selection_data`); with several, the group is trained on each in turn and every trial is
    scored by its mean val curve (:func:`_train_replicates`)."""
    from probe.engine.results import EpochReport
    from probe.engine.train import train_probe

    hparams = [{**settings.fixed, **loss_part, **{k: v for k, v in train.items() if k == "lr"}}
               for loss_part, train in (space.split(t.params) for t in trials)]
    pruned: set[int] = set()
    lost: set[int] = set()  # trials another worker failed and retried meanwhile (not ours now)
    paper = [is_paper_trial(t) for t in trials]
    pruner = BatchPruner(prune_rule(settings), study)

    def on_epoch(report: EpochReport) -> list[int]:
        stop, eligible = [], []
        for i, trial in enumerate(trials):
            value = report.val_map[i]
            if not report.active[i] or value is None:
                continue
            if not math.isfinite(value):
                stop.append(i)
                continue
            try:
                trial.report(value, report.epoch)
            except UpdateFinishedTrialError:  # reclaimed elsewhere: its heartbeat came late
                lost.add(i)
                stop.append(i)
                continue
            pruner.record(i, report.epoch, value)
            # the paper point is the study's reference: it always runs to the end
            if not paper[i]:
                eligible.append(i)
        # Optuna's decisions, from one read of the completed trials (studies.study.pruning)
        for i in pruner.decide(eligible, report.epoch):
            pruned.add(i)
            stop.append(i)
        if tick is not None:  # the study's progress line, at least every ~10 s
            tick(f"batch of {len(trials)}: epoch {report.epoch}/{probe_config.epochs}")
        return stop

    started = time.perf_counter()
    with Heartbeat(storage, [t.number for t in trials], settings.heartbeat_seconds):
        # the study shows one progress line for all its trials (run_worker), not one per batch
        if len(data) == 1:
            result = train_probe(data[0], probe_config, settings.loss, hparams,
                                 callback=on_epoch, progress=False)
        else:
            result = _train_replicates(settings, data, probe_config, hparams, on_epoch, tick)
    seconds = (time.perf_counter() - started) / max(len(trials), 1)
    states: list[str] = []
    for i, trial in enumerate(trials):
        tr = result.trials[i]
        value = tr.best.get("val_map") if tr.best else None
        ok = value is not None and math.isfinite(value) and tr.finite
        try:
            if i in lost:
                raise UpdateFinishedTrialError
            if i in pruned:
                state = TrialState.PRUNED
            elif ok:
                state = TrialState.COMPLETE
            else:  # a non-finite loss or metric
                state = TrialState.FAIL
            if state == TrialState.FAIL:
                storage.set_attr(trial.number, FAIL_REASON_KEY, "non-finite")
            told = study.tell(trial, float(value) if state == TrialState.COMPLETE else None,
                              state=state, skip_if_finished=True)
            if told.state != state:
                raise UpdateFinishedTrialError
        except UpdateFinishedTrialError:
            log(f"trial {trial.number}: reclaimed by another worker (its heartbeat was late); "
                "its retry runs there")
            lost.add(i)
            states.append(TrialState.FAIL.name)  # a placeholder: its row is dropped below
            continue
        states.append(state.name)
        log(f"trial {trial.number}: {state.name.lower()}"
            + (f", val mAP {value:.2f}" if value is not None and math.isfinite(value) else "")
            + (" (best epoch = last: may not have converged)" if state == TrialState.COMPLETE
               and best_is_last([e.get("val_map") for e in tr.epochs]) else ""))
    kept = [i for i, st in enumerate(states) if st == "COMPLETE" and i not in lost]
    if len(data) == 1 and result.best_heads is not None and kept:  # for the paired bootstrap
        write_trial_heads(Path(settings.out) / "results", [trials[i].number for i in kept],
                          result.best_heads[kept], result.source, study_tag(study))
    gone = {trials[i].number for i in lost}  # the worker that retries them writes their rows
    rows = probe_rows(result.to_dict(), kind="study", study=study.study_name,
                      numbers=[t.number for t in trials], states=states,
                      params=[t.params for t in trials],
                      extra={"worker": f"{socket.gethostname()}:{os.getpid()}",
                             "seconds": seconds, "provenance": result.source,
                             "study_tag": study_tag(study)})
    return [{**row, "value": None} if row["state"] == "FAIL" else row  # a failure: no value
            for row in rows if row["trial"] not in gone]


def _train_replicates(settings, data, probe_config, hparams, on_epoch, tick) -> Any:
    """The group trained on every replicate (``draws:N``: all in one stacked run, each trial on
    each draw; ``cv:K``: one stacked run, each trial on each fold, where the folds share a train
    size), then scored by the mean over them
    (:func:`probe.evaluation.selection.mean_over_replicates`); the mean val curve goes to
    ``on_epoch`` epoch by epoch (Optuna's intermediate values; nothing is pruned:
    ``prune_rule``)."""
    from probe.engine.results import EpochReport
    from probe.evaluation.selection import train_replicates

    def beat(report: EpochReport) -> list[int]:
        if tick is not None:
            tick(f"batch of {len(hparams)} over {len(data)} replicates, epoch "
                 f"{report.epoch}/{probe_config.epochs}")
        return []

    results = train_replicates(data, probe_config, settings.loss, hparams, callback=beat)
    merged = mean_over_replicates(results, settings.select)
    n = len(merged.trials)
    for e in range(max((len(t.epochs) for t in merged.trials), default=0)):
        vals = [t.epochs[e]["val_map"] if e < len(t.epochs) else None for t in merged.trials]
        on_epoch(EpochReport(epoch=e + 1, train_loss=[None] * n, val_map=vals,
                             test_map=[None] * n, active=[v is not None for v in vals]))
    return merged


def run_worker(settings: StudySettings, *, log: Callable[[str], None] | None = None,
               store: Any = None, space: SearchSpace | None = None) -> StudySummary:
    """Work on the study until ``n_trials`` trials have finished (completed or pruned).
    ``store`` and ``space``: the opened store and what :func:`~studies.study.settings.preflight`
    returned for it, when the caller has checked the settings (else both happen here).
    Progress goes to stderr as one study-level display with each finished trial's line
    (``log`` gets those instead when the display is off: ``SPML_PROGRESS=off``)."""
    from probe.devices import resolve_device
    from probe.evaluation.selection import selection_data

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if store is None:
        store = open_study_store(settings.store)
    study, space, storage = create_or_join(settings, store, space)
    # the study's one display (every worker's finished trials, the best so far, ETA): a bar on a
    # terminal, lines in a log (as trials finish, and every ~10 s: a batch may train minutes)
    counts = _counts(study)
    bar = Progress(settings.n_trials, f"study {study.study_name}", "trials", heartbeat=True,
                   initial=min(counts[TrialState.COMPLETE] + counts[TrialState.PRUNED],
                               settings.n_trials))
    bar.set_postfix(_status(study, counts))
    with bar:
        def say(line: str) -> None:
            bar.write(line)  # above the bar on a terminal, a plain line in a log
            if log is not None and bar.mode == "off":
                log(line)

        for note in space.notes:
            say(note)
        selection = Selection.parse(settings.select)
        bar.write(f"loading the features of {settings.store} ({store.n_rows} rows)"
                  + (f"; --select {selection}: {selection.replicates} replicates, each trial "
                     "trained on all and scored by the mean (no pruning)"
                     if selection.replicates > 1 else ""))
        data = selection_data(store, selection, device=resolve_device(settings.device),
                              observed_seed=settings.observed_seed, priors=settings.priors)
        _work(settings, study, space, storage, data, bar, say)
    return summarize(study, settings)


def _status(study: optuna.Study, counts: dict[TrialState, int]) -> str:
    best = best_trial(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    text = (f"{counts[TrialState.PRUNED]} pruned, {counts[TrialState.FAIL]} failed"
            + (f", {counts[TrialState.RUNNING]} running" if counts[TrialState.RUNNING] else ""))
    if best is not None:
        text += f", best val mAP {best.value:.2f} (trial {best.number})"
    return text


def _work(settings: StudySettings, study: optuna.Study, space: SearchSpace, storage: Any,
          data: Any, bar: Any, say: Callable[[str], None]) -> None:
    """The worker loop: ask a batch, train it stacked, tell it, until the study is done;
    ``say`` writes a trial's line."""
    from probe.engine.config import ProbeConfig

    fixed_dists = dict(space.distributions)

    def tick(detail: str) -> None:  # where the batch stands, shown if ~10 s have passed
        bar.set_postfix(f"{status}; {detail}")
        bar.refresh()

    while True:
        # retrying dead workers' trials, counting and asking under one lock: workers started
        # together never overshoot, and a retry is enqueued before anyone can take its room
        with ask_lock(settings.storage_spec(), study.study_name):
            reclaim_stale_trials(study, storage, settings.grace_seconds)
            counts = _counts(study)
            finished = counts[TrialState.COMPLETE] + counts[TrialState.PRUNED]
            if finished >= settings.n_trials or (settings.sampler == "grid"
                                                 and study.sampler.is_exhausted(study)):
                trials = None
            else:
                # enqueued (WAITING) trials are asked first, so they are part of the room
                n_ask = min(settings.batch,
                            settings.n_trials - finished - counts[TrialState.RUNNING])
                trials = [study.ask(fixed_dists) for _ in range(max(n_ask, 0))]
                for trial in trials:
                    storage.set_attr(trial.number, WORKER_KEY,
                                     f"{socket.gethostname()}:{os.getpid()}")
                    storage.set_attr(trial.number, DEVICE_KEY, str(data[0].device))
        status = _status(study, counts)
        bar.set_postfix(status)
        bar.update(min(finished, settings.n_trials) - bar.n)
        bar.refresh(force=True)
        if trials is None:
            break
        if not trials:  # the rest is running elsewhere: wait, and retry it if its worker dies
            time.sleep(min(settings.heartbeat_seconds, 2.0))
            continue
        groups: dict[tuple, list] = {}
        for trial in trials:
            _, train_part = space.split(trial.params)
            key = (train_part.get("batch_size", settings.batch_size),
                   train_part.get("epochs", settings.epochs))
            groups.setdefault(key, []).append(trial)
        rows = []
        try:
            for (batch_size, epochs), group in groups.items():
                cfg = ProbeConfig(batch_size=batch_size, epochs=epochs, lr=settings.lr,
                                  seed=settings.train_seed, val_labels=settings.val_labels,
                                  observed_seed=settings.observed_seed, device=settings.device,
                                  priors=settings.priors)
                rows += _train_group(settings, data, study, storage, space, group, cfg, say,
                                     tick=tick)
        except BaseException as err:
            abandon(study, storage, trials, err)
            raise
        finally:  # what was told to the storage is in the results too
            write_batch(Path(settings.out) / "results", rows)
