"""Optuna studies on the stacked probe engine: ask T trials, train them as one model, report
per-epoch val mAP so a pruner can stop bad trials early, tell T results.

One process runs :func:`run_worker`; ``--workers N`` starts N such processes on one machine
(journal file or PostgreSQL storage); the same command on many machines joins one PostgreSQL
study. Trials are deterministic given their settings and seed.

Crash safety (:mod:`studies.heartbeat`): every running trial carries a heartbeat, a worker's
dead trials are failed and retried once, and a batch stopped by an exception fails at once.
Results already told live in the storage and in the per-batch Parquet files, which are written
atomically. Only Optuna's public API is used: the storage object this module opens is kept
(:class:`JoinedStudy`), never read back from a study's private attributes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import optuna
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from probe.convergence import best_is_last, count_best_is_last
from probe.errors import SpmlError
from probe.selection import Selection, SelectionError, mean_over_replicates
from probe.store.protocol import PROTOCOL_SEED

from .heartbeat import (
    FAIL_REASON_KEY,
    WORKER_KEY,
    Heartbeat,
    TrialStorage,
    abandon,
    reclaim_stale_trials,
)
from .pruning import BatchPruner, MedianRule
from .results import probe_rows, write_batch
from .space import SearchSpace, build_space
from .storage import StorageSpec, StudyError, ask_lock, open_storage, parse_storage

__all__ = [
    "SAMPLERS",
    "JoinedStudy",
    "StudySettings",
    "StudySummary",
    "create_or_join",
    "run_study",
    "run_worker",
]

SAMPLERS = ("tpe", "gp", "cmaes", "random", "grid")
PRUNERS = ("median", "none")
DEVICE_KEY = "spml:device"  # trial system attribute: the device its worker trained it on
_IDENTITY_KEYS = ("spml.loss", "spml.store", "spml.space", "spml.fixed")


@dataclass(frozen=True)
class StudySettings:
    """One study: what to search, how, where it lives. Defaults are the cheap, safe choice."""

    store: str  # the feature store the probes train on
    loss: str  # a registered loss name
    n_trials: int = 32  # finished (complete or pruned) trials to reach, over all workers
    batch: int = 8  # trials asked at once and trained stacked as one model
    sampler: str = "tpe"  # TPE copes with few trials and conditional spaces; the Optuna default
    pruner: str = "median"  # median pruning of epochs: cheap, robust, no tuning of its own
    storage: str | None = None  # None: <out>/study.log, a journal (<out>/study.db if one exists)
    name: str | None = None  # None: "<dataset>-<loss>"
    out: str = "spml-study"  # results folder (Parquet per batch, storage file by default)
    seed: int = 0  # sampler seed; trial training seeds come from train_seed
    train_seed: int = 0  # init + batch order of every trial, so trials differ only by params
    fixed: dict[str, Any] = field(default_factory=dict)  # loss hparams held fixed (--set)
    space: dict[str, BaseDistribution] = field(default_factory=dict)  # --space overrides
    params: tuple[str, ...] | None = None  # search only these loss hparams
    grid: dict[str, tuple[float, ...]] = field(default_factory=dict)  # grid sampler values
    search_lr: bool | None = None  # None: searched where no paper gives the store's lr
    # (no preset for its dataset and no --lr: lr_unknown); True / False: always / never
    batch_sizes: tuple[int, ...] = ()  # categorical batch-size search (groups train apart)
    epochs_choices: tuple[int, ...] = ()  # categorical epochs search
    epochs: int | None = None  # None: the loss's paper preset for the dataset
    batch_size: int | None = None  # None: the loss's paper preset for the dataset
    lr: float | None = None  # None: the loss's paper preset for the dataset
    val_labels: str = "clean"  # docs/protocol.md step 4
    select: str = "val"  # how a trial is scored: val | cv:K | draws:N (probe.selection)
    observed_seed: int = PROTOCOL_SEED  # the literature's single-positive draw
    device: str = "auto"
    enqueue_paper: bool = True  # first trial = the paper's values (never worse than the paper)
    heartbeat_seconds: float = 10.0  # how often a running trial proves its worker is alive
    grace_seconds: float = 120.0  # a RUNNING trial silent this long is retried
    workers: int = 1  # local worker processes (needs a journal or PostgreSQL storage)
    devices: tuple[str, ...] = ()  # one device per worker (--devices cuda:0,cuda:1); (): device
    priors: str | None = None  # the store prior a loss with Loss.prior reads (docs/priors.md)

    def storage_spec(self) -> StorageSpec:
        # the journal: the fastest storage for one worker and shared by several; a study an
        # older spml wrote to <out>/study.db (SQLite) is continued there
        old = Path(self.out) / "study.db"
        default = old if self.storage is None and old.is_file() and self.workers == 1 else (
            Path(self.out) / "study.log")
        return parse_storage(self.storage, default=default)

    def validate(self) -> None:
        if self.sampler not in SAMPLERS:
            raise StudyError(
                f"--sampler must be one of {', '.join(SAMPLERS)}; got {self.sampler!r}"
            )
        if self.pruner not in PRUNERS:
            raise StudyError(f"--pruner must be one of {', '.join(PRUNERS)}; got {self.pruner!r}")
        for name in ("n_trials", "batch", "workers"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise StudyError(
                    f"--{name.replace('_', '-')} must be a positive integer; got {v!r}"
                )
        for flag, v in (("--epochs", self.epochs), ("--batch-size", self.batch_size)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise StudyError(f"{flag} must be a positive integer (or left out for the "
                                 f"loss's preset); got {v!r}")
        if self.lr is not None and not (isinstance(self.lr, int | float)
                                        and 0 < self.lr < math.inf):
            raise StudyError(f"--lr must be a positive number; got {self.lr!r}")
        for flag, values in (("--epochs-choices", self.epochs_choices),
                             ("--batch-sizes", self.batch_sizes)):
            bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
            if bad:
                raise StudyError(f"{flag} must be positive integers; got {bad[0]!r} in "
                                 f"{','.join(map(str, values))}")
        if self.sampler == "grid" and not self.grid:
            raise StudyError("--sampler grid needs the grid: --grid gr.b_T=-8,-4,-2 (repeatable)")
        if self.grid and self.sampler != "grid":
            raise StudyError("--grid is only used with --sampler grid")
        if self.grace_seconds <= self.heartbeat_seconds:
            raise StudyError(
                f"--grace ({self.grace_seconds:g} s) must exceed the heartbeat interval "
                f"({self.heartbeat_seconds:g} s), or live trials would be taken for dead ones"
            )
        try:
            Selection.parse(self.select)
        except SelectionError as err:
            raise StudyError(str(err)) from None
        if self.devices and len(self.devices) != self.workers:
            raise StudyError(
                f"--devices names {len(self.devices)} devices ({','.join(self.devices)}) for "
                f"--workers {self.workers}: give one device per worker, e.g. --devices "
                "cuda:0,cuda:1 (the worker count then follows from it)"
            )
        if self.workers > 1 and not self.storage_spec().multi_process:
            raise StudyError(
                f"--workers {self.workers} needs storage that several processes can share: an "
                "SQLite file is for one process; use a journal file (--storage study.log) or "
                "PostgreSQL (--storage postgresql://…)"
            )
        # a loss that needs a prior and has none, or a prior for a loss that uses none
        from probe.losses import get_loss_class
        from probe.trials import check_prior_request

        check_prior_request(get_loss_class(self.loss), self.priors)


@dataclass
class StudySummary:
    name: str
    storage: str
    out: str
    n_complete: int
    n_pruned: int
    n_failed: int
    best_value: float | None
    best_params: dict[str, Any]
    best_trial: int | None
    paper_value: float | None  # val mAP of the enqueued paper point, if it ran
    # completed trials whose best val epoch was their last (probe.convergence): not converged
    n_best_at_last: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# study creation and identity
# --------------------------------------------------------------------------------------------


def _store_identity(store: Any) -> dict[str, Any]:
    prov = store.provenance or {}
    return {
        "dataset": store.dataset,
        "rows": int(store.n_rows),
        "classes": int(store.n_classes),
        "feature_dim": int(store.feature_dim),
        "created": prov.get("created") or store.attrs.get("created"),
        "backbone": prov.get("backbone"),
        "weights_sha256": prov.get("weights_sha256"),
    }


def _sampler(settings: StudySettings, space: SearchSpace) -> optuna.samplers.BaseSampler:
    if settings.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=settings.seed, constant_liar=True, multivariate=True)
    if settings.sampler == "gp":
        return optuna.samplers.GPSampler(seed=settings.seed)
    if settings.sampler == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=settings.seed)
    if settings.sampler == "random":
        return optuna.samplers.RandomSampler(seed=settings.seed)
    return _AskTellGridSampler({k: list(v) for k, v in settings.grid.items()}, seed=settings.seed)


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler calls ``study.stop()`` after the last point, which only works
    inside ``study.optimize``; with ask/tell the worker loop checks ``is_exhausted`` itself."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def _prune_rule(settings: StudySettings) -> MedianRule | None:
    """The pruning rule (None: never prune); decided in process by :class:`BatchPruner`."""
    if settings.pruner == "none" or Selection.parse(settings.select).replicates > 1:
        return None  # with replicates a trial's curve is known only after all of them
    # steps are epochs counted from 1: the first epoch is never pruned
    return MedianRule(n_startup_trials=max(2, settings.batch // 2), n_warmup_steps=2)


def _pruner(settings: StudySettings) -> optuna.pruners.BasePruner:
    """The Optuna pruner the study is created with: the same rule as :func:`_prune_rule`."""
    rule = _prune_rule(settings)
    return optuna.pruners.NopPruner() if rule is None else rule.optuna()


def _space(settings: StudySettings, dataset: str) -> SearchSpace:
    if settings.sampler == "grid":
        from optuna.distributions import CategoricalDistribution

        overrides = {k: CategoricalDistribution(tuple(v)) for k, v in settings.grid.items()}
        space = build_space(settings.loss, dataset, overrides=overrides, only=())
        return SearchSpace(space.loss, overrides if overrides else space.distributions, {})
    space = build_space(
        settings.loss,
        dataset,
        search_lr=searches_lr(settings, dataset),
        batch_sizes=settings.batch_sizes,
        epochs=settings.epochs_choices,
        overrides=settings.space,
        only=settings.params,
        fixed=settings.fixed,
    )
    from probe.config import GENERIC_TRAINING

    if settings.search_lr is None and searches_lr(settings, dataset):
        space = dataclasses.replace(space, notes=(
            f"no paper gives {settings.loss}'s learning rate on {dataset}: train.lr is "
            f"searched (log-uniform 1e-5..1e-1; the first trial keeps the generic "
            f"{GENERIC_TRAINING['lr']:g}); "
            "--lr or --no-search-lr fixes it (docs/selection.md)",))
    # --set on a searched parameter fixes it: the search narrows to the others
    held = [f"{settings.loss}.{n}" for n in settings.fixed
            if f"{settings.loss}.{n}" in space.distributions]
    if not held:
        return space
    dists = {k: d for k, d in space.distributions.items() if k not in held}
    if not dists:
        raise StudyError(
            f"--set {', '.join(n.split('.', 1)[1] for n in held)}: fixes every searched "
            "parameter, so nothing is left to search; drop one from --set, or search others "
            "(--params, --space, --search-lr)")
    fixed = ",".join(f"{n.split('.', 1)[1]}={settings.fixed[n.split('.', 1)[1]]}"
                     for n in held)
    note = (f"--set {fixed}: held fixed instead of searched; the search narrows to "
            f"{', '.join(dists)}")
    return SearchSpace(space.loss, dists,
                       {k: v for k, v in space.defaults.items() if k in dists},
                       (*space.notes, note))


def preflight(settings: StudySettings, store: Any) -> SearchSpace:
    """Check every input of a study against its store before anything is written: the
    settings, the loss and its fixed hyperparameters (names and values), the search space,
    epochs and batch size against the train split. Returns the search space. A command refused
    here leaves ``--out`` and the storage as they were."""
    from probe.config import TRAINER_KEYS, resolve_training
    from probe.losses import get_loss_class
    from probe.losses._base import check_hparams

    settings.validate()
    cls = get_loss_class(settings.loss)  # an unknown loss names the closest one
    preset = cls.presets.get(store.dataset, {})
    loss_fixed = {k: v for k, v in settings.fixed.items() if k not in TRAINER_KEYS}
    try:
        check_hparams(cls.hparam_specs, {**preset, **loss_fixed}, cls.name)
    except SpmlError as err:
        raise StudyError(f"--set: {err}") from None
    for key in TRAINER_KEYS:
        v = settings.fixed.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                              or not 0 <= v < math.inf or (key == "lr" and v == 0)):
            raise StudyError(f"--set {key}: a {'positive' if key == 'lr' else 'non-negative'} "
                             f"number; got {v!r}")
    seeds = store.observed_seeds()
    if settings.observed_seed not in seeds:
        raise StudyError(
            f"--observed-seed {settings.observed_seed}: {settings.store} has no such "
            f"single-positive draw (it has {', '.join(map(str, seeds))}); add it with 'spml "
            f"draw {settings.store} --seeds {settings.observed_seed}', or pick one it has")
    from probe.data import resolve_device

    for device in settings.devices or (settings.device,):
        try:
            resolve_device(device)  # "cuda" without a GPU, a typo: refused now
        except SpmlError as err:
            flag = "--devices" if settings.devices else "--device"
            raise StudyError(f"{flag} {device}: {err}") from None
    space = _space(settings, store.dataset)
    n_train = len(store.split("train"))
    training = resolve_training(cls, store.dataset, batch_size=settings.batch_size,
                                lr=settings.lr, epochs=settings.epochs)
    sizes = [("--batch-size", training.batch_size)] if "train.batch_size" not in \
        space.distributions else [("--batch-sizes", b) for b in settings.batch_sizes]
    for flag, size in sizes:
        if size > n_train:
            source = training.sources["batch_size"] if flag == "--batch-size" else "searched"
            raise StudyError(
                f"{flag}: batch size {size} ({source}) is larger than the train split of "
                f"{settings.store} ({n_train} rows); use a batch size of at most {n_train}")
    return space


def lr_unknown(loss: str, dataset: str) -> bool:
    """No paper gives the learning rate of ``loss`` on ``dataset`` (no training preset), so
    the generic setting's lr (Cole et al.'s pick for ResNet-50 features of the four
    benchmarks) is a guess for these features: docs/selection.md "Stores without a preset"."""
    from probe.losses import get_loss_class

    return "lr" not in get_loss_class(loss).train_presets.get(dataset, {})


def searches_lr(settings: StudySettings, dataset: str) -> bool:
    """Whether the study searches ``train.lr``: as asked (``--search-lr`` / ``--no-search-lr``),
    else where the lr is unknown and not given (:func:`lr_unknown`; not with --sampler grid)."""
    if settings.search_lr is not None:
        return settings.search_lr
    return (settings.lr is None and settings.sampler != "grid" and "lr" not in settings.fixed
            and lr_unknown(settings.loss, dataset))


class JoinedStudy(NamedTuple):
    """What :func:`create_or_join` opened: the study, its search space, and its trials in the
    storage object it opened (for heartbeats and failure reasons, through Optuna's public
    storage API)."""

    study: optuna.Study
    space: SearchSpace
    trials: TrialStorage


def create_or_join(settings: StudySettings, store: Any) -> JoinedStudy:
    """Create the study (enqueueing the paper point) or join an existing one with the same loss,
    store and space; refuse, saying why, when they differ."""
    space = preflight(settings, store)
    spec = settings.storage_spec()
    storage = open_storage(spec)
    name = settings.name or f"{store.dataset}-{settings.loss}"
    if settings.search_lr is None and "train.lr" in space.distributions and \
            name in optuna.get_all_study_names(storage):
        made = optuna.load_study(study_name=name, storage=storage).user_attrs.get("spml.space")
        if made is not None and "train.lr" not in made:
            # a study made before the lr was searched by default: the same command continues
            # it with its fixed lr
            settings = dataclasses.replace(settings, search_lr=False)
            space = dataclasses.replace(_space(settings, store.dataset), notes=(
                f"study '{name}' was made with a fixed lr: continued with it (not searched)",))
    identity = {
        "spml.loss": settings.loss,
        "spml.store": _store_identity(store),
        "spml.space": {
            k: json.loads(distribution_to_json(d)) for k, d in space.distributions.items()
        },
        "spml.fixed": {k: v for k, v in sorted(settings.fixed.items())},
    }
    # the fixed training settings first: whoever sees the other keys sees these too
    identity = {"spml.training": training_identity(asdict(settings), store.dataset, space),
                **identity}
    identity = json.loads(json.dumps(identity, default=str))
    sampler, pruner = _sampler(settings, space), _pruner(settings)
    try:
        study = optuna.create_study(
            storage=storage, study_name=name, direction="maximize", sampler=sampler, pruner=pruner
        )
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
        created = False
        if _nothing_measured(study) and _identity_differs(study, identity):
            # a start that failed before measuring anything is not a study to protect: the
            # corrected command replaces it (and its failed trials' rows)
            optuna.delete_study(study_name=name, storage=storage)
            _drop_rows(Path(settings.out) / "results", name)
            study = optuna.create_study(storage=storage, study_name=name, direction="maximize",
                                        sampler=sampler, pruner=pruner)
            created = True
            space = dataclasses.replace(space, notes=(*space.notes, (
                f"study '{name}' in {spec.display} held only failed trials, made with other "
                "settings; replaced by this command's study")))
    if created:
        for key, value in identity.items():
            study.set_user_attr(key, value)
        study.set_user_attr(
            "spml.settings", json.loads(json.dumps(_settings_dict(settings), default=str))
        )
        if settings.enqueue_paper and space.defaults and settings.sampler != "grid":
            study.enqueue_trial(dict(space.defaults), user_attrs={"spml:paper": True})
    else:
        attrs = _wait_for_identity(study)
        for key in _IDENTITY_KEYS:
            if attrs.get(key) != identity[key]:
                what = {
                    "spml.loss": "loss",
                    "spml.store": "store",
                    "spml.space": "search space",
                    "spml.fixed": "fixed hyperparameters (--set)",
                }[key]
                raise StudyError(
                    f"study '{name}' in {spec.display} exists with a different {what}: it has "
                    f"{json.dumps(attrs.get(key))}, this command asks for "
                    f"{json.dumps(identity[key])}. "
                    "Use another --name, or the same settings to join it"
                )
        _check_training(attrs, identity["spml.training"], store.dataset, space, name,
                        spec.display)
    return JoinedStudy(study, space, TrialStorage(storage, name))


def _nothing_measured(study: optuna.Study) -> bool:
    """No trial of the study completed, was pruned or is running: at most failed trials and
    the enqueued paper point are there (a start that failed)."""
    return all(t.state in (TrialState.FAIL, TrialState.WAITING)
               for t in study.get_trials(deepcopy=False))


def _identity_differs(study: optuna.Study, identity: dict[str, Any]) -> bool:
    attrs = study.user_attrs
    return any(attrs.get(k) != identity[k] for k in (*_IDENTITY_KEYS, "spml.training")
               if k in attrs)


def _drop_rows(results: Path, name: str) -> None:
    """Delete the result files that hold only rows of study ``name`` (one file is one batch
    of one study)."""
    import polars as pl

    for f in sorted(results.glob("batch-*.parquet")):
        try:
            studies = pl.read_parquet(f, columns=["study"])["study"].unique().to_list()
        except Exception:  # not a results file this version reads: left alone
            continue
        if studies == [name]:
            f.unlink()


# what a trial's result depends on that is not searched, in the order they are reported
TRAINING_KEYS = ("epochs", "batch_size", "lr", "optimizer", "train_seed", "observed_seed",
                 "val_labels", "select")


def training_identity(values: dict[str, Any], dataset: str, space: SearchSpace
                      ) -> dict[str, Any]:
    """The fixed training settings of a study, resolved as the trials train with them (a value
    left to the loss's paper preset is the preset's value), from :class:`StudySettings` fields
    (``values``: ``asdict(settings)`` or the ``spml.settings`` a study stored). A setting the
    study searches is ``"searched"``: its value is a trial parameter."""
    from probe.config import ProbeConfig, resolve_training
    from probe.losses import get_loss_class

    try:
        cls = get_loss_class(values["loss"])
    except (KeyError, ValueError):
        cls = None
    resolved = resolve_training(cls, dataset, batch_size=values.get("batch_size"),
                                lr=values.get("lr"), epochs=values.get("epochs")).to_dict()
    out: dict[str, Any] = {}
    for key in TRAINING_KEYS:
        if f"train.{key}" in space.distributions:
            out[key] = "searched"
        elif key in ("epochs", "batch_size", "lr"):
            out[key] = resolved[key]
        elif key == "optimizer":
            out[key] = values.get("optimizer") or ProbeConfig().optimizer
        elif key == "select":
            out[key] = str(Selection.parse(values.get("select") or "val"))
        elif key == "observed_seed":
            out[key] = values.get(key, PROTOCOL_SEED)
        elif key == "val_labels":
            out[key] = values.get(key) or "clean"
        else:
            out[key] = values.get(key, 0)
    return out


def _check_training(attrs: dict[str, Any], given: dict[str, Any], dataset: str,
                    space: SearchSpace, name: str, where: str) -> None:
    """Refuse to add trials trained with other fixed settings than the study's: one line per
    differing setting, the stored and the given value, and what to do instead."""
    stored = attrs.get("spml.training")
    if stored is None and attrs.get("spml.settings"):  # a study made before spml.training
        stored = training_identity(attrs["spml.settings"], dataset, space)
    if stored is None:
        return
    differ = [k for k in TRAINING_KEYS if k in stored and stored.get(k) != given.get(k)]
    if not differ:
        return
    lines = [f"  {k}: the study has {stored.get(k)!r}, this command gives {given.get(k)!r}"
             for k in differ]
    raise StudyError(
        f"study '{name}' in {where} was trained with other settings; adding trials to it "
        "would mix results that cannot be compared:\n" + "\n".join(lines) + "\n"
        "Give the study's settings to add trials to it, or start a new study with another "
        "--out (or --name)"
    )


def _wait_for_identity(study: optuna.Study, timeout: float = 30.0) -> dict[str, Any]:
    """A study another worker has just created may not carry its attributes yet."""
    deadline = time.time() + timeout
    while True:
        attrs = study.user_attrs
        if all(k in attrs for k in _IDENTITY_KEYS) or time.time() > deadline:
            return attrs
        time.sleep(0.2)


def _settings_dict(settings: StudySettings) -> dict[str, Any]:
    d = asdict(settings)
    d["space"] = {k: json.loads(distribution_to_json(v)) for k, v in settings.space.items()}
    return d


# --------------------------------------------------------------------------------------------
# the worker loop
# --------------------------------------------------------------------------------------------


def _counts(study: optuna.Study) -> dict[TrialState, int]:
    counts = dict.fromkeys(TrialState, 0)
    for t in study.get_trials(deepcopy=False):
        counts[t.state] += 1
    return counts


def _train_group(settings, data, study, storage, space, trials, probe_config, log,
                 tick: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Train one group of trials sharing batch size and epochs, stacked; tell their results.

    ``data``: the replicates of the study's ``--select`` mode (:func:`probe.selection.
    selection_data`); with several, the group is trained on each in turn and every trial is
    scored by its mean val curve (:func:`_train_replicates`)."""
    from probe.results import EpochReport
    from probe.train import train_probe

    hparams = []
    for trial in trials:
        loss_part, train_part = space.split(trial.params)
        hp = {**settings.fixed, **loss_part}
        if "lr" in train_part:
            hp["lr"] = train_part["lr"]
        hparams.append(hp)
    pruned: set[int] = set()
    lost: set[int] = set()  # trials another worker failed and retried meanwhile (not ours now)
    paper = [bool(t.user_attrs.get("spml:paper")) for t in trials]

    pruner = BatchPruner(_prune_rule(settings), study)

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
        # Optuna's decisions, from one read of the completed trials (studies.pruning)
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
                told = study.tell(trial, state=state, skip_if_finished=True)
            elif ok:
                state = TrialState.COMPLETE
                told = study.tell(trial, float(value), skip_if_finished=True)
            else:
                state = TrialState.FAIL
                storage.set_attr(trial.number, FAIL_REASON_KEY, "non-finite")
                told = study.tell(trial, state=state, skip_if_finished=True)
            if told.state != state:
                raise UpdateFinishedTrialError
        except UpdateFinishedTrialError:
            log(f"trial {trial.number}: reclaimed by another worker (its heartbeat was late); "
                "its retry runs there")
            lost.add(i)
            states.append(TrialState.FAIL.name)  # a placeholder: its row is dropped below
            continue
        states.append(state.name)
        log(
            f"trial {trial.number}: {state.name.lower()}"
            + (f", val mAP {value:.2f}" if value is not None and math.isfinite(value) else "")
            + (" (best epoch = last: may not have converged)" if state == TrialState.COMPLETE
               and best_is_last([e.get("val_map") for e in tr.epochs]) else "")
        )
    rows = _result_rows(study, trials, result, states, seconds)
    gone = {trials[i].number for i in lost}  # the worker that retries them writes their rows
    return [row for row in rows if row["trial"] not in gone]


