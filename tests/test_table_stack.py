"""``spml table`` trains a row's draws as one stacked run, and ``--tune grid`` picks each loss
row's setting per draw on val.

Tolerances (float32): the stacked cell equals the ``--no-stack`` cell (one run per cell, the
reference) within 1e-4 test mAP (in percent, as the table shows it) and 2e-5 on every head
entry; batched matmuls may differ from one-trial products in the last bits. The grid's chosen
cell equals an independent ``train_probe`` run of the setting with the best val mAP among the
grid's settings trained one by one, within the same tolerances."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from studies.cli import main
from studies.table import TableConfig, TableError, build_table
from studies.table.grid import Grid

pytestmark = pytest.mark.usefixtures("one_thread")

DRAWS = (1200, 1, 2)
# stateless, scheduled (GR's epoch schedule), stateful (ROLE's per-example estimates)
LOSSES = ("an", "gr", "role")
MAP_TOL, HEAD_TOL = 1e-4, 2e-5


@pytest.fixture(scope="module")
def store(yeast_store, tmp_path_factory) -> str:
    """A copy of the yeast store holding the draws 1200, 1 and 2."""
    from probe.store import add_observed_seed

    path = tmp_path_factory.mktemp("stack") / "y.zarr"
    shutil.copytree(yeast_store, path)
    for seed in DRAWS[1:]:
        add_observed_seed(path, seed)
    return str(path)


def _config(out: Path, **kw) -> TableConfig:
    base = {"losses": LOSSES, "observed_seeds": DRAWS, "epochs": 2, "out": str(out),
            "resamples": 200}
    return TableConfig(**{**base, **kw})


def _quiet(message: str) -> None:
    pass


def _by_cell(table) -> dict[tuple[str, int], object]:
    return {(c.method.label, c.observed_seed): c for c in table.cells}


@pytest.mark.parametrize("seed", [0, 1])  # the table's training seed: init and batch order
def test_the_stacked_table_equals_one_run_per_cell_and_resumes(store, tmp_path, seed):
    stacked = build_table([store], _config(tmp_path / "s", seed=seed), progress=False,
                          log=_quiet)
    plain = build_table([store], _config(tmp_path / "p", stack=False, seed=seed),
                        progress=False, log=_quiet)
    mine, ref = _by_cell(stacked), _by_cell(plain)
    assert set(mine) == {(n, d) for n in LOSSES for d in DRAWS} == set(ref)
    for where, c in mine.items():
        r = ref[where]
        # whether a cell trained stacked is not part of its key
        assert c.key == r.key, where
        assert c.trained and r.trained
        assert c.test_map == pytest.approx(r.test_map, abs=MAP_TOL), where
        assert c.val_map == pytest.approx(r.val_map, abs=MAP_TOL), where
        torch.testing.assert_close(c.head, r.head, atol=HEAD_TOL, rtol=0)
        # the record says how it trained, and names its own draw
        assert c.record["timing"]["stacked_cells"] == len(DRAWS)
        assert r.record["timing"]["stacked_cells"] == 1
        assert c.record["config"]["observed_seed"] == where[1] == r.record["config"][
            "observed_seed"]
        assert c.record["config"] == r.record["config"]
        assert c.command == r.command
    # the three draws of a row differ, so a stacked run that mixed them up would fail above
    heads = [mine[("role", d)].head for d in DRAWS]
    assert not torch.allclose(heads[0], heads[1])
    # a rerun into the same --out trains nothing and reads every cell back as it was kept
    again = build_table([store], _config(tmp_path / "s", seed=seed), progress=False,
                        log=_quiet)
    assert again.n_trained == 0
    for where, c in _by_cell(again).items():
        assert not c.trained
        assert c.test_map == mine[where].test_map
        torch.testing.assert_close(c.head, mine[where].head, atol=0, rtol=0)
    # and the unstacked run reads the stacked cells back too (one key for both)
    assert build_table([store], _config(tmp_path / "s", stack=False, seed=seed),
                       progress=False, log=_quiet).n_trained == 0


def test_no_stack_on_the_cli(store, tmp_path, capsys):
    out = tmp_path / "t"
    args = ["table", store, "--losses", "an", "--observed-seeds", "1200,1", "--epochs", "1",
            "--resamples", "200", "--quiet", "--out", str(out)]
    assert main([*args, "--no-stack"]) == 0
    kept = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]
    assert [k["record"]["timing"]["stacked_cells"] for k in kept] == [1, 1]
    capsys.readouterr()
    assert main(args) == 0  # stacked now: the same keys, nothing trains
    assert "0 cells trained" in capsys.readouterr().err


SMALL = Grid(batch_size=(8, 16), lr=(1e-2, 1e-3), weight_decay=(0.0, 1e-3), epochs=2)


def test_the_grid_cell_is_the_best_val_setting_trained_alone(store, tmp_path):
    from probe import ProbeConfig, train_probe
    from probe.engine.data import ProbeData

    draws = (1200, 1)
    config = _config(tmp_path / "g", losses=("an", "role"), observed_seeds=draws, grid=SMALL,
                     epochs=None)
    table = build_table([store], config, progress=False, log=_quiet)
    assert any("selected by the grid" in n and "on that draw" in n for n in table.notes)
    assert "selected by the grid" in table.markdown()
    for c in table.cells:
        assert c.method.kind == "grid"
        data = ProbeData.from_store(store, observed_seed=c.observed_seed)
        runs = []
        for b in SMALL.batch_size:
            for lr in SMALL.lr:
                for wd in SMALL.weight_decay:
                    cfg = ProbeConfig(batch_size=b, lr=lr, weight_decay=wd, epochs=SMALL.epochs,
                                      seed=0, observed_seed=c.observed_seed)
                    runs.append(((b, lr, wd), train_probe(data, cfg, c.method.loss)))
        vals = [r.trials[0].best["val_map"] for _, r in runs]
        best = int(np.argmax(vals))  # the first of equal maxima, the grid's order
        ranked = sorted(vals, reverse=True)
        assert ranked[0] - ranked[1] > 1e-3, "a near tie would make the check float-sensitive"
        (b, lr, wd), ref = runs[best]
        trial = c.record["trials"][0]
        assert (c.record["config"]["batch_size"], trial["lr"], trial["weight_decay"]) == (
            b, lr, wd)
        assert c.test_map == pytest.approx(ref.trials[0].best["test_map"], abs=MAP_TOL)
        assert c.val_map == pytest.approx(vals[best], abs=MAP_TOL)
        torch.testing.assert_close(c.head, _head(ref), atol=HEAD_TOL, rtol=0)
        assert f"--batch-size {b} " in c.command and f"--observed-seed {c.observed_seed}" in (
            c.command)
    # a rerun trains nothing; a changed grid is a new key and retrains every cell
    assert build_table([store], config, progress=False, log=_quiet).n_trained == 0
    other = Grid(batch_size=(8,), lr=(1e-2, 1e-3), weight_decay=(0.0, 1e-3), epochs=2)
    changed = build_table([store], _config(tmp_path / "g", losses=("an", "role"),
                                           observed_seeds=draws, grid=other, epochs=None),
                          progress=False, log=_quiet)
    assert changed.n_trained == len(table.cells)
    kept = json.loads(next((tmp_path / "g" / "cells").glob("*.json")).read_text())
    assert len(kept["grid_runs"]) in (SMALL.size, other.size)


def _head(result) -> torch.Tensor:
    head = result.head(0)
    return torch.cat([head.weight.detach().T, head.bias.detach()[None]]).float()


def test_grid_no_stack_equals_the_stacked_grid(store, tmp_path):
    grid = Grid(batch_size=(8,), lr=(1e-2, 1e-3), weight_decay=(0.0,), epochs=1)
    kw = {"losses": ("gr",), "observed_seeds": (1200, 1), "grid": grid, "epochs": None}
    stacked = build_table([store], _config(tmp_path / "a", **kw), progress=False, log=_quiet)
    plain = build_table([store], _config(tmp_path / "b", stack=False, **kw), progress=False,
                        log=_quiet)
    for c, r in zip(stacked.cells, plain.cells):
        assert c.key == r.key and c.command == r.command
        assert c.test_map == pytest.approx(r.test_map, abs=MAP_TOL)
        torch.testing.assert_close(c.head, r.head, atol=HEAD_TOL, rtol=0)


@pytest.mark.parametrize("extra, says", [
    (["--tune", "gird"], r"--tune: grid \(.*\) or a number of trials N"),
    (["--grid", "lr=1e-2"], "--grid sets the values of --tune grid; add --tune grid"),
    (["--tune", "grid", "--lr", "1e-3"], "--lr with --tune grid"),
    (["--tune", "grid", "--grid", "momentum=0.9"], "--grid: NAME=V1,V2"),
    (["--tune", "grid", "--grid", "lr=0"], "--grid lr: positive numbers"),
    (["--tune", "grid", "--grid", "batch_size=8,x"], "--grid batch_size: comma-separated"),
    (["--tune", "grid", "--grid", "epochs=2", "--epochs", "3"], "--epochs 3 and --grid epochs"),
])
def test_bad_tune_and_grid_values_are_named(store, tmp_path, capsys, extra, says):
    out = tmp_path / "t"
    assert main(["table", store, "--losses", "an", "--quiet", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and re.search(says, err), err
    assert not out.exists()


def test_grid_values():
    assert Grid.parse(["batch_size=8", "lr=1e-2,1e-3"], epochs=4) == Grid(
        batch_size=(8,), lr=(1e-2, 1e-3), epochs=4)
    assert Grid().size == 32 and Grid().epochs == 10
    assert Grid().weight_decay == (1e-2, 1e-3, 1e-4, 1e-5)
    with pytest.raises(TableError, match=r"--tune: a number of trials .* or grid"):
        build_table(["x"], TableConfig(tune=4, grid=Grid(), out="o"))


def test_the_under_training_note_names_the_grid_s_own_flags():
    """With --tune grid the lr is the grid's choice (--lr is refused): the note says how to
    change the grid instead."""
    from types import SimpleNamespace

    from studies.table.render import convergence_notes

    rising = {"trials": [{"epochs": [{"val_map": 1.0}, {"val_map": 2.0}]}]}
    cells = [SimpleNamespace(record=rising)]
    grid_plan = SimpleNamespace(config=TableConfig(grid=Grid()))
    preset_plan = SimpleNamespace(config=TableConfig())
    (grid_note,) = convergence_notes(cells, grid_plan)
    (preset_note,) = convergence_notes(cells, preset_plan)
    assert "1 of 1 trained cells peaked" in grid_note and "--grid lr=" in grid_note
    assert "--lr" not in grid_note.replace("--grid lr=", "")
    assert "--tune N" in preset_note and "--grid" not in preset_note
