"""Deprecated home of the analyses: they moved to :mod:`studies.analyses` (one module per
analysis, e.g. :mod:`studies.analyses.ablation`). This module still gives the same names and
warns once on import; import them from :mod:`studies.analyses` instead."""

from __future__ import annotations

import warnings
from typing import Any

import studies.analyses as _analyses
from studies.analyses import __all__  # noqa: F401  (the same public names)

warnings.warn(
    "studies.analyze is deprecated: import the analyses from studies.analyses "
    "(e.g. `from studies.analyses import run_ablation`)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    return getattr(_analyses, name)


def __dir__() -> list[str]:
    return dir(_analyses)
