"""Seams as interfaces: no module of ``probe``, ``featurize`` or ``studies`` imports another
module's underscore-prefixed name (``from X import _name``). What a module needs from another is
public where it lives, with a docstring, or lives in the module that uses it. Importing a private
*module* (``from . import _hparams``) is allowed: its public names are the interface. Nor does
any module read another object's underscore attributes (``store._group``): what it needs is a
public method of that object."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("probe", "featurize", "studies")



def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """``module.name`` of every ``from X import _name`` in ``source`` (the code of ``module``)
    whose ``_name`` is not itself a module, at module level or inside functions."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
            continue
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            source_module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source_module = node.module or ""
        for alias in node.names:
            name = alias.name
            if not name.startswith("_") or name.startswith("__"):
                continue
            if _is_module(f"{source_module}.{name}"):
                continue
            found.append(f"{source_module}.{name} (line {node.lineno})")
    return found


def test_no_module_imports_another_modules_private_name():
    wrong = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            parts = path.relative_to(ROOT).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            module = ".".join(parts[:-1] if is_package else parts)
            wrong += [f"{rel}: {hit}"
                      for hit in private_imports(path.read_text(), module, is_package)]
    # the tests use the packages as users do: through public names only
    for path in sorted((ROOT / "tests").glob("*.py")):
        wrong += [f"tests/{path.name}: {hit}"
                  for hit in private_imports(path.read_text(), f"tests.{path.stem}")
                  if hit.split(".")[0] in PACKAGES]
    assert not wrong, "private names imported across modules:\n" + "\n".join(wrong)


def test_a_private_module_is_imported_only_inside_its_package():
    """``probe.losses._base`` is the losses' own: other packages and modules use what
    ``probe.losses`` exports."""
    wrong = []
    for path in sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.ImportFrom):  # relative: resolve against this module
                base = module.split(".")[: len(module.split(".")) - node.level
                                          + (parts[-1] == "__init__")]
                names = [".".join([*base, *([node.module] if node.module else [])])]
                names += [f"{names[0]}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                segs = name.split(".")
                private = [i for i, s in enumerate(segs) if s.startswith("_")
                           and not s.startswith("__") and _is_module(".".join(segs[: i + 1]))]
                if private and not f"{module}.".startswith(".".join(segs[: private[0]]) + "."):
                    wrong.append(f"{path.relative_to(ROOT)}: {name}")
    assert not wrong, "private modules imported from outside their package:\n" + "\n".join(wrong)


def test_the_walker_finds_private_names_and_lets_private_modules_pass():
    code = (
        "from probe.store.layout import SCHEMA_VERSION, _VERSIONED_PACKAGES\n"
        "from . import _hparams\n"
        "from ._hparams import check_hparams\n"
        "def f():\n"
        "    from .vlpl import _check_scores\n"
    )
    assert private_imports(code, "probe.losses._base") == [
        "probe.store.layout._VERSIONED_PACKAGES (line 1)",
        "probe.losses.vlpl._check_scores (line 5)",
    ]


# ----------------------------------------------------------------------------- one rule, one place


def test_trials_rank_by_value_then_by_the_lowest_number():
    from types import SimpleNamespace as T

    from studies.study.storage import best_trial, ranked_trials

    trials = [T(number=0, value=0.5), T(number=3, value=0.9), T(number=1, value=0.9),
              T(number=2, value=0.1)]
    assert [t.number for t in ranked_trials(trials)] == [1, 3, 0, 2]
    assert best_trial(trials).number == 1
    assert best_trial([]) is None


def _studies_sources() -> dict[str, str]:
    return {path.relative_to(ROOT).as_posix(): path.read_text()
            for path in sorted((ROOT / "studies").rglob("*.py"))}


def test_the_best_trial_rule_and_the_paper_mark_live_in_one_module():
    import re

    rank = re.compile(r"key=lambda \w+: \(-?\w+\.value, -?\w+\.number\)")
    spelled = {rel: rank.findall(text) + re.findall(r'"spml:paper"', text)
               for rel, text in _studies_sources().items()}
    elsewhere = {rel: hits for rel, hits in spelled.items()
                 if hits and rel != "studies/study/storage.py"}
    assert not elsewhere, elsewhere
    assert spelled["studies/study/storage.py"] == ['"spml:paper"']


def test_a_study_checks_its_inputs_once(yeast_store, tmp_path, monkeypatch):
    import studies.study.create as create_module
    import studies.study.run as study_module
    from studies.study.settings import StudySettings, preflight

    calls = []

    def counted(settings, store):
        calls.append(settings.loss)
        return preflight(settings, store)

    monkeypatch.setattr(study_module, "preflight", counted)
    monkeypatch.setattr(create_module, "preflight", counted)
    settings = StudySettings(store=yeast_store, loss="an_ls", n_trials=1, batch=1,
                             out=str(tmp_path), epochs=1, batch_size=32, lr=0.01,
                             pruner="none")
    summary = study_module.run_study(settings, verdict=False)
    assert summary.n_complete == 1
    assert calls == ["an_ls"]


#: attribute roots whose underscore names are not another object's private state, each with why
FOREIGN_ROOTS = {
    "argparse": "the library's subparser and group types, which its own API returns untyped",
    "torch": "torch's fused Adam kernel and C module, reached only where no public name exists",
    "model": "the Lite0 checkpoint's classifier layer (a third-party model's attribute)",
    "super()": "a subclass extending its own base class's hook, inside one class hierarchy",
}


def private_attributes(source: str) -> list[str]:
    """``root._name (line N)`` of every underscore attribute reached through anything but
    ``self``/``cls`` (an object's private state read from outside its class)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            root = ast.unparse(node.value)
            if root not in ("self", "cls") and root not in FOREIGN_ROOTS:
                found.append(f"{root}.{node.attr} (line {node.lineno})")
    return found


def test_no_module_reads_another_objects_private_attributes():
    # the examples too: they show a user the public API
    wrong = [f"{path.relative_to(ROOT).as_posix()}: {hit}"
             for folder in (*PACKAGES, "examples") for path in sorted((ROOT / folder).rglob("*.py"))
             for hit in private_attributes(path.read_text())]
    assert not wrong, "private attributes read from outside their class:\n" + "\n".join(wrong)
    assert private_attributes("store._group['x']\nself._group\nargparse._ArgumentGroup\n") == [
        "store._group (line 1)"]


def test_every_allowed_root_is_still_needed():
    """The allowlist stays short: a root no module reaches through any more is taken out."""
    roots = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                        and not node.attr.startswith("__")):
                    roots.add(ast.unparse(node.value))
    unused = sorted(set(FOREIGN_ROOTS) - roots)
    assert not unused, f"allowlisted roots no module uses any more (remove them): {unused}"
