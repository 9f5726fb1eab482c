"""Device-resident probe data: the three splits of a feature store, moved to the device once.

docs/design.md "Probe training keeps everything on the device": features of train/val/test (and the
flipped train features) and their labels are copied to the device when a :class:`ProbeData` is
built; the trainer then forms every mini-batch by an index gather, never through a DataLoader.

Layout (the trainer relies on it):

* Features keep the store's dtype (float16 by default) and gain one trailing column of ones, the
  bias input, so that a linear head is a single ``(T, D+1, C)`` tensor (rows ``0..D-1`` =
  ``nn.Linear.weight.T``, row ``D`` = ``nn.Linear.bias``); gathered rows are converted to float32
  (exact) before the matrix product.
* With flips, ``train_x`` holds ``2 N_train`` rows: the unflipped features, then the flipped
  ones; "flip sample i" is "read row ``i + N_train``" (docs/protocol.md step 6: for a frozen
  backbone a random horizontal flip is exactly picking the flipped or the unflipped feature vector).
* Labels: ``*_labels`` are the full ground truth (uint8 0/1); ``train_observed`` /
  ``val_observed`` are the single-positive draw (int8 1 = observed positive, 0 = unknown).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from probe.devices import resolve_device
from probe.errors import DataError
from probe.store.protocol import PROTOCOL_SEED, single_positive

__all__ = ["DataError", "ProbeData", "fold_mismatch", "join_fold_blocks", "load_store",
           "positions_by_fold", "same_tensor", "stack_folds", "train_targets"]


def _with_bias_column(x: np.ndarray | Tensor, dtype: torch.dtype | None) -> Tensor:
    """(N, D) features → (N, D+1) tensor with a trailing column of ones."""
    t = torch.as_tensor(np.asarray(x)) if not isinstance(x, Tensor) else x
    if dtype is not None:
        t = t.to(dtype)
    if not t.is_floating_point():
        raise DataError(f"features must be floating point; got dtype {t.dtype}")
    return torch.cat([t, torch.ones(t.shape[0], 1, dtype=t.dtype)], dim=1)


def _store_source(store: Any, rows: dict[str, np.ndarray], observed_seed: int) -> dict[str, Any]:
    """A store-loaded :class:`ProbeData`'s ``source``: the store, its rows and the draw."""
    from probe.store.records import draw_record

    source = {"kind": "store", "path": str(Path(store.path).resolve()),
              "dataset": store.dataset, "observed_seed": int(observed_seed),
              "rows": {name: len(r) for name, r in rows.items()},
              "store_dtype": store.dtype, "completed": store.attrs.get("completed"),
              "provenance": store.provenance,  # and the draw: protocol, label budget or bias
              "draw": draw_record(store.attrs, observed_seed),
              "identity": store.identity()}  # the one "same store" rule
    budget = store.observed_budget(observed_seed)
    if budget != {"k": 1, "fraction": 1.0}:  # a label-budget draw (spml draw --k/--fraction)
        source["label_budget"] = budget
    return source


