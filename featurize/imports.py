"""Feature stores built without running a backbone (docs/protocol.md "Precomputed features"):
:func:`import_cole` (Cole et al. 2021's released ResNet-50 features), :func:`import_arrays` /
:func:`import_array_files` (any ``(N, D)`` features with an ``(N, C)`` 0/1 label matrix) and
:func:`import_yeast` (MULAN *yeast*, shipped inside ``river``). All write through the crash-safe
:func:`probe.store.write_feature_store` (an interrupted import resumes) and record the source
files with their sha256.
"""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from featurize.datasets import DatasetFormatError
from featurize.datasets.cole import (
    PHASES,
    binary_labels,
    cole_class_names,
    cole_paths,
    load_cole_formatted,
    load_npy,
    read_class_names,
    reference_observed,
)
from probe.errors import MissingPathError, SpmlError
from probe.store import Store, file_sha256, write_feature_store
from probe.store.index import DatasetIndex, Phase
from probe.store.protocol import PROTOCOL_SEED, single_positive, split_indices

DEFAULT_TEST_FRACTION: float = 0.2  # held-out rows when a set has no official test split
YEAST_FEATURES: int = 103  # MULAN yeast: 103 numeric attributes ...
YEAST_LABELS: int = 14  # ... and 14 labels (Elisseeff & Weston 2001)
NO_BACKBONE = "none (imported features; no backbone was run)"


def _provenance(*, backbone: str, weights: str, transform: str, files: dict[str, Path],
                progress: bool = False, **extra: object) -> dict:
    """Provenance of an import: source files and their sha256 (also what a resume must match)."""
    return {"backbone": backbone, "weights": weights, "weights_sha256": None,
            "transform": transform, "backbone_run": False,
            "source": {"files": {name: str(Path(p).resolve()) for name, p in files.items()},
                       **extra},
            "source_sha256": {name: file_sha256(path, progress=progress)
                              for name, path in files.items()}}


def _float_features(values: np.ndarray, source: Path | str) -> np.ndarray:
    """Numeric (N, D) features; integer/bool ones become float32, others are refused."""
    if values.ndim != 2:
        raise DatasetFormatError(
            f"{source}: features must be a 2-D (N, D) matrix, got {values.shape}")
    if np.issubdtype(values.dtype, np.floating):
        return values
    if np.issubdtype(values.dtype, np.integer) or values.dtype == bool:
        return values.astype(np.float32)
    raise DatasetFormatError(f"{source}: features must be numeric, got dtype {values.dtype}")


