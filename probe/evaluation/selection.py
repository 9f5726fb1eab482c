"""How a trial is scored for model selection (``spml study --select``; docs/selection.md).

* ``val`` — the protocol: one split, one draw (one replicate).
* ``cv:K`` — K train/val re-splits of the pool: the store's own, then the protocol's generator
  (:func:`probe.store.protocol.split_indices`) seeded ``PROTOCOL_SEED + k``; the study's draw.
* ``draws:N`` — N single-positive draws on the store's split: the study's (``observed_seed``),
  then :func:`probe.store.protocol.single_positive` seeded ``observed_seed + k``.

Each replicate is a :class:`probe.engine.data.ProbeData`; a trial scores its mean val mAP curve over
them (best epoch of the mean). The replicates depend on the mode alone, so every worker sees the
same ones (:meth:`Selection.describe` records them).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from probe.engine.data import ProbeData, fold_mismatch, same_tensor
from probe.engine.results import ProbeResult
from probe.errors import SpmlError
from probe.store.protocol import PROTOCOL_SEED, single_positive, split_indices

__all__ = ["MODES", "Selection", "SelectionError", "mean_over_replicates", "selection_data",
           "train_cells", "train_replicates"]

MODES = ("val", "cv", "draws")


class SelectionError(SpmlError):
    """A ``--select`` value that cannot be used (the message names the argument)."""


@dataclass(frozen=True)
class Selection:
    """A selection mode: ``val``, ``cv:K`` or ``draws:N`` (module docstring)."""

    mode: str = "val"  # the protocol's own split and draw
    k: int = 1  # replicates: re-splits (cv) or draws (draws); 1 for val

    @classmethod
    def parse(cls, text: str | Selection) -> Selection:
        """``"val"``, ``"cv:5"``, ``"draws:3"`` → a Selection; errors name ``--select``."""
        if isinstance(text, Selection):
            return text
        value = str(text).strip().lower()
        if value == "val":
            return cls()
        m = re.fullmatch(r"(cv|draws):(\d+)", value)
        if m is None:
            raise SelectionError(
                f"--select must be 'val', 'cv:K' or 'draws:N' (K, N >= 2), e.g. --select cv:5; "
                f"got {text!r}")
        k = int(m.group(2))
        if k < 2:
            raise SelectionError(
                f"--select {value}: {m.group(1)} needs at least 2 replicates (1 is --select "
                "val, the protocol's own split and draw)")
        return cls(m.group(1), k)

    def __str__(self) -> str:
        return "val" if self.mode == "val" else f"{self.mode}:{self.k}"

    @property
    def replicates(self) -> int:
        return self.k if self.mode != "val" else 1

    def describe(self, observed_seed: int = PROTOCOL_SEED) -> dict[str, Any]:
        """What the replicates are, for results and the study's identity."""
        if self.mode == "cv":
            seeds = [None, *(PROTOCOL_SEED + k for k in range(1, self.k))]
            return {"select": str(self), "split_seeds": seeds, "observed_seed": observed_seed,
                    "note": "split 0 is the store's own; split k re-splits the pool seeded "
                            f"{PROTOCOL_SEED} + k"}
        seeds = [observed_seed + k for k in range(self.replicates)]
        return {"select": str(self), "split_seeds": [None], "observed_seeds": seeds}


def _pool_splits(store: Any, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, val) store rows of the K re-splits: the store's own, then K - 1 more."""
    train, val = store.split("train"), store.split("val")
    pool = np.sort(np.concatenate([train, val]))
    fraction = len(val) / len(pool)
    splits = [(train, val)]
    for j in range(1, k):
        first, second = split_indices(len(pool), fraction, PROTOCOL_SEED + j)
        splits.append((pool[first], pool[second]))
    return splits


def _draw(store: Any, seed: int) -> np.ndarray:
    """The single-positive draw ``seed`` for every row, as the store would hold it (per phase)."""
    if seed in store.observed_seeds():
        return store.observed(seed)
    labels = store.labels()
    n_pool = int(store.attrs["n_pool"])
    return np.concatenate([single_positive(labels[:n_pool], seed),
                           single_positive(labels[n_pool:], seed)])


