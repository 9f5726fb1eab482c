"""Adam and SGD for stacked trials: every parameter carries a leading trial axis ``T``.

The update of trial ``t`` is exactly the one ``torch.optim.Adam`` / ``torch.optim.SGD`` (default
options, L2 weight decay added to the gradient) would make on ``param[t]`` alone, with its own
learning rate and weight decay. A step never synchronises with the host: trials are grouped by
their ``(lr, weight_decay)`` pair (one call for a group of all trials, else one per group on the
slices ``param[t]``); Adam uses PyTorch's fused kernel where this device has it;
:meth:`StackedOptimizer.stop_trials` freezes trials (pruning). Gradients are passed to
:meth:`step` explicitly (``None`` skips a parameter, as ``torch.optim`` skips a None ``.grad``).
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from probe.errors import SpmlError
from probe.losses import trial_rows

__all__ = ["OptimizerConfigError", "StackedAdam", "StackedOptimizer", "StackedSGD", "TrialParam",
           "make_optimizer"]


class OptimizerConfigError(SpmlError):
    """Bad optimizer settings: the message names the setting, what was expected and what came."""


@dataclass
class TrialParam:
    """A tensor trained with one value of ``lr`` and ``weight_decay`` per trial.

    ``param`` has the trial axis first and is contiguous; ``lr``/``weight_decay`` are per-trial
    lists (a single number applies to every trial). ``trial_ids`` names the run's trial of each
    slice (default ``0, 1, …``), so that :meth:`StackedOptimizer.stop_trials` freezes the right
    slices of a per-trial loss object's state.
    """

    param: Tensor
    lr: Sequence[float] | float
    weight_decay: Sequence[float] | float = 0.0
    trial_ids: Sequence[int] | None = None

    def per_trial(self) -> TrialParam:
        """This parameter with lr, weight_decay and trial_ids as checked per-trial lists."""
        n = self.param.shape[0] if self.param.ndim else 1
        ids = list(range(n)) if self.trial_ids is None else [int(t) for t in self.trial_ids]
        if len(ids) != n:
            raise OptimizerConfigError(
                f"trial_ids: one id per slice of the leading axis ({n}); got {len(ids)}")
        out = []
        for name, value in (("lr", self.lr), ("weight_decay", self.weight_decay)):
            values = ([float(value)] * n if isinstance(value, int | float)
                      else [float(v) for v in value])
            if len(values) != n:
                raise OptimizerConfigError(
                    f"{name}: one value per trial expected ({n} trials, the parameter's leading "
                    f"axis of shape {tuple(self.param.shape)}); got {len(values)} values")
            for v in values:
                if not math.isfinite(v) or v < 0:
                    raise OptimizerConfigError(f"{name} must be a finite number >= 0; got {v!r}")
            out.append(values)
        return TrialParam(self.param, *out, ids)


class StackedOptimizer(ABC):
    """Shared bookkeeping of :class:`StackedAdam` / :class:`StackedSGD` (module docstring)."""

    def __init__(self, params: Sequence[TrialParam]) -> None:
        if not params:
            raise OptimizerConfigError("the optimizer got no parameters")
        for p in params:
            if p.param.ndim == 0:
                raise OptimizerConfigError(
                    "every parameter needs a leading trial axis; got a 0-d tensor (reshape it "
                    "to (1,) for a single trial)")
            if not p.param.is_contiguous():
                raise OptimizerConfigError(
                    f"parameters must be contiguous (trial slices are updated in place); got "
                    f"strides {p.param.stride()} for shape {tuple(p.param.shape)}")
        self.params = [p.per_trial() for p in params]
        self.n_steps = 0
        self._stopped: set[int] = set()
        self._groups = self._build_groups()

    def stop_trials(self, trials: Iterable[int]) -> None:
        """Freeze trials ``trials`` (trial ids) for the rest of the run: their slices of every
        parameter stop changing, and their optimizer state too."""
        known = {t for p in self.params for t in p.trial_ids}
        for t in trials:
            if int(t) not in known:
                raise OptimizerConfigError(
                    f"stop_trials: trial {t} is not one of this optimizer's trials "
                    f"({min(known)}..{max(known)})")
            self._stopped.add(int(t))
        self._groups = self._build_groups()

    @property
    def stopped(self) -> frozenset[int]:
        return frozenset(self._stopped)

    def select_trials(self, keep: Iterable[int], params: Sequence[Tensor]) -> None:
        """Keep only the trials ``keep`` (trial ids), each stepping exactly as it would have:
        a parameter without a kept trial leaves with its state; ``params`` are the surviving
        parameters' new tensors, in order, compacted by their owner to the kept rows."""
        kept = {int(t) for t in keep}
        survivors = [(i, [j for j, t in enumerate(p.trial_ids) if t in kept])
                     for i, p in enumerate(self.params)]
        survivors = [(i, rows) for i, rows in survivors if rows]
        if len(params) != len(survivors):
            raise OptimizerConfigError(
                f"select_trials: {len(survivors)} parameters keep a trial; got {len(params)} "
                "new tensors")
        for (i, rows), p in zip(survivors, params):
            want = (len(rows), *self.params[i].param.shape[1:])
            if tuple(p.shape) != want or not p.is_contiguous():
                raise OptimizerConfigError(
                    f"select_trials: parameter {i} needs a contiguous tensor of shape {want}; "
                    f"got {tuple(p.shape)}")
        self._select_state(survivors)
        old = self.params
        kept_params = []
        for (i, rows), p in zip(survivors, params):
            # the surviving trials' slices of each per-trial setting, in the survivors' order
            lr = [old[i].lr[j] for j in rows]
            weight_decay = [old[i].weight_decay[j] for j in rows]
            trial_ids = [old[i].trial_ids[j] for j in rows]
            kept_params.append(TrialParam(p, lr, weight_decay, trial_ids))
        self.params = kept_params
        self._stopped &= kept
        self._groups = self._build_groups()

    @abstractmethod
    def _select_state(self, survivors: list[tuple[int, list[int]]]) -> None:
        """Compact the per-parameter optimizer state to ``survivors`` (parameter, rows)."""

    def _build_groups(self) -> list[list[tuple[float, float, list[int] | None]]]:
        """Per parameter: ``(lr, wd, trials)`` groups; ``trials`` None = the whole tensor."""
        self._views: dict[tuple[int, int], list] = {}  # _slices' cache, per (param, group)
        groups = []
        for lr, wd, ids in ((p.lr, p.weight_decay, p.trial_ids) for p in self.params):
            by_key: dict[tuple[float, float], list[int]] = {}
            for t, key in enumerate(zip(lr, wd)):
                if ids[t] not in self._stopped:
                    by_key.setdefault(key, []).append(t)
            # one trial: the whole tensor; several: always trial slices, so that a trial's
            # update never depends on which others share the tensor (a vectorised kernel
            # treats a tensor's last few elements apart, at rounding level): a stopped trial
            # can leave the stack without changing the others by one bit
            if len(lr) == 1 and len(by_key) == 1:
                ((key, _),) = by_key.items()
                groups.append([(key[0], key[1], None)])
            else:
                groups.append([(k[0], k[1], ts) for k, ts in by_key.items()])
        return groups

    def _check_grads(self, grads: Sequence[Tensor | None]) -> None:
        if len(grads) != len(self.params):
            raise OptimizerConfigError(
                f"step() needs one gradient per parameter ({len(self.params)}); got {len(grads)}")

    def _slices(self, key: tuple[int, int], tensors: Sequence[Tensor],
                trials: list[int] | None) -> list[list[Tensor]]:
        """The whole tensors (one-element lists) or their trial slices. The slices of a tensor
        are made once and reused while the same tensor comes back (parameters, optimizer
        state, a reused gradient buffer): a step then costs no view creation per trial."""
        if trials is None:
            return [[t] for t in tensors]
        entry = self._views.setdefault(key, [None] * len(tensors))
        for n, t in enumerate(tensors):
            if entry[n] is None or entry[n][0] is not t:
                entry[n] = (t, [t[j] for j in trials])
        return [views for _, views in entry]

    @abstractmethod
    def step(self, grads: Sequence[Tensor | None]) -> None:
        """One update of every parameter with its gradient (``None`` = skip this parameter)."""


