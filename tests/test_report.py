"""spml report: a real study on the yeast store (search, confirmation, AN baseline) written as
HTML + Markdown + PNGs and checked against the storage and the Parquet files; rendered in
headless Chromium; synthetic studies for the edge cases (no completed trial, one parameter,
too few trials, a categorical parameter, a missing store) and the errors users hit."""

from __future__ import annotations

import argparse
import base64
import io
import json
import shlex
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import optuna
import polars as pl
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial
from PIL import Image

from studies import plots
from studies.cli.report import register_cli as register_report_cli
from studies.report import SECTIONS, ReportOptions, build_report, study_command
from studies.results.rows import read_results, write_batch
from studies.study.storage import StudyError

pytest.importorskip("river", reason="the yeast set ships inside river (extra 'yeast')")

TITLES = [t for _, t in SECTIONS]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHROMIUM = Path("/usr/bin/chromium")
FAST = ReportOptions(dpi=100)  # synthetic cases: smaller PNGs, same code


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


class _Page(HTMLParser):
    """Headings, images, tables (by id), code blocks, and every href/src of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.h2: list[str] = []
        self.imgs: list[dict] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.pre: list[str] = []
        self.links: list[str] = []
        self.tags: set[str] = set()
        self._text: list[str] | None = None
        self._table: str | None = None
        self._row: list[str] | None = None
        self._in_pre = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        if tag == "img":
            self.imgs.append(a)
        for key in ("href", "src"):
            if key in a:
                self.links.append(a[key])
        if tag == "table":
            self._table = a.get("id", "")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("h2", "td", "th"):
            self._text = []
        elif tag == "pre":
            self._in_pre, self._text = True, []

    def handle_endtag(self, tag):
        if tag == "h2":
            self.h2.append("".join(self._text or []))
            self._text = None
        elif tag in ("td", "th") and self._row is not None:
            self._row.append("".join(self._text or []))
            self._text = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "pre":
            self.pre.append("".join(self._text or []))
            self._in_pre, self._text = False, None

    def handle_data(self, data):
        if self._text is not None:
            self._text.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _informative(png: Path | bytes, min_colours: int = 64) -> np.ndarray:
    """The image as an array, after checking it is a real picture, not a blank canvas."""
    data = png.read_bytes() if isinstance(png, Path) else png
    assert data[:8] == PNG_SIGNATURE
    img = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert img.std() > 15, "image is (nearly) one colour"
    rgb = img.astype(np.int32)
    packed = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
    colours = np.unique(packed).size
    assert colours >= min_colours, f"only {colours} distinct colours"
    return img


def _png(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img.astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _check_page(result, page: _Page) -> None:
    """Every section heading; every <img> an embedded PNG equal to its figure file; nothing
    external; the Markdown has the same headings and links existing figures."""
    assert result.sections == TITLES
    assert page.h2 == TITLES
    assert len(page.imgs) == len(result.figures)
    files = {p.read_bytes() for p in result.figures}
    for img in page.imgs:
        src = img["src"]
        assert src.startswith("data:image/png;base64,")
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert data in files
        Image.open(io.BytesIO(data)).verify()
        assert img.get("alt")
    assert not ({"script", "link", "iframe", "object"} & page.tags)
    assert all(u.startswith(("#", "data:image/png;base64,")) for u in page.links), page.links
    md = result.md_path.read_text(encoding="utf-8")
    for title in TITLES:
        assert f"\n## {title}\n" in md
    linked = [line.split("](", 1)[1].rstrip(")") for line in md.splitlines()
              if line.startswith("![")]
    assert sorted(result.md_path.parent / p for p in linked) == sorted(result.figures)


def _table(page: _Page, ident: str) -> tuple[list[str], list[dict[str, str]]]:
    rows = page.tables[ident]
    return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]


# --------------------------------------------------------------------------------------------
# a real study
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """yeast store → GR study (10 trials, 2 stacked batches, median pruning) → confirmation
    of the top 2 over seeds 0,1 → report with the AN baseline."""
    from featurize.imports import import_yeast
    from studies.results.confirm import confirm_study, load_study
    from studies.study.run import run_study
    from studies.study.settings import StudySettings

    root = tmp_path_factory.mktemp("report")
    store = root / "yeast.zarr"
    import_yeast(store, progress=False)
    out = root / "study"
    settings = StudySettings(store=str(store), loss="gr", n_trials=10, batch=5, epochs=3,
                             batch_size=32, lr=0.01, out=str(out))
    run_study(settings, log=lambda m: None)
    study = load_study(str(out / "study.log"), None)
    confirm_study(study, str(store), top_k=2, seeds=(0, 1), out=out, device="cpu")
    result = build_report(out, options=ReportOptions(device="cpu"))
    return {"store": store, "out": out, "study": study, "result": result}


def test_real_study_report_matches_the_storage(real):
    result, study, out = real["result"], real["study"], real["out"]
    assert result.skipped == {}
    assert result.html_path == out / "report" / "report.html"
    names = sorted(p.name for p in result.figures)
    assert names == ["class_ap.png", "comparison.png", "contours.png", "history.png",
                     "importance.png", "learning_curves.png", "slices.png"]
    for fig in result.figures:
        assert fig.stat().st_size > 20_000
        _informative(fig)
        dpi = Image.open(fig).info["dpi"]
        assert round(dpi[0]) >= 150
    page = _parse(result.html_path)
    _check_page(result, page)

    # leaderboard: ranks by val mAP, numbers as in the storage / Parquet / confirm.parquet
    trials = {t.number: t for t in study.get_trials()}
    complete = sorted((t for t in trials.values() if t.state == TrialState.COMPLETE),
                      key=lambda t: (-t.value, t.number))
    results = {r["trial"]: r for r in pl.read_parquet(out / "results" / "*.parquet").to_dicts()}
    confirmed = {r["trial"]: r for r in pl.read_parquet(out / "confirm.parquet").to_dicts()}
    header, rows = _table(page, "leaderboard")
    assert header[:8] == ["rank", "trial", "val mAP", "best epoch", "test mAP",
                          "test mAP 95% interval", "confirmed test mAP", "runs"]
    assert header[8:] == list(trials[0].params)
    assert len(rows) == len(complete)
    for i, row in enumerate(rows):
        t = trials[int(row["trial"].split()[0])]
        assert t.number == complete[i].number
        assert row["rank"] == str(i + 1)
        assert row["val mAP"] == f"{t.value:.2f}"
        assert row["test mAP"] == f"{results[t.number]['test_map']:.2f}"
        assert row["best epoch"] == str(results[t.number]["best_epoch"])  # counted from 1
        assert 1 <= results[t.number]["best_epoch"] <= 3
        # the first trial's word: "defaults" (GR gives no values for yeast), never "paper"
        assert ("(defaults)" in row["trial"]) == bool(t.user_attrs.get("spml:paper"))
        for name, value in t.params.items():
            assert float(row[name]) == pytest.approx(value, rel=1e-3)
        c = confirmed.get(t.number)
        want = (f"{c['test_mean']:.2f} ± {c['test_std']:.2f} [{c['test_low']:.2f}, "
                f"{c['test_high']:.2f}]" if c else "–")
        assert row["confirmed test mAP"] == want
    assert sum(r["confirmed test mAP"] != "–" for r in rows) == 2
    # intervals: the best 3 trials (and the paper point) re-trained by the report; their
    # test mAP reproduces the study's, and its 95% interval brackets it
    paper = next(t for t in complete if t.user_attrs.get("spml:paper"))
    retrained = {t.number for t in complete[:3]} | {paper.number}
    for row in rows:
        n = int(row["trial"].split()[0])
        cell = row["test mAP 95% interval"]
        if n not in retrained:
            assert cell == "–"
            continue
        low, high = (float(v) for v in cell.strip("[]").split(","))
        assert low <= float(row["test mAP"]) <= high and high - low > 0.1
    _, ivs = _table(page, "intervals")
    assert [r["system"] for r in ivs] == [
        f"trial {n}" + (" (defaults)" if n == paper.number else "")
        for n in [t.number for t in complete[:3]] + ([] if paper in complete[:3]
                                                      else [paper.number])] + ["AN baseline"]
    for r in ivs[:-1]:
        n = int(r["system"].split()[1])
        assert r["test mAP"] == f"{results[n]['test_map']:.2f}"  # re-training reproduces it
    an_run = json.loads(result.baseline_path.read_text())
    assert ivs[-1]["test mAP"] == f"{an_run['trials'][0]['best']['test_map']:.2f}"
    _, pairs = _table(page, "comparison")
    assert len(pairs) == len(ivs) * (len(ivs) - 1) // 2
    for r in pairs:
        low, high = (float(v) for v in r["95% interval"].strip("[]").split(","))
        assert float(r["difference"]) >= 0 and low <= high
        assert float(r["p"]) <= float(r["p (Holm)"]) <= 1
        assert (r["verdict"] == "no clear difference") == (float(r["p (Holm)"]) >= 0.05)

    # convergence: completed trials whose best val epoch is their last are counted, with advice
    from probe.evaluation.convergence import count_best_is_last

    curves = [[t.intermediate_values[k] for k in sorted(t.intermediate_values)]
              for t in complete]
    n_last = count_best_is_last(curves)
    html = result.html_path.read_text()
    assert ("Not converged?" in html) == (n_last > 0)
    if n_last:
        assert f"{n_last} of {len(complete)} completed trials had their best val" in html

    _, crow = _table(page, "confirmation")
    assert [int(r["trial"]) for r in crow] == [r["trial"] for r in
                                               sorted(confirmed.values(), key=lambda r: r["rank"])]

    # importances: Optuna's fANOVA numbers, all parameters
    _, imp = _table(page, "importances")
    want = optuna.importance.get_param_importances(
        study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
    assert {r["parameter"]: float(r["importance"]) for r in imp} == pytest.approx(
        {k: round(v, 3) for k, v in want.items()}, abs=1e-9)

    # per-class AP: the best trial's Parquet AP against the AN run written beside the report
    best = complete[0]
    baseline = json.loads(result.baseline_path.read_text())
    assert baseline["loss"] == "an"
    an_ap = baseline["trials"][0]["best"]["test_ap"]
    _, cls = _table(page, "class-ap")
    assert len(cls) == 14
    by_class = dict(zip(baseline["class_names"], zip(results[best.number]["class_ap"], an_ap)))
    for r in cls:
        a, b = by_class[r["class"]]
        assert r[f"trial {best.number} AP"] == f"{a:.2f}"  # AP in percent, like mAP
        assert r["AN AP"] == f"{b:.2f}"
    diffs = [float(r["difference"]) for r in cls]
    assert diffs == sorted(diffs, reverse=True)
    cfg = baseline["config"]  # as spml probe --loss an trains it: the generic setting on yeast
    assert (cfg["epochs"], cfg["batch_size"], cfg["lr"], cfg["observed_seed"]) == (25, 8, 1e-4,
                                                                                     1200)


def test_reproduce_command_parses_back_to_the_same_settings(real):
    """The summary's 'spml study' line, parsed by the real CLI, gives the recorded settings."""
    from studies.cli import build_parser
    from studies.cli.study import settings_from_args
    from studies.study.create import settings_dict

    page = _parse(real["result"].html_path)
    lines = page.pre[0].splitlines()
    assert lines[0].startswith("spml study ") and lines[1].startswith("spml study confirm ")
    assert lines[2].startswith("spml report ")
    recorded = real["study"].user_attrs["spml.settings"]
    assert shlex.split(lines[0]) == study_command(recorded)
    args = build_parser().parse_args(shlex.split(lines[0])[1:])
    rebuilt = json.loads(json.dumps(settings_dict(settings_from_args(args)), default=str))
    assert rebuilt == recorded
    confirm = shlex.split(lines[1])
    assert confirm[confirm.index("--seeds") + 1] == "0,1"
    assert confirm[confirm.index("--top-k") + 1] == "2"
    # a non-default, richer setting round-trips too
    richer = {**recorded, "fixed": {"q1": 0.02}, "params": ["w_T", "b_T"], "seed": 3,
              "space": {"gr.b_T": {"name": "FloatDistribution",
                                   "attributes": {"step": None, "low": -6.0, "high": -1.0,
                                                  "log": False}}},
              "batch_sizes": [8, 16], "enqueue_paper": False, "val_labels": "observed"}
    args = build_parser().parse_args(study_command(richer)[1:])
    assert json.loads(json.dumps(settings_dict(settings_from_args(args)), default=str)) == richer


