"""Small readers shared by the dataset adapters: every error names the file (and line) it found,
what was expected there and how to fix it (COMMON.md "Clear errors for bad input")."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from probe.errors import MissingPathError, SpmlError
from probe.progress import plural

__all__ = ["DatasetFormatError", "find_file", "read_binary_column", "read_fields", "read_lines",
           "require_disjoint", "require_file", "require_images"]


class DatasetFormatError(SpmlError):
    """A dataset annotation file is malformed or disagrees with another one; the message names
    the file and line."""


def at(path: Path, line: int | None = None) -> str:
    """``path:line`` (or just the path) for error messages."""
    return f"{path}:{line}" if line is not None else str(path)


def require_file(path: Path, what: str, hint: str = "") -> Path:
    """``path`` if it is a file, else a :class:`FileNotFoundError` saying what is expected where."""
    if path.is_dir():
        raise DatasetFormatError(f"{what}: {path} is a directory; expected a file")
    if not path.is_file():
        msg = f"{what} not found: expected the file {path}"
        raise MissingPathError(f"{msg}; {hint}" if hint else msg)
    return path


def find_file(candidates: Sequence[Path], what: str, hint: str = "") -> Path:
    """The first existing file of ``candidates``; else an error listing every place looked at."""
    for path in candidates:
        if path.is_file():
            return path
    places = ", ".join(str(p) for p in candidates)
    msg = f"{what} not found: looked for {places}"
    raise MissingPathError(f"{msg}; {hint}" if hint else msg)


def read_lines(path: Path) -> list[tuple[int, str]]:
    """Non-blank lines of a text file, stripped, with their 1-based line numbers (CRLF, a UTF-8
    byte-order mark and trailing blank lines are accepted)."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DatasetFormatError(
            f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save the file as UTF-8"
        ) from None
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped:  # blank lines carry nothing
            lines.append((number, stripped))
    return lines


def read_fields(path: Path, n_min: int, n_max: int | None, layout: str
                ) -> list[tuple[int, list[str]]]:
    """Whitespace-separated fields of every non-blank line; a line with fewer than ``n_min`` or
    more than ``n_max`` fields is an error naming ``layout`` (e.g. ``"<image_id> <name>"``)."""
    rows = []
    for line, text in read_lines(path):
        fields = text.split()
        if len(fields) < n_min or (n_max is not None and len(fields) > n_max):
            raise DatasetFormatError(
                f"{at(path, line)}: expected '{layout}' but found {plural(len(fields), 'fields')}: "
                f"{text[:80]!r}")
        rows.append((line, fields))
    return rows


def read_binary_column(path: Path, n_expected: int, count_source: Path) -> np.ndarray:
    """A file of one ``0``/``1`` per line (NUS-WIDE ``Labels_*.txt``) as a bool vector, vectorised;
    ``count_source``, the file ``n_expected`` comes from, is named when the counts differ."""
    lines = path.read_bytes().rstrip().splitlines()
    if not set(lines) <= {b"0", b"1"}:
        lines = [s.strip() for s in lines]
        for i, s in enumerate(lines, 1):
            if s not in (b"0", b"1"):
                shown = s.decode("utf-8", "replace")[:40]
                raise DatasetFormatError(f"{at(path, i)}: expected a label 0 or 1, found {shown!r}")
    if len(lines) != n_expected:
        raise DatasetFormatError(
            f"{path}: has {plural(len(lines), 'label lines')} but {count_source} lists "
            f"{plural(n_expected, 'images')}; each label file must have exactly one 0/1 line "
            "per listed image, in the same order")
    return np.frombuffer(b"".join(lines), dtype=np.uint8) == ord("1")


def require_disjoint(pool: Sequence[str], test: Sequence[str], pool_src: Path, test_src: Path
                     ) -> None:
    """Image ids must be unique within a dataset: an id in both phases is an error."""
    both = set(pool).intersection(test)
    if both:
        raise DatasetFormatError(
            f"{plural(len(both), 'images')} {'is' if len(both) == 1 else 'are'} listed in both "
            f"{pool_src} and {test_src}, e.g. {min(both)}; the train and test splits must not "
            "share images")


#: Images of one annotation file: their paths, the file, and the line listing each (or None).
ImageGroup = tuple[Sequence[Path], Path, Sequence[int] | None]


def require_images(*groups: ImageGroup) -> None:
    """Raise :class:`FileNotFoundError` when images are missing, with a count and the first few,
    each with the annotation file (and line) that lists it."""
    missing = [(path, at(source, None if lines is None else lines[i]))
               for paths, source, lines in groups for i, path in enumerate(paths)
               if not os.path.isfile(path)]  # os.path: much faster than pathlib for 100k+ files
    if not missing:
        return
    total = sum(len(paths) for paths, _, _ in groups)
    shown = "".join(f"\n  {path} (listed in {where})" for path, where in missing[:20])
    more = f"\n  ... and {len(missing) - 20} more" if len(missing) > 20 else ""
    raise MissingPathError(
        f"{len(missing)} of {plural(total, 'image files')} "
        f"{'is' if len(missing) == 1 else 'are'} missing. Check the dataset root and that "
        "the images were extracted there; or featurize the others with --skip-bad (the missing "
        "ones get zero features and are listed in the store's bad_rows), or index the labels "
        f"alone with --option check_images=false:{shown}{more}")
