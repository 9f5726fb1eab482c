"""The one extension mechanism (probe.registry) for backbone families, dataset adapters and prior
sources: the package of docs/plugins.md "Backbone families, dataset adapters and prior sources",
installed offline as a distribution with entry points, is seen by real ``spml`` processes with
no import by hand -- listed by ``spml plugins`` and ``spml backbones``, featurized with by
``spml featurize``, its prior computed by ``spml priors --source`` -- and a broken plugin of each
group is named and skipped while the rest keeps working."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures_datasets import make_folder

from probe.registry import PluginFailure, Registry, RegistryError

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Backbone families, dataset adapters and prior sources"


def _docs_code() -> str:
    text = (ROOT / "docs" / "plugins.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The docs' code as package my_package, declared by a distribution with one entry point
    per group, and a broken plugin in each group."""
    site = tmp_path_factory.mktemp("outside")
    (site / "my_package").mkdir()
    (site / "my_package" / "__init__.py").write_text("")
    (site / "my_package" / "extensions.py").write_text(_docs_code())
    (site / "my_broken.py").write_text("raise ImportError('no such driver')\n")
    dist = site / "my_package-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-package\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[spml_probe.backbones]\nrandconv = my_package.extensions:RandomConvFamily\n"
        "brokenfam = my_broken:Family\n"
        "[spml_probe.datasets]\ntagged = my_package.extensions:load_tagged\n"
        "brokends = my_broken:load\n"
        "[spml_probe.priors]\nfrequency = my_package.extensions:FrequencySource\n"
        "brokenprior = my_broken:Source\n")
    return site


def _spml(args: list[str], site: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]),
           "SPML_PROGRESS": "off", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "studies.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=600)


def test_the_plugins_are_listed_and_the_broken_ones_named(site, tmp_path):
    run = _spml(["plugins", "--json"], site, tmp_path)
    assert run.returncode == 0, run.stderr
    listing = {record["group"]: record for record in json.loads(run.stdout)}
    origin = "plugin '{}' of distribution 'my-package 0.1'"
    for group, good, broken in (("spml_probe.backbones", "randconv", "brokenfam"),
                                ("spml_probe.datasets", "tagged", "brokends"),
                                ("spml_probe.priors", "frequency", "brokenprior")):
        entries = {e["name"]: e["origin"] for e in listing[group]["entries"]}
        assert entries[good] == origin.format(good)
        assert broken not in entries
        (failure,) = listing[group]["failures"]
        assert f"plugin '{broken}'" in failure and "ImportError: no such driver" in failure
    assert {"torchvision", "timm"} <= {e["name"] for e in listing["spml_probe.backbones"]
                                       ["entries"]}
    assert "an" in {e["name"] for e in listing["spml_probe.losses"]["entries"]}
    backbones = _spml(["backbones"], site, tmp_path)
    assert backbones.returncode == 0, backbones.stderr
    assert "randconv:<width>" in backbones.stdout
    assert "brokenfam" in backbones.stdout and "FAILED TO LOAD" in backbones.stdout


def test_featurize_and_priors_use_the_plugins_without_an_import(site, tmp_path):
    photos = tmp_path / "photos"
    make_folder(photos, n_images=12)
    (photos / "labels.csv").rename(photos / "tags.csv")
    store = tmp_path / "p.zarr"
    run = _spml(["featurize", "tagged", "--root", str(photos), "--backbone", "randconv:8",
                 "--weights", "random", "--out", str(store), "--quiet"], site, tmp_path)
    assert run.returncode == 0, run.stderr
    from probe.store import open_store

    opened = open_store(store)
    assert opened.features().shape == (12, 8)
    run = _spml(["priors", str(store), "--source", "frequency", "--name", "freq",
                 "--source-option", "seed=1200"], site, tmp_path)
    assert run.returncode == 0, run.stderr
    prior = open_store(store).prior("freq")
    share = (opened.observed(1200, opened.split("train")) == 1).mean(axis=0)
    np.testing.assert_allclose(prior.scores, np.tile(share, (12, 1)), rtol=1e-6)
    assert prior.provenance["model"] == "class frequency"
    # the broken ones: asked for by name, refused with their error; the rest unaffected
    run = _spml(["featurize", "brokends", "--root", str(photos), "--backbone", "randconv:8",
                 "--weights", "random", "--out", str(tmp_path / "x.zarr")], site, tmp_path)
    assert run.returncode == 2 and "brokends" in run.stderr and "no such driver" in run.stderr
    run = _spml(["featurize", "tagged", "--root", str(photos), "--backbone", "brokenfam:3",
                 "--weights", "random", "--out", str(tmp_path / "y.zarr")], site, tmp_path)
    assert run.returncode == 2 and "brokenfam" in run.stderr and "no such driver" in run.stderr
    run = _spml(["priors", str(store), "--source", "brokenprior", "--name", "z"], site, tmp_path)
    assert run.returncode == 2 and "no such driver" in run.stderr


# ----------------------------------------------------------------------------- the registry


class _Point:
    """An entry point as importlib.metadata gives it (name, value, load)."""

    def __init__(self, name, value, obj=None, error=None):
        self.name, self.value, self.dist = name, value, None
        self._obj, self._error = obj, error

    def load(self):
        if self._error is not None:
            raise self._error
        return self._obj


def test_the_registry_loads_lazily_once_and_names_failures(monkeypatch):
    points = [_Point("good", "m:good", obj="GOOD"), _Point("bad", "m:bad", error=OSError("x")),
              _Point("odd", "m_without_colon")]
    import probe.registry as module

    monkeypatch.setattr(module, "installed_entry_points", lambda group: list(points))
    registry: Registry[str] = Registry("thing", "spml_probe.things", builtin="built in",
                                       builtin_modules=("probe.",))
    registry.add("mine", "MINE", module="probe.x")
    assert registry.get("mine") == "MINE" and registry.tried() == set()  # no entry point read
    assert registry.get("good") == "GOOD" and registry.tried() == {"good"}
    assert registry.origin("good") == "plugin 'good' of an unknown distribution"
    assert registry.origin("mine") == "built in"
    with pytest.raises(RegistryError, match=r"thing 'bad' is not available: thing plugin 'bad' "
                       r".*OSError: x"):
        registry.get("bad")
    with pytest.raises(RegistryError, match=r"unknown thing 'goood'; did you mean 'good'\?"):
        registry.get("goood")
    assert registry.names() == ["mine", "good"]
    failures = registry.failures()
    assert [f.entry_point for f in failures] == ["bad", "odd"]
    assert all(isinstance(f, PluginFailure) for f in failures)
    assert "one thing as 'module:object'" in failures[1].error
    with pytest.raises(RegistryError, match="the thing name 'mine' is already taken by built in"):
        registry.add("mine", "OTHER")
    registry.add("mine", "MINE")  # the same object again is no clash
