"""``spml table`` (studies.table): rows, marks, resumable cells, outputs, refusals, the prior
rows, the tuned rows, and that every cell's printed command reproduces its mAP."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from fixtures_datasets import tree_digest

from studies.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = ["--epochs", "2", "--resamples", "200", "--quiet"]


@pytest.fixture(scope="module")
def store(yeast_store, tmp_path_factory) -> str:
    """A copy of the yeast store holding the draws 1200, 1 and 2."""
    from probe.store import add_observed_seed

    path = tmp_path_factory.mktemp("table") / "y.zarr"
    shutil.copytree(yeast_store, path)
    for seed in (1, 2):
        add_observed_seed(path, seed)
    return str(path)



def _trained(err: str) -> int:
    found = [m for x in err.splitlines() if (m := re.match(r"(\d+) cells? trained", x))]
    return int(found[0][1])


def test_table_rows_marks_outputs_and_resume(store, tmp_path, capsys):
    out = tmp_path / "t"
    args = ["table", store, "--losses", "an,gr", "--include", "full",
            "--observed-seeds", "1200,1", "--out", str(out), *FAST]
    assert main(args) == 0
    first = capsys.readouterr()
    md = first.out
    rows = [line for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    # the oracle is a reference row below a rule: never bold, never marked
    assert [r.split("|")[1].strip() for r in rows] == [
        "method", "an", "gr", "*reference (not compared)*", "an, full labels (oracle)"]
    assert sum(r.count("**") for r in rows) == 2  # exactly one bold cell in the column
    assert "**" not in rows[4] and "†" not in rows[4]
    assert "(2)" in rows[1] and "(2)" in rows[2] and "(1)" in rows[4]  # draws shown
    assert "one-sided" in md and "Holm" in md
    assert _trained(first.err) == 5  # oracle once (it sees every label), an and gr x 2 draws
    tex = (out / "table.tex").read_text()
    for part in (r"\toprule", r"\midrule", r"\bottomrule", r"\textbf{", "yeast"):
        assert part in tex
    cells = pl.read_parquet(out / "cells.parquet")
    assert cells.height == 5
    assert set(cells["format"]) == {"spml-results/2"} and set(cells["kind"]) == {"table"}
    assert sorted(cells.filter(pl.col("method") == "an")["observed_seed"].to_list()) == [1, 1200]
    # the entry is the mean of its cells, and the best entry is the highest mean
    means = cells.group_by("method").agg(pl.col("test_map").mean(), pl.col("entry_map").first())
    for row in means.iter_rows(named=True):
        assert row["test_map"] == pytest.approx(row["entry_map"], abs=1e-9)
    best = cells.filter(pl.col("best"))["method"].unique().to_list()
    single_positive = means.filter(pl.col("method") != "an, full labels (oracle)")
    assert best == [single_positive.sort("test_map", descending=True)["method"][0]]
    # a mark is exactly "not significant after Holm" against the best; the oracle competes not
    assert cells.filter(pl.col("row_kind") == "oracle")["best"].to_list() == [False]
    compared = cells.filter(~pl.col("best") & (pl.col("row_kind") != "oracle"))
    for row in compared.iter_rows(named=True):
        assert row["not_worse"] == (row["p_holm"] >= 0.05)
    assert len((out / "commands.sh").read_text().strip().splitlines()) == 2 * 5

    # a second run trains nothing and writes the same table
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()}
    assert main(args) == 0
    again = capsys.readouterr()
    assert _trained(again.err) == 0 and again.out == md
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()}
    assert after == before  # not a file written: the rerun is a no-op on disk

    # one more draw for gr: only that cell trains; an's cells are kept
    assert main(["table", store, "--losses", "gr", "--observed-seeds", "1200,1,2",
                 "--out", str(out), *FAST]) == 0
    assert _trained(capsys.readouterr().err) == 1
    assert len(list((out / "cells").glob("*.json"))) == 6
    # a changed setting is a new cell, never a silent reuse
    assert main(["table", store, "--losses", "gr", "--observed-seeds", "1200",
                 "--out", str(out), "--epochs", "3", "--resamples", "200", "--quiet"]) == 0
    assert _trained(capsys.readouterr().err) == 1


def test_each_cell_command_reproduces_its_map(store, tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["table", store, "--losses", "gr", "--include", "full",
                 "--observed-seeds", "1", "--out", str(out), *FAST]) == 0
    capsys.readouterr()
    cells = pl.read_parquet(out / "cells.parquet")
    assert cells.height == 2
    for row in cells.iter_rows(named=True):  # re-run two cells: the oracle and gr on draw 1
        argv = shlex.split(row["command"])
        assert argv[:2] == ["spml", "probe"]
        record = tmp_path / f"{row['cell']}.json"
        assert main([*argv[1:], "--quiet", "--intervals", "0", "--json", str(record)]) == 0
        got = json.loads(record.read_text())["trials"][0]["best"]["test_map"]
        assert got == pytest.approx(row["test_map"], abs=1e-9)  # the same run, bit for bit
    capsys.readouterr()


@pytest.mark.parametrize("extra, flag", [
    (["--losses", "an,nope"], "--losses"),
    (["--losses", "vlpl"], "--losses"),
    (["--observed-seeds", "1200,7"], "--observed-seeds"),
    (["--priors", "clip"], "--priors"),
    (["--tune", "4"], "--tune"),
    (["--include", "half"], "--include"),
])
def test_a_refused_table_trains_and_writes_nothing(store, tmp_path, capsys, extra, flag):
    out = tmp_path / "t"
    argv = ["table", store, *extra, *FAST]
    if flag != "--tune":
        argv += ["--out", str(out)]
    before = tree_digest(Path(store))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and "error:" in err
    assert not out.exists()
    assert tree_digest(Path(store)) == before


def test_two_stores_of_one_dataset_are_refused(store, tmp_path, capsys):
    assert main(["table", store, store, "--losses", "an", *FAST,
                 "--out", str(tmp_path / "t")]) == 2
    assert "one column per dataset" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


@pytest.fixture(scope="module")
def prior_store(store, tmp_path_factory) -> str:
    """The yeast store with a prior 'clip': noisy scores that favour each image's labels."""
    from probe.store import open_store, write_prior

    path = tmp_path_factory.mktemp("prior") / "y.zarr"
    shutil.copytree(store, path)
    s = open_store(path)
    rng = np.random.default_rng(0)
    scores = (s.labels() * 0.3 + rng.random((s.n_rows, s.n_classes)) * 0.7).astype(np.float32)
    write_prior(path, "clip", scores, {"model": "test"})
    return str(path)


