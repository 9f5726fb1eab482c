"""What a researcher copies into a paper is right or says why not: Holm with a NaN among the
p-values, one-sided marks checked against an independent numpy paired bootstrap, a diverged row
that reads n/a, the oracle as a reference row, identical rows named, cells that peaked at their
last epoch counted."""

from __future__ import annotations

import math
from statistics import NormalDist
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from probe.errors import SpmlError
from probe.evaluation.intervals import (
    BootstrapResult,
    count_non_finite,
    holm,
    mean_interval,
    paired_differences,
)

# ----------------------------------------------------------------------------- Holm


def _holm_rejects(p: list[float], alpha: float) -> list[bool]:
    """Holm's procedure as its definition states it (reference): order the finite p-values;
    reject H_(1), H_(2), … while p_(k) <= alpha / (m - k + 1); stop at the first that is not."""
    finite = sorted((v, i) for i, v in enumerate(p) if not math.isnan(v))
    m = len(finite)
    reject = [False] * len(p)
    for k, (v, i) in enumerate(finite):
        if v > alpha / (m - k):
            break
        reject[i] = True
    return reject


def test_holm_leaves_a_nan_out_of_the_family_instead_of_poisoning_it():
    adjusted = holm([0.001, math.nan, 0.001, 0.001])
    assert math.isnan(adjusted[1])
    assert adjusted[0] == adjusted[2] == adjusted[3] == pytest.approx(0.003)  # m = 3, not 4


@pytest.mark.parametrize("seed", range(20))
def test_holm_adjusted_p_values_reject_exactly_what_the_procedure_rejects(seed):
    rng = np.random.default_rng(seed)
    p = list(rng.uniform(0.0, 0.08, size=rng.integers(2, 8)))  # near 0.02-0.05: Holm matters
    if seed % 3 == 0:
        p[rng.integers(len(p))] = math.nan
    adjusted = holm(p)
    for alpha in (0.01, 0.025, 0.05, 0.1):
        assert [not math.isnan(a) and a <= alpha for a in adjusted] == _holm_rejects(p, alpha)


def test_holm_and_no_holm_disagree_where_the_correction_matters():
    p = [0.02, 0.03, 0.04]
    assert all(v < 0.05 for v in p)  # each alone: significant
    assert [a < 0.05 for a in holm(p)] == [False, False, False]  # 0.06, 0.06, 0.06


def test_holm_refuses_a_p_value_outside_zero_one():
    with pytest.raises(SpmlError, match=r"holm: p-values must be in \[0, 1\].*1.5 at position 1"):
        holm([0.1, 1.5])


# ----------------------------------------------------------------------------- means


def test_a_diverged_run_makes_the_mean_nan_and_is_counted():
    iv = mean_interval([40.0, math.nan, 42.0])
    assert math.isnan(iv.value) and math.isnan(iv.low) and math.isnan(iv.high)
    assert count_non_finite([40.0, math.nan, math.inf, None, 1.0]) == 3
    assert mean_interval([40.0, 42.0]).value == pytest.approx(41.0)


# ----------------------------------------------------------------------------- the marks


def _numpy_one_sided_marks(reps: np.ndarray, maps: np.ndarray, best: int, alpha: float
                           ) -> dict[int, bool]:
    """Independent reference: for each row j != best, the paired bootstrap differences
    best - j, a one-sided p from their standard error (normal approximation), Holm over the
    rows; True where the row is *not* significantly worse."""
    rows = [j for j in range(len(maps)) if j != best]
    p = []
    for j in rows:
        d = reps[best] - reps[j]
        se = d.std(ddof=1)
        p.append(NormalDist().cdf(-(maps[best] - maps[j]) / se))
    rejected = _holm_rejects(p, alpha)
    return {j: not r for j, r in zip(rows, rejected)}


