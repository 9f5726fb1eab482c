"""Builders of tiny datasets in the real on-disk formats (docs/protocol.md "Official
dataset layouts"), with real JPEG files, for the adapter tests and any test
that needs images (e.g. featurize).

Every ``make_*(root, ..., seed=0)`` writes under ``root`` (a fresh directory, e.g. pytest's
``tmp_path``) and returns the answers an adapter must give, derived from the generated ground
truth, as a dict:

* ``"name"``, ``"root"``, ``"options"``: call ``load_dataset(name, root, **options)``;
* ``"class_names"``: tuple of class names in column order;
* ``"pool"`` and ``"test"``: dicts with ``"image_ids"`` (tuple), ``"paths"`` (tuple of Path),
  ``"labels"`` ((N, C) uint8) and ``"n_unlabeled"`` (int), in the adapter's row order;
* ``"grayscale"`` and ``"cmyk"``: one kept pool image saved as an 8-bit grayscale JPEG and one
  as a CMYK JPEG (for decoders' fallback paths); every other image is RGB;
* ``"images"``: every JPEG written (including images the adapter drops).

Images are noise of varied sizes (16-71 px a side) so decoding and resizing are exercised
without cost. :func:`assert_index_matches` compares a ``DatasetIndex`` with these answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

__all__ = [
    "NUS_CONCEPTS",
    "assert_index_matches",
    "make_coco",
    "make_cub",
    "make_folder",
    "make_nus",
    "make_voc",
    "write_jpeg",
]

VOC_CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
    "train", "tvmonitor",
)  # fmt: skip
#: The first concepts of the official ``Concepts81.txt`` (the builder uses a prefix of them).
NUS_CONCEPTS = (
    "airport", "animal", "beach", "bear", "birds", "boats", "book", "bridge", "buildings", "cars",
)  # fmt: skip
_COCO_CATEGORIES = ((1, "person"), (2, "bicycle"), (3, "car"), (5, "airplane"), (7, "train"),
                    (11, "fire hydrant"), (13, "stop sign"), (18, "dog"))  # fmt: skip
_CUB_SPECIES = ("001.Black_footed_Albatross", "017.Cardinal", "200.Common_Yellowthroat")


def write_jpeg(path: Path, rng: np.random.RandomState, mode: str = "RGB") -> Path:
    """A real JPEG of random noise and random size; ``mode`` "RGB", "L" or "CMYK"."""
    w, h = (int(x) for x in rng.randint(16, 72, size=2))
    bands = {"RGB": 3, "L": 1, "CMYK": 4}[mode]
    pixels = rng.randint(0, 256, size=(h, w, bands), dtype=np.uint8)
    image = Image.fromarray(pixels[..., 0] if bands == 1 else pixels, mode=mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="JPEG", quality=85)
    return path


def _random_labels(rng: np.random.RandomState, n: int, c: int, p_none: float) -> np.ndarray:
    """(n, c) uint8 with about ``p_none`` of the rows empty (the last row always), the others
    with 1-3 positives."""
    labels = np.zeros((n, c), dtype=np.uint8)
    for i in range(n - 1):
        if rng.rand() >= p_none:
            labels[i, rng.choice(c, size=rng.randint(1, min(3, c) + 1), replace=False)] = 1
    return labels


def _phase(ids, paths, labels, n_unlabeled: int = 0) -> dict[str, Any]:
    return {
        "image_ids": tuple(ids),
        "paths": tuple(paths),
        "labels": np.asarray(labels, dtype=np.uint8),
        "n_unlabeled": int(n_unlabeled),
    }


def _write_images(
    paths: list[Path], rng: np.random.RandomState, special: tuple[int, int] | None = None
) -> dict[str, Path]:
    """Write every path as RGB except rows ``special`` = (grayscale, CMYK); return those two."""
    gray, cmyk = special if special is not None else (-1, -1)
    for i, path in enumerate(paths):
        write_jpeg(path, rng, "L" if i == gray else "CMYK" if i == cmyk else "RGB")
    return {"grayscale": paths[gray], "cmyk": paths[cmyk]} if special is not None else {}


def make_voc(root: Path, n_train: int = 14, n_val: int = 10, seed: int = 0) -> dict[str, Any]:
    """``root/VOCdevkit/VOC2012`` with all 40 class files and JPEGImages. About a fifth of the
    listed images have no positive (dropped by the adapter); negatives are written as ``-1`` or,
    for some, ``0`` ("difficult"); files list the images unsorted."""
    rng = np.random.RandomState(seed)
    voc = Path(root) / "VOCdevkit" / "VOC2012"
    main = voc / "ImageSets" / "Main"
    main.mkdir(parents=True)
    out: dict[str, Any] = {
        "name": "voc",
        "root": Path(root),
        "options": {},
        "class_names": VOC_CLASSES,
        "images": [],
    }
    n = n_train + n_val
    numbers = np.arange(n) * 37 + rng.randint(0, 37, size=n)  # unique: one per window of 37
    years = rng.randint(2007, 2013, size=n)  # random years: the files list ids unsorted
    all_ids = [f"{y}_{k:06d}" for y, k in zip(years, numbers)]
    for split, ids in (("train", all_ids[:n_train]), ("val", all_ids[n_train:])):
        labels = _random_labels(rng, len(ids), len(VOC_CLASSES), p_none=0.2)
        labels[0, 3] = 1  # the first listed image is kept: it becomes the grayscale one
        labels[1, 5] = 1  # and the second the CMYK one
        difficult = (labels == 0) & (rng.rand(*labels.shape) < 0.1)
        for c, name in enumerate(VOC_CLASSES):
            values = np.where(labels[:, c] == 1, 1, np.where(difficult[:, c], 0, -1))
            text = "".join(f"{i} {v:2d}\n" for i, v in zip(ids, values))
            (main / f"{name}_{split}.txt").write_text(text)
        (main / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))
        paths = [voc / "JPEGImages" / f"{i}.jpg" for i in ids]
        out.update(_write_images(paths, rng, (0, 1) if split == "train" else None))
        out["images"] += paths
        keep = sorted(np.flatnonzero(labels.any(axis=1)), key=lambda r: ids[r])
        out["pool" if split == "train" else "test"] = _phase(
            [ids[r] for r in keep], [paths[r] for r in keep], labels[keep]
        )
    return out


def make_coco(root: Path, n_train: int = 14, n_val: int = 10, seed: int = 0) -> dict[str, Any]:
    """``root/annotations/instances_{train,val}2014.json`` (8 categories with non-contiguous
    ids, not in name order) and ``root/{train,val}2014/COCO_*.jpg``. Image ids mix 2- to 6-digit
    numbers so that string order differs from numeric order; about a fifth of the images have
    no annotation (dropped); annotations are shuffled and some repeat a category."""
    rng = np.random.RandomState(seed)
    root = Path(root)
    (root / "annotations").mkdir(parents=True)
    names = tuple(name for _, name in _COCO_CATEGORIES)
    out: dict[str, Any] = {
        "name": "coco",
        "root": root,
        "options": {},
        "class_names": names,
        "images": [],
    }
    ids_set: set[int] = set()
    while len(ids_set) < n_train + n_val:  # unique ids of 2 to 6 digits
        digits = rng.randint(2, 7)
        ids_set.add(int(rng.randint(10 ** (digits - 1), 10**digits)))
    all_ids = sorted(ids_set)
    rng.shuffle(all_ids)
    for split, ids in (("train", all_ids[:n_train]), ("val", all_ids[n_train:])):
        labels = _random_labels(rng, len(ids), len(names), p_none=0.2)
        labels[0, 0] = labels[1, 2] = 1
        anns = []
        for r, image_id in enumerate(ids):
            for c in np.flatnonzero(labels[r]):
                for j in range(rng.randint(1, 3)):  # a category may be annotated twice
                    # boxes and areas that differ by row, class and instance (no RNG draw: the
                    # labels stay those of earlier versions): the label-bias draws' weights
                    x, y, w, h = 5.0 * c + j, 3.0 * r, 10.0 + c, 20.0 + r + j
                    anns.append(
                        {
                            "image_id": image_id,
                            "category_id": _COCO_CATEGORIES[c][0],
                            "iscrowd": 0,
                            "bbox": [x, y, w, h],
                            "area": 0.8 * w * h,
                        }
                    )
        rng.shuffle(anns)
        for k, ann in enumerate(anns):
            ann["id"] = 1000 + k
        folder = f"{split}2014"
        paths = [root / folder / f"COCO_{folder}_{i:012d}.jpg" for i in ids]
        data = {
            "info": {"description": "tiny COCO-format fixture"},
            "images": [
                {"id": i, "file_name": p.name, "width": 64, "height": 48}
                for i, p in zip(ids, paths)
            ],
            "annotations": anns,
            "categories": [
                {"supercategory": "thing", "id": i, "name": n} for i, n in _COCO_CATEGORIES
            ],
        }
        (root / "annotations" / f"instances_{split}2014.json").write_text(json.dumps(data))
        out.update(_write_images(paths, rng, (0, 1) if split == "train" else None))
        out["images"] += paths
        keep = sorted(np.flatnonzero(labels.any(axis=1)), key=lambda r: str(ids[r]))
        out["pool" if split == "train" else "test"] = _phase(
            [str(ids[r]) for r in keep], [paths[r] for r in keep], labels[keep]
        )
    return out


def make_nus(
    root: Path, n_train: int = 14, n_test: int = 10, n_concepts: int = 6, seed: int = 0
) -> dict[str, Any]:
    """The official NUS-WIDE layout: ``ImageList/{Train,Test}Imagelist.txt`` (Windows style:
    backslashes, CRLF), ``Concepts81.txt`` (the first ``n_concepts`` concepts),
    ``Groundtruth/TrainTestLabels/Labels_<c>_{Train,Test}.txt`` and images in
    ``Flickr/<folder>/<file>.jpg``. About a quarter of the rows have no label (kept, counted)."""
    rng = np.random.RandomState(seed)
    root = Path(root)
    concepts = NUS_CONCEPTS[:n_concepts]
    gt = root / "Groundtruth" / "TrainTestLabels"
    gt.mkdir(parents=True)
    (root / "ImageList").mkdir()
    (root / "Concepts81.txt").write_text("".join(f"{c}\r\n" for c in concepts))
    out: dict[str, Any] = {
        "name": "nus",
        "root": root,
        "options": {},
        "class_names": concepts,
        "images": [],
    }
    flickr_ids = rng.randint(10**8, 10**9, size=n_train + n_test)
    folders = ("actor", "airport", "beach", "zebra")
    rels = [f"{folders[k % 4]}/{k:04d}_{f}.jpg" for k, f in enumerate(flickr_ids)]
    for split, ids in (("Train", rels[:n_train]), ("Test", rels[n_train:])):
        labels = _random_labels(rng, len(ids), len(concepts), p_none=0.25)
        labels[0, 0] = labels[1, 1] = 1
        (root / "ImageList" / f"{split}Imagelist.txt").write_bytes(
            "".join(r.replace("/", "\\") + "\r\n" for r in ids).encode()
        )
        for c, concept in enumerate(concepts):
            (gt / f"Labels_{concept}_{split}.txt").write_text(
                "".join(f"{v}\n" for v in labels[:, c])
            )
        paths = [root / "Flickr" / r for r in ids]
        out.update(_write_images(paths, rng, (0, 1) if split == "Train" else None))
        out["images"] += paths
        n_unlabeled = int((~labels.any(axis=1)).sum())
        out["pool" if split == "Train" else "test"] = _phase(ids, paths, labels, n_unlabeled)
    return out


def make_cub(
    root: Path, n_images: int = 20, n_attributes: int = 12, seed: int = 0
) -> dict[str, Any]:
    """The official ``CUB_200_2011.tgz`` extracted in ``root``: ``root/attributes.txt`` and
    ``root/CUB_200_2011/{images.txt, train_test_split.txt, attributes/
    image_attribute_labels.txt, images/<species>/<file>.jpg}``. Two label lines carry extra
    fields (as a few official lines do); some images have no present attribute (kept,
    counted)."""
    rng = np.random.RandomState(seed)
    root = Path(root)
    ds = root / "CUB_200_2011"
    (ds / "attributes").mkdir(parents=True)
    names = tuple(f"has_part_{a // 4}::value_{a % 4}" for a in range(n_attributes))
    (root / "attributes.txt").write_text("".join(f"{a + 1} {n}\n" for a, n in enumerate(names)))
    files = [
        f"{_CUB_SPECIES[i % 3]}/{_CUB_SPECIES[i % 3].split('.')[1]}_{i + 1:04d}_{700 + i}.jpg"
        for i in range(n_images)
    ]
    (ds / "images.txt").write_text("".join(f"{i + 1} {f}\n" for i, f in enumerate(files)))
    is_train = rng.rand(n_images) < 0.55
    is_train[:2], is_train[2] = True, False
    (ds / "train_test_split.txt").write_text(
        "".join(f"{i + 1} {int(t)}\n" for i, t in enumerate(is_train))
    )
    labels = _random_labels(rng, n_images, n_attributes, p_none=0.2)
    labels[:2, 0] = 1
    lines = []
    for i in range(n_images):
        for a in range(n_attributes):
            certainty, seconds = rng.randint(1, 5), rng.rand() * 30
            lines.append(f"{i + 1} {a + 1} {labels[i, a]} {certainty} {seconds:.3f}")
    lines[5] = f"1 6 {labels[0, 5]} 3 0 7.113"  # extra fields, as in the official file
    lines[n_attributes + 2] = f"2 3 {labels[1, 2]} 2 1 0 12.5"
    (ds / "attributes" / "image_attribute_labels.txt").write_text("\n".join(lines) + "\n")
    paths = [ds / "images" / f for f in files]
    out: dict[str, Any] = {"name": "cub", "root": root, "options": {}, "class_names": names}
    out.update(_write_images(paths, rng, (0, 1)))
    out["images"] = paths
    for phase, flag in (("pool", True), ("test", False)):
        rows = np.flatnonzero(is_train == flag)
        n_unlabeled = int((~labels[rows].any(axis=1)).sum())
        out[phase] = _phase(
            [files[r] for r in rows], [paths[r] for r in rows], labels[rows], n_unlabeled
        )
    return out


def make_folder(
    root: Path,
    n_images: int = 20,
    fmt: str = "csv",
    with_split: bool = False,
    header: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """An image folder ``root`` with images in ``root/img/`` and ``root/labels.csv`` (``fmt``
    "csv", with or without a header row) or ``root/labels.jsonl`` (``fmt`` "jsonl"); labels are
    4 class names, every row has at least one. With ``with_split`` about a third of the rows
    are ``test``; without, the expected phases follow the seeded 20% split (seed 1200)."""
    rng = np.random.RandomState(seed)
    root = Path(root)
    classes = ("zebra", "apple", "car", "dog")
    labels = _random_labels(rng, n_images, len(classes), p_none=0.0)
    labels[-1, 0] = 1  # every row has a label
    rels = [f"img/{k:03d}.jpg" for k in range(n_images)]
    splits = np.where(rng.rand(n_images) < 0.35, "test", "train")
    splits[:2], splits[2] = "train", "test"
    names = [";".join(classes[c] for c in np.flatnonzero(row)) for row in labels]
    if fmt == "csv":
        rows = [
            f"{r},{n}" + (f",{s}" if with_split else "") for r, n, s in zip(rels, names, splits)
        ]
        head = ["path,labels" + (",split" if with_split else "")] if header else []
        (root / "labels.csv").parent.mkdir(parents=True, exist_ok=True)
        (root / "labels.csv").write_text("\n".join(head + rows) + "\n")
    else:
        root.mkdir(parents=True, exist_ok=True)
        objs = [
            {"path": r, "labels": n.split(";")} | ({"split": str(s)} if with_split else {})
            for r, n, s in zip(rels, names, splits)
        ]
        (root / "labels.jsonl").write_text("".join(json.dumps(o) + "\n" for o in objs))
    paths = [root / r for r in rels]
    if with_split:
        members = {s: np.flatnonzero(splits == s) for s in ("train", "test")}
    else:
        n_test = round(0.2 * n_images)
        perm = np.random.RandomState(1200).permutation(n_images)
        members = {"train": np.sort(perm[: n_images - n_test]), "test": np.sort(perm[-n_test:])}
    first_pool = int(members["train"][0]), int(members["train"][1])
    order = np.argsort(classes)  # sorted union of the names = the class order
    out: dict[str, Any] = {
        "name": "folder",
        "root": root,
        "options": {},
        "class_names": tuple(sorted(classes)),
        "images": paths,
    }
    out.update(_write_images(paths, rng, first_pool))
    for phase, split in (("pool", "train"), ("test", "test")):
        rows = members[split]
        out[phase] = _phase(
            [rels[r] for r in rows], [paths[r] for r in rows], labels[rows][:, order]
        )
    return out


def assert_index_matches(index, expected: dict[str, Any]) -> None:
    """Assert a ``DatasetIndex`` equals a builder's answers (ids, paths, labels, counts)."""
    assert index.class_names == expected["class_names"]
    for phase in ("pool", "test"):
        got, want = getattr(index, phase), expected[phase]
        assert got.image_ids == want["image_ids"], phase
        assert tuple(Path(p) for p in got.paths) == want["paths"], phase
        assert got.labels.dtype == np.uint8
        np.testing.assert_array_equal(got.labels, want["labels"], err_msg=phase)
        assert got.n_unlabeled == want["n_unlabeled"], phase


