"""Code a newcomer reads top to bottom: an AST check over the packages and examples that keeps
out the packing a line budget once bought. Each rule names the file and line it finds:

* no walrus (``:=``) inside a comprehension or a conditional expression;
* comprehensions (and generator expressions) nested at most two deep;
* no starred conditional piece inside a literal or a call (``[*([x] if c else [])]``);
* no one-element ``for`` used as a ``let`` inside a comprehension (``for x in [expr]``);
* no conditional expression anywhere inside another one (``a if p else b if q else c``,
  ``a if p else g(b if q else c)``): write the ``if``/``elif`` it stands for.

Ruff has no rule for any of these (its nearest, SIM108, pushes the other way: towards a
conditional expression), so the walk is here. Lines are not counted: write the comment where the
*why* is not obvious. ``code_lines`` measures non-blank, non-comment lines only to watch growth;
nothing asserts on a count."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("probe", "featurize", "studies", "examples")
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
MAX_NESTING = 2


def _files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def code_lines(source: str) -> int:
    """Lines of ``source`` holding a token other than a comment (blank and comment-only lines
    are not counted; a docstring's lines are). To watch growth, never a target."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.ENCODING}
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            # a multi-line token (a docstring) counts each line it spans
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines)


def package_code_lines() -> dict[str, int]:
    """``code_lines`` summed per folder of ``FOLDERS``, for a reader watching the size."""
    totals = {}
    for folder in FOLDERS:
        paths = sorted((ROOT / folder).rglob("*.py"))
        totals[folder] = sum(code_lines(path.read_text()) for path in paths)
    return totals


def packing(source: str) -> list[tuple[int, str]]:
    """(line, rule) of every packed construct in ``source``."""
    tree = ast.parse(source)
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def ancestors(node: ast.AST) -> list[ast.AST]:
        found = []
        while node in parents:
            node = parents[node]
            found.append(node)
        return found

    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.NamedExpr):
            if any(isinstance(a, (*COMPREHENSIONS, ast.IfExp)) for a in ancestors(node)):
                found.append((line, "walrus inside a comprehension or conditional expression"))
        elif isinstance(node, COMPREHENSIONS):
            depth = 1 + sum(isinstance(a, COMPREHENSIONS) for a in ancestors(node))
            if depth > MAX_NESTING:
                found.append((line, f"comprehensions nested {depth} deep"))
            for generator in node.generators:
                if isinstance(generator.iter, ast.List | ast.Tuple) and len(
                        generator.iter.elts) == 1:
                    found.append((line, "a one-element for used as a let in a comprehension"))
        elif isinstance(node, ast.Starred) and isinstance(node.value, ast.IfExp):
            found.append((line, "a starred conditional piece"))
        elif isinstance(node, ast.keyword) and node.arg is None:
            if isinstance(node.value, ast.IfExp):
                found.append((getattr(node.value, "lineno", 0), "a starred conditional piece (**)"))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if key is None and isinstance(value, ast.IfExp):
                    found.append((line, "a starred conditional piece (**)"))
        elif isinstance(node, ast.IfExp):
            # anywhere inside, not only a direct part: ``a if p else f"{b if q else c}"`` too
            inner = [n for n in ast.walk(node) if isinstance(n, ast.IfExp) and n is not node]
            if inner:
                found.append((line, "a conditional expression inside another"))
    return found


def test_the_packages_and_examples_read_top_to_bottom():
    wrong = []
    for path in _files():
        for line, rule in packing(path.read_text()):
            wrong.append(f"{path.relative_to(ROOT)}:{line}: {rule}")
    assert not wrong, "packed code (write the plain steps it stands for):\n" + "\n".join(wrong)


@pytest.mark.parametrize(("code", "rule"), [
    ("[y for x in xs if (y := f(x))]", "walrus"),
    ("a = (b := 1) if c else 2", "walrus"),
    ("[[[z for z in y] for y in x] for x in xs]", "nested 3 deep"),
    ("[*([x] if c else []), 1]", "starred conditional"),
    ("f(**({'a': 1} if c else {}))", "starred conditional piece (**)"),
    ("{**({'a': 1} if c else {})}", "starred conditional piece (**)"),
    ("[y for x in xs for y in [g(x)]]", "let"),
    ("a = 1 if p else 2 if q else 3", "inside another"),
    ("a = 1 if p else g(2 if q else 3)", "inside another"),
    ("a = 1 if p else f'{n} {b if q else c}'", "inside another"),
])
def test_the_check_finds_each_kind_of_packing(code, rule):
    (found,) = packing(code)
    assert found[0] == 1 and all(word in found[1] for word in rule.split() if word.isalpha()
                                 and word not in ("nested", "deep", "3"))


def test_plain_code_passes():
    code = ("ys = [f(x) for x in xs if x]\n"
            "zs = [[g(y) for y in x] for x in xs]\n"
            "a = 1 if p else 2\n"
            "if (n := len(xs)) > 3:\n"
            "    pass\n")
    assert packing(code) == []


def test_code_lines_counts_neither_blank_nor_comment_lines():
    code = ('"""Two\n   lines."""\n'
            "\n"
            "# a comment\n"
            "x = [1,\n"
            "     2]  # trailing\n"
            "    \n"
            "def f():\n"
            "    # why\n"
            "    return x\n")
    assert code_lines(code) == 2 + 2 + 2
    assert set(package_code_lines()) == set(FOLDERS)
    assert all(count > 0 for count in package_code_lines().values())
