"""spml study confirm --refit: the winner re-trained on train + val before testing."""

from __future__ import annotations

import pytest

from studies.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_confirm_refit_trains_the_winner_on_train_plus_val(yeast_store, tmp_path, capsys):
    """spml study confirm --refit: the winner re-trained on train + val for the median best
    epoch, one test mAP per seed and draw, in the table, confirm.parquet and best.json."""
    import json

    import polars as pl

    out = tmp_path / "s"
    assert main(["study", yeast_store, "--loss", "an_ls", "--trials", "2", "--trials-at-once", "2",
                 "--epochs", "3", "--batch-size", "32", "--lr", "0.01", "--device", "cpu",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["study", "confirm", "--storage", str(out / "study.log"), "--store", yeast_store,
                 "--top-k", "2", "--seeds", "0,1", "--out", str(out), "--refit",
                 "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "refit: trial" in printed and "train + val" in printed
    best = json.loads((out / "best.json").read_text())["confirmed"]["refit"]
    assert 1 <= best["epochs"] <= 3 and len(best["test_maps"]) == 2
    assert all(20 < v < 100 for v in best["test_maps"])
    assert best["test_low"] <= best["test_mean"] <= best["test_high"]
    frame = pl.read_parquet(out / "confirm.parquet").sort("rank")
    assert frame["refit_epochs"][0] == best["epochs"] and frame["refit_epochs"][1] is None
    from studies.report import ReportOptions, build_report

    html = build_report(out, options=ReportOptions(baseline=False)).html_path.read_text()
    assert f"re-trained on train + val for {best['epochs']} epochs" in html


def test_train_plus_val_appends_val_rows(yeast_store):
    from probe.engine.data import ProbeData
    from probe.store import open_store
    from studies.results.confirm import train_plus_val

    store = open_store(yeast_store)
    data = ProbeData.from_store(store, device="cpu")
    both = train_plus_val(data, store)
    n, v = data.n_train, data.val_x.shape[0]
    assert both.n_train == n + v
    assert both.train_x.shape[0] == (2 if data.has_flip else 1) * (n + v)
    assert (both.train_x[n: n + v] == data.val_x).all()
    assert (both.train_observed[n:] == data.val_observed).all()
    assert (both.train_labels[n:] == data.val_labels).all()
