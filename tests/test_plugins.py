"""Losses as plugins (docs/plugins.md): the contract register checks, hyperparameters filled from
the data under any name, entry points loaded by the registry (good, broken, colliding), and the
example package ``examples/loss_plugin`` installed offline and driven through real ``spml``
processes: listed, shown, trained, searched with worker processes, equal to the built-in ``an``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch
from fixtures_datasets import toy_feature_store

import probe.losses as L
import probe.registry as registry_module
from probe.engine.config import ProbeConfigError, loss_hparams
from probe.losses import (
    REGISTRY,
    HParam,
    Loss,
    LossContractError,
    LossInputError,
    LossOutput,
    register,
)
from probe.losses import testing as contract

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "loss_plugin"


@pytest.fixture
def registry(monkeypatch):
    """The registry as it is, restored after the test (which may register and load plugins)."""
    saved = REGISTRY.snapshot()
    yield
    REGISTRY.restore(saved)


def _builtins() -> list[str]:
    """The losses this repository ships (those defined in probe.losses' own modules)."""
    return [n for n in L.available()
            if L.get_loss_class(n).__module__.startswith("probe.losses.")]


def _forward(self, logits, observed, index=None):
    return LossOutput(logits.mean(dim=(-2, -1)), {})


def _loss_class(name: str, **attrs) -> type:
    return type(name.title(), (Loss,), {"name": name, "paper": "p", "formula": "f",
                                        "forward": _forward, "__module__": "user_code", **attrs})


# ----------------------------------------------------------------------------- the contract


def test_a_stateless_loss_can_drop_pruned_trials_by_default(registry):
    cls = register(_loss_class("plain_one"))
    assert cls.trial_state == () and cls(**{}).can_select_trials
    assert L.loss_origin("plain_one") == "module user_code"


def test_a_loss_with_state_must_declare_its_trial_state(registry):
    def setup(self, observed, n_epochs, n_trials=None):
        Loss.setup(self, observed, n_epochs, n_trials)

    with pytest.raises(LossContractError, match=r"loss 'memo' .*stateful=True, defines setup\(\)"
                                                r".* declares no trial_state.*trial_state = None"):
        register(_loss_class("memo", stateful=True, setup=setup))
    for hook in ("end_epoch", "manual_seed", "extra_parameters"):
        with pytest.raises(LossContractError, match=f"defines {hook}"):
            register(_loss_class(f"with_{hook}", **{hook: lambda self, *a: None}))
    frozen = register(_loss_class("memo", stateful=True, setup=setup, trial_state=None))
    assert not frozen().can_select_trials  # opted out: stopped trials stay frozen in the stack
    rows = register(_loss_class("memo_rows", stateful=True, setup=setup, trial_state=("seen",)))
    assert rows().can_select_trials


def test_register_refuses_what_breaks_the_contract_by_name(registry):
    with pytest.raises(LossContractError, match=r"must be a subclass of probe\.losses\.Loss"):
        register(int)
    with pytest.raises(LossContractError, match=r"name must be .* got 'my-loss'"):
        register(_loss_class("my-loss"))
    with pytest.raises(LossContractError, match="'knn' is reserved"):
        register(_loss_class("knn"))
    with pytest.raises(LossContractError, match="defines no forward"):
        register(type("NoForward", (Loss,), {"name": "no_forward"}))
    with pytest.raises(LossContractError, match=r"presets\['voc'\] sets \['w'\]"):
        register(_loss_class("preset_typo", presets={"voc": {"w": 1.0}}))
    with pytest.raises(LossContractError, match=r"'an' .* already taken by the built-in loss"):
        register(_loss_class("an"))
    assert isinstance(LossContractError("x"), TypeError)  # what register raised before


def test_every_built_in_loss_keeps_its_pruning_semantics():
    """trial_state as before the contract: opml and vpu keep stopped trials frozen in the stack,
    every other built-in loss removes them."""
    frozen = {n for n in L.available() if L.get_loss_class(n).trial_state is None}
    assert frozen == {"opml", "vpu"}
    assert L.get_loss_class("em_apl").trial_state == ("soft_targets",)


def test_the_select_trials_check_catches_undeclared_per_trial_state(registry):
    """A loss whose per-trial state is missing from trial_state fails the contract check that a
    plugin's tests run (probe.losses.testing), instead of training wrong after a pruning."""

    class Running(Loss):  # a running mean of each trial's logits, per class
        name, paper, formula = "running", "p", "f"
        stateful = True
        trial_state = ()  # wrong: 'mean' has a trial axis

        def setup(self, observed, n_epochs, n_trials=None):
            super().setup(observed, n_epochs, n_trials)
            self.register_buffer("mean", torch.zeros(self.n_trials or 1, observed.shape[1],
                                                     dtype=torch.float64))

        def forward(self, logits, observed, index=None):
            self.mean.mul_(0.5).add_(logits.detach().mean(-2) * 0.5)
            return LossOutput(((logits - self.mean.unsqueeze(-2)) ** 2).mean((-2, -1)), {})

    register(Running)
    with pytest.raises((AssertionError, RuntimeError)):
        contract.check_select_trials("running")
    Running.trial_state = ("mean",)
    contract.check_select_trials("running")


# ----------------------------------------------------------------------------- data quantities


def test_hparam_from_data_is_declared_and_checked():
    spec = HParam("prior", None, "class prior", low=0.0, high=1.0, from_data="positive_fraction")
    assert spec.optional
    with pytest.raises(LossContractError, match="from_data must be one of"):
        HParam("x", None, "x", from_data="positives")
    with pytest.raises(LossContractError, match="must have default None"):
        HParam("x", 1.0, "x", from_data="n_classes")
    assert set(L.DATA_QUANTITIES) == {"expected_positives", "val_cardinality", "n_classes",
                                      "positive_fraction"}


def test_any_name_is_filled_from_the_data(registry):
    specs = (HParam("kk", None, "k", low=0.0, low_open=True, from_data="expected_positives"),
             HParam("card", None, "c", from_data="val_cardinality"),
             HParam("nc", None, "n", from_data="n_classes"),
             HParam("prior", None, "π", low=0.0, high=1.0, from_data="positive_fraction"))
    cls = register(_loss_class("quantities", hparam_specs=specs))
    calls = []

    def val():
        calls.append(1)
        return 1.25

    (filled,), notes = loss_hparams(cls, [{}], "arrays", 5, val)
    assert filled == {"kk": 1.25, "card": 1.25, "nc": 5.0, "prior": 0.25}
    assert len(calls) == 1  # the val split is read once
    assert "prior=0.25 (expected positives / classes; mean label cardinality of the val split)" \
        in notes
    (voc, given), _ = loss_hparams(cls, [{}, {"kk": 3.0}], "voc", 20, lambda: 4.0)
    assert (voc["kk"], voc["card"], voc["prior"]) == (1.5, 4.0, 0.075)  # Cole et al.'s VOC
    assert given["kk"] == 3.0
    with pytest.raises(ProbeConfigError, match=r"kk=9 expected positives .* only 5 classes"):
        loss_hparams(cls, [{"kk": 9.0}], "arrays", 5, val)


def test_the_built_in_k_keeps_its_values_and_messages():
    epr = L.get_loss_class("epr")
    assert loss_hparams(epr, [{}], "coco", 80, lambda: 0.0)[1] == [
        "k=2.9 (expected positives per image, Cole et al., coco)"]
    (v,), notes = loss_hparams(epr, [{}], "arrays", 5, lambda: 1.2345678)
    assert v["k"] == 1.234568 and notes == ["k=1.23457 (mean label cardinality of the val split)"]
    with pytest.raises(ProbeConfigError, match=r"^epr: needs k \(expected positives per image\) "
                       r"and the val split has no positive label to estimate it from; set it "
                       r"\(--set k=VALUE\)$"):
        loss_hparams(epr, [{}], "arrays", 5, lambda: 0.0)
    with pytest.raises(ProbeConfigError, match="dataset 'coco' but has 5 classes"):
        loss_hparams(L.get_loss_class("role"), [{}], "coco", 5, lambda: 1.0)


# ----------------------------------------------------------------------------- entry points


@pytest.fixture
def fake_plugins(registry, monkeypatch, tmp_path):
    """Plugin modules written to a temporary directory and entry points that name them; the
    registry then loads them afresh."""
    monkeypatch.syspath_prepend(str(tmp_path))
    points: list[EntryPoint] = []
    monkeypatch.setattr(registry_module, "installed_entry_points",
                        lambda group: [p for p in points if p.group == group])
    REGISTRY.forget_plugins()

    def add(entry: str, value: str, module: str, code: str) -> None:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(code))
        points.append(EntryPoint(entry, value, REGISTRY.group))

    yield add
    for p in tmp_path.glob("*.py"):
        sys.modules.pop(p.stem, None)


