"""``spml import priors``: per-image class scores computed elsewhere (a CLIP run, a teacher) into
a store's ``priors/<name>`` (:func:`probe.store.write_prior`, docs/priors.md). By suffix:
``.npy``, an ``(N, C)`` matrix in the store's row and class order; ``.csv`` / ``.parquet``, one
column per class name (any order) and optionally an ``image_id`` column matching the store's ids
(then any row order, every store row once; else the store's order).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from featurize.datasets.cole import load_npy
from probe.errors import MissingPathError, SpmlError

__all__ = ["PROMPT_FLAGS", "PriorFileError", "import_priors", "parse_tiles", "read_score_table",
           "tiles_text"]

#: the one spelling of the prompt option of ``spml priors`` and ``spml import priors`` (the
#: second, ``--prompt``, is accepted too)
PROMPT_FLAGS = ("--prompt-template", "--prompt")

ID_COLUMN = "image_id"
SUFFIXES = (".npy", ".csv", ".parquet")


class PriorFileError(SpmlError):
    """A scores file that cannot be read as a store's prior."""


def parse_tiles(text: str) -> tuple[int, int]:
    """``--tiles`` of ``spml priors`` and ``spml import priors``: ``K`` or ``RxC`` (``4`` is
    ``4x4``; ``0`` no tiles); returns ``(rows, cols)``. Raises an ``SpmlError`` (a
    ``ValueError``, so argparse reports it) naming the flag and the forms."""
    rows, sep, cols = str(text).strip().lower().partition("x")
    cols = cols if sep else rows
    if not rows.isdigit() or not cols.isdigit() or (int(rows) == 0) != (int(cols) == 0):
        raise SpmlError(f"--tiles: expected K or RxC, e.g. 4 or 4x4 (0: no tiles); got {text}")
    return int(rows), int(cols)


def tiles_text(tiles: tuple[int, int] | None) -> str | None:
    """The provenance's form of a tile grid: ``"4x4"`` (None without tiles)."""
    return f"{tiles[0]}x{tiles[1]}" if tiles and tiles[0] else None


def _table_columns(path: Path) -> tuple[list[str], dict[str, list[Any]]]:
    """The header and columns of a ``.csv`` or ``.parquet`` table."""
    if path.suffix == ".parquet":
        import polars as pl

        try:
            frame = pl.read_parquet(path)
        except Exception as err:  # polars' own errors: not a parquet file, damaged
            raise PriorFileError(f"--from {path}: not a readable parquet file ({err})") from None
        return list(frame.columns), {c: frame[c].to_list() for c in frame.columns}
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        raise PriorFileError(f"--from {path}: the csv file is empty; it needs a header row of "
                             "class names (and optionally image_id)")
    header, body = [h.strip() for h in rows[0]], rows[1:]
    for i, row in enumerate(body):
        if len(row) != len(header):
            raise PriorFileError(f"--from {path}: line {i + 2} has {len(row)} fields, the header "
                                 f"has {len(header)}")
    return header, {h: [r[j] for r in body] for j, h in enumerate(header)}


def read_score_table(path: str | Path, class_names: Sequence[str],
                     image_ids: Sequence[str]) -> np.ndarray:
    """An ``(N, C)`` float matrix from a scores file (module docstring), rows and columns in
    the store's order (``image_ids``, ``class_names``)."""
    path = Path(path)
    if path.is_dir():
        raise PriorFileError(f"--from {path}: is a directory; expected a {', '.join(SUFFIXES)} "
                             "file of class scores")
    if not path.is_file():
        raise MissingPathError(f"--from: file {path} not found")
    if path.suffix not in SUFFIXES:
        raise PriorFileError(f"--from {path}: expected a {', '.join(SUFFIXES)} file; got suffix "
                             f"'{path.suffix}'")
    if path.suffix == ".npy":
        return np.asarray(load_npy(path, "--from (scores)"))
    header, columns = _table_columns(path)
    classes = [c for c in header if c != ID_COLUMN]
    missing = [c for c in class_names if c not in columns]
    unknown = [c for c in classes if c not in class_names]
    if missing or unknown or len(set(classes)) != len(classes):
        twice = sorted({c for c in classes if classes.count(c) > 1})
        found = [f"{what} {', '.join(names[:5])}" + (f" (and {len(names) - 5} more)"
                                                   if len(names) > 5 else "")
                 for what, names in (("missing", missing), ("unknown", unknown),
                                     ("repeated", twice)) if names]
        raise PriorFileError(
            f"--from {path}: the columns must be the store's {len(class_names)} class names "
            f"(plus optionally '{ID_COLUMN}'); {'; '.join(found)}")
    values = np.empty((len(next(iter(columns.values()), [])), len(class_names)))
    for j, name in enumerate(class_names):
        for i, cell in enumerate(columns[name]):
            try:
                values[i, j] = float(cell)
            except (TypeError, ValueError):
                where = (f"line {i + 2}, column {header.index(name) + 1} ('{name}')"
                         if path.suffix == ".csv" else f"row {i + 1}, column '{name}'")
                got = f"'{cell}'" if cell is not None and str(cell).strip() else "an empty cell"
                raise PriorFileError(f"--from {path}: {where} holds {got}; every class column "
                                     "must hold a number for every image") from None
    if ID_COLUMN not in columns:
        return values
    ids = [str(v) for v in columns[ID_COLUMN]]
    position = {image_id: i for i, image_id in enumerate(ids)}
    if len(position) != len(ids):
        seen: set[str] = set()
        twice = [i for i in ids if i in seen or seen.add(i)]
        n = len(set(twice))
        raise PriorFileError(f"--from {path}: the {ID_COLUMN} column repeats {n} "
                             f"{'id' if n == 1 else 'ids'}, e.g. '{twice[0]}'; one row per "
                             "image")
    absent = [i for i in image_ids if i not in position]
    if absent or len(ids) != len(image_ids):
        eg = f" (e.g. {', '.join(absent[:3])})" if absent else ""
        raise PriorFileError(
            f"--from {path}: the {ID_COLUMN} column must hold every store image id once "
            f"({len(image_ids)} rows); {len(absent)} store ids are absent{eg}, "
            f"the file has {len(ids)} rows")
    return values[[position[i] for i in image_ids]]


def import_priors(store_path: str | Path, name: str, from_path: str | Path, *,
                  extras: Mapping[str, str | Path] | None = None,
                  provenance: Mapping[str, Any] | None = None,
                  class_names_path: str | Path | None = None, overwrite: bool = False) -> Any:
    """Read a scores file (and ``extras`` files, the same format) and store them as prior
    ``name`` (:func:`probe.store.write_prior`); the file's path and sha256 go into the
    provenance's ``source``. ``class_names_path``: the ``.npy`` columns' class names, one per
    line, checked against the store's order. Returns the stored prior."""
    from featurize.datasets.cole import read_class_names
    from probe.store import file_sha256, open_store, write_prior

    store = open_store(store_path)
    files = {"scores": Path(from_path), **{k: Path(v) for k, v in (extras or {}).items()}}
    values = {key: read_score_table(p, store.class_names, store.image_ids)
              for key, p in files.items()}
    names = (None if class_names_path is None
             else read_class_names(Path(class_names_path), store.n_classes))
    prov = dict(provenance or {})
    prov.setdefault("source", str(files["scores"].resolve()))
    prov["source_files"] = {k: {"path": str(p.resolve()), "sha256": file_sha256(p)}
                            for k, p in files.items()}
    return write_prior(store.path, name, values.pop("scores"), prov, extras=values,
                       overwrite=overwrite, class_names=names)
