"""The examples a student reads top to bottom must keep running as the library changes."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, capsys):
    pytest.importorskip("river", reason="the examples use the yeast set shipped inside river")
    runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert "test mAP" in out
    if path.name == "gr_on_yeast.py":  # best epochs count from 1, up to the 10 trained
        epochs = [int(e) for e in re.findall(r"best epoch\s+(\d+)", out)]
        assert len(epochs) == 4 and all(1 <= e <= 10 for e in epochs)


def test_readme_setup_commands_are_what_ci_runs():
    root = Path(__file__).parent.parent
    readme = root / "README.md"
    lines, on = [], False
    for line in readme.read_text().splitlines():
        on = (on or line.startswith("## Set up")) and not line.startswith("## Tour")
        if on and line.startswith("pip install"):
            lines.append(line)
    assert lines == ["pip install -e '.[yeast]' && spml demo",
                     "pip install -e '.[dev]' && python -m pytest -q"]
    assert "awk '/^## Set up/{on=1} /^## Tour/{on=0} on && /^pip install/' README.md" in (
        root / ".ci" / "run").read_text()