GOOD = """
    from probe.losses import EntrywiseLoss, register

    @register
    class Good(EntrywiseLoss):
        name, paper, formula = "good_one", "p", "f"

        def _entries(self, z, y):
            return z
    """


def test_plugins_load_once_with_their_origin_and_failures(fake_plugins):
    fake_plugins("good_one", "good_mod:Good", "good_mod", GOOD)
    fake_plugins("by_class", "cls_mod:Plain", "cls_mod", """
        from probe.losses import EntrywiseLoss

        class Plain(EntrywiseLoss):  # no @register: the entry point names the class
            name, paper, formula = "by_class", "p", "f"

            def _entries(self, z, y):
                return -z
        """)
    fake_plugins("broken", "broken_mod:X", "broken_mod", "raise RuntimeError('no GPU driver')\n")
    fake_plugins("quits", "quits_mod:X", "quits_mod", "import sys\nsys.exit(1)\n")
    fake_plugins("an", "clash_mod:Good", "clash_mod", GOOD.replace("good_one", "an"))
    fake_plugins("module_only", "good_mod", "good_mod", GOOD)
    fake_plugins("misnamed", "misnamed_mod:Good", "misnamed_mod",
                 GOOD.replace("good_one", "other_name"))
    names = L.available()
    assert {"good_one", "by_class", "an"} <= set(names)
    assert "other_name" not in names and "misnamed" not in names
    assert L.get_loss_class("an").__module__ == "probe.losses.assume_negative"
    assert L.loss_origin("good_one") == "plugin 'good_one' of an unknown distribution"
    failures = {f.entry_point: f for f in L.plugin_failures()}
    assert set(failures) == {"broken", "quits", "an", "module_only", "misnamed"}
    assert "RuntimeError: no GPU driver (at " in failures["broken"].error
    assert "broken_mod.py:1)" in failures["broken"].error
    assert failures["quits"].error.startswith("SystemExit: 1 (at ")  # named, not fatal
    assert "'an' of clash_mod.Good is already taken by the built-in loss" in failures["an"].error
    assert "one Loss subclass as 'module:Class'" in failures["module_only"].error
    assert ("the entry point's name 'misnamed' must be the loss's name; Good.name is "
            "'other_name'") in failures["misnamed"].error
    with pytest.raises(LossInputError, match=r"loss 'broken' is not available: loss plugin "
                       r"'broken' .*'broken_mod:X'.* RuntimeError: no GPU driver"):
        L.create_loss("broken")
    with pytest.raises(LossInputError, match=r"unknown loss 'nope'.*plugins that failed to "
                       r"load: 'broken' \(an unknown distribution\), 'quits' ") as caught:
        L.get_loss_class("nope")
    assert "misnamed," not in str(caught.value)  # a plugin that failed is not available
    L.available()  # once per process: the modules are not imported again
    assert len(L.plugin_failures()) == 5
    contract.check_loss("by_class")


