"""Where work runs: the device a ``--device`` names and whether ``torch.compile`` can compile for
it. A leaf that the engine, the featurizer and the studies share (featurizing knows no trainer,
so these do not live in the engine)."""

from __future__ import annotations

import importlib.util
import os
import shutil

import torch

from probe.errors import DataError

__all__ = ["inductor_unavailable", "resolve_device"]


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` → CUDA when available, else CPU; ``"cuda"`` without a GPU is an error."""
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise DataError(f"--device must be auto, cpu, cuda or cuda:N; got {name}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DataError(f"--device {name}: this machine has no usable CUDA GPU (torch sees "
                          "none); use --device cpu or --device auto")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DataError(f"--device {name}: this machine has CUDA devices 0 to "
                          f"{torch.cuda.device_count() - 1} only")
    return dev


def inductor_unavailable(device: torch.device) -> str | None:
    """Why ``torch.compile``'s inductor cannot compile for ``device`` here (None: it can); the
    probe's ``--compile`` and the featurizer's share it."""
    cxx = os.environ.get("CXX", "g++")
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "inductor needs Triton on CUDA, and it is not installed"
    if device.type == "cpu" and shutil.which(cxx) is None:
        return f"inductor needs a C++ compiler on the CPU ({cxx}, or $CXX), none found"
    if device.type not in ("cpu", "cuda"):
        return f"inductor does not compile for {device}"
    return None
