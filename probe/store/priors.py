"""Priors in the store: per-image class scores from another model (CLIP or any teacher), an
``(N, C)`` float32 matrix over all the store's rows in its row and class order, read by the
losses with a ``Loss.prior`` (VLPL, GPR). Layout, validation and provenance keys:
docs/priors.md; :func:`probe.store.prior_writer.write_prior` writes (into a hidden staging
group renamed into place, registered in ``attrs["priors"]`` last), this module reads.
``weights_random: true`` in a prior's provenance marks a random model's scores
(:data:`RANDOM_WEIGHTS_WARNING`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from probe.store.errors import StoreError

__all__ = [
    "PRIOR_PROVENANCE_KEYS",
    "RANDOM_WEIGHTS_WARNING",
    "Prior",
    "PriorError",
    "prior_facts",
    "prior_names",
    "prior_summary",
    "random_weights_note",
    "read_prior",
]

PRIOR_PROVENANCE_KEYS: tuple[str, ...] = ("model", "prompt_template", "temperature", "tiles",
                                          "source")
GROUP = "priors"  # the store's group of priors
RANDOM_WEIGHTS_WARNING = ("computed with a randomly initialised model (spml priors --weights "
                          "random, for tests): its scores carry no knowledge of the images")


class PriorError(StoreError):
    """A prior that cannot be stored or read as asked: the message names the prior, what was
    expected, what arrived and how to fix it."""


@dataclass(frozen=True)
class Prior:
    """A prior read from a store: ``scores`` ``(len(rows), C)`` float32, the ``extras`` of the
    same shape, and its provenance."""

    name: str
    scores: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)


def prior_names(store: Any) -> list[str]:
    """Names of the priors an open :class:`probe.store.Store` holds, sorted."""
    return sorted(store.attrs.get("priors", {}))


def read_prior(store: Any, name: str, rows: Any = None) -> Prior:
    """Prior ``name`` of an open store at ``rows`` (as :meth:`probe.store.Store.labels`
    takes them), checked against its recorded shape."""
    have = store.attrs.get("priors", {})
    if name not in have:
        hint = (f"it holds {', '.join(prior_names(store))}" if have else "it holds none")
        raise PriorError(
            f"{store.path} has no prior {name!r} ({hint}); add one with 'spml import priors "
            f"{store.path} --name {name} --from scores.npy' (probe.store.write_prior)"
        )
    record = have[name]
    out: dict[str, np.ndarray] = {}
    for key in ("scores", *record["extras"]):
        full = f"{GROUP}/{name}/{key}"
        shape = store.shape(full)
        if shape is None:
            raise PriorError(f"{store.path}: prior {name!r} lacks its array {full!r}; write it "
                             "again with 'spml import priors … --overwrite'")
        if shape != (store.n_rows, store.n_classes):
            raise PriorError(
                f"{store.path}: prior array {full!r} has shape {shape}, expected "
                f"{(store.n_rows, store.n_classes)}; write it again with --overwrite"
            )
        out[key] = store.read(full, rows)
    scores = out.pop("scores")
    note = random_weights_note(record["provenance"])
    if note:
        warnings.warn(f"{store.path}: prior {name!r} was {note}", UserWarning, stacklevel=2)
    return Prior(name, scores, out, dict(record["provenance"]))


def prior_facts(provenance: Any, keys: tuple[str, ...] = ("model", "temperature", "tiles")
                ) -> list[str]:
    """A prior's provenance as ``"key value"`` words, only the keys that are set, in ``keys``'
    order: what ``spml info`` and a study's report say of it. Tiles read ``4x4`` whether
    recorded so (today) or as a list (earlier stores)."""
    prov = provenance if isinstance(provenance, dict) else {}
    facts = []
    for key in keys:
        value = prov.get(key)
        if value in (None, "", []):
            continue
        if key == "tiles" and not isinstance(value, str):
            value = "x".join(map(str, value))  # recorded as a list by earlier stores
        facts.append(f"{key} {value}")
    return facts


def random_weights_note(provenance: Any) -> str | None:
    """:data:`RANDOM_WEIGHTS_WARNING` where the provenance records random weights, else None."""
    random = isinstance(provenance, dict) and provenance.get("weights_random") is True
    return RANDOM_WEIGHTS_WARNING if random else None


def prior_summary(store: Any) -> dict[str, dict[str, Any]]:
    """``{name: {"extras": [...], "provenance": {...}, "created": ..., "warning": ...}}`` for
    ``spml info`` (``warning``: :func:`random_weights_note`, or None)."""
    return {name: {"extras": list(rec.get("extras", [])), "created": rec.get("created"),
                   "provenance": dict(rec.get("provenance", {})),
                   "warning": random_weights_note(rec.get("provenance"))}
            for name, rec in sorted(store.attrs.get("priors", {}).items())}
