"""Imports (Cole et al.'s files, any arrays, MULAN yeast) and ``spml import`` / ``spml info``."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from featurize import cli as fcli
from featurize import imports
from featurize.cli import imports as import_cli
from featurize.cli import store as store_cli
from featurize.datasets.cole import COCO_CLASSES, NUS_CLASSES, VOC_CLASSES, load_cole_formatted
from probe.store import StoreError, StoreWriter, file_sha256, open_store
from probe.store.protocol import single_positive, split_indices, split_pool

DIM = 12


def run_cli(argv: list[str]) -> int:
    """``spml ARGV`` through this package's register_cli functions (the errors propagate)."""
    parser = argparse.ArgumentParser(prog="spml")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench").add_subparsers()
    for module in (fcli, import_cli, store_cli):
        module.register_cli(sub, bench)
    args = parser.parse_args(argv)
    return args.func(args)


def cole_observe(labels: np.ndarray, seed: int = 1200) -> np.ndarray:
    """Their generate_observed_labels.py (uniform, 1 positive, 0 negatives): -1/0/+1 output."""
    y = labels.astype(np.float64).copy()
    y[y == 0] = -1
    rng = np.random.RandomState(seed)
    obs = np.zeros_like(y)
    for i in range(y.shape[0]):
        for value, keep in ((1.0, 1), (-1.0, 0)):
            idx = np.nonzero(y[i, :] == value)[0]
            rng.shuffle(idx)
            obs[i, idx[:keep]] = value
    return obs


