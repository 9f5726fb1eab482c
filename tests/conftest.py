"""Shared fixtures and the suite's markers.

* ``one_thread`` — tiny problems run on one torch thread (no thread-pool overhead on a shared
  2-core machine); a module opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``.
* ``yeast_store`` — the real MULAN *yeast* set (shipped inside ``river``) imported once per test
  session into a store; tests only read it (a test that changes a store imports its own).
* ``@pytest.mark.slow`` — the longest tests; they run with ``SPML_SLOW=1`` (CI sets it), and are
  reported as skipped with that reason otherwise.
* ``@pytest.mark.gpu`` — needs a CUDA device; skipped, saying so, where there is none.
* every test runs with ``$SPML_CACHE_DIR`` set to a fresh folder of the session.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_slow = os.environ.get("SPML_SLOW", "") not in ("", "0")
    have_cuda = None
    for item in items:
        # markers, not keywords: a checkout in a folder named "gpu" must not mark every test
        if item.get_closest_marker("slow") and not run_slow:
            item.add_marker(pytest.mark.skip(
                reason="slow test: set SPML_SLOW=1 to run it (CI does)"))
        if item.get_closest_marker("gpu"):
            if have_cuda is None:
                import torch

                have_cuda = torch.cuda.is_available()
            if not have_cuda:
                item.add_marker(pytest.mark.skip(
                    reason="needs a CUDA device (none here); run `pytest -m gpu` on a GPU machine"))


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory):
    """The suite never writes the user's cache (``$SPML_CACHE_DIR``: remembered step-thread
    choices, the bench's synthetic stores): it gets a fresh one for the session."""
    before = os.environ.get("SPML_CACHE_DIR")
    os.environ["SPML_CACHE_DIR"] = str(tmp_path_factory.mktemp("spml-cache"))
    yield
    if before is None:
        os.environ.pop("SPML_CACHE_DIR", None)
    else:
        os.environ["SPML_CACHE_DIR"] = before


@pytest.fixture(scope="module")
def one_thread():
    """Run the module's tests on one torch thread, restoring the count afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def yeast_store(tmp_path_factory) -> str:
    """Path of a store holding the real yeast set (2,417 × 103, 14 labels), read-only."""
    pytest.importorskip("river", reason="the yeast set ships inside river (extra 'yeast')")
    from featurize.imports import import_yeast

    path = tmp_path_factory.mktemp("yeast") / "yeast.zarr"
    import_yeast(path, progress=False)
    return str(path)
