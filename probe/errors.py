"""The one exception base of spml-probe.

Every error a user can cause (a bad argument, a missing or malformed file, a store that does not
match the request) is an :class:`SpmlError`, a :class:`ValueError`; packages subclass it
(``StoreError``, ``LossInputError``, ``StudyError``, …). ``spml`` prints it as one line and exits
with status 2; any other exception is a bug and is printed with its traceback.
"""

from __future__ import annotations

__all__ = ["DataError", "MissingPathError", "SpmlError", "is_int", "plain"]


class SpmlError(ValueError):
    """Bad input to spml-probe: the message names the argument, what was expected, what arrived
    and how to fix it."""


class DataError(SpmlError):
    """Unusable probe data (missing split, mismatched shapes, unknown device, …)."""


class MissingPathError(SpmlError, FileNotFoundError):
    """A path the user named does not exist (also a :class:`FileNotFoundError`)."""


def is_int(value: object, low: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``low``: the check of every
    count setting (epochs, resamples, threads, ...)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def plain(value: object) -> str:
    """A value as a message shows it to a user: ``nan``, ``inf``, ``0.5``, ``2,4``, ``true``,
    ``none``, ``(empty)`` -- never a Python or numpy repr (``np.float32(nan)``, ``tensor(…)``,
    ``None``, ``[]``). Sequences show their first 8 items and a count."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:  # numpy / torch scalars
        value = item()
    elif hasattr(value, "tolist") and not isinstance(value, str):  # arrays, tensors
        value = value.tolist()
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):  # nan, inf and -inf as repr writes them
        return repr(float(value))
    if isinstance(value, str):
        return value if value.strip() else "(empty)"
    if isinstance(value, dict):
        value = [f"{k}={plain(v)}" for k, v in value.items()]
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value)
        if not items:
            return "(empty)"
        shown = ",".join(plain(v) for v in items[:8])
        return shown if len(items) <= 8 else f"{shown},… ({len(items)} in all)"
    return str(value)
