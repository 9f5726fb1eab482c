"""One tidy results schema and ``spml export``: probe runs, study batches of different losses and
confirmations concatenate into one table (CSV or Parquet), one row per trial or per epoch."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from probe import ProbeConfig, train_probe
from probe.engine.data import ProbeData
from studies.cli import main
from studies.results.export import ExportError, collect, export
from studies.results.rows import COLUMNS, probe_rows, read_results, write_batch

pytestmark = pytest.mark.usefixtures("one_thread")


def _data() -> ProbeData:
    rng = np.random.default_rng(0)
    proto = rng.normal(size=(4, 6))
    parts = []
    for n in (40, 20, 24):
        y = np.zeros((n, 4), dtype=np.uint8)
        for i in range(n):
            y[i, rng.choice(4, size=rng.integers(1, 3), replace=False)] = 1
        parts.append(((y @ proto + 0.5 * rng.normal(size=(n, 6))).astype(np.float16), y))
    return ProbeData.from_arrays(*parts)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A probe JSON (an, 2 trials, 3 epochs) and two study results folders of different losses
    (gr: 2 parameters, an_ls: 1), written through the study's own row builder."""
    root = tmp_path_factory.mktemp("runs")
    data = _data()
    cfg = ProbeConfig(epochs=3, batch_size=8, lr=1e-2)
    an = train_probe(data, cfg, "an", [{}, {"lr": 1e-3}])
    an.write_json(root / "an.json")
    for loss, hps in (("gr", [{"w_T": 2.0, "b_T": -4.0}, {"w_T": 6.0, "b_T": -2.0}]),
                      ("an_ls", [{"eps": 0.1}, {"eps": 0.2}, {"eps": 0.3}])):
        result = train_probe(data, cfg, loss, hps)
        rows = probe_rows(result.to_dict(), kind="study", study=f"s-{loss}",
                          numbers=range(len(hps)),
                          params=[{f"{loss}.{k}": v for k, v in h.items()} for h in hps])
        write_batch(root / loss / "results", rows)
    return root


def test_probe_rows_are_tidy_in_percent_and_count_epochs_from_1(runs):
    record = json.loads((runs / "an.json").read_text())
    assert record["spml_version"]  # every JSON record says which version wrote it
    rows = probe_rows(record)
    assert [r["trial"] for r in rows] == [0, 1]
    for r, tr in zip(rows, record["trials"]):
        assert 1 <= r["best_epoch"] <= 3 and r["epochs_run"] == 3
        assert [e["epoch"] for e in tr["epochs"]] == [1, 2, 3]
        # one scale: the per-class AP averages to the mAP (both percent)
        assert np.mean(r["class_ap"]) == pytest.approx(r["test_map"], rel=1e-5)
        assert r["batch_size"] == 8 and r["epochs"] == 3 and r["optimizer"] == "adam"
    assert [r["lr"] for r in rows] == [pytest.approx(1e-2), pytest.approx(1e-3)]


def test_study_batches_of_different_losses_concatenate(runs):
    files = sorted(runs.glob("*/results/*.parquet"))
    assert len(files) == 2
    # the glob the issue tried: one schema, whatever the loss's parameters
    frame = pl.concat([pl.read_parquet(f) for f in files])
    assert frame.height == 5 and set(frame["loss"]) == {"gr", "an_ls"}
    assert not [c for c in frame.columns if c.startswith("param.")]
    assert list(frame.columns)[: len(COLUMNS)] == list(COLUMNS)
    assert {"lr", "batch_size", "epochs"} <= set(frame.columns)
    assert frame["lr"].null_count() == 0 and set(frame["epochs"]) == {3}


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_export_cli_writes_one_row_per_trial(runs, tmp_path, suffix, capsys):
    out = tmp_path / f"all.{suffix}"
    code = main(["export", str(runs / "gr"), str(runs / "an_ls"), str(runs / "an.json"),
                 "--out", str(out)])
    assert code == 0
    assert f"wrote {out}: 7 rows" in capsys.readouterr().out
    frame = pl.read_csv(out) if suffix == "csv" else pl.read_parquet(out)
    assert frame.height == 7
    assert frame.group_by("kind").len().sort("kind").rows() == [("probe", 2), ("study", 5)]
    assert sorted(frame.filter(pl.col("loss") == "gr")["trial"].to_list()) == [0, 1]
    params = [json.loads(p) for p in frame.filter(pl.col("loss") == "gr")["params"]]
    assert {"gr.w_T", "gr.b_T"} == set(params[0])
    assert frame["lr"].null_count() == 0 and frame["batch_size"].null_count() == 0
    assert frame["best_epoch"].min() >= 1 and frame["best_epoch"].max() <= 3
    assert frame["source"].null_count() == 0