def test_prior_rows_and_an_honest_zero_shot_row(prior_store, tmp_path, capsys):
    from sklearn.metrics import average_precision_score

    from probe.store import open_store

    out = tmp_path / "t"
    assert main(["table", prior_store, "--losses", "an,vlpl,gpr", "--priors", "clip",
                 "--observed-seeds", "1200", "--out", str(out), *FAST]) == 0
    md = capsys.readouterr().out
    labels = [line.split("|")[1].strip() for line in md.splitlines() if line.startswith("| ")]
    assert labels[1:] == ["zero-shot (clip)", "an", "vlpl", "gpr"]
    cells = pl.read_parquet(out / "cells.parquet")
    zs = cells.filter(pl.col("row_kind") == "zero-shot")
    assert zs.height == 1 and zs["command"][0] == ""
    # an independent reference: scikit-learn's AP of the prior on the test rows, every class
    s = open_store(prior_store)
    test = s.split("test")
    y, p = s.labels()[test], s.prior("clip", rows=test).scores
    ref = 100 * np.mean([average_precision_score(y[:, c], p[:, c]) if y[:, c].any() else 0.0
                         for c in range(y.shape[1])])
    assert zs["test_map"][0] == pytest.approx(ref, abs=1e-3)
    assert "--priors clip" in cells.filter(pl.col("method") == "gpr")["command"][0]


