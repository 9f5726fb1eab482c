"""``spml bench replicates``: one trial over seeds (a confirmation) and over draws (a draws:N
study), stacked and one run each, on a COCO-shaped store named coco. The stacked heads must
equal the one-run-each heads (the bench never buys its ratio with another result); wall times
are reported, never asserted."""

from __future__ import annotations

import json

import pytest

from probe.errors import SpmlError
from studies.cli import main
from studies.study.bench import ReplicatesBenchConfig, bench_replicates, format_replicates_bench


def test_the_bench_trains_every_mode_and_the_heads_agree(tmp_path):
    report = bench_replicates(ReplicatesBenchConfig(loss="role", rows=64, seeds=2, draws=3,
                                                    folds=3, epochs=2, cache_dir=str(tmp_path)))
    assert set(report["seconds"]) == {"one run", "seeds stacked", "seeds one run each",
                                      "draws stacked", "draws one run each", "folds stacked",
                                      "folds one run each"}
    assert all(s > 0 for s in report["seconds"].values())
    # the same heads within float rounding (test mAP in points)
    assert report["max_test_map_difference"] <= 1e-3
    s = report["seconds"]
    assert report["stacked_over_one"]["draws"] == s["draws stacked"] / s["one run"]
    assert report["each_over_stacked"]["seeds"] == s["seeds one run each"] / s["seeds stacked"]
    assert all(f > 0 for f in report["floor_seconds"].values())
    f = report["floor_seconds"]  # the least: one run's non-arithmetic shared, plus the floor
    least = (max(s["one run"] - f["one run"], 0.0) + f["seeds stacked"]) / s["one run"]
    assert report["least_over_one"]["seeds"] == pytest.approx(least, rel=1e-12)
    assert set(report["least_over_one"]) == {"seeds", "draws", "folds"}
    assert report["training"]["epochs"] == 2
    assert report["folds_in_one_run"]  # the pool re-split into folds of one train size
    from probe.store import open_store

    assert open_store(report["store"]).dataset == "coco"  # so the COCO paper presets apply
    text = format_replicates_bench(report)
    assert "2 seeds (spml study confirm)" in text and "3 draws (--select draws:3)" in text
    assert "3 folds (--select cv:3)" in text


@pytest.mark.parametrize(("field", "value", "flag"), [("seeds", 1, "--seeds"),
                                                      ("draws", 0, "--draws"),
                                                      ("folds", 1, "--folds"),
                                                      ("rows", 10, "--rows"),
                                                      ("loss", "nope", "--loss"),
                                                      ("epochs", 0, "--epochs")])
def test_bad_settings_are_refused_by_flag(field, value, flag):
    with pytest.raises(SpmlError, match=flag):
        ReplicatesBenchConfig(**{field: value}).validate()


def test_the_cli_prints_the_report_and_writes_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "replicates", "--rows", "64", "--seeds", "2", "--draws", "2",
                 "--folds", "2", "--epochs", "1", "--cache-dir", str(tmp_path), "--json", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "stacked / one" in printed and "floor" in printed and "least / one" in printed
    assert json.loads(out.read_text())["seeds"] == 2
