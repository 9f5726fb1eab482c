"""ROLE, Regularized Online Label Estimation — Cole et al., "Multi-Label Learning from Single
Positive Labels", CVPR 2021, Sec. 3.3 / Eq. 7; spec: docs/losses.md "role" (the terms, Θ's
initialisation and learning rate), the formula in :class:`ROLE`'s ``formula``. Checked against
the released code (elijahcole/single-positive-multi-label ``loss_role``, ``LabelEstimator``):
same terms, reduction and initialisation; the differences are in the notes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._base import HParam, Loss, LossInputError, register
from ._hparams import LossOutput, check_call, check_state_arg, hp, mean_bc, promote
from .assume_negative import EXPECTED_POSITIVES, K_REQUIRED, K_SPEC, epr_penalty, expected_k

__all__ = ["init_label_logits", "role"]

PAPER = "Cole et al., Multi-Label Learning from Single Positive Labels, CVPR 2021"

_LR_MULT = HParam("lr_mult", 10, "learning-rate multiplier of the label estimates Θ relative to "
                  "the head (Cole et al.'s released default)", kind="int", low=0)

_LOGIT_POS = math.log(0.995 / 0.005)  # logit(0.995)
_LOGIT_NEG = -_LOGIT_POS  # logit(0.005)
_LOGIT_UNK = math.log(0.6 / 0.4)  # logit(0.6): unobserved entries start in ±this


def init_label_logits(observed: Tensor, seed: int = 0) -> Tensor:
    """ROLE's initial Θ ``(N, C)`` float32 for ``observed`` ``(N, C)`` (Cole et al. ``models.py``
    LabelEstimator): logit(0.995) on y=1, logit(0.005) on y=−1, Uniform(−logit(0.6), logit(0.6))
    elsewhere, drawn on the CPU from a generator seeded with ``seed`` (device-independent)."""
    g = torch.Generator().manual_seed(int(seed))
    u = torch.rand(tuple(observed.shape), generator=g, dtype=torch.float32)
    theta = (_LOGIT_UNK * (2 * u - 1)).to(observed.device)
    theta = torch.where(observed == 1, torch.full_like(theta, _LOGIT_POS), theta)
    return torch.where(observed == -1, torch.full_like(theta, _LOGIT_NEG), theta)


def _role_parts(z: Tensor, y: Tensor, theta: Tensor, k) -> tuple[Tensor, Tensor]:
    """(data, reg) per trial: mean_bc(ℓ) and the halved expected-positive regularisers."""
    theta = theta.to(z.dtype)
    p, q = torch.sigmoid(z), torch.sigmoid(theta)
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    pos_f = torch.where(y == 1, F.softplus(-z), zero)
    pos_g = torch.where(y == 1, F.softplus(-theta), zero)
    q_sg, p_sg = q.detach(), p.detach()
    cross_f = q_sg * F.softplus(-z) + (1 - q_sg) * F.softplus(z)
    cross_g = p_sg * F.softplus(-theta) + (1 - p_sg) * F.softplus(theta)
    data = mean_bc(0.5 * (pos_f + pos_g) + 0.5 * (cross_f + cross_g))
    return data, 0.5 * (epr_penalty(p, k) + epr_penalty(q, k))


def role(logits: Tensor, observed: Tensor, label_logits: Tensor, k: float | Tensor) -> Tensor:
    """ROLE loss (Cole et al. CVPR 2021, Eq. 7). Stateful: ``label_logits`` are the batch's rows
    of the label-estimate matrix, Θ[index], of the logits' shape ((B, C) or (T, B, C)); the
    gradient flows into them (train them at ``lr_mult``=10 × the head's learning rate).
    ``k`` = expected positives per image (VOC 1.5, COCO 2.9, NUS 1.9, CUB 31.4)."""
    z, y, _, h = check_call("role", logits, observed, {K_REQUIRED: k})
    theta = check_state_arg("role", "label_logits", label_logits, z, "float",
                            "Θ[index], the label estimates' logits",
                            "init_label_logits(observed_train)[index]", exact=True)
    return sum(_role_parts(z, y, theta, h["k"]))


@register
class ROLE(Loss):
    name = "role"
    stacks_seeds = True  # a (T, B) index: its label estimates are read through state_rows
    paper = PAPER + ", Sec. 3.3, Eq. 7 (ROLE)"
    formula = (
        "q = σ(Θ[index]) (trainable label estimates);  on y=1: ½(−log p − log q)\n"
        "all entries: ½(−[sg(q)log p + (1−sg(q))log(1−p)] − [sg(p)log q + (1−sg(p))log(1−q)])\n"
        "mean over B·C  +  ½[(mean_n Σ_c p − k)² + (mean_n Σ_c q − k)²] / C²")
    hparam_specs = (K_SPEC, _LR_MULT)
    presets = {ds: {"k": k} for ds, k in EXPECTED_POSITIVES.items()}
    stateful = True
    trial_state = ("label_logits",)
    # per-trial draws: trial t's Θ starts from its own draw (observed_train is per trial)
    stacks_draws = True
    notes = (
        "State: Θ, an nn.Parameter (T, N_train, C) float32 returned by extra_parameters() with "
        "lr_mult (structural: one value for all stacked trials); create the optimizer after "
        "setup(). Θ's uniform part is drawn per trial from a CPU generator seeded by "
        "manual_seed (default seed 0), so a stacked trial equals a separate run with the same "
        "seed; manual_seed re-draws Θ in place. Logs are exact (the released code uses "
        "−log(x + 1e-5)). Observed negatives (y=−1) enter only through Θ's initialisation "
        "(logit(0.005)), as in the released code. k: Cole et al.'s table (COCO 2.9; their "
        "train.py has 2.5). No train presets: Cole et al. grid-searched batch size {8, 16} and "
        "lr {1e-2, …, 1e-5} per dataset (linear probe: 25 epochs).")

    def __init__(self, **hparams) -> None:
        super().__init__(**hparams)
        self._seeds: list[int] | None = None

    def setup(self, observed: Tensor, n_epochs: int, n_trials: int | None = None) -> None:
        super().setup(observed, n_epochs, n_trials)
        t = self.n_trials or 1
        if self._seeds is not None and len(self._seeds) != t:
            raise LossInputError(
                f"role: manual_seed was given {len(self._seeds)} seeds but setup stacks {t} "
                "trials; pass one seed per trial")
        self.observed_state("observed_train", observed.to(torch.int8), observed)
        self.label_logits = nn.Parameter(torch.empty(t, *observed.shape[-2:],
                                                     device=observed.device))
        self._init_theta()

    def _init_theta(self) -> None:
        t = self.label_logits.shape[0]
        seeds = self._seeds or [0] * t
        observed = self.trial_view(self.observed_train)  # (1 or T, N, C)
        with torch.no_grad():
            for i, seed in enumerate(seeds):
                draw = observed[i] if observed.shape[0] > 1 else observed[0]
                self.label_logits[i].copy_(init_label_logits(draw, seed))

    def manual_seed(self, seeds: list[int]) -> None:
        """Seed Θ's initial draw, one seed per trial; re-draws Θ in place if set up already."""
        theta = getattr(self, "label_logits", None)
        if theta is not None and len(seeds) != theta.shape[0]:
            raise LossInputError(
                f"role: manual_seed needs one seed per trial ({theta.shape[0]}); got {len(seeds)}")
        self._seeds = [int(s) for s in seeds]
        if theta is not None:
            self._init_theta()

    def select_trials(self, keep: list[int]) -> None:
        super().select_trials(keep)
        if self._seeds is not None:
            self._seeds = [self._seeds[k] for k in keep]

    def extra_parameters(self) -> list[tuple[nn.Parameter, float]]:
        """Θ with its learning-rate multiplier ``lr_mult`` (Cole et al.: 10)."""
        return [(self.state("label_logits"), float(self.hparam("lr_mult")))]

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        k = expected_k(self)
        z = promote(logits)
        rows = self.state_rows("label_logits", index, z, "gather the label estimates Θ[index]")
        data, reg = _role_parts(z, observed, rows, hp(k, z))
        return LossOutput(data + reg, {"data": data, "reg": reg})
