"""Trials: which configurations one probe run stacks, and the loss objects that compute them.

A *trial* is one configuration: a seed (init + batch order), a learning rate and weight decay,
and the loss's hyperparameters. :func:`plan_trials` turns what the caller gave (a loss name or
object, one dict or a list of dicts, the config's seeds) into a :class:`TrialPlan`: every
trial's full settings resolved (:mod:`probe.engine.config`) and checked before anything trains.
Trials that share one seed share their batch order and one loss object whose float hyperparameters
are ``(T,)`` tensors -- also when each trains on its own observed-label draw, if the loss declares
:attr:`~probe.losses.Loss.stacks_draws` (its targets are then ``(T, B, C)``). Trials with
different seeds have their own batch orders; they too share one loss object if the loss declares
:attr:`~probe.losses.Loss.stacks_seeds` (its batch rows are then ``(T, B)``). Otherwise each
trial gets a loss object of its own (:class:`LossGroup`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from probe import losses as _losses
from probe.engine.config import (
    ProbeConfig,
    ProbeConfigError,
    TrainingSettings,
    check_dataset_classes,
    loss_hparams,
    resolve_training,
)
from probe.engine.data import ProbeData, positions_by_fold
from probe.losses import Loss

__all__ = ["LossGroup", "TrialPlan", "expand_grid", "one_loss_object", "plan_trials"]


def expand_grid(values: dict[str, Sequence[Any]], zip_: bool = False) -> list[dict[str, Any]]:
    """Trials from per-key value lists: the Cartesian product over keys (first key slowest), or
    with ``zip_`` the i-th values together (lists of length 1 repeat). Used by ``--set``."""
    keys = list(values)
    lists = [list(values[k]) for k in keys]
    if zip_:
        lengths = {len(v) for v in lists if len(v) != 1}
        if len(lengths) > 1:
            raise ProbeConfigError(
                "--zip needs every value list to have the same length (or length 1); got "
                + ", ".join(f"{k}: {len(v)}" for k, v in zip(keys, lists)))
        n = lengths.pop() if lengths else 1
        return [{k: (v[0] if len(v) == 1 else v[i]) for k, v in zip(keys, lists)}
                for i in range(n)]
    return [dict(zip(keys, combo)) for combo in itertools.product(*lists)]


@dataclass
class TrialPlan:
    """Every trial of a run, resolved and checked; nothing allocated yet."""

    cls: type[Loss]
    seeds: list[int]
    lr: list[float]
    weight_decay: list[float]
    hparams: list[dict[str, Any]]  # each trial's full loss hyperparameters
    losses: list[Loss]  # one object for all trials (shared seed), else one per trial
    training: TrainingSettings
    notes: list[str]

    given: bool = False  # the caller passed a Loss object (it is never rebuilt or split)
    prior: Any = None  # the train rows' prior the loss reads (probe.store.priors.Prior), or None
    # per-trial observed-label draws: trial t trains on draws[draw_index[t]] (None: every trial
    # trains on the data's own train_observed); the draws are held once on the device
    draw_index: list[int] | None = None
    # per-trial folds (train rows of their own, probe.engine.data.stack_folds): trial t trains
    # on fold fold_index[t], whose train block starts at row fold_index[t] * fold_rows of the
    # data's train_x; its targets are draw draw_index[t] (the fold's). None: one train split
    fold_index: list[int] | None = None
    fold_rows: int = 0

    @property
    def n(self) -> int:
        return len(self.seeds)

    def subset(self, trials: range) -> TrialPlan:
        """The plan of the trials ``trials`` (a contiguous range) alone: their settings, and
        for a shared seed a fresh loss object of their hyperparameters (each trial computes
        exactly what it computes stacked with the others: probe.engine.train's docstring)."""
        if self.given:
            if len(trials) != self.n:
                raise ProbeConfigError("a plan made from a given Loss object cannot be split")
            return self
        sl = slice(trials.start, trials.stop)
        losses = [_build_loss(self.cls, self.hparams[sl])] if self.shared else self.losses[sl]
        index = None if self.draw_index is None else self.draw_index[sl]
        folds = None if self.fold_index is None else self.fold_index[sl]
        return replace(self, losses=losses, draw_index=index, fold_index=folds,
                       **{f: getattr(self, f)[sl] for f in
                          ("seeds", "lr", "weight_decay", "hparams")})

    @property
    def shared(self) -> bool:
        """One loss object for all trials (:func:`one_loss_object`): they share one seed, or
        the loss stacks per-trial seeds (:attr:`Loss.stacks_seeds`); and they train on one set
        of targets, or the loss stacks per-trial draws. It says nothing about the targets or
        the batches: :attr:`stacked_draws` tells whether each trial has its own draw,
        :attr:`one_order` whether the trials share one batch. Otherwise one loss object per
        trial, each gathering its own batch (even where the trials' seeds agree)."""
        return one_loss_object(self.cls, self.seeds, self.draw_index, self.given,
                               folds=self.fold_index is not None)

    @property
    def stacked_draws(self) -> bool:
        """One shared loss object whose trials train on their own draws: its targets are
        ``(T, B, C)`` per step and ``(T, N, C)`` at setup (:attr:`Loss.stacks_draws`)."""
        return self.shared and self.draw_index is not None

    @property
    def one_order(self) -> bool:
        """All trials visit the train rows in one batch order (they share one seed)."""
        return len(set(self.seeds)) == 1

    @property
    def one_batch(self) -> bool:
        """One loss object over one batch order on one train split: each step gathers one
        ``(B, D+1)`` batch for every trial (``x @ W``), not one per trial (``bmm``)."""
        return self.shared and self.one_order and self.fold_index is None


def one_loss_object(cls: type[Loss], seeds: Sequence[int], draw_index: Sequence[int] | None,
                    given: bool, *, folds: bool = False) -> bool:
    """Whether the trials run through one loss object: a given object always (it was set up by
    the caller, for one seed and one set of targets, on one train split); otherwise they share
    a seed on one train split, or the loss declares :attr:`~probe.losses.Loss.stacks_seeds`
    (each trial's own batch rows; per-trial ``folds`` also need it not to read the train
    features, which differ by fold), and they train on one set of targets or the loss
    declares :attr:`~probe.losses.Loss.stacks_draws`."""
    if given:
        return len(set(seeds)) == 1 and draw_index is None and not folds
    if folds and cls.needs_features:
        return False
    if (len(set(seeds)) != 1 or folds) and not cls.stacks_seeds:
        return False
    return draw_index is None or cls.stacks_draws


@dataclass
class LossGroup:
    """One loss object, the trials (along T) it computes, and its own trainable tensors."""

    loss: Loss
    trials: slice
    extra: list[tuple[nn.Parameter, float]]
    # the group's train targets (N, C): a view, never a copy (None for one object over
    # per-trial draws: the trainer gathers each step's (T, B, C) from the draws)
    targets: Tensor | None = None


def plan_trials(data: ProbeData, config: ProbeConfig, loss: Loss | str,
                hparams: dict[str, Any] | Sequence[dict[str, Any]] | None,
                draw_index: Sequence[int] | None = None, n_draws: int = 0,
                folds: Sequence[ProbeData] | None = None) -> TrialPlan:
    """Resolve the run's trials (see :func:`probe.train_probe` for what may be given).
    ``folds``: the run's folds (``data`` is then :func:`probe.engine.data.stack_folds` of them
    and ``draw_index`` each trial's fold); hyperparameters the data decides are each trial's
    fold's."""
    given: Loss | None = None
    if isinstance(loss, Loss):
        if hparams is not None:
            raise ProbeConfigError(
                "hparams must be None when a Loss object is passed (its hyperparameters are "
                "already set); pass the loss by name to give hyperparameters")
        given, cls = loss, type(loss)
        hparams = [{} for _ in range(loss.n_trials or 1)]
    elif isinstance(loss, str):
        if loss == "knn":
            raise ProbeConfigError("'knn' is not a trained loss; use probe.knn.run_knn")
        cls = _losses.get_loss_class(loss)
    else:
        raise ProbeConfigError(f"loss must be a registry name or a Loss; got {type(loss).__name__}")
    dataset = data.dataset
    training = resolve_training(cls, dataset, batch_size=config.batch_size, lr=config.lr,
                                epochs=config.epochs, use_presets=config.use_presets)
    if config.use_presets and (cls.presets.get(dataset) or cls.train_presets.get(dataset)):
        check_dataset_classes(dataset, data.n_classes, f"the {cls.name} paper presets")
    seeds, trials, lrs, wds = _normalise_trials(hparams, config, training.lr)
    index = _check_draw_index(draw_index, n_draws, len(seeds),
                              "draw" if folds is None else "fold")
    if index is not None and len(seeds) == 1 and len(index) > 1:
        # one trial, several draws: that trial on each draw
        seeds, trials, lrs, wds = (v * len(index) for v in (seeds, trials, lrs, wds))
    shared = one_loss_object(cls, seeds, index, given is not None, folds=folds is not None)
    notes: list[str] = []
    if given is not None:
        if not shared:
            raise ProbeConfigError(
                "per-trial seeds, draws or folds need one loss object per trial; pass the loss "
                "by name")
        values = given.hparams_dict()  # stacked hyperparameters come back as per-trial lists
        merged = [{k: (v[t] if isinstance(v, list) else v) for k, v in values.items()}
                  for t in range(len(seeds))]
        objects = [given]
    else:
        merged, notes = _resolve_hparams(cls, trials, data, config, folds, index)
        objects = [_build_loss(cls, merged)] if shared else [_build_loss(cls, [m]) for m in merged]
    if training.batch_size > data.n_train:
        raise ProbeConfigError(
            f"batch size {training.batch_size} ({training.sources['batch_size']}) is larger "
            f"than the train split ({data.n_train} rows); use a batch size of at most "
            f"{data.n_train}")
    return TrialPlan(cls, seeds, lrs, wds, merged, objects, training, notes, given is not None,
                     prior=train_prior(cls, config, data), draw_index=index,
                     fold_index=None if folds is None else index,
                     fold_rows=0 if folds is None else int(folds[0].train_x.shape[0]))


def _resolve_hparams(cls: type[Loss], trials: list[dict[str, Any]], data: ProbeData,
                     config: ProbeConfig, folds: Sequence[ProbeData] | None,
                     index: list[int] | None) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`probe.engine.config.loss_hparams` of the trials: on ``data``, or with folds on
    each trial's fold (a value the data decides, such as EPR's k from the val rows, is the
    fold's own)."""
    preset = data.dataset if config.use_presets else None
    if folds is None or index is None:
        return loss_hparams(cls, trials, data.dataset, data.n_classes,
                            data.val_label_cardinality, preset=preset)
    merged: list[dict[str, Any]] = [{} for _ in trials]
    notes: list[str] = []
    for k, mine in sorted(positions_by_fold(index).items()):
        values, said = loss_hparams(cls, [trials[t] for t in mine], data.dataset, data.n_classes,
                                    folds[k].val_label_cardinality, preset=preset)
        for t, v in zip(mine, values):
            merged[t] = v
        for note in said:
            note = note if len(folds) == 1 else f"fold {k}: {note}"
            if note not in notes:
                notes.append(note)
    return merged, notes


def _check_draw_index(draw_index: Sequence[int] | None, n_draws: int, n_trials: int,
                      what: str = "draw") -> list[int] | None:
    """``draw_index`` (``what`` "fold": ``fold_index``) as a list of ints, checked against the
    draws (folds) given and the trials."""
    arg = f"{what}_index"
    if draw_index is None:
        if n_draws:
            raise ProbeConfigError(
                f"{what}s: {n_draws} {what}s were given without {arg}; pass {arg} (the "
                f"{what} each trial trains on) or leave {what}s out")
        return None
    index = [int(i) for i in draw_index]
    if not index:
        raise ProbeConfigError(f"{arg} is empty: give one {what} number per trial")
    bad = [i for i in index if not 0 <= i < n_draws]
    if bad:
        raise ProbeConfigError(
            f"{arg}: {bad[0]} is not a {what} number; expected 0..{n_draws - 1} (one per "
            f"{what} given)")
    if n_trials > 1 and len(index) != n_trials:
        raise ProbeConfigError(
            f"{arg} has {len(index)} entries for {n_trials} trials; give one per trial")
    return index


def train_prior(cls: type[Loss], config: ProbeConfig, data: ProbeData) -> Any:
    """``data.train_prior`` for a loss that declares one (``Loss.prior``; docs/priors.md), checked
    against ``config.priors`` (:func:`check_prior_request`) and the prior the data carries."""
    name = config.priors
    check_prior_request(cls, name)
    if cls.prior is None:
        return None
    prior = data.train_prior
    if prior is None or prior.name != name:
        have = "none" if prior is None else f"'{prior.name}'"
        raise ProbeConfigError(
            f"{cls.name}: --priors is '{name}' but the data carries prior {have}; "
            f"load it with probe.load_store(store, priors='{name}')")
    return prior


def check_prior_request(cls: type[Loss], name: str | None) -> None:
    """Refuse a prior for a loss that uses none, and a loss that needs one without it."""
    if cls.prior is None:
        if name is not None:
            raise ProbeConfigError(f"{cls.name} uses no prior, but --priors {name} was given; "
                                   "drop --priors, or choose a loss that uses one (vlpl, gpr)")
        return
    if name is None:
        raise ProbeConfigError(
            f"{cls.name} needs a prior ({cls.prior}): pass --priors NAME "
            "naming one of the store's priors ('spml info STORE' lists them; 'spml import "
            "priors' adds one)")


def setup_loss_groups(plan: TrialPlan, train_y: Tensor, device: Any,
                      features: Tensor | Sequence[Tensor] | None = None) -> list[LossGroup]:
    """Move the loss objects to ``device``, run their ``setup`` (per-example state over the
    train split) and seed their own randomness; check the tensors they train. ``train_y`` is
    (N, C), or (K, N, C) draws when the plan has per-trial draws (trial t: its draw_index):
    a per-trial object is set up with its draw (N, C), a shared one (:attr:`TrialPlan.
    stacked_draws`) with every trial's (T, N, C) and keeps no group targets (the trainer
    gathers each step's (T, B, C) from the draws).
    ``features``: the train rows' features (N, D), unflipped, no bias column, for a loss that
    reads them (``Loss.needs_features``: handed over as float32 after ``set_prior``); with
    per-trial folds one such tensor per fold, and each object gets its trial's fold's."""
    groups = []
    for i, obj in enumerate(plan.losses):
        obj.to(device)
        span = slice(0, plan.n) if plan.shared else slice(i, i + 1)
        k = span.stop - span.start
        if plan.draw_index is None:
            targets, setup_y = train_y, train_y
        elif plan.shared:  # one object, every trial on its own draw
            targets = None
            setup_y = train_y[torch.tensor(plan.draw_index, device=train_y.device)]
        else:
            targets = setup_y = train_y[plan.draw_index[i]]  # a view of the trial's draw
        obj.setup(setup_y, n_epochs=plan.training.epochs, n_trials=k)
        if plan.prior is not None:  # the train rows' prior, shared by the stacked trials
            put = functools.partial(torch.as_tensor, dtype=torch.float32, device=device)
            obj.set_prior(put(plan.prior.scores), {k: put(v) for k, v in plan.prior.extras.items()})
            mode = getattr(obj, "prior_mode", None)  # which mode ran (GPR with/without DAMP)
            note = f"{plan.cls.name} read prior {plan.prior.name!r}: {mode}"
            if mode and note not in plan.notes:
                plan.notes.append(note)
        if obj.needs_features:
            if features is None:
                raise ProbeConfigError(f"{plan.cls.name} reads the train features; this "
                                       "caller of setup_loss_groups passed none")
            own = features
            if not isinstance(own, Tensor):  # one per fold: this object's trial's
                own = own[(plan.fold_index or [0])[span.start]]
            obj.set_features(own.float())
        obj.manual_seed(plan.seeds[span])
        extra = list(obj.extra_parameters())
        for p, _ in extra:
            if p.ndim == 0 or p.shape[0] != k or not p.is_contiguous():
                raise ProbeConfigError(
                    f"{plan.cls.name}: extra_parameters() must return contiguous tensors with a "
                    f"leading trial axis of {k}; got shape {tuple(p.shape)}")
        groups.append(LossGroup(obj, span, extra, targets))
    return groups


def _normalise_trials(hparams: dict | Sequence[dict] | None, config: ProbeConfig, lr: float
                      ) -> tuple[list[int], list[dict[str, Any]], list[float], list[float]]:
    """``(seeds, loss hparams, lr, weight decay)`` per trial: one trial repeats over several
    seeds, one seed covers every trial; per-trial ``lr`` / ``weight_decay`` are taken out."""
    if hparams is None:
        given = [{}]
    elif isinstance(hparams, dict):  # one trial
        given = [hparams]
    else:
        given = hparams
    trials = [dict(h) for h in given]  # copies: the lr / weight_decay are popped below
    if not trials:
        raise ProbeConfigError("hparams is an empty list: give at least one trial")
    seeds = list(config.seeds) if config.seeds is not None else [config.seed]
    if len(trials) == 1 and len(seeds) > 1:
        trials = trials * len(seeds)
    elif len(seeds) == 1:
        seeds = seeds * len(trials)
    elif len(seeds) != len(trials):
        raise ProbeConfigError(
            f"{len(trials)} hyperparameter trials but {len(seeds)} seeds: give one seed per "
            "trial, a single seed, or a single trial")
    lrs = [t.pop("lr", lr) for t in trials]
    wds = [t.pop("weight_decay", config.weight_decay) for t in trials]
    for t_lr, t_wd in zip(lrs, wds):
        for name, v in (("lr", t_lr), ("weight_decay", t_wd)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or (
                v < 0 or (name == "lr" and v == 0)):
                want = "positive" if name == "lr" else "non-negative"
                raise ProbeConfigError(f"trial setting '{name}' must be a {want} number; got {v!r}")
    return seeds, trials, [float(v) for v in lrs], [float(v) for v in wds]


def _build_loss(cls: type[Loss], merged: list[dict[str, Any]]) -> Loss:
    """One loss object for these trials: float hyperparameters that differ become ``(T,)``
    tensors; structural ones (bool/int/choice) must agree."""
    specs = {s.name: s for s in cls.hparam_specs}
    values: dict[str, Any] = {}
    for name in specs:
        vals = [m[name] for m in merged]
        if all(v == vals[0] for v in vals):
            values[name] = vals[0]
        elif specs[name].stackable:
            values[name] = torch.tensor(vals, dtype=torch.float32)
        else:
            raise ProbeConfigError(
                f"{cls.name}: '{name}' is a structural ({specs[name].kind}) hyperparameter and "
                f"must be the same for every stacked trial; got {vals}. Run one probe per value")
    return cls(**values)
