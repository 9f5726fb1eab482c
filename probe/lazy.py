"""Lazy public names for a package's top: ``from probe import train_probe`` imports
``probe.engine.train`` on first use only, so ``import probe`` (and ``spml --help``) stay cheap. The
one implementation behind ``probe``, ``probe.store``, ``featurize`` and ``studies``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str], namespace: dict[str, Any],
                 aliases: Mapping[str, str] | None = None
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``exports`` maps each public name to
    the module defining it (``aliases``: a public name whose attribute there is called
    otherwise). A name is imported on first access and then cached in ``namespace`` (the
    package's ``globals()``), so later look-ups skip ``__getattr__``."""
    aliases = dict(aliases or {})

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), aliases.get(name, name))
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
