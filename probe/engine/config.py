"""Training settings: the one place that decides what a run trains with.

:class:`ProbeConfig` holds a probe run's settings; :func:`resolve_training` turns "not given"
into the value a run uses (the loss's paper preset for the dataset, else the generic Cole et al.
setting), for the probe and the fine-tune alike; :func:`loss_hparams` resolves a trial's loss
hyperparameters (defaults < paper preset < given, then the values the dataset decides).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from probe.engine.optim import OPTIMIZERS
from probe.errors import SpmlError, is_int, plain
from probe.losses import HParam, Loss, check_hparam, check_hparams
from probe.losses.assume_negative import EXPECTED_POSITIVES
from probe.store.protocol import DATASET_CLASSES, PROTOCOL_SEED

__all__ = ["CONFIG_FLAGS", "GENERIC_FINETUNE", "GENERIC_TRAINING", "TRAINER_KEYS", "ProbeConfig",
           "ProbeConfigError", "TrainingSettings", "check_dataset_classes", "loss_hparams",
           "resolve_training"]

#: trial keys that belong to the trainer, not the loss (per-trial learning rate / weight decay)
TRAINER_KEYS = ("lr", "weight_decay")
#: Cole et al.'s ``linear_fixed_features`` setting (elijahcole/single-positive-multi-label):
#: Adam, 25 epochs, bs 8, lr 1e-4 (their search's pick for AN-LS on every dataset); the probe's
#: setting where neither the run nor the loss's ``train_presets`` give a value.
GENERIC_TRAINING: dict[str, Any] = {"batch_size": 8, "lr": 1e-4, "epochs": 25}
#: The fine-tune's setting for a (loss, dataset) pair without paper values in
#: ``train_presets``: Cole et al.'s end-to-end runs are 10 epochs with Adam (their train.py),
#: and bs 8 / lr 1e-5 is the end-to-end setting GR (VOC) and EM (VOC) report.
GENERIC_FINETUNE: dict[str, Any] = {"batch_size": 8, "lr": 1e-5, "epochs": 10}
_GENERIC = {"probe": (GENERIC_TRAINING, "generic (Cole et al. linear probe)"),
            "finetune": (GENERIC_FINETUNE, "generic (Cole et al. end-to-end fine-tune)")}


#: The ``spml probe`` flag that sets each :class:`ProbeConfig` field: errors name the flag a
#: user types, never the field (a field without a flag is named as is).
CONFIG_FLAGS: dict[str, str] = {
    "batch_size": "--batch-size", "lr": "--lr", "epochs": "--epochs",
    "weight_decay": "--weight-decay", "optimizer": "--optimizer", "momentum": "--momentum",
    "seed": "--seed", "seeds": "--trials-seeds", "flip": "--no-flip", "labels": "--labels",
    "val_labels": "--val-labels", "observed_seed": "--observed-seed", "device": "--device",
    "eval_every": "--eval-every", "test_curve": "--test-curve", "eval_init": "--eval-init",
    "test_intervals": "--intervals", "drop_last": "--no-drop-last",
    "use_presets": "--no-presets", "cuda_graph": "--cuda-graph", "priors": "--priors",
    "compile": "--compile",
}


_PAPER = " (or left out for the loss's paper setting)"
_BOOL = "true or false"
#: ProbeConfig.validate's checks, in order: field, whether a value is valid, what it must be
_CHECKS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("batch_size", lambda v: v is None or is_int(v, 1), "a positive integer" + _PAPER),
    ("epochs", lambda v: v is None or is_int(v, 1), "a positive integer" + _PAPER),
    ("lr", lambda v: v is None or (isinstance(v, int | float) and 0 < v < math.inf),
     "a positive number" + _PAPER),
    ("weight_decay", lambda v: 0 <= v < math.inf, "a number >= 0"),
    ("optimizer", lambda v: v in OPTIMIZERS, f"one of {', '.join(OPTIMIZERS)}"),
    ("momentum", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("labels", lambda v: v in ("observed", "full"),
     "'observed' (single positives) or 'full' (oracle)"),
    ("val_labels", lambda v: v in ("clean", "observed"),
     "'clean' (full labels) or 'observed' (single positives)"),
    ("eval_every", lambda v: is_int(v, 0), "an integer >= 0 (0 = never evaluate)"),
    ("test_curve", lambda v: isinstance(v, bool), _BOOL),
    ("eval_init", lambda v: isinstance(v, bool), _BOOL),
    ("test_intervals", lambda v: is_int(v, 0), ">= 0 (an integer: bootstrap resamples; 0 = none)"),
    ("cuda_graph", lambda v: v is None or isinstance(v, bool),
     "unset (wherever the step can be captured), " + _BOOL),
    ("compile", lambda v: isinstance(v, bool), _BOOL),
    ("f1_threshold", lambda v: 0 < v < 1, "a probability in (0, 1)"),
    ("seeds", lambda v: v is None or len(v) > 0, "a non-empty comma list of integers"),
)


class ProbeConfigError(SpmlError):
    """Bad probe settings or inputs, reported before training starts."""


@dataclass(frozen=True)
class ProbeConfig:
    """Training settings of a probe run (the loss and its hyperparameters are passed apart).

    ``None`` means "the loss's paper value for the store's dataset (``train_presets``), else
    :data:`GENERIC_TRAINING`" (:func:`resolve_training`).
    """

    batch_size: int | None = None  # paper preset, else 8 (Cole et al.'s linear-probe pick)
    lr: float | None = None  # paper preset, else 1e-4 (Cole et al.'s linear-probe pick)
    epochs: int | None = None  # paper preset, else 25 (Cole et al.'s linear_fixed_features)
    weight_decay: float = 0.0  # no SPML paper decays the head's weights
    optimizer: str = "adam"  # every SPML paper trains with Adam
    momentum: float = 0.9  # SGD only: the customary value
    betas: tuple[float, float] = (0.9, 0.999)  # torch.optim.Adam's defaults, used by the papers
    eps: float = 1e-8  # torch.optim.Adam's default
    seed: int = 0  # init + batch order of every trial when `seeds` is not given
    seeds: tuple[int, ...] | None = None  # one seed per trial (equal seeds share batch order)
    flip: bool = True  # docs/protocol.md step 6: random horizontal flip, if the store has flips
    labels: str = "observed"  # train on the single positives; "full" = the full-label oracle
    val_labels: str = "clean"  # docs/protocol.md step 4: val is clean by default; or "observed"
    observed_seed: int = PROTOCOL_SEED  # docs/protocol.md step 2: the literature's draw
    device: str = "auto"  # CUDA when available, else CPU
    eval_every: int = 1  # evaluate every epoch (best-epoch selection); 0 = never (benchmarks)
    test_curve: bool = False  # also measure test every evaluated epoch (same reported figures)
    eval_init: bool = False  # also evaluate the untrained heads (TrialResult.init)
    test_intervals: int = 0  # bootstrap resamples for a 95% interval of each trial's test mAP
    # (probe.evaluation.intervals); 0 = none (`spml probe` asks for 1000)
    drop_last: bool = True  # Cole et al.'s train DataLoader drops the last partial batch
    use_presets: bool = True  # start from loss.presets[dataset] where the paper gives values
    f1_threshold: float = 0.5  # docs/protocol.md step 5: OF1/CF1 at probability 0.5
    deterministic: bool = True  # CUDA: deterministic kernels so a re-run is bit-for-bit equal
    cuda_graph: bool | None = None  # CUDA: replay the steps as captured CUDA graphs (same heads
    # bit for bit; docs/design.md). None: wherever it can be captured; True: required; False: never
    compile: bool = False  # run the step through torch.compile (inductor) where it can
    # (StackedTrainer.compile_unavailable says why not, and the eager step runs)
    priors: str | None = None  # the store prior a loss with Loss.prior reads (docs/priors.md)

    def validate(self) -> None:
        """Raise :class:`ProbeConfigError` naming the first bad setting."""
        for name, ok, want in _CHECKS:
            if not ok(getattr(self, name)):
                raise ProbeConfigError(f"{CONFIG_FLAGS.get(name, name)} must be {want}; got "
                                       f"{plain(getattr(self, name))}")
        for s in [self.seed, *(self.seeds or ())]:
            if not is_int(s, 0) or s >= 2**32:
                raise ProbeConfigError(f"--seed and --trials-seeds must be integers in [0, 2**32); "
                                       f"got {plain(s)}")


@dataclass(frozen=True)
class TrainingSettings:
    """What a run trains with, and where each value came from (``sources``).

    ``lr`` is the rate of what the run trains: the head's for the probe, the backbone's for the
    fine-tune, whose head trains at ``lr × head_lr_mult``.
    """

    batch_size: int
    lr: float
    epochs: int
    head_lr_mult: float
    sources: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """``batch_size, lr, epochs`` and ``<key>_from`` (what the results files record)."""
        return {"batch_size": self.batch_size, "lr": self.lr, "epochs": self.epochs,
                **{f"{k}_from": v for k, v in self.sources.items()}}


def resolve_training(cls: type[Loss] | None, dataset: str, *, batch_size: int | None = None,
                     lr: float | None = None, epochs: int | None = None, use_presets: bool = True,
                     mode: str = "probe") -> TrainingSettings:
    """Batch size, learning rate and epochs of a run: the given value, else the loss's paper
    preset for ``dataset`` (``cls.train_presets``), else the generic setting of ``mode``
    (:data:`GENERIC_TRAINING` for ``"probe"``, :data:`GENERIC_FINETUNE` for ``"finetune"``).

    The head-lr rule: GR's and LL's released code trains the head at ``head_lr_mult`` (10) ×
    the backbone's rate. The probe trains only the head, so its preset lr is the head's rate;
    the fine-tune keeps the backbone's rate as ``lr`` and applies the multiplier to its head.
    A given lr is used as is (and the fine-tune then trains head and backbone at that rate).
    """
    if mode not in _GENERIC:
        raise ProbeConfigError(f"mode must be one of {list(_GENERIC)}; got {mode!r}")
    generic, generic_from = _GENERIC[mode]
    preset = cls.train_presets.get(dataset, {}) if (cls is not None and use_presets) else {}
    mult = float(preset.get("head_lr_mult", 1)) if lr is None else 1.0
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, value in {"batch_size": batch_size, "lr": lr, "epochs": epochs}.items():
        if value is not None:
            values[key], sources[key] = value, "as given"
        elif key in preset:
            values[key], sources[key] = preset[key], f"{cls.name} paper preset for {dataset}"
        else:
            values[key], sources[key] = generic[key], generic_from
    if mode == "probe" and mult != 1 and lr is None and "lr" in preset:
        backbone = values["lr"]
        values["lr"] = backbone * mult
        sources["lr"] += f" (head rate: {mult:g} × the backbone's {backbone:g})"
    return TrainingSettings(int(values["batch_size"]), float(values["lr"]),
                            int(values["epochs"]), mult if mode == "finetune" else 1.0, sources)


def check_dataset_classes(dataset: str, n_classes: int, what: str) -> None:
    """A store that names a benchmark dataset must have its class count (presets assume it)."""
    known = DATASET_CLASSES.get(dataset)
    if known is not None and known != n_classes:
        raise ProbeConfigError(
            f"the data says dataset '{dataset}' but has {n_classes} classes, while {what} for "
            f"'{dataset}' assume its {known} classes; fix the store's dataset name, or pass "
            "--no-presets and set the values yourself")


def loss_hparams(cls: type[Loss], trials: Sequence[dict[str, Any]], dataset: str, n_classes: int,
                 val_cardinality: Callable[[], float], *,
                 preset: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Each trial's full loss hyperparameters and notes on what the dataset decided.

    Per trial: the signature defaults < the paper preset ``preset`` (a dataset name, or None)
    < the trial's own values, validated. Each value left None whose
    :class:`~probe.losses.HParam` names a ``from_data`` quantity is filled from the data
    (:class:`_DataQuantities`: EPR/ROLE's ``k`` = Cole et al.'s expected positives per image
    for a benchmark dataset, else ``val_cardinality()``, the val split's mean label count).
    """
    base = dict(cls.presets.get(preset, {})) if preset is not None else {}
    merged = [check_hparams(cls.hparam_specs, {**base, **t}, cls.name) for t in trials]
    notes: list[str] = []
    quantities = _DataQuantities(cls.name, dataset, n_classes, val_cardinality)
    for spec in cls.hparam_specs:
        for values in merged:
            if spec.optional and values.get(spec.name) is None:
                if spec.from_data is None:
                    raise ProbeConfigError(
                        f"{cls.name}: hyperparameter '{spec.name}' has no default and cannot be "
                        f"derived from the data; set it (--set {spec.name}=VALUE)")
                values[spec.name], note = quantities.fill(spec)
                if note not in notes:
                    notes.append(note)
            k = values.get(spec.name)
            if (spec.from_data == "expected_positives" and isinstance(k, int | float)
                    and k > n_classes):
                raise ProbeConfigError(
                    f"{cls.name}: {spec.name}={k:g} expected positives per image, but the data "
                    f"has only {n_classes} classes; {spec.name} must be at most the class count")
    return merged, notes


