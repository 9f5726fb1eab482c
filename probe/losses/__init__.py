"""The SPML loss library (contract: ``docs/losses.md``).

Every loss is a pure function ``probe.losses.<name>(logits, observed, **hparams)`` returning a
scalar, or ``(T,)`` for logits with a trial axis ``(T, B, C)``, and a registered object,
``create_loss(name, **hparams)``, which also carries schedules and per-example state for the
trainer. A family is one module of this package (found automatically: a new loss is one file)
that registers its classes with ``@register`` and lists its pure functions in ``__all__``.
Other packages' losses register through the entry-point group ``spml_probe.losses``, imported
on the first use of their name (``docs/plugins.md``); :mod:`probe.losses.testing` holds the
contract checks a plugin's tests can run.
"""

from __future__ import annotations

import importlib
import pkgutil

from . import _base, _hparams

__all__: list[str] = []
_public = (_info.name for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)
           if not _info.name.startswith("_") and _info.name != "testing")  # testing: on demand
for _module in (_hparams, _base, *(importlib.import_module(f"{__name__}.{n}") for n in _public)):
    for _name in _module.__all__:
        globals()[_name] = getattr(_module, _name)
        __all__.append(_name)
