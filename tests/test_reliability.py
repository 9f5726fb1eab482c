"""Faults injected into stores: checksums, damage named by array and chunk, `spml verify`, repair
by re-running the same import/featurize, stores written before checksums."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from test_store import BLOCK, PROV, make_features, make_index

from probe.store import StoreDamaged, StoreError, open_store, verify_store, write_feature_store
from probe.store import writing as store_module

pytestmark = pytest.mark.usefixtures("one_thread")


def build(path: Path, feats: np.ndarray, flips: np.ndarray | None = None, **kw):
    return write_feature_store(path, make_index(), feats, flips, provenance=PROV,
                               block_rows=BLOCK, progress=False, **kw)


def chunk_file(store: Path, array: str, chunk: int) -> Path:
    group = zarr.open_group(store, mode="r")
    a = group[array]
    coords = (chunk,) + (0,) * (a.ndim - 1)
    return store / a.path / a.metadata.encode_chunk_key(coords)


def truncate(path: Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def flip_byte(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def age_chunk_files(store: Path) -> set[str]:
    """Date every chunk file back to 1970 (so that a rewritten one shows by its mtime)."""
    files = {p for p in store.rglob("*") if p.is_file() and "c" in p.relative_to(store).parts}
    for p in files:
        os.utime(p, (1000, 1000))
    return {str(p.relative_to(store)) for p in files}


def rewritten(store: Path, names: set[str]) -> set[str]:
    return {n for n in names if (store / n).stat().st_mtime != 1000}


@pytest.fixture
def feats() -> np.ndarray:
    return make_features()


# ----------------------------------------------------------------------------- checksums


def test_every_array_carries_a_checksum(tmp_path: Path, feats: np.ndarray) -> None:
    path = tmp_path / "s.zarr"
    build(path, feats, feats + 1)
    report = verify_store(path)
    assert report.ok and report.unchecksummed == []
    assert set(report.arrays) >= {"features", "features_flip", "labels", "split", "image_ids",
                                  "blocks_done", "observed/1200"}
    assert report.arrays["features"]["chunks"] == 4
    # 4 bytes of CRC-32C after each raw chunk
    assert chunk_file(path, "features", 0).stat().st_size == BLOCK * feats.shape[1] * 2 + 4


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_feature_chunk_is_named(tmp_path: Path, feats: np.ndarray, damage: str) -> None:
    path = tmp_path / "s.zarr"
    build(path, feats, feats + 1)
    target = chunk_file(path, "features_flip", 2)
    truncate(target) if damage == "truncate" else flip_byte(target)
    reason = "its file is 100 bytes" if damage == "truncate" else "checksum mismatch"
    store = open_store(path)  # metadata and small arrays are fine: it opens
    np.testing.assert_array_equal(store.features(), feats.astype(np.float16))  # other array
    with pytest.raises(StoreDamaged) as err:
        store.features(flip=True)
    msg = str(err.value)
    assert f"{path}: array 'features_flip' chunk 2 is damaged ({reason}" in msg
    assert "re-running the same featurize/import command" in msg and "spml verify" in msg
    # rows outside the damaged chunk still read
    np.testing.assert_array_equal(store.features(np.arange(0, 2 * BLOCK), flip=True),
                                  (feats + 1)[: 2 * BLOCK].astype(np.float16))
    from probe.engine.data import ProbeData

    with pytest.raises(StoreDamaged, match=r"'features_flip' chunk 2 is damaged"):
        ProbeData.from_store(path)


def test_damaged_small_arrays_are_named(tmp_path: Path, feats: np.ndarray) -> None:
    path = tmp_path / "s.zarr"
    build(path, feats)
    flip_byte(chunk_file(path, "labels", 0), at=-6)  # inside the zstd frame: same length
    store = open_store(path)
    with pytest.raises(StoreDamaged, match=r"array 'labels' chunk 0 is damaged \(checksum"):
        store.labels()
    flip_byte(chunk_file(path, "split", 0), at=-2)  # the stored checksum itself
    with pytest.raises(StoreDamaged, match=r"array 'split' chunk 0 is damaged"):
        open_store(path)
    chunk_file(path, "blocks_done", 1).unlink()
    report = verify_store(path)
    assert [(d.array, d.chunk) for d in report.damaged] == [
        ("blocks_done", (1,)), ("labels", (0, 0)), ("split", (0,))]
    assert "missing" in report.damaged[0].reason


def test_verify_cli(tmp_path: Path, feats: np.ndarray, capsys: pytest.CaptureFixture) -> None:
    from studies.cli import main

    path = tmp_path / "s.zarr"
    build(path, feats, feats)
    assert main(["verify", str(path)]) == 0
    assert "read back as written" in capsys.readouterr().out
    truncate(chunk_file(path, "features", 1))
    flip_byte(chunk_file(path, "features", 3))
    assert main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED features chunk 1: its file is 100 bytes, expected" in out
    assert "DAMAGED features chunk 3: checksum mismatch" in out
    assert "2 of " in out and "re-running the same featurize/import" in out
    assert main(["verify", str(tmp_path / "nope.zarr")]) == 2
    assert "does not exist" in capsys.readouterr().err


# ----------------------------------------------------------------------------- repair


def test_rerunning_the_import_rewrites_only_damaged_blocks(
    tmp_path: Path, feats: np.ndarray
) -> None:
    path = tmp_path / "s.zarr"
    flips = feats * 2
    build(path, feats, flips, resume=True)
    truncate(chunk_file(path, "features", 1))
    flip_byte(chunk_file(path, "features_flip", 3))
    flip_byte(chunk_file(path, "observed/1200", 0), at=-6)
    names = age_chunk_files(path)
    broken = {"features/c/1/0", "features_flip/c/3/0", "observed/1200/c/0/0"}
    store = build(path, feats, flips, resume=True)  # the same import command, run again
    assert verify_store(path).ok
    np.testing.assert_array_equal(store.features(), feats.astype(np.float16))
    np.testing.assert_array_equal(store.features(flip=True), flips.astype(np.float16))
    fresh = build(tmp_path / "fresh.zarr", feats, flips)
    np.testing.assert_array_equal(store.observed(), fresh.observed())
    # the damaged chunks, blocks 1 and 3 of both feature arrays (a block is written whole), and
    # those blocks' done marks -- nothing else
    assert rewritten(path, names) == broken | {
        "features_flip/c/1/0", "features/c/3/0", "blocks_done/c/1", "blocks_done/c/3"}
    (entry,) = store.attrs["repaired"]
    assert sorted(c[0] for c in entry["chunks"]) == ["features", "features_flip", "observed/1200"]
    with pytest.raises(StoreError, match=r"already complete and every chunk reads back"):
        build(path, feats, flips, resume=True)


def test_repair_killed_half_way_is_refused_then_finished(
    tmp_path: Path, feats: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.zarr"
    build(path, feats)
    truncate(chunk_file(path, "features", 0))
    calls = []

    def crash(self, block, *a, **k):
        calls.append(block)
        raise RuntimeError("injected crash")

    with monkeypatch.context() as m:
        m.setattr(store_module.StoreWriter, "write_block", crash)
        with pytest.raises(RuntimeError, match="injected"):
            build(path, feats, resume=True)
    assert calls == [0]
    with pytest.raises(StoreError, match=r"incomplete \(3 of 4 feature blocks"):
        open_store(path)
    build(path, feats, resume=True)
    np.testing.assert_array_equal(open_store(path).features(), feats.astype(np.float16))


def test_rerunning_featurize_repairs(tmp_path: Path) -> None:
    from fixtures_datasets import make_folder
    from test_featurize import _cfg, _index

    from featurize.backbones import load_backbone
    from featurize.extract.run import featurize

    index = _index(make_folder(tmp_path / "ds", n_images=12, seed=3))
    backbone = load_backbone("resnet18", "random", seed=0)
    out = tmp_path / "s.zarr"
    featurize(index, out, _cfg(), backbone=backbone)
    want = open_store(out).features(flip=True)
    flip_byte(chunk_file(out, "features_flip", 1))
    result = featurize(index, out, _cfg(), backbone=backbone)
    assert (result.blocks_resumed, result.blocks_done) == (2, 1)
    np.testing.assert_array_equal(open_store(out).features(flip=True), want)
    assert verify_store(out).ok


# ----------------------------------------------------------------------------- old stores


def test_store_written_before_checksums_still_opens(
    tmp_path: Path, feats: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Write a store the old way (raw feature chunks, zarr's default zstd for the small arrays,
    no CRC anywhere): it opens and reads as before; verify says what it cannot check."""
    path = tmp_path / "old.zarr"
    with monkeypatch.context() as m:
        m.setattr(store_module, "checksum_codecs", lambda compress: "auto" if compress else None)
        m.setattr(store_module, "EVERY_CHUNK", None)
        build(path, feats, feats + 3)
    group = zarr.open_group(path, mode="r")
    assert [type(c).__name__ for c in group["features"].metadata.codecs] == ["BytesCodec"]
    store = open_store(path)
    np.testing.assert_array_equal(store.features(flip=True), (feats + 3).astype(np.float16))
    rows = np.array([50, 3, 3, 17])
    np.testing.assert_array_equal(store.features(rows), feats[rows].astype(np.float16))
    report = verify_store(path)
    assert report.ok and "features" in report.unchecksummed and "labels" in report.unchecksummed
    truncate(chunk_file(path, "features", 2))  # a change of length is still caught
    with pytest.raises(StoreDamaged, match=r"'features' chunk 2 is damaged \(its file is 100"):
        store.features()
    build(path, feats, feats + 3, resume=True)  # and repaired
    np.testing.assert_array_equal(open_store(path).features(), feats.astype(np.float16))


