"""NUS-WIDE from the official release (docs/protocol.md "Official dataset layouts": NUS-WIDE).

Files read under the dataset root:

* ``ImageList/TrainImagelist.txt``, ``ImageList/TestImagelist.txt``: one image per line, as
  written by the NUS team on Windows (``actor\\0001_2124494179.jpg``; a full
  ``C:\\ImageData\\Flickr\\actor\\…`` form is accepted too: everything up to the last
  ``Flickr`` folder is dropped). Backslashes become path separators.
* ``Concepts81.txt`` (in the root or in ``ConceptsList/``): the 81 concept names, one a line;
  their order is the column order.
* ``Groundtruth/TrainTestLabels/Labels_<concept>_{Train,Test}.txt``: one ``0``/``1`` per line in
  the order of the image list.

Pool = official Train list, test = official Test list, in list order. Rows with no positive are
**kept** and counted in ``Phase.n_unlabeled`` (docs/protocol.md "Pools": about 22% of NUS rows).
Image ids are the list entries as paths relative to the ``Flickr`` folder
(``actor/0001_2124494179.jpg``), which is how Cole et al.'s code resolves its NUS image names.

Images are expected in one of these layouts, the first that holds the first listed image:

1. ``<root>/Flickr/<concept>/<file>`` (the official ``Flickr.zip`` extracted in the root),
2. ``<root>/images/<concept>/<file>``,
3. ``<root>/images/<file>`` (flat copies, as some re-crawls store them);

layout 1 when none does. With ``check_images`` (default) every image must then exist.
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


def _locate(base: Path, flat: bool, rel: str) -> Path:
    return base / (rel.rsplit("/", 1)[-1] if flat else rel)


def _image_paths(root: Path, rels: list[str]) -> tuple[Path, ...]:
    """Image files for normalized entries, in the first of the module docstring's layouts that
    holds the first listed image (the Flickr layout when none does)."""
    layouts = [(root / "Flickr", False), (root / "images", False), (root / "images", True)]
    chosen = next((lay for lay in layouts if rels and _locate(*lay, rels[0]).is_file()), layouts[0])
    return tuple(_locate(*chosen, rel) for rel in rels)


def _concepts(root: Path) -> tuple[str, ...]:
    path = find_file([root / "Concepts81.txt", root / "ConceptsList" / "Concepts81.txt"],
                     "NUS-WIDE concept list", "it comes with the NUS-WIDE ground-truth downloads")
    first_line: dict[str, int] = {}
    for line, text in read_lines(path):
        if len(text.split()) != 1:
            raise DatasetFormatError(
                f"{at(path, line)}: expected one concept name per line, found {text!r}")
        if text in first_line:
            raise DatasetFormatError(
                f"{at(path, line)}: concept {text!r} is listed again (first on line "
                f"{first_line[text]})")
        first_line[text] = line
    if not first_line:
        raise DatasetFormatError(f"{path}: lists no concept")
    return tuple(first_line)


def load_nus(root: str | Path, *, check_images: bool = True) -> DatasetIndex:
    """NUS-WIDE (81 concepts) from the official release, as the SPML protocol uses it.

    ``root``: the folder holding ``ImageList/``, ``Groundtruth/`` and ``Concepts81.txt`` (see the
    module docstring for every accepted place). ``check_images``: verify every image exists
    (False indexes the labels alone, e.g. to import Cole et al.'s released features).
    """
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
            rel = normalize_nus_entry(text)
            if not rel:
                raise DatasetFormatError(f"{at(list_path, line)}: {text!r} names no image file")
            if rel in listed:
                raise DatasetFormatError(
                    f"{at(list_path, line)}: image {rel} is listed again (first in {listed[rel]})")
            listed[rel] = at(list_path, line)
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
        n_unlabeled = int((~labels.any(axis=1)).sum())
        phases[phase_name] = Phase(
            image_ids=tuple(ids), paths=paths, labels=labels, n_unlabeled=n_unlabeled)
    if check_images:
        require_images(*groups)
    return DatasetIndex(
        name="nus", class_names=concepts, pool=phases["pool"], test=phases["test"], root=root)
