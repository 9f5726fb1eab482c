"""CPU intra-op threads for a block of work: the one helper the trainer's steps and the
evaluation use (the choice of how many lives with each: :mod:`probe.engine.speed` and
:func:`probe.engine.loop.measured_threads`,
:data:`probe.evaluation.heads.SMALL_EVAL`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["step_threads"]


@contextlib.contextmanager
def step_threads(device: torch.device, threads: int | None) -> Iterator[None]:
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
