"""``spml table --tune grid``: the tabular benchmark's equal hyperparameter selection
(docs/tables.md "Grid rows"). Every loss row trains every (batch size, lr, weight decay) of one
grid on each draw, and keeps, per draw, the setting with the best val mAP as that draw's cell.

The grid trains stacked: per batch size, one :func:`probe.train_probe` run of lr × weight decay
× draws trials (per-trial ``lr`` / ``weight_decay`` and ``draws`` / ``draw_index``), each
trial equal within float rounding to the run of its setting alone on its draw."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from probe.errors import plain

from .errors import TableError

__all__ = ["GRID_FIELDS", "Grid", "GridRun", "choose", "train_grid"]

#: what ``--grid`` may set, in the order the grid enumerates its settings
GRID_FIELDS = ("batch_size", "lr", "weight_decay", "epochs")


@dataclass(frozen=True)
class Grid:
    """The settings every loss row is trained at; defaults: the tabular SPML benchmark's
    (CRISP's protocol on the MLL sets, docs/benchmarks.md: batch size {8, 16}, lr and weight
    decay each over {1e-2, 1e-3, 1e-4, 1e-5}, chosen on val; 10 epochs)."""

    batch_size: tuple[int, ...] = (8, 16)
    lr: tuple[float, ...] = (1e-2, 1e-3, 1e-4, 1e-5)
    weight_decay: tuple[float, ...] = (1e-2, 1e-3, 1e-4, 1e-5)
    epochs: int = 10

    def validate(self) -> None:
        for name in ("batch_size", "lr", "weight_decay"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise TableError(f"--grid {name}: one or more distinct values; got "
                                 f"{','.join(map(plain, values)) or 'none'}")
        if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.batch_size):
            raise TableError(f"--grid batch_size: positive integers; got "
                             f"{','.join(map(plain, self.batch_size))}")
        for v in self.lr:
            if not (0 < v < math.inf):
                raise TableError(f"--grid lr: positive numbers; got {plain(v)}")
        for v in self.weight_decay:
            if not (0 <= v < math.inf):
                raise TableError(f"--grid weight_decay: non-negative numbers; got {plain(v)}")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 1:
            raise TableError(f"--grid epochs: a positive integer; got {self.epochs!r}")

    @property
    def size(self) -> int:
        return len(self.batch_size) * len(self.lr) * len(self.weight_decay)

    def describe(self) -> dict[str, Any]:
        """The grid as its cells' keys hash it (a changed grid is a new cell)."""
        return {"batch_size": list(self.batch_size), "lr": list(self.lr),
                "weight_decay": list(self.weight_decay), "epochs": self.epochs,
                "select": "val_map"}

    def text(self) -> str:
        """``batch size {8, 16} × lr {...} × weight decay {...}, 10 epochs``."""
        def values(vs: Sequence[Any]) -> str:
            return "{" + ", ".join(plain(v) for v in vs) + "}"

        return (f"batch size {values(self.batch_size)} × lr {values(self.lr)} × weight decay "
                f"{values(self.weight_decay)}, {self.epochs} epochs")

    @classmethod
    def parse(cls, items: Sequence[str], epochs: int | None = None) -> Grid:
        """``--grid batch_size=8,16 lr=1e-2,1e-3 weight_decay=0,1e-4 epochs=10``: each named
        field replaces the default's; ``epochs`` (``--epochs``) the grid's epochs."""
        given: dict[str, Any] = {}
        for item in items:
            name, sep, text = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in GRID_FIELDS:
                raise TableError(f"--grid: NAME=V1,V2,... with NAME one of "
                                 f"{', '.join(GRID_FIELDS)}; got {item!r}")
            if name in given:
                raise TableError(f"--grid: {name} given twice")
            parts = [p.strip() for p in text.split(",") if p.strip()]
            want = int if name in ("batch_size", "epochs") else float
            try:
                values = tuple(want(p) for p in parts)
            except ValueError:
                raise TableError(f"--grid {name}: comma-separated "
                                 f"{'integers' if want is int else 'numbers'}; got {text!r}"
                                 ) from None
            if name == "epochs":
                if len(values) != 1:
                    raise TableError(f"--grid epochs: one number of epochs; got {text!r}")
                given[name] = values[0]
            else:
                given[name] = values
        if epochs is not None:
            if "epochs" in given and given["epochs"] != epochs:
                raise TableError(f"--epochs {epochs} and --grid epochs={given['epochs']}: give "
                                 "one")
            given["epochs"] = epochs
        grid = cls(**given)
        grid.validate()
        return grid