def _store_splits_with_bias(store: Any, rows: dict[str, np.ndarray], dtype: torch.dtype | None,
                            flip: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(train, val, test) features as (N, D+1) tensors with a trailing column of ones; with
    ``flip`` the train tensor holds the train rows, then their flipped features. In the store's
    dtype the chunks are read straight into the tensors, each chunk once (probe.store.chunks);
    another dtype converts."""
    stored = getattr(torch, store.dtype)
    if dtype is not None and dtype != stored:
        flips = (False, True) if flip else (False,)
        train = [store.features(rows["train"], flip=f) for f in flips]
        train_x = _with_bias_column(np.concatenate(train), dtype)
        return (train_x, _with_bias_column(store.features(rows["val"]), dtype),
                _with_bias_column(store.features(rows["test"]), dtype))
    d = store.feature_dim
    n = {name: len(r) for name, r in rows.items()}
    xs = {name: torch.empty((2 * n[name] if flip and name == "train" else n[name], d + 1),
                            dtype=stored) for name in rows}
    for x in xs.values():
        x[:, d] = 1
    views = {name: x.numpy() for name, x in xs.items()}
    store.features_into([(rows[name], views[name][: n[name], :d]) for name in rows])
    if flip:
        store.features_into([(rows["train"], views["train"][n["train"] :, :d])], flip=True)
    return xs["train"], xs["val"], xs["test"]


@dataclass
class ProbeData:
    """The train/val/test splits of one dataset on one device (module docstring).

    Build it with :meth:`from_store` or :meth:`from_arrays`; ``source`` records where the data
    came from (store path, provenance, observed-label seed) for the results file.
    """

    train_x: Tensor  # (N_train or 2 N_train with flips, D+1), storage dtype
    train_labels: Tensor  # (N_train, C) uint8 full ground truth
    train_observed: Tensor  # (N_train, C) int8 single positives
    val_x: Tensor  # (N_val, D+1)
    val_labels: Tensor  # (N_val, C) uint8
    val_observed: Tensor  # (N_val, C) int8
    test_x: Tensor  # (N_test, D+1)
    test_labels: Tensor  # (N_test, C) uint8
    n_train: int
    has_flip: bool
    class_names: list[str]
    dataset: str = "arrays"
    source: dict[str, Any] = field(default_factory=dict)
    train_prior: Any = None  # the train rows' prior (probe.store.priors.Prior, docs/priors.md)

    @property
    def device(self) -> torch.device:
        return self.train_x.device

    @property
    def feature_dim(self) -> int:
        """D, the feature dimension (without the bias column)."""
        return self.train_x.shape[1] - 1

    @property
    def n_classes(self) -> int:
        return self.train_labels.shape[1]

    def nbytes(self) -> int:
        """Bytes held on the device by this data."""
        return sum(t.numel() * t.element_size() for t in vars(self).values()
                   if isinstance(t, Tensor))

    def val_label_cardinality(self) -> float:
        """Mean number of positives per val image (full labels): the dataset-dependent k of
        EPR / ROLE for datasets without a published value (docs/losses.md)."""
        return float(self.val_labels.float().sum(1).mean())

    @classmethod
    def from_arrays(cls, train: tuple[Any, Any], val: tuple[Any, Any], test: tuple[Any, Any], *,
                    train_flip: Any | None = None, train_observed: Any | None = None,
                    val_observed: Any | None = None, class_names: list[str] | None = None,
                    dataset: str = "arrays", device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None, source: dict[str, Any] | None = None,
                    observed_seed: int = PROTOCOL_SEED) -> ProbeData:
        """Probe data from in-memory ``(features (N, D), labels (N, C) 0/1)`` pairs per split.

        ``train_flip``: flipped train features (same shape) or None. ``train_observed`` /
        ``val_observed``: single-positive labels (int 1/0/-1); when None they are drawn with the
        protocol's generator (:func:`probe.store.protocol.single_positive`, seed
        ``observed_seed``) over each split separately. ``dtype``: storage dtype on the device
        (default: the arrays' own).
        """
        dev = resolve_device(device)
        parts = {"train": train, "val": val, "test": test}
        xs, ys = {}, {}
        for name, pair in parts.items():
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise DataError(f"{name} must be a (features, labels) pair")
            x = np.asarray(pair[0]) if not isinstance(pair[0], Tensor) else pair[0]
            y = np.asarray(pair[1]) if not isinstance(pair[1], Tensor) else pair[1].cpu().numpy()
            if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
                raise DataError(
                    f"{name}: features must be (N, D) and labels (N, C) with the same N; got "
                    f"features {tuple(x.shape)} and labels {tuple(y.shape)}")
            if x.shape[0] == 0:
                raise DataError(f"{name} split is empty: every split needs at least one row")
            if not np.isin(y, (0, 1)).all():
                raise DataError(f"{name} labels must be 0/1 full ground truth")
            xs[name], ys[name] = x, y.astype(np.uint8)
        dims = {n: x.shape[1] for n, x in xs.items()}
        classes = {n: y.shape[1] for n, y in ys.items()}
        if len(set(dims.values())) != 1 or len(set(classes.values())) != 1:
            raise DataError(f"splits disagree: feature dims {dims}, class counts {classes}")
        if train_flip is not None and tuple(np.shape(train_flip)) != tuple(xs["train"].shape):
            raise DataError(
                f"train_flip must have the train features' shape {tuple(xs['train'].shape)}; "
                f"got {tuple(np.shape(train_flip))}")
        obs = {}
        for name, given in (("train", train_observed), ("val", val_observed)):
            if given is None:
                obs[name] = single_positive(ys[name], observed_seed)
            else:
                o = np.asarray(given if not isinstance(given, Tensor) else given.cpu().numpy())
                if o.shape != ys[name].shape or not np.isin(o, (-1, 0, 1)).all():
                    raise DataError(
                        f"{name}_observed must be (N, C) = {ys[name].shape} with values -1/0/1; "
                        f"got shape {o.shape}")
                obs[name] = o.astype(np.int8)
        train_feats = _with_bias_column(xs["train"], dtype)
        if train_flip is not None:
            train_feats = torch.cat([train_feats, _with_bias_column(train_flip, train_feats.dtype)])
        return cls._on(
            dev, (train_feats, _with_bias_column(xs["val"], train_feats.dtype),
                  _with_bias_column(xs["test"], train_feats.dtype)),
            ys, obs, n_train=int(xs["train"].shape[0]), has_flip=train_flip is not None,
            class_names=list(class_names) if class_names
            else [f"class_{i}" for i in range(classes["train"])], dataset=dataset,
            source=dict(source or {"kind": "arrays", "observed_seed": observed_seed}))

    @classmethod
    def _on(cls, dev: torch.device, xs: tuple[Tensor, Tensor, Tensor],
            labels: dict[str, np.ndarray], observed: dict[str, np.ndarray],
            **fields: Any) -> ProbeData:
        """The splits' features (train, val, test), full labels and draws moved to ``dev``."""
        def on(a: np.ndarray) -> Tensor:
            return torch.from_numpy(a).to(dev)

        return cls(train_x=xs[0].to(dev), train_labels=on(labels["train"]),
                   train_observed=on(observed["train"]), val_x=xs[1].to(dev),
                   val_labels=on(labels["val"]), val_observed=on(observed["val"]),
                   test_x=xs[2].to(dev), test_labels=on(labels["test"]), **fields)

    @classmethod
    def from_store(cls, store: Any, *, device: str | torch.device = "cpu",
                   observed_seed: int = PROTOCOL_SEED, flip: bool = True,
                   dtype: torch.dtype | None = None, rows: dict[str, np.ndarray] | None = None,
                   observed: np.ndarray | None = None, replicate: dict[str, Any] | None = None,
                   priors: str | None = None) -> ProbeData:
        """Load a feature store (a path or an open :class:`probe.store.Store`).

        ``flip``: also load the flipped train features when the store has them. ``dtype``:
        storage dtype on the device (default: the store's). ``priors``: also read the store's
        prior of that name at the train rows (``train_prior``; docs/priors.md). For
        :mod:`probe.evaluation.selection`'s replicates: ``rows`` replaces the store's ``train`` /
        ``val`` rows, ``observed`` the draw (``(n_rows, C)`` int8), and ``replicate`` goes to
        ``source``.
        """
        from probe.store import open_store  # zarr loads only when a store is read

        dev = resolve_device(device)
        if isinstance(store, str | Path):
            store = open_store(store)
        rows = {**{name: store.split(name) for name in ("train", "val", "test")}, **(rows or {})}
        empty = [name for name, r in rows.items() if len(r) == 0]
        if empty:
            raise DataError(
                f"store {store.path} has no {' / '.join(empty)} rows: the probe needs a train "
                "split to fit, a val split to choose the epoch and a test split to report "
                "(docs/protocol.md steps 3-5); re-create the store with a pool and a test phase")
        labels = store.labels()
        if observed is None:
            observed = store.observed(observed_seed)
        with_flip = bool(flip and store.has_flip)
        source = _store_source(store, rows, observed_seed)
        if replicate is not None:
            source["replicate"] = dict(replicate)
        prior = None
        if priors is not None:
            prior = store.prior(priors, rows=rows["train"])
            source["priors"] = {"name": priors, "provenance": prior.provenance,
                                "extras": sorted(prior.extras)}  # the arrays a loss may read
        return cls._on(
            dev, _store_splits_with_bias(store, rows, dtype, with_flip),
            {name: labels[r] for name, r in rows.items()},
            {name: observed[rows[name]] for name in ("train", "val")},
            n_train=len(rows["train"]), has_flip=with_flip, class_names=list(store.class_names),
            dataset=store.dataset, source=source, train_prior=prior)

    def with_draw(self, store: Any, observed_seed: int, *, observed: np.ndarray | None = None,
                  replicate: dict[str, Any] | None = None) -> ProbeData:
        """This store-loaded data on another draw: the same features and labels (shared, not
        copied), the train and val observed labels and the source of draw ``observed_seed``
        -- what ``from_store(store, observed_seed=..., observed=..., replicate=...)`` loads,
        without reading the features again (a table's column and a ``draws:N`` selection hold
        their draws together). ``observed``: the draw for every store row, where the store
        does not hold it; ``replicate``: as from_store's."""
        from probe.store import open_store

        held = self.source.get("replicate")
        own_rows = held is None or str(held.get("select", "")).startswith("draws")
        if self.source.get("kind") != "store" or not own_rows:
            raise DataError("with_draw: the data must be a whole store's splits "
                            "(ProbeData.from_store without rows; a draws:N replicate holds them)")
        if isinstance(store, str | Path):
            store = open_store(store)
        rows = {name: store.split(name) for name in ("train", "val", "test")}
        if observed is None:
            observed = store.observed(observed_seed)
        dev = self.train_observed.device
        source = _store_source(store, rows, observed_seed)
        if replicate is not None:
            source["replicate"] = dict(replicate)
        for key in ("priors",):  # what the loaded data carries beside the draw
            if key in self.source:
                source[key] = self.source[key]
        return replace(self, source=source,
                       train_observed=torch.from_numpy(observed[rows["train"]]).to(dev),
                       val_observed=torch.from_numpy(observed[rows["val"]]).to(dev))


def load_store(store: Any, *, device: str | torch.device = "auto",
               observed_seed: int = PROTOCOL_SEED, flip: bool = True,
               dtype: torch.dtype | None = None, priors: str | None = None) -> ProbeData:
    """A feature store's train/val/test splits on ``device`` (``"auto"``: the GPU when there
    is one), ready for :func:`probe.train_probe`: :meth:`ProbeData.from_store` with the
    device chosen for you. ``observed_seed`` picks the single-positive draw (the literature's
    by default); ``flip`` also loads the flipped train features when the store has them;
    ``priors`` the train rows' prior of that name (docs/priors.md)."""
    return ProbeData.from_store(store, device=device, observed_seed=observed_seed, flip=flip,
                                dtype=dtype, priors=priors)


def same_tensor(a: Tensor, b: Tensor) -> bool:
    """Equal shape and values; one tensor shared by both is equal without reading it (a
    COCO-sized feature matrix is hundreds of MB)."""
    if a is b:
        return True
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def train_targets(data: ProbeData, labels: str = "observed") -> Tensor:
    """The train rows' targets (N_train, C) int8: the single positives (``labels`` "observed"),
    or the full labels as {1, -1} ("full": the oracle)."""
    if labels == "full":
        return torch.where(data.train_labels == 1, 1, -1).to(torch.int8)
    return data.train_observed


def fold_mismatch(folds: Sequence[ProbeData]) -> str | None:
    """Why these replicates cannot train as one stacked run, each trial on its own fold (None:
    they can). Folds are replicates with their own train and val rows (``--select cv:K``);
    they must agree on the train size and feature layout, the classes, the device and the test
    set, and carry no train prior (its rows would differ by fold); their val rows may differ."""
    if not folds:
        return "no folds were given"
    first = folds[0]
    for j, fold in enumerate(folds[1:], start=1):
        if fold.n_train != first.n_train:
            return f"fold {j} has {fold.n_train} train rows, fold 0 has {first.n_train}"
        if (fold.train_x.shape != first.train_x.shape or fold.train_x.dtype != first.train_x.dtype
                or fold.has_flip != first.has_flip or fold.device != first.device):
            return (f"fold {j}'s train features are {tuple(fold.train_x.shape)} "
                    f"{fold.train_x.dtype} on {fold.device}, fold 0's "
                    f"{tuple(first.train_x.shape)} {first.train_x.dtype} on {first.device}")
        if list(fold.class_names) != list(first.class_names):
            return f"fold {j} has other classes than fold 0"
        if not (same_tensor(fold.test_x, first.test_x)
                and same_tensor(fold.test_labels, first.test_labels)):
            return f"fold {j} has another test set than fold 0"
    if any(fold.train_prior is not None for fold in folds):
        return "the folds carry a train prior, which differs by fold"
    return None


def positions_by_fold(fold_of: Sequence[int]) -> dict[int, list[int]]:
    """``{fold: [positions]}``: the positions of ``fold_of`` (the fold of each trial in a
    stacked run, or any key naming it) grouped by fold, folds in order of first appearance --
    the one grouping by which each trial is trained, validated and scored on its own fold."""
    groups: dict[int, list[int]] = {}
    for position, fold in enumerate(fold_of):
        groups.setdefault(int(fold), []).append(position)
    return groups


def stack_folds(folds: Sequence[ProbeData]) -> ProbeData:
    """K folds as the one :class:`ProbeData` a stacked run trains on: ``train_x`` holds every
    fold's train block (its rows, then their flipped features) one after another, so fold k's
    block starts at row ``k * R`` (R = one fold's ``train_x`` rows); everything else is fold
    0's (the trainer reads each fold's targets and the evaluator each fold's val rows from the
    folds themselves). Raises :class:`DataError` naming the mismatch (:func:`fold_mismatch`)."""
    why = fold_mismatch(folds)
    if why is not None:
        raise DataError(f"folds: {why}; folds trained as one run need the same train size, "
                        "classes, device and test set (train them one run each instead)")
    return join_fold_blocks(folds)


def join_fold_blocks(folds: Sequence[ProbeData]) -> ProbeData:
    """:func:`stack_folds` without its check, for a caller that has asked :func:`fold_mismatch`
    already (``train_probe``, which names its own argument in the error)."""
    if len(folds) == 1:
        return folds[0]
    blocks = _consecutive_blocks([fold.train_x for fold in folds])
    if blocks is None:
        blocks = torch.cat([fold.train_x for fold in folds])
    return replace(folds[0], train_x=blocks)


def _consecutive_blocks(xs: list[Tensor]) -> Tensor | None:
    """``torch.cat(xs)`` without a copy where the ``xs`` already are consecutive blocks of one
    contiguous tensor (how :func:`probe.evaluation.selection.selection_data` loads ``cv:K``
    folds); None otherwise."""
    first = xs[0]
    storage = first.untyped_storage()
    for k, x in enumerate(xs):
        if not x.is_contiguous() or x.untyped_storage().data_ptr() != storage.data_ptr():
            return None
        if x.storage_offset() != first.storage_offset() + k * first.numel():
            return None
    rows = len(xs) * first.shape[0]
    return first.as_strided((rows, first.shape[1]), first.stride())
