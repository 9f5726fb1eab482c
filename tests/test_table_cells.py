"""`spml table`'s kept cells: a cell whose key changed (a setting, a loss's version) retrains,
and the table says how many did and why."""

from __future__ import annotations

import re
import shutil

import pytest

from studies.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = ["--resamples", "200", "--quiet"]


def _trained(err: str) -> int:
    for line in err.splitlines():
        found = re.match(r"(\d+) cells? trained", line)
        if found:
            return int(found[1])
    raise AssertionError(f"no 'cells trained' line in:\n{err}")


@pytest.fixture()
def store(yeast_store, tmp_path) -> str:
    path = tmp_path / "y.zarr"
    shutil.copytree(yeast_store, path)
    return str(path)


def test_a_changed_setting_retrains_the_kept_cell_and_counts_it(store, tmp_path, capsys):
    out = tmp_path / "t"
    args = ["table", store, "--losses", "an", "--observed-seeds", "1200", "--out", str(out),
            *FAST]
    assert main([*args, "--epochs", "2"]) == 0
    assert _trained(capsys.readouterr().err) == 1
    assert main([*args, "--epochs", "2"]) == 0
    again = capsys.readouterr().err
    assert _trained(again) == 0 and "settings changed" not in again  # the same key: kept
    assert main([*args, "--epochs", "3"]) == 0
    changed = capsys.readouterr().err
    assert _trained(changed) == 1
    # said once, as epochs: the resolved config's own epochs field is not counted again
    assert "whose settings changed: epochs (1)" in changed
    assert main([*args, "--epochs", "3", "--seed", "1"]) == 0
    flipped = capsys.readouterr().err
    assert _trained(flipped) == 1
    assert "whose settings changed: config (1)" in flipped  # the seed is keyed in the config alone


def test_a_loss_whose_version_changed_retrains_its_cell(store, tmp_path, capsys, monkeypatch):
    from probe import get_loss_class

    out = tmp_path / "t"
    args = ["table", store, "--losses", "an", "--observed-seeds", "1200", "--epochs", "2",
            "--out", str(out), *FAST]
    assert main(args) == 0
    assert _trained(capsys.readouterr().err) == 1
    cls = get_loss_class("an")
    assert cls.version == "1"  # the default every loss declares
    monkeypatch.setattr(cls, "version", "2")  # a new release of the loss
    assert main(args) == 0
    err = capsys.readouterr().err
    assert _trained(err) == 1
    assert "whose settings changed: loss_version (1)" in err