def toy_feature_store(path: Path) -> Path:
    """A 6-class store written through the real writer at ``path``: 150 pool rows + 40 test
    rows of 12-dim features that carry the labels (class prototypes plus noise), with flips."""
    from probe.store import write_feature_store
    from probe.store.index import DatasetIndex, Phase

    rng = np.random.default_rng(0)
    n_pool, n_test, d, c = 150, 40, 12, 6
    proto = rng.normal(size=(c, d))
    y = (rng.random((n_pool + n_test, c)) < 0.3).astype(np.uint8)
    y[np.arange(len(y)), rng.integers(0, c, len(y))] = 1
    x = (y @ proto + 0.4 * rng.normal(size=(len(y), d))).astype(np.float32)
    ids = [f"img{i}" for i in range(len(y))]
    index = DatasetIndex(
        "toy", tuple(f"c{i}" for i in range(c)),
        Phase(tuple(ids[:n_pool]), (None,) * n_pool, y[:n_pool]),
        Phase(tuple(ids[n_pool:]), (None,) * n_test, y[n_pool:]),
    )
    write_feature_store(path, index, x, x + 0.05, provenance={
        "backbone": "none", "weights": "none", "transform": "none"}, progress=False)
    return path


def toy_probe_arrays(seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(features, labels) of a 48/16/16-row train/val/test split, 4 classes, 6-dim float16
    features that carry the labels: ``ProbeData.from_arrays(*toy_probe_arrays(seed))``."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (48, 16, 16):
        y = (rng.random((n, 4)) < 0.3).astype(np.uint8)
        y[np.arange(n), rng.integers(0, 4, n)] = 1
        out.append(((y @ rng.normal(size=(4, 6)) + rng.normal(size=(n, 6))).astype(np.float16),
                    y))
    return out


def tree_digest(path: Path) -> str:
    """Every file's name and bytes under ``path``: equal digests before and after a command
    mean it left the folder byte for byte as it was."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def small_coco_store(root: Path) -> tuple[Path, Any]:
    """A COCO-layout dataset (30 train + 16 val images, instance boxes included) under
    ``root/coco`` and its store of random 8-dim features at ``root/coco.zarr``: the store
    keeps the boxes' size and location weights that label-bias draws read. Returns the store's
    path and the dataset index."""
    from featurize.datasets.coco import load_coco
    from probe.store import write_feature_store

    make_coco(root / "coco", n_train=30, n_val=16)
    index = load_coco(root / "coco", check_images=False)
    n = len(index.pool) + len(index.test)
    x = np.random.default_rng(0).normal(size=(n, 8)).astype(np.float32)
    path = root / "coco.zarr"
    write_feature_store(path, index, x, None, provenance={
        "backbone": "none", "weights": "none", "transform": "none"}, progress=False)
    return path, index


def interrupted_at(real: Any, call: int) -> Any:
    """``real`` that raises KeyboardInterrupt (the user's Ctrl-C) on its ``call``-th call and
    runs as itself on the others: patched in to stop a resumable run part-way."""
    calls = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    return wrapper
