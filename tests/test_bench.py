"""``spml bench probe`` on tiny sizes (no timing assertions): the synthetic store's shape and
label statistics, its cache, the report's rows/ratios, and that the engine and the plain
PyTorch loop it is timed against compute the same head."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from probe import ProbeConfig, train_probe
from probe.bench.engine import BenchConfig, format_report, plain_loop, run_bench, synthetic_store
from probe.engine.data import ProbeData
from probe.store import open_store
from studies.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_synthetic_store_shape_statistics_and_cache(tmp_path):
    path = synthetic_store(600, 24, 12, seed=1, cache_dir=tmp_path, progress=False)
    store = open_store(path)
    assert len(store.split("train")) == 600 and store.has_flip and store.dtype == "float16"
    assert store.feature_dim == 24 and store.n_classes == 12
    labels = store.labels()
    assert labels.sum(1).min() >= 1
    assert abs(labels.sum(1).mean() - 2.9) < 0.25  # 1 + Poisson(1.9): COCO's ~2.9 per image
    n_pool = len(store.split("train")) + len(store.split("val"))
    assert len(store.split("test")) == round(n_pool * 40_137 / 82_081)
    assert (store.features() >= 0).all()  # pooled-ReLU-like features
    mtime = (path / "zarr.json").stat().st_mtime_ns
    assert synthetic_store(600, 24, 12, seed=1, cache_dir=tmp_path, progress=False) == path
    assert (path / "zarr.json").stat().st_mtime_ns == mtime  # reused, not rebuilt


def test_plain_loop_equals_engine(tmp_path):
    data = ProbeData.from_store(synthetic_store(120, 8, 5, cache_dir=tmp_path, progress=False))
    head, seconds = plain_loop(data, "gr", seed=2, lr=1e-2, epochs=2, batch_size=16)
    assert len(seconds) == 2
    ours = train_probe(data, ProbeConfig(batch_size=16, lr=1e-2, epochs=2, seed=2,
                                         eval_every=0), "gr").head(0, best=False)
    torch.testing.assert_close(ours.weight, head.weight.detach(), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ours.bias, head.bias.detach(), atol=2e-5, rtol=1e-4)


def test_run_bench_report(tmp_path):
    cfg = BenchConfig(n_train=160, dim=16, n_classes=6, epochs=2, trials=(1, 3),
                      cache_dir=str(tmp_path), isolate=False)
    report = run_bench(cfg, progress=False)
    rows = {(r["method"], r["trials"]): r for r in report["rows"]}
    assert set(rows) == {("engine", 1), ("engine", 3), ("plain", 1), ("papers", 1)}
    for r in rows.values():
        assert len(r["epoch_seconds"]) == 2
        assert r["sec_per_epoch_median"] == pytest.approx(float(np.median(r["epoch_seconds"])))
        assert r["peak_memory_bytes"] > 0 and r["steps_per_epoch"] == 160 // 16
    assert rows[("engine", 3)]["sec_per_epoch_per_trial"] == pytest.approx(
        rows[("engine", 3)]["sec_per_epoch_median"] / 3)
    ratios = report["ratios"]
    assert ratios["plain_over_engine_1_trial"] == pytest.approx(
        rows[("plain", 1)]["sec_per_epoch_median"] / rows[("engine", 1)]["sec_per_epoch_median"])
    assert "engine_3_trials_over_1_trial" in ratios
    papers = rows[("papers", 1)]
    assert ratios["papers_over_engine_1_trial_training"] == pytest.approx(
        papers["sec_per_epoch_median"] / rows[("engine", 1)]["sec_per_epoch_median"])
    assert ratios["papers_over_engine_1_trial_whole_epoch"] > 0
    assert [set(m) for m in papers["maps"]] == [{"train", "val", "test"}] * 2
    assert all(0 <= v <= 100 for m in papers["maps"] for v in m.values())
    assert rows[("engine", 3)]["eval_seconds_val"] > 0
    assert rows[("engine", 3)]["eval_seconds_test_once"] > 0
    machine = report["machine"]
    assert machine["before"]["cpus"] >= 1 and len(machine["after"]["load_avg_1_5_15"]) == 3
    assert report["equivalence_max_abs_diff_engine_vs_plain"] < 1e-5
    text = format_report(report)
    assert "plain loop" in text and "engine, 3 stacked GR trials" in text
    assert "papers-style loop" in text and "load average" in text
    json.dumps(report)  # the JSON printed by the command


def test_bench_cli(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "probe", "--rows", "64", "--dim", "8", "--classes", "4", "--epochs",
                 "1", "--trials", "2", "--no-plain", "--cache-dir", str(tmp_path), "--json",
                 str(out), "--quiet", "--in-process"]) == 0
    report = json.loads(out.read_text())
    assert [(r["method"], r["trials"]) for r in report["rows"]] == [("engine", 2)]
    assert "s/epoch" in capsys.readouterr().out
    assert main(["bench", "probe", "--rows", "64", "--batch-size", "100", "--cache-dir",
                 str(tmp_path)]) == 2
    assert "larger than the train split" in capsys.readouterr().err
    assert main(["bench", "probe", "--trials", "0"]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_compare_eager_needs_cuda():
    with pytest.raises(ValueError, match=r"compare_eager \(--compare-eager\) needs a CUDA"):
        BenchConfig(compare_eager=True, device="cpu").validate()


def test_compare_one_block_times_the_same_heads_as_one_block(tmp_path, monkeypatch):
    """--compare-one-block: where the stacked trials train in blocks, the same run as one
    block is timed beside it, its heads compared (equal: a trial computes the same bits in
    any block); the ratio comes from the same run."""
    import probe.engine.loop as loop

    monkeypatch.setattr(loop, "TRIAL_BLOCK_BYTES", 4 * 17 * 6 * 4 * 2)  # two tiny heads a block
    cfg = BenchConfig(n_train=160, dim=16, n_classes=6, epochs=1, trials=(4,), plain=False,
                      papers=False, compare_one_block=True, cache_dir=str(tmp_path),
                      isolate=False)  # the patched block size holds in this process only
    report = run_bench(cfg, progress=False)
    rows = {r["method"]: r for r in report["rows"]}
    assert rows["engine"]["trial_blocks"] == [2, 2]
    assert rows["engine_one_block"]["trial_blocks"] == [4]
    assert rows["engine_one_block"]["max_abs_diff_vs_blocks"] == 0.0
    assert report["ratios"]["one_block_over_blocks_4_trials"] == pytest.approx(
        rows["engine_one_block"]["sec_per_epoch_median"] / rows["engine"]["sec_per_epoch_median"])
    assert "in 2 blocks" in format_report(report)
    import probe.bench.engine as bench

    monkeypatch.setattr(bench, "resolve_device", lambda device: torch.device("cuda"))
    with pytest.raises(ValueError, match=r"compare_one_block \(--compare-one-block\).*cuda"):
        BenchConfig(compare_one_block=True, device="cuda").validate()


def test_each_row_is_timed_alone_by_default(tmp_path, monkeypatch):
    """The default: every configuration is one job, run alone in a fresh process (here the
    jobs run in this process, to keep the test quick: the spawn itself is the slow test
    below); the heads come back and are compared here."""
    import probe.bench.engine as bench

    jobs = []
    monkeypatch.setattr(bench, "_run_job", lambda job, *a, isolate, threads: jobs.append(
        (job.__name__, isolate, threads)) or job(*a))
    cfg = BenchConfig(n_train=96, dim=8, n_classes=4, epochs=1, trials=(1,), papers=False,
                      cache_dir=str(tmp_path))
    report = run_bench(cfg, progress=False)
    assert jobs == [("_engine_job", True, 1), ("_plain_job", True, 1)]  # one_thread fixture
    assert [r["method"] for r in report["rows"]] == ["engine", "plain"]
    assert report["equivalence_max_abs_diff_engine_vs_plain"] < 1e-5


@pytest.mark.slow
def test_a_job_run_in_a_spawned_process_computes_what_it_computes_here(tmp_path):
    import probe.bench.engine as bench

    cfg = BenchConfig(n_train=96, dim=8, n_classes=4, epochs=1, trials=(1,), papers=False,
                      cache_dir=str(tmp_path))
    path = synthetic_store(96, 8, 4, cache_dir=tmp_path, progress=False)
    here = bench._run_job(bench._plain_job, cfg, str(path), isolate=False, threads=1)
    alone = bench._run_job(bench._plain_job, cfg, str(path), isolate=True, threads=1)
    np.testing.assert_array_equal(alone["heads"], here["heads"])
