"""The featurize pipeline: parity with the reference preprocessing + a plain
torchvision forward, the torchvision decode path, resume after an interruption, bad images,
the CLI and the benchmark. CPU only, seeded random weights, a dozen tiny images.

Tolerance of the parity checks: features are stored as float16, whose 11-bit significand
rounds to within 2^-11 ≈ 4.9e-4 relative; float32 summation order (batch vs single image) adds
~1e-6. So stored == reference within ``|Δ| ≤ 1e-3·|ref| + 1e-3·max|ref|``.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from torchvision import transforms

sys.path.insert(0, str(Path(__file__).parent))
from fixtures_datasets import interrupted_at, make_folder, write_jpeg

from featurize.backbones import load_backbone
from featurize.cli import register_cli as register_featurize_cli
from featurize.datasets import DatasetIndex, Phase
from featurize.extract.images import (
    BadImageError,
    batch_decode,
    cpu_decode,
    jpeg_frame,
    nvjpeg_decodable,
    pil_resized,
    resize_batch,
)
from featurize.extract.run import FeaturizeConfig, featurize, resolve_runtime
from probe.store import StoreError, open_store

torch.set_num_threads(2)


def _close(stored: np.ndarray, ref: np.ndarray) -> None:
    """float16 storage tolerance (module docstring)."""
    stored = stored.astype(np.float64)
    ref = ref.astype(np.float64)
    tol = 1e-3 * np.abs(ref) + 1e-3 * np.abs(ref).max()
    worst = np.abs(stored - ref) - tol
    assert (worst <= 0).all(), f"max excess over tolerance {worst.max():.3g}"


def _reference(model: torch.nn.Module, paths, size: int, flip: bool) -> np.ndarray:
    """The reference: PIL open → RGB → Resize((S,S), bilinear) → [hflip] → ToTensor →
    Normalize(ImageNet) → plain torchvision forward (all images in one batch)."""
    steps = [transforms.Resize((size, size), interpolation=transforms.InterpolationMode.BILINEAR)]
    if flip:
        steps.append(transforms.RandomHorizontalFlip(p=1.0))
    steps += [
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ]
    tf = transforms.Compose(steps)
    with torch.no_grad():
        return model(torch.stack([tf(Image.open(p).convert("RGB")) for p in paths])).numpy()


@pytest.fixture(scope="module")
def resnet50_pair():
    """Our seeded random ResNet-50 and a plain torchvision one built the plain way."""
    ours = load_backbone("resnet50", "random", seed=7)
    torch.manual_seed(7)
    plain = torchvision.models.resnet50()
    plain.fc = torch.nn.Identity()
    return ours, plain.eval()


@pytest.fixture(scope="module")
def resnet18():
    return load_backbone("resnet18", "random", seed=0)


def _index(expected: dict) -> DatasetIndex:
    """The DatasetIndex a fixture builder's answers describe (the adapters are tested in
    test_datasets.py; here only the images and their order matter)."""
    return DatasetIndex(
        name=expected["name"],
        class_names=expected["class_names"],
        pool=Phase(**expected["pool"]),
        test=Phase(**expected["test"]),
        root=expected["root"],
    )


@pytest.fixture
def folder(tmp_path):
    """12 tiny real JPEGs (one grayscale, one CMYK) in the generic-folder layout."""
    expected = make_folder(tmp_path / "ds", n_images=12, seed=3)
    return expected, _index(expected)


def _paths(index) -> list[Path]:
    return [Path(p) for p in (*index.pool.paths, *index.test.paths)]


def _cfg(**kw) -> FeaturizeConfig:
    base = dict(
        backbone="resnet18",
        weights="random",
        size=32,
        block_rows=4,
        batch_size=4,
        progress=False,
        decode="pil",
    )
    return FeaturizeConfig(**{**base, **kw})


# ----------------------------------------------------------------------------- parity


def test_resnet50_dozen_images_match_plain_torchvision(tmp_path, folder, resnet50_pair):
    """Seeded random ResNet-50 on the 12-image fixture (incl. grayscale + CMYK) at 32 px:
    stored features and flipped features == reference pipeline + plain forward."""
    _, index = folder
    ours, plain = resnet50_pair
    cfg = _cfg(backbone="resnet50", weights_seed=7, size=32, batch_size=6, block_rows=6)
    result = featurize(index, tmp_path / "s.zarr", cfg, backbone=ours)
    store = open_store(tmp_path / "s.zarr")
    assert result.rows_done == store.n_rows == 12 and store.feature_dim == 2048
    assert store.image_ids == [*index.pool.image_ids, *index.test.image_ids]
    paths = _paths(index)
    for flip in (False, True):
        _close(store.features(flip=flip), _reference(plain, paths, 32, flip))
    assert store.features().dtype == np.float16
    # the flipped features are really different inputs, not a copy
    assert not np.allclose(store.features(), store.features(flip=True), atol=1e-2)


def test_resnet50_at_448_matches_plain_torchvision(tmp_path, resnet50_pair):
    """The protocol's size, 448², on 2 images (one grayscale), both flips."""
    rng = np.random.RandomState(0)
    paths = (write_jpeg(tmp_path / "a.jpg", rng), write_jpeg(tmp_path / "b.jpg", rng, "L"))
    ones = np.ones((1, 1), dtype=np.uint8)
    index = DatasetIndex(
        "two", ("x",), pool=Phase(("a",), paths[:1], ones), test=Phase(("b",), paths[1:], ones)
    )
    ours, plain = resnet50_pair
    featurize(
        index,
        tmp_path / "s.zarr",
        _cfg(backbone="resnet50", weights_seed=7, size=448, batch_size=2),
        backbone=ours,
    )
    store = open_store(tmp_path / "s.zarr")
    for flip in (False, True):
        _close(store.features(flip=flip), _reference(plain, _paths(index), 448, flip))
    prov = store.provenance
    assert prov["transform"]["resize"] == [448, 448] and prov["transform"]["crop"] is None
    assert prov["weights"] == "random(seed=7)" and prov["weights_random"] is True
    assert prov["weights_sha256"] is None and store.attrs["weights_random"] is True


