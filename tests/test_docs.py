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


# ------------------------------------------------------------------------------------------
# every `spml ...` command quoted in the README and docs/ names a real command and real flags
# ------------------------------------------------------------------------------------------

DOCS = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]


def _quoted_commands(text: str) -> list[str]:
    """Every command line starting with ``spml`` inside inline code or a fenced block."""
    spans = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    # an inline code span may wrap across lines in the Markdown source
    spans += [" ".join(s.split()) for s in
              re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))]
    found = []
    for span in spans:
        for line in span.splitlines():
            # a command runs to a shell separator; a "|" inside a word names alternatives
            for m in re.finditer(r"(?:^|[\s(&;|])(spml(?: (?:[^&;|#]|\|(?! ))*)?)", line):
                words = m.group(1).split()
                if len(words) > 1 and words[1].endswith(":"):
                    continue  # a message the command prints ("spml probe: error: ..."), quoted
                found.append(m.group(1).strip())
    return found


def _subparsers(parser) -> dict:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _parsers_for(words: list[str]):
    """The parsers a command's leading words select (``a|b`` names each alternative) and the
    words left over."""
    from studies.cli import build_parser, two_word_commands

    two = two_word_commands()
    if tuple(words[:2]) in two:
        return [two[tuple(words[:2])]()], words[2:]
    parsers, rest = [build_parser()], words
    while rest:
        subs = [_subparsers(p) for p in parsers]
        names = rest[0].split("|")
        if not all(subs) or not all(n in s for n in names for s in subs):
            break
        parsers, rest = [s[n] for s in subs for n in names], rest[1:]
    return parsers, rest


def _flags(parser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def _check_command(command: str) -> list[str]:
    words = command.replace("…", " ").split()[1:]
    parsers, rest = _parsers_for(words)
    wrong = []
    if len(parsers) == 1 and parsers[0].prog == "spml" and words and not words[0].startswith("-"):
        return [f"`{command}`: spml has no command {words[0]!r}"]
    for word in rest:
        if not word.startswith("--") or word == "--":
            continue
        flag = word.split("=", 1)[0].rstrip(".,:;)")
        for parser in parsers:
            if flag not in _flags(parser):
                wrong.append(f"`{command}`: {parser.prog} has no option {flag}")
    return wrong


def test_quoted_spml_commands_and_flags_exist():
    wrong, seen = [], 0
    for path in DOCS:
        for command in _quoted_commands(path.read_text()):
            seen += 1
            wrong += [f"{path.relative_to(ROOT)}: {w}" for w in _check_command(command)]
    assert seen > 30, f"found only {seen} quoted spml commands: the extractor is broken"
    assert not wrong, "\n".join(wrong)


def test_the_command_checker_catches_a_wrong_flag_and_command():
    assert _check_command("spml probe STORE --loss gr --epochs 3") == []
    assert _check_command("spml bench probe|store") == []
    assert _quoted_commands("`spml import cole|arrays|yeast` and `spml losses show gr | head`") \
        == ["spml import cole|arrays|yeast", "spml losses show gr"]
    assert _quoted_commands("`spml probe: error: damaged` and `spml demo\n  --out x`") \
        == ["spml demo --out x"]
    assert _check_command("spml probe STORE --no-such-flag")
    assert _check_command("spml frobnicate STORE")
    assert _check_command("spml bench probe --trials 1 --no-such-flag")
    assert _quoted_commands("run `spml probe S --loss an` then\n```bash\nspml demo --out x\n```") \
        == ["spml demo --out x", "spml probe S --loss an"]


def test_the_demo_help_states_how_long_it_takes():
    """The README and ``spml demo --help`` say the same about the demo's duration."""
    from studies.cli import build_parser

    demo = _subparsers(build_parser())["demo"]
    text = demo.format_help()
    assert "minutes" not in text
    said = re.findall(r"(\d+–\d+) s on 2 CPU cores", " ".join(text.split()))
    readme = re.findall(r"(\d+–\d+) s on 2 CPU cores",
                        " ".join((ROOT / "README.md").read_text().split()))
    assert said and said == readme[:1], (said, readme)


def test_every_cited_doc_section_exists():
    """``docs/NAME.md "Section"`` in code and docs names a heading or a bold lead-in of that
    doc (quotes and case aside), so a renamed section cannot leave a dangling citation."""
    def plain(s: str) -> str:
        return " ".join(re.sub(r"[\"'`*]", "", s).lower().split())

    missing, seen = [], 0
    for path in [*SOURCES, ROOT / "pyproject.toml"]:
        text = " ".join(path.read_text().split())  # a citation may wrap across lines
        for doc, section in re.findall(r"(docs/[A-Za-z0-9_.-]+\.md),? \"([^\"]+)\"", text):
            target = (ROOT / doc).read_text()
            titles = re.findall(r"^#+ (.+)$", target, flags=re.M)
            titles += re.findall(r"\*\*([^*]+)\*\*", target)
            seen += 1
            if not any(plain(section) in plain(t) for t in titles):
                missing.append(f"{path.relative_to(ROOT)} cites {doc} \"{section}\"")
    assert seen > 20, f"found only {seen} section citations: the pattern is broken"
    assert not missing, "\n".join(missing)
