"""Positive-unlabeled multi-label loss — PU-MLC (Yuan, Zhang & Huang, "Positive Label Is All You
Need for Multi-Label Classification", arXiv 2306.16016, Eqs. 8, 10, 11), built on vPU (Chen et al.,
"A Variational Approach for Learning from Positive and Unlabeled Data", NeurIPS 2020).
Spec: docs/losses.md "Positive-unlabeled", the formula in :class:`VPU`'s ``formula``; checked
against the authors' code (TAKELAMAG/PU-MLC, ``src/loss_functions/vpu_loss.py``).

* std is the population std over the batch (÷B, as the reference); the 1e-3 floor is ours.
* **No positive in a column** (of this batch): that class's second term is 0 (the reference
  zeroes 1/|P|), its unlabeled term stays.
* log(mean_b s) = logsumexp_b(log s) − log B, exact from logits even when every s underflows.
* MixUp (pairs, λ draws and why mixing logits is exact: :class:`VPU`'s notes): t = 1 on
  observed positives, σ(z) elsewhere; t̃ = λ t₁ + (1−λ) t₂, z̃ = λ z₁ + (1−λ) z₂ on the raw
  logits, the gradient flowing through the σ(z) targets as in the reference; a batch of 1 has
  no pair (L_reg = 0).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ._base import Loss, register
from ._hparams import HParam, LossInputError, LossOutput, check_call, hp, per_trial, promote

__all__ = ["vpu"]

PAPER = (
    "Yuan, Zhang & Huang, Positive Label Is All You Need for Multi-Label Classification "
    "(PU-MLC), arXiv 2306.16016, Eqs. 8, 10, 11; vPU: Chen et al., NeurIPS 2020")

_GAMMA = HParam("gamma", 0.55, "re-balance power γ on sg(mean_b s) (COCO 0.55, VOC 0.85)",
                low=0.0, search=(0.0, 2.0))
_TEMP_ALPHA = HParam("temp_alpha", 1.0, "α in the temperature τ_c = min(α·std_b(z_·c), 1) "
                     "(COCO 1, VOC 2)", low=0.0, low_open=True, search=(0.25, 4.0), log=True)
_MIX_WEIGHT = HParam("mix_weight", 1.0, "weight of the MixUp regulariser (paper: 1; 0 = off)",
                     low=0.0)
_MIX_ALPHA = HParam("mix_alpha", 0.3, "MixUp λ ~ Beta(mix_alpha, mix_alpha) (paper: 0.3)",
                    low=0.0, low_open=True)
_LAM = HParam("lam", None, "MixUp weight λ of the first half-batch", low=0.0, high=1.0,
              optional=True)

_TAU_MIN = 1e-3  # floor of the adaptive temperature (docs/losses.md); the reference has none
_LAM_BLOCK = 256  # λ draws per trial moved to the device at once (one transfer per 256 steps)


def _log_sigmoid(x: Tensor) -> Tensor:
    """log σ(x) = −softplus(−x): the same stable value as ``F.logsigmoid``, whose CPU kernel
    opens a thread pool per call (milliseconds per call on a busy 2-core machine)."""
    return -F.softplus(-x)


def _vpu_parts(z: Tensor, y: Tensor, gamma, temp_alpha, lam) -> tuple[Tensor, Tensor]:
    """(L_var, L_reg) for logits ``(…, B, C)``; hyperparameters numbers or ``(T, 1, 1)``."""
    b = z.shape[-2]
    zd = z.detach()
    # (…, 1, C) population std (÷B) as the reference; written out: torch.std over the row axis
    # is several times slower on CPU
    std = (zd - zd.mean(dim=-2, keepdim=True)).square().mean(dim=-2, keepdim=True).sqrt()
    tau = (temp_alpha * std).clamp(max=1.0).clamp(min=_TAU_MIN)
    log_s = _log_sigmoid(z / tau)  # (…, B, C)
    log_mean_s = torch.logsumexp(log_s, dim=-2) - math.log(b)  # (…, C)
    gamma_c = gamma.view(-1, 1) if isinstance(gamma, Tensor) and gamma.ndim == 3 else gamma
    weight = torch.exp(gamma_c * log_mean_s.detach())  # (mean_b s)^γ, exact for tiny means
    pos = (y == 1).to(z.dtype)
    n_pos = pos.sum(-2)  # (C,) or (T, C): no positive in a column → its positive term is 0
    pos_mean = (log_s * pos).sum(-2) / n_pos.clamp(min=1.0)
    var = (weight * log_mean_s - pos_mean).sum(-1)

    half = b // 2
    if half == 0:  # a single row has no MixUp partner
        return var, torch.zeros_like(var)
    z1, z2 = z[..., :half, :], z[..., b - half:, :]
    y1, y2 = y[..., :half, :], y[..., b - half:, :]
    log_t1 = torch.where(y1 == 1, torch.zeros_like(z1), _log_sigmoid(z1))
    log_t2 = torch.where(y2 == 1, torch.zeros_like(z2), _log_sigmoid(z2))
    if isinstance(lam, Tensor):
        log_lam, log_1m_lam = torch.log(lam), torch.log1p(-lam)
    else:
        log_lam = math.log(lam) if lam > 0 else -math.inf
        log_1m_lam = math.log1p(-lam) if lam < 1 else -math.inf
    log_t_mix = torch.logaddexp(log_t1 + log_lam, log_t2 + log_1m_lam)
    z_mix = lam * z1 + (1 - lam) * z2
    reg = (log_t_mix - _log_sigmoid(z_mix)).square().mean(-2).sum(-1)
    return var, reg


def vpu(logits: Tensor, observed: Tensor, gamma: float | Tensor = 0.55,
        temp_alpha: float | Tensor = 1.0, mix_weight: float | Tensor = 1.0,
        mix_alpha: float | Tensor = 0.3, lam: float | Tensor | None = None) -> Tensor:
    """PU-MLC's variational PU loss with adaptive temperature and re-balance factor, plus the
    vPU MixUp regulariser (module doc; Yuan et al. Eqs. 8, 10, 11). Defaults = the COCO preset.

    ``lam``: the MixUp weight λ ∈ [0, 1] (number, or ``(T,)`` one per trial). ``None`` draws it
    from Beta(``mix_alpha``, ``mix_alpha``) with torch's global RNG (seed with
    ``torch.manual_seed`` for repeatability); the registered loss draws from its own per-trial
    generators instead (:meth:`VPU.manual_seed`). Returns the sum over classes: a scalar, or
    ``(T,)`` for ``(T, B, C)`` logits.
    """
    given = {_GAMMA: gamma, _TEMP_ALPHA: temp_alpha, _MIX_WEIGHT: mix_weight, _MIX_ALPHA: mix_alpha}
    if lam is not None:
        given[replace(_LAM, optional=False)] = lam
    z, y, values, h = check_call("vpu", logits, observed, given)
    if lam is None:
        a = torch.as_tensor(values["mix_alpha"], dtype=torch.float64)
        shape = (z.shape[0],) if z.ndim == 3 and a.ndim == 0 else ()  # one λ per trial
        lam = torch.distributions.Beta(a, a).sample(shape)
    var, reg = _vpu_parts(z, y, h["gamma"], h["temp_alpha"], hp(lam, z))
    return var + per_trial(h["mix_weight"]) * reg


@register
class VPU(Loss):
    host_per_step = True  # λ drawn per step from numpy generators
    trial_state = None  # one numpy generator per trial: a stopped trial stays in the stack, frozen
    stacks_draws = True  # per-trial (T, B, C) observed: each trial's own positives per column
    name = "vpu"
    stacks_seeds = True  # a (T, B) index: reads no per-example state
    paper = PAPER
    formula = (
        "τ_c = clamp(min(temp_alpha·std_b(sg z_·c), 1), min=1e-3),  s = σ(z/τ_c),  "
        "w_c = sg(mean_b s_·c)^γ\n"
        "L_var = Σ_c [w_c·log(mean_b s_·c) − mean_{b: y=1} log s_bc]   (no positive in c: "
        "2nd term 0)\n"
        "L_reg = Σ_c mean_b (log t̃ − log σ(z̃))²,  halves mixed with λ ~ Beta(0.3, 0.3), "
        "t = 1 on y=1 else σ(z)\n"
        "loss = L_var + mix_weight·L_reg   (sum over classes)")
    hparam_specs = (_GAMMA, _TEMP_ALPHA, _MIX_WEIGHT, _MIX_ALPHA)
    presets = {
        "coco": {"gamma": 0.55, "temp_alpha": 1.0},
        "voc": {"gamma": 0.85, "temp_alpha": 2.0}}
    # the authors' README commands: ResNet-101 end-to-end, 10% known labels, Adam + OneCycle,
    # per-GPU batch (2 GPUs); Stop_epoch=40 / 55 stops after 0-indexed epoch 40 / 55
    train_presets = {
        "coco": {"batch_size": 35, "lr": 1e-4, "epochs": 41},
        "voc": {"batch_size": 45, "lr": 4e-5, "epochs": 56}}
    notes = (
        "Reduction is the paper's sum over classes of per-class batch means (not the B·C mean). "
        "The MixUp over features is applied to the logits, which is exact for a linear head; the "
        "pairs are row i and row i + ⌈B/2⌉ (the reference also shuffles the first half; batches "
        "are already in random order) and the middle row of an odd batch is unused. λ is drawn "
        "per step and trial from the loss's own numpy generator (manual_seed; default seed 0), "
        "256 draws at a time, so the training loop never waits for the host. The temperature "
        "floor 1e-3 is ours (the reference divides by 0 for a constant column). Presets are the "
        "authors' README commands for 10% known labels (partial labels, not single positive); "
        "train_presets are their end-to-end ResNet-101 settings (per-GPU batch).")

    def __init__(self, **hparams) -> None:
        super().__init__(**hparams)
        self._seeds: list[int] | None = None
        self._gens: list[np.random.Generator] = []
        self._block: Tensor | None = None
        self._pos = 0

    def manual_seed(self, seeds: list[int]) -> None:
        """One numpy generator per trial; trial t draws what an unstacked loss seeded with
        ``seeds[t]`` draws."""
        if self.n_trials is not None and len(seeds) != self.n_trials:
            raise LossInputError(
                f"vpu: manual_seed needs one seed per trial ({self.n_trials}); got {len(seeds)}")
        self._seeds = [int(s) for s in seeds]
        self._gens = [np.random.default_rng(s) for s in self._seeds]
        self._block, self._pos = None, 0
        self._read_alphas()

    def _read_alphas(self) -> None:
        """mix_alpha per trial as Python floats, read when seeding (not when refilling λ, so the
        training step never copies a device tensor to the host)."""
        a = self.hparam("mix_alpha")
        self._alphas = a.tolist() if isinstance(a, Tensor) else [float(a)] * len(self._gens)

    def set_hparam(self, name: str, value) -> None:
        super().set_hparam(name, value)
        if name == "mix_alpha" and self._gens:  # later draws use the new Beta(a, a)
            self._read_alphas()

    def _next_lam(self, t: int, device: torch.device) -> Tensor:
        """λ of this step, ``(t,)`` on ``device``; refills a block of draws when it runs out."""
        if len(self._gens) != t:
            if self._seeds is not None:
                raise LossInputError(
                    f"vpu: seeded with {len(self._seeds)} seed(s) (manual_seed) but the logits "
                    f"stack {t} trial(s); pass one seed per trial")
            self.manual_seed([0] * t)
            self._seeds = None  # unseeded: every trial draws from seed 0
        if self._block is None or self._pos >= self._block.shape[1] or (
            self._block.device != device):
            draws = np.stack([g.beta(a, a, size=_LAM_BLOCK)
                              for g, a in zip(self._gens, self._alphas)])
            self._block = torch.from_numpy(draws).to(device, non_blocking=True)
            self._pos = 0
        lam = self._block[:, self._pos]
        self._pos += 1
        return lam

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        t = z.shape[0] if z.ndim == 3 else 1
        lam = self._next_lam(t, z.device).to(z.dtype)
        lam_v = lam.view(-1, 1, 1) if z.ndim == 3 else lam[0]
        var, reg = _vpu_parts(
            z, observed, hp(self.hparam("gamma"), z), hp(self.hparam("temp_alpha"), z), lam_v)
        total = var + per_trial(hp(self.hparam("mix_weight"), z)) * reg
        return LossOutput(total, {"var": var, "reg": reg, "lam": lam if z.ndim == 3 else lam[0]})