@pytest.mark.skipif(not CHROMIUM.exists(),
                    reason="/usr/bin/chromium is absent (CI installs Debian's chromium)")
def test_report_renders_in_headless_chromium(real, tmp_path):
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
         "--window-size=1200,3000", "--hide-scrollbars", real["result"].html_path.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert shot.exists(), proc.stderr[-2000:]
    img = _informative(shot, min_colours=500)
    assert img.shape[:2] == (3000, 1200)
    # the embedded figures were decoded and drawn: the plots' blue (#1f77b4) is on screen
    blue = (np.abs(img.astype(int) - (31, 119, 180)).sum(-1) < 30).sum()
    assert blue > 500
    # the page is not mostly background: text, tables and figures fill the first screen
    background = (np.abs(img.astype(int) - img[5, 5]).sum(-1) < 6).mean()
    assert background < 0.5

    # the intervals section, the page's last: in a screenshot of the whole page, the last
    # screenful of content holds the comparison figure (blue interval bars, a difference panel)
    shot = tmp_path / "whole.png"
    proc = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
         "--window-size=1200,16000", "--hide-scrollbars", real["result"].html_path.as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    assert shot.exists(), proc.stderr[-2000:]
    whole = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    filled = np.nonzero((np.abs(whole - whole[5, 5]).sum(-1) > 6).mean(1) > 0.01)[0]
    assert filled.max() < whole.shape[0] - 10, "page taller than the screenshot"
    tail = whole[max(0, filled.max() - 1400): filled.max()]
    _informative(_png(tail), min_colours=200)
    blue = (np.abs(tail - (31, 119, 180)).sum(-1) < 30).sum()
    grey_or_red = ((np.abs(tail - (154, 160, 166)).sum(-1) < 30)
                   | (np.abs(tail - (214, 39, 40)).sum(-1) < 30)).sum()
    assert blue > 200 and grey_or_red > 200
    dom = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
         real["result"].html_path.as_uri()], capture_output=True, text=True, timeout=120,
    ).stdout
    section = dom.split('id="intervals-and-comparison"', 1)[1]
    assert 'id="intervals"' in section and 'id="comparison"' in section
    assert "95% interval" in section and 'alt="' in section
    assert "data:image/png;base64," in section  # the comparison figure, embedded


