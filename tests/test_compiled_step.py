"""The training step through ``torch.compile`` (``ProbeConfig.compile``, ``spml probe
--compile``) against the eager step: the same heads to float rounding after several epochs, for
GR and AN, one trial and several stacked ones, on a tiny shape (inductor's CPU backend compiles
C++ with g++ here: 3-35 s per configuration, from inductor's cache or cold). Where the compiled
step cannot apply, the eager step runs and a warning says why. The same comparison on CUDA,
where the compiled step is captured in the step's CUDA graph, is marked gpu.

Tolerance: inductor fuses the loss, its gradient and Adam into a few kernels and reorders their
float32 sums, so the heads differ from the eager step's by rounding only; after 4 epochs of 8
steps at lr 1e-2 they agree within ``atol=2e-5, rtol=1e-4`` (measured on this CPU: at most 4e-6).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch

from probe.engine.config import ProbeConfig, ProbeConfigError
from probe.engine.data import ProbeData
from probe.engine.speed import SpeedOptions
from probe.engine.train import train_probe

pytest.importorskip("torch._dynamo")
TOL = dict(atol=2e-5, rtol=1e-4)
CASES = [
    ("gr", None),  # one trial: GR's schedule moves every epoch
    ("gr", [{"w_T": 2.0}, {"w_T": 10.0, "lr": 3e-2}, {"b_T": -2.0, "weight_decay": 1e-3}]),
    ("an", None),
    ("an", [{"lr": 1e-2}, {"lr": 3e-2, "weight_decay": 1e-3}, {"lr": 1e-1}]),
]
# on 2 busy cores a cold compile (no inductor cache) takes 10-35 s: two cases (1 GR trial, 3
# stacked AN trials) run always, the other two with SPML_SLOW=1
SLOW = pytest.mark.slow


def _data(d: int = 12, classes: int = 8) -> ProbeData:
    rng = np.random.default_rng(5)
    out = []
    for n in (64, 24, 24):
        y = (rng.random((n, classes)) < 0.3).astype(np.uint8)
        y[np.arange(n), rng.integers(0, classes, n)] = 1
        x = y @ rng.normal(size=(classes, d)) + rng.normal(size=(n, d))
        out.append((x.astype(np.float16), y))
    flips = out[0][0][:, ::-1].copy()
    return ProbeData.from_arrays(*out, train_flip=flips)


def _frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _check(data: ProbeData, cfg: ProbeConfig, loss: str, trials) -> None:
    torch._dynamo.reset()
    before = _frames_compiled()
    eager = train_probe(data, cfg, loss, trials)
    compiled = train_probe(data, replace(cfg, compile=True), loss, trials)
    assert compiled.timing["compiled"] and not eager.timing["compiled"]
    # one graph for the run: the schedule's per-epoch values are tensors, not constants
    # (one more for a last partial batch of another shape)
    graphs = _frames_compiled() - before
    assert 1 <= graphs <= (1 if cfg.drop_last else 2), graphs
    torch.testing.assert_close(compiled.final_heads, eager.final_heads, **TOL)
    diff = (compiled.final_heads - eager.final_heads).abs().max().item()
    moved = (eager.final_heads - train_probe(data, replace(cfg, epochs=1), loss, trials)
             .final_heads).abs().max().item()
    assert moved > 100 * max(diff, 1e-7)  # the training moved the heads far more than that
    for a, b in zip(compiled.trials, eager.trials, strict=True):
        losses = [[e["train_loss"] for e in r.epochs] for r in (a, b)]
        assert len(losses[0]) == cfg.epochs and np.allclose(*losses, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("loss,trials", [
    CASES[0], pytest.param(*CASES[1], marks=SLOW), pytest.param(*CASES[2], marks=SLOW), CASES[3]])
def test_compiled_step_equals_the_eager_step_on_cpu(loss, trials):
    cfg = ProbeConfig(epochs=4, batch_size=8, lr=1e-2, eval_every=0, device="cpu")
    _check(_data(), cfg, loss, trials)


def test_compiled_trials_train_in_one_block():
    """Trial blocks would compile the step once per block: --compile trains one block, and the
    run says it ran compiled."""
    cfg = ProbeConfig(epochs=1, batch_size=8, lr=1e-2, eval_every=0, device="cpu", compile=True)
    trials = [{"w_T": 2.0}, {"w_T": 6.0}, {"w_T": 10.0}]
    result = train_probe(_data(), cfg, "gr", trials, speed=SpeedOptions(trial_block=1))
    assert result.timing["trial_blocks"] == [3] and result.timing["compiled"]
    eager = train_probe(_data(), replace(cfg, compile=False), "gr", trials,
                        speed=SpeedOptions(trial_block=1))
    assert eager.timing["trial_blocks"] == [1, 1, 1] and not eager.timing["compiled"]


@pytest.mark.slow
def test_compiled_step_with_several_seeds_and_a_partial_last_batch():
    """Trials of different seeds (one loss object each, a batched product) and drop_last off
    (the last batch of 64 % 7 = 1 row compiles a second graph)."""
    cfg = ProbeConfig(epochs=3, batch_size=7, lr=1e-2, eval_every=0, device="cpu",
                      drop_last=False, seeds=[0, 1, 2])
    _check(_data(), cfg, "an", None)


@pytest.mark.slow
@pytest.mark.parametrize("seeds", [None, [0, 1, 2]])
def test_compiled_step_with_a_trial_stopped_after_the_first_epoch(seeds):
    """A pruned trial leaves the stack (its head, Adam state, per-trial lr and the loss's rows):
    the others go on through a recompiled step as in the eager run with the same stop."""
    cfg = ProbeConfig(epochs=3, batch_size=8, lr=1e-2, device="cpu", seeds=seeds)
    trials = [{"w_T": 2.0}, {"w_T": 6.0, "lr": 3e-2}, {"w_T": 10.0}]

    def stop(report):
        return [1] if report.epoch == 1 else []

    eager = train_probe(_data(), cfg, "gr", trials, callback=stop)
    compiled = train_probe(_data(), replace(cfg, compile=True), "gr", trials, callback=stop)
    assert compiled.timing["compiled"]
    assert [t.stopped_at for t in compiled.trials] == [t.stopped_at for t in eager.trials]
    assert [t.stopped_at for t in eager.trials] == [None, 1, None]
    torch.testing.assert_close(compiled.final_heads, eager.final_heads, **TOL)


def test_the_eager_step_runs_where_the_step_cannot_be_compiled():
    data = _data()
    cfg = ProbeConfig(epochs=1, batch_size=8, eval_every=0, device="cpu", compile=True)
    with pytest.warns(RuntimeWarning, match=r"--compile: the eager step runs instead \(only "
                      r"the Adam update"):
        result = train_probe(data, replace(cfg, optimizer="sgd"), "an")
    assert result.timing["compiled"] is False
    with pytest.warns(RuntimeWarning, match=r"--compile.*the gr loss keeps state"):
        result = train_probe(data, cfg, "gr", {"learn_kv": True})  # its own parameters
    assert result.timing["compiled"] is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert train_probe(data, replace(cfg, compile=False), "an").timing["compiled"] is False
    with pytest.raises(ProbeConfigError, match="--compile must be true or false; got yes"):
        ProbeConfig(compile="yes").validate()


def test_the_eager_step_takes_over_when_the_compiler_fails_on_the_first_step(monkeypatch):
    """A failure inside torch.compile (tracing, inductor, the C++ compiler) at the first step:
    a warning, and the run trains eagerly from that step on -- the eager run's heads exactly."""
    from probe.engine import loop

    def failing(fn, **kwargs):
        def call(*args):
            raise torch._dynamo.exc.InternalTorchDynamoError("boom\nthe rest")
        return call

    monkeypatch.setattr(loop.torch, "compile", failing)
    data = _data()
    cfg = ProbeConfig(epochs=2, batch_size=8, lr=1e-2, eval_every=0, device="cpu")
    with pytest.warns(RuntimeWarning, match=r"--compile: the eager step runs instead "
                      r"\(torch.compile failed: boom\)"):
        failed = train_probe(data, replace(cfg, compile=True), "an")
    assert failed.timing["compiled"] is False
    assert torch.equal(failed.final_heads, train_probe(data, cfg, "an").final_heads)


@pytest.mark.slow
def test_spml_probe_compile_flag(tmp_path):
    """``spml probe --compile`` trains through the compiled step, its --json says so, and the
    best val mAP is the eager run's to float rounding."""
    from fixtures_datasets import toy_feature_store

    from studies.cli import main

    store = toy_feature_store(tmp_path / "toy.zarr")
    runs = {}
    for flag in ("--compile", "--no-cuda-graph"):
        out = tmp_path / f"{flag}.json"
        assert main(["probe", str(store), "--loss", "an", "--epochs", "2", "--batch-size", "8",
                     "--device", "cpu", "--json", str(out), "--quiet", flag]) == 0
        runs[flag] = json.loads(out.read_text())
    assert runs["--compile"]["timing"]["compiled"] is True
    assert runs["--no-cuda-graph"]["timing"]["compiled"] is False
    a, b = (runs[f]["trials"][0]["best"]["val_map"] for f in ("--compile", "--no-cuda-graph"))
    assert a == pytest.approx(b, abs=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("loss,trials", [CASES[0], CASES[3]])  # a compile each: two cases
def test_compiled_step_equals_the_eager_step_on_cuda(loss, trials):
    """On CUDA the compiled step is captured in the step's CUDA graph (the default there):
    compiled + graph against the eager step without graphs."""
    cfg = ProbeConfig(epochs=4, batch_size=8, lr=1e-2, eval_every=0, device="cuda",
                      cuda_graph=False)
    data = _data()
    eager = train_probe(data, cfg, loss, trials)
    both = train_probe(data, replace(cfg, compile=True, cuda_graph=True), loss, trials)
    assert both.timing["compiled"] and both.timing["cuda_graph"]
    torch.testing.assert_close(both.final_heads, eager.final_heads, **TOL)