def test_torchvision_decode_path_is_close_to_pil(tmp_path, folder, resnet18):
    """--decode torchvision (CPU libjpeg + torch resize; grayscale/CMYK converted) gives
    features within the one-grey-level resize difference of the PIL path."""
    _, index = folder
    featurize(index, tmp_path / "pil.zarr", _cfg(), backbone=resnet18)
    featurize(index, tmp_path / "tv.zarr", _cfg(decode="torchvision"), backbone=resnet18)
    a, b = open_store(tmp_path / "pil.zarr"), open_store(tmp_path / "tv.zarr")
    for flip in (False, True):
        fa, fb = a.features(flip=flip).astype(float), b.features(flip=flip).astype(float)
        assert np.abs(fa - fb).max() <= 0.03 * np.abs(fa).max()
    assert "torchvision" in b.provenance["transform"]["decode"]
    assert "PIL" in a.provenance["transform"]["decode"]


@pytest.mark.slow  # inductor compiles ResNet-18 on the CPU: ~30 s
def test_compiled_backbone_stores_the_eager_features(tmp_path, folder, resnet18, monkeypatch):
    """--compile: the backbone through torch.compile (inductor, here on the CPU) stores the eager
    run's features within the float16 tolerance, and the provenance says it ran compiled; where
    inductor cannot run, the run warns and stays eager."""
    _, index = folder
    featurize(index, tmp_path / "eager.zarr", _cfg(), backbone=resnet18)
    featurize(index, tmp_path / "compiled.zarr", _cfg(compile=True), backbone=resnet18)
    eager, compiled = open_store(tmp_path / "eager.zarr"), open_store(tmp_path / "compiled.zarr")
    for flip in (False, True):
        _close(compiled.features(flip=flip), eager.features(flip=flip))
    assert compiled.provenance["transform"]["compute"] == "float32, torch.compile (inductor)"
    assert eager.provenance["transform"]["compute"] == "float32"
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.warns(RuntimeWarning, match=r"--compile: the backbone runs eagerly .*C\+\+"):
        assert not resolve_runtime(_cfg(compile=True, device="cpu")).compile


# ----------------------------------------------------------------------------- images


