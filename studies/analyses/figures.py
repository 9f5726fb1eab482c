"""Figures of the GR paper's analyses (:mod:`studies.analyses` computes, this module draws), in
the house style of :mod:`studies.plots` (Agg canvas, one titled PNG per function), and
:func:`write_outputs`, which writes an analysis's JSON, Markdown tables and figures."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np

from probe.engine.results import write_json_atomic
from probe.io import atomic_write_text
from studies.plots import BLUE, DPI, GREY, ORANGE, RED, STYLE, new_figure, save_figure

from .ablation import AblationResult
from .calibration import CalibrationResult
from .common import k_hat_curve, scar_curve
from .curves import CurvesResult
from .distinguish import DistinguishResult
from .sensitivity import SWEEPS, SensitivityResult

__all__ = ["figures", "plot_ablation", "plot_calibration", "plot_curves", "plot_distinguish",
           "plot_histograms", "plot_sensitivity", "write_outputs"]


def figures(result: Any, out: Path, dpi: int = DPI) -> list[Path]:
    """Draw ``result``'s figures into ``out``; returns their paths."""
    draw: dict[type, Callable[[Any], list[Path]]] = {
        AblationResult: lambda r: [plot_ablation(r.rows, out / "ablation.png",
                                                 n_seeds=len(r.settings["seeds"]), dpi=dpi)],
        SensitivityResult: lambda r: [plot_sensitivity(r, out / f"{r.kind}.png", dpi=dpi)],
        DistinguishResult: lambda r: [plot_distinguish(r, out / "distinguish.png", dpi=dpi),
                                      plot_histograms(r, out / "distinguish_hist.png", dpi=dpi)],
        CalibrationResult: lambda r: [plot_calibration(r, out / "calibration.png", dpi=dpi)],
        CurvesResult: lambda r: [plot_curves(r, out / "curves.png", dpi=dpi)],
    }
    for kind, fn in draw.items():
        if isinstance(result, kind):
            return fn(result)
    raise TypeError(f"no figures for {type(result).__name__}")


def write_outputs(result: Any, out: str | os.PathLike, dpi: int = DPI) -> list[Path]:
    """Write ``OUT/<kind>.json``, ``OUT/<kind>.md`` (tables, figures linked) and the PNGs.
    Returns every path written (JSON, Markdown, then the figures)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = figures(result, out, dpi)
    json_path = write_json_atomic(out / f"{result.kind}.json", result.to_dict())
    md_path = out / f"{result.kind}.md"
    atomic_write_text(md_path, result.markdown(paths, base=out) + "\n")
    return [json_path, md_path, *paths]


_TAB = mpl.colormaps["tab10"].colors


def plot_ablation(rows: Sequence[dict[str, Any]], path: str | os.PathLike, *, n_seeds: int = 1,
                  dpi: int = DPI) -> Path:
    """Horizontal bars of val and test mAP per ablation row (error bars: std over seeds for val,
    the 95% interval for test), the AN baseline's test mAP as a dashed line."""
    n = len(rows)
    with mpl.rc_context(STYLE):
        fig = new_figure(9, 1.4 + 0.5 * n)
        ax = fig.add_subplot()
        pos, h = np.arange(n)[::-1].astype(float), 0.38
        for off, key, color, label in ((h / 2, "val", GREY, "val mAP"),
                                       (-h / 2, "test", BLUE, "test mAP")):
            means = np.array([r[f"{key}_mean"] for r in rows], dtype=float)
            # val: std over seeds; test: its 95% interval (analyses.common.trial_scores)
            if key == "test":
                err = _interval_errors(rows, means)
            elif n_seeds > 1:
                err = np.array([r["val_std"] for r in rows], dtype=float)
            else:  # one seed: no spread to show
                err = None
            ax.barh(pos + off, means, height=h, color=color, label=label, xerr=err, capsize=3)
            for y, m in zip(pos + off, means):
                if math.isfinite(m):
                    ax.text(m, y, f" {m:.2f}", va="center", fontsize=8.5)
        base = next((r for r in rows if r["loss"] == "an"), None)
        if base is not None and math.isfinite(base["test_mean"]):
            ax.axvline(base["test_mean"], color=RED, ls="--", lw=1, label="AN test mAP")
        vals = [r[k] for r in rows for k in ("val_mean", "test_mean") if math.isfinite(r[k])]
        lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
        span = max(hi - lo, 1.0)
        ax.set(xlim=(max(0.0, lo - 0.6 * span), hi + 0.35 * span), yticks=pos,
               yticklabels=[f"{r['name']}  [{' '.join(r['marks'])}]" for r in rows],
               xlabel="mAP (%) at the best val epoch" + (
                   f" (mean ± std, {n_seeds} seeds)" if n_seeds > 1 else "")
               + "; test error bars: 95% interval",
               title="GR ablation (Table 3): marks are k̂, v, L (✓ on, × off, ◦ learned)")
        ax.grid(axis="y", visible=False)
        fig.legend(loc="outside lower center", ncols=3, frameon=False)
        return save_figure(fig, path, dpi)


