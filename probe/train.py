"""The probe engine: many linear heads trained at once on device-resident features (issue 5).

docs/design.md "What fast means" / "Many trials at once" / "Semantics are not traded for speed".
One call, :func:`train_probe`, trains T configurations ("trials") of one SPML loss as one
stacked model and evaluates all T×C columns on val and test after every epoch.

Exact semantics (what a trial *is*)
-----------------------------------
Trial ``t`` with seed ``s`` equals this plain PyTorch program, to float tolerance:

* **init**: ``torch.manual_seed(s); head = nn.Linear(D, C)`` -- weight then bias, drawn by
  ``nn.Linear``'s default initialisation from a CPU generator seeded with ``s``
  (:func:`init_head` reproduces those draws bit for bit, without touching the global RNG);
* **batch order and flips**: a second CPU generator ``torch.Generator().manual_seed(s + 2**32)``
  (:data:`ORDER_STREAM_OFFSET`: it never collides with another trial's init stream); every epoch
  draws ``perm = torch.randperm(N_train, generator=g)`` and then, when flip augmentation is on,
  ``coin = torch.randint(0, 2, (N_train,), generator=g)``: the i-th sample of the epoch is train
  row ``perm[i]``, read from the flipped features iff ``coin[i] == 1`` (:func:`epoch_order`);
* **batches**: consecutive slices of ``batch_size`` of that order; the last partial batch is
  dropped when ``drop_last`` (Cole et al.'s train DataLoader does);
* **step**: ``loss = loss_fn(head(x), observed[idx], index=idx)``, ``loss.backward()``,
  ``torch.optim.Adam`` (or SGD) step on the head (weight decay as ``torch.optim``'s L2 term) and
  on the loss's own parameters (``loss.extra_parameters()``, e.g. ROLE's Θ, at ``lr × lr_mult``,
  no weight decay); the loss's hooks ``start_epoch(e)`` before and, when
  ``loss.needs_epoch_pass``, ``end_epoch(e, logits of the unflipped train features)`` after
  every epoch; ``loss.manual_seed([s])`` after ``loss.setup(...)``.

Trials that share a seed share their batch order: the batch is gathered once, ``(B, D+1)``, and
multiplied by the stacked weights ``(T, D+1, C)``; the loss sees logits ``(T, B, C)`` with
per-trial hyperparameters as ``(T,)`` tensors -- the loss contract. Trials with different seeds
gather their own batches ``(T, B, D+1)`` (one ``bmm``) and each trial gets its own loss object
(the contract's ``index`` is one row list per call).

Speed (no semantics traded): the head's gradient skips autograd -- autograd differentiates the
loss w.r.t. the logits only, then ``dW = Xᵀ·dZ`` is one matrix product; the bias is a trailing
ones column of the features (:mod:`probe.data`), so the head is one tensor and Adam is one fused
update; every batch of an epoch is drawn up front and moved to the device once; nothing in an
epoch waits for the device (losses follow the no-host-sync contract, the optimizer's bias
corrections are host arithmetic); on CPU the steps of a small stacked head run on one thread
(``ProbeConfig.step_threads``), since intra-op threading of ~10 tiny ops per step costs more
than it gains. ``torch.compile`` is not used: on the GR loss it saved ~13% of a CPU step for
~30 s of compilation (break-even after ~100 COCO epochs).
"""

from __future__ import annotations

import contextlib
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from . import losses as _losses
from .data import ProbeData, resolve_device
from .io import atomic_write, atomic_write_text
from .losses._base import Loss, check_hparams
from .losses.assume_negative import EXPECTED_POSITIVES
from .metrics import f1_scores, mean_average_precision
from .optim import OPTIMIZERS, TrialParam, make_optimizer

__all__ = [
    "GENERIC_TRAINING",
    "KNOWN_CLASS_COUNTS",
    "ORDER_STREAM_OFFSET",
    "TRAINER_KEYS",
    "EpochReport",
    "ProbeConfig",
    "ProbeConfigError",
    "ProbeResult",
    "TrialResult",
    "epoch_order",
    "evaluate_head",
    "expand_grid",
    "init_head",
    "load_head",
    "order_generator",
    "save_head",
    "train_probe",
    "write_json_atomic",
]

#: the batch-order stream of seed s is seeded with s + 2**32 (init uses s itself)
ORDER_STREAM_OFFSET = 2**32
#: trial keys that belong to the trainer, not the loss (per-trial learning rate / weight decay)
TRAINER_KEYS = ("lr", "weight_decay")
#: Cole et al.'s ``linear_fixed_features`` setting (``train.py``/``config.py`` of
#: elijahcole/single-positive-multi-label): Adam, 25 epochs; their search over bs {8, 16} ×
#: lr {1e-2 … 1e-5} picked bs 8, lr 1e-4 for AN-LS on every dataset. Used when neither the
#: config nor the loss's ``train_presets`` for the store's dataset give a value.
GENERIC_TRAINING = {"batch_size": 8, "lr": 1e-4, "epochs": 25}
#: class counts of the datasets whose paper presets the losses carry (docs/protocol.md)
KNOWN_CLASS_COUNTS = {"voc": 20, "coco": 80, "nus": 81, "cub": 312}
_EVAL_BLOCK = 1 << 25  # logits elements (T·N·C) evaluated at once, bounds eval memory
_HEAD_FORMAT = "spml-probe-head/1"
_RESULT_FORMAT = "spml-probe-result/1"


