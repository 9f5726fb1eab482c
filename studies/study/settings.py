"""A study's settings and the checks made before anything is written: :class:`StudySettings`
(its own validation), :func:`preflight` (every input against the store), the search space a
study searches, and the refusals of a missing store or an unwritable ``--out``.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.distributions import BaseDistribution

from probe.errors import SpmlError, plain
from probe.evaluation.selection import Selection, SelectionError
from probe.store.protocol import PROTOCOL_SEED
from studies.study.space import SearchSpace, build_space
from studies.study.storage import StorageSpec, StudyError, parse_storage

__all__ = ["PRUNERS", "SAMPLERS", "StudySettings", "check_writable", "lr_unknown",
           "open_study_store", "preflight", "resolve_study_name", "searches_lr",
           "study_search_space"]

SAMPLERS = ("tpe", "gp", "cmaes", "random", "grid")
PRUNERS = ("median", "none")


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
    select: str = "val"  # how a trial is scored: val | cv:K | draws:N (probe.evaluation.selection)
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
        for flag, value, choices in (("--sampler", self.sampler, SAMPLERS),
                                     ("--pruner", self.pruner, PRUNERS)):
            if value not in choices:
                raise StudyError(f"{flag} must be one of {', '.join(choices)}; got {plain(value)}")
        preset = " (or left out for the loss's preset)"
        for flag, v, hint in (("--trials", self.n_trials, ""), ("--trials-at-once", self.batch, ""),
                              ("--workers", self.workers, ""), ("--epochs", self.epochs, preset),
                              ("--batch-size", self.batch_size, preset)):
            if (v is not None or not hint) and not (type(v) is int and v >= 1):
                raise StudyError(f"{flag} must be a positive integer{hint}; got {plain(v)}")
        if self.lr is not None and not (isinstance(self.lr, int | float)
                                        and 0 < self.lr < math.inf):
            raise StudyError(f"--lr must be a positive number; got {plain(self.lr)}")
        for flag, values in (("--epochs-choices", self.epochs_choices),
                             ("--batch-sizes", self.batch_sizes)):
            bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
            if bad:
                raise StudyError(f"{flag} must be positive integers; got {plain(bad[0])} in "
                                 f"{','.join(map(str, values))}")
        if self.sampler == "grid" and not self.grid:
            raise StudyError("--sampler grid needs the grid: --grid gr.b_T=-8,-4,-2 (repeatable)")
        if self.grid and self.sampler != "grid":
            raise StudyError("--grid is only used with --sampler grid")
        if self.grace_seconds <= self.heartbeat_seconds:
            raise StudyError(f"--grace ({self.grace_seconds:g} s) must exceed the heartbeat "
                             f"interval ({self.heartbeat_seconds:g} s), or live trials would be "
                             "taken for dead ones")
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
        if self.workers > 1 and self.storage_spec().kind == "sqlite":
            raise StudyError(
                f"--workers {self.workers} needs storage that several processes can share: an "
                "SQLite file is for one process; use a journal file (--storage study.log) or "
                "PostgreSQL (--storage postgresql://…)"
            )
        # a loss that needs a prior and has none, or a prior for a loss that uses none
        from probe.engine.trials import check_prior_request
        from probe.losses import get_loss_class

        check_prior_request(get_loss_class(self.loss), self.priors)


def study_search_space(settings: StudySettings, dataset: str) -> SearchSpace:
    """The search space a study of ``settings`` on ``dataset`` samples (for the grid sampler:
    the grid's values)."""
    if settings.sampler == "grid":
        from optuna.distributions import CategoricalDistribution

        overrides = {k: CategoricalDistribution(tuple(v)) for k, v in settings.grid.items()}
        space = build_space(settings.loss, dataset, overrides=overrides, only=())
        return SearchSpace(space.loss, overrides if overrides else space.distributions, {})
    space = build_space(settings.loss, dataset, search_lr=searches_lr(settings, dataset),
                        batch_sizes=settings.batch_sizes, epochs=settings.epochs_choices,
                        overrides=settings.space, only=settings.params, fixed=settings.fixed)
    from probe.engine.config import GENERIC_TRAINING

    if settings.search_lr is None and searches_lr(settings, dataset):
        space = dataclasses.replace(space, notes=(
            f"no paper gives {settings.loss}'s learning rate on {dataset}: train.lr is "
            f"searched (log-uniform 1e-5..1e-1; the first trial keeps the generic "
            f"{GENERIC_TRAINING['lr']:g}); "
            "--lr or --no-search-lr fixes it (docs/selection.md)",))
    # --set on a searched parameter fixes it: the search narrows to the others
    names = [n for n in settings.fixed if f"{settings.loss}.{n}" in space.distributions]
    if not names:
        return space
    held = {f"{settings.loss}.{n}" for n in names}
    dists = {k: d for k, d in space.distributions.items() if k not in held}
    if not dists:
        raise StudyError(
            f"--set {', '.join(names)}: fixes every searched parameter, so nothing is left to "
            "search; drop one from --set, or search others (--params, --space, --search-lr)")
    fixed = ",".join(f"{n}={settings.fixed[n]}" for n in names)
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
    from probe.engine.config import TRAINER_KEYS, resolve_training
    from probe.losses import check_hparams, get_loss_class

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
                             f"number; got {plain(v)}")
    seeds = store.observed_seeds()
    if settings.observed_seed not in seeds:
        raise StudyError(
            f"--observed-seed {settings.observed_seed}: {settings.store} has no such "
            f"single-positive draw (it has {', '.join(map(str, seeds))}); add it with 'spml "
            f"draw {settings.store} --seeds {settings.observed_seed}', or pick one it has")
    from probe.devices import resolve_device

    for device in settings.devices or (settings.device,):
        try:
            resolve_device(device)  # "cuda" without a GPU, a typo: refused now
        except SpmlError as err:
            flag = "--devices" if settings.devices else "--device"
            raise StudyError(f"{flag} {device}: {err}") from None
    check_study_prior(settings, store, cls)
    space = study_search_space(settings, store.dataset)
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


