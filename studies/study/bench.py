"""``spml bench study``: trials per minute of a real ``spml study``, and where its time goes.

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

__all__ = ["StudyBenchConfig", "bench_study", "format_study_bench", "yeast_bench_store"]


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
