"""``spml bench study`` on a tiny store (no timing assertions): a real study runs to its trial
count, the wall time is split into parts that add up to it, and the wrapped functions are
restored afterwards."""

from __future__ import annotations

import json

import pytest

import probe.engine.data
import probe.engine.train
import studies.study.worker
from probe.bench.engine import synthetic_store
from studies.cli import main
from studies.study.bench import StudyBenchConfig, bench_study, format_study_bench

pytestmark = pytest.mark.usefixtures("one_thread")


def test_bench_study_report_and_restores_the_engine(tmp_path):
    store = synthetic_store(200, 8, 5, cache_dir=tmp_path, progress=False)
    real = (probe.engine.train.train_probe, probe.engine.data.ProbeData.__dict__["from_store"],
            studies.study.worker.write_batch)
    report = bench_study(StudyBenchConfig(store=str(store), n_trials=6, batch=3, epochs=3,
                                          batch_size=16))
    assert (probe.engine.train.train_probe, probe.engine.data.ProbeData.__dict__["from_store"],
            studies.study.worker.write_batch) == real
    assert report["finished_trials"] == report["complete"] + report["pruned"] >= 6
    assert report["engine_calls"] >= 2
    parts = report["seconds"]
    assert set(parts) == {"train", "eval", "optuna", "io", "setup"}
    assert all(v >= 0 for v in parts.values()) and parts["train"] > 0 and parts["eval"] > 0
    assert sum(parts.values()) == pytest.approx(report["wall_seconds"], rel=1e-6)
    assert report["trials_per_minute"] == pytest.approx(
        60 * report["finished_trials"] / report["wall_seconds"])
    text = format_study_bench(report)
    assert "trials/min" in text and "load average" in text
    # what the trials trained with is printed: given, or the generic setting (no preset here)
    assert (report["training"]["batch_size"], report["training"]["epochs"]) == (16, 3)
    assert "training: batch size 16 (as given)" in text and "generic" in text
    json.dumps(report)


@pytest.mark.parametrize("storage", ["journal", "sqlite"])
def test_bench_study_cli(tmp_path, capsys, storage):
    store = synthetic_store(200, 8, 5, cache_dir=tmp_path, progress=False)
    out = tmp_path / "b.json"
    assert main(["bench", "study", "--store", str(store), "--trials", "3", "--trials-at-once", "3",
                 "--epochs", "2", "--batch-size", "16", "--storage", storage,
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["finished_trials"] >= 3 and report["config"]["storage"] == storage
    assert "where the time went" in capsys.readouterr().out
    with pytest.raises(ValueError, match="storage must be 'journal' or 'sqlite'"):
        StudyBenchConfig(store=str(store), storage="redis").validate()