@dataclass
class GridRun:
    """One grid setting trained on one draw: its one-trial result."""

    batch_size: int
    lr: float
    weight_decay: float
    result: Any  # probe.engine.results.ProbeResult, one trial

    @property
    def val_map(self) -> float:
        best = self.result.trials[0].best or {}
        value = best.get("val_map")
        return math.nan if value is None else float(value)

    def summary(self) -> dict[str, Any]:
        """What a grid cell keeps of each setting: the setting and its val figure."""
        return {"batch_size": self.batch_size, "lr": self.lr,
                "weight_decay": self.weight_decay, "val_map": self.val_map,
                "best_epoch": self.result.trials[0].best_epoch}


def choose(runs: Sequence[GridRun]) -> GridRun:
    """The run with the highest val mAP; ties (and NaN) go to the first in grid order (batch
    size, then lr, then weight decay, as given). With no finite val figure, the first run."""
    best = runs[0]
    for run in runs[1:]:
        if math.isfinite(run.val_map) and not run.val_map <= best.val_map:
            best = run
    return best


def train_grid(base: Any, loss: str, hparams: dict[str, Any], grid: Grid,
               datas: Sequence[Any], *, stack: bool = True) -> list[list[GridRun]]:
    """Every grid setting on each of ``datas`` (one :class:`ProbeData` per draw, of one store
    and split: they differ in the train draw alone): per draw, its runs in grid order.

    ``base``: the row's :class:`probe.ProbeConfig` (its seed, labels, ...); the grid sets batch
    size, epochs, lr and weight decay. ``stack=True``: one run per batch size, of lr × weight
    decay × draws trials; ``stack=False``: one run per (draw, setting), the reference."""
    from probe.engine.results import trials_of
    from probe.engine.train import train_probe

    settings = [(lr, wd) for lr in grid.lr for wd in grid.weight_decay]
    out: list[list[GridRun]] = [[] for _ in datas]
    for b in grid.batch_size:
        config = dataclasses.replace(base, batch_size=b, epochs=grid.epochs)
        if not stack:
            for k, data in enumerate(datas):
                for lr, wd in settings:
                    own = dataclasses.replace(config, lr=lr, weight_decay=wd,
                                              observed_seed=data.source.get(
                                                  "observed_seed", base.observed_seed))
                    result = train_probe(data, own, loss, dict(hparams), progress=False)
                    result = dataclasses.replace(
                        result, timing={**result.timing, "stacked_cells": 1, "grid_trials": 1})
                    out[k].append(GridRun(b, lr, wd, result))
            continue
        trials, index = [], []
        for k in range(len(datas)):
            for lr, wd in settings:
                trials.append({**hparams, "lr": lr, "weight_decay": wd})
                index.append(k)
        stacked = train_probe(datas[0], config, loss, trials, progress=False,
                              draws=[d.train_observed for d in datas], draw_index=index)
        for t, (k, (lr, wd)) in enumerate(zip(index, settings * len(datas))):
            data = datas[k]
            # the record of the run of this setting alone on this draw (the reference)
            record_config = {**stacked.config, "lr": lr, "weight_decay": wd,
                             "observed_seed": data.source.get("observed_seed",
                                                              base.observed_seed)}
            timing = {**stacked.timing, "stacked_cells": len(datas), "grid_trials": len(trials)}
            result = trials_of(stacked, range(t, t + 1), source=data.source,
                               config=record_config, timing=timing, shared_batch_order=True)
            out[k].append(GridRun(b, lr, wd, result))
    return out