def _interval_errors(rows: Sequence[dict[str, Any]], means: np.ndarray) -> np.ndarray | None:
    """``xerr`` / ``yerr`` (2, n) from the rows' ``test_low`` / ``test_high`` (None if absent)."""
    low = np.array([r.get("test_low", math.nan) for r in rows], dtype=float)
    high = np.array([r.get("test_high", math.nan) for r in rows], dtype=float)
    if not np.isfinite(low).any():
        return None
    return np.nan_to_num(np.stack([means - low, high - means]), nan=0.0)


def plot_sensitivity(result: SensitivityResult, path: str | os.PathLike, *,
                     dpi: int = DPI) -> Path:
    """Fig. 2: val and test mAP against the swept parameter, one line per series value (error
    bars: std over seeds for val, the 95% interval for test), AN as a red dotted line; for
    q2 × q3 two annotated heatmaps."""
    sw = SWEEPS[result.param]
    n = len(result.settings["seeds"])
    with mpl.rc_context(STYLE):
        fig = new_figure(11, 4.4)
        axes = fig.subplots(1, 2, squeeze=False)[0]
        xs, ss = (sorted({p[k] for p in result.points}) for k in ("x", "series"))
        by = {(p["x"], p["series"]): p for p in result.points}
        for ax, split in zip(axes, ("val", "test")):
            if result.param == "q2q3":
                grid = np.array([[by[(x, s)][f"{split}_mean"] for s in ss] for x in xs])
                im = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
                for i in range(len(xs)):
                    for j in range(len(ss)):
                        v = grid[i, j]
                        if math.isfinite(v):
                            ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=8.5,
                                    color="white" if v < np.nanmean(grid) else "black")
                ax.set(xticks=range(len(ss)), xticklabels=[f"{s:g}" for s in ss],
                       yticks=range(len(xs)), yticklabels=[f"{x:g}" for x in xs],
                       xlabel=sw.series_label, ylabel=sw.x_label)
                ax.grid(False)
                fig.colorbar(im, ax=ax, label=f"{split} mAP (%)", shrink=0.9)
            else:
                for k, s in enumerate(ss):
                    pts = [by[(x, s)] for x in xs if (x, s) in by]
                    means = np.array([p[f"{split}_mean"] for p in pts], dtype=float)
                    if split != "val":
                        err = _interval_errors(pts, means)
                    elif n > 1:
                        err = [p[f"{split}_std"] for p in pts]
                    else:  # one seed: no spread to show
                        err = None
                    # series side by side (dodged by ~1% of the axis) so error bars never hide
                    dodge = (k - (len(ss) - 1) / 2) * 0.012 * ((max(xs) - min(xs)) or 1.0)
                    ax.errorbar([p["x"] + dodge for p in pts], means, yerr=err,
                                color=_TAB[k % len(_TAB)], marker="o", ms=4, capsize=3, lw=1.6,
                                label=f"{sw.series_label} = {s:g}")
                if result.baseline is not None and math.isfinite(result.baseline[f"{split}_mean"]):
                    ax.axhline(result.baseline[f"{split}_mean"], color=RED, ls=":", lw=1.5,
                               label="AN baseline")
                ax.set(xlabel=sw.x_label, ylabel=f"{split} mAP (%)"
                       + (", 95% interval" if split == "test" else ""))
                ax.legend(loc="best")
            ax.set_title(f"{split} mAP at the best val epoch")
        fig.suptitle(result.title, fontsize=13, fontweight="bold")
        return save_figure(fig, path, dpi)