class StackedAdam(StackedOptimizer):
    """``torch.optim.Adam`` (Kingma & Ba 2015, as implemented by PyTorch) with a trial axis.

    Per trial: ``g ← g + wd·θ``; ``m ← lerp(m, g, 1−β1)``; ``v ← β2·v + (1−β2)·g²``;
    ``θ ← θ − lr/(1−β1^k) · m / (√v/√(1−β2^k) + ε)`` at step ``k``.
    ``fused``: None = use PyTorch's fused kernel where it runs on this device, True = require it,
    False = the single-tensor algorithm.
    """

    def __init__(self, params: Sequence[TrialParam], betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, fused: bool | None = None) -> None:
        super().__init__(params)
        b1, b2 = map(float, betas)
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise OptimizerConfigError(f"betas must lie in [0, 1); got {betas!r}")
        if not (eps >= 0.0 and math.isfinite(eps)):
            raise OptimizerConfigError(f"eps must be a finite number >= 0; got {eps!r}")
        self.betas, self.eps = (b1, b2), float(eps)
        self.exp_avg = [torch.zeros_like(p.param) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p.param) for p in self.params]
        self._denom = [torch.empty_like(p.param) for p in self.params]
        # the fused kernel reads the step count from a float tensor on the parameter's device
        self._step_t = [torch.zeros((), dtype=torch.float32, device=p.param.device)
                        for p in self.params]
        self._k = [0] * len(self.params)
        can_fuse = all(_fused_adam_runs(p.param.device, p.param.dtype) for p in self.params)
        if fused and not can_fuse:
            raise OptimizerConfigError(
                "fused=True: PyTorch's fused Adam kernel is not available for these parameters "
                f"(device {self.params[0].param.device}, dtype {self.params[0].param.dtype})")
        self.fused = can_fuse if fused is None else bool(fused)

    def _select_state(self, survivors: list[tuple[int, list[int]]]) -> None:
        self.exp_avg = [trial_rows(self.exp_avg[i], rows) for i, rows in survivors]
        self.exp_avg_sq = [trial_rows(self.exp_avg_sq[i], rows) for i, rows in survivors]
        self._denom = [torch.empty_like(m) for m in self.exp_avg]
        self._step_t = [self._step_t[i] for i, _ in survivors]
        self._k = [self._k[i] for i, _ in survivors]

    def step(self, grads: Sequence[Tensor | None]) -> None:
        self._check_grads(grads)
        self.n_steps += 1
        b1, b2 = self.betas
        for i, (p, grad) in enumerate(zip(self.params, grads)):
            if grad is None:
                continue
            self._k[i] += 1  # per-parameter step count, as torch.optim keeps it
            bc1 = 1.0 - b1 ** self._k[i]
            bc2_sqrt = math.sqrt(1.0 - b2 ** self._k[i])
            self._step_t[i].add_(1.0)
            tensors = (p.param, grad, self.exp_avg[i], self.exp_avg_sq[i], self._denom[i])
            for k, (lr, wd, trials) in enumerate(self._groups[i]):
                param, g, m, v, denom = self._slices((i, k), tensors, trials)
                if self.fused:
                    torch._fused_adam_(param, g, m, v, [], [self._step_t[i]] * len(param),
                                       lr=lr, beta1=b1, beta2=b2, weight_decay=wd, eps=self.eps,
                                       amsgrad=False, maximize=False)
                    continue
                for th, gr, ma, va, de in zip(param, g, m, v, denom):
                    if wd != 0.0:
                        gr = gr.add(th, alpha=wd)
                    ma.lerp_(gr, 1.0 - b1)
                    va.mul_(b2).addcmul_(gr, gr, value=1.0 - b2)
                    torch.sqrt(va, out=de)
                    de.div_(bc2_sqrt).add_(self.eps)
                    th.addcdiv_(ma, de, value=-lr / bc1)


