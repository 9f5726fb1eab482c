"""PASCAL VOC 2012 from its official layout (docs/protocol.md "Official dataset layouts"), read as
Cole et al.'s ``preproc/format_pascal.py`` does: ``ImageSets/Main/{class}_{train,val}.txt`` (lines
``<id> <-1|0|1>``), positive iff ``1`` (``0``, "difficult", is negative), images without a
positive dropped, the rest sorted by ``<id>.jpg``. Pool = ``train`` (5,717), test = ``val`` (5,823).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from probe.errors import MissingPathError
from probe.store.index import DatasetIndex, Phase

from ._parse import (
    DatasetFormatError,
    at,
    read_fields,
    require_disjoint,
    require_file,
    require_images,
)

__all__ = ["VOC_CLASSES", "find_voc2012", "load_voc"]

#: The 20 VOC classes in the standard (alphabetical) order = column order of the labels.
VOC_CLASSES: tuple[str, ...] = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
    "train", "tvmonitor",
)  # fmt: skip

_VALUES = {"-1": 0, "0": 0, "1": 1}


def find_voc2012(root: str | Path) -> Path:
    """The ``VOC2012`` folder for ``root`` = the folder holding ``VOCdevkit``, ``VOCdevkit``
    itself, or ``VOC2012`` itself."""
    root = Path(root)
    for cand in (root / "VOCdevkit" / "VOC2012", root / "VOC2012", root):
        if (cand / "ImageSets" / "Main").is_dir():
            return cand
    raise MissingPathError(
        f"no VOC 2012 layout under {root}: expected {root}/VOCdevkit/VOC2012/ImageSets/Main/ "
        f"(root may also be the VOCdevkit or VOC2012 folder itself); extract "
        f"VOCtrainval_11-May-2012.tar there")


def _read_class_file(path: Path) -> list[tuple[int, str, int]]:
    """``(line, image_id, label)`` of one ``{class}_{split}.txt``; label 1 iff the value is 1."""
    entries, first_line = [], {}
    for line, (image_id, value) in read_fields(path, 2, 2, "<image_id> <-1|0|1>"):
        if value not in _VALUES:
            raise DatasetFormatError(
                f"{at(path, line)}: label {value!r} for image {image_id} is not one of -1, 0, 1 "
                f"(1 = present, 0 = difficult, -1 = absent)")
        if (first := first_line.setdefault(image_id, line)) != line:
            raise DatasetFormatError(f"{at(path, line)}: image {image_id} is listed again (first "
                                     f"on line {first})")
        entries.append((line, image_id, _VALUES[value]))
    return entries


def _read_phase(main: Path, split: str) -> tuple[Path, list[int], list[str], np.ndarray]:
    """One official split: the first class file, the line of each image in it, the image ids in
    that file's order and their (N, 20) labels. Every class file must list the same images."""
    files = [require_file(main / f"{name}_{split}.txt", f"VOC class file for '{name}' ({split})",
                          "every one of the 20 classes needs its ImageSets/Main file")
             for name in VOC_CLASSES]
    ref = _read_class_file(files[0])
    ids = [image_id for _, image_id, _ in ref]
    row = {image_id: r for r, image_id in enumerate(ids)}
    labels = np.zeros((len(ids), len(VOC_CLASSES)), dtype=np.uint8)
    same = f"every class file of the '{split}' split must list the same images"
    for c, path in enumerate(files):
        entries = ref if c == 0 else _read_class_file(path)
        if len(entries) != len(ids):
            raise DatasetFormatError(
                f"{path}: lists {len(entries)} images but {files[0]} lists {len(ids)}; {same}")
        for line, image_id, value in entries:
            if image_id not in row:
                raise DatasetFormatError(
                    f"{at(path, line)}: image {image_id} is not listed in {files[0]}; {same}")
            labels[row[image_id], c] = value
    return files[0], [line for line, _, _ in ref], ids, labels


def load_voc(root: str | Path, *, check_images: bool = True) -> DatasetIndex:
    """PASCAL VOC 2012 (20 classes) from ``root`` (the folder holding ``VOCdevkit``, or
    ``VOCdevkit``, or ``VOC2012``); ``check_images``: every kept image must exist."""
    voc = find_voc2012(root)
    main = voc / "ImageSets" / "Main"
    phases, groups = {}, []
    for split in ("train", "val"):
        ref_path, ref_lines, ids, labels = _read_phase(main, split)
        # Cole's format_pascal.py sorts the file names "<id>.jpg" of images with a positive.
        keep = sorted(np.flatnonzero(labels.any(axis=1)).tolist(), key=lambda i: ids[i] + ".jpg")
        kept_ids = tuple(ids[i] for i in keep)
        paths = tuple(voc / "JPEGImages" / f"{image_id}.jpg" for image_id in kept_ids)
        groups.append((paths, ref_path, [ref_lines[i] for i in keep]))
        phases[split] = Phase(image_ids=kept_ids, paths=paths, labels=labels[keep])
    require_disjoint(phases["train"].image_ids, phases["val"].image_ids, groups[0][1], groups[1][1])
    if check_images:
        require_images(*groups)
    return DatasetIndex(
        name="voc", class_names=VOC_CLASSES, pool=phases["train"], test=phases["val"], root=voc)
