"""The code stays lint-clean (ruff, as configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    pytest.importorskip("ruff", reason="ruff comes with the dev extra")
    ruff = shutil.which("ruff") or f"{sys.executable} -m ruff"
    run = subprocess.run([*ruff.split(), "check", "probe", "featurize", "studies", "tests",
                          "examples"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