def plot_distinguish(result: DistinguishResult, path: str | os.PathLike, *,
                     dpi: int = DPI) -> Path:
    """Fig. 3a: W1 between the confidences of positive and negative unannotated entries per
    completed epoch (0 = before training), one line per loss, ±std over seeds shaded, the best
    val epoch circled."""
    with mpl.rc_context(STYLE):
        fig = new_figure(8.5, 4.6)
        ax = fig.add_subplot()
        for k, r in enumerate(result.losses):
            color = _TAB[k % len(_TAB)]
            e, m, s = (np.array(r[k], dtype=float) for k in ("epochs", "w1_mean", "w1_std"))
            ax.plot(e, m, color=color, marker="o", ms=4, lw=2, label=r["loss"])
            if len(result.settings["seeds"]) > 1:
                ax.fill_between(e, m - s, m + s, color=color, alpha=0.2, lw=0)
            if r["best_epoch"] is not None and r["best_epoch"] in r["epochs"]:
                j = r["epochs"].index(r["best_epoch"])
                ax.scatter([e[j]], [m[j]], s=110, facecolor="none", edgecolor=color, lw=1.8,
                           zorder=4)
        ax.set(xlabel="completed epochs (0 = before training)", ylabel="Wasserstein-1 distance",
               title=f"Positive vs negative unannotated {result.split} entries (best val epoch "
               "circled)")
        ax.xaxis.set_major_locator(mpl.ticker.MaxNLocator(integer=True))
        ax.legend(loc="best")
        return save_figure(fig, path, dpi)


def plot_histograms(result: DistinguishResult, path: str | os.PathLike, *,
                    dpi: int = DPI) -> Path:
    """Fig. 3b/c: density histograms of the confidences of the truly negative and truly
    positive unannotated entries, one row per loss, one panel per chosen epoch."""
    cols, rows = max(len(v) for v in result.hist_epochs.values()), len(result.losses)
    edges = np.linspace(0, 1, result.bins + 1)
    width = edges[1] - edges[0]
    with mpl.rc_context(STYLE):
        fig = new_figure(3.3 * cols + 0.6, 2.7 * rows + 0.8)
        grid = fig.subplots(rows, cols, squeeze=False)
        for i, r in enumerate(result.losses):
            chosen = result.hist_epochs[r["loss"]]
            for j in range(cols):
                ax = grid[i][j]
                if j >= len(chosen):
                    ax.set_visible(False)
                    continue
                e = chosen[j]
                k = r["epochs"].index(e)
                for counts, color, label in ((r["hist_neg"][k], BLUE, "negative"),
                                             (r["hist_pos"][k], ORANGE, "positive")):
                    c = np.asarray(counts, dtype=float)
                    dens = c / max(c.sum(), 1) / width
                    ax.stairs(dens, edges, color=color, fill=True, alpha=0.45, label=label)
                tag = ""
                if e == r["best_epoch"]:
                    tag = " (best)"
                elif e == 0:
                    tag = " (init)"
                ax.set_title(f"{r['loss']}, epoch {e}{tag}\nW1 = {r['w1_mean'][k]:.3f}",
                             fontsize=10.5)
                ax.set_xlim(0, 1)
                if i == rows - 1:
                    ax.set_xlabel("confidence p")
                if j == 0:
                    ax.set_ylabel("density")
        handles: dict[str, Any] = {}
        for ax in grid.flat:
            for h, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, h)
        fig.legend(list(handles.values()), [f"truly {k} unannotated" for k in handles],
                   loc="outside lower center", ncols=2, frameon=False)
        fig.suptitle(f"Confidences of the unannotated {result.split} entries (Fig. 3b/c)",
                     fontsize=13, fontweight="bold")
        return save_figure(fig, path, dpi)