def _train_replicates(settings, data, probe_config, hparams, on_epoch, tick) -> Any:
    """The group trained stacked on each replicate in turn, then scored by the mean over them
    (:func:`probe.selection.mean_over_replicates`); the mean val curve goes to ``on_epoch``
    epoch by epoch (Optuna's intermediate values; nothing is pruned: ``_prune_rule``)."""
    from probe.results import EpochReport
    from probe.train import train_probe

    results = []
    for r, d in enumerate(data):
        def beat(report: EpochReport, r: int = r) -> list[int]:
            if tick is not None:
                tick(f"batch of {len(hparams)}: replicate {r + 1}/{len(data)}, epoch "
                     f"{report.epoch}/{probe_config.epochs}")
            return []

        results.append(train_probe(d, probe_config, settings.loss, hparams, callback=beat,
                                   progress=False))
    merged = mean_over_replicates(results, settings.select)
    n = len(merged.trials)
    for e in range(max((len(t.epochs) for t in merged.trials), default=0)):
        vals = [t.epochs[e]["val_map"] if e < len(t.epochs) else None for t in merged.trials]
        on_epoch(EpochReport(epoch=e + 1, train_loss=[None] * n, val_map=vals,
                             test_map=[None] * n, active=[v is not None for v in vals]))
    return merged


