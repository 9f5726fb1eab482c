"""Generalized Robust Loss — Chen et al., "Boosting Single Positive Multi-label Classification with
Generalized Robust Loss", IJCAI 2024, Eqs. 4, 7, 11, 14, schedule Eqs. 9, 10, 12, 13; spec:
docs/losses.md "Generalized Robust Loss", the formula in :class:`GR`'s ``formula``. Every L is
computed from logits (:func:`_gce_logits`); an observed negative (y=−1) is a known negative,
k̂ = 0 and v = 1 there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._base import HParam, Loss, register
from ._hparams import LossInputError, LossOutput, check_call, check_inputs, hp, mean_bc, promote

__all__ = ["GRParts", "gr", "gr_framework"]

PAPER = (
    "Chen et al., Boosting Single Positive Multi-label Classification with Generalized Robust "
    "Loss, IJCAI 2024")

#: q below which the L's take their −log limit (Python numbers) or are clamped (tensors): there
#: −expm1(q·x)/q and −x differ by a relative q·|x|/2 ≤ 5e-11 for |x| ≤ 100.
Q_TINY = 1e-12
#: robust=False (paper Table 3, "×" in the L column): q1 = q2 = q3 = 0.01
Q_NOT_ROBUST = 0.01
_KV = ("w", "b", "mu", "sigma")

# the current values, as taken by the pure function (defaults: COCO's final values, Table 6)
_W = HParam("w", 10.0, "slope w of k̂ = σ(w·p + b) (Eq. 7)")
_B = HParam("b", -8.0, "intercept b of k̂ = σ(w·p + b); τ = −b/w is k̂'s threshold (Eq. 8)")
_MU = HParam("mu", 0.8, "centre μ of v = exp(−(p − μ)²/(2σ²)) (Eq. 11)")
_SIGMA = HParam("sigma", 0.5, "width σ of v = exp(−(p − μ)²/(2σ²)) (Eq. 11)", low=0.0,
                low_open=True)
_Q1 = HParam("q1", 0.01, "robustness q1 of L1 on positives (0 = −log p, the released code)",
             low=0.0)
_Q2 = HParam("q2", 0.01, "robustness q2 of L2, the pseudo-positive part (0 = −log p)", low=0.0,
             search=(0.001, 1.0), log=True)
_Q3 = HParam("q3", 1.0, "robustness q3 of L3, the negative part (1 = MAE, 0 = −log(1−p))",
             low=0.0, search=(0.01, 2.0), log=True)
_USE_K = HParam("use_k", True, "use the pseudo-label k̂ (False: k̂ ≡ 0, Table 3)", kind="bool")
_USE_V = HParam("use_v", True, "use the weight v (False: v ≡ 1, Table 3)", kind="bool")
_ROBUST = HParam("robust", True, "use q1, q2, q3 (False: q1 = q2 = q3 = 0.01, Table 3)",
                 kind="bool")
_LEARN_KV = HParam("learn_kv", False, "train (w, b, μ, σ) by gradient descent instead of the "
                   "schedule (Table 3, last row)", kind="bool")

#: GR's hyperparameters (the scheduled w, b, μ, σ, the q's and the switches), shared with GPR
GR_SPECS = (
    replace(_W, name="w_0", default=0.0,
            doc="initial w (Assumption 1: k̂ constant early; released code 0)"),
    replace(_W, name="w_T", doc="final w (Table 6: VOC 2, COCO/NUS/CUB 10); τ = −b_T/w_T, best "
            "near 1 (Fig. 2a)", search=(2.0, 16.0)),
    replace(_B, name="b_0", default=-2.0, doc="initial b (released code −2)"),
    replace(_B, name="b_T", doc="final b (Table 6: VOC −2, COCO/NUS/CUB −8; Fig. 2a: −2, −5, −8)",
            search=(-8.0, -2.0)),
    replace(_MU, name="mu_0", default=0.5, doc="initial μ (released code 0.5)"),
    replace(_MU, name="mu_T", doc="final μ (Table 6: 0.8; Fig. 2b: 0.2–1, best 0.8)",
            search=(0.2, 1.0)),
    replace(_SIGMA, name="sigma_0", default=2.0, doc="initial σ (released code 2)"),
    replace(_SIGMA, name="sigma_T", doc="final σ (Table 6: 0.5; Fig. 2b: 0.1, 0.5, 1)",
            search=(0.1, 1.0), log=True),
    _Q1, _Q2, _Q3, _USE_K, _USE_V, _ROBUST, _LEARN_KV)


class GRParts(NamedTuple):
    """GR's named parts: the loss ((T,) or scalar) and per-entry tensors shaped like the logits.

    ``k_hat``: the soft target actually used: 1 on y=1, k̂ on y=0, 0 on y=−1 (0 on y=0 when
    ``use_k=False``). ``v``: 1 on y≠0, v on y=0. ``l1``, ``l2``, ``l3``: the three surrogate
    losses evaluated on every entry (ℓ = l1 on y=1, v·(k̂·l2 + (1−k̂)·l3) on y=0, l3 on y=−1).
    """

    loss: Tensor
    k_hat: Tensor
    v: Tensor
    l1: Tensor
    l2: Tensor
    l3: Tensor


def _gce_logits(z: Tensor, q, negative: bool) -> Tensor:
    """(1 − x^q)/q (Eq. 14) for x = σ(z), or x = σ(−z) = 1 − σ(z) (``negative``), as
    −expm1(q·log x)/q from log x = logsigmoid(±z): stable for all q ≥ 0, q = 0 gives −log x
    exactly (a per-trial q is clamped at :data:`Q_TINY`, the gradient −x^q stays finite). A
    number q = 1 (L3's paper value) is 1 − x, computed directly as a sigmoid."""
    if not isinstance(q, Tensor) and q == 1.0:
        return torch.sigmoid(z if negative else -z)
    log_x = F.logsigmoid(-z if negative else z)
    if isinstance(q, Tensor):
        q = q.clamp_min(Q_TINY)
        return torch.expm1(q * log_x) / -q
    return -log_x if q < Q_TINY else torch.expm1(q * log_x) * (-1.0 / q)


def gauss_coef(sigma):
    """−1/(2σ²), the exponent's factor in v (σ² clamped away from 0 for learned σ)."""
    if isinstance(sigma, Tensor):
        return -0.5 / sigma.square().clamp_min(1e-12)
    return -0.5 / (sigma * sigma)


def gr_core(z: Tensor, y: Tensor, w, b, mu, sigma, q1, q2, q3, use_k: bool, use_v: bool) -> GRParts:
    """GR on promoted logits z (…, B, C) and observed y; hyperparameters already viewed by hp().
    k̂ and v are masked once (k̂ = 0, v = 1 on y=−1; k̂ = 1 on y=1), so one ``where`` picks L1
    on y=1 and v·lerp(L3, L2, k̂) = v·[k̂·L2 + (1−k̂)·L3] everywhere else."""
    p = torch.sigmoid(z.detach())  # sg(p): k̂ and v calibrate the output, no gradient through p
    unobs, positive = y == 0, y > 0
    k_hat = (torch.where(unobs, torch.sigmoid(p * w + b), positive) if use_k
             else positive.to(z.dtype).expand_as(p))
    v = (torch.where(unobs, torch.exp((p - mu).square() * gauss_coef(sigma)), 1.0) if use_v
         else torch.ones_like(p))
    l1 = _gce_logits(z, q1, negative=False)
    same_q = not isinstance(q1, Tensor) and not isinstance(q2, Tensor) and q1 == q2
    l2 = l1 if same_q else _gce_logits(z, q2, negative=False)
    l3 = _gce_logits(z, q3, negative=True)
    rest = torch.lerp(l3, l2, k_hat) if use_k else l3
    if use_v:
        rest = v * rest
    entries = torch.where(positive, l1, rest)
    return GRParts(mean_bc(entries), k_hat, v, l1, l2, l3)


def gr(logits: Tensor, observed: Tensor, w: float | Tensor = 10.0, b: float | Tensor = -8.0,
       mu: float | Tensor = 0.8, sigma: float | Tensor = 0.5, q1: float | Tensor = 0.01,
       q2: float | Tensor = 0.01, q3: float | Tensor = 1.0, use_k: bool = True, use_v: bool = True,
       robust: bool = True, return_parts: bool = False) -> Tensor | GRParts:
    """GR loss at fixed (w, b, μ, σ) (paper Eqs. 4, 5, 7, 11, 14); mean over B·C.

    ``w, b, mu, sigma`` are the *current* values (the schedule is the registered object's job);
    the defaults are COCO's final values (Table 6). ``q = 0`` is the exact −log limit.
    ``use_k=False`` sets k̂ ≡ 0, ``use_v=False`` sets v ≡ 1, ``robust=False`` replaces q1, q2, q3
    by 0.01 (Table 3's ablation). With ``return_parts`` returns :class:`GRParts`
    ``(loss, k_hat, v, l1, l2, l3)``.
    """
    if not isinstance(return_parts, bool):
        raise LossInputError(f"gr: 'return_parts' must be True or False; got {return_parts!r}")
    z, y, _, h = check_call("gr", logits, observed, {
        _W: w, _B: b, _MU: mu, _SIGMA: sigma, _Q1: q1, _Q2: q2, _Q3: q3, _USE_K: use_k,
        _USE_V: use_v, _ROBUST: robust})
    qs = (h["q1"], h["q2"], h["q3"]) if robust else (Q_NOT_ROBUST,) * 3
    parts = gr_core(z, y, h["w"], h["b"], h["mu"], h["sigma"], *qs, use_k, use_v)
    return parts if return_parts else parts.loss


def gr_framework(k_hat: Callable[[Tensor], Tensor] | float, v: Callable[[Tensor], Tensor] | float,
                 l1: Callable[[Tensor], Tensor], l2: Callable[[Tensor], Tensor] | None,
                 l3: Callable[[Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """The GR framework as a building block (paper Eqs. 4-5, Table 1), for teaching.

    ``k_hat`` and ``v`` are numbers or callables of the stop-gradient probabilities sg(p);
    ``l1``, ``l2``, ``l3`` are callables of the logits z returning per-entry losses (use
    ``F.logsigmoid`` for logs). ``l2=None`` stands for Table 1's "undefined" and requires
    k̂ = 0 on every unobserved entry. Returns ``loss(logits, observed)``:
    mean over B·C of ℓ = l1 on y=1, v·[k̂·l2 + (1−k̂)·l3] on y=0, l3 on y=−1.

    Example — Hill loss as in Table 1 (k̂ = 0, v = 1, L1 = −log p, L3 = (1.5 − p)p²)::

        hill_t1 = gr_framework(k_hat=0.0, v=1.0, l1=lambda z: -F.logsigmoid(z), l2=None,
                               l3=lambda z: (1.5 - torch.sigmoid(z)) * torch.sigmoid(z) ** 2)
    """
    for name, fn in (("k_hat", k_hat), ("v", v), ("l1", l1), ("l3", l3)):
        if not callable(fn) and (name in ("l1", "l3") or not isinstance(fn, int | float)):
            raise LossInputError(
                f"gr_framework: '{name}' must be a callable"
                + (" or a number" if name in ("k_hat", "v") else "")
                + f"; got {type(fn).__name__}")
    if l2 is not None and not callable(l2):
        raise LossInputError(f"gr_framework: 'l2' must be a callable or None; got {l2!r}")

    def component(fn, p: Tensor) -> Tensor:
        out = fn(p) if callable(fn) else torch.full_like(p, float(fn))
        return torch.as_tensor(out, dtype=p.dtype, device=p.device).expand_as(p)

    def loss(logits: Tensor, observed: Tensor) -> Tensor:
        z, y = check_inputs(logits, observed, loss="gr_framework")
        p = torch.sigmoid(z.detach())
        unobs = y == 0
        k = torch.where(unobs, component(k_hat, p), 0.0)
        weight = torch.where(unobs, component(v, p), 1.0)
        rest = (1 - k) * l3(z)
        if l2 is None:
            if bool((k != 0).any()):
                raise LossInputError(
                    "gr_framework: 'l2' is None (undefined) but k_hat is non-zero on some "
                    "unobserved entries; pass an l2 callable")
        else:
            rest = rest + k * l2(z)
        return mean_bc(torch.where(y > 0, l1(z), weight * rest))

    return loss


@register
class GR(Loss):
    """GR loss with its linear schedule of (w, b, μ, σ) and the paper's ablation switches."""

    name = "gr"
    stacks_seeds = True  # a (T, B) index: reads no per-example state
    paper = PAPER + ", Eqs. 4, 7, 11, 14 (schedule Eqs. 9, 10, 12, 13)"
    formula = (
        "k̂ = σ(w·sg(p) + b);  v = exp(−(sg(p) − μ)²/(2σ²)) on y=0, 1 elsewhere\n"
        "L1 = (1 − p^q1)/q1;  L2 = (1 − p^q2)/q2;  L3 = (1 − (1−p)^q3)/q3   (q = 0: −log)\n"
        "y=1: L1;  y=0: v·[k̂·L2 + (1−k̂)·L3];  y=−1: L3;  mean over B·C\n"
        "w, b, μ, σ: v_0 + (v_T − v_0)·e/(E−1) at 0-indexed epoch e of E")
    hparam_specs = GR_SPECS
    trial_state = tuple(f"kv_{n}" for n in _KV)  # learn_kv's parameters (absent otherwise)
    stacks_draws = True  # per-trial (T, B, C) observed broadcast entry by entry
    # paper Table 6 (q1 = 0.01 throughout, Sec. 4.4)
    presets = {
        "voc": {"w_T": 2.0, "b_T": -2.0, "mu_T": 0.8, "sigma_T": 0.5, "q2": 0.01, "q3": 1.0},
        "coco": {"w_T": 10.0, "b_T": -8.0, "mu_T": 0.8, "sigma_T": 0.5, "q2": 0.01, "q3": 1.0},
        "nus": {"w_T": 10.0, "b_T": -8.0, "mu_T": 0.8, "sigma_T": 0.5, "q2": 0.01, "q3": 1.0},
        "cub": {"w_T": 10.0, "b_T": -8.0, "mu_T": 0.8, "sigma_T": 0.5, "q2": 0.01, "q3": 1.5}}
    # lr is Table 6's backbone rate; the released code (config.py lr_mult=10) trains the linear
    # head at head_lr_mult × lr, which is what a linear probe trains
    train_presets = {
        "voc": {"batch_size": 8, "lr": 1e-5, "epochs": 8, "head_lr_mult": 10},
        "coco": {"batch_size": 16, "lr": 1e-5, "epochs": 8, "head_lr_mult": 10},
        "nus": {"batch_size": 16, "lr": 1e-5, "epochs": 10, "head_lr_mult": 10},
        "cub": {"batch_size": 8, "lr": 5e-5, "epochs": 10, "head_lr_mult": 10}}
    notes = """\
Defaults are COCO's values (Table 6); presets voc/coco/nus/cub set the final values, q2, q3.
Start values (w_0, b_0, μ_0, σ_0) = (0, −2, 0.5, 2) are the released code's (yan4xi1/GRLoss).
Schedule: docs/losses.md's e/(E−1), reaching the final values in the last epoch. The released code
uses e/E for (w, b) and (e+1)/E for (μ, σ) (0-indexed e), so its w, b never reach w_T, b_T.
Table 6's lr is the backbone's; the released code trains the linear head at 10× that lr.
The released code uses −log p on positives (q1 = 0); the paper sets q1 = 0.01 (our default).
robust=False replaces q1, q2, q3 by 0.01 (Table 3); with use_k=False, use_v=False as well each
entry is (1 − e^{−0.01·a})/0.01 of AN's entry a: Table 3's "AN assumption", equal to AN only
in the limit q → 0 (q1 = q2 = q3 = 0 with use_k=use_v=False gives AN exactly).
Observed negatives (y = −1) get L3 with k̂ = 0, v = 1 (the released code gives them 0).
learn_kv=True (Table 3's "◦" row): w, b, μ, σ are nn.Parameters of shape (T,) shared by all
classes, created in setup() at (w_0, b_0, μ_0, σ_0) and trained with the head's optimizer
(extra_parameters, lr_mult 1) on the loss itself; the schedule and the *_T values are unused.
The released code instead learns (w, b) only, one pair per class (a logistic regression on
sg(p)), with its own SGD (lr 0.1, momentum 0.9, weight decay 1e-3), keeping μ, σ scheduled.
Minimising the loss over these parameters drives k̂ toward the smaller of L2, L3 and v toward
0 (σ → 0): a likely reason why the paper finds the learned variant worse.
parts: k_hat, v, l1, l2, l3 per entry (…, B, C), detached (see GRParts)."""

    def __init__(self, **hparams: Any) -> None:
        super().__init__(**hparams)
        self._now: dict[str, float] = {}
        self._refresh_schedule()

    def _fractions(self) -> dict[str, float]:
        """How far each of w, b, μ, σ has moved from v_0 to v_T: e/(E−1) of the 0-indexed epoch."""
        frac = 1.0 if self.n_epochs <= 1 else min(max(self.epoch / (self.n_epochs - 1), 0.0), 1.0)
        return dict.fromkeys(_KV, frac)

    def _refresh_schedule(self) -> None:
        """Set the current (w, b, μ, σ): Python floats, or (T,) non-persistent buffers."""
        for n, frac in self._fractions().items():
            v0, vt = self.hparam(f"{n}_0"), self.hparam(f"{n}_T")
            value = v0 + (vt - v0) * frac
            buf = f"now_{n}"
            if isinstance(value, Tensor):
                self._now.pop(n, None)
                old = self._buffers.get(buf)
                if old is not None and old.shape == value.shape and old.dtype == value.dtype:
                    old.copy_(value)
                else:
                    self.register_buffer(buf, value.clone(), persistent=False)
            else:
                self._buffers.pop(buf, None)
                self._now[n] = float(value)

    def schedule_values(self) -> dict[str, float | Tensor]:
        """The scheduled (w, b, μ, σ) of the current epoch (floats or (T,) tensors)."""
        return {n: self._now[n] if n in self._now else self._buffers[f"now_{n}"] for n in _KV}

    def set_hparam(self, name: str, value: Any) -> None:
        super().set_hparam(name, value)
        self._refresh_schedule()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # the current values are derived (non-persistent): recompute from the loaded endpoints
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._refresh_schedule()

    def setup(self, observed: Tensor, n_epochs: int, n_trials: int | None = None) -> None:
        super().setup(observed, n_epochs, n_trials)
        self.epoch = 0
        self._refresh_schedule()
        if self.hparam("learn_kv"):
            t = self.n_trials or 1
            for n in _KV:  # a number: the default dtype; a tensor: its own
                start = torch.as_tensor(self.hparam(f"{n}_0"))
                self.register_parameter(f"kv_{n}", nn.Parameter(start.expand(t).clone()))

    def start_epoch(self, epoch: int) -> None:
        super().start_epoch(epoch)
        self._refresh_schedule()

    def select_trials(self, keep: list[int]) -> None:
        super().select_trials(keep)
        self._refresh_schedule()  # the current (w, b, μ, σ) derive from the kept endpoints

    def extra_parameters(self) -> list[tuple[nn.Parameter, float]]:
        if not self.hparam("learn_kv") or "kv_w" not in self._parameters:
            return []
        return [(self._parameters[f"kv_{n}"], 1.0) for n in _KV]

    def _current(self, z: Tensor) -> list:
        if not self.hparam("learn_kv"):
            return [hp(v, z) for v in self.schedule_values().values()]
        if "kv_w" not in self._parameters:
            raise LossInputError(
                "gr: learn_kv=True creates (w, b, mu, sigma) in setup(); call "
                "loss.setup(observed_train, n_epochs, n_trials) before the first forward")
        params = [self._parameters[f"kv_{n}"] for n in _KV]
        if z.ndim == 2:
            if params[0].numel() != 1:
                raise LossInputError(
                    f"gr: learned (w, b, mu, sigma) have {params[0].numel()} trials but 'logits' "
                    f"has no trial axis (shape {tuple(z.shape)})")
            return [prm.to(z.dtype).reshape(()) for prm in params]
        return [hp(prm, z) for prm in params]

    def _qs(self, z: Tensor) -> list:
        """q1, q2, q3 viewed for ``z`` (0.01 each with robust=False)."""
        if not self.hparam("robust"):
            return [Q_NOT_ROBUST] * 3
        return [hp(self.hparam(q), z) for q in ("q1", "q2", "q3")]

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        out = gr_core(z, observed, *self._current(z), *self._qs(z), self.hparam("use_k"),
                      self.hparam("use_v"))
        parts = {k: getattr(out, k).detach() for k in ("k_hat", "v", "l1", "l2", "l3")}
        return LossOutput(out.loss, parts)
