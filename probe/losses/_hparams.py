"""A loss's hyperparameters and inputs: their specs (:class:`HParam`), their checks, the trial
axis views (:func:`hp`, :func:`per_trial`), and the errors a loss raises. Part of the loss
contract (:mod:`probe.losses._base`, which re-exports every name here)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from probe.errors import SpmlError, plain
from probe.registry import close_matches

__all__ = ["DATA_QUANTITIES", "HParam", "LossContractError", "LossInputError", "LossOutput",
           "check_hparam", "check_hparams", "check_inputs", "hp", "mean_bc", "per_trial", "promote"]


class LossInputError(SpmlError):
    """Bad input to a loss: the message names the argument, what was expected and what arrived."""


class LossContractError(SpmlError, TypeError):
    """A loss class that breaks the contract of :class:`Loss` (refused by :func:`register`, or
    a plugin that cannot be loaded): the message names the class and what to declare."""


class LossOutput(NamedTuple):
    """What a :class:`Loss` object returns: the total and the paper's named parts (may be empty)."""

    loss: Tensor
    parts: dict[str, Tensor]


#: The quantities of the data a hyperparameter can be filled with when it is left None
#: (``HParam(..., default=None, from_data=NAME)``); :func:`probe.engine.config.loss_hparams`
# computes
#: them for the probe, studies, confirm, the analyses and the fine-tune alike.
DATA_QUANTITIES: dict[str, str] = {
    "expected_positives": (
        "expected positives per image: Cole et al.'s value for a benchmark dataset (VOC 1.5, "
        "COCO 2.9, NUS 1.9, CUB 31.4), else the val split's mean label cardinality; a value "
        "above the class count is refused (EPR's and ROLE's k)"),
    "val_cardinality": "the val split's mean number of positive labels per image",
    "n_classes": "the number of classes C of the data",
    "positive_fraction": (
        "expected_positives / C: the share of labels that are positive (a class prior)")}


@dataclass(frozen=True)
class HParam:
    """One hyperparameter of a loss: its default, its valid range and its search range.

    ``low``/``high`` bound the *valid* values (``low_open``/``high_open`` make a bound strict);
    ``search`` is the ``(low, high)`` range a study samples from (``log`` = log-uniform), or
    ``None`` when the parameter is not searched. ``kind`` is ``float`` (stackable per trial),
    ``int``, ``bool`` or ``choice`` (structural: the same for all stacked trials).

    ``from_data`` names a quantity of the data (:data:`DATA_QUANTITIES`, e.g.
    ``"expected_positives"``) that the trainer fills the parameter with when it is left None;
    such a parameter's default must be None (it is then ``optional``). ``optional`` alone
    (without ``from_data``) lets a pure function take None; the trainer refuses it unset.
    """

    name: str
    default: Any
    doc: str
    kind: str = "float"
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    search: tuple[float, float] | None = None
    log: bool = False
    choices: tuple[Any, ...] | None = None
    optional: bool = False  # None is a valid value (filled in by the trainer with from_data)
    requires: str | None = None  # a bool switch this parameter only matters under (OPML options)
    from_data: str | None = None  # left None: filled with this DATA_QUANTITIES entry
    count: bool = False  # a number of items compared with a 0-based rank: 7.3 acts as 8 items

    def effective(self, value: Any) -> Any:
        """What ``value`` acts as in training: a count (``count=True``) takes ``rank < value``,
        so a fraction acts as the next whole number (``effective(7.27) == 8``); others as
        given."""
        if self.count and isinstance(value, int | float) and not isinstance(value, bool):
            return max(0, math.ceil(value))
        return value

    def __post_init__(self) -> None:
        if self.from_data is None:
            return
        if self.from_data not in DATA_QUANTITIES:
            raise LossContractError(
                f"HParam '{self.name}': from_data must be one of {sorted(DATA_QUANTITIES)}; got "
                f"{self.from_data!r}")
        if self.default is not None:
            raise LossContractError(
                f"HParam '{self.name}': a parameter filled from the data (from_data="
                f"{self.from_data!r}) must have default None; got {self.default!r}")
        object.__setattr__(self, "optional", True)

    @property
    def stackable(self) -> bool:
        return self.kind == "float"

    def range_text(self) -> str:
        if self.kind == "bool":
            return "True/False"
        if self.kind == "choice":
            return " | ".join(map(repr, self.choices or ()))
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        return f"{'(' if self.low_open or self.low is None else '['}{lo}, {hi}" + (
            ")" if self.high_open or self.high is None else "]")


