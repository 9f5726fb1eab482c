"""One extension mechanism for everything a user may add: losses, backbone families, dataset
adapters and prior sources each live in a :class:`Registry` (docs/plugins.md).

A registry maps names to objects of one kind. The project's own entries are added in code
(:meth:`Registry.add`, or a decorator built on it such as :func:`probe.losses.register`);
another installed package adds its entries through an entry-point group
(``spml_probe.losses``, ``spml_probe.backbones``, ``spml_probe.datasets``,
``spml_probe.priors``), one entry point per entry, named like the entry, its value
``"module:object"``. Entry points are read lazily:

- asking for a registered name never reads an entry point;
- asking for another name imports only the entry point of that name, once per process;
- listing (:meth:`Registry.names`, :meth:`Registry.items`) imports every entry point.

A plugin that fails to load -- whatever its import raises, ``SystemExit`` included, or an
object its registry's check refuses -- adds nothing and is recorded as a
:class:`PluginFailure`: listings name it (entry point, distribution, ``Type: message (at
file:line)``) and asking for its name raises that line. A name that is taken is refused by name,
and the entry that holds it keeps it.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from probe.errors import SpmlError

__all__ = ["PluginFailure", "Registry", "RegistryError", "adopt_named_instance",
           "check_named_instance", "close_matches", "distribution_text", "error_line",
           "installed_entry_points"]

T = TypeVar("T")


class RegistryError(SpmlError):
    """A name that is taken, unknown, or whose plugin failed to load."""


def close_matches(name: str, known: list[str], cutoff: float) -> list[str]:
    """The closest known name, matching case-insensitively first (``GR`` → ``gr``); names are
    exact, so the user gets the suggestion rather than a silent guess. The one rule for "did you
    mean" of registry names and hyperparameters alike."""
    import difflib

    folded = {k.lower(): k for k in known}
    if name.lower() in folded:
        return [folded[name.lower()]]
    hint = difflib.get_close_matches(name.lower(), list(folded), n=1, cutoff=cutoff)
    return [folded[h] for h in hint]


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded: its registry's kind, its entry point, the distribution
    that declares it, and the error (``"Type: message (at file:line)"``)."""

    entry_point: str
    value: str
    distribution: str
    error: str
    kind: str = "loss"

    def __str__(self) -> str:
        return (f"{self.kind} plugin '{self.entry_point}' (entry point {self.entry_point} = "
                f"{self.value!r} of {self.distribution}) failed to load: {self.error}")


def installed_entry_points(group: str) -> list[Any]:
    """The installed entry points of ``group``, in a fixed order (by name, then value); read from
    the distributions' metadata, nothing is imported."""
    from importlib.metadata import entry_points

    return sorted(entry_points(group=group), key=lambda ep: (ep.name, ep.value))


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