def check_study_prior(settings: StudySettings, store: Any, cls: Any) -> None:
    """``--priors NAME``: the store holds it (else "did you mean" the closest name), with the
    extras the loss needs -- refused before anything is written."""
    import difflib

    name = settings.priors
    if name is None:
        return
    have = store.prior_names()
    if name not in have:
        close = difflib.get_close_matches(name, have, n=1)
        hint, held = f"did you mean '{close[0]}'? " if close else "", ", ".join(have) or "none"
        raise StudyError(
            f"--priors {name}: {settings.store} has no prior of that name (it holds {held}); "
            f"{hint}pick one it holds, or add it with 'spml import priors {settings.store} "
            f"--name NAME --from scores.npy' (or 'spml priors')")
    extras = store.attrs.get("priors", {}).get(name, {}).get("extras", [])
    missing = [k for k in getattr(cls, "prior_extras", ()) if k not in extras]
    if missing:
        raise StudyError(
            f"--priors {name}: --loss {settings.loss} needs the prior's extra arrays "
            f"{', '.join(missing)}, which {settings.store}'s prior {name} lacks; store them "
            f"with 'spml import priors {settings.store} --name {name} --extra "
            f"{missing[0]}=FILE --overwrite'")


def lr_unknown(loss: str, dataset: str) -> bool:
    """No paper gives the learning rate of ``loss`` on ``dataset`` (no training preset): the
    generic lr is a guess (docs/selection.md "Stores without a paper preset")."""
    from probe.losses import get_loss_class

    return "lr" not in get_loss_class(loss).train_presets.get(dataset, {})


def searches_lr(settings: StudySettings, dataset: str) -> bool:
    """Whether the study searches ``train.lr``: as asked (``--search-lr`` / ``--no-search-lr``),
    else where the lr is unknown and not given (:func:`lr_unknown`; not with --sampler grid)."""
    if settings.search_lr is not None:
        return settings.search_lr
    return (settings.lr is None and settings.sampler != "grid" and "lr" not in settings.fixed
            and lr_unknown(settings.loss, dataset))


def resolve_study_name(settings: StudySettings, dataset: str) -> str:
    """The study's name: ``--name``, else ``<dataset>-<loss>`` for the store's ``dataset``."""
    return settings.name or f"{dataset}-{settings.loss}"


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
