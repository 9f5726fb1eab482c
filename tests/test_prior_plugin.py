"""A prior-reading plugin written from docs/plugins.md "Reading a prior" alone: the section's
code block, installed as a plugin (an entry point in a dist-info directory of its own), keeps
the contract (check_loss), equals AN at γ = 0, and trains through ``spml probe`` and a study
with two worker processes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_datasets import toy_feature_store

from probe.losses import REGISTRY, create_loss
from probe.losses.testing import check_loss
from probe.store import open_store, write_prior

ROOT = Path(__file__).resolve().parent.parent


def _section_code() -> str:
    text = (ROOT / "docs" / "plugins.md").read_text()
    section = text.split("## Reading a prior", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The docs' code as module spml_prior_plugin, with an entry point prior_an."""
    site = tmp_path_factory.mktemp("prior_plugin")
    (site / "spml_prior_plugin.py").write_text(_section_code())
    dist = site / "spml_prior_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: spml-prior-plugin\n"
                                   "Version: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[spml_probe.losses]\nprior_an = spml_prior_plugin:PriorWeightedAN\n")
    return site


@pytest.fixture
def registry():
    saved = REGISTRY.snapshot()
    yield
    REGISTRY.restore(saved)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    path = toy_feature_store(tmp_path_factory.mktemp("store") / "toy.zarr")
    s = open_store(path)
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(s.n_rows, s.n_classes)) + 3 * s.labels()
    scores = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    write_prior(path, "clip", scores.astype(np.float32), {"model": "synthetic"})
    return path


def _spml(args: list[str], site: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
           "SPML_PROGRESS": "off", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "studies.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=600)


def test_the_documented_prior_loss_keeps_the_contract(site, registry):
    spec = importlib.util.spec_from_file_location("spml_prior_plugin_doc",
                                                  site / "spml_prior_plugin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers prior_an
    check_loss("prior_an")
    loss = create_loss("prior_an", gamma=0.0)
    an = create_loss("an")
    g = torch.Generator().manual_seed(0)
    y = torch.zeros(10, 4, dtype=torch.int8)
    y[torch.arange(10), torch.randint(0, 4, (10,), generator=g)] = 1
    loss.setup(y, n_epochs=1)
    loss.set_prior(torch.rand(10, 4, generator=g))
    assert loss.prior_mode == "scores only"
    z = torch.randn(6, 4, generator=g, dtype=torch.float64)
    index = torch.tensor([0, 2, 4, 6, 8, 9])
    torch.testing.assert_close(loss(z, y[index], index=index).loss, an(z, y[index]).loss)
    with pytest.raises(Exception, match="tile_max"):  # an extra it does not read
        loss.set_prior(torch.rand(10, 4), {"tile_max": torch.rand(10, 4)})


def test_the_documented_prior_loss_trains_through_spml_probe(site, store, tmp_path):
    out = tmp_path / "probe.json"
    proc = _spml(["probe", str(store), "--loss", "prior_an", "--priors", "clip", "--set",
                  "gamma=0,2", "--epochs", "2", "--batch-size", "8", "--lr", "0.01", "--quiet",
                  "--json", str(out)], site, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    trials = json.loads(out.read_text())["trials"]
    assert [t["hparams"] for t in trials] == [{"gamma": 0.0}, {"gamma": 2.0}]
    assert trials[0]["epochs"] != trials[1]["epochs"]  # the prior's weight changed training
    refused = _spml(["probe", str(store), "--loss", "prior_an", "--epochs", "1", "--quiet"],
                    site, tmp_path)
    assert refused.returncode == 2 and "--priors NAME" in refused.stderr


@pytest.mark.slow  # two worker processes start torch and Optuna (as tests/test_plugins.py's)
def test_the_documented_prior_loss_is_searched_by_two_workers(site, store, tmp_path):
    out = tmp_path / "study"
    proc = _spml(["study", str(store), "--loss", "prior_an", "--priors", "clip", "--trials",
                  "4", "--trials-at-once", "2", "--workers", "2", "--epochs", "2",
                  "--batch-size", "16", "--lr", "0.01", "--out", str(out),
                  "--json", str(tmp_path / "s.json")],
                 site, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["n_complete"] + summary["n_pruned"] >= 4
    import optuna

    from studies.study.storage import open_existing_storage

    study = optuna.load_study(study_name="toy-prior_an",
                              storage=open_existing_storage(out / "study.log")[1])
    trials = study.get_trials()
    assert len(trials) >= 4 and all(set(t.params) == {"prior_an.gamma"} for t in trials)
    pids = {int(t.system_attrs["spml:worker"].rsplit(":", 1)[1]) for t in trials}
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids
