"""The error of ``spml table``: its own module, so that every module of the table (the cells, the
grid) raises it without importing another."""

from __future__ import annotations

from probe.errors import SpmlError

__all__ = ["TableError"]


class TableError(SpmlError):
    """An input ``spml table`` cannot use; raised before anything trains or is written."""
