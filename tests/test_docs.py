"""The docs ship in the repo and stay true to the code: every doc the code and README cite
exists under docs/, nothing points outside the clone, and the generated loss reference equals
what the registry says today."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "README.md", *ROOT.glob("docs/*.md"),
           *(p for pkg in ("probe", "featurize", "studies", "examples")
             for p in (ROOT / pkg).rglob("*.py"))]


def test_every_cited_doc_exists():
    missing = []
    for path in SOURCES:
        for cited in re.findall(r"docs/[A-Za-z0-9_.-]+\.md", path.read_text()):
            if not (ROOT / cited).exists():
                missing.append(f"{path.relative_to(ROOT)} cites {cited}")
    assert not missing, "\n".join(missing)


def test_nothing_points_outside_the_clone():
    outside = []
    for path in SOURCES:
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"shared/spec|shared/papers|\.\./papers/|\.\./shared", line):
                outside.append(f"{path.relative_to(ROOT)}:{line_no}: {line.strip()}")
    assert not outside, "\n".join(outside)


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links {target}, which is not in the repo"


def test_loss_reference_is_generated_from_the_registry():
    from probe.cli import loss_reference_markdown
    from probe.losses import available

    committed = (ROOT / "docs" / "loss-reference.md").read_text()
    assert committed == loss_reference_markdown(), (
        "docs/loss-reference.md is out of date: run "
        "`spml losses doc > docs/loss-reference.md`")
    for name in available():
        assert f"## {name}\n" in committed