def _checked_rows(features: np.ndarray, labels: np.ndarray, source: str, label_source: str,
                  dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Float (N, D) features, finite and within the store dtype's range, and their (N, C) 0/1
    labels, one row per sample (errors name the source and row)."""
    features = _float_features(np.asarray(features), source)
    finite = np.isfinite(features).all(axis=1)
    if not finite.all():
        row = int(np.nonzero(~finite)[0][0])
        raise DatasetFormatError(f"{source}: features of row {row} are NaN or infinite")
    limit = float(np.finfo(dtype).max)
    big = (np.abs(features) > limit).any(axis=1)
    if big.any():
        row = int(np.nonzero(big)[0][0])
        raise DatasetFormatError(
            f"{source}: row {row} has a value of magnitude {np.abs(features[row]).max():.4g}, "
            f"beyond {dtype}'s range; store as float32 (--dtype float32)")
    labels = binary_labels(labels, label_source)
    if features.shape[0] != labels.shape[0]:
        raise DatasetFormatError(
            f"{source} has {features.shape[0]} rows but {label_source} has {labels.shape[0]}: "
            "features and labels must have one row per sample, in the same order")
    return features, labels


def import_cole(root: str | Path, dataset: str, out: str | Path, *, dtype: str = "float16",
                class_names_file: str | Path | None = None, overwrite: bool = False,
                block_rows: int = 1024, progress: bool = True) -> Store:
    """Store Cole et al.'s released features (their ``train`` files the pool, ``val`` the test
    rows; no flipped features); their ``formatted_*_labels_obs.npy``, where present, is compared
    with the store's seed-1200 draw (the provenance's ``reference_check``)."""
    root = Path(root)
    index = load_cole_formatted(root, dataset, class_names_file)  # the dataset name checked
    _, names_source = cole_class_names(root, dataset, class_names_file)
    paths = cole_paths(root, features=True)
    features = {}
    for phase in PHASES:
        path = paths[f"features_{phase}"]
        feats = _float_features(load_npy(path, "features", mmap=True), path)
        n = len(getattr(index, phase))
        if feats.shape[0] != n:
            raise DatasetFormatError(
                f"{path} has {feats.shape[0]} feature rows but "
                f"{paths[f'images_{phase}'].name} lists {n} images")
        features[phase] = feats
    if features["pool"].shape[1] != features["test"].shape[1]:
        raise DatasetFormatError(
            f"{paths['features_pool'].name} has {features['pool'].shape[1]} columns but "
            f"{paths['features_test'].name} has {features['test'].shape[1]}")
    provenance = _provenance(
        backbone="resnet50 (features released by Cole et al. 2021; not run here)",
        weights="ImageNet-pretrained ResNet-50 (torchvision pretrained=True), as released",
        transform="Cole et al.: Resize((448, 448)), ToTensor, ImageNet mean/std; no flip",
        files={p.name: p for p in paths.values()}, progress=progress, kind="cole",
        dataset_dir=str(root.resolve()), class_names=names_source,
        reference_check=_reference_check(root, index))
    return write_feature_store(out, index, (features["pool"], features["test"]),
                               provenance=provenance, dtype=dtype, block_rows=block_rows,
                               overwrite=overwrite, resume=True, progress=progress,
                               sources=[str(paths["features_pool"]), str(paths["features_test"])])


def _reference_check(root: Path, index: DatasetIndex) -> dict[str, str]:
    """Does our seed-1200 single-positive draw equal Cole et al.'s saved one, per phase?"""
    result = {}
    for phase in PHASES:
        ref = reference_observed(root, phase)
        if ref is None:
            result[phase] = "no reference file"
            continue
        (path, obs), labels = ref, getattr(index, phase).labels
        if obs.shape != labels.shape:
            result[phase] = f"{path.name}: shape {obs.shape} differs from labels {labels.shape}"
        else:
            ours = single_positive(labels, PROTOCOL_SEED)
            same = np.array_equal(ours == 1, np.asarray(obs) == 1)
            result[phase] = f"{path.name}: {'identical' if same else 'DIFFERENT'} positives"
    return result