def test_fast_reader_matches_zarr_for_any_row_selection(tmp_path: Path, feats: np.ndarray) -> None:
    path = tmp_path / "s.zarr"
    store = build(path, feats)
    ref = zarr.open_group(path, mode="r")["features"][:]
    rng = np.random.default_rng(0)
    n = feats.shape[0]
    for rows in (None, slice(5, 40), slice(None, None, 3), rng.permutation(n), np.array([], int),
                 rng.integers(0, n, 100), rng.random(n) < 0.5, np.arange(BLOCK, 2 * BLOCK)):
        want = ref if rows is None else ref[rows]
        np.testing.assert_array_equal(store.features(rows), want)
        wide = np.zeros((len(want), feats.shape[1] + 1), np.float16)
        store.features(rows, out=wide[:, :-1])  # strided destination
        np.testing.assert_array_equal(wide[:, :-1], want)
        assert not wide[:, -1].any()


def test_os_error_reading_a_chunk_is_named(tmp_path: Path, feats: np.ndarray) -> None:
    path = tmp_path / "s.zarr"
    store = build(path, feats)
    target = chunk_file(path, "features", 1)
    target.unlink()
    with pytest.raises(StoreDamaged, match=r"'features' chunk 1 is damaged \(its file is missing"):
        store.features()
    target.mkdir()  # an unreadable chunk (root reads chmod 000 files, so a directory)
    with pytest.raises(StoreDamaged, match=r"'features' chunk 1 is damaged \(reading it failed"):
        store.features()