def test_jpeg_sniffing_and_cpu_decode(tmp_path):
    rng = np.random.RandomState(1)
    rgb, gray, cmyk = (write_jpeg(tmp_path / f"{m}.jpg", rng, m) for m in ("RGB", "L", "CMYK"))
    png = tmp_path / "x.png"
    Image.fromarray(rng.randint(0, 255, (20, 30, 3), dtype=np.uint8)).save(png)
    frames = {p.stem: jpeg_frame(p.read_bytes()) for p in (rgb, gray, cmyk, png)}
    assert frames["RGB"] == (0xC0, 3) and frames["L"] == (0xC0, 1)
    assert frames["CMYK"][1] == 4 and frames["x"] is None
    assert nvjpeg_decodable(rgb.read_bytes())
    assert not any(nvjpeg_decodable(p.read_bytes()) for p in (gray, cmyk, png))
    progressive = io.BytesIO()
    Image.open(rgb).save(progressive, "JPEG", progressive=True)
    assert jpeg_frame(progressive.getvalue()) == (0xC2, 3)
    for p in (rgb, gray, cmyk, png):  # the CPU decode equals PIL's RGB conversion
        ref = np.asarray(Image.open(p).convert("RGB"))
        got = cpu_decode(bytearray(p.read_bytes()), p).permute(1, 2, 0).numpy()
        assert np.array_equal(got, ref), p.name


def test_batch_decode_falls_back_image_by_image(tmp_path):
    """The batched decode (nvJPEG on CUDA; run here on the CPU, same code path): a batch with a
    truncated JPEG is retried image by image; good images decode as PIL does, the broken one
    comes back as a BadImageError naming it."""
    rng = np.random.RandomState(4)
    good = [write_jpeg(tmp_path / f"{k}.jpg", rng) for k in range(2)]
    broken = tmp_path / "truncated.jpg"
    broken.write_bytes(good[0].read_bytes()[:300])
    files = [good[0], broken, good[1]]
    out = batch_decode([bytearray(p.read_bytes()) for p in files], files, torch.device("cpu"))
    assert isinstance(out[1], BadImageError) and "truncated.jpg" in str(out[1])
    for k in (0, 2):
        ref = np.asarray(Image.open(files[k]).convert("RGB"))
        assert np.array_equal(out[k].permute(1, 2, 0).numpy(), ref)
    whole = batch_decode([bytearray(p.read_bytes()) for p in good], good, torch.device("cpu"))
    assert all(isinstance(t, torch.Tensor) and t.shape[0] == 3 for t in whole)


def test_gpu_style_batch_assembly_on_cpu(tmp_path):
    """The CUDA path's batch assembly (JPEG bytes for the batched decode, CPU-decoded fallback
    images, unreadable files) run on the CPU: same input as decoding everything on the CPU,
    order kept, the bad image zeroed and reported."""
    import featurize.extract.run as runner
    from featurize.extract.images import ImageTransform, normalize

    rng = np.random.RandomState(5)
    files = [write_jpeg(tmp_path / f"{k}.jpg", rng, m) for k, m in enumerate(["RGB", "L", "RGB"])]
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(files[0].read_bytes()[:200])
    files.append(broken)
    datas = [bytearray(p.read_bytes()) for p in files]
    items = [
        ("jpeg", datas[0]),
        ("image", cpu_decode(datas[1], files[1])),
        ("jpeg", datas[2]),
        ("jpeg", datas[3]),
    ]
    rt = resolve_runtime(FeaturizeConfig(device="cpu", decode="torchvision"))
    transform = ImageTransform(size=24)
    x, bad = runner.model_input(items, files, rt, transform)
    assert list(bad) == [3] and "broken.jpg" in bad[3]
    ref = resize_batch([cpu_decode(d, p) for d, p in zip(datas[:3], files[:3])], 24)
    assert torch.equal(x[:3], normalize(ref, transform))
    zero = normalize(torch.zeros((1, 3, 24, 24), dtype=torch.uint8), transform)
    assert torch.equal(x[3:], zero)


def test_resize_batch_matches_pil_within_one_level(tmp_path):
    rng = np.random.RandomState(2)
    paths = [write_jpeg(tmp_path / f"{k}.jpg", rng) for k in range(4)]
    imgs = [
        torch.from_numpy(np.asarray(Image.open(p).convert("RGB")).copy()).permute(2, 0, 1)
        for p in paths
    ]
    got = resize_batch(imgs + imgs[:1], 40)  # a repeated shape exercises the grouping
    assert got.shape == (5, 3, 40, 40) and got.dtype == torch.uint8
    for k, p in enumerate(paths):
        ref = pil_resized(p, 40).astype(int)
        assert np.abs(got[k].permute(1, 2, 0).numpy().astype(int) - ref).max() <= 1
    assert torch.equal(got[0], got[4])


