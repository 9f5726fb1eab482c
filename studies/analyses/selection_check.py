"""``spml analyze selection``: does a study's winner hold up on test, per ``--select`` mode?

Per selection mode (``val``, ``cv:K``, ``draws:N``; :mod:`probe.evaluation.selection`) and study
seed, one study searches the loss's hyperparameters; its winner and the loss's paper values are
trained on the protocol's split with ``eval_seeds`` seeds and tested, and the row records both test
mAPs and their difference (docs/selection.md holds the table for yeast and what it recommends). The
studies live in ``OUT/studies/<mode>-seed<s>/``: re-running the same command resumes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.errors import SpmlError
from probe.evaluation.intervals import mean_std

__all__ = ["SelectionCheck", "check_selection", "format_selection", "plot_selection",
           "summarize_selection"]


@dataclass(frozen=True)
class SelectionCheck:
    loss: str = "gr"  # the loss whose search is checked
    modes: tuple[str, ...] = ("val", "cv:5", "draws:5")  # the protocol, then the two averages
    study_seeds: tuple[int, ...] = (0, 1, 2, 3, 4)  # one study per mode and seed
    trials: int = 24  # finished trials per study
    batch: int = 8  # trials trained stacked
    eval_seeds: tuple[int, ...] = (0, 1, 2)  # training seeds of the winner / paper test runs
    epochs: int | None = None  # None: the loss's paper setting for the dataset
    batch_size: int | None = None  # None: as epochs
    lr: float | None = None  # None: as epochs
    sampler: str = "tpe"  # as spml study
    device: str = "auto"
    out: str = "spml-analysis/selection"  # studies under OUT/studies

    def validate(self) -> None:
        from probe.evaluation.selection import Selection

        for mode in self.modes:
            Selection.parse(mode)
        if not self.modes or not self.study_seeds or not self.eval_seeds:
            raise SpmlError("--modes, --study-seeds and --eval-seeds must each name a value")
        if self.trials < 2 or self.batch < 1:
            raise SpmlError(f"--trials must be >= 2 and --trials-at-once >= 1; got "
                             f"{self.trials}, {self.batch}")


def _test_maps(data: Any, cfg: SelectionCheck, params: list[dict[str, Any]]) -> list[float]:
    """Mean test mAP over ``eval_seeds`` of each parameter set, trained stacked on ``data``."""
    from probe.engine.config import ProbeConfig
    from probe.engine.train import train_probe

    n = len(cfg.eval_seeds)
    hparams = [p for p in params for _ in range(n)]
    pc = ProbeConfig(epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                     seeds=tuple(cfg.eval_seeds) * len(params), device=cfg.device)
    result = train_probe(data, pc, cfg.loss, hparams, progress=False)
    tests = [t.best.get("test_map", math.nan) for t in result.trials]
    return [float(sum(tests[i * n:(i + 1) * n]) / n) for i in range(len(params))]


def check_selection(store_path: str, config: SelectionCheck | None = None, *,
                    log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per (mode, study seed): the winner's selection score, its parameters, and the
    winner's and the paper values' mean test mAP on the protocol's split."""
    from probe.engine.data import ProbeData
    from probe.store import open_store
    from studies.study.run import run_study
    from studies.study.settings import StudySettings
    from studies.study.space import build_space

    cfg = config or SelectionCheck()
    cfg.validate()
    log = log or (lambda m: None)
    store = open_store(store_path)
    data = ProbeData.from_store(store, device=cfg.device)
    space = build_space(cfg.loss, store.dataset)
    paper = space.split(space.defaults)[0]
    (paper_test,) = _test_maps(data, cfg, [paper])
    log(f"paper values {paper}: test mAP {paper_test:.2f} (mean of {len(cfg.eval_seeds)} seeds)")
    rows = []
    for mode in cfg.modes:
        for seed in cfg.study_seeds:
            where = Path(cfg.out) / "studies" / f"{mode.replace(':', '')}-seed{seed}"
            settings = StudySettings(store=store_path, loss=cfg.loss, n_trials=cfg.trials,
                                     batch=cfg.batch, sampler=cfg.sampler, seed=seed,
                                     train_seed=seed, select=mode, out=str(where),
                                     epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                                     device=cfg.device)
            summary = run_study(settings)
            won = space.split(summary.best_params)[0]
            (test,) = _test_maps(data, cfg, [won])
            rows.append({"mode": mode, "study_seed": seed, "trials": cfg.trials,
                         "winner_trial": summary.best_trial, "winner_score": summary.best_value,
                         "winner_params": won, "winner_test_map": test,
                         "paper_test_map": paper_test, "difference": test - paper_test,
                         "winner_is_paper": summary.best_trial == 0})
            log(f"{mode:<8} seed {seed}: winner trial {summary.best_trial} (score "
                f"{summary.best_value:.2f}): test mAP {test:.2f}, paper {paper_test:.2f}, "
                f"difference {test - paper_test:+.2f}")
    return rows