# --------------------------------------------------------------------------------------------
# synthetic studies: edge cases without training
# --------------------------------------------------------------------------------------------

_SETTINGS = {"store": "/nowhere/gone.zarr", "loss": "gr", "n_trials": 8, "batch": 4,
             "sampler": "tpe", "pruner": "median", "storage": None, "name": None,
             "out": "synthetic", "seed": 0, "train_seed": 0, "fixed": {}, "space": {},
             "params": None, "grid": {}, "search_lr": False, "batch_sizes": [],
             "epochs_choices": [], "epochs": 3, "batch_size": 32, "lr": 0.01,
             "val_labels": "clean", "observed_seed": 1200, "device": "auto",
             "enqueue_paper": True, "heartbeat_seconds": 10.0, "grace_seconds": 120.0,
             "workers": 1}


def _synthetic(directory: Path, dists: dict, trials: list[tuple[str, dict, list[float]]],
               name: str = "toy-gr", parquet: bool = False) -> optuna.Study:
    """A study in DIR/study.db as spml study records it, with the given (state, params,
    per-epoch val mAP) trials; the first trial is the paper point. ``parquet``: also the
    results batch spml study writes (test mAP = val mAP - 1, per-class AP of 3 classes)."""
    directory.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(study_name=name, direction="maximize",
                                storage=f"sqlite:///{directory / 'study.db'}")
    study.set_user_attr("spml.loss", "gr")
    study.set_user_attr("spml.store", {"dataset": "toy", "rows": 100, "classes": 3,
                                       "feature_dim": 8})
    study.set_user_attr("spml.settings", {**_SETTINGS, "out": str(directory)})
    for i, (state, params, curve) in enumerate(trials):
        st = TrialState[state]
        study.add_trial(create_trial(
            state=st, params=params, distributions=dists,
            value=max(curve) if st == TrialState.COMPLETE else None,
            intermediate_values=dict(enumerate(curve, 1)),  # steps are epochs from 1
            user_attrs={"spml:paper": True} if i == 0 else {},
        ))
    if parquet:
        write_batch(directory / "results", [
            {"study": name, "trial": i, "state": state, "loss": "gr", "params": params,
             "value": max(curve), "best_epoch": int(np.argmax(curve)) + 1,
             "test_map": max(curve) - 1, "val_map": max(curve), "val_map_per_epoch": curve,
             "test_map_per_epoch": curve, "class_ap": [20.0, 50.0, 80.0], "seed": 0,
             "observed_seed": 1200}
            for i, (state, params, curve) in enumerate(trials) if curve
        ])
    return study