def test_tune_adds_a_tuned_row_per_loss(store, tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["table", store, "--losses", "an,gr", "--tune", "2", "--observed-seeds", "1200",
                 "--out", str(out), *FAST]) == 0
    md = capsys.readouterr().out
    labels = [line.split("|")[1].strip() for line in md.splitlines() if line.startswith("| ")]
    assert labels[1:] == ["an", "an, tuned (2 trials)", "gr", "gr, tuned (2 trials)"]
    assert (out / "studies" / "yeast-gr").is_dir()
    cells = pl.read_parquet(out / "cells.parquet")
    tuned = cells.filter(pl.col("row_kind") == "tuned")
    assert tuned.height == 2
    gr_tuned = tuned.filter(pl.col("loss") == "gr")
    assert "--set" in gr_tuned["command"][0]  # the winner's hyperparameters, spelled out
    # one budget for every loss: the lr searched for both, no pruning, no verdict on test
    from studies.results.confirm import load_study
    from studies.study.storage import find_storage

    for loss in ("an", "gr"):
        study = load_study(find_storage(out / "studies" / f"yeast-{loss}"), f"table-yeast-{loss}")
        assert any(name.endswith("lr") for name in study.user_attrs["spml.space"]), loss
        assert study.user_attrs["spml.settings"]["pruner"] == "none"
    # a study folder's winner as a row of its own (--from), trained like the tuned row
    assert main(["table", store, "--losses", "an", "--from", str(out / "studies" / "yeast-gr"),
                 "--observed-seeds", "1200", "--out", str(out), *FAST]) == 0
    assert "| gr, searched (table-yeast-gr) |" in capsys.readouterr().out
    cells = pl.read_parquet(out / "cells.parquet")
    searched = cells.filter(pl.col("row_kind") == "study")
    assert searched["test_map"][0] == pytest.approx(gr_tuned["test_map"][0], abs=1e-9)
    assert searched["cell"][0] == gr_tuned["cell"][0]  # the same settings: the same cell