def import_arrays(out: str | Path, features: np.ndarray, labels: np.ndarray, *, name: str,
                  test_features: np.ndarray | None = None, test_labels: np.ndarray | None = None,
                  test_fraction: float | None = None, class_names: Sequence[str] | None = None,
                  provenance: dict | None = None, extra_attrs: dict | None = None,
                  dtype: str = "float16", overwrite: bool = False, progress: bool = True,
                  sources: Sequence[str] = ("features", "test features"),
                  label_sources: Sequence[str] = ("labels", "test labels"),
                  split: Sequence[float] | None = None) -> Store:
    """Store any ``(N, D)`` features with an ``(N, C)`` 0/1 label matrix. Test rows are given
    (``test_features`` + ``test_labels``; ids ``train<i>`` / ``test<i>``) or held out
    (``test_fraction``, default 0.2, by :func:`probe.store.protocol.split_indices` with seed
    1200; ids ``row<i>``). ``split`` = (train, val, test) fractions of all rows instead, e.g.
    the tabular SPML benchmark's (0.8, 0.1, 0.1) (:func:`check_split`): the test rows are held
    out as with ``test_fraction``, and val is its share of the rest. Class names default to
    ``class_<c>``; ``sources`` / ``label_sources`` name the inputs in errors."""
    feats, y = _checked_rows(features, labels, sources[0], label_sources[0], dtype)
    attrs = dict(extra_attrs or {})
    if split is not None:
        if test_fraction is not None or test_features is not None:
            raise SpmlError("--split: give either a train/val/test split or a test fraction "
                            "or test files, not both")
        train_share, val_share, test_fraction = check_split(split)
        attrs["val_fraction"] = val_share / (train_share + val_share)
        attrs["split"] = [train_share, val_share, test_fraction]
    if (test_features is None) != (test_labels is None):
        raise SpmlError("give both test features and test labels, or neither")
    if test_features is not None:
        if test_fraction is not None:
            raise SpmlError("give either test features/labels or a test fraction, not both")
        test_feats, test_y = _checked_rows(test_features, test_labels, sources[1],
                                           label_sources[1], dtype)
        if test_feats.shape[1] != feats.shape[1] or test_y.shape[1] != y.shape[1]:
            raise DatasetFormatError(
                f"test features/labels have {test_feats.shape[1]}/{test_y.shape[1]} columns but "
                f"the training ones have {feats.shape[1]}/{y.shape[1]}")
        pool_ids = [f"train{i}" for i in range(feats.shape[0])]
        test_ids = [f"test{i}" for i in range(test_feats.shape[0])]
        attrs.setdefault("test_split", {"method": "given"})
    else:
        fraction = DEFAULT_TEST_FRACTION if test_fraction is None else float(test_fraction)
        pool_rows, test_rows = split_indices(feats.shape[0], fraction, PROTOCOL_SEED)
        feats, test_feats = feats[pool_rows], feats[test_rows]
        y, test_y = y[pool_rows], y[test_rows]
        pool_ids = [f"row{i}" for i in pool_rows]
        test_ids = [f"row{i}" for i in test_rows]
        attrs.setdefault("test_split", {"method": "random (probe.store.protocol.split_indices)",
                                        "fraction": fraction, "seed": PROTOCOL_SEED})
    n_classes = y.shape[1]
    names = tuple(class_names if class_names is not None
                  else (f"class_{c}" for c in range(n_classes)))
    if len(names) != n_classes:
        raise DatasetFormatError(f"{len(names)} class names given but the labels have {n_classes}")
    index = DatasetIndex(name=name, class_names=names,
                         pool=Phase(tuple(pool_ids), tuple(Path(i) for i in pool_ids), y),
                         test=Phase(tuple(test_ids), tuple(Path(i) for i in test_ids), test_y))
    prov = provenance or {"backbone": NO_BACKBONE, "weights": "none", "backbone_run": False,
                          "transform": "none (features stored as given)",
                          "source": "in-memory arrays"}
    return write_feature_store(out, index, (feats, test_feats), provenance=prov, dtype=dtype,
                               overwrite=overwrite, resume=True, extra_attrs=attrs,
                               progress=progress)


def check_split(split: Sequence[float]) -> tuple[float, float, float]:
    """``--split TRAIN,VAL,TEST``: three fractions of all rows, each in (0, 1), summing to 1
    (within 1e-6); returned as floats. Refused with the flag named otherwise."""
    values = [float(v) for v in split]
    if len(values) != 3:
        raise SpmlError(f"--split: three fractions TRAIN,VAL,TEST (e.g. 0.8,0.1,0.1); got "
                        f"{len(values)} ({','.join(map(str, values))})")
    if not all(0.0 < v < 1.0 for v in values) or abs(sum(values) - 1.0) > 1e-6:
        raise SpmlError(f"--split: fractions in (0, 1) that sum to 1, e.g. 0.8,0.1,0.1; got "
                        f"{','.join(map(str, values))} (sum {sum(values):g})")
    return values[0], values[1], values[2]


