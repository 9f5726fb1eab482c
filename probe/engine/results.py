"""What a probe run produces: per-trial results, the results JSON and saved heads.

:class:`ProbeResult` is what :func:`probe.train_probe` returns; :meth:`ProbeResult.write_json`
writes the results file (strict JSON, atomically); :func:`save_head` / :func:`load_head` store
trained heads in ``nn.Linear`` layout with what is needed to use and reproduce them.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import json
import math
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from probe.engine.config import ProbeConfigError
from probe.errors import MissingPathError
from probe.io import atomic_write, atomic_write_text
from probe.progress import plural

__all__ = ["BestEpoch", "EpochReport", "ProbeResult", "TrialResult", "environment_info",
           "from_linear", "load_head", "loss_package", "save_head", "to_linear", "trials_of",
           "versioned", "write_json_atomic"]

_HEAD_FORMAT = "spml-probe-head/1"
_RESULT_FORMAT = "spml-probe-result/1"


@dataclass
class EpochReport:
    """What the per-epoch callback sees (lists indexed by trial; None for stopped trials)."""

    epoch: int  # the epoch just trained, counted from 1 like every output (1..epochs)
    train_loss: list[float | None]
    val_map: list[float | None]
    test_map: list[float | None]
    active: list[bool]
    # the active trials' current heads (n_active, D+1, C) in trial order, bias in the last row,
    # on the training device; read-only
    heads: Tensor | None = None


def _figure(key: str, doc: str) -> property:
    return property(lambda self: self.get(key), doc=doc)


class BestEpoch(dict):
    """A trial's best epoch (selected on val): its figures, in percent, as a dict
    (``best["test_map"]``, JSON) with typed attribute access (``best.test_map``; None where the
    run did not measure it, e.g. ``test_map_low`` without test intervals)."""

    __slots__ = ()

    val_map = _figure("val_map", "val mAP (percent)")
    test_map = _figure("test_map", "test mAP (percent)")
    test_map_low = _figure("test_map_low", "the test mAP's 95% interval, low end")
    test_map_high = _figure("test_map_high", "the test mAP's 95% interval, high end")
    val_OF1 = _figure("val_OF1", "val overall F1 (percent)")
    val_CF1 = _figure("val_CF1", "val per-class F1 (percent)")
    test_OF1 = _figure("test_OF1", "test overall F1 (percent)")
    test_CF1 = _figure("test_CF1", "test per-class F1 (percent)")
    val_ap = _figure("val_ap", "val AP per class (percent)")
    test_ap = _figure("test_ap", "test AP per class (percent)")

    def to_dict(self) -> dict[str, Any]:
        return dict(self)


@dataclass
class TrialResult:
    """One trial: its settings, per-epoch metrics and its best epoch (selected on val;
    :class:`BestEpoch`, a dict with typed attribute access)."""

    trial: int
    seed: int
    hparams: dict[str, Any]  # the loss's hyperparameters, defaults included
    lr: float
    weight_decay: float
    init: dict[str, float] = field(default_factory=dict)  # val/test mAP of the untrained head
    # one row per trained epoch: {"epoch": 1, "train_loss", "val_map", ...}; epochs count from 1
    epochs: list[dict[str, Any]] = field(default_factory=list)
    best_epoch: int | None = None  # 1..epochs (0 only for a model that trains no epoch: kNN)
    best: BestEpoch = field(default_factory=BestEpoch)
    stopped_at: int | None = None  # the last epoch the trial trained (pruned), from 1
    finite: bool = True  # False once its training loss or metrics went NaN/inf

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "best" and not isinstance(value, BestEpoch):
            value = BestEpoch(value or {})  # a plain dict given or assigned becomes typed
        object.__setattr__(self, name, value)


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
        return {"format": _RESULT_FORMAT, "loss": self.loss,
                "loss_package": loss_package(self.loss), "config": self.config,
                "dataset": self.dataset, "data": self.source, "environment": self.environment,
                "n_trials": self.n_trials, "shared_batch_order": self.shared_batch_order,
                "best_trial": self.best_trial(), "class_names": self.class_names,
                "trials": [asdict(t) for t in self.trials], "timing": self.timing}

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
        return to_linear(heads[trial])


def trials_of(result: ProbeResult, trials: range, **changes: Any) -> ProbeResult:
    """The trials ``trials`` (a contiguous range) of a stacked run as a result of their own:
    renumbered from 0, their heads cloned (the stacked run's tensors are not kept alive), and
    ``changes`` (``source``, ``config``, ``timing``, ...) replacing the run's fields. How a
    stacked table cell, replicate or grid setting becomes the result of its own run."""
    rows = [replace(t, trial=i) for i, t in enumerate(result.trials[trials.start:trials.stop])]
    heads: dict[str, Any] = {}
    for name in ("best_heads", "final_heads"):
        stack = getattr(result, name)
        heads[name] = None if stack is None else stack[trials.start:trials.stop].clone()
    return replace(result, trials=rows, **heads, **changes)


def loss_package(loss: str) -> dict[str, str] | None:
    """The distribution that provides loss ``loss`` and its version (``{"name", "version"}``):
    spml-probe for a built-in loss, the plugin's package for a plugin; None where unknown."""
    try:
        from probe.losses import get_loss_class

        name = _packages()[get_loss_class(loss).__module__.split(".")[0]][0]
        return {"name": name, "version": md.version(name)}
    except Exception:  # an unknown or broken loss, no distribution: the record says nothing
        return None


@functools.cache
def _packages() -> dict[str, list[str]]:
    """Top-level module -> distributions (read once per process)."""
    return dict(md.packages_distributions())


def to_linear(w_aug: Tensor) -> nn.Linear:
    """A ``(D+1, C)`` head (bias in the last row, the engine's layout) as ``nn.Linear``."""
    d = w_aug.shape[0] - 1
    lin = nn.Linear(d, w_aug.shape[1])
    with torch.no_grad():
        lin.weight.copy_(w_aug[:d].T)
        lin.bias.copy_(w_aug[d])
    return lin


def from_linear(lin: nn.Linear) -> Tensor:
    """An ``nn.Linear`` as a ``(D+1, C)`` head (bias in the last row): :func:`to_linear`'s
    inverse."""
    return torch.cat([lin.weight.detach().T, lin.bias.detach()[None]])


def write_json_atomic(path: str | Path, payload: Any) -> Path:
    """JSON to ``path`` via a temporary file in the same directory and ``os.replace``;
    non-finite numbers are written as null. A record (a dict) is stamped with the version of
    spml-probe that wrote it (``"spml_version"``, first key) unless it carries one already."""
    text = json.dumps(_strict(versioned(payload)), indent=1, allow_nan=False,
                      default=_json_default)
    return atomic_write_text(path, text)


def versioned(payload: Any) -> Any:
    """``payload`` with ``"spml_version"`` (the ``spml --version`` number) first, for a dict."""
    if not isinstance(payload, dict) or "spml_version" in payload:
        return payload
    from probe import __version__

    return {"spml_version": __version__, **payload}


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
    meta = versioned({"trials": [asdict(result.trials[t]) for t in idx],
                      "which": "best" if best else "final", "loss": result.loss,
                      "config": result.config, "class_names": result.class_names,
                      "dataset": result.dataset, "data": result.source,
                      "environment": result.environment})
    payload = {
        "format": _HEAD_FORMAT,
        "weight": heads[idx, :d].transpose(1, 2).contiguous(),
        "bias": heads[idx, d].contiguous(),
        # plain JSON types only, so torch.load(weights_only=True) reads the file back
        **json.loads(json.dumps(meta, default=_json_default))}
    return atomic_write(path, lambda fh: torch.save(payload, fh))


def load_head(path: str | Path, trial: int = 0) -> tuple[nn.Linear, dict[str, Any]]:
    """``(nn.Linear, metadata)`` of one trial saved by :func:`save_head`."""
    path = Path(path)
    if not path.is_file():
        raise MissingPathError(f"--eval-head {path}: no such head file")
    save = "save heads with 'spml probe STORE --loss LOSS --save-head PATH.pt'"
    kind = _file_kind(path)
    if kind is not None:  # say what it is, not what torch's unpickler made of it
        raise ProbeConfigError(f"{path} is {kind}, not a readable spml-probe head file; {save}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # torch raises several types for a foreign or corrupt file
        raise ProbeConfigError(
            f"{path} is not a readable spml-probe head file (torch cannot read it: another "
            f"program's file, or a damaged head); {save}") from None
    if not isinstance(payload, dict) or payload.get("format") != _HEAD_FORMAT:
        raise ProbeConfigError(
            f"{path} is not an spml-probe head file (format {_HEAD_FORMAT!r}); save heads with "
            "'spml probe … --save-head PATH'")
    weight, bias = payload["weight"], payload["bias"]
    if not 0 <= trial < weight.shape[0]:
        raise ProbeConfigError(f"{path} holds {plural(weight.shape[0], 'heads')} (trials 0 to "
                               f"{weight.shape[0] - 1}); trial {trial} asked for")
    meta = {k: v for k, v in payload.items() if k not in ("weight", "bias")}
    return to_linear(torch.cat([weight[trial].T, bias[trial][None]])), meta


def _file_kind(path: Path) -> str | None:
    """What a file that cannot be a head (a zip or pickle written by ``torch.save``) is, in
    words: a probe results JSON, another JSON, a text/CSV file; None when it may be a head."""
    with open(path, "rb") as f:
        start = f.read(4096)
    if start[:2] == b"PK" or start[:1] == b"\x80":
        return None  # torch.save's zip, or a legacy pickle
    text = start.lstrip()
    if text[:1] in (b"{", b"["):
        try:
            record = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            return "a JSON file"
        if isinstance(record, dict) and "trials" in record:
            return ("the results JSON of a probe run ('spml probe --json'), which holds "
                    "metrics but no weights; re-run that probe with --save-head PATH.pt")
        return "a JSON file"
    try:
        line = start.decode("utf-8").splitlines()[0] if start else ""
    except UnicodeDecodeError:
        return None
    if not start:
        return "an empty file"
    return "a CSV file" if "," in line else "a text file"


def environment_info(device: torch.device) -> dict[str, Any]:
    env = {"torch": str(torch.__version__), "python": platform.python_version(),
           "platform": platform.platform(), "device": str(device),
           "threads": torch.get_num_threads()}
    if device.type == "cuda":
        env.update(device_name=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    else:
        env["device_name"] = platform.processor() or platform.machine()
    return env