def summarize_selection(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode: the mean difference (winner − paper test mAP) over study seeds, its standard
    deviation, the worst seed, and how often the winner was at least as good as the paper."""
    out = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        d = [r["difference"] for r in rows if r["mode"] == mode]
        out.append({"mode": mode, "n": len(d), "mean_difference": sum(d) / len(d),
                    "sd": mean_std(d)[1],
                    "worst": min(d), "not_worse": sum(x >= 0 for x in d),
                    "mean_winner_test_map": sum(r["winner_test_map"] for r in rows
                                                if r["mode"] == mode) / len(d)})
    return out


def format_selection(rows: list[dict[str, Any]]) -> str:
    """A Markdown table: one line per mode, then one per study."""
    paper = rows[0]["paper_test_map"] if rows else math.nan
    lines = [f"Winner's test mAP minus the paper values' ({paper:.2f}), per selection mode "
             "(mean over study seeds):", "",
             "| --select | studies | winner test mAP | difference, mean ± sd | worst | "
             "winner ≥ paper |", "|---|---|---|---|---|---|"]
    for s in summarize_selection(rows):
        lines.append(f"| {s['mode']} | {s['n']} | {s['mean_winner_test_map']:.2f} | "
                     f"{s['mean_difference']:+.2f} ± {s['sd']:.2f} | {s['worst']:+.2f} | "
                     f"{s['not_worse']} of {s['n']} |")
    lines += ["", "| --select | study seed | winner trial | its score | winner test mAP | "
              "difference |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['study_seed']} | {r['winner_trial']} | "
                     f"{r['winner_score']:.2f} | {r['winner_test_map']:.2f} | "
                     f"{r['difference']:+.2f} |")
    return "\n".join(lines)


def plot_selection(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """The winner − paper test mAP of every study, a column of points per mode, with the mean."""
    import matplotlib as mpl

    from studies.plots import DPI, STYLE, new_figure, save_figure

    modes = list(dict.fromkeys(r["mode"] for r in rows))
    with mpl.rc_context(STYLE):
        fig = new_figure(1.6 * len(modes) + 2.4, 3.8)
        ax = fig.subplots()
        ax.axhline(0.0, color="0.5", lw=1, ls="--", label="paper values")
        for i, mode in enumerate(modes):
            d = [r["difference"] for r in rows if r["mode"] == mode]
            ax.plot([i] * len(d), d, "o", alpha=0.6, color="C0")
            ax.plot([i - 0.2, i + 0.2], [sum(d) / len(d)] * 2, color="C3", lw=2,
                    label="mean" if i == 0 else None)
        ax.set(xticks=range(len(modes)), xticklabels=[f"--select {m}" for m in modes],
               ylabel="winner − paper test mAP (points)")
        ax.legend()
        fig.suptitle("Does the study's winner beat the paper's values on test?")
        return save_figure(fig, path, DPI)