def plot_calibration(result: CalibrationResult, path: str | os.PathLike, *,
                     dpi: int = DPI) -> Path:
    """Fig. 5: FN/(FN+TN) per confidence bucket (dot area ∝ entries) before and after
    training, with k̂ = σ(w·p + b) at the schedule's start / final values and Eq. 6."""
    grid_p = np.linspace(0, 1, 201)
    with mpl.rc_context(STYLE):
        fig = new_figure(11, 4.6)
        axes = fig.subplots(1, 2, squeeze=False, sharey=True)[0]
        for ax, stats, when, which, k in (
                (axes[0], result.before, "before training", "start", result.k_start),
                (axes[1], result.after, "after the last epoch", "final", result.k_final)):
            ok = stats.counts > 0
            size = 12 + 90 * np.sqrt(stats.counts[ok] / max(stats.counts.max(), 1))
            ax.scatter(stats.mean_p[ok], stats.rate[ok], s=size, color=GREY, edgecolor="black",
                       lw=0.4, zorder=3, label="observed FN/(FN+TN)")
            if which == "start":
                ax.axhline(result.fn_rate, color=GREY, ls="--", lw=1,
                           label=f"#FN/#unannotated = {result.fn_rate:.3f}")
            if k is not None:
                ax.plot(grid_p, k_hat_curve(grid_p, *k), color=BLUE, lw=2,
                        label=f"k̂ {which} {_k_text(*k)}")
            if which == "final":
                ax.plot(grid_p, scar_curve(grid_p, result.a), color=ORANGE, lw=2, ls="--",
                        label=f"Eq. 6, a = {result.a:.3f}")
            ax.set(xlim=(0, 1), ylim=(-0.02, 1.02), xlabel="confidence p (bucket mean)",
                   title=when)
            ax.legend(loc="upper left", fontsize=8.5)
        axes[0].set_ylabel("FN / (FN + TN)")
        fig.suptitle(f"Unannotated train entries that are truly positive, {result.loss} "
                     f"({len(result.before.counts)} buckets)", fontsize=13, fontweight="bold")
        return save_figure(fig, path, dpi)


def _k_text(w: float, b: float) -> str:
    return f"σ({w:g}·p {'−' if b < 0 else '+'} {abs(b):g})"


def plot_curves(result: CurvesResult, path: str | os.PathLike, *, dpi: int = DPI) -> Path:
    """Fig. 1: the entry loss and its gradient w.r.t. the logit on y=0 (unannotated) and y=1
    (positive) against p, every curve in its own colour."""
    p = np.asarray(result.p)
    styles = ("-", "--", ":", "-.")
    with mpl.rc_context(STYLE):
        fig = new_figure(11, 8)
        grid = fig.subplots(2, 2, squeeze=False)
        panels = (("loss_y0", "loss on an unannotated label (y = 0)", "ℓ"),
                  ("grad_y0", "gradient on an unannotated label (y = 0)", "∂ℓ/∂z"),
                  ("loss_y1", "loss on a positive (y = 1)", "ℓ"),
                  ("grad_y1", "gradient on a positive (y = 1)", "∂ℓ/∂z"))
        colors: dict[str, Any] = {}
        for ax, (key, title, ylabel) in zip(grid.flat, panels):
            for c in result.curves:
                base = c["label"].split(" @ ")[0]
                color = colors.setdefault(base, _TAB[len(colors) % len(_TAB)])
                same = [o for o in result.curves if o["label"].split(" @ ")[0] == base]
                ls = styles[same.index(c) % len(styles)]
                ax.plot(p, c[key], color=color, ls=ls, lw=1.8, label=c["label"])
            if key.startswith("grad"):
                ax.axhline(0, color="black", lw=0.6)
            ax.set(xlim=(0, 1), xlabel="p = σ(z)", ylabel=ylabel, title=title)
        handles, labels = grid[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels)),
                   frameon=False)
        fig.suptitle(result.title, fontsize=13, fontweight="bold")
        return save_figure(fig, path, dpi)