def test_export_per_epoch_and_the_python_function(runs, tmp_path):
    frame = collect([runs / "gr", runs / "an.json"], epochs=True)
    assert frame.height == (2 + 2) * 3
    assert sorted(set(frame["epoch"])) == [1, 2, 3]
    assert frame["epoch_val_map"].null_count() == 0
    one = frame.filter((pl.col("kind") == "probe") & (pl.col("trial") == 0)).sort("epoch")
    record = json.loads((runs / "an.json").read_text())
    assert one["epoch_val_map"].to_list() == pytest.approx(
        [e["val_map"] for e in record["trials"][0]["epochs"]])
    best = one.filter(pl.col("epoch") == one["best_epoch"][0])
    assert best["epoch_val_map"][0] == pytest.approx(one["val_map"][0])
    path, again = export([runs / "gr", runs / "an.json"], tmp_path / "e.parquet", epochs=True)
    assert pl.read_parquet(path).equals(again)


def test_export_errors_name_the_path_and_what_was_expected(runs, tmp_path):
    with pytest.raises(ExportError, match=r"PATH .*nope: no such file"):
        collect([tmp_path / "nope"])
    (tmp_path / "x.json").write_text('{"a": 1}')
    with pytest.raises(ExportError, match=r"not a probe results record"):
        collect([tmp_path / "x.json"])
    with pytest.raises(ExportError, match=r"--out: expected a file name ending in \.csv"):
        export([runs / "gr"], tmp_path / "out.xlsx")
    assert main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "a.csv")]) == 2
    assert not (tmp_path / "a.csv").exists()


def test_batches_written_before_the_tidy_schema_are_upgraded(tmp_path):
    """spml-results/1: val_map a per-epoch list, best epoch from 0, AP on 0-1, param.<name>."""
    old = pl.DataFrame([{"study": "s", "trial": 0, "state": "COMPLETE", "loss": "gr",
                         "params": '{"gr.w_T": 2.0}', "value": 60.0, "best_epoch": 2,
                         "test_map": 55.0, "val_map": [50.0, 58.0, 60.0],
                         "class_ap": [0.5, 0.6], "param.gr.w_T": 2.0}])
    (tmp_path / "results").mkdir()
    old.write_parquet(tmp_path / "results" / "batch-old.parquet")
    row = read_results(tmp_path / "results").row(0, named=True)
    assert row["best_epoch"] == 3 and row["val_map"] == 60.0
    assert row["val_map_per_epoch"] == [50.0, 58.0, 60.0]
    assert row["class_ap"] == pytest.approx([50.0, 60.0])
    assert "param.gr.w_T" not in row


def test_extra_metric_columns_slot_in(runs):
    """A record with interval bounds (test_map_low/high) concatenates with one without."""
    record = json.loads((runs / "an.json").read_text())
    for tr in record["trials"]:
        tr["best"].update(test_map_low=tr["best"]["test_map"] - 1.0,
                          test_map_high=tr["best"]["test_map"] + 1.0)
    with_iv = pl.DataFrame(probe_rows(record))
    assert {"test_map_low", "test_map_high"} <= set(with_iv.columns)
    both = pl.concat([collect([runs / "gr"]), collect([runs / "an.json"]),
                      with_iv.select([c for c in with_iv.columns if c in COLUMNS
                                      or c.startswith("test_map_")])], how="diagonal_relaxed")
    assert both.height == 2 + 2 + 2 and both["test_map_low"].null_count() == 4
