"""Cole et al. (2021)'s formatted SPML files (docs/protocol.md "Precomputed features"): the
``formatted_{train,val}_{labels,images}.npy`` and released ResNet-50 features, their ``train``
our pool, their ``val`` our test phase; the ``.npy`` helpers serve :mod:`featurize.imports`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from featurize.datasets._parse import DatasetFormatError
from featurize.datasets.voc import VOC_CLASSES  # the order of Cole et al.'s format_pascal.py
from probe.errors import MissingPathError, SpmlError
from probe.store.index import DatasetIndex, Phase

# order of ``categories`` in instances_{train,val}2014.json (their format_coco.py)
COCO_CLASSES: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange",
    "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant",
    "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote", "keyboard", "cell phone",
    "microwave", "oven", "toaster", "sink", "refrigerator", "book", "clock", "vase", "scissors",
    "teddy bear", "hair drier", "toothbrush",
)  # fmt: skip
# NUS-WIDE Concepts81.txt (alphabetical)
NUS_CLASSES: tuple[str, ...] = (
    "airport", "animal", "beach", "bear", "birds", "boats", "book", "bridge", "buildings", "cars",
    "castle", "cat", "cityscape", "clouds", "computer", "coral", "cow", "dancing", "dog",
    "earthquake", "elk", "fire", "fish", "flags", "flowers", "food", "fox", "frost", "garden",
    "glacier", "grass", "harbor", "horses", "house", "lake", "leaf", "map", "military", "moon",
    "mountain", "nighttime", "ocean", "person", "plane", "plants", "police", "protest", "railroad",
    "rainbow", "reflection", "road", "rocks", "running", "sand", "sign", "sky", "snow", "soccer",
    "sports", "statue", "street", "sun", "sunset", "surf", "swimmers", "tattoo", "temple", "tiger",
    "tower", "town", "toy", "train", "tree", "valley", "vehicle", "water", "waterfall", "wedding",
    "whales", "window", "zebra",
)  # fmt: skip

COLE_DATASETS: tuple[str, ...] = ("voc", "coco", "nus", "cub")
_ALIASES = {"pascal": "voc", "nuswide": "nus"}  # the names Cole et al.'s code uses
_N_CLASSES = {"voc": 20, "coco": 80, "nus": 81, "cub": 312}
# image folder relative to the dataset directory (``get_metadata`` in their datasets.py)
_IMAGE_DIRS = {"voc": "VOCdevkit/VOC2012/JPEGImages", "coco": ".", "nus": "Flickr",
               "cub": "CUB_200_2011/CUB_200_2011/images"}
PHASES = {"pool": "train", "test": "val"}  # our phase -> their file prefix
LABELS_FILE = "formatted_{}_labels.npy"
IMAGES_FILE = "formatted_{}_images.npy"
FEATURES_FILE = "{}_features_imagenet_resnet50.npy"


def canonical_dataset(dataset: str) -> str:
    """``voc|coco|nus|cub`` (also Cole et al.'s ``pascal`` / ``nuswide``)."""
    name = _ALIASES.get(dataset.lower(), dataset.lower())
    if name not in COLE_DATASETS:
        raise SpmlError(
            f"unknown dataset {dataset!r} for Cole et al.'s formatted files; expected one of "
            f"{list(COLE_DATASETS)}")
    return name


def load_npy(path: Path, what: str, *, mmap: bool = False) -> np.ndarray:
    """``np.load`` without pickles, with errors that name the file and what it should hold."""
    path = Path(path)
    if path.is_dir():
        raise DatasetFormatError(f"{what}: {path} is a directory; expected a .npy file")
    if not path.is_file():
        raise MissingPathError(f"{what}: file {path} not found")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic != b"\x93NUMPY":  # say what it is instead of numpy's pickle advice
        kind = ("a text/CSV file" if magic and all(32 <= c < 127 or c in (9, 10, 13)
                                                    for c in magic) else "not a .npy file")
        raise DatasetFormatError(
            f"{what}: {path} is {kind}; expected a .npy array written by np.save. Convert "
            f"a CSV with: python -c \"import numpy as np; np.save('{path.with_suffix('.npy')}', "
            f"np.loadtxt('{path}', delimiter=','))\"")
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as err:
        if "pickle" not in str(err):
            raise DatasetFormatError(f"{what}: {path} is a damaged .npy file (its header "
                                     "cannot be read); write it again with np.save") from None
        raise DatasetFormatError(
            f"{what}: {path} holds an object array (Python objects), not plain numbers or "
            "strings; save it with np.save from a numeric array (e.g. arr.astype(np.float32))"
        ) from None
    except OSError as err:
        raise DatasetFormatError(f"{what}: {path} is a damaged .npy file ({err}); write it "
                                 "again with np.save") from None


def binary_labels(values: np.ndarray, source: Path | str) -> np.ndarray:
    """An (N, C) 0/1 label matrix as uint8; the error names the source, row and column."""
    y = np.asarray(values)
    if y.ndim != 2:
        raise DatasetFormatError(
            f"{source}: labels must be a 2-D (N, C) matrix, got shape {y.shape}")
    if not (np.issubdtype(y.dtype, np.number) or y.dtype == bool):
        raise DatasetFormatError(f"{source}: labels must be numeric 0/1, got dtype {y.dtype}")
    bad = ~np.isin(y, (0, 1))
    if bad.any():
        r, c = (int(v[0]) for v in np.nonzero(bad))
        raise DatasetFormatError(
            f"{source}: labels must be 0/1 but row {r}, column {c} is {y[r, c].item()!r}")
    return y.astype(np.uint8)


def read_class_names(path: Path, n_expected: int | None = None) -> tuple[str, ...]:
    """Class names, one per line, or ``<index> <name>`` lines (CUB's ``attributes.txt``);
    checked against the label count."""
    path = Path(path)
    if not path.is_file():
        raise MissingPathError(f"class-names file {path} not found")
    names = [line.strip() for line in path.read_text(encoding="utf-8").rstrip().splitlines()]
    for i, name in enumerate(names, 1):
        if not name:
            raise DatasetFormatError(f"{path} line {i}: empty class name")
    split = [name.split(maxsplit=1) for name in names]
    if names and all(len(p) == 2 and p[0].isdigit() for p in split):
        names = [p[1] for p in split]
    seen: dict[str, int] = {}
    for i, name in enumerate(names, 1):
        if (first := seen.setdefault(name, i)) != i:
            raise DatasetFormatError(f"{path} line {i}: class name {name!r} repeats line {first}")
    if n_expected is not None and len(names) != n_expected:
        raise DatasetFormatError(
            f"{path} has {len(names)} class names but the labels have {n_expected} columns")
    return tuple(names)


def cole_class_names(root: Path, dataset: str, class_names_file: str | Path | None = None
                     ) -> tuple[tuple[str, ...], str]:
    """``(class names, where they came from)`` for one of Cole et al.'s datasets."""
    dataset = canonical_dataset(dataset)
    n = _N_CLASSES[dataset]
    if class_names_file is not None:
        return read_class_names(class_names_file, n), str(Path(class_names_file))
    if dataset == "voc":
        return VOC_CLASSES, "VOC 2012 standard order (Cole et al.'s format_pascal.py)"
    if dataset == "coco":
        return COCO_CLASSES, "COCO 2014 categories order (Cole et al.'s format_coco.py)"
    candidates = {
        "nus": ["Concepts81.txt", "NUS-WIDE/Concepts81.txt", "ConceptsList/Concepts81.txt"],
        "cub": ["attributes.txt", "CUB_200_2011/attributes.txt",
                "CUB_200_2011/CUB_200_2011/attributes.txt", "../attributes.txt"],
    }[dataset]
    for rel in candidates:
        if (root / rel).is_file():
            return read_class_names(root / rel, n), str(root / rel)
    if dataset == "nus":
        return NUS_CLASSES, "NUS-WIDE Concepts81 alphabetical order (no Concepts81.txt found)"
    raise MissingPathError(
        f"CUB attribute names: none of {candidates} exists under {root}; put CUB's "
        "attributes.txt there or pass --class-names FILE (312 names, one per line)")


def cole_paths(root: Path, *, features: bool) -> dict[str, Path]:
    """The files of one dataset directory (``labels_pool``, ``images_test``, ...); a missing
    one is a FileNotFoundError listing all that are missing."""
    kinds = {"labels": LABELS_FILE, "images": IMAGES_FILE, "features": FEATURES_FILE}
    paths = {f"{kind}_{phase}": root / name.format(prefix) for phase, prefix in PHASES.items()
             for kind, name in kinds.items() if features or kind != "features"}
    missing = [p.name for p in paths.values() if not p.is_file()]
    if missing:
        raise MissingPathError(
            f"{root} lacks Cole et al.'s files {missing}; it should hold "
            f"formatted_{{train,val}}_{{labels,images}}.npy"
            + (" and {train,val}_features_imagenet_resnet50.npy" if features else "")
            + " (from https://caltech.box.com/v/single-positive-multi-label)")
    return paths


def load_cole_formatted(root: str | Path, dataset: str,
                        class_names_file: str | Path | None = None) -> DatasetIndex:
    """The pool (their ``train``) and test (their ``val``) phases, rows in the files' order;
    image ids are the formatted image strings, under the image folder (need not exist)."""
    root = Path(root)
    if not root.is_dir():
        raise MissingPathError(f"Cole et al. dataset directory {root} not found")
    dataset = canonical_dataset(dataset)
    names, _ = cole_class_names(root, dataset, class_names_file)
    paths = cole_paths(root, features=False)
    image_dir = root / _IMAGE_DIRS[dataset]
    phases = {}
    for phase in PHASES:
        labels_path, images_path = paths[f"labels_{phase}"], paths[f"images_{phase}"]
        labels = binary_labels(load_npy(labels_path, "labels"), labels_path)
        images = load_npy(images_path, "image list")
        if images.ndim != 1 or images.dtype.kind not in "US":
            raise DatasetFormatError(
                f"{images_path} must be a 1-D array of image paths (strings), got dtype "
                f"{images.dtype} and shape {images.shape}")
        if images.shape[0] != labels.shape[0]:
            raise DatasetFormatError(
                f"{images_path} lists {images.shape[0]} images but {labels_path} has "
                f"{labels.shape[0]} label rows")
        if labels.shape[1] != len(names):
            raise DatasetFormatError(
                f"{labels_path} has {labels.shape[1]} label columns but {dataset} has "
                f"{len(names)} classes")
        ids = tuple(str(s.decode() if isinstance(s, bytes) else s) for s in images.tolist())
        phases[phase] = Phase(image_ids=ids, paths=tuple(image_dir / s for s in ids), labels=labels,
                              n_unlabeled=int((labels.sum(1) == 0).sum()))
    return DatasetIndex(name=dataset, class_names=tuple(names), pool=phases["pool"],
                        test=phases["test"], root=root)


def reference_observed(root: Path, phase: str) -> tuple[Path, np.ndarray] | None:
    """Cole et al.'s own single positives for ``phase`` (``formatted_<p>_labels_obs.npy`` or the
    ``_uniform_`` variant, -1/0/+1), if the directory holds them; used to check our draw."""
    prefix = PHASES[phase]
    for name in (f"formatted_{prefix}_{kind}labels_obs.npy" for kind in ("", "uniform_")):
        if (root / name).is_file():
            return root / name, load_npy(root / name, "reference observed labels")
    return None