def test_a_loss_resolves_without_importing_the_other_plugins(fake_plugins, tmp_path):
    """A built-in name reads no plugin; a plugin's name imports that plugin only; a plugin
    that exits at import is imported by nothing but a listing (or its own name)."""
    fake_plugins("good_one", "good_mod:Good", "good_mod", GOOD)
    marker = tmp_path / "imported"
    fake_plugins("quits", "quits_mod:X", "quits_mod",
                 f"import pathlib, sys\npathlib.Path({str(marker)!r}).touch()\nsys.exit(1)\n")
    assert L.get_loss_class("an").name == "an" and L.create_loss("gr").name == "gr"
    assert REGISTRY.tried() == set() and "good_mod" not in sys.modules
    assert L.get_loss_class("good_one").__module__ == "good_mod"
    assert REGISTRY.tried() == {"good_one"} and not marker.exists()
    with pytest.raises(LossInputError, match=r"unknown loss 'good_on'; did you mean "
                       r"'good_one'\?"):
        L.get_loss_class("good_on")
    assert not marker.exists()
    with pytest.raises(LossInputError, match=r"loss 'quits' is not available: .*SystemExit: 1"):
        L.get_loss_class("quits")
    assert marker.exists()


def test_importing_probe_loads_no_plugin(tmp_path):
    """Discovery is lazy: importing probe (and probe.losses) reads no entry point."""
    code = "import probe, probe.losses as L; print(bool(L.REGISTRY.tried()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.split()
    assert out == ["False"]