class Registry(Generic[T]):
    """Names → objects of one kind, filled in code and through the entry-point group ``group``.

    ``adopt(name, obj)`` turns what an entry point names into the entry to register, raising to
    refuse it (the registry records the refusal as a :class:`PluginFailure`); by default the
    object itself is registered. ``form`` says what an entry point's value names (for the
    refusal of a value that is not ``module:object``). ``taken_error`` and ``unknown_error``
    are the exception types raised for a taken name and an unknown one, so each kind keeps its
    own error class.
    ``builtin`` is how the project's own entries are described by :meth:`origin`; entries added
    in code by other modules are "module NAME".
    """

    def __init__(self, kind: str, group: str, *, builtin: str,
                 builtin_modules: tuple[str, ...],
                 adopt: Callable[[str, Any], T] | None = None,
                 form: str = "",
                 taken_error: type[Exception] = RegistryError,
                 unknown_error: type[Exception] = RegistryError) -> None:
        self.kind = kind
        self.group = group
        self.builtin = builtin
        self.builtin_modules = builtin_modules
        self._adopt = adopt
        # what an entry point's value must name, for the refusal of one that names no object
        self.form = form or f"one {kind} as 'module:object'"
        self.taken_error = taken_error
        self.unknown_error = unknown_error
        self._entries: dict[str, T] = {}
        self._origins: dict[str, str] = {}
        self._tried: set[str] = set()
        self._failures: list[PluginFailure] = []
        self._all_loaded = False
        self._loading: str | None = None  # the origin of the plugin being imported, if any
        # re-entrant: a plugin's module registers its entries while its entry point loads
        self._lock = threading.RLock()

    # -- adding entries -------------------------------------------------------------------

    def add(self, name: str, obj: T, *, module: str | None = None) -> T:
        """Register ``obj`` under ``name``; a name taken by another object is refused, naming
        both. ``module`` (default: ``obj.__module__``) decides the entry's origin."""
        with self._lock:
            taken = self._entries.get(name)
            if taken is not None and taken is not obj:
                # a class or function is named by where it is defined; an instance by its repr
                whose = f" of {describe(obj)}" if hasattr(obj, "__qualname__") else ""
                raise self.taken_error(
                    f"the {self.kind} name '{name}'{whose} is already taken by "
                    f"{self._origins.get(name, 'another entry')} ({describe(taken)}); give the "
                    f"new {self.kind} another name")
            if taken is None:
                self._origins[name] = self._origin_of(obj, module)
            self._entries[name] = obj
        return obj

    def _origin_of(self, obj: Any, module: str | None) -> str:
        if self._loading is not None:
            return self._loading
        module = module if module is not None else getattr(obj, "__module__", None) or ""
        if module.startswith(self.builtin_modules):
            return self.builtin
        return f"module {module}"

    def remove(self, name: str) -> None:
        """Forget ``name`` (tests; a plugin that failed half-way)."""
        with self._lock:
            self._entries.pop(name, None)
            self._origins.pop(name, None)

    # -- entry points ---------------------------------------------------------------------

    def entry_points(self) -> dict[str, Any]:
        """The installed entry points of the group by name (nothing imported); the first of two
        with one name wins."""
        points: dict[str, Any] = {}
        for ep in installed_entry_points(self.group):
            points.setdefault(ep.name, ep)
        return points

    def load_entry_point(self, ep: Any) -> None:
        """Import the one entry an entry point names, once per process. Whatever the import
        raises (not ``KeyboardInterrupt``), or a refusal of ``adopt``, leaves no entry behind and
        is recorded (:meth:`failures`); so does any other entry its module added on import."""
        with self._lock:
            if ep.name in self._tried:
                return
            self._tried.add(ep.name)
            distribution = distribution_text(ep)
            before = set(self._entries)
            origin = f"plugin '{ep.name}' of {distribution}"
            self._loading = origin
            loaded = False
            try:
                if ":" not in ep.value:
                    raise self.taken_error(
                        f"the entry point must name {self.form} (one entry point per "
                        f"{self.kind}, named like it)")
                obj = ep.load()
                entry = self._adopt(ep.name, obj) if self._adopt is not None else obj
                self.add(ep.name, entry)
                self._origins[ep.name] = origin
                loaded = True
            except KeyboardInterrupt:
                raise
            except BaseException as err:  # SystemExit too: a plugin never takes a command down
                self._failures.append(PluginFailure(
                    ep.name, ep.value, distribution, error_line(err), self.kind))
            finally:
                self._loading = None
                # an entry the module added on import that no entry point of its own names is
                # not a plugin's entry; a failed plugin leaves none
                for name in set(self._entries) - before:
                    if not (loaded and name == ep.name):
                        self.remove(name)

    def load_all(self) -> None:
        """Import every installed entry point of the group (listings do)."""
        if self._all_loaded:
            return
        with self._lock:
            for ep in self.entry_points().values():
                self.load_entry_point(ep)
            self._all_loaded = True

    # -- reading --------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def registered(self, name: str) -> T | None:
        """The entry registered as ``name`` now, reading no entry point (None if none)."""
        return self._entries.get(name)

    def registered_now(self) -> list[T]:
        """The entries registered so far, in registration order, reading no entry point (for
        text built at import time, such as a command's help)."""
        return list(self._entries.values())

    def get(self, name: str) -> T:
        """The entry ``name``: a registered one without reading any entry point, else the
        entry point of that name (imported on this first use). An unknown name gets the closest
        suggestion; a name whose plugin failed gets that plugin's error."""
        entry = self._entries.get(name)
        if entry is not None:
            return entry
        points = self.entry_points() if isinstance(name, str) else {}
        if name in points:
            self.load_entry_point(points[name])
            if name in self._entries:
                return self._entries[name]
        for failure in self._failures:
            if failure.entry_point == name:
                raise self.unknown_error(
                    f"{self.kind} '{name}' is not available: {failure}; fix or uninstall the "
                    "plugin") from None
        failed = {f.entry_point for f in self._failures}
        known = sorted((set(self._entries) | set(points)) - failed)
        hint = close_matches(str(name), known, cutoff=0.4)
        message = f"unknown {self.kind} '{name}'"
        if hint:
            message += f"; did you mean '{hint[0]}'?"
        message += f" (available: {', '.join(known)})"
        if self._failures:
            broken = [f"'{f.entry_point}' ({f.distribution})" for f in self._failures]
            message += f"; plugins that failed to load: {', '.join(broken)}"
        raise self.unknown_error(message) from None

    def names(self) -> list[str]:
        """Every name, in registration order, after loading every entry point."""
        self.load_all()
        return list(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        """(name, entry) pairs in registration order, after loading every entry point."""
        self.load_all()
        return iter(list(self._entries.items()))

    def failures(self) -> list[PluginFailure]:
        """The plugins that failed to load in this process, after loading every entry point."""
        self.load_all()
        return list(self._failures)

    def origin(self, name: str) -> str:
        """Where the entry ``name`` comes from: the built-in text, ``"plugin 'x' of
        distribution 'y 1.0'"``, or ``"module m"`` (added by the user's own code)."""
        self.get(name)
        return self._origins.get(name, self.builtin)

    def tried(self) -> set[str]:
        """The entry points this process has tried to import."""
        return set(self._tried)

    # -- tests ----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole state, for :meth:`restore` (tests register and load plugins)."""
        return {"entries": dict(self._entries), "origins": dict(self._origins),
                "tried": set(self._tried), "failures": list(self._failures),
                "all_loaded": self._all_loaded}

    def restore(self, state: dict[str, Any]) -> None:
        """Put back a :meth:`snapshot`."""
        with self._lock:
            self._entries = dict(state["entries"])
            self._origins = dict(state["origins"])
            self._tried = set(state["tried"])
            self._failures = list(state["failures"])
            self._all_loaded = state["all_loaded"]

    def forget_plugins(self) -> None:
        """Read the entry points afresh (tests that install fake ones)."""
        with self._lock:
            self._tried = set()
            self._failures = []
            self._all_loaded = False


def check_named_instance(obj: Any, base: type, caller: str, what: str) -> None:
    """The contract of an entry that is an object with a ``name`` (a backbone family, a prior
    source): an instance of ``base`` whose name is letters, digits and '_'; refused naming
    ``caller`` otherwise."""
    if not isinstance(obj, base):
        raise TypeError(f"{caller}: {obj!r} is not a {base.__module__}.{base.__qualname__}")
    name = getattr(obj, "name", "")
    if not name or not name.replace("_", "").isalnum():
        raise RegistryError(f"{caller}: a {what}'s name must be letters, digits and '_'; got "
                            f"{name!r}")


def adopt_named_instance(base: type, caller: str, what: str) -> Callable[[str, Any], Any]:
    """An ``adopt`` for a registry of named instances: the entry point may name an instance of
    ``base`` or a subclass (built with no arguments), whose ``name`` must be the entry point's
    name."""

    def adopt(name: str, obj: Any) -> Any:
        entry = obj() if isinstance(obj, type) and issubclass(obj, base) else obj
        check_named_instance(entry, base, caller, what)
        if entry.name != name:
            raise RegistryError(f"the entry point's name {name!r} must be the {what}'s name; "
                                f"{type(entry).__qualname__}.name is {entry.name!r}")
        return entry

    return adopt


def describe(obj: Any) -> str:
    """``module.QualifiedName`` of a class or function, else the object's repr."""
    qualname = getattr(obj, "__qualname__", None)
    if qualname is None:
        return repr(obj)
    return f"{getattr(obj, '__module__', '?')}.{qualname}"