def test_study_without_a_completed_trial_still_gets_a_report(tmp_path):
    dists = {"gr.w_T": FloatDistribution(2, 16), "gr.q2": FloatDistribution(1e-3, 1, log=True)}
    _synthetic(tmp_path / "s", dists, [
        ("PRUNED", {"gr.w_T": 4.0, "gr.q2": 0.01}, [30.0, 31.5]),
        ("PRUNED", {"gr.w_T": 9.0, "gr.q2": 0.1}, [29.0]),
        ("FAIL", {"gr.w_T": 12.0, "gr.q2": 0.5}, []),
    ])
    result = build_report(tmp_path / "s", options=FAST)
    page = _parse(result.html_path)
    _check_page(result, page)
    assert [p.name for p in result.figures] == ["history.png"]
    _informative(result.figures[0])
    assert set(result.skipped) == set(TITLES[1:2] + TITLES[3:])
    assert "no completed trial" in result.skipped["Leaderboard"].lower()
    text = result.html_path.read_text()
    assert "This study has no completed trial yet (3 trial(s): 2 pruned, 1 failed" in text
    assert "leaderboard" not in page.tables  # nothing to rank, and no empty table either


def test_one_parameter_and_a_missing_store_are_skipped_with_reasons(tmp_path):
    dists = {"gr.b_T": FloatDistribution(-8, -2)}
    rng = np.random.default_rng(0)
    trials = [("COMPLETE", {"gr.b_T": float(b)}, list(40 + rng.random(3)))
              for b in np.linspace(-8, -2, 6)]
    _synthetic(tmp_path / "s", dists, [*trials, ("PRUNED", {"gr.b_T": -5.5}, [38.0])],
               parquet=True)
    result = build_report(tmp_path / "s", options=FAST)
    page = _parse(result.html_path)
    _check_page(result, page)
    _, rows = _table(page, "leaderboard")
    assert [float(r["test mAP"]) for r in rows] == [float(r["val mAP"]) - 1 for r in rows]
    assert sorted(p.name for p in result.figures) == ["history.png", "learning_curves.png",
                                                      "slices.png"]
    assert "1 parameter (gr.b_T)" in result.skipped["Parameter importances"]
    assert "two searched parameters" in result.skipped["Contour plots"]
    reason = result.skipped["Per-class AP vs the AN baseline"]
    assert "/nowhere/gone.zarr" in reason and "--store" in reason
    text = result.html_path.read_text()
    assert "Skipped: the study searches 1 parameter (gr.b_T)" in text
    # --store pointing nowhere says so too
    result = build_report(tmp_path / "s", store=str(tmp_path / "nope.zarr"), options=FAST)
    assert "does not exist" in result.skipped["Per-class AP vs the AN baseline"]