def import_array_files(out: str | Path, features_path: str | Path, labels_path: str | Path, *,
                       name: str, test_features_path: str | Path | None = None,
                       test_labels_path: str | Path | None = None,
                       test_fraction: float | None = None,
                       class_names_path: str | Path | None = None, dtype: str = "float16",
                       overwrite: bool = False, progress: bool = True,
                       split: Sequence[float] | None = None) -> Store:
    """:func:`import_arrays` from ``.npy`` files (``spml import arrays``)."""
    if (test_features_path is None) != (test_labels_path is None):
        raise SpmlError("--test-features and --test-labels go together: give both or neither")
    files = {"features": Path(features_path), "labels": Path(labels_path)}
    if test_features_path is not None:
        files |= {"test_features": Path(test_features_path), "test_labels": Path(test_labels_path)}
    loaded = {key: load_npy(path, "--" + key.replace("_", "-")) for key, path in files.items()}
    names = None
    if class_names_path is not None:
        n_classes = binary_labels(loaded["labels"], files["labels"]).shape[1]
        names = read_class_names(Path(class_names_path), n_classes)
        files["class_names"] = Path(class_names_path)
    provenance = _provenance(backbone=NO_BACKBONE, weights="none",
                             transform="none (features stored as given)", files=files,
                             progress=progress, kind="arrays")
    return import_arrays(
        out, loaded["features"], loaded["labels"], name=name,
        test_features=loaded.get("test_features"), test_labels=loaded.get("test_labels"),
        test_fraction=test_fraction, class_names=names, provenance=provenance, dtype=dtype,
        overwrite=overwrite, progress=progress,
        sources=(str(files["features"]), str(files.get("test_features", "test features"))),
        label_sources=(str(files["labels"]), str(files.get("test_labels", "test labels"))),
        split=split)


class MissingExtraError(SpmlError):
    """An optional dependency is not installed."""


def import_arff(out: str | Path, arff_path: str | Path, xml_path: str | Path, *,
                name: str | None = None, test_fraction: float | None = None,
                split: Sequence[float] | None = None, dtype: str = "float16",
                overwrite: bool = False, progress: bool = True) -> Store:
    """A MULAN ARFF + XML set (``spml import arff``; :func:`featurize.datasets.arff.read_mulan`),
    split as :func:`import_arrays` (``--split 0.8,0.1,0.1`` for the tabular SPML benchmark)."""
    from featurize.datasets.arff import read_mulan

    files = {"arff": Path(arff_path), "xml": Path(xml_path)}
    features, labels, names = read_mulan(files["arff"], files["xml"])
    provenance = _provenance(backbone=NO_BACKBONE, weights="none",
                             transform="none (features stored as given)", files=files,
                             progress=progress, kind="MULAN ARFF")
    if split is None and test_fraction is None:
        test_fraction = DEFAULT_TEST_FRACTION
    return import_arrays(out, features, labels, name=name or files["arff"].stem,
                         test_fraction=test_fraction, class_names=names, provenance=provenance,
                         dtype=dtype, overwrite=overwrite, progress=progress,
                         sources=(str(files["arff"]), "test"),
                         label_sources=(str(files["arff"]), "test"), split=split)