def test_decode_errors_name_the_file(tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(BadImageError, match=r"broken\.jpg"):
        pil_resized(bad, 32)
    with pytest.raises(BadImageError, match=r"broken\.jpg"):
        cpu_decode(bytearray(bad.read_bytes()), bad)


# ----------------------------------------------------------------------------- resume, bad


def test_a_run_without_skip_bad_lists_every_unreadable_image(tmp_path, folder, resnet18):
    """The batch's unreadable images and every later one whose file cannot be opened are
    named in one error (rows, ids, causes), not only the first; nothing is half-written."""
    _, index = folder
    paths = _paths(index)
    victims = {1: paths[1], 6: paths[6], 10: paths[10]}  # batches 0, 1 and 2 of 4 rows
    for p in victims.values():
        p.write_bytes(b"not an image at all")
    with pytest.raises(BadImageError) as caught:
        featurize(index, tmp_path / "s.zarr", _cfg(), backbone=resnet18)
    text = str(caught.value)
    assert "3 unreadable image(s) in this run" in text
    for row, p in victims.items():
        assert f"row {row}, image id" in text and p.name in text, (row, text)
    assert text.index("row 1,") < text.index("row 6,") < text.index("row 10,")
    assert "--skip-bad" in text


def test_interrupted_run_resumes_to_the_same_store(tmp_path, folder, resnet18):
    """A corrupt image in block 2 stops the run naming the file; blocks 0-1 stay written; the
    store is refused as incomplete; after fixing the file the same call resumes (only block 2
    computed) and gives the features of an uninterrupted run."""
    _, index = folder
    paths = _paths(index)
    victim = paths[9]  # rows 8-11 are block 2 with block_rows=4
    good_bytes = victim.read_bytes()
    victim.write_bytes(good_bytes[: len(good_bytes) // 3])  # truncated JPEG
    out = tmp_path / "s.zarr"
    with pytest.raises(BadImageError, match=rf"{victim.name}.*row 9"):
        featurize(index, out, _cfg(), backbone=resnet18)
    with pytest.raises(StoreError, match="incomplete"):
        open_store(out)
    victim.write_bytes(good_bytes)
    result = featurize(index, out, _cfg(), backbone=resnet18)
    assert (result.blocks_resumed, result.blocks_done, result.rows_done) == (2, 1, 4)
    featurize(index, tmp_path / "fresh.zarr", _cfg(), backbone=resnet18)
    a, b = open_store(out), open_store(tmp_path / "fresh.zarr")
    for flip in (False, True):
        np.testing.assert_array_equal(a.features(flip=flip), b.features(flip=flip))
    assert a.attrs.get("resumed")
    with pytest.raises(StoreError, match=r"already complete.*--overwrite"):
        featurize(index, out, _cfg(), backbone=resnet18)


def test_ctrl_c_keeps_finished_blocks(tmp_path, folder, resnet18, monkeypatch):
    """Ctrl-C in the device loop (third batch = block 2): the blocks already handed to the
    writer thread are still written; the re-run computes only the rest."""
    import featurize.extract.run as runner

    _, index = folder
    real = runner.model_input
    monkeypatch.setattr(runner, "model_input", interrupted_at(real, 3))
    out = tmp_path / "s.zarr"
    with pytest.raises(KeyboardInterrupt):
        featurize(index, out, _cfg(), backbone=resnet18)
    monkeypatch.setattr(runner, "model_input", real)
    result = featurize(index, out, _cfg(), backbone=resnet18)
    assert (result.blocks_resumed, result.rows_done) == (2, 4)


def test_resume_refuses_other_settings(tmp_path, folder, resnet18):
    _, index = folder
    paths = _paths(index)
    paths[5].write_bytes(b"garbage")
    out = tmp_path / "s.zarr"
    with pytest.raises(BadImageError):
        featurize(index, out, _cfg(), backbone=resnet18)
    with pytest.raises(StoreError, match=r"size: store 32, now 40.*--overwrite"):
        featurize(index, out, _cfg(size=40), backbone=resnet18)
    other = load_backbone("resnet18", "random", seed=1)
    with pytest.raises(StoreError, match=r"'weights' differs.*random\(seed=0\)"):
        featurize(index, out, _cfg(weights_seed=1), backbone=other)
    with pytest.raises(StoreError, match="'backbone' differs"):
        featurize(index, out, _cfg(backbone="mobilenet_v3_large"))
    # --overwrite starts again (and --skip-bad gets past the broken file)
    result = featurize(index, out, _cfg(overwrite=True, skip_bad=True), backbone=resnet18)
    assert result.blocks_resumed == 0 and len(result.bad_rows) == 1


def test_skip_bad_records_rows_and_zero_features(tmp_path, folder, resnet18):
    _, index = folder
    paths = _paths(index)
    paths[2].write_bytes(b"\x00" * 50)  # undecodable
    paths[7].unlink()  # missing
    out = tmp_path / "s.zarr"
    # without --skip-bad a missing file is reported before any work: no store is created
    with pytest.raises(FileNotFoundError, match=rf"(?s)1 of 12 image files.*{paths[7].name}"):
        featurize(index, out, _cfg(), backbone=resnet18)
    assert not out.exists()
    for decode in ("pil", "torchvision"):
        result = featurize(
            index, out, _cfg(skip_bad=True, decode=decode, overwrite=True), backbone=resnet18
        )
        store = open_store(out)
        assert [b["row"] for b in result.bad_rows] == [2, 7]
        assert store.attrs["n_bad_rows"] == 2
        assert [b["row"] for b in store.attrs["bad_rows"]] == [2, 7]
        assert store.attrs["bad_rows"][1]["path"] == str(paths[7])
        assert store.attrs["bad_rows"][1]["image_id"] == store.image_ids[7]
        assert "does not exist" in store.attrs["bad_rows"][1]["error"]
        for flip in (False, True):
            feats = store.features(flip=flip)
            assert not feats[[2, 7]].any() and feats[[0, 1, 3]].any(axis=1).all()


def test_runtime_choices():
    rt = resolve_runtime(FeaturizeConfig(device="cpu"))
    assert (rt.decode, rt.precision, rt.batch_size) == ("pil", "fp32", 16)
    with pytest.raises(ValueError, match="--decode"):
        resolve_runtime(FeaturizeConfig(decode="nvjpeg"))
    with pytest.raises(ValueError, match="--device"):
        resolve_runtime(FeaturizeConfig(device="tpu!"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_runtime(FeaturizeConfig(device="cuda"))


# ----------------------------------------------------------------------------- CLI, bench


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spml")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench").add_subparsers(dest="bench_target", required=True)
    register_featurize_cli(sub, bench)
    return parser


def test_cli_featurize_and_bench(tmp_path, folder, capsys):
    expected, _ = folder
    out = tmp_path / "cli.zarr"
    args = _parser().parse_args(
        [
            "featurize",
            "folder",
            "--root",
            str(expected["root"]),
            "--out",
            str(out),
            "--option",
            f"annotations={expected['root'] / 'labels.csv'}",
            "--backbone",
            "resnet18",
            "--weights",
            "random",
            "--size",
            "32",
            "--batch-size",
            "6",
            "--device",
            "cpu",
            "--quiet",
            "--block-rows",
            "8",
        ]
    )
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}" in text and "12 images" in text and "WARNING: random weights" in text
    store = open_store(out)
    assert store.feature_dim == 512 and store.has_flip and store.provenance["weights_random"]
    from studies.cli import main

    assert main(["info", str(out)]) == 0  # spml info says loudly that these are not real
    assert "WARNING: RANDOM WEIGHTS" in capsys.readouterr().out

    args = _parser().parse_args(
        [
            "bench",
            "featurize",
            "--device",
            "cpu",
            "--images",
            "3",
            "--size",
            "32",
            "--backbone",
            "resnet18",
            "--batch-size",
            "2",
            "--json",
            "--image-size",
            "120x90",
        ]
    )
    assert args.func(args) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["images"] == 3 and result["images_per_s"] > 0
    assert result["weights"] == "random(seed=0)" and result["image_size"] == "120x90"
    assert result["decode"] == "pil" and result["device"] == "cpu"
    assert result["decode_images_per_s"] > 0 and result["forward_images_per_s"] > 0


def test_cli_errors_and_help(tmp_path, capsys):
    args = _parser().parse_args(
        [
            "featurize",
            "folder",
            "--root",
            str(tmp_path),
            "--out",
            str(tmp_path / "s"),
            "--option",
            "oops",
            "--weights",
            "random",
            "--backbone",
            "resnet18",
        ]
    )
    with pytest.raises(ValueError, match="KEY=VALUE"):
        args.func(args)
    with pytest.raises(SystemExit):
        _parser().parse_args(["featurize", "--help"])
    text = capsys.readouterr().out
    for needle in ("--weights", "resnet50-0676ba61.pth", "--skip-bad", "examples:", "--decode"):
        assert needle in text