def test_few_trials_and_a_categorical_parameter(tmp_path):
    """3 completed trials: no importances (too few) but a contour over the 3 points, with a
    categorical axis; an earlier report's importance figure is removed, not left stale."""
    dists = {"gr.q3": FloatDistribution(0.01, 2, log=True),
             "train.batch_size": CategoricalDistribution((8, 16))}
    _synthetic(tmp_path / "s", dists, [
        ("COMPLETE", {"gr.q3": 1.0, "train.batch_size": 8}, [40.0, 41.0]),
        ("COMPLETE", {"gr.q3": 0.1, "train.batch_size": 16}, [39.0, 42.5]),
        ("COMPLETE", {"gr.q3": 0.03, "train.batch_size": 8}, [38.0, 39.0]),
    ])
    stale = tmp_path / "s" / "report" / "figures" / "importance.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    result = build_report(tmp_path / "s", options=FAST)
    _check_page(result, _parse(result.html_path))
    assert "only 3 completed trial(s)" in result.skipped["Parameter importances"]
    assert not stale.exists()
    contour = next(p for p in result.figures if p.name == "contours.png")
    _informative(contour)
    page = _parse(result.html_path)
    _, rows = _table(page, "leaderboard")
    assert [r["trial"] for r in rows] == ["1", "0 (defaults)", "2"]  # no paper values here
    assert [r["train.batch_size"] for r in rows] == ["16", "8", "8"]
    assert rows[0]["test mAP"] == "–"  # no results folder: unknown, not invented
    assert "no results folder" in result.html_path.read_text()