def selection_data(store: Any, select: str | Selection = "val", *,
                   device: str | torch.device = "cpu", observed_seed: int = PROTOCOL_SEED,
                   flip: bool = True, dtype: torch.dtype | None = None,
                   priors: str | None = None) -> list[ProbeData]:
    """The replicates a ``select`` mode scores trials on, each a :class:`ProbeData` on
    ``device`` (``val``: one, :meth:`ProbeData.from_store`). ``draws:N`` replicates share one
    load of the features (:meth:`ProbeData.with_draw`); ``cv:K`` ones share the test split
    and each hold their own train and val features (K × the memory of one train split).
    ``priors``: each replicate's train rows of that store prior (docs/priors.md)."""
    from probe.store import open_store

    selection = Selection.parse(select)
    if isinstance(store, str | Path):
        store = open_store(store)
    common = {"device": device, "flip": flip, "dtype": dtype, "priors": priors}
    if selection.mode == "val":
        return [ProbeData.from_store(store, observed_seed=observed_seed, **common)]
    if selection.mode == "cv":
        return _load_folds(store, selection, observed_seed, common)
    first = ProbeData.from_store(store, observed_seed=observed_seed,
                                 observed=_draw(store, observed_seed),
                                 replicate={"select": str(selection), "index": 0}, **common)
    replicates = [first]
    for j in range(1, selection.k):
        replicates.append(first.with_draw(store, observed_seed + j,
                                          observed=_draw(store, observed_seed + j),
                                          replicate={"select": str(selection), "index": j}))
    return replicates


def _load_folds(store: Any, selection: Selection, observed_seed: int,
                common: dict[str, Any]) -> list[ProbeData]:
    """The ``cv:K`` replicates: the store's one test split held once (fold 0's tensors); where
    the folds share a train size, their train features are consecutive blocks of one tensor,
    the layout :func:`probe.engine.data.stack_folds` trains them from without a copy."""
    observed = store.observed(observed_seed)
    splits = _pool_splits(store, selection.k)
    one_size = len({len(train) for train, _ in splits}) == 1
    folds: list[ProbeData] = []
    block: torch.Tensor | None = None
    for j, (train, val) in enumerate(splits):
        fold = ProbeData.from_store(store, observed_seed=observed_seed,
                                    rows={"train": train, "val": val}, observed=observed,
                                    replicate={"select": str(selection), "index": j}, **common)
        if folds:
            fold = dataclasses.replace(fold, test_x=folds[0].test_x,
                                       test_labels=folds[0].test_labels)
        if one_size:
            rows = fold.train_x.shape[0]
            if block is None:
                block = fold.train_x.new_empty((len(splits) * rows, fold.train_x.shape[1]))
            own = block[j * rows : (j + 1) * rows]
            own.copy_(fold.train_x)
            fold = dataclasses.replace(fold, train_x=own)
        folds.append(fold)
    return folds


def _one_draw_apart(data: list[ProbeData], val_labels: str) -> bool:
    """Whether the replicates differ in their train draw alone (``draws:N``): then one stacked
    run trains them all (the val draw matters only when val is scored on observed labels)."""
    first = data[0]
    fields = ["train_x", "val_x", "val_labels", "test_x", "test_labels"]
    if val_labels != "clean":
        fields.append("val_observed")
    for d in data[1:]:
        if d.n_train != first.n_train:
            return False
        for name in fields:
            if not same_tensor(getattr(d, name), getattr(first, name)):
                return False
    return True