class ProbeConfigError(ValueError):
    """Bad probe settings or inputs, reported before training starts."""


@dataclass(frozen=True)
class ProbeConfig:
    """Training settings of a probe run (the loss and its hyperparameters are passed apart).

    ``None`` means "the loss's paper value for the store's dataset (``train_presets``), else
    :data:`GENERIC_TRAINING`".
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
    seeds: tuple[int, ...] | None = None  # one seed per trial (trials with equal seeds share
    # their batch order, which is the fast path)
    flip: bool = True  # docs/protocol.md step 6: random horizontal flip, if the store has flips
    labels: str = "observed"  # train on the single positives; "full" = the full-label oracle
    val_labels: str = "clean"  # docs/protocol.md step 4: val is clean by default; or "observed"
    observed_seed: int = 1200  # docs/protocol.md step 2: the literature's single-positive draw
    device: str = "auto"  # CUDA when available, else CPU
    eval_every: int = 1  # evaluate every epoch (best-epoch selection); 0 = never (benchmarks)
    drop_last: bool = True  # Cole et al.'s train DataLoader drops the last partial batch
    use_presets: bool = True  # start from loss.presets[dataset] where the paper gives values
    f1_threshold: float = 0.5  # docs/protocol.md step 5: OF1/CF1 at probability 0.5
    deterministic: bool = True  # CUDA: deterministic kernels so a re-run is bit-for-bit equal
    step_threads: int | None = None  # CPU threads for the training steps; None = 1 while the
    # stacked head is small (< 2**22 weights): a probe step is ~10 tiny ops, and intra-op
    # threading costs more than it gains (measured 2 threads 5-20x slower on a shared 2-core
    # machine); larger heads keep torch's setting. Evaluation always uses torch's setting.

    def validate(self) -> None:
        """Raise :class:`ProbeConfigError` naming the first bad setting."""
        def bad(name: str, want: str) -> ProbeConfigError:
            got = getattr(self, name)
            return ProbeConfigError(f"ProbeConfig.{name} must be {want}; got {got!r}")

        for name in ("batch_size", "epochs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise bad(name, "a positive integer (or None for the paper preset)")
        lr = self.lr
        if lr is not None and not (isinstance(lr, int | float) and 0 < lr < math.inf):
            raise bad("lr", "a positive number (or None for the paper preset)")
        if not (0 <= self.weight_decay < math.inf):
            raise bad("weight_decay", "a number >= 0")
        if self.optimizer not in OPTIMIZERS:
            raise bad("optimizer", f"one of {list(OPTIMIZERS)}")
        if not 0 <= self.momentum <= 1:
            raise bad("momentum", "in [0, 1]")
        if self.labels not in ("observed", "full"):
            raise bad("labels", "'observed' (single positives) or 'full' (oracle)")
        if self.val_labels not in ("clean", "observed"):
            raise bad("val_labels", "'clean' (full labels) or 'observed' (single positives)")
        if isinstance(self.eval_every, bool) or not isinstance(self.eval_every, int) or (
            self.eval_every < 0
        ):
            raise bad("eval_every", "an integer >= 0 (0 = never evaluate)")
        if not 0 < self.f1_threshold < 1:
            raise bad("f1_threshold", "a probability in (0, 1)")
        for s in [self.seed, *(self.seeds or ())]:
            if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**32:
                raise ProbeConfigError(f"seeds must be integers in [0, 2**32); got {s!r}")
        if self.seeds is not None and len(self.seeds) == 0:
            raise bad("seeds", "None or a non-empty tuple of integers")
        st = self.step_threads
        if st is not None and (isinstance(st, bool) or not isinstance(st, int) or st < 1):
            raise bad("step_threads", "None (automatic) or a positive integer")


# --------------------------------------------------------------------------------------------
# seeds → init and batch order (the exact semantics of the module docstring)
# --------------------------------------------------------------------------------------------


def init_head(seed: int, in_features: int, out_features: int) -> tuple[Tensor, Tensor]:
    """``(weight (C, D), bias (C,))`` exactly as ``torch.manual_seed(seed); nn.Linear(D, C)``
    draws them (``nn.Linear.reset_parameters``: Kaiming-uniform weight with a=√5, then a
    uniform bias in ±1/√D), from a private CPU generator (the global RNG is not touched)."""
    g = torch.Generator().manual_seed(int(seed))
    weight = torch.empty(out_features, in_features)
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=g)
    bound = 1 / math.sqrt(in_features) if in_features > 0 else 0.0
    bias = torch.empty(out_features)
    nn.init.uniform_(bias, -bound, bound, generator=g)
    return weight, bias


def order_generator(seed: int) -> torch.Generator:
    """The batch-order stream of a trial with ``seed`` (see the module docstring)."""
    return torch.Generator().manual_seed(int(seed) + ORDER_STREAM_OFFSET)


def epoch_order(g: torch.Generator, n: int, flip: bool) -> tuple[Tensor, Tensor]:
    """One epoch's ``(perm, rows)`` from the order stream ``g``: ``perm`` (n,) train rows in
    visiting order; ``rows`` the same rows offset by ``n`` where the sample is flipped
    (the row index into :attr:`ProbeData.train_x`)."""
    perm = torch.randperm(n, generator=g)
    if not flip:
        return perm, perm
    coin = torch.randint(0, 2, (n,), generator=g)
    return perm, perm + coin * n


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------


@dataclass
class EpochReport:
    """What the per-epoch callback sees (lists indexed by trial; None for stopped trials)."""

    epoch: int
    train_loss: list[float | None]
    val_map: list[float | None]
    test_map: list[float | None]
    active: list[bool]
    # the current stacked heads (T, D+1, C), bias in the last row, on the training device;
    # read-only (analyses read the train logits through them; do not modify)
    heads: Tensor | None = None


@dataclass
class TrialResult:
    """One trial: its settings, per-epoch metrics and its best epoch (selected on val)."""

    trial: int
    seed: int
    hparams: dict[str, Any]  # the loss's hyperparameters, defaults included
    lr: float
    weight_decay: float
    init: dict[str, float] = field(default_factory=dict)  # val/test mAP of the untrained head
    epochs: list[dict[str, Any]] = field(default_factory=list)
    best_epoch: int | None = None
    best: dict[str, Any] = field(default_factory=dict)
    stopped_at: int | None = None  # epoch after which the trial was stopped (pruned)
    finite: bool = True  # False once its training loss or metrics went NaN/inf


@dataclass
class ProbeResult:
    """Everything a probe run produced; :meth:`to_dict` / :meth:`write_json` for the file."""

    loss: str
    config: dict[str, Any]
    trials: list[TrialResult]
    class_names: list[str]
    dataset: str
    source: dict[str, Any]
    environment: dict[str, Any]
    timing: dict[str, Any]
    shared_batch_order: bool
    best_heads: Tensor | None = None  # (T, D+1, C) float32 CPU, the best epoch's head per trial
    final_heads: Tensor | None = None  # (T, D+1, C) after the last epoch

    @property
    def n_trials(self) -> int:
        return len(self.trials)

    def best_trial(self) -> int | None:
        """The trial with the highest best-epoch val mAP (None if nothing was evaluated)."""
        scored = [(t.best.get("val_map", -math.inf), -t.trial) for t in self.trials if t.best]
        scored = [(v if math.isfinite(v) else -math.inf, i) for v, i in scored]
        return -max(scored)[1] if scored else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": _RESULT_FORMAT,
            "loss": self.loss,
            "config": self.config,
            "dataset": self.dataset,
            "data": self.source,
            "environment": self.environment,
            "n_trials": self.n_trials,
            "shared_batch_order": self.shared_batch_order,
            "best_trial": self.best_trial(),
            "class_names": self.class_names,
            "trials": [asdict(t) for t in self.trials],
            "timing": self.timing,
        }

    def write_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` atomically (temporary file in the same folder, then rename)."""
        return write_json_atomic(path, self.to_dict())

    def head(self, trial: int = 0, best: bool = True) -> nn.Linear:
        """Trial ``trial``'s head as a plain ``nn.Linear`` (best epoch, or the final one)."""
        heads = self.best_heads if best else self.final_heads
        if heads is None:
            raise ProbeConfigError(f"the {self.loss} run has no trained head")
        if not 0 <= trial < heads.shape[0]:
            raise ProbeConfigError(f"trial {trial} out of range [0, {heads.shape[0]})")
        return _to_linear(heads[trial])


