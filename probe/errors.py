"""The one exception base of spml-probe.

Every error a user can cause -- a bad argument, a missing or malformed file, a store that does
not match the request -- is an :class:`SpmlError`. It subclasses :class:`ValueError`, so code
that already catches ``ValueError`` keeps working. The ``spml`` command prints an
``SpmlError`` as one line and exits with status 2; any other exception is a bug in spml-probe
and is printed with its traceback.

Each package defines its own, more specific subclasses (``StoreError``, ``LossInputError``,
``StudyError``, …); catch :class:`SpmlError` to handle them all.
"""

from __future__ import annotations

__all__ = ["MissingPathError", "SpmlError"]


class SpmlError(ValueError):
    """Bad input to spml-probe: the message names the argument, what was expected, what arrived
    and how to fix it."""


class MissingPathError(SpmlError, FileNotFoundError):
    """A path the user named does not exist (also a :class:`FileNotFoundError`)."""