def check_hparam(spec: HParam, value: Any, loss: str = "") -> Any:
    """Validate one hyperparameter value (number or ``(T,)`` tensor) against its spec; returns
    it normalised (floats for numbers, float tensors for tensors)."""
    def refused(text: str) -> LossInputError:
        where = f"{loss}: " if loss else ""
        return LossInputError(f"{where}hyperparameter '{spec.name}' {text}")

    if value is None:
        if spec.optional:
            return None
        raise refused(f"is required ({spec.doc}); set it with --set {spec.name}=VALUE")
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise refused(f"must be true or false; got {plain(value)}")
        return value
    if spec.kind == "choice":
        if value not in (spec.choices or ()):
            raise refused(f"must be one of {', '.join(map(str, spec.choices or ()))}; got "
                          f"{plain(value)}")
        return value
    if spec.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise refused(f"must be an integer; got {plain(value)}")
        value = int(value)
        vals = [float(value)]
    elif isinstance(value, Tensor):
        if value.ndim > 1 or not (value.is_floating_point() or value.dtype in _INT_DTYPES):
            raise refused(f"as a tensor must be a float tensor of shape (T,) (one value per "
                          f"trial); got dtype {value.dtype}, shape {tuple(value.shape)}")
        value = value.detach().to(torch.float64 if value.dtype == torch.float64 else torch.float32)
        vals = value.flatten().tolist()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        value = float(value)
        vals = [value]
    else:
        several = isinstance(value, str) and "," in value
        raise refused(f"must be a number; got {plain(value)}" + (
            " (one value here: a comma list is a grid of trials for 'spml probe --set', and "
            "'spml study --grid' searches among values)" if several else ""))
    for v in vals:
        bad = not math.isfinite(v)
        if spec.low is not None:
            bad |= v < spec.low or (spec.low_open and v == spec.low)
        if spec.high is not None:
            bad |= v > spec.high or (spec.high_open and v == spec.high)
        if bad:
            raise refused(f"must lie in {spec.range_text()} ({spec.doc}); got {v:g}")
    return value


_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def hp(value: float | Tensor, logits: Tensor) -> float | Tensor:
    """View a hyperparameter for broadcasting against ``logits`` ``(B, C)`` or ``(T, B, C)``:
    numbers and 0-d tensors stay so; a ``(T,)`` tensor becomes ``(T, 1, 1)`` on the logits'
    device and dtype. Does not validate (see :func:`check_hparam`)."""
    if not isinstance(value, Tensor):
        return value
    value = value.to(device=logits.device, dtype=logits.dtype)
    return value if value.ndim == 0 else value.view(-1, 1, 1)


def per_trial(value: float | Tensor) -> float | Tensor:
    """The inverse view of :func:`hp` for per-trial reductions: ``(T, 1, 1)`` → ``(T,)``;
    numbers and 0-d tensors unchanged."""
    return value.reshape(-1) if isinstance(value, Tensor) and value.ndim == 3 else value


