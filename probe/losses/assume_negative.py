"""The assume-negative family — Cole et al., "Multi-Label Learning from Single Positive Labels",
CVPR 2021, Sec. 3 (AN, AN-LS, WAN, EPR); spec: docs/losses.md "Assume-negative family", the
formulas in each class's ``formula`` (``spml losses show an``). Logs are computed from logits
(−log p = softplus(−z), −log(1−p) = softplus(z)).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from ._base import EntrywiseLoss, HParam, Loss, LossInputError, register
from ._hparams import LossOutput, check_call, check_inputs, hp, mean_bc, per_trial, promote

__all__ = ["EXPECTED_POSITIVES", "an", "an_ls", "epr", "wan"]

PAPER = "Cole et al., Multi-Label Learning from Single Positive Labels, CVPR 2021"

#: k = expected positives per image (Cole et al., Table 1); other datasets use the mean label
#: cardinality of their val split.
EXPECTED_POSITIVES = {"voc": 1.5, "coco": 2.9, "nus": 1.9, "cub": 31.4}

_EPS = HParam("eps", 0.1, "label-smoothing amount ε", low=0.0, high=0.5, high_open=True,
              search=(0.01, 0.4))
#: EPR's k, the expected positives per image (also ROLE's and GPR's regulariser's)
K_SPEC = HParam("k", None, "expected positives per image (VOC 1.5, COCO 2.9, NUS 1.9, CUB 31.4; "
                "else the val split's mean label cardinality)", low=0.0, low_open=True,
                search=(0.5, 10.0), log=True, from_data="expected_positives")
#: k as the pure functions take it: required
K_REQUIRED = replace(K_SPEC, optional=False, from_data=None)


def expected_k(loss: Loss) -> float | Tensor:
    """The registered loss's k (EPR, ROLE, GPR), refused while unset."""
    k = loss.hparam("k")
    if k is None:
        raise LossInputError(
            f"{loss.name}: hyperparameter 'k' (expected positives per image) is not set; pass "
            "k=… or let the trainer fill it from the dataset")
    return k


def an_entries(z: Tensor, y: Tensor) -> Tensor:
    return torch.where(y == 1, F.softplus(-z), F.softplus(z))


def _an_ls_entries(z: Tensor, y: Tensor, eps) -> Tensor:
    pos, neg = F.softplus(-z), F.softplus(z)  # −log p, −log(1−p)
    return torch.where(y == 1, (1 - eps) * pos + eps * neg, (1 - eps) * neg + eps * pos)


def _wan_entries(z: Tensor, y: Tensor) -> Tensor:
    c = z.shape[-1]
    return torch.where(y == 1, F.softplus(-z), F.softplus(z) / max(c - 1, 1))


def epr_penalty(p: Tensor, k) -> Tensor:
    """(mean_n Σ_c p_nc − k)² / C² per trial: EPR's regulariser, ROLE's and GPR's too."""
    return (p.sum(-1).mean(-1) - per_trial(k)) ** 2 / p.shape[-1] ** 2


def _epr_parts(z: Tensor, y: Tensor, k) -> tuple[Tensor, Tensor]:
    data = mean_bc(torch.where(y == 1, F.softplus(-z), torch.zeros_like(z)))
    return data, epr_penalty(torch.sigmoid(z), k)


def an(logits: Tensor, observed: Tensor) -> Tensor:
    """Assume negative: BCE with every unobserved label taken as negative (Cole et al. Eq. 3)."""
    z, y = check_inputs(logits, observed, loss="an")
    return mean_bc(an_entries(z, y))


def an_ls(logits: Tensor, observed: Tensor, eps: float | Tensor = 0.1) -> Tensor:
    """AN with label smoothing ε (Cole et al. Sec. 3): targets 1−ε / ε instead of 1 / 0."""
    z, y, _, h = check_call("an_ls", logits, observed, {_EPS: eps})
    return mean_bc(_an_ls_entries(z, y, h["eps"]))


def wan(logits: Tensor, observed: Tensor) -> Tensor:
    """Weak assume negative: unobserved terms down-weighted by 1/(C−1) (Cole et al. Sec. 3)."""
    z, y = check_inputs(logits, observed, loss="wan")
    return mean_bc(_wan_entries(z, y))


def epr(logits: Tensor, observed: Tensor, k: float | Tensor) -> Tensor:
    """Expected positive regularisation (Cole et al. Eq. 6): positives only, plus
    (mean_n Σ_c p_nc − k)² / C²."""
    z, y, _, h = check_call("epr", logits, observed, {K_REQUIRED: k})
    return sum(_epr_parts(z, y, h["k"]))


@register
class AN(EntrywiseLoss):
    name = "an"
    stacks_seeds = True  # a (T, B) index: reads no per-example state
    paper = PAPER + ", Eq. 3"
    formula = "y=1: −log p;  y≤0: −log(1−p);  mean over B·C"
    entries = staticmethod(an_entries)
    stacks_draws = True  # per-trial (T, B, C) observed broadcast entry by entry


@register
class ANLS(EntrywiseLoss):
    name = "an_ls"
    stacks_seeds = True  # a (T, B) index: reads no per-example state
    paper = PAPER + ", Sec. 3 (AN-LS)"
    formula = "y=1: −(1−ε)log p − ε log(1−p);  y≤0: −(1−ε)log(1−p) − ε log p;  mean over B·C"
    hparam_specs = (_EPS,)
    entries = staticmethod(_an_ls_entries)
    stacks_draws = True  # per-trial (T, B, C) observed broadcast entry by entry


@register
class WAN(EntrywiseLoss):
    name = "wan"
    stacks_seeds = True  # a (T, B) index: reads no per-example state
    paper = PAPER + ", Sec. 3 (WAN)"
    formula = "y=1: −log p;  y≤0: −log(1−p)/(C−1);  mean over B·C"
    entries = staticmethod(_wan_entries)
    stacks_draws = True  # per-trial (T, B, C) observed broadcast entry by entry


@register
class EPR(Loss):
    name = "epr"
    stacks_seeds = True  # a (T, B) index: reads no per-example state
    paper = PAPER + ", Eq. 6 (EPR)"
    formula = "y=1: −log p;  y≤0: 0;  mean over B·C  +  (mean_n Σ_c p_nc − k)² / C²"
    hparam_specs = (K_SPEC,)
    presets = {ds: {"k": k} for ds, k in EXPECTED_POSITIVES.items()}
    trial_state = ()  # stateless
    stacks_draws = True  # per-trial (T, B, C) observed: the data term entry by entry

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None) -> LossOutput:
        z = promote(logits)
        data, reg = _epr_parts(z, observed, hp(expected_k(self), z))
        return LossOutput(data + reg, {"data": data, "reg": reg})
