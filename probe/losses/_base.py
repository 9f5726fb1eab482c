"""The contract every SPML loss follows (``docs/losses.md`` "Conventions"): the :class:`Loss`
base class and the registry (built-ins and plugins). Every loss exists as a pure function
(validating its inputs, then calling an unchecked core) and as a registered :class:`Loss`
(validating once, before training, then calling the same core without host synchronisation).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from probe.registry import PluginFailure, Registry

from ._hparams import (
    HParam,
    LossContractError,
    LossInputError,
    LossOutput,
    check_hparams,
    hp,
    mean_bc,
    promote,
)

__all__ = ["REGISTRY", "EntrywiseLoss", "Loss", "available", "create_loss", "flat_rows",
           "get_loss_class", "loss_origin", "per_trial_rows", "plugin_failures", "register",
           "trial_rows"]


class Loss(nn.Module):
    """Base class of a registered loss: the contract every loss -- built-in or plugin -- keeps.
    A subclass sets the class attributes below, implements :meth:`forward` and is registered
    with :func:`register`, which checks them. What each attribute declares and the hooks in the
    trainer's order: ``docs/plugins.md`` "The contract"; ``trial_state`` (``()``: no per-trial
    state, ``None``: a stopped trial stays in the stack, frozen): "Pruning"; ``prior`` (None, or
    what it reads from a store's ``priors/<name>``, handed over once by :meth:`set_prior`):
    "Reading a prior"; ``needs_features`` (True: the trainer hands the train split's features
    ``(N_train, D)`` float32 -- the unflipped rows, no bias column -- to :meth:`set_features`
    once, after ``setup`` and ``set_prior``; SMILE's label-enhancement networks read them).

    ``forward(logits, observed, index=None) -> LossOutput`` takes ``(T, B, C)`` (or ``(B, C)``)
    logits, ``(B, C)`` int8 labels of -1/0/1 and the batch's train rows; it returns the ``(T,)``
    (or scalar) loss and its named parts, without synchronising with the host (no ``.item()``,
    ``bool(tensor)``, ``nonzero``): the inputs were validated before training. Hyperparameters
    are read with :meth:`hparam` and viewed with :func:`hp`; half-precision logits are promoted
    (:func:`promote`).

    ``stacks_draws`` (default False) declares that stacked trials may each train on their own
    observed labels: :meth:`forward` accepts ``observed`` of shape ``(T, B, C)`` (trial t's own
    targets, with ``(T, B, C)`` logits) and :meth:`setup` accepts ``(T, N_train, C)`` (trial
    t's own draw), and trial t then computes exactly what it computes alone on ``observed[t]``.
    The trainer then runs trials that share a seed but differ in their draw through one loss
    object (one call per step); a loss that does not declare it gets one object per trial
    (correct, slower). Per-example state derived from the observed labels must then be per
    trial: :meth:`per_example` and :meth:`observed_state` keep it so.

    ``stacks_seeds`` (default False; needs ``stacks_draws``) declares that stacked trials may
    each have their own seed, hence their own batch: :meth:`forward` then gets ``index`` of
    shape ``(T, B)`` (trial t's batch rows) with ``(T, B, C)`` observed labels, and
    :meth:`manual_seed` one seed per trial; trial t computes exactly what it computes alone.
    Per-example state read through :meth:`state_rows` follows a ``(T, B)`` index by itself; a
    loss that writes per-example state by ``index`` must handle the trial axis before declaring
    it. The trainer then runs trials with different seeds (``spml study confirm``) through one
    loss object (one call per step) instead of one object per trial.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    formula: ClassVar[str] = ""
    hparam_specs: ClassVar[tuple[HParam, ...]] = ()
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    train_presets: ClassVar[dict[str, dict[str, Any]]] = {}
    stateful: ClassVar[bool] = False
    needs_epoch_pass: ClassVar[bool] = False
    notes: ClassVar[str] = ""
    trial_state: ClassVar[tuple[str, ...] | None] = ()
    host_per_step: ClassVar[bool] = False
    # bumped when what the loss computes changes: results (table cells) trained with another
    # version are not reused
    version: ClassVar[str] = "1"
    prior: ClassVar[str | None] = None
    needs_features: ClassVar[bool] = False
    # forward takes (T, B, C) observed and setup (T, N, C): one object for per-trial draws
    stacks_draws: ClassVar[bool] = False
    # forward also takes a (T, B) index (each trial's own batch): one object for per-trial seeds
    stacks_seeds: ClassVar[bool] = False

    def __init__(self, **hparams: Any) -> None:
        super().__init__()
        values = check_hparams(self.hparam_specs, hparams, self.name)
        t_sizes = {v.shape[0] for v in values.values() if isinstance(v, Tensor) and v.ndim == 1}
        if len(t_sizes) > 1:
            raise LossInputError(
                f"{self.name}: per-trial hyperparameters must all have the same length T; got "
                f"lengths {sorted(t_sizes)}")
        self.n_trials: int | None = t_sizes.pop() if t_sizes else None
        self._hp_names: list[str] = []  # those held as (T,) or 0-d tensor buffers hp_<name>
        self._static: dict[str, Any] = {}  # the others, as Python values
        for name, value in values.items():
            self._keep(name, value)
        self.epoch = 0
        self.n_epochs = 1
        # buffers with a leading trial axis because setup got per-trial draws (observed_state)
        self._draw_state: list[str] = []

    def __repr__(self) -> str:
        """``GR(w_T=..., b_T=..., ..., preset='coco')``: every hyperparameter's value (a
        per-trial one as its list) and the paper preset it started from, if any."""
        values = self.hparams_dict()
        parts = [f"{s.name}={values[s.name]!r}" for s in self.hparam_specs if s.name in values]
        preset = getattr(self, "preset", None)
        if preset is not None:
            parts.append(f"preset={preset!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def hparam(self, name: str) -> Any:
        """The hyperparameter's value: a number, or a ``(T,)`` tensor buffer."""
        if name in self._static:
            return self._static[name]
        return getattr(self, f"hp_{name}")

    def set_hparam(self, name: str, value: Any) -> None:
        """Set a hyperparameter after construction (e.g. the trainer filling EPR's k), validated."""
        value = check_hparams(self.hparam_specs, {name: value}, self.name)[name]  # unknown: a hint
        if isinstance(value, Tensor) and value.ndim == 1 and self.n_trials not in (
                None, value.shape[0]):
            raise LossInputError(f"{self.name}: hyperparameter '{name}' must have shape "
                                 f"({self.n_trials},); got {tuple(value.shape)}")
        self._keep(name, value)

    def _keep(self, name: str, value: Any) -> None:
        if isinstance(value, Tensor):
            self._static.pop(name, None)
            if name in self._hp_names:
                getattr(self, f"hp_{name}").copy_(value)
            else:
                self.register_buffer(f"hp_{name}", value.clone())
                self._hp_names.append(name)
            if value.ndim == 1:
                self.n_trials = value.shape[0]
        else:
            if name in self._hp_names:
                self._hp_names.remove(name)
                delattr(self, f"hp_{name}")
            self._static[name] = value

    def hparams_dict(self) -> dict[str, Any]:
        """All hyperparameters as plain Python values (tensors as lists), e.g. for results JSON."""
        return {**self._static, **{n: getattr(self, f"hp_{n}").tolist() for n in self._hp_names}}

    def setup(self, observed: Tensor, n_epochs: int, n_trials: int | None = None) -> None:
        """Called once before training with the train split's observed labels ``(N, C)`` --
        or, for a loss that :attr:`stacks_draws`, ``(T, N, C)``: trial t's own draw --:
        stateless losses only record ``n_epochs``; stateful ones allocate their state here."""
        if isinstance(observed, Tensor) and observed.ndim == 3:
            if not self.stacks_draws:
                raise LossInputError(
                    f"{self.name}: setup got per-trial observed labels of shape "
                    f"{tuple(observed.shape)} (T, N, C), but this loss does not declare "
                    "stacks_draws; give one (N, C) matrix, one loss object per draw")
            if n_trials is not None and observed.shape[0] != n_trials:
                raise LossInputError(
                    f"{self.name}: setup got {observed.shape[0]} per-trial draws (observed of "
                    f"shape {tuple(observed.shape)}) for {n_trials} trials; give one per trial")
            n_trials = observed.shape[0]
        self._draw_state = []
        if n_trials is not None and self.n_trials is not None and n_trials != self.n_trials:
            raise LossInputError(
                f"{self.name}: the hyperparameters describe {self.n_trials} trials but the "
                f"trainer stacks {n_trials}")
        if n_epochs < 1:
            raise LossInputError(f"{self.name}: n_epochs must be >= 1; got {n_epochs}")
        self.n_epochs = int(n_epochs)
        if n_trials is not None:
            self.n_trials = n_trials

    def set_prior(self, scores: Tensor, extras: dict[str, Tensor] | None = None) -> None:
        """Receive the train split's prior once, after :meth:`setup`: ``scores`` ``(N_train,
        C)`` float32 in the train rows' order, ``extras`` further ``(N_train, C)`` arrays by
        name. Losses with :attr:`prior` set override this (``probe.losses.PriorMixin``)."""
        raise LossInputError(
            f"{self.name}: this loss uses no prior (per-image class scores); drop --priors "
            "or choose a loss that uses one (vlpl, gpr)")

    def set_features(self, train_x: Tensor) -> None:
        """Receive the train split's features once, after :meth:`setup` (and
        :meth:`set_prior`): ``(N_train, D)`` float32 on the loss's device, the unflipped rows
        in the train rows' order, without the bias column. Losses with :attr:`needs_features`
        override this."""
        raise LossInputError(
            f"{self.name}: this loss reads no features (needs_features is False)")

    def start_epoch(self, epoch: int) -> None:
        """Called at the start of every epoch (0-indexed); schedules update here."""
        self.epoch = int(epoch)

    def end_epoch(self, epoch: int, logits: Tensor | None = None) -> None:
        """Called after every epoch (0-indexed). ``logits``: ``(T, N_train, C)`` when
        :attr:`needs_epoch_pass` (the unflipped train features through the current head, no
        grad), with T = 1 for an unstacked loss."""

    def epoch_logits(self, logits: Tensor | None, shape: tuple[int, ...]) -> Tensor:
        """:meth:`end_epoch`'s ``logits``, refused unless of the train split's ``shape``."""
        if logits is None or tuple(logits.shape) != tuple(shape):
            raise LossInputError(
                f"{self.name}: end_epoch needs the train split's logits of shape {tuple(shape)} "
                f"(T, N_train, C); got {None if logits is None else tuple(logits.shape)}")
        return logits

    def state(self, name: str) -> Tensor:
        """Per-example state ``name`` allocated by :meth:`setup`; a clear error before setup."""
        value = getattr(self, name, None)
        if value is None:
            raise LossInputError(
                f"{self.name}: call setup(observed_train, n_epochs) before the first forward "
                f"(the loss keeps per-example state '{name}' over the train split)")
        return value

    def per_example(self, name: str, observed: Tensor, fill: Any, dtype: torch.dtype) -> None:
        """Register state ``name`` ``(T, N_train, C)`` filled with ``fill``, in :meth:`setup`
        (``observed`` ``(N, C)``, or per-trial draws ``(T, N, C)``)."""
        shape = observed.shape[-2:]
        self.register_buffer(name, torch.full((self.n_trials or 1, *shape), fill,
                                              dtype=dtype, device=observed.device))

    def observed_state(self, name: str, value: Tensor, observed: Tensor,
                       per_trial: bool | None = None) -> None:
        """Register ``value``, derived from :meth:`setup`'s ``observed`` row by row, as the
        non-persistent buffer ``name``. With per-trial draws (``observed`` ``(T, N, C)``) its
        leading axis is the trial axis, and :meth:`select_trials` keeps the kept trials' rows;
        with one ``(N, C)`` matrix it is shared by the trials as it stands. ``per_trial``:
        whether ``value`` has the trial axis, where that is not ``observed``'s (None)."""
        self.register_buffer(name, value, persistent=False)
        if per_trial is None:
            per_trial = observed.ndim == 3
        if per_trial and name not in self._draw_state:
            self._draw_state.append(name)
        elif not per_trial and name in self._draw_state:
            self._draw_state.remove(name)

    def trial_view(self, value: Tensor) -> Tensor:
        """``value`` registered by :meth:`observed_state` with a leading trial axis: as it is
        for per-trial draws, else with a trial axis of 1 in front (broadcast over trials)."""
        return value if value.ndim == 3 else value.unsqueeze(0)

    def state_rows(self, name: str, index: Tensor | None, z: Tensor, why: str) -> Tensor:
        """The batch's rows ``index`` of state ``name``: ``(T, B, C)`` for stacked logits ``z``,
        else trial 0's ``(B, C)``; refused without ``index`` (``why``: what it looks up). A
        ``(T, B)`` index (each trial's own batch, :attr:`stacks_seeds`) takes trial t's rows
        ``index[t]`` of its own state ``state[t]``."""
        if index is None:
            raise LossInputError(f"{self.name}: pass index= (the batch's row numbers in the "
                                 f"train split) to forward to {why}")
        state = self.state(name)
        if index.ndim == 2:
            return per_trial_rows(state, index)
        return state[:, index] if z.ndim == 3 else state[0, index]

    def manual_seed(self, seeds: list[int]) -> None:
        """Seed the loss's own randomness, one seed per trial (vPU's MixUp draws λ).

        Trial t must draw exactly what an unstacked loss seeded with ``seeds[t]`` draws, so a
        stacked run equals T separate runs. Deterministic losses ignore this."""

    def extra_parameters(self) -> list[tuple[nn.Parameter, float]]:
        """Trainable tensors the loss owns, with their learning-rate multiplier (ROLE's Θ)."""
        return []

    @property
    def can_select_trials(self) -> bool:
        return self.trial_state is not None

    def select_trials(self, keep: list[int]) -> None:
        """Keep only the stacked trials ``keep`` (positions along T, increasing), in place:
        the (T,) hyperparameters and the per-trial state named by :attr:`trial_state` keep
        those rows, so each kept trial continues exactly as before (a pruned trial leaves the
        stacked model). Parameters are replaced by new ``nn.Parameter`` objects: read
        :meth:`extra_parameters` again afterwards."""
        if self.trial_state is None:
            raise LossInputError(f"{self.name}: select_trials is not supported by this loss")
        n = self.n_trials
        if n is None or not keep or any(not 0 <= k < n for k in keep) or sorted(set(keep)) != list(
                keep):
            raise LossInputError(
                f"{self.name}: select_trials needs increasing trial positions in [0, {n}); got "
                f"{list(keep)}")
        for name in self._hp_names:
            value = getattr(self, f"hp_{name}")
            if value.ndim == 1:
                setattr(self, f"hp_{name}", trial_rows(value, keep))
        for name in self.trial_state:
            value = getattr(self, name, None)
            if isinstance(value, nn.Parameter):
                setattr(self, name, nn.Parameter(trial_rows(value.data, keep),
                                                 requires_grad=value.requires_grad))
            elif isinstance(value, Tensor):
                setattr(self, name, trial_rows(value, keep))
        for name in self._draw_state:  # state of per-trial draws (observed_state)
            setattr(self, name, trial_rows(getattr(self, name), keep))
        self.n_trials = len(keep)

    @classmethod
    def describe(cls) -> str:
        """A human-readable card: paper, formula, defaults, searchable ranges, presets, notes."""
        lines = [f"{cls.name} — {cls.paper}", "", cls.formula.strip(), "", "hyperparameters:"]
        width = max((len(s.name) for s in cls.hparam_specs), default=4)
        for s in cls.hparam_specs:
            search = ""
            if s.search is not None:
                search = f"  search [{s.search[0]:g}, {s.search[1]:g}]"
                if s.log:
                    search += " log"
            if s.requires:
                search += f"  (with {s.requires}=True)"
            default = "(from the dataset)" if s.default is None else repr(s.default)
            lines.append(
                f"  {s.name:<{width}}  default {default:<10} valid {s.range_text():<14}{search}"
                f"  — {s.doc}")
        if not cls.hparam_specs:
            lines.append("  (none)")
        if cls.presets or cls.train_presets:
            lines += ["", "paper presets per dataset:"]
            for ds in sorted(set(cls.presets) | set(cls.train_presets)):
                vals = {**cls.train_presets.get(ds, {}), **cls.presets.get(ds, {})}
                lines.append(f"  {ds}: " + ", ".join(f"{k}={v}" for k, v in vals.items()))
        if cls.prior:
            lines += ["", f"prior: {cls.prior} (spml probe --priors NAME; docs/priors.md)"]
        if cls.stateful:
            lines += ["", "stateful: keeps per-example state over the train split"]
        if cls.notes:
            lines += ["", "notes: " + cls.notes.strip()]
        return "\n".join(lines)


class EntrywiseLoss(Loss):
    """A stateless loss whose value is a per-entry term reduced by the mean over B·C: subclasses
    define ``_entries(z, y) -> (…, B, C)`` on promoted logits (``self._h(name, z)`` views a
    hyperparameter for broadcasting), or set ``entries = staticmethod(fn)`` for a function
    ``fn(z, y, *hparams)`` taking the views in ``hparam_specs`` order."""

    trial_state = ()
    entries: ClassVar[Any] = None

    def _h(self, name: str, z: Tensor) -> Any:
        return hp(self.hparam(name), z)

    def _entries(self, z: Tensor, y: Tensor) -> Tensor:
        if self.entries is None:
            raise TypeError(f"{type(self).__name__} must define _entries(z, y)")
        return self.entries(z, y, **{s.name: self._h(s.name, z) for s in self.hparam_specs})

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        return LossOutput(mean_bc(self._entries(z, observed)), {})


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED = {"knn": "the training-free kNN baseline of spml probe"}
# hooks that keep state over training: a loss defining one must declare its trial_state
_STATE_HOOKS = ("setup", "end_epoch", "manual_seed", "extra_parameters", "set_features")


def trial_rows(value: Tensor, keep: list[int]) -> Tensor:
    """Rows ``keep`` (distinct, increasing) of ``value``'s leading (trial) axis as a contiguous
    tensor; ``value`` itself when every row is kept. Shared by the losses', the optimizer's and
    the trainer's select_trials."""
    if len(keep) == value.shape[0]:
        return value
    return value[torch.tensor(keep, device=value.device)].contiguous()


def per_trial_rows(values: Tensor, index: Tensor, of: Tensor | None = None) -> Tensor:
    """Trial t's rows ``index[t]`` of ``values[of[t]]`` (``of`` None: of ``values[t]``), as
    ``(T, B, ...)`` from ``values`` ``(K, N, ...)`` and ``index`` ``(T, B)``: one
    ``index_select`` over the flattened leading axes (differentiable; no host
    synchronisation, so a CUDA graph captures it). Shared by :meth:`Loss.state_rows` and the
    trainer's per-trial targets."""
    rows = flat_rows(index, values.shape[1], of)
    picked = values.flatten(0, 1).index_select(0, rows)
    return picked.view(*index.shape, *values.shape[2:])


def flat_rows(index: Tensor, n: int, of: Tensor | None = None) -> Tensor:
    """``(T·B,)`` row numbers in a ``(K, N, ...)`` tensor flattened to ``(K·N, ...)`` of trial
    t's rows ``index[t]`` of slice ``of[t]`` (``of`` None: slice t); the index that
    :func:`per_trial_rows` reads and a per-trial state update writes through."""
    if of is None:
        of = torch.arange(index.shape[0], device=index.device)
    return (of.view(-1, 1) * n + index).reshape(-1)


def _check_contract(cls: Any) -> None:
    """Refuse a class that breaks the :class:`Loss` contract, naming what to declare."""
    what = getattr(cls, "__qualname__", repr(cls))
    if not (isinstance(cls, type) and issubclass(cls, Loss)):
        raise LossContractError(f"register: {what} must be a subclass of probe.losses.Loss")
    name = cls.name
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise LossContractError(
            f"register: {what}.name must be the loss's registry name, letters, digits and '_' "
            f"(e.g. 'my_loss'); got {name!r}")
    if name in _RESERVED:
        raise LossContractError(f"register: {what}.name '{name}' is reserved for "
                                f"{_RESERVED[name]}; choose another name")
    if cls.forward is nn.Module.forward:
        raise LossContractError(f"register: loss '{name}' ({what}) defines no forward(logits, "
                                "observed, index=None) -> LossOutput")
    specs = cls.hparam_specs
    if not isinstance(specs, tuple) or not all(isinstance(s, HParam) for s in specs):
        raise LossContractError(f"register: loss '{name}': hparam_specs must be a tuple of "
                                f"HParam; got {specs!r}")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise LossContractError(f"register: loss '{name}': hparam_specs name a parameter twice "
                                f"({names})")
    for dataset, values in cls.presets.items():
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise LossContractError(f"register: loss '{name}': presets['{dataset}'] sets "
                                    f"{unknown}, which are not in hparam_specs ({names})")
    if cls.stacks_seeds and not cls.stacks_draws:
        raise LossContractError(
            f"register: loss '{name}' ({what}) sets stacks_seeds but not stacks_draws: trials "
            "with their own batches also have their own (T, B, C) targets; declare both")
    if cls.needs_features and cls.set_features is Loss.set_features:
        raise LossContractError(
            f"register: loss '{name}' ({what}) sets needs_features but defines no "
            "set_features(train_x), which receives them")
    ts = cls.trial_state
    if ts is not None and not (isinstance(ts, tuple) and all(isinstance(t, str) for t in ts)):
        raise LossContractError(f"register: loss '{name}': trial_state must be a tuple of "
                                f"buffer/parameter names, () or None; got {ts!r}")
    hooks = [h for h in _STATE_HOOKS if getattr(cls, h) is not getattr(Loss, h)]
    flags = [f for f in ("stateful", "needs_epoch_pass") if getattr(cls, f)]
    declares = any("trial_state" in vars(k) for k in cls.__mro__  # not only the library's bases
                   if k not in (Loss, EntrywiseLoss) and issubclass(k, Loss))
    if (hooks or flags) and not declares:
        why = ", ".join([f"{f}=True" for f in flags] + [f"defines {h}()" for h in hooks])
        raise LossContractError(
            f"register: loss '{name}' ({what}) may keep state over training ({why}) but "
            "declares no trial_state, so the trainer cannot know how to remove a pruned trial; "
            "declare trial_state = (the names of its buffers/parameters with a leading trial "
            "axis), trial_state = () if none of its state is per trial, or trial_state = None "
            "to keep stopped trials frozen in the stack")


def register(cls: type[Loss]) -> type[Loss]:
    """Class decorator: register a :class:`Loss` under ``cls.name`` (the name in docs/losses.md).

    Checks the contract (:class:`Loss`) and refuses a name already taken, naming both classes
    (:class:`LossContractError`)."""
    _check_registrable(cls)
    REGISTRY.add(cls.name, cls)
    return cls


def _check_registrable(cls: Any) -> None:
    """The contract :func:`register` checks: :class:`Loss`'s attributes and hooks, and the
    prior contract (docs/plugins.md "Reading a prior")."""
    _check_contract(cls)
    # the prior contract (probe.losses.PriorMixin, docs/plugins.md "Reading a prior")
    mixin = callable(getattr(cls, "prior_rows", None)) and callable(
        getattr(cls, "prior_ready", None))
    if cls.prior is not None and not mixin:
        raise LossContractError(
            f"register: loss '{cls.name}' sets prior = {cls.prior!r} but does not derive from "
            "probe.losses.PriorMixin, which keeps the prior and gathers a batch's rows; declare "
            f"class {cls.__name__}(PriorMixin)")
    if mixin:
        if not isinstance(cls.prior, str) or not cls.prior.strip():
            raise LossContractError(
                f"register: loss '{cls.name}' derives from PriorMixin but sets no prior; set "
                "prior = 'what it reads' (e.g. 'class scores'), or derive from Loss")
        extras = [*cls.prior_extras, *cls.prior_optional]
        if len(set(extras)) != len(extras) or not all(
                isinstance(k, str) and _NAME.fullmatch(k) and k != "scores" for k in extras):
            raise LossContractError(
                f"register: loss '{cls.name}': prior_extras and prior_optional must be distinct "
                f"names of letters, digits and '_', other than 'scores'; got {extras}")


def _adopt_plugin(name: str, obj: Any) -> type[Loss]:
    """What a loss entry point names, checked: a Loss subclass whose ``name`` is the entry
    point's name (registered by :meth:`Registry.load_entry_point` after this)."""
    if not isinstance(obj, type):
        raise LossContractError(
            f"the entry point must name a Loss subclass ('module:Class'); it names "
            f"{type(obj).__name__} {obj!r}")
    if getattr(obj, "name", None) != name:
        raise LossContractError(
            f"the entry point's name '{name}' must be the loss's name; "
            f"{obj.__qualname__}.name is {getattr(obj, 'name', None)!r}")
    _check_registrable(obj)
    return obj


#: every loss by name: the built-ins (each module's ``@register``), the user's own
#: (``@register`` in their code) and the plugins of ``spml_probe.losses`` (probe.registry)
REGISTRY: Registry[type[Loss]] = Registry(
    "loss", "spml_probe.losses", builtin="the built-in loss",
    builtin_modules=("probe.losses.",), adopt=_adopt_plugin,
    form="one Loss subclass as 'module:Class'", taken_error=LossContractError,
    unknown_error=LossInputError)


def plugin_failures() -> list[PluginFailure]:
    """The loss plugins that failed to load in this process (``PluginFailure``: entry point,
    distribution, error), after loading every plugin."""
    return REGISTRY.failures()


def loss_origin(name: str) -> str:
    """Where the registered loss ``name`` comes from: ``"the built-in loss"``, ``"plugin 'x' of
    distribution 'y 1.0'"`` or ``"module m"`` (a class registered by the user's own code)."""
    return REGISTRY.origin(name)


def available() -> list[str]:
    """Names of all registered losses (built-in and every plugin that loads), sorted."""
    return sorted(REGISTRY.names())


def get_loss_class(name: str) -> type[Loss]:
    """The registered class for ``name``: a built-in or registered loss without reading any
    plugin, else the plugin whose entry point has that name (imported on this first use).
    Unknown names get the closest suggestion, and a name whose plugin failed to load gets that
    plugin's error."""
    return REGISTRY.get(name)


def create_loss(name: str, preset: str | None = None, **hparams: Any) -> Loss:
    """Build a registered loss. ``preset`` (e.g. ``"coco"``) starts from the paper's values for
    that dataset; explicit ``hparams`` override them."""
    cls = get_loss_class(name)
    if preset is not None and preset not in cls.presets:
        raise LossInputError(
            f"{name}: no paper preset for dataset '{preset}' (presets: "
            f"{', '.join(sorted(cls.presets)) or 'none'})")
    values = dict(cls.presets[preset]) if preset is not None else {}
    values.update(hparams)  # explicit values override the preset's
    loss = cls(**values)
    loss.preset = preset  # shown by its repr
    return loss
