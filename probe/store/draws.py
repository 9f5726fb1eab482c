"""More draws of observed labels for a complete store: :func:`add_draws` (several seeds of
one kind, all checked first), :func:`add_observed_seed` (the protocol's single positives, or a
label budget) and :func:`add_biased_draw` (a label bias: :mod:`probe.store.bias`),
docs/protocol.md step 2 and "Label budgets", docs/priors.md "Label-bias draws"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from probe.store.bias import BIASES, GROUP, biased_positive, class_weights
from probe.store.errors import StoreError
from probe.store.layout import phase_observed
from probe.store.reading import Store, open_store
from probe.store.records import check_draw, draw_record, write_draws


def add_draws(path: str | Path, seeds: Sequence[int], *, k: int = 1, fraction: float = 1.0,
              bias: str | None = None, weights_by_class: Sequence[float] | None = None
              ) -> list[int]:
    """Add the draws ``seeds`` to a complete store, all of one kind: the protocol's single
    positives, a label budget (``k``, ``fraction``; :func:`add_observed_seed`) or a label
    ``bias`` (:func:`add_biased_draw`). Every seed is checked before the first is written: one
    taken by a draw of another kind refuses the whole call and writes nothing. Seeds already
    holding this very draw are kept. Returns the seeds written."""
    store = open_store(path)
    if bias is not None:
        if (k, fraction) != (1, 1.0):
            raise StoreError("--bias draws one positive per image: drop --k / --fraction")
        plan = _bias_plan(store, bias, weights_by_class)
    else:
        if weights_by_class is not None:
            raise StoreError("--class-weights goes with --bias semantic")
        plan = _budget_plan(k, fraction)
    return _add_draws(store, [int(s) for s in dict.fromkeys(seeds)], *plan)


def _budget_plan(k: Any, fraction: Any) -> tuple:
    """A kind of draw, checked: its record, the attribute and value registering it, and the
    draw of ``(pool labels, test labels, seed)`` (:func:`_add_draws`'s arguments)."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise StoreError(f"--k (observed positives per image) must be an integer >= 1; got {k}")
    if (isinstance(fraction, bool) or not isinstance(fraction, int | float)
            or not 0.0 < float(fraction) <= 1.0):
        raise StoreError(f"--fraction (of images labelled) must lie in (0, 1]; got {fraction}")
    budget = {"k": int(k), "fraction": float(fraction)}
    record = draw_record({"observed_budgets": {"0": budget}}, 0)
    return (record, "observed_budgets" if record["kind"] == "budget" else None, budget,
            lambda pool, test, seed: draw_observed(record, pool, test, seed))


def _bias_plan(store: Store, bias: str, weights_by_class: Sequence[float] | None) -> tuple:
    """:func:`_budget_plan` for a ``bias`` draw: ``semantic`` needs ``weights_by_class``,
    ``size`` and ``location`` the store's boxes."""
    if bias not in BIASES:
        raise StoreError(f"--bias must be one of {', '.join(BIASES)}; got {bias!r}")
    if bias == "semantic":
        if weights_by_class is None:
            raise StoreError("--bias semantic needs --class-weights FILE (one weight per class)")
        w = class_weights(weights_by_class, store.n_classes)
        record, weights = {"bias": bias, "class_weights": w.tolist()}, None
    else:
        if weights_by_class is not None:
            raise StoreError(f"--class-weights is for --bias semantic, not {bias}")
        if store.shape(f"{GROUP}/{bias}") is None:
            raise StoreError(
                f"--bias {bias} needs the dataset's object boxes, and {store.path} (dataset "
                f"{store.dataset!r}) holds none: only stores featurized from COCO's instance "
                "annotations have them (spml featurize coco); --bias semantic works on any store"
            )
        record, weights = {"bias": bias}, store.read(f"{GROUP}/{bias}")
    return ({"kind": "bias", **record}, "observed_bias", record,
            lambda pool, test, seed: draw_observed({"kind": "bias", **record}, pool, test, seed,
                                                   weights))


def draw_observed(record: dict[str, Any], labels_pool: np.ndarray, labels_test: np.ndarray,
                  seed: int, box_weights: np.ndarray | None = None) -> np.ndarray:
    """The observed labels of draw ``seed`` as its ``record`` (probe.store.records.draw_record)
    says, each phase re-seeded: what adding a draw writes and what repairing a damaged one
    writes again. ``box_weights``: a ``size`` / ``location`` bias's ``(N, C)`` weights (the
    store's ``bias/<kind>``); a ``semantic`` bias's class weights are in its record."""
    if record["kind"] != "bias":
        budget = None if record["kind"] == "protocol" else {"k": record["k"],
                                                            "fraction": record["fraction"]}
        return phase_observed(labels_pool, labels_test, seed, budget)
    n_pool = len(labels_pool)
    if record["bias"] == "semantic":
        shape = (n_pool + len(labels_test), labels_pool.shape[1])
        box_weights = np.broadcast_to(np.asarray(record["class_weights"], np.float64), shape)
    if box_weights is None:
        raise StoreError(f"draw {seed}: a '{record['bias']}' label bias needs the store's box "
                         f"weights ({GROUP}/{record['bias']})")
    return np.concatenate([biased_positive(labels_pool, box_weights[:n_pool], seed),
                           biased_positive(labels_test, box_weights[n_pool:], seed)])


def _add_draws(store: Store, seeds: Sequence[int], record: dict[str, Any], attr: str | None,
               value: Any, draw: Callable[[np.ndarray, np.ndarray, int], np.ndarray]
               ) -> list[int]:
    """Every seed checked (one holding a draw of another kind refuses the call by name:
    :func:`probe.store.records.check_draw`; one holding this draw is left alone), then
    ``draw(pool labels, test labels, seed)`` for each other one, then all written at once
    (:func:`probe.store.records.write_draws`: checked again under the store's lock, where a
    seed another process took meanwhile with a draw of another kind refuses the whole call
    and nothing is written). Returns the seeds written."""
    seeds = [int(s) for s in seeds if not check_draw(store.attrs, int(s), record, store.path)]
    if not seeds:
        return []
    labels = store.labels()
    n_pool = int(store.attrs["n_pool"])
    arrays = [(int(seed), record, draw(labels[:n_pool], labels[n_pool:], int(seed)), attr, value)
              for seed in seeds]
    return write_draws(store, arrays)


def add_observed_seed(path: str | Path, seed: int, *, k: int = 1, fraction: float = 1.0) -> None:
    """Add the draw ``observed/<seed>`` to a complete store, each phase re-seeded with ``seed``
    (docs/protocol.md step 2); every command with ``--observed-seed`` can then train on it.

    ``k`` / ``fraction``: a label budget (:func:`probe.store.protocol.budget_positive`; k = 1 on
    every image is the protocol's draw), recorded in ``observed_budgets``. A seed that holds
    this draw is left alone, one that holds another is refused by name.
    """
    plan = _budget_plan(k, fraction)  # checked before the store is opened
    _add_draws(open_store(path), [int(seed)], *plan)


def add_biased_draw(path: str | Path, seed: int, bias: str,
                    weights_by_class: Sequence[float] | None = None) -> dict[str, Any]:
    """Add ``observed/<seed>``: single positives drawn with ``bias`` (:mod:`probe.store.bias`),
    each phase re-seeded. ``weights_by_class``: the ``semantic`` bias's C weights. A seed
    already holding the same draw is left alone, one holding a draw of another kind is refused
    by name. Returns the draw's record."""
    store = open_store(path)
    plan = _bias_plan(store, bias, weights_by_class)
    _add_draws(store, [int(seed)], *plan)
    return plan[2]
