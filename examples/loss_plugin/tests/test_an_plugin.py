"""The plugin's own tests: the loss contract (spml-probe's checks) and its math against an
independent reference, the built-in ``an`` where the two agree."""

from __future__ import annotations

import spml_an_plugin  # registers "an_plugin" (installed, the entry point does the same)
import torch

from probe.losses import an, create_loss
from probe.losses.testing import check_loss


def test_the_loss_keeps_the_contract():
    check_loss("an_plugin")


def test_the_math_by_hand_and_against_the_built_in_an():
    z = torch.tensor([[2.0, -1.0], [0.5, 3.0]], dtype=torch.float64)
    y = torch.tensor([[1, 0], [0, -1]], dtype=torch.int8)
    p = torch.sigmoid(z)
    by_hand = (-3 * torch.log(p[0, 0]) - torch.log(1 - p[0, 1]) - torch.log(1 - p[1, 0])
               - torch.log(1 - p[1, 1])) / 4
    torch.testing.assert_close(spml_an_plugin.an_plugin(z, y, pos_weight=3.0), by_hand)
    torch.testing.assert_close(spml_an_plugin.an_plugin(z, y), an(z, y))
    stacked = create_loss("an_plugin", pos_weight=torch.tensor([1.0, 3.0]))
    out = stacked(torch.stack([z, z]), y).loss
    torch.testing.assert_close(out, torch.stack([an(z, y), by_hand]).to(out.dtype))
