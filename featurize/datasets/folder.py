"""Users' own multi-label image data: an image folder plus an annotation file (``labels.csv`` or
``labels.jsonl`` in ``root`` unless ``annotations`` names one); image paths relative to ``root``
or absolute; every error names the annotation file and line.

* **CSV**: ``path,labels[,split]``, a row's labels joined by ``;`` (``img/001.jpg,cat;dog,train``);
  an optional header row (a cell ``path``) names the columns in any order, others are ignored.
* **JSON lines** (``.jsonl``, ``.ndjson``, ``.json``): ``{"path": …, "labels": […], "split": …}``.

Classes: the given list (names, or a file of one name a line), else the sorted union of the
labels. ``split`` is ``train`` (the pool) or ``test``, on every row or on none; without it a
seeded test split like docs/protocol.md step 3 (``RandomState(split_seed).permutation(N)``, the
last ``round(test_fraction * N)`` are test). Rows without labels: ``empty`` = ``error``
(default), ``keep`` (counted in ``Phase.n_unlabeled``) or ``drop``.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from probe.errors import SpmlError, plain
from probe.store.index import DatasetIndex, Phase
from probe.store.protocol import PROTOCOL_SEED

from ._parse import DatasetFormatError, at, find_file, read_lines, require_file, require_images

__all__ = ["SPLIT_VALUES", "load_folder"]

#: Accepted values of the ``split`` column / key.
SPLIT_VALUES = ("train", "test")
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
_COLUMNS = ("path", "labels", "split")  # CSV columns, in the order of a file without header


@dataclass(frozen=True)
class _Row:
    """One annotation record as written."""

    line: int
    path: str
    labels: tuple[str, ...]
    split: str | None


def _label_names(raw: list[str]) -> tuple[str, ...]:
    """The label names of one row, stripped, empty ones (``"cat;;dog"``, a trailing ``;``)
    dropped."""
    names = [x.strip() for x in raw]
    return tuple(name for name in names if name)


def _split_value(value: object, where: str) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    text = str(value).strip().lower()
    if text not in SPLIT_VALUES:
        extra = (" (validation rows are drawn from 'train' by the protocol)"
                 if text in ("val", "valid", "validation") else "")
        raise DatasetFormatError(
            f"{where}: split '{value}' is not one of {', '.join(SPLIT_VALUES)}{extra}")
    return text


def _read_csv(path: Path) -> list[_Row]:
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DatasetFormatError(
            f"{path}: not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    rows: list[_Row] = []
    header: list[str] | None = None
    try:
        for cells in reader:
            where = at(path, reader.line_num)
            names = [c.strip().lower() for c in cells]
            if not any(names):
                continue
            if not rows and header is None and "path" in names:
                if "labels" not in names or any(names.count(n) > 1 for n in _COLUMNS):
                    raise DatasetFormatError(
                        f"{where}: the header must name the columns 'path' and 'labels' once "
                        f"each (and optionally 'split'), found {','.join(cells)}")
                header = names
                continue
            if header is None and len(cells) not in (2, 3):
                raise DatasetFormatError(
                    f"{where}: expected 'path,labels' or 'path,labels,split' (labels joined by "
                    f"';'), found {len(cells)} {'cell' if len(cells) == 1 else 'cells'}: "
                    f"{','.join(cells)}")
            if header is not None and len(cells) != len(header):
                raise DatasetFormatError(
                    f"{where}: expected {len(header)} cells as in the header, found {len(cells)}")
            cell = dict(zip(header or _COLUMNS, cells))
            labels = _label_names(cell["labels"].split(";"))
            split = _split_value(cell.get("split"), where)
            rows.append(_Row(reader.line_num, cell["path"].strip(), labels, split))
    except csv.Error as e:
        raise DatasetFormatError(f"{at(path, reader.line_num)}: not valid CSV ({e})") from None
    return rows


def _read_jsonl(path: Path) -> list[_Row]:
    rows = []
    for line, text in read_lines(path):
        where = at(path, line)
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise DatasetFormatError(f"{where}: not a JSON object ({e.msg})") from None
        labels = obj.get("labels") if isinstance(obj, dict) else None
        if not (isinstance(obj, dict) and isinstance(obj.get("path"), str)
                and isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
            raise DatasetFormatError(
                f'{where}: expected an object like {{"path": "img/1.jpg", "labels": '
                f'["cat", "dog"]}} (labels a list of strings), found {text[:100]}')
        names = _label_names(labels)
        rows.append(_Row(line, obj["path"].strip(), names, _split_value(obj.get("split"), where)))
    return rows


def _class_list(classes: str | Path | Sequence[str]) -> tuple[tuple[str, ...], str]:
    """Names and where they came from (a file, or "the classes argument")."""
    if isinstance(classes, str | Path):
        path = require_file(Path(classes), "class list")
        first: dict[str, int] = {}
        for line, name in read_lines(path):
            if (seen := first.setdefault(name, line)) != line:
                raise DatasetFormatError(f"{at(path, line)}: class {name!r} is listed again "
                                         f"(first on line {seen})")
        names, source = tuple(first), str(path)
    else:
        names, source = tuple(str(c).strip() for c in classes), "the classes argument"
        dupes = sorted({c for c in names if names.count(c) > 1})
        if dupes:
            raise SpmlError(f"classes: names must be unique, repeated: {', '.join(dupes)}")
    if not names:
        raise SpmlError(f"classes: {source} lists no class")
    return names, source


def load_folder(root: str | Path, *, annotations: str | Path | None = None,
                classes: str | Path | Sequence[str] | None = None, name: str | None = None,
                empty: Literal["error", "keep", "drop"] = "error", test_fraction: float = 0.2,
                split_seed: int = PROTOCOL_SEED, check_images: bool = True) -> DatasetIndex:
    """The image folder ``root`` with its annotation file (module docstring); ``name`` defaults
    to the folder's name; ``check_images``: every listed image must exist."""
    root = Path(root)
    if root.exists() and not root.is_dir():  # load_dataset refused a missing one
        raise DatasetFormatError(f"--root {root}: is a file; expected the image folder")
    if empty not in ("error", "keep", "drop"):
        raise SpmlError(f"--option empty: expected error, keep or drop; got {plain(empty)}")
    if not 0.0 < test_fraction < 1.0:
        raise SpmlError(f"--option test_fraction: expected a number in (0, 1); got "
                        f"{plain(test_fraction)}")
    known, source = _class_list(classes) if classes is not None else ((), "")
    if annotations is None:
        ann = find_file([root / "labels.csv", root / "labels.jsonl"], "annotation file",
                        "pass --option annotations=PATH to name a CSV or JSON-lines file")
        if ann.suffix == ".csv" and (root / "labels.jsonl").is_file():
            raise SpmlError(
                f"annotations: both {ann} and {root / 'labels.jsonl'} exist; pass "
                f"--option annotations=PATH to choose one")
    else:
        ann = require_file(Path(annotations), "annotation file")
    if ann.suffix.lower() == ".csv":
        rows = _read_csv(ann)
    elif ann.suffix.lower() in _JSON_SUFFIXES:
        rows = _read_jsonl(ann)
    else:
        raise SpmlError(
            f"annotations: cannot tell the format of {ann} from its suffix; name it .csv "
            f"(path,labels[,split]) or .jsonl (one JSON object a line)")
    if not rows:
        raise DatasetFormatError(f"{ann}: has no annotation rows")
    known_set = set(known)
    kept: list[_Row] = []
    seen: dict[str, int] = {}  # image -> the line first listing it
    for row in rows:
        where = at(ann, row.line)
        if not row.path:
            raise DatasetFormatError(f"{where}: the image path is empty")
        for label in row.labels:
            if known and label not in known_set:
                close = difflib.get_close_matches(label, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise DatasetFormatError(
                    f"{where}: unknown class {label!r} (not in {source}){hint}")
        if (first := seen.setdefault(os.path.normpath(root / row.path), row.line)) != row.line:
            raise DatasetFormatError(
                f"{where}: image {row.path} is listed again (first on line {first})")
        if not row.labels:
            if empty == "error":
                raise DatasetFormatError(
                    f"{where}: image {row.path} has no label; pass --option empty=keep to keep "
                    f"such rows (counted as unlabeled) or --option empty=drop to drop them")
            if empty == "drop":
                continue
        kept.append(row)
    if not kept:
        raise DatasetFormatError(f"{ann}: no row has a label (every row was dropped)")
    with_split = [r for r in kept if r.split is not None]
    if with_split and len(with_split) != len(kept):
        missing = next(r for r in kept if r.split is None)
        raise DatasetFormatError(
            f"{at(ann, missing.line)}: no split given, but other rows have one (e.g. line "
            f"{with_split[0].line}); give train or test on every row, or on none for a seeded "
            f"{test_fraction:.0%} test split")
    n = len(kept)
    if with_split:
        members = {s: np.array([i for i, r in enumerate(kept) if r.split == s], dtype=np.int64)
                   for s in SPLIT_VALUES}
    else:
        n_test = round(test_fraction * n)
        if not 0 < n_test < n:
            raise DatasetFormatError(
                f"{ann}: {n} {'row is' if n == 1 else 'rows are'} too few for a "
                f"{test_fraction:.0%} test split; add rows or give a split column")
        perm = np.random.RandomState(split_seed).permutation(n)
        members = {"train": np.sort(perm[: n - n_test]), "test": np.sort(perm[-n_test:])}
    for split, idx in members.items():
        if len(idx) == 0:
            raise DatasetFormatError(f"{ann}: no row has split '{split}'; both phases need rows")
    class_names = known or tuple(sorted({label for r in kept for label in r.labels}))
    if not class_names:
        raise DatasetFormatError(f"{ann}: no row has a label, so there are no classes")
    column = {c: j for j, c in enumerate(class_names)}
    phases, groups = {}, []
    for split, idx in members.items():
        phase_rows = [kept[i] for i in idx]
        labels = np.zeros((len(phase_rows), len(class_names)), dtype=np.uint8)
        for i, r in enumerate(phase_rows):
            labels[i, [column[c] for c in r.labels]] = 1
        paths = tuple(root / r.path for r in phase_rows)
        groups.append((paths, ann, [r.line for r in phase_rows]))
        phases[split] = Phase(
            image_ids=tuple(Path(os.path.normpath(r.path)).as_posix() for r in phase_rows),
            paths=paths, labels=labels, n_unlabeled=sum(not r.labels for r in phase_rows))
    if check_images:
        require_images(*groups)
    return DatasetIndex(name=name or root.resolve().name or "folder", class_names=class_names,
                        pool=phases["train"], test=phases["test"], root=root)
