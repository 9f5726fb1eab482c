"""The ranks of a ``torch.distributed`` featurize run (``torchrun``): which blocks a process
writes, and the collectives that keep the ranks in step (the run itself is
:mod:`featurize.extract.run`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from probe.errors import SpmlError


class RankFailed(SpmlError):
    """Another rank of a distributed featurize run failed (its message is included)."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in a ``torchrun`` featurize run: rank 0 creates (or resumes) the
    store, rank ``r`` of ``world`` featurizes the pending blocks ``r, r + world, …``, and rank 0
    marks the store complete once all are done (a store every machine's file system sees)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0  # picks cuda:<local_rank> on a machine with several GPUs

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def agree(self, error: BaseException | None, value: Any = None) -> Any:
        """Collective: every rank reports how its part went; raise on every rank if any failed
        (so no rank waits forever for one that stopped with an error). Returns rank 0's
        ``value`` on every rank."""
        reports = self.gather((None if error is None else f"{error}", value))
        if error is not None:
            raise error
        failed = [(r, msg) for r, (msg, _) in enumerate(reports) if msg is not None]
        if failed:
            r, msg = failed[0]
            advice = ("" if "resum" in msg else
                      ". The blocks finished so far are kept: re-run the same command to resume")
            raise RankFailed(f"featurize rank {r} of {self.world} failed: {msg}{advice}")
        return reports[0][1]

    def gather(self, value: Any) -> list[Any]:
        """Collective: ``value`` of every rank, in rank order."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist

        reports: list[Any] = [None] * self.world
        dist.all_gather_object(reports, value)
        return reports


def current_ranks() -> Ranks:
    """The ranks of the initialised default process group, or a single process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return Ranks()
    return Ranks(rank=dist.get_rank(), world=dist.get_world_size(),
                 local_rank=int(os.environ.get("LOCAL_RANK", dist.get_rank())))


@contextlib.contextmanager
def distributed_from_env() -> Iterator[Ranks]:
    """Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) join the process group for
    the run (gloo: only a few small messages are exchanged, so CPU and GPU machines alike);
    otherwise one process. The group is left again at the end."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    import torch.distributed as dist

    if world <= 1 or dist.is_initialized():
        yield current_ranks()
        return
    dist.init_process_group("gloo")
    try:
        yield current_ranks()
    finally:
        dist.destroy_process_group()