def write_cole(
    root: Path,
    n_classes: int,
    sizes: tuple[int, int] = (30, 14),
    unlabeled_every: int = 0,
    with_obs: bool = True,
    image_fmt: str = "2008_{:06d}.jpg",
) -> dict[str, np.ndarray]:
    """Cole et al.'s formatted files as their preproc scripts save them (float labels, <U paths)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    out = {}
    start = 0
    for prefix, n in zip(("train", "val"), sizes):
        labels = np.zeros((n, n_classes))  # float64, as np.zeros in format_*.py
        for i in range(n):
            labels[i, rng.choice(n_classes, size=rng.integers(1, 4), replace=False)] = 1.0
        if unlabeled_every:
            labels[::unlabeled_every] = 0.0
        images = np.array([image_fmt.format(start + i) for i in range(n)])
        start += n
        feats = rng.normal(size=(n, DIM)).astype(np.float32)
        np.save(root / f"formatted_{prefix}_labels.npy", labels)
        np.save(root / f"formatted_{prefix}_images.npy", images)
        np.save(root / f"{prefix}_features_imagenet_resnet50.npy", feats)
        if with_obs:
            np.save(root / f"formatted_{prefix}_labels_obs.npy", cole_observe(labels))
        out[f"{prefix}_labels"], out[f"{prefix}_images"], out[f"{prefix}_feats"] = (
            labels,
            images,
            feats,
        )
    return out


# ----------------------------------------------------------------------------- Cole et al.


def test_load_cole_formatted_voc(tmp_path: Path) -> None:
    data = write_cole(tmp_path / "pascal", 20)
    index = load_cole_formatted(tmp_path / "pascal", "pascal")
    assert index.name == "voc" and index.class_names == VOC_CLASSES
    assert (len(index.pool), len(index.test)) == (30, 14)
    assert (
        index.pool.image_ids[0] == "2008_000000.jpg"
        and index.test.image_ids[0] == "2008_000030.jpg"
    )
    assert index.pool.paths[1] == tmp_path / "pascal/VOCdevkit/VOC2012/JPEGImages/2008_000001.jpg"
    assert index.pool.labels.dtype == np.uint8
    np.testing.assert_array_equal(index.test.labels, data["val_labels"])
    from featurize.datasets import load_dataset  # the adapters' registry reaches it as "cole"

    again = load_dataset("cole", tmp_path / "pascal", dataset="voc")
    assert again.pool.image_ids == index.pool.image_ids


def test_import_cole_store(tmp_path: Path) -> None:
    root = tmp_path / "coco"
    data = write_cole(root, 80, image_fmt="train2014/COCO_train2014_{:012d}.jpg")
    store = imports.import_cole(root, "coco", tmp_path / "coco.zarr", block_rows=16, progress=False)
    assert store.class_names == list(COCO_CLASSES) and store.n_rows == 44
    assert store.feature_dim == DIM and not store.has_flip
    feats = np.concatenate([data["train_feats"], data["val_feats"]])
    np.testing.assert_array_equal(store.features(), feats.astype(np.float16))
    np.testing.assert_array_equal(store.split("test"), np.arange(30, 44))
    np.testing.assert_array_equal(store.split("val"), split_pool(30)[1])
    assert (len(store.split("train")), len(store.split("val"))) == (24, 6)
    # our seed-1200 draw equals the one their script saved
    np.testing.assert_array_equal(
        store.observed(rows=np.arange(30)) == 1, cole_observe(data["train_labels"]) == 1
    )
    prov = store.provenance
    assert prov["backbone_run"] is False
    assert prov["source"]["reference_check"] == {
        "pool": "formatted_train_labels_obs.npy: identical positives",
        "test": "formatted_val_labels_obs.npy: identical positives",
    }
    sha = prov["source_sha256"]
    assert sha["train_features_imagenet_resnet50.npy"] == file_sha256(
        root / "train_features_imagenet_resnet50.npy"
    )
    assert len(sha) == 6


def test_cole_nus_unlabeled_and_names(tmp_path: Path) -> None:
    root = tmp_path / "nuswide"
    write_cole(root, 81, unlabeled_every=4, with_obs=False, image_fmt="actor/{:04d}_1.jpg")
    index = load_cole_formatted(root, "nus")
    assert index.class_names == NUS_CLASSES
    assert (index.pool.n_unlabeled, index.test.n_unlabeled) == (8, 4)  # rows 0, 4, 8, …
    assert index.pool.paths[0] == root / "Flickr/actor/0000_1.jpg"
    names = [f"concept{k}" for k in range(81)]
    (root / "Concepts81.txt").write_text("\n".join(names) + "\n\n")
    assert load_cole_formatted(root, "nuswide").class_names == tuple(names)
    store = imports.import_cole(root, "nus", tmp_path / "nus.zarr", progress=False)
    assert store.attrs["n_unlabeled"] == {"pool": 8, "test": 4}
    assert store.summary()["splits"]["test"]["rows_without_positive"] == 4
    assert (store.observed()[store.labels().sum(1) == 0] == 0).all()
    assert store.provenance["source"]["reference_check"]["pool"] == "no reference file"


def test_cole_cub_attribute_names(tmp_path: Path) -> None:
    root = tmp_path / "cub"
    write_cole(root, 312, sizes=(6, 4), with_obs=False, image_fmt="001.Albatross/a_{}.jpg")
    with pytest.raises(FileNotFoundError, match=r"attributes.txt.*--class-names"):
        load_cole_formatted(root, "cub")
    (root / "CUB_200_2011").mkdir()
    (root / "CUB_200_2011" / "attributes.txt").write_text(
        "".join(f"{k} has_attr::value_{k}\n" for k in range(1, 313))
    )
    index = load_cole_formatted(root, "cub")
    assert index.class_names[0] == "has_attr::value_1" and len(index.class_names) == 312
    assert index.pool.paths[0] == root / "CUB_200_2011/CUB_200_2011/images/001.Albatross/a_0.jpg"


def test_cole_errors(tmp_path: Path) -> None:
    root = tmp_path / "voc"
    data = write_cole(root, 20, with_obs=False)
    out = tmp_path / "o.zarr"
    (root / "val_features_imagenet_resnet50.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks Cole et al.'s files \['val_features"):
        imports.import_cole(root, "voc", out, progress=False)
    np.save(root / "val_features_imagenet_resnet50.npy", data["val_feats"][:13])
    with pytest.raises(ValueError, match=r"val_features_imagenet_resnet50.npy has 13 feature rows"):
        imports.import_cole(root, "voc", out, progress=False)
    np.save(root / "formatted_val_images.npy", data["val_images"][:-1])
    with pytest.raises(ValueError, match=r"formatted_val_images.npy lists 13 images but"):
        load_cole_formatted(root, "voc")
    np.save(root / "formatted_val_images.npy", data["val_images"])
    bad = data["train_labels"].copy()
    bad[3, 7] = 2.0
    np.save(root / "formatted_train_labels.npy", bad)
    with pytest.raises(
        ValueError, match=r"formatted_train_labels.npy: labels must be 0/1 but row 3, col"
    ):
        load_cole_formatted(root, "voc")
    np.save(root / "formatted_train_labels.npy", data["train_labels"][:, :19])
    with pytest.raises(ValueError, match=r"has 19 label columns but voc has 20"):
        load_cole_formatted(root, "voc")
    np.save(root / "formatted_train_labels.npy", data["train_labels"])
    names = tmp_path / "names.txt"
    names.write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"names.txt has 2 class names but the labels have 20"):
        load_cole_formatted(root, "voc", names)
    names.write_text("a\n\nb\n")
    with pytest.raises(ValueError, match=r"names.txt line 2: empty class name"):
        load_cole_formatted(root, "voc", names)
    np.save(root / "formatted_train_images.npy", np.array([object()] * 30, dtype=object))
    with pytest.raises(ValueError, match=r"formatted_train_images.npy holds an object array"):
        load_cole_formatted(root, "voc")
    with pytest.raises(ValueError, match=r"unknown dataset 'imagenet'"):
        load_cole_formatted(root, "imagenet")


# ----------------------------------------------------------------------------- arrays


@pytest.fixture
def arrays(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(50, 6)).astype(np.float64)
    y = (rng.random((50, 4)) < 0.5).astype(np.int64)
    paths = {"x": tmp_path / "x.npy", "y": tmp_path / "y.npy", "names": tmp_path / "names.txt"}
    np.save(paths["x"], x)
    np.save(paths["y"], y)
    paths["names"].write_text("alpha\nbeta\ngamma\ndelta\n")
    return paths


def test_import_arrays_fraction(tmp_path: Path, arrays: dict[str, Path]) -> None:
    out = tmp_path / "a.zarr"
    code = run_cli(
        ["import", "arrays", "--features", str(arrays["x"]), "--labels", str(arrays["y"]),
         "--class-names", str(arrays["names"]), "--test-fraction", "0.3", "--name", "tab",
         "--out", str(out), "--dtype", "float32", "--quiet"]
    )  # fmt: skip
    assert code == 0
    store = open_store(out)
    x, y = np.load(arrays["x"]), np.load(arrays["y"])
    pool, test = split_indices(50, 0.3, 1200)
    assert (len(pool), len(test)) == (35, 15)
    np.testing.assert_array_equal(
        store.features(), np.concatenate([x[pool], x[test]]).astype(np.float32)
    )
    np.testing.assert_array_equal(store.labels(), np.concatenate([y[pool], y[test]]))
    assert store.image_ids[:2] == [f"row{pool[0]}", f"row{pool[1]}"]
    assert store.image_ids[35] == f"row{test[0]}"
    assert store.class_names == ["alpha", "beta", "gamma", "delta"] and store.dataset == "tab"
    assert store.attrs["test_split"] == {
        "method": "random (probe.store.protocol.split_indices)", "fraction": 0.3, "seed": 1200,
    }  # fmt: skip
    np.testing.assert_array_equal(
        store.observed(rows=np.arange(35)), single_positive(y[pool].astype(np.uint8))
    )
    assert set(store.provenance["source_sha256"]) == {"features", "labels", "class_names"}


def test_import_arrays_test_files(tmp_path: Path, arrays: dict[str, Path]) -> None:
    xt, yt = tmp_path / "xt.npy", tmp_path / "yt.npy"
    np.save(xt, np.ones((9, 6), dtype=np.int32))  # integer features are accepted as float
    np.save(yt, np.eye(9, 4, dtype=bool))
    store = imports.import_array_files(
        tmp_path / "b.zarr", arrays["x"], arrays["y"], name="tab", test_features_path=xt,
        test_labels_path=yt, progress=False,
    )  # fmt: skip
    assert (len(store.split("train")) + len(store.split("val")), len(store.split("test"))) == (
        50,
        9,
    )
    assert store.image_ids[0] == "train0" and store.image_ids[50] == "test0"
    assert store.class_names == ["class_0", "class_1", "class_2", "class_3"]
    np.testing.assert_array_equal(store.features(store.split("test")), np.ones((9, 6)))
    assert store.attrs["test_split"] == {"method": "given"}


def test_import_arrays_errors(tmp_path: Path, arrays: dict[str, Path]) -> None:
    out = tmp_path / "e.zarr"

    def run(**kw):
        return imports.import_array_files(
            out, kw.pop("x", arrays["x"]), kw.pop("y", arrays["y"]), name="t", progress=False, **kw
        )

    with pytest.raises(FileNotFoundError, match=r"nope.npy not found"):
        run(x=tmp_path / "nope.npy")
    bad = tmp_path / "bad.npy"
    np.save(bad, np.full((50, 4), 3))
    with pytest.raises(ValueError, match=r"bad.npy: labels must be 0/1 but row 0, column 0 is 3"):
        run(y=bad)
    np.save(bad, np.zeros((49, 4)))
    with pytest.raises(ValueError, match=r"x.npy has 50 rows but .*bad.npy has 49"):
        run(y=bad)
    nan = np.load(arrays["x"])
    nan[17, 2] = np.nan
    np.save(bad, nan)
    with pytest.raises(ValueError, match=r"bad.npy: features of row 17 are NaN"):
        run(x=bad)
    np.save(bad, np.load(arrays["x"]) * 1e6)
    with pytest.raises(ValueError, match=r"beyond float16's range.*--dtype float32"):
        run(x=bad)
    names = tmp_path / "n.txt"
    names.write_text("a\nb\na\nc\n")
    with pytest.raises(ValueError, match=r"n.txt line 3: class name 'a' repeats line 1"):
        run(class_names_path=names)
    names.write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"n.txt has 2 class names but the labels have 4"):
        run(class_names_path=names)
    with pytest.raises(ValueError, match=r"give both or neither"):
        run(test_features_path=arrays["x"])
    run()
    with pytest.raises(StoreError, match=r"already complete.*--overwrite"):
        run()
    assert run(overwrite=True).n_rows == 50


def test_interrupted_import_resumes(
    tmp_path: Path, arrays: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(0)
    x, y = tmp_path / "big_x.npy", tmp_path / "big_y.npy"
    np.save(x, rng.normal(size=(3000, 4)).astype(np.float32))  # 3 blocks of 1024 rows
    np.save(y, (rng.random((3000, 3)) < 0.5).astype(np.uint8))
    out = tmp_path / "r.zarr"
    real_write = StoreWriter.write_block
    calls = []

    def crash_on_second(self, block, *a, **k):
        calls.append(block)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_write(self, block, *a, **k)

    monkeypatch.setattr(StoreWriter, "write_block", crash_on_second)
    argv = ["import", "arrays", "--features", str(x), "--labels", str(y), "--name", "big",
            "--out", str(out), "--quiet"]  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        run_cli(argv)
    monkeypatch.setattr(StoreWriter, "write_block", real_write)
    with pytest.raises(StoreError, match=r"incomplete \(1 of 3"):
        run_cli(["info", str(out)])
    np.save(arrays["x"], np.zeros((3000, 4), np.float32))  # another source: refuses to mix
    other = [a if a != str(x) else str(arrays["x"]) for a in argv]
    with pytest.raises(StoreError, match=r"'source_sha256' differs"):
        run_cli(other)
    assert run_cli(argv) == 0  # the same command resumes
    store = open_store(out)
    assert len(store.attrs["resumed"]) == 1  # the refused attempt did not touch the store
    pool, test = split_indices(3000, 0.2, 1200)
    data = np.load(x)
    np.testing.assert_array_equal(
        store.features(), np.concatenate([data[pool], data[test]]).astype(np.float16)
    )


# ----------------------------------------------------------------------------- yeast + info


def test_yeast_then_info_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from studies.cli import main

    out = tmp_path / "yeast.zarr"
    assert main(["import", "yeast", "--out", str(out), "--quiet"]) == 0
    assert "2417 rows (train 1547 / val 387 / test 483)" in capsys.readouterr().out
    assert main(["info", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["rows"], s["classes"], s["feature_dim"], s["dtype"]) == (2417, 14, 103, "float16")
    assert {k: v["rows"] for k, v in s["splits"].items()} == {
        "train": 1547,
        "val": 387,
        "test": 483,
    }
    assert s["class_names"][0] == "Class1" and s["n_unlabeled"] == {"pool": 0, "test": 0}
    assert s["other_attrs"]["test_split"]["seed"] == 1200
    assert s["provenance"]["backbone_run"] is False
    assert 4.0 < s["splits"]["train"]["label_cardinality"] < 4.5  # yeast: 4.24 labels per gene
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "yeast: 2417 rows, 14 classes, 103-dim float16 features" in text
    assert "test_split" in text and "source_sha256" in text
    # the stored values are the csv's values (float16)
    feats, labels, _ = imports.load_yeast_csv(imports.yeast_csv_path())
    pool, test = split_indices(2417, 0.2, 1200)
    store = open_store(out)
    np.testing.assert_array_equal(store.labels(), np.concatenate([labels[pool], labels[test]]))
    np.testing.assert_array_equal(
        store.features([0, 2416]), feats[[pool[0], test[-1]]].astype(np.float16)
    )
    # errors through the real entry point: one line, exit status 2
    assert main(["import", "yeast", "--out", str(out)]) == 2
    assert "already complete" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "none.zarr")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_yeast_without_river(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "river" else real(name, *a)
    )
    with pytest.raises(ValueError, match=r"pip install 'spml-probe\[yeast\]'"):
        imports.import_yeast(tmp_path / "y.zarr")


def test_info_rejects_other_schema(tmp_path: Path, arrays: dict[str, Path]) -> None:
    import zarr

    out = tmp_path / "s.zarr"
    imports.import_array_files(out, arrays["x"], arrays["y"], name="t", progress=False)
    zarr.open_group(out, mode="r+").attrs["schema_version"] = 2
    with pytest.raises(StoreError, match=r"schema version 2; this spml-probe reads version 1"):
        run_cli(["info", str(out)])


def test_cli_constants_agree() -> None:
    """featurize's CLI modules keep copies so that building the parser does not import zarr."""
    from probe.store import DTYPES

    assert fcli.DTYPES == DTYPES and import_cli.TEST_FRACTION == imports.DEFAULT_TEST_FRACTION