def _result_rows(study: optuna.Study, trials: list, result: Any, states: list[str],
                 seconds: float) -> list[dict[str, Any]]:
    """The batch's rows in the tidy schema (studies.results): each trial's outcome with the
    settings it trained with, read from the probe run itself."""
    rows = probe_rows(result.to_dict(), kind="study", study=study.study_name,
                      numbers=[t.number for t in trials], states=states,
                      params=[t.params for t in trials],
                      extra={"worker": f"{socket.gethostname()}:{os.getpid()}",
                             "seconds": seconds, "provenance": result.source})
    for row in rows:
        if row["state"] == "FAIL":
            row["value"] = None
    return rows


def run_worker(
    settings: StudySettings, *, log: Callable[[str], None] | None = None
) -> StudySummary:
    """Work on the study until ``n_trials`` trials have finished (completed or pruned).

    Progress goes to stderr as one study-level display (:func:`_study_progress`), its first
    line before the features load; it also prints each finished trial's line (``log`` gets
    those instead when the display is off: ``SPML_PROGRESS=off``)."""
    from probe.data import resolve_device
    from probe.selection import selection_data

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = open_study_store(settings.store)
    study, space, storage = create_or_join(settings, store)
    results_dir = Path(settings.out) / "results"
    fixed_dists = dict(space.distributions)
    with _study_progress(study, settings) as bar:
        for note in space.notes:
            bar.write(note)
            if log is not None and bar.mode == "off":
                log(note)
        selection = Selection.parse(settings.select)
        bar.write(f"loading the features of {settings.store} ({store.n_rows} rows)"
                  + (f"; --select {selection}: {selection.replicates} replicates, each trial "
                     "trained on all and scored by the mean (no pruning)"
                     if selection.replicates > 1 else ""))
        data = selection_data(store, selection, device=resolve_device(settings.device),
                              observed_seed=settings.observed_seed, priors=settings.priors)
        _work(settings, study, space, storage, data, results_dir, fixed_dists, bar, log)
    return summarize(study, settings)


