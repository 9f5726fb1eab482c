"""The store's root attributes, changed one way: :func:`update_root_attrs` (read-modify-write
under a file lock, so a draw and a prior written at the same time both stay recorded), and
the one record of what a draw is, :func:`draw_record` / :func:`draw_text` (protocol, label
budget or label bias, with its parameters), checked in one place by :func:`check_draw`."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from probe.store.chunks import small_array
from probe.store.errors import StoreError
from probe.store.layout import is_protocol_budget

__all__ = ["attrs_lock", "check_draw", "draw_record", "draw_text", "update_root_attrs",
           "write_draws"]


@contextmanager
def attrs_lock(path: str | Path) -> Iterator[None]:
    """An exclusive ``flock`` on the store's folder itself (no lock file: zarr would warn about
    a foreign file), freed by the kernel if its holder dies: every change of the root
    attributes happens while it is held."""
    fd = os.open(Path(path), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def update_root_attrs(path: str | Path, change: Callable[[dict[str, Any]], dict[str, Any]]
                      ) -> dict[str, Any]:
    """Under :func:`attrs_lock`: read the store's root attributes afresh, call ``change``
    with a copy, and write the keys it returns (the others stay as they are on disk). Returns
    what was written. The only writer of the attributes a finished store gains later (draws,
    bias draws, priors)."""
    with attrs_lock(path):
        group = zarr.open_group(Path(path), mode="r+")
        new = change(dict(group.attrs))
        if new:
            group.attrs.update(new)
        return new


def draw_record(attrs: dict[str, Any], seed: int) -> dict[str, Any]:
    """What draw ``seed`` of a store (its root ``attrs``) is: ``{"kind": "protocol"}`` (one
    uniform positive per image), ``{"kind": "budget", "k", "fraction"}`` (spml draw --k
    --fraction) or ``{"kind": "bias", "bias", ...}`` (spml draw --bias; ``class_weights`` for
    semantic)."""
    key = str(int(seed))
    bias = attrs.get("observed_bias", {}).get(key)
    if bias is not None:
        return {"kind": "bias", **bias}
    budget = attrs.get("observed_budgets", {}).get(key)
    if budget is not None and not is_protocol_budget(budget):
        return {"kind": "budget", "k": int(budget["k"]), "fraction": float(budget["fraction"])}
    return {"kind": "protocol"}


def draw_text(record: dict[str, Any]) -> str:
    """A draw record in words (``spml info``, refusals, summaries)."""
    if record["kind"] == "bias":
        return f"label bias '{record['bias']}' (one positive per image, --bias {record['bias']})"
    if record["kind"] == "budget":
        return (f"k={record['k']} positives per image on {100 * float(record['fraction']):g}% "
                f"of the images (a label budget, --k {record['k']} --fraction "
                f"{record['fraction']:g})")
    return "one positive per image (the protocol's uniform draw)"


def check_draw(attrs: dict[str, Any], seed: int, record: dict[str, Any], store: Any) -> bool:
    """Whether draw ``seed`` is already there as ``record`` (True: nothing to write); False
    when the seed is free. A seed holding a draw of another kind is refused by name, whichever
    kind came first."""
    seeds = sorted(int(s) for s in attrs.get("observed_seeds", []))
    if int(seed) not in seeds:
        return False
    have = draw_record(attrs, seed)
    if have == record:
        return True
    raise StoreError(
        f"{store} already holds draw {seed} with {draw_text(have)}; a seed names one "
        f"draw, so {draw_text(record)} needs another seed (e.g. --seeds {max(seeds) + 1})"
    )


def write_draws(store: Any, draws: Sequence[tuple[int, dict[str, Any], np.ndarray, str | None,
                                                Any]]) -> list[int]:
    """Write each ``(seed, record, observed, attr, value)`` of ``draws`` as draw
    ``observed/<seed>`` of an open store and register it in ``observed_seeds`` (and
    ``attrs[attr][seed] = value``), all under one :func:`attrs_lock`: every seed is checked
    against its record first (another process may have added it, of the same kind -- then it
    is not written again -- or of another -- then the whole call is refused and nothing is
    written), the arrays are written, and the attributes last, so an interrupted call leaves
    the store as it was and two processes drawing one seed can never leave one's data under
    the other's record. A prior or draw written at the same time is not lost. Returns the
    seeds written."""
    with attrs_lock(store.path):
        group = zarr.open_group(store.path, mode="r+")
        attrs = dict(group.attrs)
        fresh = [d for d in draws if not check_draw(attrs, d[0], d[1], store.path)]
        if not fresh:
            return []  # already there, drawn with the same records and seeds
        new: dict[str, Any] = {"observed_seeds": sorted(
            {*map(int, attrs["observed_seeds"]), *(int(d[0]) for d in fresh)})}
        for seed, _, observed, attr, value in fresh:
            small_array(group["observed"], str(seed), observed)
            if attr is not None:
                new[attr] = {**attrs.get(attr, {}), **new.get(attr, {}), str(seed): value}
        group.attrs.update(new)
        return [int(d[0]) for d in fresh]