class StackedSGD(StackedOptimizer):
    """``torch.optim.SGD`` (dampening 0, no Nesterov) with a trial axis.

    Per trial: ``g ← g + wd·θ``; with momentum μ > 0, ``b ← g`` at the first step, else
    ``b ← μ·b + g``, and ``g ← b``; then ``θ ← θ − lr·g``.
    """

    def __init__(self, params: Sequence[TrialParam], momentum: float = 0.0) -> None:
        super().__init__(params)
        if not 0.0 <= momentum <= 1.0:
            raise OptimizerConfigError(f"momentum must lie in [0, 1]; got {momentum!r}")
        self.momentum = float(momentum)
        self.buffers = [torch.zeros_like(p.param) for p in self.params] if momentum else []
        self._started = [False] * len(self.params)

    def _select_state(self, survivors: list[tuple[int, list[int]]]) -> None:
        if self.momentum:
            self.buffers = [trial_rows(self.buffers[i], rows) for i, rows in survivors]
        self._started = [self._started[i] for i, _ in survivors]

    def step(self, grads: Sequence[Tensor | None]) -> None:
        self._check_grads(grads)
        self.n_steps += 1
        for i, (p, grad) in enumerate(zip(self.params, grads)):
            if grad is None:
                continue
            first = not self._started[i]
            self._started[i] = True
            tensors = (p.param, grad, self.buffers[i] if self.momentum else grad)
            for k, (lr, wd, trials) in enumerate(self._groups[i]):
                param, g, buf = self._slices((i, k), tensors, trials)
                for th, gr, bu in zip(param, g, buf):
                    if wd != 0.0:
                        gr = gr.add(th, alpha=wd)
                    if self.momentum:
                        if first:
                            bu.copy_(gr)
                        else:
                            bu.mul_(self.momentum).add_(gr)
                        gr = bu
                    th.add_(gr, alpha=-lr)


@functools.cache
def _fused_adam_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch._fused_adam_`` runs on ``device`` for ``dtype`` (tried once, on a tiny
    tensor)."""
    if not hasattr(torch, "_fused_adam_") or dtype not in (torch.float32, torch.float64):
        return False
    try:
        t = [torch.zeros(2, dtype=dtype, device=device) for _ in range(4)]
        step = torch.ones((), dtype=torch.float32, device=device)
        torch._fused_adam_([t[0]], [t[1]], [t[2]], [t[3]], [], [step], lr=1e-3, beta1=0.9,
                           beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


OPTIMIZERS = ("adam", "sgd")


def make_optimizer(name: str, params: Sequence[TrialParam], *, momentum: float = 0.9,
                   betas: tuple[float, float] = (0.9, 0.999),
                   eps: float = 1e-8) -> StackedOptimizer:
    """``"adam"`` → :class:`StackedAdam`, ``"sgd"`` → :class:`StackedSGD` (with ``momentum``)."""
    if name == "adam":
        return StackedAdam(params, betas=betas, eps=eps)
    if name == "sgd":
        return StackedSGD(params, momentum=momentum)
    raise OptimizerConfigError(f"optimizer must be one of {list(OPTIMIZERS)}; got {name!r}")
