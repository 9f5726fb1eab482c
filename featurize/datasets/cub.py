"""CUB-200-2011 attributes from the official layout (docs/protocol.md "Official dataset layouts"),
read as Cole et al.'s ``preproc/format_cub.py`` does: the 312 attributes of ``attributes.txt`` are
the classes; an image's label is ``is_present`` of ``attributes/image_attribute_labels.txt`` (the
first three fields of a line, as the reference; every (image, attribute) pair exactly once);
every image is kept, in ``images.txt`` order (those without a positive counted in
``Phase.n_unlabeled``). Pool = ``is_training_image == 1`` (5,994), test = the rest (5,794).

The dataset folder holds ``images.txt``: ``root``, ``root/CUB_200_2011`` (the official archive)
or ``root/CUB_200_2011/CUB_200_2011`` (Cole et al.'s ``data/cub``); ``attributes.txt`` is looked
for there, in its parent and in its ``attributes/`` folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from probe.errors import MissingPathError
from probe.store.index import DatasetIndex, Phase

from ._parse import DatasetFormatError, at, find_file, read_fields, require_file, require_images

__all__ = ["find_cub", "load_cub"]


def find_cub(root: str | Path) -> Path:
    """The folder holding ``images.txt`` (see the module docstring for the accepted roots)."""
    root = Path(root)
    for cand in (root, root / "CUB_200_2011", root / "CUB_200_2011" / "CUB_200_2011"):
        if (cand / "images.txt").is_file():
            return cand
    raise MissingPathError(
        f"no CUB-200-2011 layout under {root}: expected {root}/images.txt or "
        f"{root}/CUB_200_2011/images.txt; extract CUB_200_2011.tgz there")


def _id_table(path: Path, layout: str) -> list[tuple[int, int, str]]:
    """``(line, id, value)`` of a two-column file whose first column is a unique integer id."""
    rows, first_line = [], {}
    for line, (key, value) in read_fields(path, 2, 2, layout):
        if not key.isdigit():
            raise DatasetFormatError(f"{at(path, line)}: id {key!r} is not a positive integer")
        if (first := first_line.setdefault(int(key), line)) != line:
            raise DatasetFormatError(f"{at(path, line)}: id {key} is listed again (first on line "
                                     f"{first})")
        rows.append((line, int(key), value))
    if not rows:
        raise DatasetFormatError(f"{path}: is empty; expected lines '{layout}'")
    return rows


def _attribute_names(ds: Path) -> tuple[str, ...]:
    path = find_file([ds / "attributes.txt", ds.parent / "attributes.txt",
                      ds / "attributes" / "attributes.txt"], "CUB attribute names (attributes.txt)",
                     "CUB_200_2011.tgz has it next to the CUB_200_2011 folder")
    names = []
    for k, (line, attr_id, name) in enumerate(_id_table(path, "<attribute_id> <name>"), 1):
        if attr_id != k:
            raise DatasetFormatError(
                f"{at(path, line)}: expected attribute id {k} (ids must run 1, 2, … in order), "
                f"found {attr_id}")
        names.append(name)
    return tuple(names)


def _find_line(path: Path, row: int | None = None) -> tuple[int, str]:
    """``(1-based line, text)`` of the ``row``-th (0-based) non-blank line or, without ``row``,
    of the first that does not start with three integers; ``(0, "")`` if none (errors only)."""
    with path.open("rb") as f:
        nonblank = ((n, raw) for n, raw in enumerate(f, 1) if raw.strip())
        for k, (line, raw) in enumerate(nonblank):
            fields = raw.split()
            bad = len(fields) < 3 or not all(x.isdigit() for x in fields[:3])
            if (k == row) if row is not None else bad:
                return line, raw.decode("utf-8", "replace").strip()[:80]
    return 0, ""


def _attribute_labels(path: Path, row_of: dict[int, int], n_attrs: int, ids_path: Path
                      ) -> np.ndarray:
    """The (N, A) ``is_present`` matrix; vectorised (the official file has 3.7M lines)."""
    layout = "<image_id> <attribute_id> <is_present> <certainty_id> <time>"
    try:
        table = np.loadtxt(path, usecols=(0, 1, 2), dtype=np.int64, comments=None, ndmin=2)
    except ValueError as e:
        line, text = _find_line(path)
        found = f"found {text!r}" if line else f"numpy said: {e}"
        raise DatasetFormatError(
            f"{at(path, line or None)}: expected '{layout}' (integers) but {found}") from None
    image_ids, attr_ids, present = table.T
    known = np.full(max(row_of) + 1, -1, dtype=np.int64)  # image id -> row, -1 = unknown
    known[list(row_of)] = list(row_of.values())
    in_range = (image_ids >= 0) & (image_ids < len(known))
    rows = np.where(in_range, known[np.where(in_range, image_ids, 0)], -1)
    checks = ((rows < 0, lambda k: f"image id {image_ids[k]} is not in {ids_path}"),
              ((attr_ids < 1) | (attr_ids > n_attrs),
               lambda k: f"attribute id {attr_ids[k]} is outside 1..{n_attrs} (attributes.txt)"),
              ((present != 0) & (present != 1), lambda k: f"is_present {present[k]} is not 0 or 1"))
    for bad, message in checks:
        if bad.any():
            k = int(np.argmax(bad))
            raise DatasetFormatError(f"{at(path, _find_line(path, k)[0])}: {message(k)}")
    flat = rows * n_attrs + (attr_ids - 1)
    counts = np.bincount(flat, minlength=len(row_of) * n_attrs)
    if (counts > 1).any():
        repeated = np.ones(len(flat), dtype=bool)
        repeated[np.unique(flat, return_index=True)[1]] = False  # first occurrences are fine
        k = int(np.argmax(repeated))
        raise DatasetFormatError(
            f"{at(path, _find_line(path, k)[0])}: image {image_ids[k]}, attribute {attr_ids[k]} "
            f"is given again; each (image, attribute) pair must appear once")
    if (counts == 0).any():
        r, a = divmod(int(np.argmin(counts)), n_attrs)
        image_id = next(i for i, row in row_of.items() if row == r)
        raise DatasetFormatError(
            f"{path}: has no line for image {image_id}, attribute {a + 1}; expected one line "
            f"for every image of {ids_path} and every attribute ({len(row_of) * n_attrs} lines), "
            f"found {len(flat)}")
    labels = np.zeros((len(row_of), n_attrs), dtype=np.uint8)
    labels[rows, attr_ids - 1] = present
    return labels


def load_cub(root: str | Path, *, check_images: bool = True) -> DatasetIndex:
    """CUB-200-2011 with its 312 attributes as classes (``root``: module docstring);
    ``check_images``: every image must exist under ``images/``."""
    ds = find_cub(root)
    images_path = ds / "images.txt"
    images = _id_table(images_path, "<image_id> <image_name>")
    row_of = {image_id: r for r, (_, image_id, _) in enumerate(images)}
    split_path = require_file(ds / "train_test_split.txt", "CUB train/test split")
    is_train = np.full(len(images), -1, dtype=np.int8)
    for line, image_id, flag in _id_table(split_path, "<image_id> <is_training_image>"):
        if image_id not in row_of:
            raise DatasetFormatError(
                f"{at(split_path, line)}: image id {image_id} is not in {images_path}")
        if flag not in ("0", "1"):
            raise DatasetFormatError(
                f"{at(split_path, line)}: is_training_image {flag!r} is not 0 or 1")
        is_train[row_of[image_id]] = int(flag)
    if (is_train < 0).any():
        line, image_id, _ = images[int(np.argmax(is_train < 0))]
        raise DatasetFormatError(
            f"{split_path}: has no line for image {image_id} ({at(images_path, line)})")
    class_names = _attribute_names(ds)
    labels_path = require_file(ds / "attributes" / "image_attribute_labels.txt",
                               "CUB image attribute labels")
    labels = _attribute_labels(labels_path, row_of, len(class_names), images_path)
    phases, groups = {}, []
    for name, flag in (("pool", 1), ("test", 0)):
        rows = np.flatnonzero(is_train == flag)
        ids = tuple(images[r][2] for r in rows)
        paths = tuple(ds / "images" / name_ for name_ in ids)
        groups.append((paths, images_path, [images[r][0] for r in rows]))
        phases[name] = Phase(image_ids=ids, paths=paths, labels=labels[rows],
                             n_unlabeled=int((~labels[rows].any(axis=1)).sum()))
    if check_images:
        require_images(*groups)
    return DatasetIndex(
        name="cub", class_names=class_names, pool=phases["pool"], test=phases["test"], root=ds)
