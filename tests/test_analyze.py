"""``spml analyze`` (studies.analyses, studies.cli.analyze): the GR paper's analyses.

Numbers against hand-made cases and closed forms (Wasserstein-1 vs scipy and exact shifts,
confidence buckets, the entry loss/gradient curves of AN, Hill and GR Eq. 18), then every
analysis end to end on the real MULAN yeast store (a few epochs each), checked against direct
runs of the probe engine, and the CLI with its errors.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch
from PIL import Image

import studies.analyses as A
import studies.analyses.common as analyses_common
import studies.analyses.figures as F
from probe import ProbeConfig, train_probe
from probe.engine.data import ProbeData
from probe.engine.loop import init_head
from probe.evaluation.intervals import head_intervals, mean_interval
from studies.cli.analyze import register_cli as register_analyze_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FAST = dict(epochs=2, batch_size=64, lr=1e-3)  # a few hundred steps on yeast: well under 1 s


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def store(yeast_store):
    return Path(yeast_store)


@pytest.fixture(scope="module")
def yeast(store):
    return ProbeData.from_store(store)


def _png(path) -> np.ndarray:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    img = np.asarray(Image.open(path).convert("RGB"))
    assert img.std() > 15 and img.shape[0] > 300 and img.shape[1] > 600
    return img


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# --------------------------------------------------------------------------------------------
# Wasserstein-1
# --------------------------------------------------------------------------------------------


def test_wasserstein_identical_is_zero_and_shift_is_its_size():
    rng = np.random.default_rng(0)
    u = rng.random(500)
    assert A.wasserstein_1d(u, u) == 0.0
    assert A.wasserstein_1d(u, rng.permutation(u)) == 0.0
    for c in (0.3, -1.7, 5.0):
        assert A.wasserstein_1d(u, u + c) == pytest.approx(abs(c), rel=1e-12)
    # two point masses: the distance between them
    assert A.wasserstein_1d([0.2], [0.9]) == pytest.approx(0.7)
    # half the mass moved by 1
    assert A.wasserstein_1d([0.0, 1.0], [1.0, 1.0]) == pytest.approx(0.5)


@pytest.mark.parametrize("n,m", [(1, 7), (50, 50), (333, 1000)])
def test_wasserstein_matches_scipy(n, m):
    rng = np.random.default_rng(n + m)
    u = rng.normal(size=n)
    v = rng.gamma(2.0, size=m)
    want = scipy.stats.wasserstein_distance(u, v)
    assert A.wasserstein_1d(u, v) == pytest.approx(want, rel=1e-10, abs=1e-12)
    assert A.wasserstein_1d(torch.tensor(u, dtype=torch.float32),
                            torch.tensor(v, dtype=torch.float32)) == pytest.approx(want, rel=1e-5)
    # ties
    a, b = rng.integers(0, 4, size=n).astype(float), rng.integers(0, 4, size=m).astype(float)
    assert A.wasserstein_1d(a, b) == pytest.approx(scipy.stats.wasserstein_distance(a, b))


def test_wasserstein_errors():
    with pytest.raises(A.AnalyzeError, match="non-empty"):
        A.wasserstein_1d([], [1.0])
    with pytest.raises(A.AnalyzeError, match="NaN"):
        A.wasserstein_1d([math.nan], [1.0])


# --------------------------------------------------------------------------------------------
# confidence buckets and curves
# --------------------------------------------------------------------------------------------


def test_bucket_rates_hand_made():
    p = [0.05, 0.05, 0.0, 0.15, 0.95, 1.0, 0.999, 0.5]
    y = [1, 0, 0, 0, 1, 1, 0, 1]
    s = A.bucket_rates(p, y, n_buckets=10)
    assert s.counts.tolist() == [3, 1, 0, 0, 0, 1, 0, 0, 0, 3]
    assert s.positives.tolist() == [1, 0, 0, 0, 0, 1, 0, 0, 0, 2]
    assert s.rate[0] == pytest.approx(1 / 3)
    assert s.rate[1] == 0.0 and s.rate[5] == 1.0
    assert s.rate[9] == pytest.approx(2 / 3)  # p = 1.0 falls into the last, closed bucket
    assert np.isnan(s.rate[[2, 3, 4, 6, 7, 8]]).all()
    assert s.mean_p[0] == pytest.approx(0.1 / 3)
    assert s.mean_p[9] == pytest.approx((0.95 + 1.0 + 0.999) / 3)
    assert s.edges.tolist() == pytest.approx([i / 10 for i in range(11)])
    assert A.bucket_rates(torch.tensor(p), torch.tensor(y).bool(), 10).counts.tolist() == \
        s.counts.tolist()
    d = s.to_dict()
    assert d["rate"][2] is None and d["counts"][0] == 3
    json.dumps(d)


def test_bucket_rates_errors():
    with pytest.raises(A.AnalyzeError, match=r"\[0, 1\]"):
        A.bucket_rates([1.2], [1])
    with pytest.raises(A.AnalyzeError, match="2 values but truth has 1"):
        A.bucket_rates([0.1, 0.2], [1])
    with pytest.raises(A.AnalyzeError, match="positive integer"):
        A.bucket_rates([0.1], [1], n_buckets=0)


def test_k_hat_and_eq6_curves():
    assert A.k_hat_curve(0.3, 0.0, -2.0) == pytest.approx(_sigmoid(-2.0))
    assert A.k_hat_curve(0.8, 10.0, -8.0) == pytest.approx(0.5)  # τ = −b/w
    p = np.linspace(0, 1, 11)
    assert A.scar_curve(p, 1.0) == pytest.approx(np.zeros(11))  # every positive observed
    a = 1 / 2.94  # COCO in Fig. 5d
    assert A.scar_curve(p, a) == pytest.approx((1 - a) * p / (1 - a * p))
    assert A.scar_curve(1.0, a) == pytest.approx(1.0)
    with pytest.raises(A.AnalyzeError, match="a = P"):
        A.scar_curve(p, 0.0)


def _curve(result, label):
    (c,) = [c for c in result.curves if c["label"] == label]
    return {k: np.asarray(c[k]) for k in ("loss_y0", "grad_y0", "loss_y1", "grad_y1")}


def test_curves_closed_forms_an_and_hill():
    r = A.loss_curves(["an", "hill"], points=101)
    p = np.asarray(r.p)
    assert p.min() > 0 and p.max() < 1 and len(p) == 101
    an = _curve(r, "an")
    np.testing.assert_allclose(an["loss_y0"], -np.log(1 - p), rtol=1e-9)
    np.testing.assert_allclose(an["grad_y0"], p, rtol=1e-9)
    np.testing.assert_allclose(an["loss_y1"], -np.log(p), rtol=1e-9)
    np.testing.assert_allclose(an["grad_y1"], -(1 - p), rtol=1e-9)
    hill = _curve(r, "hill")  # λ = 1.5: GR paper Eq. 33
    np.testing.assert_allclose(hill["loss_y0"], (1.5 - p) * p**2, rtol=1e-9)
    np.testing.assert_allclose(hill["grad_y0"], 3 * p**2 * (1 - p) ** 2, rtol=1e-8, atol=1e-14)
    assert [c["epochs"] for c in r.curves] == [[1, 8], [1, 8]]  # no schedule: drawn once


def test_curves_gr_eq18_at_the_schedule_ends():
    """∂ℓ/∂z on y=0 = v·[(1−k̂)(1−p)^q3·p − k̂·p^q2·(1−p)] (Eq. 18; v, k̂ under stop-gradient),
    with (w, b, μ, σ) at the start (0, −2, 0.5, 2) and the final (10, −8, 0.8, 0.5) values."""
    r = A.loss_curves(["gr"], {"gr": {"q3": [1.0, 0.5]}}, n_epochs=5, at=[1, 3, 5])
    p = np.asarray(r.p)
    assert [c["label"] for c in r.curves] == [
        f"gr q3={q:g} @ epoch {e}" for q in (1.0, 0.5) for e in (1, 3, 5)]
    for q3 in (1.0, 0.5):
        for e, (w, b, mu, sigma) in ((1, (0, -2, 0.5, 2)), (3, (5, -5, 0.65, 1.25)),
                                     (5, (10, -8, 0.8, 0.5))):
            c = _curve(r, f"gr q3={q3:g} @ epoch {e}")
            k = _sigmoid(w * p + b)
            v = np.exp(-((p - mu) ** 2) / (2 * sigma**2))
            q2 = 0.01
            grad = v * ((1 - k) * (1 - p) ** q3 * p - k * p**q2 * (1 - p))
            loss = v * (k * (1 - p**q2) / q2 + (1 - k) * (1 - (1 - p) ** q3) / q3)
            np.testing.assert_allclose(c["grad_y0"], grad, rtol=1e-7, atol=1e-12)
            np.testing.assert_allclose(c["loss_y0"], loss, rtol=1e-7)
            np.testing.assert_allclose(c["grad_y1"], -(p**0.01) * (1 - p), rtol=1e-7)
    # Fig. 1b's point: early on k̂ ≈ 0.12 makes the gradient negative for small p
    early = _curve(r, "gr q3=1 @ epoch 1")["grad_y0"]
    assert early[0] < 0 < early[len(p) // 2]


def test_curves_refuse_losses_that_are_not_entrywise():
    with pytest.raises(A.AnalyzeError, match="per-example state"):
        A.loss_curves(["role"])
    with pytest.raises(A.AnalyzeError, match="other entries of the batch"):
        A.loss_curves(["vpu"])
    with pytest.raises(A.AnalyzeError, match="other classes of its sample"):
        A.loss_curves(["zlpr"])
    with pytest.raises(A.AnalyzeError, match=r"epr\.k=VALUE"):
        A.loss_curves(["epr"])
    with pytest.raises(A.AnalyzeError, match="ll_r at epoch 8"):
        A.loss_curves(["ll_r"])
    assert A.loss_curves(["ll_r"], at=[1]).curves[0]["label"] == "ll_r"  # epoch 1 = AN
    with pytest.raises(ValueError, match="did you mean 'gr'"):
        A.loss_curves(["grr"])
    with pytest.raises(ValueError, match="did you mean 'w_T'"):
        A.loss_curves(["gr"], {"gr": {"wT": 1.0}})
    with pytest.raises(A.AnalyzeError, match="counted from 1"):
        A.loss_curves(["gr"], at=[0])
    with pytest.raises(A.AnalyzeError, match="not among the losses"):
        A.loss_curves(["an"], {"gr": {"q3": 1.0}})


# --------------------------------------------------------------------------------------------
# sweeps
# --------------------------------------------------------------------------------------------


def test_sweep_points_and_range_errors():
    pts = A.sweep_points("tau", [0.5, 1.0], [-2.0, -8.0])
    assert [p["hparams"] for p in pts] == [{"w_T": 4.0, "b_T": -2.0}, {"w_T": 2.0, "b_T": -2.0},
                                           {"w_T": 16.0, "b_T": -8.0}, {"w_T": 8.0, "b_T": -8.0}]
    for p in pts:  # τ = −b/w
        assert -p["hparams"]["b_T"] / p["hparams"]["w_T"] == pytest.approx(p["x"])
    assert len(A.sweep_points("mu")) == 9 * 3 and len(A.sweep_points("q2q3")) == 4 * 5
    bad = [("tau", [0.0], None, "τ = −b_T/w_T must be > 0"),
           ("tau", None, [1.0], "b_T must be < 0"),
           ("mu", [1.2], None, "μ_T is the centre"),
           ("mu", None, [0.0], "σ_T"),
           ("q2q3", [-0.1], None, "q must be >= 0"),
           ("tau", [0.5, 0.5], None, "repeat"),
           ("tau", [], None, "at least one"),
           ("sigma", None, None, "--param must be one of")]
    for param, values, series, msg in bad:
        with pytest.raises(A.AnalyzeError, match=msg):
            A.sweep_points(param, values, series)


# --------------------------------------------------------------------------------------------
# the analyses on the real yeast store
# --------------------------------------------------------------------------------------------


def _count_runs(monkeypatch):
    """Wrap studies.analyses.common.train_probe to record (loss, stacked trials) per run."""
    calls = []

    def counting(data, config, loss, hparams, **kw):
        calls.append((loss, len(hparams), config.seeds))
        return train_probe(data, config, loss, hparams, **kw)

    monkeypatch.setattr(analyses_common, "train_probe", counting)
    return calls


def test_ablation_rows_switches_and_direct_runs(yeast, tmp_path, monkeypatch):
    calls = _count_runs(monkeypatch)
    cfg = ProbeConfig(seeds=(0, 1), **FAST)
    r = A.run_ablation(yeast, cfg, {"q3": 1.5})
    assert [row["name"] for row in r.rows] == [row.name for row in A.ABLATION_ROWS]
    assert len(calls) == 9 and all(n == 2 and seeds == (0, 1) for _, n, seeds in calls)
    assert calls[0][0] == "gr"  # the reference row first: its settings are pinned
    for row, spec in zip(r.rows, A.ABLATION_ROWS):
        assert row["loss"] == spec.loss and row["marks"] == list(spec.marks)
        assert len(row["val_maps"]) == 2 and len(row["best_epochs"]) == 2
        if spec.loss == "gr":
            assert row["hparams"]["q3"] == 1.5
            for key in ("use_k", "use_v", "robust"):
                assert row["hparams"][key] == spec.switches[key]
            assert row["hparams"]["learn_kv"] == spec.switches.get("learn_kv", False)
        mean, std = row["test_mean"], row["test_std"]
        assert mean == pytest.approx(np.mean(row["test_maps"]))
        assert std == pytest.approx(np.std(row["test_maps"], ddof=1))
    assert r.settings["batch_size"] == 64 and r.settings["epochs"] == 2
    # a row equals the engine run directly with the same settings
    direct = train_probe(yeast, cfg, "gr", [{"use_k": True, "use_v": False, "robust": True,
                                             "q3": 1.5}] * 2)
    (row,) = [row for row in r.rows if row["name"] == "k̂ + L"]
    assert row["val_maps"] == [t.best["val_map"] for t in direct.trials]
    assert row["test_maps"] == [t.best["test_map"] for t in direct.trials]
    an = train_probe(yeast, cfg, "an", [{}] * 2)
    assert r.rows[0]["test_maps"] == [t.best["test_map"] for t in an.trials]

    paths = F.write_outputs(r, tmp_path)
    assert [p.name for p in paths] == ["ablation.json", "ablation.md", "ablation.png"]
    data = json.loads(paths[0].read_text())
    assert data["rows"][7]["name"] == "GR (k̂ + v + L)" and data["settings"]["seeds"] == [0, 1]
    md = paths[1].read_text()
    assert "| row | k̂ | v | L | loss | val mAP | test mAP | 95% interval | best epoch |" in md
    assert f"{r.rows[0]['test_mean']:.2f} ± {r.rows[0]['test_std']:.2f}" in md
    # two seeds: the interval of the mean over them (Student t), around the mean
    iv = mean_interval(r.rows[0]["test_maps"])
    assert (r.rows[0]["test_low"], r.rows[0]["test_high"]) == (iv.low, iv.high)
    assert iv.low < r.rows[0]["test_mean"] < iv.high
    assert f"[{iv.low:.2f}, {iv.high:.2f}]" in md and "Student t" in md
    assert "![ablation](ablation.png)" in md
    _png(paths[2])
    with pytest.raises(A.AnalyzeError, match="sets the switches"):
        A.run_ablation(yeast, cfg, {"use_v": False})


def test_sensitivity_trains_one_stacked_run(yeast, tmp_path, monkeypatch):
    calls = _count_runs(monkeypatch)
    cfg = ProbeConfig(**FAST)
    r = A.run_sensitivity(yeast, cfg, "tau", values=[0.5, 1.0], series=[-2.0, -5.0])
    assert calls == [("gr", 4, (0, 0, 0, 0)), ("an", 1, (0,))]
    assert [(p["series"], p["x"], p["hparams"]["w_T"]) for p in r.points] == [
        (-2.0, 0.5, 4.0), (-2.0, 1.0, 2.0), (-5.0, 0.5, 10.0), (-5.0, 1.0, 5.0)]
    # stacked = one run per point (the engine's semantics), to float tolerance
    one = train_probe(yeast, cfg, "gr", [{"w_T": 10.0, "b_T": -5.0}])
    assert r.points[2]["val_mean"] == pytest.approx(one.trials[0].best["val_map"], abs=1e-3)
    assert r.baseline is not None and math.isfinite(r.baseline["test_mean"])
    paths = F.write_outputs(r, tmp_path)
    assert [p.name for p in paths] == ["sensitivity_tau.json", "sensitivity_tau.md",
                                       "sensitivity_tau.png"]
    _png(paths[2])
    md = paths[1].read_text()
    assert "| b_T | tau | w_T | val mAP | test mAP | 95% interval |" in md
    assert "| AN baseline |" in md and "paired bootstrap" in md
    # one seed: each point's interval over the test images, from its own head
    boot = head_intervals(yeast.test_x, yeast.test_labels, one.best_heads)
    p = r.points[2]
    assert p["test_low"] < p["test_mean"] < p["test_high"]
    assert p["test_low"] == pytest.approx(boot.intervals[0].low, abs=0.05)
    assert p["test_high"] == pytest.approx(boot.intervals[0].high, abs=0.05)

    calls.clear()
    grid = A.run_sensitivity(yeast, replace_seeds(cfg, (3, 4)), "q2q3", values=[0.01, 0.5],
                             series=[0.5, 1.0], baseline=False)
    assert calls == [("gr", 8, (3, 4) * 4)]
    assert all(len(p["val_maps"]) == 2 for p in grid.points)
    _png(F.write_outputs(grid, tmp_path)[2])
    with pytest.raises(A.AnalyzeError, match="sets w_T and b_T itself"):
        A.run_sensitivity(yeast, cfg, "tau", hparams={"w_T": 3.0})
    with pytest.raises(A.AnalyzeError, match="use_v=False makes unused"):
        A.run_sensitivity(yeast, cfg, "mu", hparams={"use_v": False})


def replace_seeds(cfg: ProbeConfig, seeds) -> ProbeConfig:
    from dataclasses import replace

    return replace(cfg, seeds=tuple(seeds))


def _unannotated_p(data: ProbeData, heads: torch.Tensor):
    x = data.train_x[: data.n_train].float()
    mask = data.train_observed == 0
    truth = data.train_labels.bool()[mask]
    ps = [torch.sigmoid(x @ heads[t])[mask] for t in range(heads.shape[0])]
    return ps, truth


def test_calibration_buckets_against_the_engine(yeast, tmp_path):
    cfg = ProbeConfig(seeds=(0, 1), **FAST)
    r = A.run_calibration(yeast, cfg, "gr", n_buckets=20)
    mask = yeast.train_observed == 0
    n_unann = int(mask.sum())
    fn = int((mask & yeast.train_labels.bool()).sum())
    assert r.fn_rate == pytest.approx(fn / n_unann)
    for stats in (r.before, r.after):  # seeds pooled
        assert stats.counts.sum() == 2 * n_unann and stats.positives.sum() == 2 * fn
    # before training: the engine's initial heads; after: its final heads
    init = torch.stack([torch.cat([w.T, b[None]]) for w, b in
                        (init_head(s, yeast.feature_dim, yeast.n_classes) for s in (0, 1))])
    for heads, stats in ((init, r.before),
                         (train_probe(yeast, cfg, "gr", [{}] * 2).final_heads, r.after)):
        ps, truth = _unannotated_p(yeast, heads)
        want = A.bucket_rates(torch.cat(ps), torch.cat([truth, truth]), 20)
        assert stats.counts.tolist() == want.counts.tolist()
        np.testing.assert_allclose(stats.rate, want.rate, equal_nan=True)
    assert r.k_start == (0.0, -2.0) and r.k_final == (10.0, -8.0)  # GR defaults (no preset)
    observed = int((yeast.train_observed == 1).sum())
    assert r.a == pytest.approx(observed / int(yeast.train_labels.sum()))
    assert set(r.gaps) >= {"k̂ final", "k̂ start (before)"}
    paths = F.write_outputs(r, tmp_path)
    _png(paths[2])
    assert "FN rate before" in paths[1].read_text()
    an = A.run_calibration(yeast, ProbeConfig(**FAST), "an", n_buckets=10)
    assert an.k_start is None and an.k_final is None and math.isfinite(an.a)


def test_distinguish_w1_per_epoch_from_the_engine_heads(yeast, tmp_path):
    cfg = ProbeConfig(seeds=(0, 1), **FAST)
    r = A.run_distinguish(yeast, cfg, ["gr", "an"], hparams={"gr": {"w_T": 2.0}},
                          hist_epochs=[0, "best", "last"], bins=20)
    mask = yeast.train_observed == 0
    n_pos = int((mask & yeast.train_labels.bool()).sum())
    assert r.counts["positive"] == n_pos
    assert r.counts["negative"] == int(mask.sum()) - n_pos
    for res, name in zip(r.losses, ("gr", "an")):
        assert res["loss"] == name and res["epochs"] == [0, 1, 2]
        assert len(res["w1"]) == 3 and all(len(w) == 2 for w in res["w1"])
        for hp, hn in zip(res["hist_pos"], res["hist_neg"]):
            assert sum(hp) == 2 * n_pos and sum(hn) == 2 * r.counts["negative"]
        assert r.hist_epochs[name][0] == 0 and r.hist_epochs[name][-1] == 2
    assert r.losses[0]["hparams"]["w_T"] == 2.0
    # epoch 0 from the initial heads, the last epoch from the engine's final heads
    init = torch.stack([torch.cat([w.T, b[None]]) for w, b in
                        (init_head(s, yeast.feature_dim, yeast.n_classes) for s in (0, 1))])
    final = train_probe(yeast, cfg, "gr", [{"w_T": 2.0}] * 2).final_heads
    for e, heads in ((0, init), (2, final)):
        ps, truth = _unannotated_p(yeast, heads)
        want = [A.wasserstein_1d(p[truth], p[~truth]) for p in ps]
        assert r.losses[0]["w1"][e] == pytest.approx(want, rel=1e-6)
    paths = F.write_outputs(r, tmp_path)
    assert [p.name for p in paths] == ["distinguish.json", "distinguish.md", "distinguish.png",
                                       "distinguish_hist.png"]
    for p in paths[2:]:
        _png(p)
    md = paths[1].read_text()
    assert "| epoch | W1 gr | W1 an |" in md
    with pytest.raises(A.AnalyzeError, match=r"completed-epoch numbers 0\.\.2"):
        A.run_distinguish(yeast, ProbeConfig(**FAST), ["an"], hist_epochs=[5])


def test_store_without_full_labels_is_refused(tmp_path):
    """Labels that are only the single positives: no ground truth for unannotated entries."""
    from featurize.imports import import_arrays

    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 6)).astype(np.float32)
    y = np.zeros((120, 4), dtype=np.uint8)
    y[np.arange(120), rng.integers(0, 4, 120)] = 1
    path = tmp_path / "single.zarr"
    import_arrays(path, x, y, name="single", progress=False)
    data = ProbeData.from_store(path)
    for run in (lambda: A.run_calibration(data, ProbeConfig(**FAST)),
                lambda: A.run_distinguish(data, ProbeConfig(**FAST))):
        with pytest.raises(A.AnalyzeError, match="no full ground truth"):
            run()


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spml")
    register_analyze_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit):
        _run([*argv, "--help"])
    return capsys.readouterr().out


def test_cli_help_has_examples(capsys):
    assert "ablation" in _help(["analyze"], capsys)
    for name in ("ablation", "sensitivity", "distinguish", "calibration", "curves"):
        text = _help(["analyze", name], capsys)
        assert "examples:" in text and f"spml analyze {name}" in text
        assert "--out" in text


def test_cli_commands_write_outputs(store, tmp_path, capsys):
    train = ["--epochs", "2", "--batch-size", "64", "--lr", "1e-3", "--quiet"]
    s = str(store)
    assert _run(["analyze", "curves", "--loss", "an,gr", "--set", "gr.q3=0.5,1",
                 "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "gr q3=0.5 @ epoch 1" in out and "wrote" in out
    assert json.loads((tmp_path / "c" / "curves.json").read_text())["curves"][0]["loss"] == "an"
    assert _run(["analyze", "sensitivity", s, "--param", "mu", "--mu-T", "0.5,0.8",
                 "--sigma-T", "0.5", "--no-baseline", *train, "--out", str(tmp_path / "s")]) == 0
    assert "sigma_T" in capsys.readouterr().out
    assert (tmp_path / "s" / "sensitivity_mu.png").is_file()
    assert _run(["analyze", "calibration", s, "--buckets", "10", "--set", "w_T=4", *train,
                 "--out", str(tmp_path / "k")]) == 0
    data = json.loads((tmp_path / "k" / "calibration.json").read_text())
    assert data["k_final"] == [4.0, -8.0] and len(data["after"]["counts"]) == 10
    assert _run(["analyze", "sensitivity", s, "--param", "tau", "--tau", "1", "--b-T=-3",
                 "--no-baseline", *train, "--out", str(tmp_path / "t")]) == 0
    data = json.loads((tmp_path / "t" / "sensitivity_tau.json").read_text())
    assert data["points"][0]["hparams"] == {"w_T": 3.0, "b_T": -3.0}
    capsys.readouterr()
    assert _run(["analyze", "distinguish", s, "--loss", "an,gr", "--set", "q3=0.5",
                 "--hist-epochs", "0,last", "--bins", "10", "--seeds", "0,1", *train,
                 "--out", str(tmp_path / "d")]) == 0
    assert "| W1 an" not in capsys.readouterr().out  # the terminal table is not Markdown
    data = json.loads((tmp_path / "d" / "distinguish.json").read_text())
    assert [r["loss"] for r in data["losses"]] == ["an", "gr"]
    assert data["losses"][1]["hparams"]["q3"] == 0.5 and data["hist_epochs"]["an"] == [0, 2]
    assert len(data["losses"][0]["hist_pos"][0]) == 10 and data["settings"]["seeds"] == [0, 1]
    assert _run(["analyze", "ablation", s, "--set", "q2=0.1", *train,
                 "--out", str(tmp_path / "a")]) == 0
    assert "learned k̂, v + L" in capsys.readouterr().out
    rows = json.loads((tmp_path / "a" / "ablation.json").read_text())["rows"]
    assert all(r["hparams"]["q2"] == 0.1 for r in rows[1:]) and rows[0]["loss"] == "an"


def test_cli_errors_are_value_errors(store, tmp_path):
    s = str(store)
    cases = [
        (["analyze", "sensitivity", s, "--param", "tau", "--b-T=2"], "b_T must be < 0"),
        (["analyze", "sensitivity", s, "--param", "tau", "--q2", "0.1"], "another sweep"),
        (["analyze", "sensitivity", s, "--param", "mu", "--mu-T", "x"], "comma list of numbers"),
        (["analyze", "ablation", s, "--set", "robust=false"], "switches per row"),
        (["analyze", "ablation", s, "--set", "w_T=2,3"], "takes one value"),
        (["analyze", "calibration", s, "--loss", "gr,an"], "trains one loss"),
        (["analyze", "calibration", s, "--loss", "nope"], "unknown loss"),
        (["analyze", "distinguish", s, "--set", "zz=1"], "none of the losses"),
        (["analyze", "distinguish", s, "--set", "em.alpha=1"], "not among the losses"),
        (["analyze", "distinguish", s, "--hist-epochs", "first"], "--hist-epochs"),
        (["analyze", "distinguish", s, "--hist-epochs", "0,²"], "--hist-epochs"),  # not int()
        (["analyze", "ablation", s, "--seeds", "a"], "--seeds"),
        (["analyze", "ablation", s, "--epochs", "0"], "epochs"),
        (["analyze", "curves", "--loss", "role"], "per-example state"),
        (["analyze", "ablation", str(tmp_path / "missing.zarr")], "does not exist"),
    ]
    for argv, msg in cases:
        with pytest.raises((ValueError, FileNotFoundError), match=msg):
            _run([*argv, "--out", str(tmp_path / "x"), *(["--quiet"] if "curves" not in argv
                                                           else [])])
    assert not (tmp_path / "x").exists()
