"""On a store for which the loss has no paper values, nothing the study, compare and report
print calls the first trial "paper": the one word for it is "defaults", and the only line that
names a paper is the note saying there is none."""

from __future__ import annotations

import pytest

from studies.cli import main

pytest.importorskip("river", reason="the yeast set ships inside river (extra 'yeast')")


def _paper_lines(text: str, tmp_path) -> list[str]:
    """Lines that say "paper", less the note that says the loss has no paper values (the
    test's own folder, named after the test, is taken out first)."""
    text = text.replace(str(tmp_path), "<tmp>")
    return [line for line in text.splitlines()
            if "paper" in line.lower() and "has no paper values" not in line]


def test_without_paper_values_no_output_says_paper(yeast_store, tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["study", yeast_store, "--loss", "gr", "--trials", "2", "--trials-at-once", "2",
                 "--epochs", "1", "--lr", "0.01", "--out", str(out)]) == 0
    study = capsys.readouterr()
    assert "has no paper values for dataset 'yeast'" in study.out + study.err  # says why
    assert "defaults" in study.out
    assert _paper_lines(study.out + study.err, tmp_path) == []
    assert main(["compare", str(out)]) == 0
    compare = capsys.readouterr()
    assert "defaults" in compare.out
    assert _paper_lines(compare.out + compare.err, tmp_path) == []
    report_dir = tmp_path / "report"
    assert main(["report", str(out), "--store", yeast_store, "--out", str(report_dir)]) == 0
    report = capsys.readouterr()
    assert _paper_lines(report.out + report.err, tmp_path) == []
    markdown = (report_dir / "report.md").read_text()
    assert "defaults value" in markdown  # the search-space table's column
    assert _paper_lines(markdown, tmp_path) == []