def test_help_texts(capsys: pytest.CaptureFixture) -> None:
    for cmd, words in (
        (["import", "cole"], ["formatted_{train,val}_labels.npy", "float16", "example"]),
        (["import", "arrays"], ["--test-fraction", "seed 1200", "examples"]),
        (["import", "yeast"], ["pip install 'spml-probe[yeast]'", "seed 1200", "example"]),
        (["info"], ["--json", "provenance", "examples"]),
    ):
        with pytest.raises(SystemExit):
            run_cli([*cmd, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for word in words:
            assert word in text, (cmd, word)


def test_seeds_give_other_single_positive_draws(tmp_path: Path, capsys) -> None:
    """docs/protocol.md step 2 with other seeds: `--seeds` on import and `spml draw` later."""
    pytest.importorskip("river")
    from probe.store.protocol import single_positive
    from studies.cli import main

    out = tmp_path / "y.zarr"
    assert main(["import", "yeast", "--out", str(out), "--seeds", "1200,5", "--quiet"]) == 0
    assert main(["draw", str(out), "--seeds", "7,5"]) == 0
    store = open_store(out)
    assert store.observed_seeds() == [5, 7, 1200]
    labels, n_pool = store.labels(), int(store.attrs["n_pool"])
    for seed in (5, 7):  # each phase re-seeded, exactly the protocol's generator
        expected = np.concatenate([single_positive(labels[:n_pool], seed),
                                   single_positive(labels[n_pool:], seed)])
        np.testing.assert_array_equal(store.observed(seed), expected)
    assert not np.array_equal(store.observed(5), store.observed(1200))
    capsys.readouterr()
    assert main(["draw", str(out), "--seeds", "x"]) == 2
    assert "--seeds must be integers" in capsys.readouterr().err
