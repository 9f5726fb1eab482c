"""One exception base: every input error of probe, featurize and studies is a probe.SpmlError,
and the CLI tells a user's mistake (one line, exit 2) from a bug (traceback, exit 1)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import probe
from probe import SpmlError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("probe", "featurize", "studies")


def _modules():
    for pkg in PACKAGES:
        yield pkg
        for info in pkgutil.walk_packages([str(ROOT / pkg)], prefix=f"{pkg}."):
            if not info.name.endswith("__main__"):
                yield info.name


def test_spml_error_is_a_value_error():
    assert issubclass(SpmlError, ValueError)
    assert issubclass(probe.MissingPathError, SpmlError)
    assert issubclass(probe.MissingPathError, FileNotFoundError)


def test_every_error_class_of_the_packages_derives_from_spml_error():
    found = []
    for name in _modules():
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == name
            ):
                found.append(obj)
                assert issubclass(obj, SpmlError), f"{name}.{obj.__name__} is no SpmlError"
    assert len(found) >= 15  # the packages define many; an empty walk would pass vacuously


def test_no_bare_value_error_or_file_not_found_is_raised():
    """A library function raises an SpmlError subclass, never a bare ValueError (the CLI would
    take it for a bug) nor a bare FileNotFoundError (use MissingPathError)."""
    offenders = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                    func = node.exc.func
                    if isinstance(func, ast.Name) and func.id in ("ValueError",
                                                                  "FileNotFoundError"):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders


def test_cli_prints_one_line_for_a_user_error(capsys):
    from studies.cli import main

    assert main(["losses", "show", "not-a-loss"]) == 2
    err = capsys.readouterr().err
    assert "error: unknown loss 'not-a-loss'" in err
    assert "Traceback" not in err


def test_cli_prints_a_traceback_for_a_bug(capsys, monkeypatch):
    import probe.cli
    from studies.cli import main

    def broken(args):
        raise KeyError("internal state")

    monkeypatch.setattr(probe.cli, "_losses_list", broken, raising=True)
    assert main(["losses", "list"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "KeyError: 'internal state'" in err
    assert "this is a bug in spml-probe" in err and "spml losses list" in err
