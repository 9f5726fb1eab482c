"""The teaching notebook (examples/spml_tutorial.py, Jupytext percent format) runs end to end in
a real Jupyter kernel, so that it cannot rot; no executed copy of it is kept in the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).parent.parent / "examples" / "spml_tutorial.py"


def _text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        parts += [str(v) for v in out.get("data", {}).values()]
    return "".join(parts)


def test_the_tutorial_notebook_runs_in_a_kernel(tmp_path):
    pytest.importorskip("river", reason="the notebook uses the yeast set shipped inside river")
    jupytext = pytest.importorskip("jupytext", reason="pip install -e '.[notebook]'")
    nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[notebook]'")
    pytest.importorskip("ipykernel", reason="pip install -e '.[notebook]'")

    nb = jupytext.read(NOTEBOOK)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) >= 7 and not any(c.get("outputs") for c in code)  # stored without outputs
    # each cell may take at most two minutes; an error in any cell fails the test
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "\n".join(_text(c) for c in code)
    assert "observed positives per row: 1.00" in outputs
    for name in ("an", "em", "gr"):
        assert f"{name}: best epoch" in outputs
    figures = [c for c in code if any("image/png" in o.get("data", {}) for o in c.outputs)]
    assert len(figures) >= 2  # the loss curves and GR's k-hat and v
    done = re.search(r"(\d+) complete, (\d+) pruned; best val mAP", outputs)
    assert done and int(done[1]) + int(done[2]) == 24  # the study's summary line
    assert "| an, full labels (oracle) |" in outputs  # the table, as Markdown


def test_no_executed_notebook_is_committed():
    examples = NOTEBOOK.parent
    assert not list(examples.glob("*.ipynb")), "keep the notebook as Jupytext .py, no outputs"