def train_replicates(data: list[ProbeData], config: Any, loss: str,
                     hparams: dict[str, Any] | Sequence[dict[str, Any]] | None = None, *,
                     callback: Any = None, stack: bool = True) -> list[ProbeResult]:
    """The same trials trained on every replicate, one :class:`ProbeResult` per replicate (as
    :func:`probe.engine.train.train_probe` on each in turn). Replicates that differ in their
    train draw alone (``draws:N``) train as one stacked run, each (trial, replicate) on its own
    draw; replicates with train and val rows of their own (``cv:K``) as one stacked run of
    per-trial folds (:func:`probe.engine.train.train_probe` with ``fold_index``) where they
    share the train size and the test set and the loss stacks them in one object
    (:func:`_folds_stack`); each equal to the run on that replicate within float rounding.
    Otherwise one run per replicate. ``callback`` sees every stacked trial; nothing is pruned.
    ``stack=False``: one run per replicate (the reference)."""
    from probe.engine.results import trials_of
    from probe.engine.train import train_probe

    if not data:
        raise SelectionError("train_replicates: data is empty; give at least one replicate")
    if not stack or len(data) == 1:
        return [train_probe(d, config, loss, hparams, callback=callback, progress=False)
                for d in data]
    one_draw = _one_draw_apart(data, config.val_labels)
    if not one_draw and not _folds_stack(data, loss):
        return [train_probe(d, config, loss, hparams, callback=callback, progress=False)
                for d in data]
    if isinstance(hparams, dict) or hparams is None:
        n = len(config.seeds) if config.seeds is not None else 1
        trials = [dict(hparams or {}) for _ in range(n)]
    else:
        trials = [dict(h) for h in hparams]
    seeds = list(config.seeds) if config.seeds is not None else [config.seed]
    if len(seeds) == 1:
        seeds = seeds * len(trials)
    n = len(trials)
    r = len(data)
    each = [j for j in range(r) for _ in range(n)]  # trial i on replicate j: j * n + i
    stacked_config = dataclasses.replace(config, seeds=tuple(seeds * r))
    if one_draw:  # draws:N: one train split, each trial on its own draw
        stacked = train_probe(data[0], stacked_config, loss, trials * r, callback=callback,
                              progress=False, draws=[d.train_observed for d in data],
                              draw_index=each)
    else:  # cv:K: each trial on its own fold's train and val rows
        stacked = train_probe(list(data), stacked_config, loss, trials * r, callback=callback,
                              progress=False, fold_index=each)
    out = []
    for j, d in enumerate(data):
        out.append(trials_of(stacked, range(j * n, (j + 1) * n), source=d.source,
                             config={**stacked.config, "seeds": config.seeds},
                             timing={**stacked.timing, "stacked_replicates": r},
                             shared_batch_order=len(set(seeds)) == 1))
    return out


def _folds_stack(folds: list[ProbeData], loss: str) -> bool:
    """Whether replicates with rows of their own train as one run: they agree on what folds
    must share (:func:`probe.engine.data.fold_mismatch`: not, e.g., folds of unequal train
    sizes), and the loss runs every (trial, fold) through one object (else one object per
    trial, each holding its own per-example state: SMILE's feature graph)."""
    from probe.engine.trials import one_loss_object
    from probe.losses import get_loss_class

    if fold_mismatch(folds) is not None:
        return False
    return one_loss_object(get_loss_class(loss), [0], [0], False, folds=True)


def train_cells(cells: Sequence[tuple[Any, ProbeData]], loss: str,
                hparams: dict[str, Any] | None = None, *, stack: bool = True
                ) -> list[ProbeResult]:
    """One :class:`ProbeResult` (one trial) per ``(config, data)`` cell of one loss, as
    ``train_probe(data, config, loss, hparams)`` on each: a table's column of draws and seeds.
    Cells whose configs differ in ``seed`` and ``observed_seed`` alone (the draw is in the
    data; the config only names it) and whose data differ in the train draw alone train as one
    stacked run (equal within float rounding); the others one run each. ``stack=False``: one
    run per cell (the reference)."""
    from probe.engine.results import trials_of
    from probe.engine.train import train_probe

    out: list[ProbeResult | None] = [None] * len(cells)
    groups: dict[Any, list[int]] = {}
    for i, (config, _) in enumerate(cells):
        if config.seeds is not None:
            raise SelectionError(f"train_cells: cell {i} sets seeds; give one seed per cell")
        key = repr(dataclasses.replace(config, seed=0, observed_seed=0)) if stack else i
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        datas = [cells[i][1] for i in members]
        config = cells[members[0]][0]
        if len(members) == 1 or not _one_draw_apart(datas, config.val_labels):
            for i in members:
                alone = train_probe(cells[i][1], cells[i][0], loss, hparams, progress=False)
                out[i] = dataclasses.replace(alone, timing={**alone.timing, "stacked_cells": 1})
            continue
        seeds = tuple(cells[i][0].seed for i in members)
        stacked = train_probe(datas[0], dataclasses.replace(config, seeds=seeds), loss,
                              [dict(hparams or {}) for _ in members], progress=False,
                              draws=[d.train_observed for d in datas],
                              draw_index=list(range(len(members))))
        for j, i in enumerate(members):
            own = cells[i][0]
            out[i] = trials_of(
                stacked, range(j, j + 1), source=datas[j].source,
                config={**stacked.config, "seed": own.seed, "seeds": None,
                        "observed_seed": own.observed_seed},
                timing={**stacked.timing, "stacked_cells": len(members)},
                shared_batch_order=True)
    return [r for r in out if r is not None]


