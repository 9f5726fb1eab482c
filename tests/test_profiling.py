"""``probe.profiling``: the torch.profiler summary that ``spml bench probe --profile``,
``spml bench featurize --profile`` and ``.ci/gpu`` report. Counts, not timings, are asserted:
how many calls of an operator were recorded says which work the profile covered."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from probe.bench.engine import profile_epoch
from probe.engine.config import ProbeConfig
from probe.engine.data import ProbeData
from probe.profiling import Profile, format_summary, summarize


def test_a_profile_counts_the_calls_made_inside_it_only():
    x = torch.randn(64, 64)
    x @ x  # before: not recorded
    with Profile("cpu", top=50) as prof:
        for _ in range(7):
            x @ x
        for _ in range(3):
            x + 1
    x @ x  # after: not recorded
    s = prof.summary
    calls = {row["name"]: row["calls"] for row in s["top"]}
    assert calls["aten::mm"] == 7 and calls["aten::add"] == 3
    assert s["device"] == "cpu" and s["sorted_by"] == "self_cpu_ms"
    assert s["wall_s"] > 0 and s["host_op_s"] > 0
    assert s["device_busy_s"] is None and s["device_busy_share"] is None
    assert s["kernel_launches"] == 0 and s["graph_launches"] == 0
    times = [row["self_cpu_ms"] for row in s["top"]]
    assert times == sorted(times, reverse=True)


def test_a_failing_block_leaves_no_summary():
    with pytest.raises(RuntimeError, match="inside"), Profile("cpu") as prof:
        raise RuntimeError("inside")
    assert prof.summary is None


@dataclass
class _Event:  # what key_averages() yields, as far as summarize reads it
    key: str
    count: int
    self_cpu_time_total: float  # µs
    self_device_time_total: float | None = 0.0


def test_on_a_gpu_the_kernels_set_the_order_and_the_busy_share():
    events = [_Event("aten::mm", 10, 500.0), _Event("sgemm_kernel_" + "x" * 200, 10, 0.0, 3000.0),
              _Event("cudaLaunchKernel", 25, 250.0), _Event("cudaGraphLaunch", 4, 40.0),
              _Event("elementwise_kernel", 15, 0.0, 1000.0)]
    s = summarize(events, wall_s=0.01, device="cuda", top=3)
    assert s["device_busy_s"] == pytest.approx(0.004)  # 3000 + 1000 µs of kernels
    assert s["device_busy_share"] == pytest.approx(0.4)
    assert s["host_op_s"] == pytest.approx(790e-6)
    assert (s["kernel_launches"], s["graph_launches"]) == (25, 4)
    assert s["sorted_by"] == "self_device_ms"
    assert [row["calls"] for row in s["top"]] == [10, 15, 10]  # sgemm, elementwise, then mm
    assert len(s["top"][0]["name"]) == 120  # a template instance's name is cut
    assert "note" not in s
    lines = format_summary(s, "one epoch", top=2)
    assert lines[0].startswith("profile of one epoch: 0.010 s wall, device busy 0.004 s (40% ")
    assert "25 kernel and 4 CUDA-graph launches" in lines[0]
    assert len(lines) == 3 and "3.0 ms on the device" in lines[1] and "10 calls" in lines[1]


def test_kernels_launched_without_kernel_time_say_the_device_was_not_recorded():
    """CUPTI missing: launches but no kernel time -- no busy share is claimed."""
    old = _Event("aten::mm", 2, 80.0, None)
    old.self_cuda_time_total = 0.0  # the name before torch 2.4
    s = summarize([old, _Event("cudaLaunchKernel", 2, 20.0)], wall_s=0.5, device="cuda")
    assert s["device_busy_s"] is None and s["device_busy_share"] is None
    assert s["sorted_by"] == "self_cpu_ms" and "no kernel time was recorded" in s["note"]
    assert "(kernels were launched" in format_summary(s, "x")[1]


def test_profile_epoch_records_one_training_epoch():
    """The second epoch of a fresh trainer and nothing else: one Adam step per batch."""
    rng = np.random.default_rng(0)

    def split(n):
        return rng.normal(size=(n, 8)).astype(np.float32), (rng.random((n, 3)) < 0.4) * 1

    data = ProbeData.from_arrays(split(64), split(16), split(16))
    config = ProbeConfig(batch_size=16, epochs=5, lr=1e-3, device="cpu")
    s = profile_epoch(data, config, "an", [{}, {}], top=500)
    calls = {row["name"]: row["calls"] for row in s["top"]}
    steps = 64 // 16
    assert calls["aten::_fused_adam_"] == steps
