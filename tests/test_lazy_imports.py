"""A bare GPU machine has torch, torchvision, numpy, pillow and zarr (and, for studies, optuna)
and little else: ``spml featurize``, ``spml probe`` and ``spml bench`` must run
without polars, faiss, matplotlib or tqdm, which are imported only where they are used.

Each check runs the real ``spml`` commands in a fresh interpreter whose import system hides the
optional packages exactly as if they were not installed: ``import polars`` raises
ModuleNotFoundError and ``importlib.util.find_spec("polars")`` is None (torch itself probes
optional packages that way).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fixtures_datasets import make_folder

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("polars", "faiss", "matplotlib", "optuna", "tqdm", "sklearn", "pandas", "scipy",
            "psycopg", "sqlalchemy")  # fmt: skip

# Runs ``spml`` once per argv list in one interpreter with OPTIONAL hidden; prints a JSON line
# with the exit codes and the hidden packages that got imported anyway (must be none).
_RUNNER = textwrap.dedent(
    """
    import json, sys
    hidden = set(json.loads(sys.argv[1]))

    class Hide:
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in hidden:
                return None
            find = getattr(self.finder, "find_spec", None)
            return find(name, path, target) if find else None

        def __getattr__(self, attr):
            return getattr(self.finder, attr)

    sys.meta_path[:] = [Hide(f) for f in sys.meta_path]
    from studies.cli import main

    codes = [main(argv) for argv in json.loads(sys.argv[2])]
    loaded = sorted({m.split(".")[0] for m in sys.modules} & hidden)
    print("RESULT " + json.dumps({"codes": codes, "loaded": loaded}))
    """
)


def run_without(hidden: tuple[str, ...], commands: list[list[str]], cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPML_PROGRESS": "off"}
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, json.dumps(hidden), json.dumps(commands)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT ") :])


def test_hidden_packages_are_really_hidden(tmp_path: Path) -> None:
    """The blocker works: a command that needs polars (spml report's tables) cannot import it."""
    code = "import importlib.util as u, sys; sys.exit(u.find_spec('polars') is not None)"
    runner = _RUNNER.replace("from studies.cli import main", code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", runner, json.dumps(["polars"]), "[]"],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_featurize_probe_and_bench_need_no_optional_package(tmp_path: Path) -> None:
    make_folder(tmp_path / "ds", n_images=12, seed=3)
    tiny = ["--backbone", "resnet18", "--weights", "random", "--size", "32", "--quiet"]
    commands = [
        ["featurize", "folder", "--root", "ds", "--out", "s.zarr", *tiny, "--block-rows", "4"],
        ["featurize", "folder", "--root", "ds", "--out", "t.zarr", *tiny, "--decode",
         "torchvision", "--batch-size", "5"],
        ["probe", "s.zarr", "--loss", "an", "--epochs", "2", "--set", "lr=1e-3,1e-2", "--quiet",
         "--json", "probe.json"],
        ["probe", "s.zarr", "--loss", "knn", "--set", "k=3", "--quiet"],
        ["bench", "probe", "--rows", "300", "--dim", "16", "--classes", "4", "--epochs", "1",
         "--trials", "1,2", "--cache-dir", "cache", "--json", "bench.json"],
        ["bench", "featurize", "--backbone", "resnet18", "--size", "32", "--images", "3",
         "--image-size", "64x48", "--json"],
    ]  # fmt: skip
    result = run_without(OPTIONAL, commands, tmp_path)
    assert result == {"codes": [0] * len(commands), "loaded": []}
    trials = json.loads((tmp_path / "probe.json").read_text())
    assert len(trials["trials"]) == 2
    assert (tmp_path / "bench.json").is_file()


def test_deterministic_cuda_kernels_do_not_import_torchdynamo():
    """``torch.use_deterministic_algorithms`` imports ``torch._inductor.config`` and with it all
    of TorchDynamo: about half of a whole ``spml probe`` process on a GPU machine (``python -X
    importtime``). The engine's switch sets the same kernel flag without that import. The
    context only sets flags, so it runs here without a GPU."""
    code = textwrap.dedent(
        """
        import sys, torch
        from probe.engine.loop import deterministic
        with deterministic(torch.device("cuda"), True):
            on = (torch.are_deterministic_algorithms_enabled(),
                  torch.is_deterministic_algorithms_warn_only_enabled())
        print(on, torch.are_deterministic_algorithms_enabled(),
              sorted(m for m in ("torch._inductor", "torch._dynamo") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True).stdout.strip()
    assert out == "(True, True) False []", out
