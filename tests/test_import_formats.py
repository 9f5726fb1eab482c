"""``spml import arff``: MULAN's ARFF (dense and sparse rows) + label XML, parsed to the same
arrays a direct reading of the fixture gives, and stored with the benchmark's split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from featurize.datasets.arff import read_mulan
from probe.errors import SpmlError
from probe.store import open_store

XML = """<?xml version="1.0" encoding="utf-8"?>
<labels xmlns="http://mulan.sourceforge.net/labels">
<label name="lab_a"></label>
<label name="lab_b"></label>
<label name="lab_c"></label>
</labels>
"""


def _fixture(rng: np.random.Generator, n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    x = np.round(rng.normal(size=(n, 4)), 3)
    x[rng.random(x.shape) < 0.4] = 0.0  # zeros, so the sparse form leaves entries out
    y = (rng.random((n, 3)) < 0.4).astype(np.uint8)
    y[np.arange(n), rng.integers(0, 3, n)] = 1  # every row has a positive
    return x, y


def _header() -> list[str]:
    # labels placed among the features, as some MULAN sets do (the XML decides which are labels)
    return ["@relation 'toy: -C 3'", "% a comment", "@attribute f0 numeric",
            "@attribute lab_a {0,1}", "@attribute 'f 1' numeric", "@attribute f2 NUMERIC",
            "@attribute lab_b {0,1}", "@attribute f3 numeric", "@attribute lab_c {0,1}", "",
            "@data"]


def _columns(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.column_stack([x[:, 0], y[:, 0], x[:, 1], x[:, 2], y[:, 1], x[:, 3], y[:, 2]])


def _write(tmp_path: Path, x: np.ndarray, y: np.ndarray, sparse: bool) -> tuple[Path, Path]:
    lines = _header()
    for row in _columns(x, y):
        if sparse:
            items = [f"{i} {v:g}" for i, v in enumerate(row) if v != 0]
            lines.append("{" + ", ".join(items) + "}")
        else:
            lines.append(",".join(f"{v:g}" for v in row))
    arff = tmp_path / ("sparse.arff" if sparse else "dense.arff")
    arff.write_text("\n".join(lines) + "\n")
    xml = tmp_path / "toy.xml"
    xml.write_text(XML)
    return arff, xml


@pytest.mark.parametrize("sparse", [False, True])
def test_read_mulan_dense_and_sparse(tmp_path: Path, sparse: bool) -> None:
    x, y = _fixture(np.random.default_rng(3))
    arff, xml = _write(tmp_path, x, y, sparse)
    feats, labels, names = read_mulan(arff, xml)
    assert names == ("lab_a", "lab_b", "lab_c")
    np.testing.assert_allclose(feats, x.astype(np.float32), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(labels, y)


def test_import_arff_cli_split(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from studies.cli import main

    x, y = _fixture(np.random.default_rng(5), n=100)
    arff, xml = _write(tmp_path, x, y, sparse=True)
    out = tmp_path / "toy.zarr"
    assert main(["import", "arff", str(arff), "--xml", str(xml), "--split", "0.8,0.1,0.1",
                 "--dtype", "float32", "--out", str(out), "--quiet"]) == 0
    assert "100 rows (train 80 / val 10 / test 10)" in capsys.readouterr().out
    store = open_store(out)
    assert store.dataset == "sparse" and store.n_classes == 3 and store.feature_dim == 4
    # every stored row is one of the fixture's rows, with its own labels, and all rows are kept
    stored = store.features(np.arange(100))
    order = [int(np.flatnonzero(np.all(np.isclose(x, row, atol=1e-6), axis=1))[0])
             for row in stored]
    assert sorted(order) == list(range(100))
    np.testing.assert_array_equal(store.labels(), y[order])


def test_read_mulan_errors(tmp_path: Path) -> None:
    x, y = _fixture(np.random.default_rng(1), n=5)
    arff, xml = _write(tmp_path, x, y, sparse=False)
    bad_xml = tmp_path / "bad.xml"
    bad_xml.write_text('<labels><label name="nope"/></labels>')
    with pytest.raises(SpmlError, match="not attributes"):
        read_mulan(arff, bad_xml)
    bad_xml.write_text("<labels></labels>")
    with pytest.raises(SpmlError, match="--xml"):
        read_mulan(arff, bad_xml)
    short = tmp_path / "short.arff"
    short.write_text("\n".join([*_header(), "1,0,2"]) + "\n")
    with pytest.raises(SpmlError, match="line 12: 3 values"):
        read_mulan(short, xml)


@pytest.mark.parametrize("base", [1, 0])
def test_import_mat_indices(tmp_path: Path, base: int, capsys: pytest.CaptureFixture) -> None:
    import scipy.io

    from studies.cli import main

    rng = np.random.default_rng(11)
    x, y = _fixture(rng, n=60)
    order = rng.permutation(60)
    tr, va, te = order[:40], order[40:50], order[50:]
    # MATLAB writes column vectors of doubles
    mat = tmp_path / "toy.mat"
    scipy.io.savemat(mat, {"X": x, "Y": y.astype(np.float64), "Y_obs": y.astype(np.float64),
                           "tr_idx": (tr + base).reshape(-1, 1).astype(np.float64),
                           "va_idx": (va + base).reshape(-1, 1).astype(np.float64),
                           "te_idx": (te + base).reshape(-1, 1).astype(np.float64)})
    out = tmp_path / "toy.zarr"
    assert main(["import", "mat", str(mat), "--dtype", "float32", "--out", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    # a 0-based file whose indices reach N-1 only: read as 0-based
    assert f"read as {base}-based" in printed
    assert "60 rows (train 40 / val 10 / test 10)" in printed
    store = open_store(out)
    test_rows = store.split("test")
    np.testing.assert_allclose(store.features(test_rows), x[np.sort(te)].astype(np.float32),
                               atol=1e-6)
    np.testing.assert_array_equal(store.labels(test_rows), y[np.sort(te)])
    pool = np.concatenate([store.split("train"), store.split("val")])
    np.testing.assert_array_equal(np.sort(store.labels(np.sort(pool)), axis=None),
                                  np.sort(y[np.concatenate([tr, va])], axis=None))


def test_import_mat_errors(tmp_path: Path) -> None:
    import scipy.io

    from featurize.datasets.matfile import read_smile_mat

    mat = tmp_path / "bad.mat"
    scipy.io.savemat(mat, {"X": np.zeros((4, 2)), "Y": np.ones((4, 2))})
    with pytest.raises(SpmlError, match="tr_idx"):
        read_smile_mat(mat)
    scipy.io.savemat(mat, {"X": np.zeros((4, 2)), "Y": np.ones((4, 2)),
                           "tr_idx": [[1], [2]], "va_idx": [[2]], "te_idx": [[4]]})
    with pytest.raises(SpmlError, match="distinct rows"):
        read_smile_mat(mat)