class _DataQuantities:
    """The values of :data:`probe.losses.DATA_QUANTITIES` for one dataset, each computed once,
    and the note that says where a filled value came from."""

    def __init__(self, loss: str, dataset: str, n_classes: int,
                 val_cardinality: Callable[[], float]) -> None:
        self.loss, self.dataset, self.n_classes = loss, dataset, n_classes
        self._read_val = val_cardinality
        self._cache: dict[str, tuple[float, str]] = {}  # quantity -> value, why

    def fill(self, spec: HParam) -> tuple[float, str]:
        """``(value, note)`` for the parameter ``spec`` (its ``from_data``), validated."""
        if spec.from_data not in self._cache:
            self._cache[spec.from_data] = getattr(self, f"_{spec.from_data}")(spec)
        value, why = self._cache[spec.from_data]
        note = f"{spec.name}={value:g} ({why})"
        try:
            value = check_hparam(spec, value, self.loss)
        except SpmlError as err:
            raise ProbeConfigError(
                f"{self.loss}: hyperparameter '{spec.name}' filled from the data "
                f"({spec.from_data}) is not valid: {err}; set it (--set {spec.name}=VALUE)"
            ) from None
        return value, note

    @functools.cached_property
    def _val(self) -> float:
        return round(float(self._read_val()), 6)

    def _expected_positives(self, spec: HParam) -> tuple[float, str]:
        if self.dataset in EXPECTED_POSITIVES:
            check_dataset_classes(self.dataset, self.n_classes,
                                  f"the expected positives {spec.name}")
            return (float(EXPECTED_POSITIVES[self.dataset]),
                    f"expected positives per image, Cole et al., {self.dataset}")
        value = self._val
        if not value > 0:
            raise ProbeConfigError(
                f"{self.loss}: needs {spec.name} (expected positives per image) and the val "
                f"split has no positive label to estimate it from; set it "
                f"(--set {spec.name}=VALUE)")
        return value, "mean label cardinality of the val split"

    def _val_cardinality(self, spec: HParam) -> tuple[float, str]:
        return self._val, "mean label cardinality of the val split"

    def _n_classes(self, spec: HParam) -> tuple[float, str]:
        return float(self.n_classes), "the number of classes"

    def _positive_fraction(self, spec: HParam) -> tuple[float, str]:
        k, why = self._expected_positives(spec)
        return round(k / self.n_classes, 6), f"expected positives / classes; {why}"