def _to_linear(w_aug: Tensor) -> nn.Linear:
    d = w_aug.shape[0] - 1
    lin = nn.Linear(d, w_aug.shape[1])
    with torch.no_grad():
        lin.weight.copy_(w_aug[:d].T)
        lin.bias.copy_(w_aug[d])
    return lin


def write_json_atomic(path: str | Path, payload: Any) -> Path:
    """JSON to ``path`` via a temporary file in the same directory and ``os.replace``;
    non-finite numbers are written as null."""
    text = json.dumps(_strict(payload), indent=1, allow_nan=False, default=_json_default)
    return atomic_write_text(path, text)


def _strict(obj: Any) -> Any:
    """NaN/inf → None (null), so the file is strict JSON for every reader."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_strict(v) for v in obj]
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Tensor):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def save_head(path: str | Path, result: ProbeResult, trials: Sequence[int] | None = None,
              best: bool = True) -> Path:
    """Save trained heads (``nn.Linear`` layout: weight ``(T, C, D)``, bias ``(T, C)``) with
    what is needed to use and reproduce them (loss, hyperparameters, config, data source).
    Written atomically. Load with :func:`load_head`."""
    heads = result.best_heads if best else result.final_heads
    if heads is None:
        raise ProbeConfigError(f"the {result.loss} run has no trained head to save")
    idx = list(range(heads.shape[0])) if trials is None else [int(t) for t in trials]
    d = heads.shape[1] - 1
    meta = {
        "trials": [asdict(result.trials[t]) for t in idx],
        "which": "best" if best else "final",
        "loss": result.loss,
        "config": result.config,
        "class_names": result.class_names,
        "dataset": result.dataset,
        "data": result.source,
        "environment": result.environment,
    }
    payload = {
        "format": _HEAD_FORMAT,
        "weight": heads[idx, :d].transpose(1, 2).contiguous(),
        "bias": heads[idx, d].contiguous(),
        # plain JSON types only, so torch.load(weights_only=True) reads the file back
        **json.loads(json.dumps(meta, default=_json_default)),
    }
    return atomic_write(path, lambda fh: torch.save(payload, fh))


def load_head(path: str | Path, trial: int = 0) -> tuple[nn.Linear, dict[str, Any]]:
    """``(nn.Linear, metadata)`` of one trial saved by :func:`save_head`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"head file {path} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a foreign or corrupt file
        raise ProbeConfigError(f"{path} is not a readable spml-probe head file: {err}") from None
    if not isinstance(payload, dict) or payload.get("format") != _HEAD_FORMAT:
        raise ProbeConfigError(
            f"{path} is not an spml-probe head file (format {_HEAD_FORMAT!r}); save heads with "
            "'spml probe … --save-head PATH'"
        )
    weight, bias = payload["weight"], payload["bias"]
    if not 0 <= trial < weight.shape[0]:
        raise ProbeConfigError(f"{path} holds {weight.shape[0]} heads; trial {trial} asked for")
    lin = nn.Linear(weight.shape[2], weight.shape[1])
    with torch.no_grad():
        lin.weight.copy_(weight[trial])
        lin.bias.copy_(bias[trial])
    meta = {k: v for k, v in payload.items() if k not in ("weight", "bias")}
    return lin, meta