def promote(logits: Tensor) -> Tensor:
    """float16/bfloat16 logits are computed in float32 (a half-precision loss loses the digits
    that separate trials); other dtypes pass through."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def mean_bc(entries: Tensor) -> Tensor:
    """The Cole et al. reduction: mean over the last two (B, C) axes; keeps the trial axis."""
    return entries.mean(dim=(-2, -1))


def check_inputs(logits: Tensor, observed: Tensor, hparams: dict[str, Any] | None = None,
                 loss: str = "", allow_soft: bool = False) -> tuple[Tensor, Tensor]:
    """Validate ``logits``/``observed`` (and the T of any ``(T,)`` hyperparameters); returns
    them with half-precision logits promoted to float32 and ``observed`` on the logits' device.
    Synchronises with the device: the training loop validates once and calls unchecked cores."""
    where = f"{loss}: " if loss else ""
    if not isinstance(logits, Tensor):
        raise LossInputError(f"{where}'logits' must be a torch.Tensor; got {type(logits).__name__}")
    if not isinstance(observed, Tensor):
        raise LossInputError(
            f"{where}'observed' must be a torch.Tensor of -1/0/1; got {type(observed).__name__}")
    if not logits.is_floating_point():
        raise LossInputError(
            f"{where}'logits' must be a float tensor; got dtype {logits.dtype} "
            "(convert with logits.float())")
    if logits.ndim not in (2, 3):
        raise LossInputError(
            f"{where}'logits' must have shape (B, C) or (T, B, C); got shape {tuple(logits.shape)}")
    if tuple(observed.shape) not in (tuple(logits.shape[-2:]), tuple(logits.shape)):
        raise LossInputError(
            f"{where}'observed' must have shape {tuple(logits.shape[-2:])} (or the logits' full "
            f"shape {tuple(logits.shape)}); got {tuple(observed.shape)}")
    if observed.is_floating_point() and not allow_soft:
        raise LossInputError(
            f"{where}'observed' must be an integer tensor with values -1/0/1; got dtype "
            f"{observed.dtype} (convert with observed.to(torch.int8))")
    if observed.dtype == torch.bool:
        observed = observed.to(torch.int8)
    if not observed.is_floating_point() and observed.numel():
        bad = (observed != 0) & (observed != 1) & (observed != -1)
        if bool(bad.any()):
            raise LossInputError(
                f"{where}'observed' must hold only -1 (negative), 0 (unobserved), 1 (positive); "
                f"got {sorted(set(observed[bad].unique().tolist()))[:5]}")
    if hparams:
        t = logits.shape[0] if logits.ndim == 3 else None
        for name, value in hparams.items():
            if isinstance(value, Tensor) and value.ndim == 1:
                if t is None:
                    raise LossInputError(
                        f"{where}hyperparameter '{name}' has one value per trial (shape "
                        f"{tuple(value.shape)}) but 'logits' has no trial axis (shape "
                        f"{tuple(logits.shape)}); pass logits of shape (T, B, C)")
                if value.shape[0] != t:
                    raise LossInputError(
                        f"{where}hyperparameter '{name}' must have shape ({t},) to match the "
                        f"trial axis of 'logits' {tuple(logits.shape)}; got {tuple(value.shape)}")
    return promote(logits), observed.to(logits.device)


def check_state_arg(loss: str, arg: str, value: Any, z: Tensor, kind: str, holds: str,
                    start: str, exact: bool = False) -> Tensor:
    """A pure function's per-example state ``arg``: a ``kind`` ("float" or "bool") tensor shaped
    like the batch ``(B, C)`` or the logits (``exact``: the logits only), on ``z``'s device;
    else an error naming what it ``holds`` and how to ``start`` it."""
    if not isinstance(value, Tensor) or (
            value.dtype != torch.bool if kind == "bool" else not value.is_floating_point()):
        got = getattr(value, "dtype", type(value).__name__)
        raise LossInputError(f"{loss}: '{arg}' must be a {kind} tensor ({holds}); got {got} "
                             f"(start from {start})")
    want = [tuple(z.shape)] if exact else [tuple(z.shape[-2:]), tuple(z.shape)]
    if tuple(value.shape) not in want:
        shape = "the logits' shape" if exact else "shape"
        raise LossInputError(f"{loss}: '{arg}' must have {shape} "
                             f"{' or '.join(map(str, want))}; got {tuple(value.shape)}")
    return value.to(z.device)


def check_hparams(specs: tuple[HParam, ...], given: dict[str, Any], loss: str) -> dict[str, Any]:
    """Validate a dict of hyperparameters against specs: unknown names, ranges; fill defaults."""
    by_name = {s.name: s for s in specs}
    for name in given:
        if name not in by_name:
            hint = close_matches(name, list(by_name), cutoff=0.6)
            raise LossInputError(
                f"{loss}: unknown hyperparameter '{name}'"
                + (f"; did you mean '{hint[0]}'?" if hint else "")
                + f" (known: {', '.join(by_name) or 'none'})")
    return {s.name: check_hparam(s, given.get(s.name, s.default), loss) for s in specs}


def check_call(loss: str, logits: Tensor, observed: Tensor, given: dict[HParam, Any]
               ) -> tuple[Tensor, Tensor, dict[str, Any], dict[str, Any]]:
    """A pure function's checks: each given hyperparameter against its spec, then the inputs.
    Returns the promoted logits, the observed labels, the values by name and their :func:`hp`
    views."""
    values = {s.name: check_hparam(s, v, loss) for s, v in given.items()}
    z, y = check_inputs(logits, observed, values, loss=loss)
    return z, y, values, {k: hp(v, z) for k, v in values.items()}


