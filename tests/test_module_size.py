"""Modules a reader can hold in their head: no module of the packages is over MAX_LINES lines.
A module that grows past it is split along its seams (docs/design.md "Layers")."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("probe", "featurize", "studies")
MAX_LINES = 800
# modules allowed past the limit for now, each with its reason (none today)
KNOWN_EXCEPTIONS: set[str] = set()


def _line_counts() -> dict[str, int]:
    return {
        path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def test_no_module_is_over_the_line_limit():
    counts = _line_counts()
    assert counts, "no modules found"
    over = {name: n for name, n in counts.items() if n > MAX_LINES and name not in KNOWN_EXCEPTIONS}
    assert not over, "modules over {} lines (split them along their seams): {}".format(
        MAX_LINES, ", ".join(f"{name} ({n} lines)" for name, n in sorted(over.items())))


def test_known_exceptions_exist():
    """An exception for a module that no longer exists is stale: remove it."""
    counts = _line_counts()
    assert all(name in counts for name in KNOWN_EXCEPTIONS), sorted(KNOWN_EXCEPTIONS - set(counts))
