"""Creating or joining a study: its identity (loss, store, search space, fixed settings) stored
with it, its sampler and pruner, and the refusals to add trials to a study made with other
settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import optuna
from optuna.distributions import distribution_to_json
from optuna.trial import TrialState

from probe.evaluation.selection import Selection
from probe.store.protocol import PROTOCOL_SEED
from studies.results.rows import MADE_ATTR
from studies.study.heartbeat import TrialStorage
from studies.study.pruning import MedianRule
from studies.study.settings import StudySettings, preflight, resolve_study_name, study_search_space
from studies.study.space import SearchSpace
from studies.study.storage import PAPER_ATTR, StudyError, ask_lock, open_storage

__all__ = ["TRAINING_KEYS", "WORKER_INDEX_ENV", "JoinedStudy", "create_or_join", "sampler_seed",
           "training_identity"]

# what a study is, stored with it, and how a refusal names each part
_IDENTITY = {"spml.loss": "loss", "spml.store": "store", "spml.space": "search space",
             "spml.fixed": "fixed hyperparameters (--set)"}


#: the environment variable that numbers a study's local worker processes (0, 1, …)
WORKER_INDEX_ENV = "SPML_WORKER_INDEX"


def sampler_seed(seed: int, told: int, worker: int) -> int:
    """The sampler's seed for a process that joins a study holding ``told`` trials, as worker
    ``worker``: ``seed`` itself for the first process of a new study (a fresh study is
    reproducible from its seed), else a seed mixed from all three. A process that resumes or
    extends a study, or a second worker, must not replay the sequence another process already
    sampled from the same seed (it would repeat its parameters trial for trial)."""
    if told == 0 and worker == 0:
        return int(seed)
    text = f"{int(seed)}:{int(told)}:{int(worker)}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little") & 0x7FFFFFFF


def _sampler(settings: StudySettings, seed: int | None = None) -> optuna.samplers.BaseSampler:
    seed = settings.seed if seed is None else seed
    if settings.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True, multivariate=True)
    if settings.sampler == "grid":
        return _AskTellGridSampler({k: list(v) for k, v in settings.grid.items()}, seed=seed)
    return {"gp": optuna.samplers.GPSampler, "cmaes": optuna.samplers.CmaEsSampler,
            "random": optuna.samplers.RandomSampler}[settings.sampler](seed=seed)


def _worker_index() -> int:
    text = os.environ.get(WORKER_INDEX_ENV, "0")
    return int(text) if text.isdigit() else 0


def _reseeded(study: optuna.Study, settings: StudySettings, told: int | None = None
              ) -> optuna.Study:
    """The study with its sampler seeded for this process (:func:`sampler_seed`): by the
    trials the storage holds when it joins (``told``; a study this process made: 0), and by
    its worker index."""
    if settings.sampler == "grid":
        # the grid's order is shuffled by the seed and its cells are handed out by trial number
        # and by what the storage holds: a reseeded grid would reorder the cells under the
        # trials already told (and repeat them), while the grid itself never repeats a cell
        return study
    if told is None:
        told = len(study.get_trials(deepcopy=False))
    seed = sampler_seed(settings.seed, told, _worker_index())
    if seed != settings.seed:
        study.sampler = _sampler(settings, seed)
    return study


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler calls ``study.stop()`` after the last point, which only works
    inside ``study.optimize``; with ask/tell the worker loop checks ``is_exhausted`` itself."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def prune_rule(settings: StudySettings) -> MedianRule | None:
    """The pruning rule (None: never prune); decided in process by :class:`BatchPruner`."""
    if settings.pruner == "none" or Selection.parse(settings.select).replicates > 1:
        return None  # with replicates a trial's curve is known only after all of them
    # steps are epochs counted from 1: the first epoch is never pruned
    return MedianRule(n_startup_trials=max(2, settings.batch // 2), n_warmup_steps=2)


class JoinedStudy(NamedTuple):
    """What :func:`create_or_join` opened: the study, its search space, and its trials in the
    storage object it opened (for heartbeats and failure reasons, through Optuna's public
    storage API)."""

    study: optuna.Study
    space: SearchSpace
    trials: TrialStorage


def paper_point(space: SearchSpace, settings: StudySettings, store: Any) -> dict[str, Any]:
    """The study's first trial: the space's paper values (the loss's preset for the store's
    dataset, else its defaults), with every value the loss derives from the data (e.g. GPR's
    and EPR's ``k``, :data:`probe.losses.DATA_QUANTITIES`) filled exactly as ``spml probe``
    fills it (:func:`probe.engine.config.loss_hparams`, the val split's label cardinality)."""
    from probe.engine.config import TRAINER_KEYS, loss_hparams
    from probe.losses import get_loss_class

    point = dict(space.defaults)
    prefix = f"{settings.loss}."
    missing = [k for k in space.distributions if k.startswith(prefix) and k not in point]
    if not missing:
        return point
    import torch

    cls = get_loss_class(settings.loss)

    def val_cardinality() -> float:  # as probe.engine.data.ProbeData.val_label_cardinality
        return float(torch.from_numpy(store.labels(store.split("val"))).float().sum(1).mean())

    fixed = {k: v for k, v in settings.fixed.items() if k not in TRAINER_KEYS}
    (values,), _ = loss_hparams(cls, [fixed], store.dataset, store.n_classes, val_cardinality,
                                preset=store.dataset)
    for key in missing:
        value, dist = values.get(key[len(prefix):]), space.distributions[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if getattr(dist, "low", value) <= value <= getattr(dist, "high", value):
            point[key] = float(value) if isinstance(dist, optuna.distributions.FloatDistribution) \
                else value
    return point


def create_or_join(settings: StudySettings, store: Any,
                   space: SearchSpace | None = None) -> JoinedStudy:
    """Create the study (enqueueing the paper point) or join an existing one with the same loss,
    store and space; refuse, saying why, when they differ. ``space``: what :func:`preflight`
    returned for these settings and store when the caller has checked them (they are checked
    once per study); without it they are checked here."""
    if space is None:
        space = preflight(settings, store)
    spec = settings.storage_spec()
    storage = open_storage(spec)
    name = resolve_study_name(settings, store.dataset)
    if settings.search_lr is None and "train.lr" in space.distributions and \
            name in optuna.get_all_study_names(storage):
        made = optuna.load_study(study_name=name, storage=storage).user_attrs.get("spml.space")
        if made is not None and "train.lr" not in made:
            # a study made before the lr was searched by default: the same command continues
            # it with its fixed lr
            settings = dataclasses.replace(settings, search_lr=False)
            space = dataclasses.replace(study_search_space(settings, store.dataset), notes=(
                f"study '{name}' was made with a fixed lr: continued with it (not searched)",))
    identity = json.loads(json.dumps({
        # the fixed training settings first: whoever sees the other keys sees these too
        "spml.training": training_identity(asdict(settings), store.dataset, space),
        "spml.loss": settings.loss,
        "spml.store": store.identity(),  # the one "same store" rule (probe.store)
        "spml.space": {k: json.loads(distribution_to_json(d))
                       for k, d in space.distributions.items()},
        "spml.fixed": dict(sorted(settings.fixed.items())),
    }, default=str))
    sampler, rule = _sampler(settings), prune_rule(settings)
    # the Optuna pruner the study is created with: the rule BatchPruner applies
    pruner = optuna.pruners.NopPruner() if rule is None else rule.optuna()

    def load_or_create(load: bool) -> optuna.Study:
        if load:
            return optuna.load_study(storage=storage, study_name=name, sampler=sampler,
                                     pruner=pruner)
        return optuna.create_study(storage=storage, study_name=name, sampler=sampler,
                                   pruner=pruner, direction="maximize")

    try:
        study = load_or_create(False)
    except optuna.exceptions.DuplicatedStudyError:
        study = _reseeded(load_or_create(True), settings)
        if _nothing_measured(study) and _identity_differs(study, identity):
            # a start that failed before measuring anything is not a study to protect: the
            # corrected command replaces it (and its failed trials' rows) -- under the ask
            # lock, checked again there, so that two machines starting it at once replace it
            # once and the second joins the first's new study
            with ask_lock(spec, name):
                study = load_or_create(True)
                if _nothing_measured(study) and _identity_differs(study, identity):
                    optuna.delete_study(study_name=name, storage=storage)
                    _drop_rows(Path(settings.out) / "results", name)
                    study = load_or_create(False)
                    space = dataclasses.replace(space, notes=(*space.notes, (
                        f"study '{name}' in {spec.display} held only failed trials, made with "
                        "other settings; replaced by this command's study")))
                    _label_new(study, identity, settings, space, store)
                    return JoinedStudy(study, space, TrialStorage(storage, name))
    else:
        _label_new(study, identity, settings, space, store)
        return JoinedStudy(_reseeded(study, settings, told=0), space,
                           TrialStorage(storage, name))
    attrs = _wait_for_identity(study)
    for key, what in _IDENTITY.items():
        if attrs.get(key) != identity[key]:
            raise StudyError(
                f"study '{name}' in {spec.display} exists with a different {what}: it has "
                f"{json.dumps(attrs.get(key))}, this command asks for "
                f"{json.dumps(identity[key])}. Use another --name, or the same settings to join it"
            )
    _check_training(attrs, identity["spml.training"], store.dataset, space, name, spec.display)
    return JoinedStudy(study, space, TrialStorage(storage, name))


def _label_new(study: optuna.Study, identity: dict[str, Any], settings: StudySettings,
               space: SearchSpace, store: Any) -> None:
    """A new study's identity and settings, then its paper point enqueued. ``spml.made`` (a
    random id) comes first: the tag of the heads its trials keep (studies.results.rows.study_tag)
    then differs from a study of the same name and settings made in another storage, or made
    again after its storage was deleted, that keeps heads in the same folder."""
    study.set_user_attr(MADE_ATTR, uuid.uuid4().hex)
    for key, value in identity.items():
        study.set_user_attr(key, value)
    study.set_user_attr("spml.settings",
                        json.loads(json.dumps(settings_dict(settings), default=str)))
    point = paper_point(space, settings, store)
    if settings.enqueue_paper and point and settings.sampler != "grid":
        study.enqueue_trial(point, user_attrs={PAPER_ATTR: True})


def _nothing_measured(study: optuna.Study) -> bool:
    """No trial of the study completed, was pruned or is running: at most failed trials and
    the enqueued paper point are there (a start that failed)."""
    return all(t.state in (TrialState.FAIL, TrialState.WAITING)
               for t in study.get_trials(deepcopy=False))


def _identity_differs(study: optuna.Study, identity: dict[str, Any]) -> bool:
    attrs = study.user_attrs
    return any(attrs.get(k) != identity[k] for k in (*_IDENTITY, "spml.training")
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
                 "val_labels", "select", "priors")


def training_identity(values: dict[str, Any], dataset: str, space: SearchSpace
                      ) -> dict[str, Any]:
    """The fixed training settings of a study, resolved as the trials train with them (a value
    left to the loss's paper preset is the preset's value), from :class:`StudySettings` fields
    (``values``: ``asdict(settings)`` or the ``spml.settings`` a study stored). A setting the
    study searches is ``"searched"``: its value is a trial parameter."""
    from probe.engine.config import ProbeConfig, resolve_training
    from probe.losses import get_loss_class

    try:
        cls = get_loss_class(values["loss"])
    except (KeyError, ValueError):
        cls = None
    resolved = resolve_training(cls, dataset, batch_size=values.get("batch_size"),
                                lr=values.get("lr"), epochs=values.get("epochs")).to_dict()
    given = {**{k: resolved[k] for k in ("epochs", "batch_size", "lr")},
             "optimizer": values.get("optimizer") or ProbeConfig().optimizer,
             "train_seed": values.get("train_seed", 0),
             "observed_seed": values.get("observed_seed", PROTOCOL_SEED),
             "val_labels": values.get("val_labels") or "clean",
             "select": str(Selection.parse(values.get("select") or "val")),
             # the store prior a loss reads (None: none); a study made before priors has no
             # such key and is not compared
             "priors": values.get("priors")}
    return {k: "searched" if f"train.{k}" in space.distributions else given[k]
            for k in TRAINING_KEYS}


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
        if all(k in attrs for k in _IDENTITY) or time.time() > deadline:
            return attrs
        time.sleep(0.2)


def settings_dict(settings: StudySettings) -> dict[str, Any]:
    """The settings as the study records them (``spml.settings``; the --space ranges as JSON)."""
    return {**asdict(settings), "space": {k: json.loads(distribution_to_json(v))
                                          for k, v in settings.space.items()}}
