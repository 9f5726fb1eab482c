"""What a study used travels with its results: confirm trains on the study's draw, compare
pairs heads of different draws, the report names the prior and its Reproduce command runs,
export says which draw and prior each row used, and a mistyped prior is refused before the
study's folder is written."""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import sys

import numpy as np
import polars as pl
import pytest

from probe.store import open_store
from studies.cli import main
from studies.results.rows import read_results

pytest.importorskip("river", reason="the yeast set ships inside river (extra 'yeast')")

FAST = ["--epochs", "1", "--batch-size", "64", "--lr", "0.01"]


def _run(argv):
    """``spml argv`` with stdout and stderr captured: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "stdout", out)
        mp.setattr(sys, "stderr", err)
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def store(yeast_store, tmp_path_factory):
    """A yeast copy with a semantic-bias draw 21 and a prior 'teacher'."""
    root = tmp_path_factory.mktemp("rec")
    path = root / "yeast.zarr"
    shutil.copytree(yeast_store, path)
    s = open_store(path)
    (root / "w.txt").write_text("\n".join(str(1 + i % 4) for i in range(s.n_classes)))
    assert _run(["draw", str(path), "--seeds", "21", "--bias", "semantic",
                 "--class-weights", str(root / "w.txt")])[0] == 0
    labels = s.labels().astype(np.float32)
    noisy = labels + np.random.default_rng(0).random(labels.shape).astype(np.float32)
    np.save(root / "scores.npy", noisy / noisy.sum(1, keepdims=True))
    assert _run(["import", "priors", str(path), "--name", "teacher", "--from",
                 str(root / "scores.npy"), "--model", "test-teacher"])[0] == 0
    return path


@pytest.fixture(scope="module")
def biased_study(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("bs") / "st"
    rc, text, err = _run(["study", str(store), "--loss", "gr", "--trials", "3",
                          "--trials-at-once", "3", "--observed-seed", "21", "--out", str(out),
                          *FAST])
    assert rc == 0, err
    return out, text


def test_confirm_as_printed_trains_on_the_studys_draw(biased_study):
    out, text = biased_study
    cmd = next(m.group(1) for m in re.finditer(r"^\s+(spml study confirm .+)$", text, re.M))
    rc, _, err = _run(shlex.split(cmd)[1:])
    assert rc == 0, err
    assert "draws: 21 (label bias 'semantic'" in err and "the study's" in err
    # a progress line per re-trained trial, with the count and (before the last) the ETA
    done = re.findall(r"trial \d+ re-trained on draw 21 .*confirm yeast-gr: (\d+)/(\d+)", err)
    assert [int(k) for k, _ in done] == list(range(1, int(done[0][1]) + 1))
    assert "ETA" in err
    rows = pl.read_parquet(out / "confirm.parquet")
    tests = {r["trial"]: r["test_map"] for r in read_results(out / "results").iter_rows(
        named=True)}
    for row in rows.iter_rows(named=True):
        assert set(row["observed_seeds"]) == {21}
        run0 = row["test_maps"][row["seeds"].index(0)]  # training seed 0: the study's own
        assert run0 == pytest.approx(tests[row["trial"]], abs=0.011)


def test_a_mistyped_prior_is_refused_before_anything_is_written(store, tmp_path):
    out = tmp_path / "D"
    rc, _, err = _run(["study", str(store), "--loss", "gpr", "--priors", "teachr", "--out",
                       str(out), "--trials", "2", *FAST])
    assert rc == 2
    assert "--priors teachr" in err and "did you mean 'teacher'?" in err
    assert "--name teachr" not in err  # never suggests making a prior under the typo
    assert not out.exists()
    out.mkdir()
    assert _run(["study", str(store), "--loss", "gpr", "--priors", "teachr", "--out",
                 str(out), "--trials", "2", *FAST])[0] == 2
    assert list(out.iterdir()) == []


def test_several_workers_print_one_summary(store, tmp_path):
    import os
    import subprocess

    out = tmp_path / "w"
    proc = subprocess.run(
        [sys.executable, "-m", "studies.cli", "study", str(store), "--loss", "an_ls", "--trials",
         "4", "--trials-at-once", "1", "--workers", "4", "--out", str(out), *FAST],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("study yeast-an_ls in ") == 1, proc.stdout
    assert proc.stdout.count("on the test split") == 1


def test_compare_pairs_heads_of_a_biased_and_the_protocol_draw(store, tmp_path):
    heads = []
    for seed in (21, 1200):
        heads.append(tmp_path / f"an{seed}.pt")
        rc, _, err = _run(["probe", str(store), "--loss", "an", "--observed-seed", str(seed),
                           *FAST, "--save-head", str(heads[-1]), "--quiet"])
        assert rc == 0, err
    rc, text, err = _run(["compare", *map(str, heads), "--json", str(tmp_path / "c.json")])
    assert rc == 0, err
    assert "note: the heads were trained on different draws" in text
    assert "draw 21, label bias 'semantic'" in text and "draw 1200, one positive" in text
    (pair,) = json.loads((tmp_path / "c.json").read_text())["pairs"]
    assert pair["diff_low"] <= pair["diff"] <= pair["diff_high"]


def test_compare_of_a_study_shows_a_line_per_head(biased_study, tmp_path):
    out, _ = biased_study
    rc, text, err = _run(["compare", str(out)])
    assert rc == 0, err
    n = len(re.findall(r"^\s+[A-Z]\s+yeast-gr trial \d+", text, re.M))
    kept = re.findall(r"kept by the study yeast-gr trial \d+.*: (\d+)/(\d+)", err)
    assert n >= 2 and len(kept) == n  # the study kept every head it measured
    # without the kept heads (a study made before they were kept): each one re-trained
    old = tmp_path / "old"
    shutil.copytree(out, old)
    for f in (old / "results").glob("heads-*.pt"):
        f.unlink()
    rc, again, err = _run(["compare", str(old)])
    assert rc == 0, err
    lines = re.findall(r"re-trained yeast-gr trial \d+.*: (\d+)/(\d+)", err)
    assert [int(k) for k, _ in lines] == list(range(1, n + 1))
    assert "ETA" in err or "eta" in err.lower()
    maps = re.findall(r"trial \d+(?: paper)?\s+([\d.]+)\s+\[", text)
    assert maps == re.findall(r"trial \d+(?: paper)?\s+([\d.]+)\s+\[", again)


@pytest.fixture(scope="module")
def prior_study(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("ps") / "st"
    rc, _, err = _run(["study", str(store), "--loss", "gpr", "--priors", "teacher",
                          "--trials", "2", "--trials-at-once", "2", "--out", str(out), *FAST])
    assert rc == 0, err
    return out


def _best_val(out, name):
    import optuna

    from studies.study.storage import open_existing_storage

    study = optuna.load_study(study_name=name,
                              storage=open_existing_storage(out / "study.log")[1])
    return study.best_value


def test_a_report_of_a_study_without_kept_heads_retrains_them(biased_study, tmp_path):
    """A study made before trials kept their heads: the report re-trains each, a line per head,
    and its intervals table shows the same test mAPs as from the kept heads."""
    out, _ = biased_study
    rc, _, err = _run(["report", str(out), "--out", str(tmp_path / "kept")])
    assert rc == 0, err
    old = tmp_path / "old"
    shutil.copytree(out, old)
    for f in (old / "results").glob("heads-*.pt"):
        f.unlink()
    rc, _, err = _run(["report", str(old), "--out", str(tmp_path / "again")])
    assert rc == 0, err
    lines = re.findall(r"re-trained trial \d+ for its test-mAP interval \(.*: (\d+)/(\d+) heads",
                       err)
    assert lines and [int(k) for k, _ in lines] == list(range(1, len(lines) + 1))

    def intervals(md: str) -> list[str]:
        return re.findall(r"^\| trial \d+[^|]*\| ([\d.]+) \|", md, re.M)

    kept = intervals((tmp_path / "kept" / "report.md").read_text())
    assert kept and kept == intervals((tmp_path / "again" / "report.md").read_text())


@pytest.mark.parametrize("which, says", [
    ("prior_study", "'teacher' (--priors teacher): model test-teacher"),
    ("biased_study", "draw 21 (label bias 'semantic'"),
])
def test_the_report_names_what_the_study_used_and_its_reproduce_command_runs(
        request, tmp_path, which, says):
    study_out = request.getfixturevalue(which)
    study_out = study_out[0] if isinstance(study_out, tuple) else study_out
    rc, _, err = _run(["report", str(study_out), "--out", str(tmp_path / "r")])
    assert rc == 0, err
    # the intervals score the heads the study kept; nothing is re-trained
    assert re.search(r"the intervals' heads: \d+ kept by the study, 0 re-trained", err), err
    assert "re-trained trial" not in err
    md = (tmp_path / "r" / "report.md").read_text()
    assert "the trials' heads as the study kept them when they finished" in md
    assert says in md
    assert "(from spml-probe " in md  # the package that provides the loss, and its version
    cmd = next(ln.strip().strip("`") for ln in md.splitlines()
               if ln.strip().strip("`").startswith("spml study ") and "--out" in ln)
    argv = shlex.split(cmd)[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "again")
    rc, _, err = _run(argv)
    assert rc == 0, err
    name = "yeast-gpr" if which == "prior_study" else "yeast-gr"
    assert _best_val(tmp_path / "again", name) == pytest.approx(_best_val(study_out, name),
                                                                 abs=1e-9)


def test_export_rows_say_which_draw_and_prior_and_share_one_key_scheme(store, biased_study,
                                                                       prior_study, tmp_path):
    out, _ = biased_study
    run = tmp_path / "run.json"
    rc, _, err = _run(["probe", str(store), "--loss", "gr", "--observed-seed", "21", *FAST,
                       "--json", str(run), "--quiet"])
    assert rc == 0, err
    rc, _, err = _run(["export", str(out), str(prior_study), str(run), "--out",
                       str(tmp_path / "all.csv")])
    assert rc == 0, err
    frame = pl.read_csv(tmp_path / "all.csv")
    for row in frame.iter_rows(named=True):
        draw = json.loads(row["draw"])
        if row["observed_seed"] == 21:
            assert draw == json.loads(json.dumps(
                {"kind": "bias", "bias": "semantic",
                 "class_weights": [float(1 + i % 4) for i in range(14)]}))
        else:
            assert draw == {"kind": "protocol"}
        keys = set(json.loads(row["params"]))
        assert keys and all(k.startswith((f"{row['loss']}.", "train.")) for k in keys), keys
        assert row["backbone"] and row["loss_package"].startswith("spml-probe ")
    priors = frame.filter(pl.col("loss") == "gpr")
    assert priors.height and set(priors["prior"]) == {"teacher"}
    assert all(json.loads(p)["model"] == "test-teacher" for p in priors["prior_provenance"])
    assert frame.filter(pl.col("loss") == "gr")["prior"].null_count() == \
        frame.filter(pl.col("loss") == "gr").height
    assert frame.filter(pl.col("kind") == "probe").height == 1


def test_run_study_returns_what_spml_study_prints_without_re_training(store, tmp_path,
                                                                      monkeypatch):
    import subprocess

    import probe.engine.train
    from studies import StudySettings, run_study

    out = tmp_path / "cli"
    rc, text, err = _run(["study", str(store), "--loss", "gr", "--trials", "3",
                          "--trials-at-once", "3", "--out", str(out), *FAST])
    assert rc == 0, err
    printed = {int(m.group(1)): (float(m.group(2)), float(m.group(3)), float(m.group(4)))
               for m in re.finditer(r"trial (\d+)\s+val mAP\s+[\d.]+\s+test mAP\s+([\d.]+) "
                                    r"\[([\d.]+), ([\d.]+)\]", text)}
    assert printed

    def no_training(*a, **k):
        raise AssertionError("the summary re-trained a head the study kept")

    settings = StudySettings(store=str(store), loss="gr", n_trials=3, batch=3,
                             out=str(tmp_path / "lib"), epochs=1, batch_size=64, lr=0.01)
    real = probe.engine.train.train_probe
    summary = run_study(settings, verdict=False)
    monkeypatch.setattr(probe.engine.train, "train_probe", no_training)
    import optuna

    from studies.study.storage import open_storage
    from studies.study.summary import with_verdict

    study = optuna.load_study(study_name=summary.name,
                              storage=open_storage(settings.storage_spec()))
    summary = with_verdict(summary, study, settings)
    monkeypatch.setattr(probe.engine.train, "train_probe", real)
    v = summary.verdict
    for row in [v.winner, *([v.paper] if v.paper else [])]:
        assert printed[row.trial] == pytest.approx(
            (round(row.test_map, 2), round(row.test_low, 2), round(row.test_high, 2)),
            abs=0.006)
    tests = {r["trial"]: r["test_map"] for r in read_results(tmp_path / "lib" / "results")
             .iter_rows(named=True)}
    # its own head: equal up to float32 (the study) vs float64 (the bootstrap) AP arithmetic
    assert v.winner.test_map == pytest.approx(tests[v.winner.trial], abs=1e-4)
    # the same from a fresh interpreter, as a notebook user would
    code = (f"from studies import StudySettings, run_study; s = run_study(StudySettings("
            f"store={str(store)!r}, loss='gr', n_trials=3, batch=3, out={str(tmp_path / 'py')!r}"
            ", epochs=1, batch_size=64, lr=0.01)); v = s.verdict; print(v.winner.trial, "
            "f'{v.winner.test_map:.2f}', f'{v.diff:+.2f}' if v.diff is not None else '-')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    trial, test_map, _ = proc.stdout.split()
    assert float(test_map) == printed[int(trial)][0]


def test_the_first_trial_fills_data_derived_values_as_probe_does(store, tmp_path):
    import optuna

    from studies.study.storage import open_existing_storage

    out = tmp_path / "epr"
    rc, text, err = _run(["study", str(store), "--loss", "epr", "--trials", "2",
                          "--trials-at-once", "2", "--out", str(out), *FAST])
    assert rc == 0, err
    study = optuna.load_study(study_name="yeast-epr",
                              storage=open_existing_storage(out / "study.log")[1])
    first = next(t for t in study.trials if t.user_attrs.get("spml:paper"))
    run = tmp_path / "p.json"
    assert _run(["probe", str(store), "--loss", "epr", *FAST, "--json", str(run),
                 "--quiet"])[0] == 0
    assert first.params["epr.k"] == json.loads(run.read_text())["trials"][0]["hparams"]["k"]
    # no paper values for yeast: called defaults, with why, never "--no-paper"
    assert "--no-paper" not in text
    assert "note: epr has no paper values for dataset 'yeast'" in text
    assert re.search(r"^\s+defaults\s+trial \d", text, re.M) or "val winner = defaults" in text
    assert "trained with: epochs 1, batch size 64, lr 0.01" in text
    assert "draw: --observed-seed 1200" in text


def test_a_refused_report_leaves_no_empty_folders(biased_study, tmp_path, monkeypatch):
    out, _ = biased_study
    import studies.report.build as build

    def refuse(*a, **k):
        from probe.errors import SpmlError

        raise SpmlError("--store: refused for the test")

    monkeypatch.setattr(build, "train_report_runs", refuse)
    target = tmp_path / "D" / "deeper"
    rc, _, err = _run(["report", str(out), "--out", str(target)])
    assert rc == 2 and "refused for the test" in err
    assert not (tmp_path / "D").exists()
    (tmp_path / "mine").mkdir()
    rc, _, _ = _run(["report", str(out), "--out", str(tmp_path / "mine")])
    assert rc == 2 and (tmp_path / "mine").is_dir()  # the user's folder stays, empty
    assert list((tmp_path / "mine").iterdir()) == []


def test_a_searched_count_says_what_it_acts_as():
    """GPR's top_k and VLPL's k_neg compare a 0-based rank with the value: 7.27868 acts as 8
    classes, and the summary says so; other parameters print as they are."""
    from probe.losses import get_loss_class
    from studies.study.summary import param_lines

    spec = {s.name: s for s in get_loss_class("gpr").hparam_specs}["top_k"]
    assert spec.effective(7.27868) == 8 and spec.effective(3.0) == 3
    lines = param_lines("gpr", {"gpr.top_k": 7.27868, "gpr.eta": 0.3, "train.lr": 1e-4})
    assert lines == ["  gpr.top_k = 7.27868 (acts as 8)", "  gpr.eta = 0.3", "  train.lr = 0.0001"]
    assert param_lines("vlpl", {"vlpl.k_neg": 2.0}) == ["  vlpl.k_neg = 2"]
    assert param_lines("vlpl", {"vlpl.k_neg": 0.5}) == ["  vlpl.k_neg = 0.5 (acts as 1)"]
