"""MS-COCO 2014 from its official layout (docs/protocol.md "Official dataset layouts"), read as
Cole et al.'s ``preproc/format_coco.py`` does: class index = position in ``categories`` (the same
for train and val); images with at least one annotation (crowd included), ids sorted **as
strings**; a class is positive iff it has an annotation. Pool = ``train2014`` (82,081), test =
``val2014`` (40,137); paths ``{train,val}2014/COCO_{train,val}2014_%012d.jpg``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from probe.store.index import DatasetIndex, Phase

from ._parse import DatasetFormatError, require_disjoint, require_file, require_images

__all__ = ["load_coco"]


def _load_json(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetFormatError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not all(k in data for k in ("categories", "annotations")):
        raise DatasetFormatError(
            f"{path}: expected a COCO instances file, a JSON object with 'categories' and "
            f"'annotations' lists")
    return data


def _categories(data: dict[str, Any], path: Path) -> tuple[list[str], dict[int, int]]:
    names, index = [], {}
    for i, cat in enumerate(data["categories"]):
        if not isinstance(cat, dict) or "id" not in cat or "name" not in cat:
            raise DatasetFormatError(
                f"{path}: categories[{i}] must be an object with 'id' and 'name', found {cat!r}")
        if int(cat["id"]) in index:
            raise DatasetFormatError(f"{path}: categories[{i}] repeats category id {cat['id']}")
        names.append(str(cat["name"]))
        index[int(cat["id"])] = i
    if not names:
        raise DatasetFormatError(f"{path}: the 'categories' list is empty")
    return names, index


def _phase(root: Path, split: str, data: dict, path: Path, cat_index: dict[int, int]) -> Phase:
    anns = data["annotations"]
    image_of = np.empty(len(anns), dtype=np.int64)
    class_of = np.empty(len(anns), dtype=np.int64)
    for k, ann in enumerate(anns):
        try:
            image_of[k], cat_id = int(ann["image_id"]), int(ann["category_id"])
        except (KeyError, TypeError, ValueError):
            raise DatasetFormatError(
                f"{path}: annotations[{k}] needs integer 'image_id' and 'category_id', found "
                f"{str(ann)[:120]}") from None
        if cat_id not in cat_index:
            raise DatasetFormatError(
                f"{path}: annotations[{k}] (image {image_of[k]}) has category_id {cat_id}, "
                f"which is not in the file's 'categories'")
        class_of[k] = cat_index[cat_id]
    ids = sorted({str(i) for i in image_of.tolist()})  # string order, as the reference
    row_of = {int(s): r for r, s in enumerate(ids)}
    rows = np.fromiter((row_of[i] for i in image_of.tolist()), dtype=np.int64, count=len(anns))
    labels = np.zeros((len(ids), len(cat_index)), dtype=np.uint8)
    labels[rows, class_of] = 1
    paths = tuple(root / f"{split}2014" / f"COCO_{split}2014_{int(s):012d}.jpg" for s in ids)
    return Phase(image_ids=tuple(ids), paths=paths, labels=labels,
                 bias_weights=_bias_weights(data, anns, rows, class_of, labels.shape))


def _bias_weights(data: dict, anns: list, rows: np.ndarray, class_of: np.ndarray,
                  shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """The label-bias draws' weights per (image, class) (Cole et al.'s ``spml-bias`` branch,
    ``preproc/biased_labels.py``; probe.store.bias): ``size`` = the total ``area`` of the
    class's instances; ``location`` = Σ 1/d over its instances, d the distance in pixels of the
    box centre from the image centre (0.0005 where d = 0, as theirs). Empty (no biased draws)
    when an annotation lacks ``area``/``bbox`` or an image its ``width``/``height``."""
    try:
        dims = {int(im["id"]): (float(im["width"]), float(im["height"]))
                for im in data.get("images", [])}
        area = np.array([float(a["area"]) for a in anns], dtype=np.float64)
        box = np.array([[float(v) for v in a["bbox"][:4]] for a in anns],
                       dtype=np.float64).reshape(-1, 4)
        size = np.array([dims[int(a["image_id"])] for a in anns], dtype=np.float64).reshape(-1, 2)
    except (KeyError, TypeError, ValueError, IndexError):
        return {}
    centre = box[:, :2] + box[:, 2:] / 2
    dist = np.hypot(*(centre - size / 2).T)
    inv = 1.0 / np.where(dist == 0, 0.0005, dist)
    cell = rows * shape[1] + class_of  # each annotation's (image, class): its values summed
    return {kind: np.bincount(cell, values, shape[0] * shape[1]).reshape(shape).astype(np.float32)
            for kind, values in (("size", area), ("location", inv))}


def load_coco(root: str | Path, *, check_images: bool = True) -> DatasetIndex:
    """MS-COCO 2014 (80 classes) from ``root``, the folder holding ``annotations/`` and
    ``{train,val}2014/``; ``check_images``: every image must exist."""
    root = Path(root)
    phases: dict[str, Phase] = {}
    files: dict[str, Path] = {}
    categories: dict[str, tuple[list[str], dict[int, int]]] = {}
    for split in ("train", "val"):  # one JSON in memory at a time (train2014's is 330 MB)
        path = files[split] = require_file(
            root / "annotations" / f"instances_{split}2014.json", f"COCO {split} annotations",
            "unzip annotations_trainval2014.zip into the dataset root")
        data = _load_json(path)
        categories[split] = _categories(data, path)
        if categories[split] != categories["train"]:
            raise DatasetFormatError(
                f"{path}: its 'categories' (names, ids or order) differ from those of "
                f"instances_train2014.json; both files must come from the same COCO 2014 release")
        phases[split] = _phase(root, split, data, path, categories[split][1])
        del data
    require_disjoint(phases["train"].image_ids, phases["val"].image_ids, files["train"],
                     files["val"])
    if check_images:
        require_images(*((phases[s].paths, files[s], None) for s in files))
    return DatasetIndex(name="coco", class_names=tuple(categories["train"][0]),
                        pool=phases["train"], test=phases["val"], root=root)
