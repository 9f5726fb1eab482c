"""The map in docs/design.md ("Where things live") is the tree: every folder of the three
packages is a row, each row lists exactly the modules in it, and the rules of the layout hold --
a package root keeps at most ten modules besides ``__init__``, and no two modules of one folder
share a prefix word (``study_*``, ``*_cli``: a prefix asks for a sub-package)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("probe", "featurize", "studies")
MAX_ROOT_MODULES = 10


def _folders() -> dict[str, set[str]]:
    """folder (``probe/engine/``) -> its modules' names, without ``__init__``."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for init in sorted((ROOT / package).rglob("__init__.py")):
            folder = init.parent
            name = folder.relative_to(ROOT).as_posix() + "/"
            found[name] = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    return found


def _map() -> dict[str, set[str]]:
    """The rows of docs/design.md's map: folder -> the modules its row names."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.fullmatch(r"`[\w/]+/`", cells[0]):
            continue
        modules = set(re.findall(r"`(\w+)`", cells[1]))
        rows[cells[0].strip("`")] = modules
    return rows


def test_the_map_in_docs_design_is_the_tree():
    folders, rows = _folders(), _map()
    assert rows, "docs/design.md has no 'Where things live' map"
    assert sorted(rows) == sorted(folders), (
        f"folders missing from the map: {sorted(set(folders) - set(rows))}; "
        f"rows for folders that do not exist: {sorted(set(rows) - set(folders))}")
    wrong = {f: (sorted(rows[f] - folders[f]), sorted(folders[f] - rows[f]))
             for f in folders if rows[f] != folders[f]}
    assert not wrong, "rows whose modules differ from the folder's (named, missing): " + str(wrong)


def test_package_roots_are_small_and_folders_have_no_prefix_groups():
    folders = _folders()
    for package in PACKAGES:
        modules = folders[f"{package}/"]
        assert len(modules) <= MAX_ROOT_MODULES, (package, sorted(modules))
    for folder, modules in folders.items():
        words = Counter(name.lstrip("_").split("_")[0] for name in modules)
        shared = sorted(w for w, n in words.items() if n > 1)
        assert not shared, f"{folder}: modules share a prefix word {shared}: {sorted(modules)}"
        suffixes = Counter(name.split("_")[-1] for name in modules if "_" in name.strip("_"))
        assert suffixes.get("cli", 0) == 0, f"{folder}: *_cli modules belong in a cli/ folder"
