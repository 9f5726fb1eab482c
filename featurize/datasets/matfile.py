"""SMILE's released dataset files (palm-ml/smile): a MATLAB ``.mat`` holding ``X`` (N, D),
``Y`` (N, C) 0/1 and the row indices ``tr_idx``, ``va_idx``, ``te_idx`` (1-based as MATLAB
writes them, or 0-based; detected from the indices and reported)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featurize.datasets import DatasetFormatError

__all__ = ["SmileMat", "read_smile_mat"]

INDEX_KEYS = ("tr_idx", "va_idx", "te_idx")


@dataclass(frozen=True)
class SmileMat:
    features: np.ndarray
    labels: np.ndarray
    indices: dict[str, np.ndarray]  # 0-based rows per key of INDEX_KEYS
    base: int  # 1 or 0: how the file numbered its rows


def _load(path: Path) -> dict:
    import scipy.io

    try:
        return scipy.io.loadmat(path)
    except NotImplementedError:
        # MATLAB v7.3 files are HDF5, which loadmat does not read
        try:
            import h5py
        except ImportError:
            raise DatasetFormatError(
                f"{path} is a MATLAB v7.3 (HDF5) file; reading it needs h5py (pip install h5py), "
                "or re-save it in MATLAB with save(..., '-v7')") from None
        with h5py.File(path, "r") as fh:
            # h5py returns MATLAB arrays transposed
            return {key: np.asarray(fh[key]).T for key in fh.keys()}


def read_smile_mat(path: str | Path) -> SmileMat:
    """Read and check a SMILE ``.mat`` file; indices returned 0-based."""
    path = Path(path)
    data = _load(path)
    missing = [key for key in ("X", "Y", *INDEX_KEYS) if key not in data]
    if missing:
        raise DatasetFormatError(f"{path}: no {missing} in the file; SMILE's files hold X, Y, "
                                 f"Y_obs, tr_idx, va_idx, te_idx (found {sorted(data)})")
    x = np.asarray(data["X"].toarray() if hasattr(data["X"], "toarray") else data["X"],
                   dtype=np.float64)
    y = np.asarray(data["Y"].toarray() if hasattr(data["Y"], "toarray") else data["Y"])
    if not np.isin(y, (0, 1)).all():
        raise DatasetFormatError(f"{path}: Y must be 0/1 (SMILE's -1 negatives are not expected)")
    n = x.shape[0]
    raw = {key: np.asarray(data[key]).astype(np.int64).ravel() for key in INDEX_KEYS}
    every = np.concatenate(list(raw.values()))
    # 1-based when no index is 0 and some index is N; 0-based otherwise
    base = 1 if every.min() >= 1 and every.max() == n else 0
    indices = {key: values - base for key, values in raw.items()}
    every = every - base
    if every.min() < 0 or every.max() >= n or len(np.unique(every)) != len(every):
        raise DatasetFormatError(f"{path}: tr_idx/va_idx/te_idx must be distinct rows of X "
                                 f"(0..{n - 1} or 1..{n}); got {every.min() + base}.."
                                 f"{every.max() + base} with {len(every)} entries")
    return SmileMat(x, y.astype(np.uint8), indices, base)
