"""``spml bench table``: the table stacked and with one run per cell on a COCO-shaped store
named coco; the two tables' cells must agree (the bench never buys its ratio with another
result). Wall times are reported, never asserted."""

from __future__ import annotations

import json

import pytest

from probe.errors import SpmlError
from studies.cli import main
from studies.table.bench import TableBenchConfig, bench_table, format_table_bench


def test_the_bench_builds_both_tables_on_a_store_named_coco(tmp_path):
    report = bench_table(TableBenchConfig(rows=64, losses=("an", "role"), draws=2, epochs=2,
                                          cache_dir=str(tmp_path)))
    assert report["cells"] == 4 and report["trained"] == 4  # 2 rows x 2 draws, every one trained
    assert report["draws"] == [1200, 1]
    # the same cells within float rounding (test mAP in points)
    assert report["max_test_map_difference"] <= 1e-3
    assert set(report["seconds"]) == {"stacked", "one run per cell"}
    assert all(s > 0 for s in report["seconds"].values())
    from probe.store import open_store

    assert open_store(report["store"]).dataset == "coco"  # so the COCO paper presets apply
    text = format_table_bench(report)
    assert "a COCO-shaped store named coco" in text and "faster stacked" in text


def test_the_cli_prints_the_report_and_writes_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "table", "--rows", "64", "--losses", "an", "--draws", "2",
                 "--epochs", "1", "--cache-dir", str(tmp_path), "--json", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "one run per cell (--no-stack)" in printed
    assert json.loads(out.read_text())["cells"] == 2


@pytest.mark.parametrize(("changes", "flag"), [({"rows": 10}, "--rows"), ({"draws": 1}, "--draws"),
                                               ({"store": "voc"}, "--store"),
                                               ({"losses": ()}, "--losses")])
def test_bad_settings_are_refused_by_name(changes, flag):
    with pytest.raises(SpmlError, match=flag):
        TableBenchConfig(**changes).validate()


def test_the_yeast_bench_reads_the_real_set(tmp_path, yeast_store):
    import shutil

    shutil.copytree(yeast_store, tmp_path / "bench-yeast.zarr")  # the bench cache's copy
    report = bench_table(TableBenchConfig(store="yeast", losses=("an",), draws=2, epochs=1,
                                          cache_dir=str(tmp_path)))
    assert report["rows"] == 2417 and report["cells"] == 2
    assert report["max_test_map_difference"] <= 1e-3
    assert "the yeast set (2,417 rows)" in format_table_bench(report)