# --------------------------------------------------------------------------------------------
# trials: hyperparameters, seeds, the stacked loss
# --------------------------------------------------------------------------------------------


def expand_grid(values: dict[str, Sequence[Any]], zip_: bool = False) -> list[dict[str, Any]]:
    """Trials from per-key value lists: the Cartesian product over keys (first key slowest), or
    with ``zip_`` the i-th values together (lists of length 1 repeat). Used by ``--set``."""
    keys = list(values)
    lists = [list(values[k]) for k in keys]
    if not keys:
        return [{}]
    if zip_:
        lengths = {len(v) for v in lists if len(v) != 1}
        if len(lengths) > 1:
            raise ProbeConfigError(
                "--zip needs every value list to have the same length (or length 1); got "
                + ", ".join(f"{k}: {len(v)}" for k, v in zip(keys, lists))
            )
        n = lengths.pop() if lengths else 1
        return [{k: (v[0] if len(v) == 1 else v[i]) for k, v in zip(keys, lists)}
                for i in range(n)]
    out: list[dict[str, Any]] = [{}]
    for k, vs in zip(keys, lists):
        out = [{**o, k: v} for o in out for v in vs]
    return out


@dataclass
class _Trials:
    seeds: list[int]
    loss_hparams: list[dict[str, Any]]
    lr: list[float]
    weight_decay: list[float]

    @property
    def n(self) -> int:
        return len(self.seeds)


def _normalise_trials(hparams: dict | Sequence[dict] | None, config: ProbeConfig, lr: float
                      ) -> _Trials:
    if hparams is None:
        trials = [{}]
    elif isinstance(hparams, dict):
        trials = [dict(hparams)]
    else:
        trials = [dict(h) for h in hparams]
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
            "trial, a single seed, or a single trial"
        )
    out = _Trials(seeds, [], [], [])
    for t in trials:
        t_lr = t.pop("lr", lr)
        t_wd = t.pop("weight_decay", config.weight_decay)
        for name, v in (("lr", t_lr), ("weight_decay", t_wd)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or (
                v < 0 or (name == "lr" and v == 0)
            ):
                want = "positive" if name == "lr" else "non-negative"
                raise ProbeConfigError(f"trial setting '{name}' must be a {want} number; got {v!r}")
        out.loss_hparams.append(t)
        out.lr.append(float(t_lr))
        out.weight_decay.append(float(t_wd))
    return out


def resolve_training(config: ProbeConfig, cls: type[Loss] | None, dataset: str
                      ) -> dict[str, Any]:
    """Batch size, lr and epochs a run uses, with where each came from: the config, else the
    loss's paper preset for ``dataset``, else :data:`GENERIC_TRAINING`."""
    preset = (cls.train_presets.get(dataset, {}) if cls is not None else {})
    out = {}
    for key in ("batch_size", "lr", "epochs"):
        given = getattr(config, key)
        if given is not None:
            out[key], out[f"{key}_from"] = given, "as given"
        elif config.use_presets and key in preset:
            out[key], out[f"{key}_from"] = preset[key], f"{cls.name} paper preset for {dataset}"
            mult = preset.get("head_lr_mult", 1)
            if key == "lr" and mult != 1:  # the probe trains only the head: the head's rate
                out[key] = preset[key] * mult
                out[f"{key}_from"] += f" (head rate: {mult:g} × the backbone's {preset[key]:g})"
        else:
            out[key] = GENERIC_TRAINING[key]
            out[f"{key}_from"] = "generic (Cole et al. linear probe)"
    return out


def _check_dataset_classes(dataset: str, n_classes: int, what: str) -> None:
    known = KNOWN_CLASS_COUNTS.get(dataset)
    if known is not None and known != n_classes:
        raise ProbeConfigError(
            f"the data says dataset '{dataset}' but has {n_classes} classes, while {what} for "
            f"'{dataset}' assume its {known} classes; fix the store's dataset name, or pass "
            "use_presets=False (--no-presets) and set the values yourself"
        )


def _merge_trial_hparams(cls: type[Loss], trials: _Trials, dataset: str, use_presets: bool
                         ) -> list[dict[str, Any]]:
    """Each trial's full loss hyperparameters: defaults < paper preset < the trial's own."""
    base = dict(cls.presets.get(dataset, {})) if use_presets else {}
    merged = []
    for t in trials.loss_hparams:
        values = check_hparams(cls.hparam_specs, {**base, **t}, cls.name)  # unknown names, ranges
        merged.append(values)
    return merged


def _fill_dataset_hparams(cls: type[Loss], merged: list[dict[str, Any]], dataset: str,
                          data: ProbeData) -> list[str]:
    """Fill optional hyperparameters left None from the dataset (EPR/ROLE's k): the published
    expected positives per image (Cole et al. Table 1) or the val split's label cardinality.
    Returns notes on what was filled; errors for values the class count contradicts."""
    notes = []
    for spec in cls.hparam_specs:
        if not spec.optional:
            continue
        for values in merged:
            if values.get(spec.name) is not None:
                continue
            if spec.name != "k":
                raise ProbeConfigError(
                    f"{cls.name}: hyperparameter '{spec.name}' has no default and cannot be "
                    f"derived from the data; set it (--set {spec.name}=VALUE)"
                )
            if dataset in EXPECTED_POSITIVES:
                _check_dataset_classes(dataset, data.n_classes, "the expected positives k")
                values["k"] = float(EXPECTED_POSITIVES[dataset])
                note = f"k={values['k']:g} (expected positives per image, Cole et al., {dataset})"
            else:
                values["k"] = round(data.val_label_cardinality(), 6)
                note = f"k={values['k']:g} (mean label cardinality of the val split)"
            if note not in notes:
                notes.append(note)
    for values in merged:
        k = values.get("k")
        if isinstance(k, int | float) and k > data.n_classes:
            raise ProbeConfigError(
                f"{cls.name}: k={k:g} expected positives per image, but the data has only "
                f"{data.n_classes} classes; k must be at most the class count"
            )
    return notes


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
                f"must be the same for every stacked trial; got {vals}. Run one probe per value"
            )
    return cls(**values)