def _study_progress(study: optuna.Study, settings: StudySettings) -> Any:
    """The study's one progress display: trials finished of ``n_trials`` (this and every other
    worker's), pruned and failed, the best val mAP so far, elapsed and ETA; a bar on a
    terminal, plain lines in a log (one at once, then as trials finish and every ~10 s)."""
    from probe.progress import Progress

    counts = _counts(study)
    done = min(counts[TrialState.COMPLETE] + counts[TrialState.PRUNED], settings.n_trials)
    bar = Progress(settings.n_trials, f"study {study.study_name}", "trials", initial=done,
                   heartbeat=True)  # a batch may train for minutes: a line every ~10 s anyway
    bar.set_postfix(_status(study, counts))
    return bar


def _status(study: optuna.Study, counts: dict[TrialState, int]) -> str:
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    best = max(complete, key=lambda t: (t.value, -t.number)) if complete else None
    text = (f"{counts[TrialState.PRUNED]} pruned, {counts[TrialState.FAIL]} failed"
            + (f", {counts[TrialState.RUNNING]} running" if counts[TrialState.RUNNING] else ""))
    if best is not None:
        text += f", best val mAP {best.value:.2f} (trial {best.number})"
    return text


def _work(settings: StudySettings, study: optuna.Study, space: SearchSpace, storage: Any,
          data: Any, results_dir: Path, fixed_dists: dict, bar: Any,
          log: Callable[[str], None] | None = None) -> None:
    """The worker loop: ask a batch, train it stacked, tell it, until the study is done."""
    from probe.config import ProbeConfig

    def say(line: str) -> None:
        bar.write(line)  # above the bar on a terminal, a plain line in a log
        if log is not None and bar.mode == "off":
            log(line)
    while True:
        # retrying dead workers' trials, counting and asking under one lock: workers started
        # together never overshoot, and a retry is enqueued before anyone can take its room
        with ask_lock(settings.storage_spec(), study.study_name):
            reclaim_stale_trials(study, storage, settings.grace_seconds)
            counts = _counts(study)
            finished = counts[TrialState.COMPLETE] + counts[TrialState.PRUNED]
            if finished >= settings.n_trials or (
                settings.sampler == "grid" and _grid_exhausted(study)
            ):
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
            key = (
                train_part.get("batch_size", settings.batch_size),
                train_part.get("epochs", settings.epochs),
            )
            groups.setdefault(key, []).append(trial)
        rows = []
        try:
            for (batch_size, epochs), group in groups.items():
                cfg = ProbeConfig(
                    batch_size=batch_size,
                    epochs=epochs,
                    lr=settings.lr,
                    seed=settings.train_seed,
                    val_labels=settings.val_labels,
                    observed_seed=settings.observed_seed,
                    device=settings.device,
                    priors=settings.priors,
                )
                rows += _train_group(settings, data, study, storage, space, group, cfg, say,
                                     tick=functools.partial(_tick, bar, status))
        except BaseException as err:
            abandon(study, storage, trials, err)
            raise
        finally:  # what was told to the storage is in the results too
            write_batch(results_dir, rows)


