"""The CUDA paths, run with ``pytest -m gpu`` on a machine with a GPU; skipped elsewhere with
the reason shown by ``pytest -ra`` (tests/conftest.py). ``bash .ci/gpu`` runs them with the GPU
benches (docs/performance.md, "One NVIDIA H100").

* nvJPEG decode (``torchvision.io.decode_jpeg(device='cuda')``, batched) and the GPU resize
  against the PIL reference;
* bf16 + channels_last features against the fp32/PIL reference path: cosine ≥ 0.999 per image
  (the target), and the compiled backbone's (``--compile``) against the eager one's;
* one stacked trial on CUDA (CUDA graphs, the default) equals the plain PyTorch loop on CUDA;
* AP on CUDA equals AP on the CPU to float rounding (the canonical ranking), and so do the
  bootstrap replicates of the test-mAP intervals;
* no host synchronisation inside an epoch, checked on the device with
  ``torch.cuda.set_sync_debug_mode("error")`` around every training step.

(The CUDA-graph step vs the eager step is ``tests/test_train.py::
test_cuda_graph_step_equals_the_eager_step``, also marked gpu.)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from featurize.bench import synthetic_index, synthetic_photos
from featurize.extract.images import batch_decode, pil_resized, read_bytes, resize_batch
from featurize.extract.run import FeaturizeConfig, featurize
from probe.bench.engine import plain_loop, synthetic_store
from probe.engine.config import ProbeConfig
from probe.engine.data import ProbeData
from probe.engine.train import train_probe
from probe.store import open_store

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> list[Path]:
    """COCO-like JPEGs (640×480, quality 90) as ``spml bench featurize`` writes them."""
    return synthetic_photos(tmp_path_factory.mktemp("photos"), 12, 640, 480, seed=1)


def test_nvjpeg_batch_decode_matches_pil(photos) -> None:
    """Decoded pixels: nvJPEG and libjpeg (PIL) agree on luma to rounding; their chroma
    upsampling differs (libjpeg's "fancy" triangular filter vs nvJPEG's), which moves RGB by up
    to ~100 at sharp colour edges on a small share of pixels (on an H100, 12 photos: RGB mean
    |Δ| below 1, luma p99.9 1, luma max 13); torchvision's CPU decode equals PIL exactly. The
    features that come out of it are what matters:
    test_bf16_fast_path_features_match_the_fp32_reference."""
    decoded = batch_decode([read_bytes(p) for p in photos], photos, torch.device("cuda"))
    luma = np.array([0.299, 0.587, 0.114])
    for path, image in zip(photos, decoded, strict=True):
        assert isinstance(image, torch.Tensor) and image.is_cuda, image
        ref = np.asarray(Image.open(path).convert("RGB")).astype(np.int16)
        got = image.permute(1, 2, 0).cpu().numpy().astype(np.int16)
        assert got.shape == ref.shape
        diff, dy = np.abs(got - ref), np.abs(got @ luma - ref @ luma)
        where = f"{path.name}: RGB mean |Δ| {diff.mean():.3f}, luma p99.9 {np.percentile(dy, 99.9)}"
        assert diff.mean() <= 1.0 and (diff > 8).mean() <= 0.02, where
        assert dy.mean() <= 0.2 and np.percentile(dy, 99.9) <= 2 and dy.max() <= 24, where


def test_gpu_resize_matches_pil_resize(photos) -> None:
    """The antialiased bilinear resize on the GPU vs PIL's BILINEAR resize (the reference)."""
    images = [
        torch.from_numpy(np.asarray(Image.open(p).convert("RGB")).copy()).permute(2, 0, 1).cuda()
        for p in photos
    ]
    got = resize_batch(images, 448)
    assert got.is_cuda and got.shape == (len(photos), 3, 448, 448)
    for k, path in enumerate(photos):
        ref = pil_resized(path, 448).astype(int)
        assert np.abs(got[k].permute(1, 2, 0).cpu().numpy().astype(int) - ref).max() <= 1


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_bf16_fast_path_features_match_the_fp32_reference(photos, tmp_path) -> None:
    """ResNet-50 at 448² (seeded random weights: no download on a GPU box): the fast path
    (nvJPEG, GPU resize, bf16 autocast, channels_last) vs the reference (PIL, fp32), for the
    image and its flip; the target is cosine ≥ 0.999 per image."""
    index = synthetic_index(photos, len(photos), "gpu")
    common = dict(backbone="resnet50", weights="random", size=448, batch_size=8,
                  progress=False, device="cuda", dtype="float32")  # fmt: skip
    ref = featurize(index, tmp_path / "ref.zarr",
                    FeaturizeConfig(**common, decode="pil", precision="fp32"))  # fmt: skip
    fast = featurize(index, tmp_path / "fast.zarr",
                     FeaturizeConfig(**common, decode="torchvision", precision="bf16"))  # fmt: skip
    assert (ref.decode, ref.precision, fast.decode, fast.precision) == (
        "pil", "fp32", "torchvision", "bf16")  # fmt: skip
    a, b = open_store(ref.store_path), open_store(fast.store_path)
    for flip in (False, True):
        cos = _cosines(a.features(flip=flip), b.features(flip=flip))
        assert cos.min() >= 0.999, f"flip={flip}: per-image cosine min {cos.min():.5f}"