def test_probe_data_from_store_reads_the_same_tensors(tmp_path: Path, feats: np.ndarray) -> None:
    import torch

    from probe.engine.data import ProbeData

    path = tmp_path / "s.zarr"
    store = build(path, feats, feats - 2)
    group = zarr.open_group(path, mode="r")
    f, g = group["features"][:], group["features_flip"][:]
    rows = {name: store.split(name) for name in ("train", "val", "test")}
    data = ProbeData.from_store(path)
    want = {"train": np.concatenate([f[rows["train"]], g[rows["train"]]]),
            "val": f[rows["val"]], "test": f[rows["test"]]}
    for name, x in (("train", data.train_x), ("val", data.val_x), ("test", data.test_x)):
        assert x.dtype == torch.float16
        np.testing.assert_array_equal(x[:, :-1].numpy(), want[name])
        assert bool((x[:, -1] == 1).all())
    as32 = ProbeData.from_store(path, dtype=torch.float32)
    assert torch.equal(as32.train_x, data.train_x.float())
    assert torch.equal(as32.test_x, data.test_x.float())


# ----------------------------------------------------------------------------- write failures


def _spml_limited(argv: list[str], max_file_bytes: int | None) -> subprocess.CompletedProcess:
    """``spml ARGV`` in a subprocess whose files may not grow past ``max_file_bytes``
    (RLIMIT_FSIZE: a write past it fails with EFBIG, as on a full disk)."""

    def limit() -> None:
        if max_file_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "studies.cli", *argv], capture_output=True,
                          text=True, preexec_fn=limit, env=env, timeout=600)


