"""``spml analyze label-budget``: how each loss degrades as labels get scarcer
(docs/protocol.md "Label budgets"): per budget -- ``k`` observed positives per image on a
``fraction`` of the images, drawn in memory from the store's full labels
(:func:`probe.store.protocol.budget_positive`) -- each loss's test mAP at the best val epoch with
a 95% paired-bootstrap interval over the test images; nothing is written to the store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.errors import SpmlError
from probe.store.protocol import PROTOCOL_SEED

__all__ = ["BudgetConfig", "budget_data", "format_budget", "label_budget", "plot_budget"]


@dataclass(frozen=True)
class BudgetConfig:
    losses: tuple[str, ...] = ("an", "gr")  # the baseline and the loss under study
    ks: tuple[int, ...] = (1, 2, 3)  # positives per image; 1 is the protocol
    fractions: tuple[float, ...] = (1.0, 0.5, 0.25)  # of images labelled; 1 is the protocol
    seed: int = PROTOCOL_SEED  # the draw seed: 1200 makes (1, 1.0) the literature's draw
    epochs: int | None = None  # None: the loss's paper setting for the dataset
    batch_size: int | None = None  # None: as epochs
    lr: float | None = None  # None: as epochs
    train_seed: int = 0  # init and batch order, the same for every budget (paired)
    n_resamples: int = 1000  # bootstrap resamples of the test images per interval
    device: str = "auto"

    def validate(self) -> None:
        if not self.losses or not self.ks or not self.fractions:
            raise SpmlError("--losses, --k and --fractions must each name at least one value")
        if bad_k := [k for k in self.ks if k < 1]:
            raise SpmlError(f"--k: positives per image must be >= 1; got {bad_k}")
        if bad_f := [f for f in self.fractions if not 0.0 < f <= 1.0]:
            raise SpmlError(f"--fractions: fractions of images labelled must lie in (0, 1]; "
                             f"got {bad_f}")


def budget_data(data: Any, store: Any, *, k: int, fraction: float, seed: int) -> Any:
    """``data`` (loaded from ``store``) with train/val observed labels drawn under the budget
    from the pool's full labels, like the store's own draws (one walk over the pool)."""
    import torch

    from probe.store.protocol import budget_positive

    n_pool = int(store.attrs["n_pool"])
    pool = budget_positive(store.labels()[:n_pool], seed, k=k, fraction=fraction)
    obs = {name: torch.from_numpy(pool[store.split(name)]).to(data.device)
           for name in ("train", "val")}
    return dataclasses.replace(data, train_observed=obs["train"], val_observed=obs["val"],
                               source={**data.source, "label_budget": {
                                   "k": k, "fraction": fraction, "seed": seed}})


def label_budget(store_path: str, config: BudgetConfig | None = None, *,
                 log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per (loss, k, fraction): val and test mAP at the best val epoch, the test
    interval, the best epoch and how many positives the train split observed."""
    from probe.engine.config import ProbeConfig
    from probe.engine.data import ProbeData
    from probe.evaluation.intervals import attach_test_intervals
    from probe.evaluation.selection import train_replicates
    from probe.store import open_store

    cfg = config or BudgetConfig()
    cfg.validate()
    log = log or (lambda m: None)
    store = open_store(store_path)
    base = ProbeData.from_store(store, device=cfg.device, observed_seed=PROTOCOL_SEED)
    budgets = [(fraction, k) for fraction in cfg.fractions for k in cfg.ks]
    data = [budget_data(base, store, k=k, fraction=fraction, seed=cfg.seed)
            for fraction, k in budgets]  # the budgets' draws; the features are base's
    pc = ProbeConfig(epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                     seed=cfg.train_seed, device=cfg.device)
    # every budget of a loss in one stacked run (each trial on its budget's draw)
    results = {loss: train_replicates(data, pc, loss, [{}]) for loss in cfg.losses}
    rows = []
    for (fraction, k), budget, j in zip(budgets, data, range(len(budgets))):
        n_obs = int((budget.train_observed == 1).sum())
        for loss in cfg.losses:
            result = results[loss][j]
            attach_test_intervals(result, budget, n_resamples=cfg.n_resamples)
            b = result.trials[0].best
            rows.append({"loss": loss, "k": k, "fraction": fraction, "train_positives": n_obs,
                         **{key: b.get(key) for key in ("val_map", "test_map",
                                                        "test_map_low", "test_map_high")},
                         "best_epoch": result.trials[0].best_epoch})
            log(f"{loss:<8} k={k} fraction={fraction:g}: test mAP "
                f"{b.get('test_map', float('nan')):.2f} ({n_obs} observed train positives)")
    return rows


def format_budget(rows: list[dict[str, Any]]) -> str:
    """Test mAP [95% interval] per loss (rows) and budget (columns)."""
    budgets = list(dict.fromkeys((r["k"], r["fraction"]) for r in rows))
    losses = list(dict.fromkeys(r["loss"] for r in rows))
    by = {(r["loss"], r["k"], r["fraction"]): r for r in rows}
    heads = [f"k={k}, {100 * f:g}% imgs" for k, f in budgets]
    width = max(len(h) for h in [*heads, "00.00 [00.00, 00.00]"])
    lines = ["Test mAP [95% interval over test images] by label budget: k observed positives "
             "per image on a fraction of the images (k=1, 100% is the protocol).",
             f"{'loss':<8}  " + "  ".join(h.rjust(width) for h in heads)]
    for loss in losses:
        out = []
        for b in budgets:
            r = by.get((loss, *b))
            if r is None:
                out.append("-")
            else:
                out.append(f"{r['test_map']:.2f} [{r['test_map_low']:.2f}, "
                           f"{r['test_map_high']:.2f}]")
        lines.append(f"{loss:<8}  " + "  ".join(c.rjust(width) for c in out))
    return "\n".join(lines)


def plot_budget(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Test mAP against positives per image, one panel per fraction labelled, a line per loss
    with its 95% interval as error bars."""
    import matplotlib as mpl
    import numpy as np

    from studies.plots import DPI, STYLE, new_figure, save_figure

    fractions = list(dict.fromkeys(r["fraction"] for r in rows))
    losses = list(dict.fromkeys(r["loss"] for r in rows))
    with mpl.rc_context(STYLE):
        fig = new_figure(3.6 * len(fractions) + 1, 3.8)
        axes = np.atleast_1d(fig.subplots(1, len(fractions), sharey=True))
        for ax, f in zip(axes, fractions):
            for loss in losses:
                pts = sorted((r for r in rows if r["loss"] == loss and r["fraction"] == f),
                             key=lambda r: r["k"])
                x, y, lo, hi = (np.array([r[key] for r in pts], dtype=float)
                                for key in ("k", "test_map", "test_map_low", "test_map_high"))
                ax.errorbar(x, y, yerr=[y - lo, hi - y], marker="o", capsize=3, label=loss)
            ax.set(title=f"{100 * f:g}% of images labelled", xticks=sorted({r["k"] for r in rows}),
                   xlabel="observed positives per image (k)")
        axes[0].set_ylabel("test mAP (%), 95% interval")
        axes[-1].legend()
        fig.suptitle("How each loss degrades as labels get scarcer")
        return save_figure(fig, path, DPI)