def test_errors_name_the_folder_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        build_report(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"holds no study: expected study\.log"):
        build_report(tmp_path / "empty")
    assert not any((tmp_path / "empty").iterdir())  # looking never creates a storage
    with pytest.raises(FileNotFoundError, match="no such file"):
        build_report(tmp_path / "empty", storage=str(tmp_path / "other.db"))
    dists = {"gr.w_T": FloatDistribution(2, 16)}
    one = [("COMPLETE", {"gr.w_T": 3.0}, [40.0])]
    _synthetic(tmp_path / "two", dists, one, name="a")
    _synthetic(tmp_path / "two", dists, one, name="b")
    with pytest.raises(StudyError, match=r"holds 2 studies \(a, b\); name one"):
        build_report(tmp_path / "two")
    result = build_report(tmp_path / "two", name="b", options=ReportOptions(dpi=100,
                                                                            baseline=False))
    assert "Study report: b" in result.html_path.read_text()


def test_cli(tmp_path, capsys):
    dists = {"gr.w_T": FloatDistribution(2, 16)}
    _synthetic(tmp_path / "s", dists, [("COMPLETE", {"gr.w_T": 3.0}, [40.0, 41.0])])
    parser = argparse.ArgumentParser(prog="spml")
    register_report_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", str(tmp_path / "s"), "--out", str(tmp_path / "r"),
                              "--no-baseline", "--dpi", "100"])
    assert args.func(args) == 0
    captured = capsys.readouterr()
    assert f"wrote {tmp_path / 'r' / 'report.html'}" in captured.out
    assert "Per-class AP vs the AN baseline: skipped: the AN baseline was turned off " \
           "(--no-baseline)" in captured.err
    args = parser.parse_args(["report", str(tmp_path / "s"), "--top", "0"])
    with pytest.raises(ValueError, match="--top must be an integer >= 1; got 0"):
        args.func(args)
    with pytest.raises(SystemExit):
        parser.parse_args(["report", "--help"])
    help_text = capsys.readouterr().out
    assert "examples:" in help_text and "STUDY_DIR/report" in help_text


def test_class_ap_plot_keeps_the_extremes_of_many_classes(tmp_path):
    rng = np.random.default_rng(1)
    n = 90
    best, base = rng.random(n), rng.random(n)
    best[5] = np.nan  # a class without test positives
    path = plots.plot_class_ap([f"c{i}" for i in range(n)], best, base, tmp_path / "c.png",
                               max_classes=20, dpi=80)
    assert path == tmp_path / "c.png"
    _informative(path)
    # 20 bars pairs + margins: the figure's height follows the 20 shown classes, not 90
    assert Image.open(path).size[1] < 80 * (1.6 + 0.34 * 25)
    with pytest.raises(ValueError, match="3 class names but 2"):
        plots.plot_class_ap(["a", "b", "c"], [0.1, 0.2], [0.1, 0.2], tmp_path / "x.png")


def test_contour_of_points_that_span_no_area(tmp_path):
    axes = (plots.ParamAxis("a"), plots.ParamAxis("b", log=True))
    pts = [plots.TrialPoint(i, "COMPLETE", 40.0 + i, {"a": float(i), "b": 10.0 ** i})
           for i in range(3)]  # collinear in (a, log b)
    path = plots.plot_contours(pts, [axes], tmp_path / "c.png", dpi=80)
    _informative(path, min_colours=20)


def test_report_can_be_rebuilt_into_another_folder(real, tmp_path):
    """--out elsewhere, --store given explicitly: the same numbers, figures beside the .md."""
    shutil.copytree(real["out"], tmp_path / "copy", ignore=shutil.ignore_patterns("report"))
    result = build_report(tmp_path / "copy", store=str(real["store"]), out=tmp_path / "rep",
                          options=ReportOptions(device="cpu", dpi=100))
    assert result.md_path == tmp_path / "rep" / "report.md"
    assert all(p.parent == tmp_path / "rep" / "figures" for p in result.figures)
    a = _table(_parse(real["result"].html_path), "leaderboard")[1]
    b = _table(_parse(result.html_path), "leaderboard")[1]
    assert a == b