def _tick(bar: Any, status: str, detail: str = "") -> None:
    """The study's display within a batch: its status, where the batch stands (``detail``,
    e.g. "batch of 16: epoch 3/8"), shown now if ~10 s have passed since the last line."""
    bar.set_postfix(f"{status}; {detail}" if detail else status)
    bar.refresh()


def _grid_exhausted(study: optuna.Study) -> bool:
    sampler = study.sampler
    return isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(study)


def summarize(study: optuna.Study, settings: StudySettings) -> StudySummary:
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = max(complete, key=lambda t: (t.value, -t.number)) if complete else None
    paper = [t for t in complete if t.user_attrs.get("spml:paper")]
    return StudySummary(
        name=study.study_name,
        storage=settings.storage_spec().display,
        out=str(settings.out),
        n_complete=len(complete),
        n_pruned=sum(t.state == TrialState.PRUNED for t in trials),
        n_failed=sum(t.state == TrialState.FAIL for t in trials),
        best_value=best.value if best else None,
        best_params=dict(best.params) if best else {},
        best_trial=best.number if best else None,
        paper_value=paper[0].value if paper else None,
        n_best_at_last=count_best_is_last([_curve(t) for t in complete]),
    )


def _curve(trial: optuna.trial.FrozenTrial) -> list[float | None]:
    """A trial's val mAP per reported epoch, in order (its intermediate values)."""
    steps = trial.intermediate_values
    return [steps[k] for k in sorted(steps)]


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


