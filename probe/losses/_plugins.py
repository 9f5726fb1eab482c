"""Loss plugins: the entry points of the group ``spml_probe.losses``, one per loss, named like
the loss, its value ``"module:Class"`` (docs/plugins.md "How plugins are found"). This module
only reads them; the registry in :mod:`probe.losses._base` loads them.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

__all__ = ["GROUP", "PluginFailure", "distribution_text", "entry_points", "error_line"]

#: the entry-point group a loss plugin registers under
GROUP = "spml_probe.losses"


@dataclass(frozen=True)
class PluginFailure:
    """A loss plugin that could not be loaded: its entry point, the distribution that declares
    it, and the error (``"Type: message (at file:line)"``)."""

    entry_point: str
    value: str
    distribution: str
    error: str

    def __str__(self) -> str:
        return (f"loss plugin '{self.entry_point}' (entry point {self.entry_point} = "
                f"{self.value!r} of {self.distribution}) failed to load: {self.error}")


def entry_points() -> list[Any]:
    """The installed entry points of :data:`GROUP`, in a fixed order (by name, then value)."""
    from importlib.metadata import entry_points as _entry_points

    return sorted(_entry_points(group=GROUP), key=lambda ep: (ep.name, ep.value))


def distribution_text(ep: Any) -> str:
    """``distribution 'name version'`` of an entry point, as far as it is known."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "an unknown distribution"
    try:
        return f"distribution '{dist.metadata['Name']} {dist.version}'"
    except Exception:  # a distribution with broken metadata still names its entry point
        return "a distribution without readable metadata"


def error_line(err: BaseException) -> str:
    """One line for an exception: its type, its message's first line and where it was raised."""
    message = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {message[0]}" if message else type(err).__name__
    frames = traceback.extract_tb(err.__traceback__)
    if frames:
        text += f" (at {frames[-1].filename}:{frames[-1].lineno})"
    return text