def test_training_settings_come_from_the_rows_and_mixed_ones_are_flagged(tmp_path):
    """A study made before settings were part of its identity may hold trials trained
    at another lr; the report reads what each trial trained with from the results rows, says
    the study is mixed, and shows the best trial's settings, not the first run's."""
    dists = {"gr.w_T": FloatDistribution(2, 16), "gr.q2": FloatDistribution(1e-3, 1, log=True)}
    trials = [("COMPLETE", {"gr.w_T": 2.0 + i, "gr.q2": 0.01 * (i + 1)}, [40.0 + i, 41.0 + i])
              for i in range(4)]
    _synthetic(tmp_path / "s", dists, trials, parquet=True)
    # two more trials, trained at lr 0.1 by a resumed run (the old, silent behaviour)
    study = optuna.load_study(study_name="toy-gr", storage=f"sqlite:///{tmp_path / 's/study.db'}")
    for i in (4, 5):
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=50.0 + i,
                                     params={"gr.w_T": 3.0 + i, "gr.q2": 0.5}, distributions=dists,
                                     intermediate_values={1: 49.0 + i, 2: 50.0 + i}))
    write_batch(tmp_path / "s" / "results", [
        {"study": "toy-gr", "trial": i, "state": "COMPLETE", "loss": "gr",
         "params": {"gr.w_T": 3.0 + i, "gr.q2": 0.5}, "value": 50.0 + i, "val_map": 50.0 + i,
         "best_epoch": 2, "test_map": 49.0 + i, "class_ap": [20.0, 50.0, 80.0], "lr": 0.1,
         "batch_size": 32, "epochs": 3} for i in (4, 5)])
    # the first run's rows say lr 0.01, batch size 32, 3 epochs
    frame = read_results(tmp_path / "s" / "results")
    frame = frame.with_columns(pl.col("lr").fill_null(0.01), pl.col("batch_size").fill_null(32),
                               pl.col("epochs").fill_null(3))
    for f in (tmp_path / "s" / "results").glob("batch-*.parquet"):
        f.unlink()
    write_batch(tmp_path / "s" / "results", frame.to_dicts())
    result = build_report(tmp_path / "s", options=FAST)
    text = result.html_path.read_text()
    assert "trained with different settings (lr: 0.01, 0.1)" in text
    assert "lr 0.1 (recorded with the trials)" in text  # the best trial (5) trained at 0.1


def test_the_summary_names_the_source_of_an_imported_and_of_a_featurized_store():
    """An import records its source as a dict, a featurized store as fields (and, before them,
    a sentence): each reads back as one line, never a crash on a string."""
    from studies.report.sections import source_text

    assert source_text({"source": {"kind": "arrays", "dataset": "yeast"}}) == "yeast"
    assert source_text({"source": "images of dataset 'photos' under /data/photos"}) == \
        "images of dataset 'photos' under /data/photos"
    assert source_text({"source": "images of dataset 'photos' under /x", "dataset": "photos",
                        "image_root": "/abs/photos", "adapter": "folder",
                        "adapter_options": {}}) == "images of dataset 'photos' under /abs/photos"
    assert source_text({}) == "?"


def test_on_a_store_without_paper_values_nothing_calls_the_first_trial_paper(real, capsys):
    """GR gives no values for yeast: the report, its figures' labels and spml compare call the
    first trial "defaults", never "paper"."""
    import re

    from studies.cli import main
    from studies.study.storage import reference_label

    assert reference_label(real["study"]) == "defaults"
    md = real["result"].md_path.read_text(encoding="utf-8")
    for phrase in ("(paper)", "paper point", "minus paper"):
        assert phrase not in md, phrase
    assert "defaults point" in md or "(defaults)" in md
    assert main(["compare", str(real["out"]), "--resamples", "100"]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"trial \d+ paper", out) and re.search(r"trial \d+ defaults", out)


def test_the_reports_an_row_equals_spml_probe_loss_an(real, capsys):
    """The AN baseline is trained as `spml probe --loss an` trains it (not at the study's
    tuned lr): the same test mAP on the same store, draw and seed."""
    import json

    from studies.cli import main

    baseline = json.loads((real["out"] / "report" / "an_baseline.json").read_text())
    record = real["out"] / "an_probe.json"
    assert main(["probe", str(real["store"]), "--loss", "an", "--intervals", "0", "--quiet",
                 "--json", str(record)]) == 0
    capsys.readouterr()
    probe = json.loads(record.read_text())
    assert baseline["config"]["lr"] == probe["config"]["lr"]
    assert baseline["config"]["epochs"] == probe["config"]["epochs"]
    assert (baseline["trials"][0]["best"]["test_map"]
            == pytest.approx(probe["trials"][0]["best"]["test_map"], abs=1e-9))
