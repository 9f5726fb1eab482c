"""``spml bench probe --loss NAME`` (no timing assertions): any registered loss on the engine
rows, a synthetic prior written once into the bench store for a loss that reads one."""

from __future__ import annotations

import json

import pytest

from probe.bench.engine import BenchConfig, run_bench, synthetic_store
from probe.bench.prior import synthetic_prior
from probe.store import open_store
from studies.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(("loss", "prior"), [
    ("gpr", "bench-tile_max-tile_mean-tile_min"), ("vlpl", "bench"), ("em", None)])
def test_bench_times_the_named_loss(tmp_path, loss, prior):
    cfg = BenchConfig(n_train=96, dim=8, n_classes=6, epochs=1, trials=(1, 2), loss=loss,
                      cache_dir=str(tmp_path), isolate=False)
    report = run_bench(cfg, progress=False)
    rows = [(r["method"], r["trials"]) for r in report["rows"]]
    assert rows == [("engine", 1), ("engine", 2)]  # the plain / papers loops time GR only
    assert f"stacked {loss.upper()} trial" in report["rows"][0]["name"]
    assert report["store"]["prior"] == prior
    if prior is not None:
        store = open_store(report["store"]["path"])
        got = store.prior(prior)
        assert got.scores.shape == (store.n_rows, 6)
        assert abs(got.scores.sum(1) - 1).max() < 1e-4  # a softmax over the classes
        if loss == "gpr":
            assert (got.extras["tile_max"] >= got.extras["tile_mean"]).all()
            assert (got.extras["tile_mean"] >= got.extras["tile_min"]).all()


def test_the_synthetic_prior_is_written_once(tmp_path):
    path = synthetic_store(64, 4, 5, cache_dir=tmp_path, progress=False)
    assert synthetic_prior(path, ()) == "bench"
    mtime = (path / "zarr.json").stat().st_mtime_ns
    assert synthetic_prior(path, ()) == "bench"
    assert (path / "zarr.json").stat().st_mtime_ns == mtime


def test_bench_cli_refuses_an_unknown_loss(tmp_path, capsys):
    assert main(["bench", "probe", "--loss", "nope", "--rows", "64", "--cache-dir",
                 str(tmp_path)]) == 2
    assert "--loss nope is not a registered loss" in capsys.readouterr().err
    out = tmp_path / "b.json"
    assert main(["bench", "probe", "--loss", "vlpl", "--rows", "64", "--dim", "8", "--classes",
                 "4", "--epochs", "1", "--trials", "1", "--cache-dir", str(tmp_path), "--json",
                 str(out), "--quiet", "--in-process"]) == 0
    assert json.loads(out.read_text())["config"]["loss"] == "vlpl"
