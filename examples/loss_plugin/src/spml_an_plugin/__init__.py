"""An example spml-probe loss plugin: assume-negative BCE with a positive weight.

With p = σ(z) and y ∈ {1, 0, −1} (observed positive, unobserved, observed negative)::

    an_plugin   y=1: −w·log p        y≤0: −log(1−p)        mean over all B·C entries

computed from the logits (−log p = softplus(−z), −log(1−p) = softplus(z)). With w = 1 it is
Cole et al.'s assume-negative loss (CVPR 2021, Eq. 3), spml-probe's built-in ``an``; w > 1
counts the single observed positive more against the many assumed negatives.

The entry point ``an_plugin = "spml_an_plugin:PositiveWeightedAN"`` (pyproject.toml) makes
``spml`` find it; importing this module also registers it (``@register``), so a script or a
test can use it without installing the package.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from probe.losses import (
    HParam,
    Loss,
    LossOutput,
    check_hparam,
    check_inputs,
    hp,
    mean_bc,
    promote,
    register,
)

__all__ = ["PositiveWeightedAN", "an_plugin"]

_POS_WEIGHT = HParam(
    "pos_weight", 1.0, "weight w of the observed positive's term (1 = Cole et al.'s AN)",
    low=0.0, low_open=True, search=(0.25, 4.0), log=True,
)


def _entries(z: Tensor, y: Tensor, w) -> Tensor:
    """The per-entry terms: −w·log p where y = 1, −log(1−p) elsewhere."""
    return torch.where(y == 1, w * F.softplus(-z), F.softplus(z))


def an_plugin(logits: Tensor, observed: Tensor, pos_weight: float | Tensor = 1.0) -> Tensor:
    """The loss as a pure function: logits ``(B, C)`` or ``(T, B, C)``, observed -1/0/1, a
    number or a ``(T,)`` tensor of positive weights; a scalar, or ``(T,)`` with a trial axis."""
    pos_weight = check_hparam(_POS_WEIGHT, pos_weight, "an_plugin")
    z, y = check_inputs(logits, observed, {"pos_weight": pos_weight}, loss="an_plugin")
    return mean_bc(_entries(z, y, hp(pos_weight, z)))


@register
class PositiveWeightedAN(Loss):
    """Assume-negative BCE with a weight w on the observed positives (module docstring)."""

    name = "an_plugin"
    paper = ("example plugin: Cole et al., Multi-Label Learning from Single Positive Labels, "
             "CVPR 2021, Eq. 3, with a positive weight")
    formula = "y=1: −w·log p;  y≤0: −log(1−p);  mean over B·C   (w = pos_weight)"
    hparam_specs = (_POS_WEIGHT,)
    notes = "w = 1 is the built-in 'an'. Stateless: trial_state () (the default)."

    def forward(self, logits: Tensor, observed: Tensor, index: Tensor | None = None
                ) -> LossOutput:
        z = promote(logits)  # half precision is computed in float32
        w = hp(self.hparam("pos_weight"), z)  # a number, or (T,) viewed as (T, 1, 1)
        return LossOutput(mean_bc(_entries(z, observed, w)), {})
