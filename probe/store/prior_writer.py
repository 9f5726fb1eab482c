"""Writing a prior into a store (:func:`write_prior`; the layout and reading:
:mod:`probe.store.priors`, docs/priors.md)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from probe.errors import plain
from probe.store.chunks import small_array
from probe.store.layout import check_json, utc_now
from probe.store.priors import GROUP, PRIOR_PROVENANCE_KEYS, Prior, PriorError
from probe.store.reading import open_store
from probe.store.records import update_root_attrs

__all__ = ["write_prior"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_STAGING = ".staging-"


def check_prior_name(name: Any, what: str = "name") -> str:
    """A prior's name as given, or refused naming ``what`` (the flag) and the rule: 1-64
    letters, digits, '_' or '-', starting with a letter."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise PriorError(
            f"prior {what} must be 1-64 letters, digits, '_' or '-' (starting with a letter or "
            f"digit), e.g. 'clip' or 'clip-vitl14'; got {name!r}"
        )
    return name


def _check_matrix(values: Any, name: str, what: str, shape: tuple[int, int]) -> np.ndarray:
    """``values`` as a finite float32 ``shape`` matrix, or a :class:`PriorError` naming it."""
    try:
        arr = np.asarray(values)
    except Exception as err:  # ragged lists and the like
        raise PriorError(f"prior {name!r}: {what} is not an array ({err})") from None
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.floating)
                                 or np.issubdtype(arr.dtype, np.integer)):
        raise PriorError(
            f"prior {name!r}: {what} must hold numbers (a float matrix of class scores); got "
            f"dtype {arr.dtype}"
        )
    if arr.shape != shape:
        raise PriorError(
            f"prior {name!r}: {what} must have shape (N, C) = {shape}, one row per store row "
            f"(train, val and test, in the store's order) and one column per class; got "
            f"{arr.shape}"
        )
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(np.float32)
    bad = ~np.isfinite(out)
    if bad.any():
        r, c = (int(i) for i in np.argwhere(bad)[0])
        raise PriorError(
            f"prior {name!r}: {what} must be finite (float32); {int(bad.sum())} "
            f"{'entry is' if bad.sum() == 1 else 'entries are'} nan/inf or overflow float32, "
            f"the first at row {r}, class {c} (value {plain(arr[r, c])})"
        )
    return out


def _check_provenance(provenance: Any, name: str) -> dict[str, Any]:
    provenance = {} if provenance is None else provenance
    if not isinstance(provenance, Mapping):
        raise PriorError(
            f"prior {name!r}: provenance must be a dict (keys {list(PRIOR_PROVENANCE_KEYS)}); got "
            f"{type(provenance).__name__}"
        )
    return check_json({**dict.fromkeys(PRIOR_PROVENANCE_KEYS), **provenance},
                      f"prior {name!r}: provenance", PriorError)


def write_prior(
    store_path: str | Path,
    name: str,
    scores: Any,
    provenance: Mapping[str, Any] | None = None,
    extras: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    *,
    class_names: Sequence[str] | None = None,
) -> Prior:
    """Store per-image class ``scores`` ``(N, C)`` as prior ``name`` in a complete store.

    ``extras``: further ``(N, C)`` arrays by name (DAMP's ``tile_max``, ``tile_min``,
    ``tile_mean``). ``provenance``: :data:`PRIOR_PROVENANCE_KEYS` (missing ones recorded as
    None) and any other JSON. ``class_names``: the scores' class order, which must be the
    store's. An existing prior of that name is an error unless ``overwrite``. Every check runs
    before anything is written (docs/priors.md). Returns the stored :class:`Prior`.
    """
    store = open_store(store_path)
    name = check_prior_name(name)
    shape = (store.n_rows, store.n_classes)
    if class_names is not None:
        given = [str(c) for c in class_names]
        if given != store.class_names:
            if sorted(given) == sorted(store.class_names):
                first = next(i for i, (a, b) in enumerate(zip(given, store.class_names)) if a != b)
                detail = (f"the same classes in another order (column {first} is "
                          f"{given[first]!r}, the store's is {store.class_names[first]!r}); "
                          "reorder the columns to the store's class order")
            else:
                missing = sorted(set(store.class_names) - set(given))[:5]
                extra = sorted(set(given) - set(store.class_names))[:5]
                detail = (f"other classes (missing {missing}, unknown {extra}; {len(given)} "
                          f"given, the store has {len(store.class_names)})")
            raise PriorError(f"prior {name!r}: class_names must be the store's classes in its "
                             f"order ('spml info {store.path}'); got {detail}")
    values = {"scores": _check_matrix(scores, name, "scores", shape)}
    for key, arr in dict(extras or {}).items():
        check_prior_name(key, "extra name")
        if key == "scores":
            raise PriorError(f"prior {name!r}: an extra cannot be called 'scores' (the main "
                             "matrix); pick another name")
        values[key] = _check_matrix(arr, name, f"extra {key!r}", shape)
    prov = _check_provenance(provenance, name)
    have = store.attrs.get("priors", {})
    if name in have and not overwrite:
        source = have[name]["provenance"].get("source")
        raise PriorError(
            f"{store.path} already holds prior {name!r} (from {source}); "
            "pass --overwrite to replace it, or choose another --name"
        )
    group = zarr.open_group(store.path, mode="r+")
    parent = group.require_group(GROUP)
    staging_key = f"{_STAGING}{name}"
    staging_dir = store.path / GROUP / staging_key
    shutil.rmtree(staging_dir, ignore_errors=True)
    block_rows = max(1, min(int(store.attrs["block_rows"]), store.n_rows))
    try:
        staged = parent.create_group(staging_key, overwrite=True)
        for key, arr in values.items():
            small_array(staged, key, arr, chunks=(block_rows, shape[1]))
        final_dir = store.path / GROUP / name
        if final_dir.exists():
            shutil.rmtree(final_dir)
        os.rename(staging_dir, final_dir)
    except BaseException:
        shutil.rmtree(staging_dir, ignore_errors=True)
        raise
    record = {"provenance": prov, "extras": sorted(k for k in values if k != "scores"),
              "shape": list(shape), "created": utc_now()}
    update_root_attrs(store.path, lambda attrs: {  # re-read under the lock: draws may land too
        "priors": {**dict(attrs.get("priors", {})), name: record}})
    return Prior(name, values["scores"], {k: v for k, v in values.items() if k != "scores"}, prov)
