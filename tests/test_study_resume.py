"""A study never repeats itself when it is extended, resumed after Ctrl-C, or run by several
workers: the sampler of a process that joins a study is seeded by the trials already told (and
by its worker index), so it does not replay the sequence another process drew from the same
seed. One test per sampler the CLI offers (tpe, random, cmaes, gp, grid)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from studies.study.run import run_study
from studies.study.settings import StudySettings

SAMPLERS = ["tpe", "random", "cmaes", "gp", "grid"]


def _settings(store, out, sampler, n_trials):
    grid = {"gr.w_T": (1.0, 3.0, 5.0, 7.0), "gr.b_T": (-3.0, 0.0, 3.0, 6.0)}
    return StudySettings(store=store, loss="gr", sampler=sampler, n_trials=n_trials, batch=4,
                         epochs=1, batch_size=64, lr=0.01, pruner="none", out=str(out),
                         name="resume", grid=grid if sampler == "grid" else {},
                         enqueue_paper=False)


def _params(out) -> list[tuple]:
    from studies.results.rows import read_results

    frame = read_results(out / "results")
    return [tuple(sorted(json.loads(p).items())) for p in frame["params"]]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_extending_a_study_repeats_no_parameter_set(yeast_store, tmp_path, sampler):
    out = tmp_path / sampler
    run_study(_settings(yeast_store, out, sampler, 8), log=lambda m: None, verdict=False)
    run_study(_settings(yeast_store, out, sampler, 16), log=lambda m: None, verdict=False)
    params = _params(out)
    assert len(params) == 16
    assert len(set(params)) == 16, "an extension replayed parameter sets already tried"


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_study_resumed_after_ctrl_c_repeats_no_parameter_set(yeast_store, tmp_path,
                                                               monkeypatch, sampler):
    import probe.engine.train as engine

    out = tmp_path / sampler
    real = engine.train_probe
    calls = {"n": 0}

    def interrupted_on_the_third_batch(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "train_probe", interrupted_on_the_third_batch)
    with pytest.raises(KeyboardInterrupt):
        run_study(_settings(yeast_store, out, sampler, 16), log=lambda m: None, verdict=False)
    monkeypatch.setattr(engine, "train_probe", real)
    run_study(_settings(yeast_store, out, sampler, 16), log=lambda m: None, verdict=False)
    summary = run_study(_settings(yeast_store, out, sampler, 16), log=lambda m: None,
                        verdict=False)  # nothing left to run: the summary of the whole study
    assert summary.n_failed == 0 and summary.n_interrupted == 4  # the interrupted batch
    params = _params(out)
    assert len(params) == 16  # rows of finished trials (the interrupted batch wrote none)
    assert len(set(params)) == 16, "the resumed study repeated parameter sets"


def test_the_seed_of_a_joining_process_differs_and_a_fresh_study_keeps_its_own():
    from studies.study.create import sampler_seed

    assert sampler_seed(7, 0, 0) == 7  # a new study: reproducible from its seed
    seeds = {sampler_seed(7, told, worker) for told in (0, 8, 16) for worker in (0, 1, 2)}
    assert len(seeds) == 9  # every (told, worker) its own sequence
    assert sampler_seed(7, 8, 1) == sampler_seed(7, 8, 1)  # deterministic


def test_a_grid_stops_when_every_cell_is_tried_and_says_so(yeast_store, tmp_path):
    out = tmp_path / "small-grid"
    settings = dataclasses.replace(_settings(yeast_store, out, "grid", 8),
                                   grid={"gr.w_T": (1.0, 3.0), "gr.b_T": (0.0, 3.0)})
    summary = run_study(settings, log=lambda m: None, verdict=False)
    params = _params(out)
    assert len(params) == 4 and len(set(params)) == 4  # every cell once, none repeated
    said = [line for line in summary.facts if "the grid is exhausted" in line]
    assert len(said) == 1 and "all 4 of its cells" in said[0] and "4 of --trials 8" in said[0]
    # extending an exhausted grid runs nothing again and says so again
    summary = run_study(dataclasses.replace(settings, n_trials=16), log=lambda m: None,
                        verdict=False)
    assert len(_params(out)) == 4
    assert any("4 of --trials 16" in line for line in summary.facts)


@pytest.mark.slow
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_two_workers_extending_a_study_repeat_no_parameter_set(yeast_store, tmp_path, sampler):
    from studies.cli import main

    out = tmp_path / sampler
    grid = ["--grid", "gr.w_T=1,3,5,7", "--grid", "gr.b_T=-3,0,3,6"] if sampler == "grid" else []
    for n_trials in ("8", "16"):
        code = main(["study", yeast_store, "--loss", "gr", "--sampler", sampler,
                     *grid, "--trials", n_trials, "--trials-at-once", "2", "--workers", "2",
                     "--storage", str(out / "study.log"), "--out", str(out), "--epochs", "1",
                     "--batch-size", "64", "--lr", "0.01", "--pruner", "none"])
        assert code == 0
    params = _params(out)
    assert len(params) == 16
    assert len(set(params)) == 16, "two workers extending the study repeated parameter sets"