def test_compiled_fast_path_features_match_the_eager_ones(photos, tmp_path) -> None:
    """--compile on the fast path: the backbone through torch.compile (inductor, Triton kernels)
    gives the eager fast path's features, cosine ≥ 0.999 per image, flips included (both bf16:
    the kernels round differently)."""
    index = synthetic_index(photos, len(photos), "gpu")
    common = dict(backbone="resnet50", weights="random", size=448, batch_size=8, progress=False,
                  device="cuda", dtype="float32", decode="torchvision", precision="bf16")
    eager = featurize(index, tmp_path / "eager.zarr", FeaturizeConfig(**common))
    compiled = featurize(index, tmp_path / "compiled.zarr", FeaturizeConfig(**common, compile=True))
    a, b = open_store(eager.store_path), open_store(compiled.store_path)
    assert "torch.compile" in b.provenance["transform"]["compute"]
    for flip in (False, True):
        cos = _cosines(a.features(flip=flip), b.features(flip=flip))
        assert cos.min() >= 0.999, f"flip={flip}: per-image cosine min {cos.min():.5f}"


def test_one_stacked_trial_equals_the_plain_loop_on_cuda(tmp_path) -> None:
    store = synthetic_store(512, 64, 10, cache_dir=tmp_path, progress=False)
    data = ProbeData.from_store(store, device="cuda")
    head, _ = plain_loop(data, "gr", seed=2, lr=1e-2, epochs=2, batch_size=16)
    ours = train_probe(
        data,
        ProbeConfig(batch_size=16, lr=1e-2, epochs=2, seed=2, eval_every=0, device="cuda"),
        "gr",
    ).head(0, best=False)
    torch.testing.assert_close(ours.weight.cpu(), head.weight.detach().cpu(),
                               atol=2e-5, rtol=1e-4)  # fmt: skip
    torch.testing.assert_close(ours.bias.cpu(), head.bias.detach().cpu(), atol=2e-5, rtol=1e-4)


@contextlib.contextmanager
def _sync_is_an_error():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("loss_name", ["an", "gr", "ll_cp", "em_apl"])
def test_no_host_synchronisation_inside_an_epoch_on_cuda(tmp_path, monkeypatch, loss_name):
    """docs/design.md: no host synchronisation inside an epoch. Every training step of 4
    stacked trials runs with CUDA's sync debug mode set to raise on any synchronising call
    (a device→host copy, .item(), nonzero, a blocking stream sync)."""
    from probe.engine import loop

    steps = []
    real_step = loop.StackedTrainer._step

    def checked_step(self, *args, **kwargs):
        with _sync_is_an_error():
            out = real_step(self, *args, **kwargs)
        steps.append(1)
        return out

    monkeypatch.setattr(loop.StackedTrainer, "_step", checked_step)
    store = synthetic_store(256, 32, 10, cache_dir=tmp_path, progress=False)
    data = ProbeData.from_store(store, device="cuda")
    lrs = [{"lr": v} for v in (1e-3, 3e-3, 1e-2, 3e-2)]
    # the eager step: with CUDA graphs (the default) most steps are replays, not _step calls
    cfg = ProbeConfig(batch_size=16, epochs=2, device="cuda", cuda_graph=False)
    train_probe(data, cfg, loss_name, lrs)
    assert len(steps) >= 2 * (256 // 16)  # every step of both epochs ran checked


def test_bench_compares_the_graph_run_with_the_eager_step(tmp_path) -> None:
    """``spml bench probe --compare-eager``: an eager row per configuration, its heads equal
    to the graph run's, and the ratio of the two."""
    from probe.bench.engine import BenchConfig, run_bench

    report = run_bench(BenchConfig(n_train=256, dim=32, n_classes=10, epochs=1, trials=(1, 4),
                                   plain=False, papers=False, device="cuda", compare_eager=True,
                                   cache_dir=str(tmp_path)), progress=False)
    eager = [r for r in report["rows"] if r["method"] == "engine_eager"]
    assert [r["trials"] for r in eager] == [1, 4]
    assert all(r["max_abs_diff_vs_graph"] == 0.0 for r in eager)
    assert {"eager_over_cuda_graph_1_trials", "eager_over_cuda_graph_4_trials"} <= set(
        report["ratios"])


def test_ap_on_cuda_equals_ap_on_the_cpu() -> None:
    """The canonical ranking (probe.metrics.ranking.ap_block) on CUDA -- torch's sort, then the same
    searches -- gives the CPU's AP, ties included, to float rounding (a CUDA sum adds in its
    own order)."""
    from probe.metrics.ranking import column_ap

    g = torch.Generator().manual_seed(3)
    for scores in (torch.randn(4, 16_416, 80, generator=g),
                   torch.randint(0, 5, (2, 3000, 7), generator=g).float(),
                   torch.randn(2, 500, 6, generator=g).double()):
        targets = torch.rand(scores.shape[-2:], generator=g) < 0.05
        cpu = column_ap(scores, targets)
        cuda = column_ap(scores.cuda(), targets.cuda()).cpu()
        torch.testing.assert_close(cuda, cpu, rtol=1e-6, atol=1e-7)


def test_bootstrap_replicates_on_cuda_equal_the_cpus() -> None:
    """The paired bootstrap (probe.evaluation.intervals) on CUDA -- torch's sort, one tile of all
    the resamples, no column threads -- gives the CPU's replicates to float rounding, ties included
    (positives tied with each other enter in row order on both)."""
    from probe.evaluation.intervals import bootstrap_counts, weighted_column_ap

    g = torch.Generator().manual_seed(5)
    for scores in (torch.randn(2, 4000, 20, generator=g),
                   torch.randint(0, 6, (2, 900, 5), generator=g).float()):
        targets = torch.rand(scores.shape[-2:], generator=g) < 0.1
        counts = bootstrap_counts(scores.shape[1], 200, seed=1)
        cpu = weighted_column_ap(scores, targets, counts)
        cuda = weighted_column_ap(scores.cuda(), targets.cuda(), counts.cuda()).cpu()
        torch.testing.assert_close(cuda, cpu, rtol=1e-6, atol=1e-7)