def test_one_sided_marks_equal_a_numpy_paired_bootstrap_on_a_three_row_toy():
    rng = np.random.default_rng(3)
    b = 2000
    base = rng.normal(size=b)
    reps = np.stack([50 + base + 0.3 * rng.normal(size=b),          # the best
                     49.45 + base + 0.3 * rng.normal(size=b),       # ~ one-sided p 0.1
                     48.9 + base + 0.3 * rng.normal(size=b)])       # clearly worse
    maps = reps.mean(1)
    boot = BootstrapResult(map=torch.tensor(maps), replicates=torch.tensor(reps), intervals=[],
                           n_resamples=b, seed=0, level=0.95)
    diffs = paired_differences(boot, [(0, 1), (0, 2)], alternative="greater")
    expected = _numpy_one_sided_marks(reps, maps, 0, 0.05)
    assert {d.b: not d.significant for d in diffs} == expected
    assert expected == {1: True, 2: False}
    for d in diffs:  # the one-sided p is half the two-sided one for a positive difference
        two = paired_differences(boot, [(d.a, d.b)])[0]
        assert d.p_value == pytest.approx(two.p_value / 2, rel=1e-9)


def test_a_pair_with_a_nan_row_has_no_p_and_leaves_the_family():
    reps = torch.tensor([[50.0, 51.0, 50.5], [49.0, 48.0, 49.5], [math.nan] * 3],
                        dtype=torch.float64)
    boot = BootstrapResult(map=reps.mean(1), replicates=reps, intervals=[], n_resamples=3,
                           seed=0, level=0.95)
    diffs = paired_differences(boot, [(0, 1), (0, 2)], alternative="greater")
    assert math.isnan(diffs[1].p_value) and math.isnan(diffs[1].p_holm)
    assert diffs[0].p_holm == pytest.approx(diffs[0].p_value)  # a family of one


# ----------------------------------------------------------------------------- notes


def _cell(label, kind, seed, head, curve=None, path="s.zarr"):
    method = SimpleNamespace(label=label, kind=kind)
    record = None if curve is None else {"trials": [{"epochs": [{"val_map": v} for v in curve]}]}
    return SimpleNamespace(method=method, column=SimpleNamespace(path=path), observed_seed=seed,
                           head=head, record=record)


def test_rows_that_trained_the_same_heads_are_named_once():
    from studies.table.render import identical_rows_notes

    h = torch.randn(5, 3)
    methods = [SimpleNamespace(label=n, kind="preset") for n in ("zlpr", "opml", "an")]
    cells = []
    for seed in (1200, 1):
        cells += [_cell("zlpr", "preset", seed, h + seed), _cell("opml", "preset", seed,
                                                                  h + seed + 1e-8),
                  _cell("an", "preset", seed, h - seed)]
    (note,) = identical_rows_notes(methods, cells)
    assert note.startswith("zlpr and opml trained the same heads on every store and draw")
    cells[4].head = h + 1 + 1e-3  # one draw differs: not the same method
    assert identical_rows_notes(methods, cells) == []


def test_cells_that_peaked_at_their_last_epoch_are_counted_with_the_fix():
    from studies.table.render import convergence_notes, count_peaked_at_last

    cells = [_cell("an", "preset", 1, None, [1.0, 2.0, 3.0]),
             _cell("gr", "preset", 1, None, [1.0, 3.0, 2.0]),
             _cell("em", "preset", 1, None, [1.0, 2.0, 2.5]),
             _cell("zero", "zero-shot", 1, None)]
    assert count_peaked_at_last(cells) == (2, 3)
    (note,) = convergence_notes(cells, None)
    assert note.startswith("2 of 3 trained cells peaked at their last epoch")
    assert "--epochs" in note and "--lr" in note and "--tune" in note
    assert convergence_notes(cells[1:2], None) == []


