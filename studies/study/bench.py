"""``spml bench study``: trials per minute of a real ``spml study``, and where its time goes;
``spml bench replicates``: what a confirmation over seeds and a ``draws:N`` / ``cv:K`` study
cost stacked.

A study is run exactly as ``spml study`` runs it (:func:`studies.study.run.run_study`, one worker, a
fresh storage in a temporary folder) on a named store, and its wall time is split into
**train** (epochs and the losses' per-epoch passes), **eval** (val every epoch, test once),
**optuna** (the per-epoch callback and everything outside the engine that is not I/O: ask, tell,
heartbeats, storage), **io** (loading the store, writing the Parquet results) and **setup** (the
rest of each engine call). To read those timings the bench wraps ``train_probe``, the store
loader and the Parquet writer for the duration of the run. One run, no medians: a study is one
long run whose trials/min is the figure.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from probe.errors import SpmlError

__all__ = ["ReplicatesBenchConfig", "StudyBenchConfig", "bench_replicates", "bench_study",
           "format_replicates_bench", "format_study_bench", "yeast_bench_store"]


@dataclass(frozen=True)
class StudyBenchConfig:
    """One measured study (defaults: a 64-trial GR study on yeast)."""

    store: str  # a feature store path ("yeast" / "coco" are resolved by the CLI)
    loss: str = "gr"  # the loss the study searches
    n_trials: int = 64  # finished trials to reach
    batch: int = 16  # trials asked at once and trained stacked
    epochs: int | None = None  # None: the loss's paper preset for the dataset
    batch_size: int | None = None  # None: the loss's paper preset for the dataset
    pruner: str = "median"  # as `spml study`'s default
    storage: str = "journal"  # journal (spml study's default) | sqlite: a fresh file either way
    seed: int = 0  # sampler seed

    def validate(self) -> None:
        """The storage kind; the rest is checked as ``spml study`` checks it (run_study)."""
        if self.storage not in ("journal", "sqlite"):
            raise SpmlError(f"bench study: storage must be 'journal' or 'sqlite'; got "
                             f"{self.storage!r}")


def yeast_bench_store(cache_dir: str | Path | None = None, progress: bool = False) -> Path:
    """The real yeast set as a store in the bench cache (imported once from river's copy)."""
    from featurize.imports import import_yeast
    from probe.bench.engine import default_cache_dir
    from probe.store import StoreError, open_store

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / "bench-yeast.zarr"
    if path.exists():
        with contextlib.suppress(StoreError):
            open_store(path)
            return path
    root.mkdir(parents=True, exist_ok=True)
    import_yeast(path, overwrite=True, progress=progress)
    return path


class _Clock:
    """Seconds spent in the wrapped functions during a study (see the module docstring)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(("train", "eval", "callback", "engine", "io"), 0.0)
        self.calls = 0

    @contextlib.contextmanager
    def wrapped(self) -> Iterator[_Clock]:
        import probe.engine.train
        import studies.study.worker
        from probe.engine.data import ProbeData

        real_train = probe.engine.train.train_probe
        clock = self

        def timed(fn: Any, key: str) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    clock.seconds[key] += time.perf_counter() - t0
            return call

        def train_probe(*args: Any, callback: Any = None, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            result = real_train(*args, callback=callback and timed(callback, "callback"), **kwargs)
            clock.seconds["engine"] += time.perf_counter() - t0
            timing = result.timing
            clock.seconds["train"] += sum(timing["train_seconds"]) + sum(
                timing["end_epoch_seconds"])
            clock.seconds["eval"] += sum(timing["eval_seconds"]) + timing.get("test_seconds", 0.0)
            clock.calls += 1
            return result

        with (mock.patch.object(probe.engine.train, "train_probe", train_probe),
              mock.patch.object(ProbeData, "from_store",
                                classmethod(timed(ProbeData.from_store.__func__, "io"))),
              mock.patch.object(studies.study.worker, "write_batch",
                                timed(studies.study.worker.write_batch, "io"))):
            yield self


def bench_study(config: StudyBenchConfig, *, log: Any = None) -> dict[str, Any]:
    """Run the study of ``config`` once; trials/min and the split of its wall time."""
    from probe.bench.engine import machine_info
    from probe.engine.config import resolve_training
    from probe.losses import get_loss_class
    from probe.store import open_store
    from studies.study.run import run_study
    from studies.study.settings import StudySettings

    config.validate()
    before = machine_info()
    with tempfile.TemporaryDirectory(prefix="spml-bench-study-") as tmp:
        settings = StudySettings(
            store=str(config.store), loss=config.loss, n_trials=config.n_trials,
            batch=config.batch, pruner=config.pruner, out=str(Path(tmp) / "study"),
            storage=str(Path(tmp) / "study" / ("study.log" if config.storage == "journal"
                                                else "study.db")),
            seed=config.seed, epochs=config.epochs, batch_size=config.batch_size)
        clock = _Clock()
        t0 = time.perf_counter()
        with clock.wrapped():
            summary = run_study(settings, log=log or (lambda msg: None))
        wall = time.perf_counter() - t0
    s = clock.seconds
    finished = summary.n_complete + summary.n_pruned
    split = {"train": s["train"], "eval": s["eval"],
             "optuna": s["callback"] + max(wall - s["engine"] - s["io"], 0.0), "io": s["io"],
             "setup": max(s["engine"] - s["train"] - s["eval"] - s["callback"], 0.0)}
    store = open_store(config.store)
    training = resolve_training(get_loss_class(config.loss), store.dataset,
                                batch_size=config.batch_size, epochs=config.epochs)
    return {
        "config": {**vars(config), "store": str(config.store)},
        "store": {"dataset": store.dataset, "train_rows": len(store.split("train")),
                  "dim": store.feature_dim, "classes": store.n_classes},
        # what the trials trained with: a setting left out is the loss's preset for the
        # store's dataset, else the generic one (the synthetic store has no paper preset)
        "training": {"batch_size": training.batch_size, "lr": training.lr,
                     "epochs": training.epochs, "sources": training.sources},
        "machine": {"before": before, "after": machine_info()},
        "wall_seconds": wall, "finished_trials": finished, "complete": summary.n_complete,
        "pruned": summary.n_pruned, "engine_calls": clock.calls,
        "trials_per_minute": 60.0 * finished / wall if wall > 0 else float("nan"),
        "seconds": split,
        "fractions": {k: v / wall for k, v in split.items()} if wall > 0 else {},
        "optuna_in_epoch_callbacks_seconds": s["callback"],
    }


def format_study_bench(report: dict[str, Any]) -> str:
    """The report as text (what ``spml bench study`` prints before the JSON)."""
    c, st, m = report["config"], report["store"], report["machine"]
    lines = [
        f"study bench: {c['loss']} on {st['dataset']} ({st['train_rows']} train rows x "
        f"{st['dim']}, {st['classes']} classes), {c['n_trials']} trials in batches of "
        f"{c['batch']}, pruner {c['pruner']}"]
    tr = report.get("training")
    if tr:
        lines.append(f"training: batch size {tr['batch_size']} ({tr['sources']['batch_size']}), "
                     f"lr {tr['lr']:g} ({tr['sources']['lr']}), {tr['epochs']} epochs")
    lines += [
        f"machine: {m['before']['cpu']}, {m['before']['cpus']} CPUs, "
        f"{m['before']['torch_threads']} torch threads; load average before "
        f"{m['before']['load_avg_1_5_15']} after {m['after']['load_avg_1_5_15']}",
        f"{report['finished_trials']} trials finished ({report['complete']} complete, "
        f"{report['pruned']} pruned) in {report['wall_seconds']:.1f} s: "
        f"{report['trials_per_minute']:.1f} trials/min",
        "where the time went: " + ", ".join(
            f"{k} {v:.1f} s ({100 * report['fractions'].get(k, 0):.0f}%)"
            for k, v in report["seconds"].items()),
    ]
    return "\n".join(lines)


#: what spml bench replicates stacks: a confirmation's seeds, a draws:N and a cv:K study's
#: replicates
KINDS = ("seeds", "draws", "folds")


@dataclass(frozen=True)
class ReplicatesBenchConfig:
    """One measured confirmation (defaults: AN at its COCO preset, 3 seeds, 5 draws, 5 folds, a
    quarter of COCO's train rows)."""

    loss: str = "an"  # the confirmed trial's loss, at its COCO paper preset
    rows: int = 16_384  # train rows of the COCO-shaped store (COCO: 65,665)
    seeds: int = 3  # training seeds of `spml study confirm`
    draws: int = 5  # replicates of `--select draws:N`
    folds: int = 5  # replicates of `--select cv:K` (the pool re-split K ways)
    epochs: int | None = None  # None: the loss's COCO preset
    cache_dir: str | None = None  # where the synthetic store is kept (the bench cache)
    device: str = "auto"

    def validate(self) -> None:
        from probe.losses import available

        if self.loss not in available():
            raise SpmlError(f"bench replicates: --loss {self.loss!r} is not a registered loss; "
                            "choose one of 'spml losses list' (e.g. an, gr, role)")
        if self.rows < 64:
            raise SpmlError(f"bench replicates: --rows must be at least 64; got {self.rows}")
        for flag, value in (("--seeds", self.seeds), ("--draws", self.draws),
                            ("--folds", self.folds)):
            if value < 2:
                raise SpmlError(f"bench replicates: {flag} must be at least 2 (stacking needs "
                                f"several replicates); got {value}")
        if self.epochs is not None and self.epochs < 1:
            raise SpmlError(f"bench replicates: --epochs must be at least 1; got {self.epochs}")


def bench_replicates(config: ReplicatesBenchConfig | None = None, *,
                     progress: bool = False) -> dict[str, Any]:
    """What ``spml study confirm`` over seeds and a ``--select draws:N`` / ``cv:K`` study train
    for one trial (:func:`probe.evaluation.selection.train_replicates`), on a COCO-shaped store
    named coco: one run (one seed, one draw), the seeds stacked and one run per seed, the draws
    stacked and one run per draw, the folds stacked and one run per fold; with the arithmetic
    floor of each (:func:`probe.engine.loop.
    step_arithmetic`: the products and Adam of T heads, no loss, no Python) and the machine.
    Every mode runs once untimed first (imports, the step-thread choice); each is then timed
    once. The stacked runs' heads are compared with the one-run-each heads (test mAP)."""
    import dataclasses

    from probe.bench.engine import machine_info, synthetic_store
    from probe.devices import resolve_device
    from probe.engine.config import ProbeConfig
    from probe.evaluation.selection import selection_data, train_replicates

    config = config or ReplicatesBenchConfig()
    config.validate()
    store = synthetic_store(config.rows, cache_dir=config.cache_dir, progress=progress,
                            name="coco")
    device = resolve_device(config.device)
    draws = selection_data(store, f"draws:{config.draws}", device=device)
    folds = selection_data(store, f"cv:{config.folds}", device=device)
    one = draws[0]  # the store's own draw: what one run of the trial trains on
    base = ProbeConfig(seed=0, epochs=config.epochs, device=str(device))
    seeds = tuple(range(config.seeds))

    def seed_runs(cfg: Any) -> list[Any]:
        return [train_replicates([one], dataclasses.replace(cfg, seed=s), config.loss, [{}])[0]
                for s in seeds]

    modes = {
        "one run": lambda cfg: train_replicates([one], cfg, config.loss, [{}]),
        "seeds stacked": lambda cfg: train_replicates(
            [one], dataclasses.replace(cfg, seeds=seeds), config.loss, [{}] * len(seeds)),
        "seeds one run each": seed_runs,
        "draws stacked": lambda cfg: train_replicates(draws, cfg, config.loss, [{}]),
        "draws one run each": lambda cfg: train_replicates(draws, cfg, config.loss, [{}],
                                                           stack=False),
        "folds stacked": lambda cfg: train_replicates(folds, cfg, config.loss, [{}]),
        "folds one run each": lambda cfg: train_replicates(folds, cfg, config.loss, [{}],
                                                           stack=False),
    }
    before = machine_info()
    for run in modes.values():  # untimed: imports, thread choices, caches
        run(dataclasses.replace(base, epochs=1))
    seconds: dict[str, float] = {}
    results: dict[str, list[Any]] = {}
    for label, run in modes.items():
        t0 = time.perf_counter()
        results[label] = run(base)
        seconds[label] = time.perf_counter() - t0
    first = results["one run"][0]
    steps = first.timing["steps_per_epoch"] * first.timing["epochs_run"]
    floors = {"one run": _floor(one, first, 1, True, steps),
              "seeds stacked": _floor(one, first, config.seeds, False, steps),
              "draws stacked": _floor(one, first, config.draws, True, steps),
              "folds stacked": _floor(one, first, config.folds, False, steps)}
    diff = max(_largest_difference(results[f"{kind} stacked"], results[f"{kind} one run each"])
               for kind in KINDS)
    training = first.config
    return {"loss": config.loss, "rows": config.rows, "seeds": config.seeds,
            "draws": config.draws, "folds": config.folds,
            "fold_train_rows": folds[0].n_train, "device": str(device),
            # the folds trained as one run (not one run each: folds of unequal train sizes)
            "folds_in_one_run": results["folds stacked"][0].timing.get(
                "stacked_replicates") == config.folds,
            "training": {k: training.get(k) for k in ("batch_size", "lr", "epochs")},
            "steps": steps, "seconds": seconds, "floor_seconds": floors,
            "stacked_over_one": {kind: seconds[f"{kind} stacked"] / seconds["one run"]
                                 for kind in KINDS},
            "least_over_one": least_over_one(seconds["one run"], floors),
            "each_over_stacked": {kind: seconds[f"{kind} one run each"]
                                  / seconds[f"{kind} stacked"] for kind in KINDS},
            "max_test_map_difference": diff, "machine_before": before,
            "machine": machine_info(), "store": str(store)}


def least_over_one(one_run: float, floors: dict[str, float]) -> dict[str, float]:
    """Per kind, the least a stacked run can cost on this machine, over one run: one run's time
    beyond its heads' arithmetic, shared by every replicate, plus the stacked heads' own floor.
    A target below it needs a device where the heads' arithmetic runs side by side."""
    shared = max(one_run - floors["one run"], 0.0)
    return {kind: (shared + floors[f"{kind} stacked"]) / one_run for kind in KINDS}


def _floor(data: Any, result: Any, trials: int, one_batch: bool, steps: int) -> float:
    """Seconds the arithmetic of ``trials`` heads takes over ``steps`` steps at the run's batch
    size and step threads (a median of five timings of 50 steps)."""
    import statistics

    import torch

    from probe.engine.loop import step_arithmetic, sync
    from probe.engine.threads import step_threads

    shape = (trials, data.train_x.shape[1], data.n_classes)
    step = step_arithmetic(shape, result.config["batch_size"], one_batch, data.device)
    threads = result.timing.get("step_threads")
    samples = []
    with step_threads(data.device, threads or torch.get_num_threads()):
        for _ in range(6):
            t0 = time.perf_counter()
            for _ in range(50):
                step()
            sync(data.device)
            samples.append((time.perf_counter() - t0) / 50)
    return statistics.median(samples[1:]) * steps  # the first: warm-up


def _largest_difference(stacked: list[Any], each: list[Any]) -> float:
    """The largest |test mAP| difference (points) between matching trials of two runs; inf
    where one is finite and the other not."""
    import math

    mine = [t.best.get("test_map") for r in stacked for t in r.trials]
    ref = [t.best.get("test_map") for r in each for t in r.trials]
    if len(mine) != len(ref):
        raise SpmlError("bench replicates: the stacked and one-run-each runs trained different "
                        "numbers of trials; this is a bug in spml-probe")
    diff = 0.0
    for a, b in zip(mine, ref):
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            if a != b:
                diff = math.inf
            continue
        diff = max(diff, abs(a - b))
    return diff


def format_replicates_bench(report: dict[str, Any]) -> str:
    """The report as text (what ``spml bench replicates`` prints before the JSON)."""
    s, f, m = report["seconds"], report["floor_seconds"], report["machine_before"]
    tr = report["training"]
    lines = [
        f"replicates bench: {report['loss']} at its COCO preset (batch {tr['batch_size']}, lr "
        f"{tr['lr']:g}, {tr['epochs']} epoch(s), {report['steps']} steps) on the COCO-shaped store "
        f"named coco, {report['rows']:,} train rows; {report['device']}",
        f"one run (one seed, one draw): {s['one run']:.2f} s (arithmetic floor "
        f"{f['one run']:.2f} s)",
        f"{'':<34}{'stacked':>9}{'one run each':>14}{'stacked / one':>15}"
        f"{'each / stacked':>16}{'floor':>8}{'least / one':>13}"]
    for kind, label in (("seeds", f"{report['seeds']} seeds (spml study confirm)"),
                        ("draws", f"{report['draws']} draws (--select draws:{report['draws']})"),
                        ("folds", f"{report['folds']} folds (--select cv:{report['folds']})")):
        lines.append(
            f"{label:<34}{s[f'{kind} stacked']:>8.2f}s{s[f'{kind} one run each']:>13.2f}s"
            f"{report['stacked_over_one'][kind]:>14.2f}x{report['each_over_stacked'][kind]:>15.2f}x"
            f"{f[f'{kind} stacked']:>7.2f}s{report['least_over_one'][kind]:>12.2f}x")
    if not report["folds_in_one_run"]:
        lines.append("the folds trained one run each (their train sizes differ)")
    lines += [
        f"heads: largest test mAP difference stacked vs one run each "
        f"{report['max_test_map_difference']:.4f} points",
        "floor: the T heads' products and Adam update alone over the run's steps "
        "(probe.engine.loop.step_arithmetic), at the run's step threads",
        "least / one: one run's time beyond its floor plus the stacked heads' floor, over one "
        "run -- the least stacking can cost on this machine",
        f"machine: {m['cpu']}, {m['cpus']} CPUs, {m['torch_threads']} torch threads; load "
        f"average before {m['load_avg_1_5_15']} after {report['machine']['load_avg_1_5_15']}"]
    return "\n".join(lines)