@dataclass
class _LossGroup:
    loss: Loss
    trials: slice  # the trials (along T) this loss object covers
    extra: list[tuple[nn.Parameter, float]]


# --------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------


def _logits(x: Tensor, w: Tensor) -> Tensor:
    """(T, N, C) float32 logits of features ``x`` (N, D+1) under heads ``w`` (T, D+1, C)."""
    t, _, c = w.shape
    n = x.shape[0]
    out = torch.empty(t, n, c, dtype=torch.float32, device=w.device)
    step = max(1, min(8192, _EVAL_BLOCK // max(1, t * c)))  # rows per product
    for r0 in range(0, n, step):
        out[:, r0 : r0 + step] = torch.matmul(x[r0 : r0 + step].float(), w)
    return out


def evaluate_heads(x: Tensor, targets: Tensor, w: Tensor, threshold: float) -> dict[str, Tensor]:
    """mAP (T,), per-class AP (T, C), OF1/CF1 (T,) for heads ``w`` (T, D+1, C), in trial
    blocks so the logits stay below :data:`_EVAL_BLOCK` elements."""
    t, _, c = w.shape
    per = max(1, _EVAL_BLOCK // max(1, x.shape[0] * c))
    maps, aps, of1, cf1 = [], [], [], []
    for t0 in range(0, t, per):
        z = _logits(x, w[t0 : t0 + per])
        m = mean_average_precision(targets, logits=z)
        f = f1_scores(targets, logits=z, threshold=threshold)
        maps.append(m.map.reshape(-1))
        aps.append(m.ap.reshape(-1, c))
        of1.append(f.overall_f1.reshape(-1))
        cf1.append(f.class_f1.reshape(-1))
        del z
    return {"map": torch.cat(maps), "ap": torch.cat(aps), "OF1": torch.cat(of1),
            "CF1": torch.cat(cf1)}


def evaluate_head(data: ProbeData, head: nn.Linear, threshold: float = 0.5) -> dict[str, Any]:
    """Val (clean) and test mAP / OF1 / CF1 and per-class test AP of one ``nn.Linear`` head."""
    if head.in_features != data.feature_dim or head.out_features != data.n_classes:
        raise ProbeConfigError(
            f"the head maps {head.in_features} features to {head.out_features} classes, the "
            f"data has {data.feature_dim} features and {data.n_classes} classes"
        )
    w = torch.cat([head.weight.detach().T, head.bias.detach()[None]]).to(data.device).float()
    out: dict[str, Any] = {}
    for split, x, y in (("val", data.val_x, data.val_labels), ("test", data.test_x,
                                                                data.test_labels)):
        r = evaluate_heads(x, y.bool(), w[None], threshold)
        out.update({f"{split}_map": float(r["map"][0]), f"{split}_OF1": float(r["OF1"][0]),
                    f"{split}_CF1": float(r["CF1"][0])})
        out[f"{split}_ap"] = r["ap"][0].tolist()
    return out


# --------------------------------------------------------------------------------------------
# the engine
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _deterministic(device: torch.device, enabled: bool) -> Iterator[None]:
    """On CUDA, deterministic kernels for the run (restored afterwards); CPU is deterministic."""
    if not (enabled and device.type == "cuda"):
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    warn_before = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_before)


def environment_info(device: torch.device) -> dict[str, Any]:
    env = {
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    else:
        env["device_name"] = platform.processor() or platform.machine()
    return env


class _NoBar:
    """Stands in for a tqdm bar when progress is off (tqdm is then not even imported)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))

    def close(self) -> None:
        pass


def _progress_bar(n: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return _NoBar(n)
    from tqdm.auto import tqdm

    return tqdm(range(n), desc=desc, unit="epoch", file=sys.stderr, leave=False)


_SMALL_HEAD = 1 << 22  # stacked head weights below which training steps run single-threaded


def _resolve_threads(step_threads: int | None, device: torch.device, n_weights: int
                     ) -> int | None:
    """CPU threads for the step loop (None: leave torch's setting); see ProbeConfig."""
    if device.type != "cpu":
        return None
    if step_threads is not None:
        return step_threads
    return 1 if n_weights < _SMALL_HEAD else None


@contextlib.contextmanager
def _step_threads(device: torch.device, threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` intra-op CPU threads, restoring the setting after."""
    if threads is None or device.type != "cpu" or threads == torch.get_num_threads():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_probe(
    data: ProbeData,
    config: ProbeConfig | None = None,
    loss: Loss | str = "an",
    hparams: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
    *,
    callback: Callable[[EpochReport], Iterable[int] | None] | None = None,
    progress: bool = False,
) -> ProbeResult:
    """Train T linear heads at once with one SPML loss; evaluate after every epoch.

    Args:
        data: device-resident splits (:class:`ProbeData`); training runs on ``data.device``
            unless ``config.device`` names another, to which the data is then moved.
        config: training settings (:class:`ProbeConfig`); None = defaults.
        loss: a registry name (``"gr"``) or a ready :class:`Loss` object (then ``hparams``
            must be None, and its own hyperparameters define the trials).
        hparams: one dict (one trial) or a list of dicts (T stacked trials) of the loss's
            hyperparameters, plus optionally the per-trial trainer keys ``lr`` and
            ``weight_decay``. Missing keys take the paper preset for the data's dataset (when
            ``config.use_presets``), then the loss's defaults; EPR/ROLE's ``k`` comes from the
            dataset (:data:`EXPECTED_POSITIVES` or the val split's label cardinality).
        callback: called after each evaluated epoch with an :class:`EpochReport`; it returns
            the trials to stop (their weights freeze, they leave the optimizer's update and the
            later evaluations; their best epoch stays what it was). When every trial is
            stopped, training ends.
        progress: a tqdm bar over epochs on stderr, one line per epoch with the best trial's
            val/test mAP.

    Returns:
        :class:`ProbeResult` (per-trial per-epoch metrics, best epoch and its per-class AP,
        best and final heads, config, data provenance, environment, timing).

    Raises :class:`ProbeConfigError` / :class:`~probe.losses.LossInputError` /
    :class:`~probe.data.DataError` (all ``ValueError``) before training for bad settings: an
    unknown hyperparameter or loss, a batch size larger than the train split, a GPU asked for
    without one, a class count that contradicts the dataset's presets, …
    """
    t_start = time.perf_counter()
    config = config or ProbeConfig()
    config.validate()
    device = data.device if config.device == "auto" else resolve_device(config.device)
    if device != data.device:
        data = _move(data, device)
    dataset = data.dataset

    # ---- the loss and the trials --------------------------------------------------------
    if isinstance(loss, Loss):
        if hparams is not None:
            raise ProbeConfigError(
                "hparams must be None when a Loss object is passed (its hyperparameters are "
                "already set); pass the loss by name to give hyperparameters"
            )
        cls = type(loss)
        n_loss_trials = loss.n_trials or 1
        hparams = [{} for _ in range(n_loss_trials)]
    elif isinstance(loss, str):
        if loss == "knn":
            raise ProbeConfigError("'knn' is not a trained loss; use probe.knn.run_knn")
        cls = _losses.get_loss_class(loss)
    else:
        raise ProbeConfigError(f"loss must be a registry name or a Loss; got {type(loss).__name__}")
    training = resolve_training(config, cls, dataset)
    if config.use_presets and (cls.presets.get(dataset) or cls.train_presets.get(dataset)):
        _check_dataset_classes(dataset, data.n_classes, f"the {cls.name} paper presets")
    trials = _normalise_trials(hparams, config, training["lr"])
    n_trials = trials.n
    shared = len(set(trials.seeds)) == 1
    notes: list[str] = []
    if isinstance(loss, Loss):
        if not shared:
            raise ProbeConfigError(
                "per-trial seeds need one loss object per trial; pass the loss by name"
            )
        given = loss.hparams_dict()  # stacked hyperparameters come back as per-trial lists
        merged = [{k: (v[t] if isinstance(v, list) else v) for k, v in given.items()}
                  for t in range(n_trials)]
        loss_objects = [loss]
    else:
        merged = _merge_trial_hparams(cls, trials, dataset, config.use_presets)
        notes = _fill_dataset_hparams(cls, merged, dataset, data)
        if shared:
            loss_objects = [_build_loss(cls, merged)]
        else:
            loss_objects = [_build_loss(cls, [m]) for m in merged]

    # ---- sizes ------------------------------------------------------------------------------
    n, batch, epochs = data.n_train, int(training["batch_size"]), int(training["epochs"])
    if batch > n:
        raise ProbeConfigError(
            f"batch size {batch} ({training['batch_size_from']}) is larger than the train split "
            f"({n} rows); use a batch size of at most {n}"
        )
    n_steps = n // batch if config.drop_last else -(-n // batch)
    flip = bool(config.flip and data.has_flip)
    if config.flip and not data.has_flip:
        notes.append("flip augmentation off: the data has no flipped features")
    d1, c = data.train_x.shape[1], data.n_classes

    # train targets: single positives, or the full labels as {1, -1} (the oracle)
    if config.labels == "full":
        train_y = torch.where(data.train_labels == 1, 1, -1).to(torch.int8)
    else:
        train_y = data.train_observed
    val_targets = (data.val_labels.bool() if config.val_labels == "clean"
                   else data.val_observed == 1)
    test_targets = data.test_labels.bool()

    # ---- loss objects: setup, seeds, their own parameters ---------------------------------
    groups: list[_LossGroup] = []
    for i, obj in enumerate(loss_objects):
        obj.to(device)
        span = slice(0, n_trials) if shared else slice(i, i + 1)
        k = span.stop - span.start
        obj.setup(train_y, n_epochs=epochs, n_trials=k)
        obj.manual_seed(trials.seeds[span])
        extra = list(obj.extra_parameters())
        for p, _ in extra:
            if p.ndim == 0 or p.shape[0] != k or not p.is_contiguous():
                raise ProbeConfigError(
                    f"{cls.name}: extra_parameters() must return contiguous tensors with a "
                    f"leading trial axis of {k}; got shape {tuple(p.shape)}"
                )
        groups.append(_LossGroup(obj, span, extra))

    # ---- the stacked head and the optimizer ------------------------------------------------
    w = torch.empty(n_trials, d1, c, dtype=torch.float32)
    drawn: dict[int, Tensor] = {}
    for t, s in enumerate(trials.seeds):
        if s not in drawn:
            weight, bias = init_head(s, d1 - 1, c)
            drawn[s] = torch.cat([weight.T, bias[None]])
        w[t] = drawn[s]
    w = w.to(device)
    grad_w = torch.empty_like(w)
    params = [TrialParam(w, trials.lr, trials.weight_decay)]
    for g in groups:
        lrs, ids = trials.lr[g.trials], range(n_trials)[g.trials]
        params += [TrialParam(p.data, [lr * mult for lr in lrs], 0.0, trial_ids=ids)
                   for p, mult in g.extra]
    opt = make_optimizer(config.optimizer, params, momentum=config.momentum,
                         betas=config.betas, eps=config.eps)
    order_gens = [order_generator(s) for s in (trials.seeds[:1] if shared else trials.seeds)]
    extra_params = [p for g in groups for p, _ in g.extra]
    threads = _resolve_threads(config.step_threads, device, w.numel())

    # ---- bookkeeping --------------------------------------------------------------------------
    results = [TrialResult(trial=t, seed=trials.seeds[t], hparams=_plain(merged[t]),
                           lr=trials.lr[t], weight_decay=trials.weight_decay[t])
               for t in range(n_trials)]
    best_val = [-math.inf] * n_trials
    best_w = w.detach().clone().cpu()
    best_ap: dict[str, Tensor | None] = {"val": None, "test": None}
    active = [True] * n_trials
    timing: dict[str, Any] = {"train_seconds": [], "eval_seconds": [], "end_epoch_seconds": []}
    loss_sum = torch.zeros(n_trials, dtype=torch.float32, device=device)
    evaluate = config.eval_every > 0
    pin = device.type == "cuda"

    def run_eval(epoch: int | None) -> dict[str, list[float]]:
        idx = [t for t in range(n_trials) if active[t]]
        heads = w if len(idx) == n_trials else w[torch.tensor(idx, device=device)]
        out: dict[str, list[float]] = {}
        aps = {}
        for split, x, y in (("val", data.val_x, val_targets), ("test", data.test_x,
                                                                 test_targets)):
            r = evaluate_heads(x, y, heads, config.f1_threshold)
            vals = {k: r[k].tolist() for k in ("map", "OF1", "CF1")}
            for k, v in vals.items():
                full: list[float | None] = [None] * n_trials
                for j, t in enumerate(idx):
                    full[t] = v[j]
                out[f"{split}_{k}"] = full
            aps[split] = (idx, r["ap"])
        if epoch is not None:
            _select_best(epoch, out, aps)
        return out

    def _select_best(epoch: int, out: dict[str, list], aps: dict[str, tuple]) -> None:
        idx = aps["val"][0]
        improved = [j for j, t in enumerate(idx)
                    if _finite(out["val_map"][t]) and out["val_map"][t] > best_val[t]]
        if not improved:
            return
        rows = [idx[j] for j in improved]
        sel_dev = torch.tensor(improved, device=device)
        best_w[rows] = w[torch.tensor(rows, device=device)].detach().cpu()
        for split in ("val", "test"):
            ap = aps[split][1][sel_dev].cpu()
            if best_ap[split] is None:
                best_ap[split] = torch.full((n_trials, c), math.nan)
            best_ap[split][rows] = ap
        for t in rows:
            best_val[t] = out["val_map"][t]
            results[t].best_epoch = epoch
            results[t].best = {k: v[t] for k, v in out.items()}
            results[t].best["val_ap"] = best_ap["val"][t].tolist()
            results[t].best["test_ap"] = best_ap["test"][t].tolist()

    with _deterministic(device, config.deterministic), torch.no_grad():
        if evaluate:
            init = run_eval(None)
            for t in range(n_trials):
                results[t].init = {"val_map": init["val_map"][t], "test_map": init["test_map"][t]}
        bar = _progress_bar(epochs, f"probe {cls.name} ×{n_trials}", progress)
        for epoch in bar:
            t0 = time.perf_counter()
            for g in groups:
                g.loss.start_epoch(epoch)
            draws = [epoch_order(gen, n, flip) for gen in order_gens]
            perm = torch.stack([p for p, _ in draws])
            rows = torch.stack([r for _, r in draws])
            if pin:
                perm, rows = perm.pin_memory(), rows.pin_memory()
            perm = perm.to(device, non_blocking=True)
            rows = rows.to(device, non_blocking=True)
            loss_sum.zero_()
            with _step_threads(device, threads):
                for step in range(n_steps):
                    if shared:
                        idx = perm[0, step * batch : (step + 1) * batch]
                        x = data.train_x[rows[0, step * batch : (step + 1) * batch]].float()
                        z = torch.matmul(x, w)  # (B, D+1) @ (T, D+1, C) -> (T, B, C)
                    else:
                        idx = perm[:, step * batch : (step + 1) * batch]
                        x = data.train_x[rows[:, step * batch : (step + 1) * batch]].float()
                        z = torch.bmm(x, w)  # (T, B, D+1) @ (T, D+1, C)
                    z.requires_grad_(True)
                    with torch.enable_grad():
                        if shared:
                            per_trial = groups[0].loss(z, train_y[idx], index=idx).loss
                        else:
                            per_trial = torch.cat([
                                g.loss(z[g.trials], train_y[idx[g.trials.start]],
                                       index=idx[g.trials.start]).loss.reshape(1)
                                for g in groups
                            ])
                        grads = torch.autograd.grad(per_trial.sum(), [z, *extra_params],
                                                    allow_unused=True)
                    # dL/dW = Xᵀ dL/dZ per trial: one matrix product instead of autograd
                    if shared:
                        torch.matmul(x.T, grads[0], out=grad_w)
                    else:
                        torch.bmm(x.transpose(1, 2), grads[0], out=grad_w)
                    opt.step([grad_w, *grads[1:]])
                    loss_sum += per_trial.detach().reshape(n_trials)
            _sync(device)
            t1 = time.perf_counter()
            if any(g.loss.needs_epoch_pass for g in groups):
                train_logits = _logits(data.train_x[:n], w)
                for g in groups:
                    g.loss.end_epoch(epoch, train_logits[g.trials])
                del train_logits
                _sync(device)
            t2 = time.perf_counter()
            timing["train_seconds"].append(t1 - t0)
            timing["end_epoch_seconds"].append(t2 - t1)
            train_loss = (loss_sum / max(n_steps, 1)).tolist()
            last = epoch == epochs - 1
            record: dict[str, list] = {}
            if evaluate and ((epoch + 1) % config.eval_every == 0 or last):
                record = run_eval(epoch)
            timing["eval_seconds"].append(time.perf_counter() - t2)
            for t in range(n_trials):
                if not active[t]:
                    continue
                row = {"epoch": epoch, "train_loss": train_loss[t]}
                row.update({k: v[t] for k, v in record.items()})
                results[t].epochs.append(row)
                if not all(_finite(v) for v in row.values() if isinstance(v, float)):
                    results[t].finite = False
            if record:
                live = [t for t in range(n_trials) if active[t] and _finite(best_val[t])]
                if live:
                    b = max(live, key=lambda t: best_val[t])
                    line = (f"epoch {epoch + 1}/{epochs}: best trial {b} val mAP "
                            f"{results[b].best.get('val_map', math.nan):.2f} test mAP "
                            f"{results[b].best.get('test_map', math.nan):.2f}")
                    if progress:
                        bar.write(line, file=sys.stderr)
                if callback is not None:
                    report = EpochReport(
                        epoch=epoch,
                        train_loss=[train_loss[t] if active[t] else None for t in range(n_trials)],
                        val_map=list(record["val_map"]),
                        test_map=list(record["test_map"]),
                        active=list(active),
                        heads=w,
                    )
                    stop = [int(t) for t in (callback(report) or ())]
                    stop = [t for t in stop if 0 <= t < n_trials and active[t]]
                    if stop:
                        for t in stop:
                            active[t] = False
                            results[t].stopped_at = epoch
                        opt.stop_trials(stop)
                        if not any(active):
                            break
        bar.close()

    timing["total_seconds"] = time.perf_counter() - t_start
    timing["epochs_run"] = len(timing["train_seconds"])
    timing["steps_per_epoch"] = n_steps
    resolved = {**asdict(config), **training, "device": str(device), "flip_used": flip,
                "notes": notes}
    return ProbeResult(
        loss=cls.name,
        config=resolved,
        trials=results,
        class_names=list(data.class_names),
        dataset=dataset,
        source=dict(data.source),
        environment=environment_info(device),
        timing=timing,
        shared_batch_order=shared,
        best_heads=best_w if evaluate else None,
        final_heads=w.detach().cpu(),
    )


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.tolist() if isinstance(v, Tensor) else v) for k, v in values.items()}


def _move(data: ProbeData, device: torch.device) -> ProbeData:
    moved = {k: (v.to(device) if isinstance(v, Tensor) else v) for k, v in vars(data).items()}
    return replace(data, **moved)

