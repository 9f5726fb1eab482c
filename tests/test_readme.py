"""The README's Python code runs as written: every ```python block, in order, in one namespace,
in a fresh directory (what a reader pasting them into a notebook would get)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_readme_has_python_blocks():
    blocks = _blocks()
    assert len(blocks) >= 2
    assert any("train_probe" in b for b in blocks)


def test_readme_python_blocks_run_twice_in_one_folder(tmp_path, monkeypatch, capsys):
    """Pasted twice into one notebook in one folder, the blocks run both times (the second run
    reuses the store and the study); no example writes to a folder named like a package, which
    would shadow it on the next import."""
    pytest.importorskip("river", reason="the README's example imports the yeast set (river)")
    monkeypatch.chdir(tmp_path)
    for run in (1, 2):
        namespace: dict = {"__name__": "__readme__"}
        for i, block in enumerate(_blocks()):
            exec(compile(block, f"README.md python block {i + 1} (run {run})", "exec"), namespace)
        out = capsys.readouterr().out
        assert "test mAP" in out and "winner " in out
        assert (tmp_path / "runs" / "gr-study" / "report" / "report.html").exists()
        assert namespace["summary"].n_complete >= 1
    packages = {"probe", "featurize", "studies", "tests", "examples"}
    assert not packages & {p.name for p in tmp_path.iterdir()}