def _mean(values: Sequence[Any]) -> float | None:
    """The replicates' mean; None where any replicate lacks the value."""
    return None if any(v is None for v in values) else float(sum(values) / len(values))


def _mean_test_figures(bests: list[dict[str, Any]]) -> dict[str, Any]:
    """The replicates' test figures (``test_map``, ``test_OF1``, per-class ``test_ap``, …),
    averaged; a figure missing from any replicate is None (per class for ``test_ap``)."""
    out: dict[str, Any] = {}
    for key in [k for k in (bests[0] or {}) if k.startswith("test_")]:
        values = [(b or {}).get(key) for b in bests]
        if all(isinstance(v, list) for v in values):
            out[key] = [_mean(col) for col in zip(*values)]
        elif all(isinstance(v, int | float) for v in values):
            out[key] = _mean(values)
        else:
            out[key] = None
    return out


def mean_over_replicates(results: list[Any], select: str | Selection) -> Any:
    """One :class:`probe.engine.results.ProbeResult` scoring each trial by the mean over the
    replicates' results (the same trials, trained on each replicate of ``select``).

    Per epoch, ``val_map`` and ``train_loss`` are the replicates' means (each replicate's value
    in ``replicate_val_map``); the best epoch is the first maximum of the mean val curve; the
    test figures are the means of each replicate's on its own best-val head. No heads."""
    selection = Selection.parse(select)
    if len(results) != selection.replicates or not results:
        raise SelectionError(
            f"mean_over_replicates: {selection} has {selection.replicates} replicates; got "
            f"{len(results)} results")
    first = results[0]
    trials = []
    for i, base in enumerate(first.trials):
        runs = [r.trials[i] for r in results]
        epochs = []
        for e in range(min(len(t.epochs) for t in runs)):
            vals = [t.epochs[e].get("val_map") for t in runs]
            epochs.append({"epoch": base.epochs[e]["epoch"],
                           "train_loss": _mean([t.epochs[e].get("train_loss") for t in runs]),
                           "val_map": _mean(vals), "replicate_val_map": vals})
        curve = [e["val_map"] for e in epochs]
        scored = [(v, -j) for j, v in enumerate(curve) if v is not None and math.isfinite(v)]
        best_epoch, best = None, {}
        if scored:
            j = -max(scored)[1]
            best_epoch = epochs[j]["epoch"]
            best = {"epoch": best_epoch, "val_map": curve[j],
                    **_mean_test_figures([t.best for t in runs]),
                    "replicate_val_map": epochs[j]["replicate_val_map"],
                    "replicate_test_map": [t.best.get("test_map") if t.best else None
                                           for t in runs]}
        trials.append(dataclasses.replace(
            base, epochs=epochs, best_epoch=best_epoch, best=best, init={},
            stopped_at=None, finite=all(t.finite for t in runs)))
    config = {**first.config, "select": str(selection)}
    source = {**first.source, "replicates": selection.describe(
        first.source.get("observed_seed", PROTOCOL_SEED))}
    source.pop("replicate", None)
    timing = {"replicates": [r.timing for r in results]}
    return ProbeResult(loss=first.loss, config=config, trials=trials,
                       class_names=first.class_names, dataset=first.dataset, source=source,
                       environment=first.environment, timing=timing,
                       shared_batch_order=first.shared_batch_order)