def import_mat(out: str | Path, mat_path: str | Path, *, name: str | None = None,
               dtype: str = "float16", overwrite: bool = False, progress: bool = True) -> Store:
    """SMILE's ``.mat`` dataset file (``spml import mat``;
    :func:`featurize.datasets.matfile.read_smile_mat`): the file's ``te_idx`` rows are the
    test set; ``tr_idx`` + ``va_idx`` the pool, split into train/val by the store's seeded
    draw at the file's val share (the file's own val rows and ``Y_obs`` are not kept: the
    single positives are this project's seeded draws)."""
    from featurize.datasets.matfile import read_smile_mat

    path = Path(mat_path)
    mat = read_smile_mat(path)
    pool = np.sort(np.concatenate([mat.indices["tr_idx"], mat.indices["va_idx"]]))
    test = np.sort(mat.indices["te_idx"])
    n_val = len(mat.indices["va_idx"])
    provenance = _provenance(backbone=NO_BACKBONE, weights="none",
                             transform="none (features stored as given)", files={"mat": path},
                             progress=progress, kind="SMILE .mat", index_base=mat.base)
    attrs = {"test_split": {"method": "given (te_idx)", "index_base": mat.base}}
    if n_val:
        attrs["val_fraction"] = n_val / len(pool)
    return import_arrays(out, mat.features[pool], mat.labels[pool], name=name or path.stem,
                         test_features=mat.features[test], test_labels=mat.labels[test],
                         provenance=provenance, extra_attrs=attrs, dtype=dtype,
                         overwrite=overwrite, progress=progress, sources=(str(path), str(path)),
                         label_sources=(str(path), str(path)))


def yeast_csv_path() -> Path:
    """``river/datasets/yeast.csv.gz`` inside the installed river package (river not imported)."""
    spec = importlib.util.find_spec("river")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(
            "the yeast data set ships inside the 'river' package, which is not installed: "
            "pip install 'spml-probe[yeast]'")
    for location in spec.submodule_search_locations:
        path = Path(location) / "datasets" / "yeast.csv.gz"
        if path.is_file():
            return path
    raise MissingPathError(
        f"river is installed but has no datasets/yeast.csv.gz under "
        f"{list(spec.submodule_search_locations)}; reinstall it: pip install 'spml-probe[yeast]'")


def load_yeast_csv(path: Path) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """``(features (2417, 103) float64, labels (2417, 14) uint8, label names)`` of the csv."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        header = fh.readline().strip().split(",")
        if len(header) != YEAST_FEATURES + YEAST_LABELS:
            raise DatasetFormatError(
                f"{path} line 1: expected {YEAST_FEATURES + YEAST_LABELS} columns "
                f"(103 attributes, 14 labels), got {len(header)}")
        try:
            table = np.loadtxt(fh, delimiter=",", dtype=np.float64, ndmin=2)
        except ValueError as err:
            raise DatasetFormatError(f"{path}: cannot parse the numeric table ({err})") from None
    if table.shape[1] != len(header):
        raise DatasetFormatError(
            f"{path}: rows have {table.shape[1]} columns, header {len(header)}")
    labels = binary_labels(table[:, YEAST_FEATURES:], path)
    return table[:, :YEAST_FEATURES], labels, tuple(header[YEAST_FEATURES:])


def import_yeast(out: str | Path, *, dtype: str = "float16",
                 test_fraction: float | None = None, overwrite: bool = False,
                 progress: bool = True, split: Sequence[float] | None = None) -> Store:
    """Store MULAN *yeast* from river's copy, ``test_fraction`` of its rows held out (default
    0.2; it has no official test split; seed 1200, recorded in the ``test_split`` attribute),
    or the ``split`` (train, val, test) of the tabular SPML benchmark, e.g. (0.8, 0.1, 0.1)."""
    if split is None and test_fraction is None:
        test_fraction = DEFAULT_TEST_FRACTION
    path = yeast_csv_path()
    features, labels, names = load_yeast_csv(path)
    provenance = _provenance(
        backbone=NO_BACKBONE, weights="none",
        transform="none (MULAN yeast attributes stored as given)", files={"yeast.csv.gz": path},
        kind="yeast",
        dataset="MULAN yeast (Elisseeff & Weston 2001), copy shipped in the river package")
    return import_arrays(out, features, labels, name="yeast", test_fraction=test_fraction,
                         class_names=names, provenance=provenance, dtype=dtype, overwrite=overwrite,
                         progress=progress, sources=(str(path), str(path)),
                         label_sources=(str(path), str(path)), split=split)