def test_a_row_with_a_diverged_draw_reads_n_a_and_is_not_marked():
    from studies.table.render import Entry, entry_text

    method = SimpleNamespace(loss="gr")
    cells = [SimpleNamespace(method=method, observed_seed=s) for s in (1200, 1, 2)]
    iv = mean_interval([41.0, math.nan, 43.0])
    e = Entry(0, 0, cells, iv.value, iv.low, iv.high, "draws", not_worse=True,
              n_diverged=count_non_finite([41.0, math.nan, 43.0]))
    assert not e.competes
    assert entry_text(e, ("**", "**"), " †", "{}") == "n/a (1 of 3 diverged)"
    fine = Entry(1, 0, cells, 42.0, 41.0, 43.0, "draws", not_worse=True)
    assert entry_text(fine, ("**", "**"), " †", "{}") == "42.00 [41.00, 43.00] (3) †"
    oracle = Entry(2, 0, cells[:1], 50.0, 49.0, 51.0, "images", not_worse=True, reference=True)
    assert "†" not in entry_text(oracle, ("**", "**"), " †", "{}")


# ----------------------------------------------------------------------------- kept heads


def test_two_studies_in_one_folder_each_score_their_own_heads(yeast_store, tmp_path):
    """Two ``run_study`` calls with one ``out``: each verdict scores the heads its own trials
    kept, never the other study's (their trial numbers are the same)."""
    from studies.results.rows import read_trial_heads
    from studies.study.run import run_study
    from studies.study.settings import StudySettings

    out = tmp_path / "shared"
    verdicts = {}
    for loss in ("an_ls", "gr"):
        settings = StudySettings(store=yeast_store, loss=loss, n_trials=2, batch=2, epochs=2,
                                 batch_size=32, lr=0.01, pruner="none", out=str(out),
                                 name=f"s-{loss}")
        summary = run_study(settings, log=lambda m: None)
        verdicts[loss] = summary.verdict
    assert len(list((out / "results").glob("heads-s-an_ls-*.pt"))) == 1
    assert len(list((out / "results").glob("heads-s-gr-*.pt"))) == 1
    from studies.results.confirm import load_study
    from studies.results.rows import study_tag
    from studies.study.storage import find_storage

    heads = {}
    for loss in ("an_ls", "gr"):
        study = load_study(find_storage(out), f"s-{loss}")
        heads[loss] = read_trial_heads(out / "results", study_tag(study))
        assert sorted(heads[loss]) == [0, 1]
    assert not torch.equal(heads["an_ls"][0][0], heads["gr"][0][0])
    # each verdict's winner is its own study's trial, scored on its own kept head
    from probe.engine.data import ProbeData
    from probe.evaluation.heads import stacked_logits
    from probe.metrics import mean_average_precision

    data = ProbeData.from_store(yeast_store, device="cpu", flip=False)
    for loss in ("an_ls", "gr"):
        v = verdicts[loss]
        head = heads[loss][v.winner.trial][0]
        scores = stacked_logits(data.test_x, head[None].float())[0]
        expected = float(mean_average_precision(data.test_labels.bool(), logits=scores).map)
        assert v.winner.test_map == pytest.approx(expected, abs=1e-4)  # float32 AP
    assert verdicts["an_ls"].winner.test_map != verdicts["gr"].winner.test_map


# ----------------------------------------------------------------------------- one store rule


@pytest.fixture
def two_stores(yeast_store, tmp_path):
    """A copy of the yeast store with a label-budget draw 5, and another build of yeast (a
    30% test split)."""
    import shutil

    from featurize.imports import import_yeast
    from probe.store import add_observed_seed

    mine = tmp_path / "mine.zarr"
    shutil.copytree(yeast_store, mine)
    add_observed_seed(mine, 5, k=2)
    other = tmp_path / "other.zarr"
    import_yeast(other, test_fraction=0.3, progress=False)
    return mine, other


def _study(store, out, **kw):
    from studies.results.confirm import load_study
    from studies.study.run import run_study
    from studies.study.settings import StudySettings
    from studies.study.storage import find_storage

    settings = StudySettings(store=str(store), loss="an_ls", n_trials=2, batch=2, epochs=2,
                             batch_size=32, lr=0.01, pruner="none", out=str(out), name="s", **kw)
    run_study(settings, log=lambda m: None, verdict=False)
    return load_study(find_storage(out), "s")