def _no_partial_files(store: Path) -> None:
    assert not [p for p in store.rglob("*") if p.name.endswith((".partial", ".tmp"))]


def test_import_under_a_file_size_limit_fails_clearly_then_resumes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, y = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(x, rng.normal(size=(3000, 256)).astype(np.float32))  # 1024-row chunks: 512 KiB
    np.save(y, (rng.random((3000, 4)) < 0.4).astype(np.uint8))
    out = tmp_path / "s.zarr"
    argv = ["import", "arrays", "--features", str(x), "--labels", str(y), "--name", "t",
            "--out", str(out), "--quiet"]
    failed = _spml_limited(argv, 256 << 10)
    assert failed.returncode == 2, failed.stderr
    err = failed.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert f"cannot write block 0 (rows 0:1024) of {out}: File too large" in err
    assert "re-run the same command: it resumes" in err
    with pytest.raises(StoreError, match="incomplete"):
        open_store(out)
    assert verify_store(out).ok  # what was written is intact
    _no_partial_files(out)
    done = _spml_limited(argv, None)  # room again: the same command
    assert done.returncode == 0, done.stderr
    fresh = tmp_path / "fresh.zarr"
    assert _spml_limited([*argv[:-3], "--out", str(fresh), "--quiet"], None).returncode == 0
    np.testing.assert_array_equal(open_store(out).features(), open_store(fresh).features())
    assert open_store(out).attrs["resumed"]


def test_featurize_under_a_file_size_limit_fails_clearly_then_resumes(tmp_path: Path) -> None:
    from fixtures_datasets import make_folder

    expected = make_folder(tmp_path / "ds", n_images=12, seed=3)
    out = tmp_path / "s.zarr"
    argv = ["featurize", "folder", "--root", str(expected["root"]), "--out", str(out),
            "--option", f"annotations={expected['root'] / 'labels.csv'}", "--backbone",
            "resnet18", "--weights", "random", "--size", "32", "--device", "cpu", "--quiet",
            "--block-rows", "64"]  # one 64 KiB chunk per feature array
    failed = _spml_limited(argv, 48 << 10)
    assert failed.returncode == 2, failed.stderr
    err = failed.stderr.strip().splitlines()[-1]
    assert f"cannot write block 0 (rows 0:12) of {out}: File too large" in err
    assert "Traceback" not in failed.stderr
    assert verify_store(out).ok
    _no_partial_files(out)
    done = _spml_limited(argv, None)
    assert done.returncode == 0, done.stderr
    assert verify_store(out).ok and open_store(out).n_rows == 12


def test_creating_a_store_under_a_file_size_limit_leaves_nothing(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, y = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(x, rng.normal(size=(100, 8)).astype(np.float32))
    np.save(y, (rng.random((100, 4)) < 0.4).astype(np.uint8))
    out = tmp_path / "s.zarr"
    argv = ["import", "arrays", "--features", str(x), "--labels", str(y), "--name", "t",
            "--out", str(out), "--quiet"]
    failed = _spml_limited(argv, 300)  # not even the store's metadata fits
    assert failed.returncode == 2, failed.stderr
    assert f"cannot create {out}: File too large" in failed.stderr and not out.exists()
    assert _spml_limited(argv, None).returncode == 0
    assert open_store(out).n_rows == 100


def test_a_damaged_budget_draw_is_rewritten_with_its_budget(
    tmp_path: Path, feats: np.ndarray
) -> None:
    """A label-budget draw (spml draw --k --fraction) repaired by re-running the import is
    drawn again with its budget, not as a single-positive draw."""
    from probe.store import add_observed_seed

    path = tmp_path / "s.zarr"
    build(path, feats, resume=True)
    add_observed_seed(path, 20, k=2, fraction=0.5)
    before = open_store(path).observed(20)
    flip_byte(chunk_file(path, "observed/20", 0), at=-6)
    assert not verify_store(path).ok
    store = build(path, feats, resume=True)
    assert verify_store(path).ok
    np.testing.assert_array_equal(store.observed(20), before)
    assert store.observed_budget(20) == {"k": 2, "fraction": 0.5}
