"""NUS-WIDE from the official release (docs/protocol.md "Official dataset layouts"):
``ImageList/{Train,Test}Imagelist.txt`` (Windows paths such as ``actor\\0001_2124494179.jpg``,
everything up to the last ``Flickr`` folder dropped), ``Concepts81.txt`` (in the root or in
``ConceptsList/``; the column order) and ``Groundtruth/TrainTestLabels/Labels_<concept>_{Train,
Test}.txt`` (one 0/1 a line, in list order). Pool = Train, test = Test, in list order; rows without
a positive are kept (``Phase.n_unlabeled``). Image ids are the entries relative to ``Flickr``
(``actor/0001_2124494179.jpg``), as Cole et al.'s code names them. Images: the first layout that
holds the first listed one of ``<root>/Flickr/<concept>/<file>`` (the official ``Flickr.zip``),
``<root>/images/<concept>/<file>`` and ``<root>/images/<file>``, else the first.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from probe.store.index import DatasetIndex, Phase

from ._parse import (
    DatasetFormatError,
    at,
    find_file,
    read_binary_column,
    read_lines,
    require_file,
    require_images,
)

__all__ = ["load_nus", "normalize_nus_entry"]

_SPLITS = {"pool": "Train", "test": "Test"}


def normalize_nus_entry(entry: str) -> str:
    """An image list entry as a relative POSIX path: ``C:\\ImageData\\Flickr\\actor\\x.jpg`` and
    ``actor\\x.jpg`` both give ``actor/x.jpg``."""
    parts = [p for p in entry.strip().replace("\\", "/").split("/") if p]
    lowered = [p.lower() for p in parts]
    if "flickr" in lowered:
        parts = parts[len(lowered) - lowered[::-1].index("flickr") :]
    elif parts and len(parts[0]) == 2 and parts[0][1] == ":":  # a bare drive letter
        parts = parts[1:]
    return "/".join(parts)


def _image_paths(root: Path, rels: list[str]) -> tuple[Path, ...]:
    """Image files for normalized entries, in the first of the module docstring's layouts that
    holds the first listed image (the Flickr layout when none does)."""
    layouts = [lambda rel: root / "Flickr" / rel, lambda rel: root / "images" / rel,
               lambda rel: root / "images" / rel.rsplit("/", 1)[-1]]
    chosen = next((path for path in layouts if rels and path(rels[0]).is_file()), layouts[0])
    return tuple(chosen(rel) for rel in rels)


def _concepts(root: Path) -> tuple[str, ...]:
    path = find_file([root / "Concepts81.txt", root / "ConceptsList" / "Concepts81.txt"],
                     "NUS-WIDE concept list", "it comes with the NUS-WIDE ground-truth downloads")
    first_line: dict[str, int] = {}
    for line, text in read_lines(path):
        if len(text.split()) != 1:
            raise DatasetFormatError(
                f"{at(path, line)}: expected one concept name per line, found {text!r}")
        if (first := first_line.setdefault(text, line)) != line:
            raise DatasetFormatError(f"{at(path, line)}: concept {text!r} is listed again (first "
                                     f"on line {first})")
    if not first_line:
        raise DatasetFormatError(f"{path}: lists no concept")
    return tuple(first_line)


def load_nus(root: str | Path, *, check_images: bool = True) -> DatasetIndex:
    """NUS-WIDE (81 concepts) from ``root``, the folder holding ``ImageList/``, ``Groundtruth/``
    and ``Concepts81.txt``; ``check_images``: every image must exist."""
    root = Path(root)
    concepts = _concepts(root)
    gt = root / "Groundtruth" / "TrainTestLabels"
    phases, groups = {}, []
    listed: dict[str, str] = {}  # image -> where it is first listed (ids are dataset-unique)
    for phase_name, split in _SPLITS.items():
        list_path = require_file(root / "ImageList" / f"{split}Imagelist.txt",
                                 f"NUS-WIDE {split.lower()} image list",
                                 "unzip the NUS-WIDE ImageList download into the dataset root")
        entries = read_lines(list_path)
        ids: list[str] = []
        for line, text in entries:
            rel, where = normalize_nus_entry(text), at(list_path, line)
            if not rel:
                raise DatasetFormatError(f"{where}: {text!r} names no image file")
            if (first := listed.setdefault(rel, where)) != where:
                raise DatasetFormatError(f"{where}: image {rel} is listed again (first in {first})")
            ids.append(rel)
        labels = np.zeros((len(ids), len(concepts)), dtype=np.uint8)
        for c, concept in enumerate(concepts):
            label_path = require_file(
                gt / f"Labels_{concept}_{split}.txt",
                f"NUS-WIDE {split.lower()} labels of concept '{concept}'",
                "unzip the NUS-WIDE Groundtruth download into the dataset root")
            labels[:, c] = read_binary_column(label_path, len(ids), list_path)
        paths = _image_paths(root, ids)
        groups.append((paths, list_path, [line for line, _ in entries]))
        phases[phase_name] = Phase(image_ids=tuple(ids), paths=paths, labels=labels,
                                   n_unlabeled=int((~labels.any(axis=1)).sum()))
    if check_images:
        require_images(*groups)
    return DatasetIndex(
        name="nus", class_names=concepts, pool=phases["pool"], test=phases["test"], root=root)