def test_the_example_plugins_own_tests_pass(registry, monkeypatch):
    """examples/loss_plugin/tests (the contract checks and the math against 'an'), run here
    with the package imported from its source tree."""
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    monkeypatch.syspath_prepend(str(EXAMPLE / "tests"))
    try:
        import test_an_plugin

        test_an_plugin.test_the_loss_keeps_the_contract()
        test_an_plugin.test_the_math_by_hand_and_against_the_built_in_an()
        assert L.loss_origin("an_plugin") == "module spml_an_plugin"
    finally:
        sys.modules.pop("test_an_plugin", None)
        sys.modules.pop("spml_an_plugin", None)


# ----------------------------------------------------------------------------- real processes


def _spml(args: list[str], pythonpath: Path, cwd: Path, argv: list[str] | None = None
          ) -> subprocess.CompletedProcess:
    """``spml ARGS`` in a fresh interpreter that finds the packages under ``pythonpath``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), str(ROOT)]),
           "SPML_PROGRESS": "off", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *(argv or ["-m", "studies.cli", *args])],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


_MANY = """
import contextlib, io, json, sys
from studies.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(argv)
    results.append((code, out.getvalue()))
print(json.dumps(results))
"""


def _spml_in_one_process(commands: list[list[str]], pythonpath: Path, cwd: Path
                         ) -> tuple[list[tuple[int, str]], str]:
    """``spml`` commands run one after the other in one fresh interpreter (torch starts once):
    each command's exit code and output, and the interpreter's stderr."""
    proc = _spml([], pythonpath, cwd, argv=["-c", _MANY, json.dumps(commands)])
    assert proc.returncode == 0, proc.stderr
    return [tuple(r) for r in json.loads(proc.stdout.splitlines()[-1])], proc.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """examples/loss_plugin installed offline into a directory of its own (pip --target)."""
    setuptools = pytest.importorskip("setuptools", reason="building the example plugin needs "
                                     "setuptools (offline: no build isolation)")
    major_minor = tuple(int(p) for p in setuptools.__version__.split(".")[:2])
    if major_minor < (70, 1) and importlib.util.find_spec("wheel") is None:
        pytest.skip("setuptools < 70.1 builds wheels only with the 'wheel' package")
    tmp = tmp_path_factory.mktemp("plugin")
    source = tmp / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = tmp / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return target


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return toy_feature_store(tmp_path_factory.mktemp("store") / "toy.zarr")


def test_the_installed_example_plugin_is_listed_shown_and_trained_like_an(installed, store,
                                                                           tmp_path):
    out = {loss: tmp_path / f"{loss}.json" for loss in ("an_plugin", "an")}
    train = ["--epochs", "3", "--batch-size", "8", "--lr", "0.01", "--quiet"]
    (listed, shown, *probes), stderr = _spml_in_one_process([
        ["losses", "list"],
        ["losses", "show", "an_plugin"],
        ["probe", str(store), "--loss", "an_plugin", "--set", "pos_weight=1,2", *train,
         "--json", str(out["an_plugin"])],
        ["probe", str(store), "--loss", "an", *train, "--json", str(out["an"])],
    ], installed, tmp_path)
    assert [code for code, _ in (listed, shown, *probes)] == [0] * 4, stderr
    line = next(ln for ln in listed[1].splitlines() if ln.startswith("an_plugin "))
    assert "[plugin 'an_plugin' of distribution 'spml-an-plugin 0.1.0']" in line
    assert f"{len(_builtins()) + 1} losses" in listed[1] and "failed" not in listed[1]
    assert "pos_weight" in shown[1] and "search [0.25, 4] log" in shown[1]
    runs = {loss: json.loads(path.read_text())["trials"] for loss, path in out.items()}
    plugin_w1, plugin_w2, an = runs["an_plugin"][0], runs["an_plugin"][1], runs["an"][0]
    assert plugin_w1["hparams"] == {"pos_weight": 1.0}
    # w = 1 is the built-in AN: the same metrics, the training loss within float rounding (a
    # stack of two heads sums its loss in another order than one head alone)
    for mine, ref in zip(plugin_w1["epochs"], an["epochs"], strict=True):
        assert mine.keys() == ref.keys()
        for key in mine:
            assert mine[key] == pytest.approx(ref[key], rel=1e-6, abs=0), key
    assert plugin_w2["epochs"] != an["epochs"]


@pytest.mark.slow  # two worker processes start torch and Optuna (as tests/test_study.py's)
def test_the_installed_example_plugin_is_searched_by_worker_processes(installed, store,
                                                                      tmp_path):
    out = tmp_path / "study"
    proc = _spml(["study", str(store), "--loss", "an_plugin", "--trials", "4",
                  "--trials-at-once", "2", "--workers", "2", "--epochs", "2", "--batch-size",
                  "16", "--lr", "0.01",
                  "--out", str(out), "--json", str(tmp_path / "s.json")], installed, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["n_complete"] + summary["n_pruned"] >= 4
    import optuna

    from studies.study.storage import open_existing_storage

    trials = optuna.load_study(study_name="toy-an_plugin",
                               storage=open_existing_storage(out / "study.log")[1]).get_trials()
    assert len(trials) >= 4 and all(set(t.params) == {"an_plugin.pos_weight"} for t in trials)
    workers = {t.system_attrs.get("spml:worker") for t in trials}
    pids = {int(w.rsplit(":", 1)[1]) for w in workers}  # trained in the worker processes
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids, workers


def _pip_target(source: Path, target: Path) -> None:
    """``pip install`` a package directory offline into ``target`` (no deps, no index)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_a_plugin_that_exits_at_import_is_never_imported_by_a_built_in_loss(installed, store,
                                                                           tmp_path):
    """A distribution whose plugin calls sys.exit(1) at import, installed with pip: 'spml
    probe --loss an' trains and never imports it; 'spml losses list' imports it, names it
    (entry point, distribution, SystemExit) and still lists every built-in, exit 0."""
    source = tmp_path / "spml_quits"
    (source / "spml_quits_mod").mkdir(parents=True)
    marker = tmp_path / "imported"
    (source / "spml_quits_mod" / "__init__.py").write_text(
        f"import pathlib, sys\npathlib.Path({str(marker)!r}).touch()\nsys.exit(1)\n")
    (source / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "spml-quits"
        version = "1.2"

        [project.entry-points."spml_probe.losses"]
        quits = "spml_quits_mod:Quits"

        [tool.setuptools]
        packages = ["spml_quits_mod"]
        """))
    site = tmp_path / "site"
    _pip_target(source, site)
    out = tmp_path / "an.json"
    (trained,), stderr = _spml_in_one_process([
        ["probe", str(store), "--loss", "an", "--epochs", "2", "--batch-size", "8", "--lr",
         "0.01", "--quiet", "--json", str(out)]], site, tmp_path)
    assert trained[0] == 0, stderr
    assert json.loads(out.read_text())["loss"] == "an"
    assert not marker.exists()  # the plugin was never imported
    (listed, asked), stderr = _spml_in_one_process([["losses", "list"], ["losses", "show",
                                                                        "quits"]], site, tmp_path)
    assert marker.exists() and listed[0] == 0, stderr
    names = {ln.split()[0] for ln in listed[1].split("\n\n")[0].splitlines()}
    assert names == set(_builtins()) and f"{len(_builtins())} losses" in listed[1]
    assert ("loss plugin 'quits' (entry point quits = 'spml_quits_mod:Quits' of distribution "
            "'spml-quits 1.2') failed to load: SystemExit: 1 (at ") in listed[1]
    assert asked[0] == 2 and "loss 'quits' is not available" in stderr
