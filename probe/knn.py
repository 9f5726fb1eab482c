"""The kNN baseline (docs/losses.md "Beyond the papers"): a training-free method, evaluated
like a loss. A query's scores are Σ over its k nearest training images (cosine similarity s_j of
L2-normalised features) of softmax_j(s_j / τ) times their observed label vectors (the full labels
with ``labels="full"``): a convex combination of 0/1 vectors, so every score is a probability.
Search is exact: faiss' ``IndexFlatIP`` when faiss is installed (imported lazily), else the same
inner products in torch on the data's device. Several ``(k, τ)`` pairs share one search.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from probe.engine.config import ProbeConfig, ProbeConfigError
from probe.engine.data import ProbeData
from probe.engine.results import ProbeResult, TrialResult, environment_info
from probe.losses import HParam, check_hparams
from probe.metrics import f1_scores, mean_average_precision

__all__ = ["KNN_HPARAMS", "knn_scores", "nearest_neighbours", "run_knn"]

KNN_HPARAMS = (
    HParam("k", 20, "number of nearest training neighbours", kind="int", low=1),
    HParam("temperature", 0.07, "softmax temperature τ over the neighbours' cosine similarities",
           low=0.0, low_open=True, search=(0.01, 1.0), log=True))
BACKENDS = ("auto", "faiss", "torch")
_SEARCH_BLOCK = 1 << 24  # similarity elements computed at once by the torch backend


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def nearest_neighbours(train: Tensor, query: Tensor, k: int, backend: str = "auto"
                       ) -> tuple[Tensor, Tensor]:
    """Cosine ``(similarities (M, k), indices (M, k))`` of each query row among ``train``
    rows, most similar first. Exact search with faiss (``IndexFlatIP``) or torch."""
    if backend not in BACKENDS:
        raise ProbeConfigError(f"knn backend must be one of {list(BACKENDS)}; got {backend!r}")
    if not 1 <= k <= train.shape[0]:
        raise ProbeConfigError(
            f"knn: k={k} neighbours asked for, but the train split has {train.shape[0]} rows")
    train_n = F.normalize(train.float(), dim=1)
    query_n = F.normalize(query.float(), dim=1)
    faiss = _faiss() if backend in ("auto", "faiss") else None
    if backend == "faiss" and faiss is None:
        raise ProbeConfigError(
            "knn backend 'faiss' asked for, but faiss is not installed: pip install faiss-cpu "
            "(or use backend 'torch' / 'auto', the same exact search in torch)")
    if faiss is not None:
        index = faiss.IndexFlatIP(train_n.shape[1])
        index.add(np.ascontiguousarray(train_n.cpu().numpy(), dtype=np.float32))
        sims, ids = index.search(np.ascontiguousarray(query_n.cpu().numpy(), dtype=np.float32), k)
        return (torch.from_numpy(sims).to(query.device),
                torch.from_numpy(ids).to(torch.int64).to(query.device))
    step = max(1, _SEARCH_BLOCK // max(1, train_n.shape[0]))
    tops = [(query_n[r0 : r0 + step] @ train_n.T).topk(k, dim=1)
            for r0 in range(0, query_n.shape[0], step)]
    return torch.cat([t.values for t in tops]), torch.cat([t.indices for t in tops])


def knn_scores(sims: Tensor, ids: Tensor, train_targets: Tensor, k: int, temperature: float
               ) -> Tensor:
    """Scores (M, C) from a neighbour search (module docstring): the first ``k`` neighbours,
    softmax over ``sims / temperature``, times their 0/1 target vectors."""
    weights = torch.softmax(sims[:, :k].double() / temperature, dim=1)  # (M, k)
    labels = train_targets.double()[ids[:, :k]]  # (M, k, C)
    return torch.einsum("mk,mkc->mc", weights, labels).float()


def run_knn(data: ProbeData, config: ProbeConfig | None = None,
            hparams: dict[str, Any] | Sequence[dict[str, Any]] | None = None, *,
            backend: str = "auto") -> ProbeResult:
    """Evaluate the kNN baseline for one or more ``{k, temperature}`` trials on val and test.

    Train neighbours carry the observed single positives (``config.labels == "full"``: the full
    labels); val is scored against clean or observed labels as ``config.val_labels`` says, test
    against the full labels. The result has the shape of a trained probe's: one "epoch" 0,
    which is the best epoch; no heads.
    """
    t_start = time.perf_counter()
    config = config or ProbeConfig()
    config.validate()
    if hparams is None:
        trials = [{}]
    elif isinstance(hparams, dict):
        trials = [hparams]
    else:  # one dict per trial
        trials = [dict(h) for h in hparams]
    values = [check_hparams(KNN_HPARAMS, t, "knn") for t in trials]
    train = data.train_x[: data.n_train, :-1]  # unflipped train features, no bias column
    targets = (data.train_labels if config.labels == "full" else data.train_observed) == 1
    val_targets = (data.val_labels.bool() if config.val_labels == "clean"
                   else data.val_observed == 1)
    splits = {"val": (data.val_x[:, :-1], val_targets),
              "test": (data.test_x[:, :-1], data.test_labels.bool())}
    k_max = max(v["k"] for v in values)  # one search serves every trial's k
    searches = {name: nearest_neighbours(train, x, k_max, backend)
                for name, (x, _) in splits.items()}
    used = "faiss" if backend != "torch" and _faiss() is not None else "torch"
    results = []
    for t, v in enumerate(values):
        row: dict[str, Any] = {"epoch": 0, "train_loss": None}
        aps = {}
        for name, (_, y) in splits.items():
            sims, ids = searches[name]
            scores = knn_scores(sims, ids, targets, v["k"], v["temperature"])
            m = mean_average_precision(y, probs=scores)
            f = f1_scores(y, probs=scores, threshold=config.f1_threshold)
            row.update({f"{name}_map": float(m.map), f"{name}_OF1": float(f.overall_f1),
                        f"{name}_CF1": float(f.class_f1)})
            aps[name] = (100.0 * m.ap).tolist()  # percent, the scale of mAP
        results.append(TrialResult(
            trial=t, seed=config.seed, hparams=dict(v), lr=math.nan, weight_decay=math.nan,
            epochs=[row], best_epoch=0, best={**{k: x for k, x in row.items() if k != "epoch"},
                                              "val_ap": aps["val"], "test_ap": aps["test"]},
            finite=all(math.isfinite(row[f"{s}_map"]) for s in ("val", "test"))))
    return ProbeResult(
        loss="knn",
        config={"labels": config.labels, "val_labels": config.val_labels,
                "f1_threshold": config.f1_threshold, "backend": used,
                "device": str(data.device)},
        trials=results, class_names=list(data.class_names), dataset=data.dataset,
        source=dict(data.source), environment=environment_info(data.device),
        timing={"total_seconds": time.perf_counter() - t_start}, shared_batch_order=True)