def run_study(
    settings: StudySettings,
    *,
    worker_command: Sequence[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> StudySummary:
    """Run a study: in this process (``workers == 1``) or in ``workers`` local processes, each
    running ``worker_command`` (the same ``spml study`` command with ``--workers 1``); with
    ``devices``, worker ``i`` gets ``--devices devices[i]`` (one worker per GPU)."""
    settings.validate()
    store = open_study_store(settings.store)
    preflight(settings, store)  # every input checked before the storage is created
    check_writable(settings)
    if settings.workers == 1:
        with _write_errors(settings):
            return run_worker(settings, log=log)
    if worker_command is None:
        raise StudyError("several workers need the command that starts one worker")
    space = create_or_join(settings, store).space  # create once, before the workers race
    for note in space.notes:
        if log is not None:
            log(note)
    per_worker = [["--devices", d] for d in settings.devices] or [[]] * settings.workers
    cores = available_cores()
    if settings.workers > cores and log is not None:
        log(f"warning: --workers {settings.workers} on {cores} CPU cores: the workers share "
            "the cores, one thread each, and the study takes longer than with "
            f"--workers {cores}")
    env = worker_env(settings.workers, cores)
    procs = [subprocess.Popen([*worker_command, *extra], env=env) for extra in per_worker]
    codes = [p.wait() for p in procs]
    storage = open_storage(settings.storage_spec())
    study = optuna.load_study(study_name=settings.name or _default_name(settings), storage=storage)
    summary = summarize(study, settings)
    if summary.n_complete + summary.n_pruned < settings.n_trials:
        raise StudyError(
            f"the workers stopped (exit codes {codes}) with only "
            f"{summary.n_complete + summary.n_pruned} of {settings.n_trials} trials finished; "
            "run the same command again to finish the study"
        )
    return summary


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_threads(workers: int, cores: int) -> int:
    """Threads per worker process: the cores shared out, at least one (N workers that each
    keep torch's full thread count oversubscribe the cores and run slower than one)."""
    return max(1, cores // max(workers, 1))


def worker_env(workers: int, cores: int | None = None,
               base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a local worker process starts with: ``base`` (this process's) with
    the thread count of :func:`worker_threads` for torch (OpenMP) and the BLAS libraries."""
    env = dict(os.environ if base is None else base)
    n = worker_threads(workers, available_cores() if cores is None else cores)
    env.update(dict.fromkeys(THREAD_VARS, str(n)))
    return env


def open_study_store(path: str) -> Any:
    """The study's feature store, opened read-only; a missing path says so (never a write
    error), naming the flag and how to make one."""
    from probe.store import StoreNotFoundError, open_store

    try:
        return open_store(path)
    except StoreNotFoundError:
        raise StudyError(
            f"STORE: no store at {path}; pass a feature store made by 'spml featurize' or "
            f"'spml import' (e.g. 'spml import yeast --out {shlex.quote(str(path))}')") from None


def check_writable(settings: StudySettings) -> None:
    """Refuse, before anything is written, an ``--out`` (or storage file) that cannot be made
    or written, naming the real cause (:func:`probe.io.check_writable`)."""
    from probe.io import check_writable as check

    check(Path(settings.out) / "results", "--out")
    spec = settings.storage_spec()
    if spec.kind != "postgresql":
        check(Path(spec.target), "--storage" if settings.storage else "--out")


def _default_name(settings: StudySettings) -> str:
    from probe.store import open_store

    return f"{open_store(settings.store).dataset}-{settings.loss}"
