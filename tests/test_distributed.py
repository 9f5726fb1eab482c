"""``spml featurize`` past one process: ``torch.distributed`` ranks write disjoint row
blocks of one store, the store is complete only when every block is, and an interrupted run
resumes. On CPU with two ``gloo`` ranks (spawned processes, one torch thread each); the stores
are compared bit for bit with a single-process run's (the same batches: a batch never crosses a
block, so which rank computes a block does not change its values).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch.multiprocessing as mp
import zarr

sys.path.insert(0, str(Path(__file__).parent))
from fixtures_datasets import make_folder

from featurize.datasets import load_dataset
from probe.store import open_store

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(
    backbone="resnet18",
    weights="random",
    size=32,
    block_rows=2,
    batch_size=2,
    workers=2,
    decode="pil",
    progress=False,
)  # fmt: skip


def _rank_main(rank: int, world: int, init_file: str, index, out: str, config: dict,
               report: str) -> None:  # fmt: skip
    """One rank: join the gloo group (file rendezvous), featurize, write what happened, leave.

    The report is written before the group is left, and the process ends with ``os._exit``
    once it has: a spawned process otherwise finalises the interpreter with gloo's threads
    still around, and one such rank died with SIGABRT ("terminate called without an active
    exception") after its work was done, once, in a CI run on a loaded machine (not seen in
    60 runs here)."""
    import torch
    import torch.distributed as dist

    from featurize.extract.run import FeaturizeConfig, featurize

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
        )
    try:
        res = featurize(index, out, FeaturizeConfig(**config))
        outcome = {
            "ok": True,
            "rows_done": res.rows_done,
            "blocks_done": res.blocks_done,
            "blocks_resumed": res.blocks_resumed,
            "bad_rows": res.bad_rows,
            "world_size": res.world_size,
        }
    except Exception as err:
        outcome = {"ok": False, "type": type(err).__name__, "error": str(err)}
    Path(report, f"rank{rank}.json").write_text(json.dumps(outcome))
    if world > 1:
        dist.barrier()  # no rank leaves while another is still in a collective
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(tmp: Path, world: int, index, out: Path, **config) -> list[dict]:
    """Run ``world`` ranks to the end; their reports in rank order."""
    tag = f"{out.name}-{len(list(tmp.glob('round-*')))}"
    report = tmp / f"round-{tag}"
    report.mkdir()
    mp.start_processes(
        _rank_main,
        args=(world, str(tmp / f"pg-{tag}"), index, str(out), {**CONFIG, **config}, str(report)),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    return [json.loads((report / f"rank{r}.json").read_text()) for r in range(world)]


def arrays(path: Path) -> dict[str, np.ndarray]:
    group = zarr.open_group(path, mode="r")
    return {name: group[name][:] for name in ("features", "features_flip", "blocks_done")}


def assert_same_store(a: Path, b: Path) -> None:
    """Bit for bit: features, flipped features, labels and splits."""
    sa, sb = open_store(a), open_store(b)
    for flip in (False, True):
        fa, fb = sa.features(flip=flip), sb.features(flip=flip)
        assert fa.dtype == fb.dtype and np.array_equal(fa.view(np.uint16), fb.view(np.uint16))
    assert np.array_equal(sa.labels(), sb.labels())
    assert np.array_equal(sa.split("train"), sb.split("train"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """12 tiny JPEGs (6 blocks of 2 rows) and the single-process reference store."""
    tmp = tmp_path_factory.mktemp("dist")
    make_folder(tmp / "ds", n_images=12, seed=3)
    index = load_dataset("folder", tmp / "ds")
    reference = tmp / "single.zarr"
    (single,) = run_ranks(tmp, 1, index, reference)
    assert single["ok"] and single["blocks_done"] == 6, single
    return tmp, index, reference


def test_two_ranks_write_disjoint_blocks_of_one_store(dataset, tmp_path) -> None:
    _, index, reference = dataset
    out = tmp_path / "two.zarr"
    reports = run_ranks(tmp_path, 2, index, out)
    assert all(r["ok"] for r in reports), reports
    # both ranks report the whole run: 6 blocks, 12 rows, 2 processes
    assert {(r["blocks_done"], r["rows_done"], r["world_size"]) for r in reports} == {(6, 12, 2)}
    assert open_store(out).attrs["provenance"]["run"]["world_size"] == 2
    assert_same_store(out, reference)


@pytest.mark.slow
def test_a_failing_rank_stops_all_and_the_run_resumes(dataset, tmp_path) -> None:
    """Rank 1 owns blocks 1, 3, 5; an undecodable image in block 3 stops it there. Every rank
    reports the failure, the store stays incomplete (open_store refuses it) with exactly the
    finished blocks marked, and the same command resumes only the rest."""
    _, index, reference = dataset
    paths = [Path(p) for p in (*index.pool.paths, *index.test.paths)]
    victim = paths[6]  # row 6: block 3
    original = victim.read_bytes()
    victim.write_bytes(b"not a jpeg")
    out = tmp_path / "resumed.zarr"
    try:
        reports = run_ranks(tmp_path, 2, index, out)
    finally:
        victim.write_bytes(original)
    assert [r["ok"] for r in reports] == [False, False]
    assert reports[1]["type"] == "BadImageError" and str(victim) in reports[1]["error"]
    assert "rank 1 of 2 failed" in reports[0]["error"] and "resume" in reports[0]["error"]
    done = arrays(out)["blocks_done"]
    assert done[[0, 1, 2, 4]].all() and not done[3] and not done[5]
    assert not zarr.open_group(out, mode="r").attrs["complete"]
    with pytest.raises(ValueError, match="incomplete"):
        open_store(out)
    # rank 0 refuses to resume with another transform: every rank stops with its reason
    reports = run_ranks(tmp_path, 2, index, out, size=48)
    assert [r["type"] for r in reports] == ["StoreError", "RankFailed"], reports
    assert "rank 0 of 2 failed" in reports[1]["error"] and "size" in reports[1]["error"]

    reports = run_ranks(tmp_path, 2, index, out)
    assert all(r["ok"] for r in reports), reports
    assert {(r["blocks_resumed"], r["blocks_done"], r["rows_done"]) for r in reports} == {(4, 2, 4)}
    assert_same_store(out, reference)


@pytest.mark.slow
def test_bad_rows_of_all_ranks_reach_the_store(dataset, tmp_path) -> None:
    """With --skip-bad each rank records its bad rows per block (ranks never rewrite the shared
    attributes at once); rank 0 merges them at the end: the same list as one process finds."""
    _, index, _ = dataset
    paths = [Path(p) for p in (*index.pool.paths, *index.test.paths)]
    victims = {1: paths[1], 6: paths[6]}  # block 0 (rank 0) and block 3 (rank 1)
    originals = {r: p.read_bytes() for r, p in victims.items()}
    for p in victims.values():
        p.write_bytes(b"not a jpeg")
    try:
        (single,) = run_ranks(tmp_path, 1, index, tmp_path / "one.zarr", skip_bad=True)
        reports = run_ranks(tmp_path, 2, index, tmp_path / "two.zarr", skip_bad=True)
    finally:
        for r, p in victims.items():
            p.write_bytes(originals[r])
    assert single["ok"] and [b["row"] for b in single["bad_rows"]] == [1, 6]
    assert all(r["ok"] for r in reports), reports
    assert reports[0]["bad_rows"] == reports[1]["bad_rows"] == single["bad_rows"]
    store = open_store(tmp_path / "two.zarr")
    assert store.attrs["bad_rows"] == single["bad_rows"] and store.attrs["n_bad_rows"] == 2
    assert not (tmp_path / "two.zarr" / "spml-bad-rows").exists()
    assert_same_store(tmp_path / "two.zarr", tmp_path / "one.zarr")


@pytest.mark.slow
def test_torchrun_cli(dataset, tmp_path) -> None:
    """The documented command: ``torchrun --nproc-per-node 2 -m studies.cli featurize …``;
    only rank 0 prints the summary."""
    tmp, _, reference = dataset
    out = tmp_path / "torchrun.zarr"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", port, "-m", "studies.cli",
           "featurize", "folder", "--root", str(tmp / "ds"), "--out", str(out),
           "--backbone", "resnet18", "--weights", "random",
           "--size", "32", "--block-rows", "2", "--batch-size", "2", "--decode", "pil",
           "--workers", "2", "--quiet", "--json"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{") : proc.stdout.rindex("}") + 1])
    assert (summary["world_size"], summary["rows_done"], summary["blocks_done"]) == (2, 12, 6)
    assert_same_store(out, reference)


# ----------------------------------------------------------------------------- study workers


@pytest.mark.slow
def test_study_runs_one_worker_per_device(yeast_store, tmp_path, monkeypatch) -> None:
    """``spml study --devices cpu,cpu``: two workers on one journal storage, worker i started
    with ``--devices <device i>``; every trial records the device it was trained on."""
    import optuna

    import studies.study.run as study_mod
    import studies.study.worker as worker_mod
    from studies.cli import main
    from studies.study.storage import open_storage, parse_storage

    started: list[list[str]] = []
    real_popen = subprocess.Popen

    def popen(cmd, *args, **kwargs):
        # subprocess is one module: count the study's worker processes, not other programs a
        # library starts meanwhile (platform.processor() runs `uname -p` once per process)
        if isinstance(cmd, list | tuple) and "study" in cmd:
            started.append(list(cmd))
        return real_popen(cmd, *args, **kwargs)

    monkeypatch.setattr(study_mod.subprocess, "Popen", popen)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    out = tmp_path / "study"
    fast = ["--epochs", "2", "--batch-size", "32", "--lr", "0.01"]
    code = main(["study", yeast_store, "--loss", "an_ls", "--trials", "4", "--trials-at-once", "2",
                 "--devices", "cpu,cpu", "--storage", str(out / "study.log"), "--out", str(out),
                 *fast])  # fmt: skip
    assert code == 0
    assert len(started) == 2
    assert all(cmd[-2:] == ["--devices", "cpu"] for cmd in started), started
    storage = open_storage(parse_storage(out / "study.log"))
    trials = optuna.load_study(study_name="yeast-an_ls", storage=storage).get_trials()
    finished = [t for t in trials if t.state.is_finished()]
    assert len(finished) >= 4
    assert {t.system_attrs.get(worker_mod.DEVICE_KEY) for t in finished} == {"cpu"}


def test_study_devices_errors(tmp_path, capsys) -> None:
    from studies.cli import main

    store = str(tmp_path / "none.zarr")
    assert main(["study", store, "--loss", "an", "--devices", "cpu,cpu", "--workers", "3",
                 "--storage", str(tmp_path / "s.log")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--devices names 2 devices (cpu,cpu) for --workers 3" in err
    assert main(["study", store, "--loss", "an", "--devices", "cpu,tpu!"]) == 2
    assert "device must be" in capsys.readouterr().err
