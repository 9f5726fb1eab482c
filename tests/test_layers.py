"""The packages' layers read top-down (docs/design.md "Layers"): a test that walks every import
statement of ``probe``, ``featurize`` and ``studies`` -- at module level and inside functions --
and fails on an import cycle or on an import from a lower layer to a higher one."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("probe", "featurize", "studies")

# lowest first; a module may import only modules of its own layer or below
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("store", ("probe.errors", "probe.store", "probe.io", "probe.progress", "probe.lazy",
               "probe.registry", "probe.devices", "probe.profiling")),
    ("losses", ("probe.metrics.ranking", "probe.losses", "probe.metrics")),
    ("engine", ("probe",)),
    ("featurize", ("featurize",)),
    ("studies", ("studies",)),
]


def _layer(module: str) -> int:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank is not None, module
    return rank


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[tuple[str, int]]]:
    """module -> {(imported project module, line)} over every import statement in the file."""
    graph: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                targets = [module, *(f"{module}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add((target, node.lineno))
    return graph


def test_no_import_points_up_a_layer():
    modules = _modules()
    wrong = []
    for name, targets in _imports(modules).items():
        for target, line in sorted(targets):
            # a package's __init__ re-exporting its own submodules is not a dependency upwards
            if name in PACKAGES and target.startswith(name + "."):
                continue
            if _layer(target) > _layer(name):
                wrong.append(f"{modules[name].relative_to(ROOT)}:{line}: {name} "
                             f"({LAYERS[_layer(name)][0]}) imports {target} "
                             f"({LAYERS[_layer(target)][0]})")
    assert not wrong, "imports pointing up a layer:\n" + "\n".join(wrong)


def test_no_import_cycle():
    modules = _modules()
    graph = {name: {t for t, _ in targets
                    # a package importing its own submodules (re-exports) is no cycle
                    if not t.startswith(name + ".")}
             for name, targets in _imports(modules).items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(modules):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_walker_sees_imports_at_module_level_and_inside_functions():
    modules = _modules()
    graph = {name: {t for t, _ in targets} for name, targets in _imports(modules).items()}
    for name in modules:
        _layer(name)  # every module has a layer
    assert "probe.store" in graph["featurize.extract.run"]  # module level
    assert "probe.engine.train" in graph["studies.study.worker"]  # inside a function
    assert "probe.losses._base" in graph["probe.losses.gr_loss"]  # relative


@pytest.mark.parametrize("module, forbidden", [
    # a user who imports features and trains heads never imports the backbone code
    ("probe.store", ("torch", "torchvision", "featurize", "studies")),
    ("probe.losses", ("torchvision", "featurize", "studies", "optuna", "polars")),
    ("probe.engine.train", ("torchvision", "featurize", "studies", "optuna", "polars", "faiss")),
])
def test_lower_layers_do_not_load_higher_ones(module, forbidden):
    code = (f"import sys, {module}; bad = sorted(m for m in sys.modules "
            f"if m.split('.')[0] in {forbidden!r}); print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.strip()
    assert out == "", f"importing {module} loaded {out}"


def test_the_engine_reads_in_short_functions():
    """The engine is read top to bottom: no function in ``probe/`` over 120 lines, and
    ``train_probe`` a few named steps (its body, docstring aside, under 60 lines)."""
    long = []
    for path in (ROOT / "probe").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 120:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: "
                                f"{length} lines")
                if node.name == "train_probe" and path.name == "train.py":
                    body = node.body[1:] if ast.get_docstring(node) else node.body
                    assert body[-1].end_lineno - body[0].lineno + 1 < 60
    assert not long, "functions over 120 lines in probe/:\n" + "\n".join(long)