def test_a_from_row_keeps_its_studys_val_labels_and_store(two_stores, tmp_path, capsys):
    from studies.cli import main

    mine, other = two_stores
    _study(mine, tmp_path / "st", val_labels="observed")
    out = tmp_path / "t"
    assert main(["table", str(mine), "--losses", "an", "--from", str(tmp_path / "st"),
                 "--observed-seeds", "1200", "--epochs", "2", "--resamples", "200", "--quiet",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    commands = (out / "commands.sh").read_text()
    assert "--loss an_ls" in commands and "--val-labels observed" in commands
    assert main(["table", str(other), "--losses", "an", "--from", str(tmp_path / "st"),
                 "--observed-seeds", "1200", "--epochs", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--from" in err and "another store" in err


def test_confirm_refuses_another_store_and_adds_draws_of_the_studys_kind(two_stores, tmp_path):
    from fixtures_datasets import tree_digest

    from probe.store import open_store
    from probe.store.records import draw_record
    from studies.results.confirm import confirm_study
    from studies.study.storage import StudyError

    mine, other = two_stores
    study = _study(mine, tmp_path / "st", observed_seed=5)  # trained on the label budget
    before = tree_digest(other)
    with pytest.raises(StudyError, match=r"STORE .*other.zarr: not the store study 's' trained"):
        confirm_study(study, str(other), top_k=1, seeds=(0,))
    assert tree_digest(other) == before  # refused before anything was written
    before = tree_digest(mine)
    with pytest.raises(StudyError, match=r"--observed-seeds: draw 1200 .* the study trained on "
                                         r"k=2 positives"):
        confirm_study(study, str(mine), top_k=1, seeds=(0,), observed_seeds=(9, 1200))
    assert tree_digest(mine) == before  # draw 9 was not added either
    rows = confirm_study(study, str(mine), top_k=1, seeds=(0,), observed_seeds=(5, 9))
    assert rows and draw_record(dict(open_store(mine).attrs), 9) == {
        "kind": "budget", "k": 2, "fraction": 1.0}


# ----------------------------------------------------------------------------- small test sets


def test_a_probe_on_eight_test_images_warns_about_its_interval_once(tmp_path, capsys):
    from featurize.imports import import_arrays
    from studies.cli import main

    rng = np.random.default_rng(0)
    y = (rng.random((80, 4)) < 0.3).astype(np.uint8)
    y[np.arange(80), rng.integers(0, 4, 80)] = 1
    x = (y @ rng.normal(size=(4, 6)) + rng.normal(size=(80, 6))).astype(np.float32)
    import_arrays(tmp_path / "s.zarr", x[:72], y[:72], test_features=x[72:],
                  test_labels=y[72:], name="small", progress=False)
    assert main(["probe", str(tmp_path / "s.zarr"), "--loss", "an", "--epochs", "2",
                 "--intervals", "200", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("rest on 8 test images (fewer than 50)") == 1
    from probe.evaluation.intervals import few_test_images

    assert few_test_images(50) is None


# ----------------------------------------------------------------------------- the verdict's p


@pytest.mark.parametrize(("p_value", "said"), [(0.0004, "p < 0.001"), (0.0312, "p = 0.031")])
def test_the_verdict_states_its_p_value_as_a_sentence_reads(p_value, said):
    """Below the printed precision the verdict says "p < 0.001", never "p = <0.001"."""
    from studies.study.verdict import Verdict, VerdictRow, format_verdict

    winner = VerdictRow("winner", 3, 42.7, 40.5, 38.3, 41.8)
    paper = VerdictRow("paper values", 0, 41.8, 44.5, 41.9, 46.8)
    verdict = Verdict(winner=winner, paper=paper, references=[], diff=-4.0, diff_low=-6.4,
                      diff_high=-2.0, p_holm=None, n_test=483, level=0.95,
                      winner_is_paper=False, p_value=p_value)
    lines = [line for line in format_verdict(verdict) if "(paired bootstrap, uncorrected)" in line]
    assert len(lines) == 1 and lines[0].strip().startswith(f"{said} (paired bootstrap")
