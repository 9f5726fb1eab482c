"""Where a run's time goes: a ``torch.profiler`` summary small enough for a JSON report.

``spml bench probe --profile`` and ``spml bench featurize --profile`` attach one to their
measurements, and ``.ci/gpu`` puts it beside each GPU figure that misses its target, so that the
next change is chosen from data rather than guessed. A summary says how long the profiled work
took, how much of that the device was busy (on a GPU: a small share means the host -- Python,
kernel launches, synchronisations -- sets the pace; a large one, the kernels themselves), how
many kernels and CUDA graphs were launched, and the operators and kernels that took the most
time, each with its number of calls::

    with Profile(device) as prof:
        work()
    prof.summary  # {"wall_s": ..., "device_busy_share": ..., "top": [...], ...}

Profiling slows what it watches (most where many small operators run), so the figures of a
benchmark are timed without it and the profile is taken in a run of its own.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import torch

__all__ = ["TOP_OPERATORS", "Profile", "format_summary", "summarize"]

#: operators and kernels a summary lists, the most expensive first
TOP_OPERATORS = 12

#: runtime calls that launch one kernel, or one whole CUDA graph
_KERNEL_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                    "cuLaunchKernelEx", "cudaLaunchCooperativeKernel")
_GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")

#: a kernel's name (a C++ template instance) beyond this many characters is cut
_NAME_CHARS = 120


class Profile:
    """Profile what runs inside ``with Profile(device) as prof:``; ``prof.summary`` is then
    :func:`summarize`'s dict. On a CUDA device the kernels are recorded too, and the device is
    synchronised at both ends so that the wall time covers the work started inside."""

    def __init__(self, device: torch.device | str, top: int = TOP_OPERATORS) -> None:
        self.device = torch.device(device)
        self.top = top
        self.summary: dict[str, Any] | None = None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        else:
            # kineto's start/stop lines and its "no GPU" error say nothing about a CPU profile
            # (read when the process's first profile starts; a level the user set stays)
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        self._profiler = torch.profiler.profile(activities=activities)
        self._t0 = 0.0

    def __enter__(self) -> Profile:
        self._sync()
        with warnings.catch_warnings():  # kineto's notices on a machine without a GPU
            warnings.simplefilter("ignore")
            self._profiler.__enter__()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sync()
        wall = time.perf_counter() - self._t0
        self._profiler.__exit__(*exc)
        if exc[0] is None:
            self.summary = summarize(self._profiler.key_averages(), wall, self.device, self.top)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def summarize(averages: Any, wall_s: float, device: torch.device | str,
              top: int = TOP_OPERATORS) -> dict[str, Any]:
    """A JSON-able summary of ``torch.profiler``'s ``key_averages()`` over ``wall_s`` seconds:

    * ``host_op_s``: the operators' own CPU time, summed over every thread;
    * ``device_busy_s`` and ``device_busy_share`` (of ``wall_s``): the kernels' time, on a CUDA
      device (None elsewhere);
    * ``kernel_launches`` and ``graph_launches``: runtime launch calls (0 on the CPU);
    * ``top``: the ``top`` operators and kernels by their own device time (on a CUDA device) or
      CPU time, each with ``calls``, ``self_cpu_ms`` and ``self_device_ms``.
    """
    cuda = torch.device(device).type == "cuda"
    rows = []
    host_us = device_us = 0.0
    launches = {"kernel": 0, "graph": 0}
    for event in averages:
        self_device = _self_device_us(event)
        host_us += event.self_cpu_time_total
        device_us += self_device
        if event.key in _KERNEL_LAUNCHES:
            launches["kernel"] += event.count
        elif event.key in _GRAPH_LAUNCHES:
            launches["graph"] += event.count
        rows.append({"name": event.key[:_NAME_CHARS], "calls": int(event.count),
                     "self_cpu_ms": round(event.self_cpu_time_total / 1e3, 3),
                     "self_device_ms": round(self_device / 1e3, 3)})
    # kernels launched but no kernel time: the device's activity was not recorded (CUPTI)
    recorded = cuda and (device_us > 0 or launches["kernel"] + launches["graph"] == 0)
    by = "self_device_ms" if recorded else "self_cpu_ms"
    rows.sort(key=lambda r: r[by], reverse=True)
    device_s = device_us / 1e6 if recorded else None
    summary = {"device": str(device), "wall_s": round(wall_s, 6),
               "host_op_s": round(host_us / 1e6, 6),
               "device_busy_s": None if device_s is None else round(device_s, 6),
               "device_busy_share": (None if device_s is None or wall_s <= 0
                                     else round(device_s / wall_s, 4)),
               "kernel_launches": launches["kernel"], "graph_launches": launches["graph"],
               "sorted_by": by, "top": rows[:top]}
    if cuda and not recorded:
        summary["note"] = ("kernels were launched but no kernel time was recorded (is CUPTI "
                           "available?): the device's busy share is not measured")
    return summary


def format_summary(summary: dict[str, Any], what: str, top: int = 5) -> list[str]:
    """``summary`` as text lines under the heading ``what``: the busy share, the launches and
    the ``top`` most expensive operators."""
    if summary.get("device_busy_share") is not None:
        busy = (f"device busy {summary['device_busy_s']:.3f} s "
                f"({100 * summary['device_busy_share']:.0f}% of the wall time)")
    else:
        busy = f"operators' own CPU time {summary['host_op_s']:.3f} s (all threads)"
    lines = [f"profile of {what}: {summary['wall_s']:.3f} s wall, {busy}, "
             f"{summary['kernel_launches']} kernel and {summary['graph_launches']} CUDA-graph "
             "launches"]
    if summary.get("note"):
        lines.append(f"  ({summary['note']})")
    column = summary["sorted_by"]
    unit = "ms on the device" if column == "self_device_ms" else "ms of CPU"
    for row in summary["top"][:top]:
        lines.append(f"  {row[column]:>10.1f} {unit} {row['calls']:>8} calls  {row['name']}")
    return lines


def _self_device_us(event: Any) -> float:
    """An averaged event's own device time in µs (``self_cuda_time_total`` before torch 2.4)."""
    value = getattr(event, "self_device_time_total", None)
    if value is None:
        value = getattr(event, "self_cuda_time_total", 0.0)
    return float(value or 0.0)