@pytest.mark.slow
def test_the_done_when_command(yeast_store, tmp_path, capsys):
    """The documented run: every loss plus the oracle on three draws, then one more draw (at
    three epochs: what is trained, kept and resumed does not depend on the epochs)."""
    from probe.store import add_observed_seed

    y = tmp_path / "y.zarr"
    shutil.copytree(yeast_store, y)
    for seed in (1, 2, 3):
        add_observed_seed(y, seed)
    out = tmp_path / "t"
    argv = ["table", str(y), "--observed-seeds", "1200,1,2", "--include", "full",
            "--epochs", "3", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    first = capsys.readouterr()
    from probe import available_losses, get_loss_class

    losses = [n for n in available_losses() if get_loss_class(n).prior is None]
    assert _trained(first.err) == 3 * len(losses) + 1
    assert (out / "table.tex").is_file() and (out / "cells.parquet").is_file()
    assert main(argv) == 0
    assert _trained(capsys.readouterr().err) == 0
    assert main(["table", str(y), "--losses", "gr", "--observed-seeds", "1200,1,2,3",
                 "--epochs", "3", "--out", str(out), "--quiet"]) == 0
    assert _trained(capsys.readouterr().err) == 1


def test_marks_follow_the_paired_test_within_the_column(store):
    """Three rows with known relations: gr given an's very heads (a difference of exactly 0:
    marked, Holm p = 1) and em given an's heads negated (far worse: not marked)."""

    from probe.engine.data import ProbeData
    from probe.evaluation.heads import stacked_logits
    from probe.metrics import mean_average_precision
    from studies.table import Table, TableConfig, plan_table
    from studies.table.cells import make_cells, train_cells

    plan = plan_table([store], TableConfig(losses=("an", "gr", "em"), observed_seeds=(1200, 1),
                                           epochs=2, lr=0.01, batch_size=32, resamples=200))
    cells = make_cells(plan)
    train_cells(plan, cells, progress=False, log=lambda m: None)
    data = ProbeData.from_store(store, device="cpu", flip=False)
    by = {name: sorted((c for c in cells if c.method.loss == name), key=lambda c: c.observed_seed)
          for name in ("an", "gr", "em")}
    for a, g, e in zip(by["an"], by["gr"], by["em"]):
        g.head, g.test_map = a.head.clone(), a.test_map
        e.head = -a.head
        logits = stacked_logits(data.test_x, e.head[None].float())[0]
        e.test_map = float(mean_average_precision(data.test_labels, logits=logits).map)
    table = Table(plan, cells)
    an, gr, em = (table.entries[(j, 0)] for j in range(3))
    assert an.best and not gr.best and not em.best  # a tie goes to the first row
    assert gr.not_worse and gr.p_holm == 1.0
    assert not em.not_worse and em.p_holm < 0.05
    rows = [line for line in table.markdown().splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| an | **") and rows[2].endswith("† |")
    assert "†" not in rows[3]


def test_the_default_draws_are_the_protocols_and_another_kind_is_refused(store, tmp_path,
                                                                          capsys):
    from probe.store import add_observed_seed

    path = tmp_path / "y.zarr"
    shutil.copytree(store, path)
    add_observed_seed(path, 5, k=3)  # a label budget: another experiment, not a protocol draw
    out = tmp_path / "t"
    assert main(["table", str(path), "--losses", "an", "--out", str(out), *FAST]) == 0
    capsys.readouterr()
    cells = pl.read_parquet(out / "cells.parquet")
    assert sorted(set(cells["observed_seed"].to_list())) == [1, 2, 1200]
    assert main(["table", str(path), "--losses", "an", "--observed-seeds", "1200,5",
                 *FAST]) == 2
    err = capsys.readouterr().err
    assert "--observed-seeds: draw 5" in err and "label budget" in err


def test_a_prior_overwritten_under_its_name_retrains_its_cells_and_says_why(store, tmp_path,
                                                                           capsys):
    from probe.store import open_store, write_prior

    path = tmp_path / "y.zarr"
    shutil.copytree(store, path)
    opened = open_store(path)
    rng = np.random.default_rng(0)
    write_prior(path, "p", rng.random((opened.n_rows, opened.n_classes)).astype(np.float32),
                provenance={"model": "random"})
    out = tmp_path / "t"
    args = ["table", str(path), "--losses", "vlpl", "--priors", "p", "--observed-seeds", "1200",
            "--out", str(out), *FAST]
    assert main(args) == 0
    first = capsys.readouterr()
    assert _trained(first.err) == 1
    assert main(args) == 0
    assert _trained(capsys.readouterr().err) == 0  # the same prior: kept
    write_prior(path, "p", rng.random((opened.n_rows, opened.n_classes)).astype(np.float32),
                provenance={"model": "random"}, overwrite=True)
    assert main(args) == 0
    again = capsys.readouterr()
    assert _trained(again.err) == 1
    assert "whose settings changed: prior (1)" in again.err
    assert again.out != first.out  # the zero-shot row reads the new prior too


def test_metrics_tables_bold_by_each_metrics_direction(store, tmp_path, capsys):
    args = ["table", store, "--losses", "an,gr,wan", "--observed-seeds", "1200,1",
            "--metrics", "ranking_loss,average_precision", "--stat", "std", *FAST]
    assert main(args) == 0
    md = capsys.readouterr().out
    for metric, lower in (("ranking_loss", True), ("average_precision", False)):
        block = md.split(f"**test {metric}**", 1)[1].split("Wilcoxon", 1)[0]
        rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line
                and not line.startswith("| method")]
        means = {r.split("|")[1].strip(): float(r.split("|")[2].strip().strip("*").split()[0]
                                                .strip("*")) for r in rows}
        bold = [r.split("|")[1].strip() for r in rows if "**" in r]
        pick = min if lower else max
        assert bold == [pick(means, key=means.get)], (metric, means, bold)
        assert "±" in block  # --stat std: mean ± std over the two draws
    assert "Wilcoxon signed-rank" in md
    assert main(["table", store, "--losses", "an", "--metrics", "accuracy", *FAST]) == 2
    assert "--metrics" in capsys.readouterr().err


def test_the_wilcoxon_p_equals_an_exact_enumeration():
    """scipy.stats.wilcoxon, as the table calls it, against the exact two-sided p of the
    signed-rank statistic enumerated over all 2^n sign patterns (no ties, n = 8)."""
    import itertools

    from scipy.stats import wilcoxon

    rng = np.random.default_rng(4)
    a = rng.normal(size=8)
    b = a - rng.normal(0.4, 1.0, size=8)
    d = a - b
    ranks = np.argsort(np.argsort(np.abs(d))) + 1
    w_plus = ranks[d > 0].sum()
    total = ranks.sum()
    stats = [sum(r for r, s in zip(ranks, signs) if s)
             for signs in itertools.product([0, 1], repeat=8)]
    observed = min(w_plus, total - w_plus)
    p_exact = np.mean([min(s, total - s) <= observed for s in stats])
    assert float(wilcoxon(a, b).pvalue) == pytest.approx(p_exact, rel=1e-9)
