"""The figures of a study report (``spml report``), drawn with matplotlib's Agg canvas.

No pyplot: every function builds a :class:`~matplotlib.figure.Figure` on its own canvas, so
nothing touches global figure state and it runs headless. Each takes plain data (no Optuna
objects), writes one titled PNG at ``dpi`` and returns its path. The plots follow Optuna's
visualisations (history, fANOVA importances, slices, contours), drawn without plotly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from probe.errors import SpmlError
from probe.io import atomic_write
from studies.study.storage import best_trial, ranked_trials

__all__ = ["DPI", "ParamAxis", "TrialPoint", "plot_class_ap", "plot_comparison", "plot_contours",
           "plot_history", "plot_importances", "plot_learning_curves", "plot_slices"]

DPI = 150  # print quality for papers; a 9-inch-wide figure is 1350 px
VALUE_LABEL = "val mAP (%)"
STYLE = {
    "font.size": 10.5, "axes.titlesize": 12.5, "axes.titleweight": "bold", "axes.labelsize": 11,
    "xtick.labelsize": 9.5, "ytick.labelsize": 9.5, "legend.fontsize": 9.5,
    "legend.framealpha": 0.9, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
    "axes.spines.right": False, "figure.facecolor": "white", "savefig.facecolor": "white",
}
BLUE, ORANGE, GREY, RED, _GOLD = "#1f77b4", "#ff7f0e", "#9aa0a6", "#d62728", "#f2b701"


@dataclass(frozen=True)
class TrialPoint:
    """One trial as the figures see it."""

    number: int
    state: str  # Optuna state name: COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    value: float | None  # COMPLETE: val mAP at the best epoch; PRUNED: best val before the stop
    params: dict[str, Any] = field(default_factory=dict)
    curve: tuple[float | None, ...] = ()  # val mAP per epoch, the first epoch first
    paper: bool = False  # the enqueued paper point


@dataclass(frozen=True)
class ParamAxis:
    """A searched parameter: how to place its values on an axis."""

    name: str
    log: bool = False  # log-uniform search: a log axis
    choices: tuple[Any, ...] | None = None  # categorical: one tick per choice

    def coords(self, values: Sequence[Any]) -> np.ndarray:
        """Values → axis coordinates (index for categorical, log10 for log, else as is)."""
        if self.choices is not None:
            return np.array([list(self.choices).index(v) for v in values], dtype=float)
        x = np.asarray(values, dtype=float)
        return np.log10(x) if self.log else x

    def format_axis(self, axis: Any) -> None:
        """Ticks in parameter units for coordinates made by :meth:`coords` (call it after the
        data is drawn): one per choice; on a log axis at 1-2-5 multiples of powers of ten."""
        if self.choices is not None:
            axis.set_ticks(range(len(self.choices)), labels=[str(c) for c in self.choices])
        elif self.log:
            lo, hi = sorted(axis.get_view_interval())
            for mults in ((1, 2, 5), (1, 3), (1,)):
                ticks = [math.log10(m * 10.0**k) for k in range(math.floor(lo) - 1,
                                                                 math.ceil(hi) + 1)
                         for m in mults if lo <= math.log10(m * 10.0**k) <= hi]
                if len(ticks) <= 7:
                    break
            if len(ticks) >= 2:
                axis.set_ticks(ticks)
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{10 ** v:.3g}"))


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: str | os.PathLike, dpi: int) -> Path:
    """Write the PNG atomically (a reader never sees half a file); returns its path."""
    return atomic_write(path, lambda fh: fig.savefig(fh, dpi=dpi, format="png"))


def _valued(points: Sequence[TrialPoint], states: tuple[str, ...]) -> list[TrialPoint]:
    return [p for p in points if p.state in states and p.value is not None
            and math.isfinite(p.value)]


def _best(points: Sequence[TrialPoint]) -> TrialPoint | None:
    return best_trial(_valued(points, ("COMPLETE",)))


def plot_history(
    points: Sequence[TrialPoint], path: str | os.PathLike, *, title: str = "Optimisation history",
    dpi: int = DPI, reference: str = "paper",
) -> Path:
    """Val mAP per trial number with the running best of the completed trials; pruned trials
    (at the best val mAP they reached before the pruner stopped them), failed trials (ticks on
    the x axis) and the paper point (star, dashed reference line) marked."""
    with mpl.rc_context(STYLE):
        fig = new_figure(9, 4.6)
        ax = fig.add_subplot()
        done, pruned = _valued(points, ("COMPLETE",)), _valued(points, ("PRUNED",))
        failed = [p for p in points if p.state == "FAIL"]
        if done:
            ax.scatter([p.number for p in done], [p.value for p in done], s=36, color=BLUE,
                       zorder=3, label=f"complete ({len(done)})")
            order = sorted(done, key=lambda p: p.number)
            running = np.maximum.accumulate([p.value for p in order])
            xs = [p.number for p in order]
            last = max(p.number for p in points)
            ax.step([*xs, last], [*running, running[-1]], where="post", color=ORANGE,
                    lw=2, zorder=2, label="best so far")
        if pruned:
            ax.scatter([p.number for p in pruned], [p.value for p in pruned], marker="x", s=36,
                       color=GREY, zorder=3, label=f"pruned ({len(pruned)}), best val reached")
        for p in (q for q in done if q.paper):
            ax.scatter([p.number], [p.value], marker="*", s=260, color=RED, edgecolor="black",
                       lw=0.6, zorder=4, label=f"{reference} point ({p.value:.2f})")
            ax.axhline(p.value, color=RED, ls="--", lw=1, alpha=0.7)
        if failed:
            ax.plot([p.number for p in failed], [0.0] * len(failed), "|", color=RED, ms=14,
                    mew=2, transform=ax.get_xaxis_transform(), clip_on=False,
                    label=f"failed ({len(failed)})")
        ax.set(xlabel="trial number", ylabel=VALUE_LABEL, title=title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if done or pruned or failed:
            fig.legend(loc="outside lower center", ncols=4, frameon=False)
        return save_figure(fig, path, dpi)


def plot_importances(
    importances: dict[str, float], path: str | os.PathLike, *,
    title: str = "Parameter importance (fANOVA)", dpi: int = DPI,
) -> Path:
    """Horizontal bars of the fANOVA importances (fractions of the variance of val mAP that each
    parameter explains; they sum to 1), the most important on top."""
    items = sorted(importances.items(), key=lambda kv: kv[1])
    with mpl.rc_context(STYLE):
        fig = new_figure(8, 1.2 + 0.45 * len(items))
        ax = fig.add_subplot()
        names = [k for k, _ in items]
        values = [100 * v for _, v in items]
        bars = ax.barh(names, values, color=BLUE, height=0.6)
        for bar, v in zip(bars, values):
            ax.text(bar.get_width() + 0.8, bar.get_y() + bar.get_height() / 2, f"{v:.1f}%",
                    va="center", fontsize=9.5)
        ax.set_xlim(0, max([*values, 1.0]) * 1.15)
        ax.set(xlabel="share of the variance of val mAP explained (%)", title=title)
        ax.grid(axis="y", visible=False)
        return save_figure(fig, path, dpi)


def plot_slices(
    points: Sequence[TrialPoint], axes: Sequence[ParamAxis], path: str | os.PathLike, *,
    title: str = "Val mAP against each searched parameter", dpi: int = DPI,
) -> Path:
    """One panel per parameter: val mAP of every completed trial against the parameter's value,
    coloured by trial number (how the sampler moved); pruned trials as grey crosses, the paper
    point and the best trial as stars."""
    done, pruned, best = _valued(points, ("COMPLETE",)), _valued(points, ("PRUNED",)), _best(points)
    numbers = [p.number for p in points] or [0]
    norm = mpl.colors.Normalize(min(numbers), max(max(numbers), min(numbers) + 1))
    cols = min(len(axes), 3)
    rows = math.ceil(len(axes) / cols)
    with mpl.rc_context(STYLE):
        fig = new_figure(3.4 * cols + 0.9, 3.0 * rows + 0.6)
        grid = fig.subplots(rows, cols, squeeze=False, sharey=True)
        scatter = None
        for k, axis in enumerate(axes):
            ax = grid[k // cols][k % cols]
            have = [p for p in pruned if axis.name in p.params]
            if have:
                ax.scatter(axis.coords([p.params[axis.name] for p in have]),
                           [p.value for p in have], marker="x", s=22, color=GREY, zorder=2,
                           label="pruned")
            have = [p for p in done if axis.name in p.params]
            if have:
                scatter = ax.scatter(axis.coords([p.params[axis.name] for p in have]),
                                     [p.value for p in have], c=[p.number for p in have],
                                     cmap="viridis", norm=norm, s=34, edgecolor="black", lw=0.4,
                                     zorder=3)
            for p, color, label in ((next((q for q in done if q.paper), None), RED, "paper"),
                                    (best, _GOLD, "best")):
                if p is not None and axis.name in p.params:
                    ax.scatter(axis.coords([p.params[axis.name]]), [p.value], marker="*", s=230,
                               color=color, edgecolor="black", lw=0.6, zorder=4, label=label)
            axis.format_axis(ax.xaxis)
            ax.set_xlabel(axis.name + (" (log scale)" if axis.log else ""))
            if k % cols == 0:
                ax.set_ylabel(VALUE_LABEL)
        for k in range(len(axes), rows * cols):
            grid[k // cols][k % cols].set_visible(False)
        handles: dict[str, Any] = {}
        for ax in grid.flat:  # one legend entry per kind, from whichever panel has it
            for h, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, h)
        if handles:
            fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                       ncols=len(handles), frameon=False)
        if scatter is not None:
            fig.colorbar(scatter, ax=grid, label="trial number", shrink=0.85)
        fig.suptitle(title, fontsize=13, fontweight="bold")
        return save_figure(fig, path, dpi)


def _triangulation(x: np.ndarray, y: np.ndarray) -> mpl.tri.Triangulation | None:
    """Delaunay triangulation of the points, computed on coordinates scaled to the unit square
    (so one parameter's range does not flatten the triangles); None when the points are too few
    or collinear to span an area."""
    xy = np.stack([x, y], 1)
    span = np.ptp(xy, axis=0)
    if len(np.unique(xy, axis=0)) < 3 or (span == 0).any():
        return None
    try:
        unit = mpl.tri.Triangulation((x - x.min()) / span[0], (y - y.min()) / span[1])
    except (ValueError, RuntimeError):  # Qhull: collinear or duplicate points
        return None
    return mpl.tri.Triangulation(x, y, triangles=unit.triangles)


def plot_contours(
    points: Sequence[TrialPoint], pairs: Sequence[tuple[ParamAxis, ParamAxis]],
    path: str | os.PathLike, *, title: str = "Val mAP over pairs of parameters", dpi: int = DPI,
) -> Path:
    """One panel per pair: val mAP of the completed trials interpolated linearly over their
    Delaunay triangulation (filled contours, only inside the trials' convex hull), with the
    trials as dots and the best trial as a gold star. Duplicate points are averaged first; a pair
    whose points span no area shows the dots only and says so."""
    done, best = _valued(points, ("COMPLETE",)), _best(points)
    values = [p.value for p in done] or [0.0]
    lo, hi = min(values), max(values)
    hi = hi if hi > lo else lo + 1e-6
    levels, norm = np.linspace(lo, hi, 12), mpl.colors.Normalize(lo, hi)
    with mpl.rc_context(STYLE):
        fig = new_figure(3.35 * len(pairs) + 1.1, 3.9)
        grid = fig.subplots(1, len(pairs), squeeze=False)[0]
        mappable = None
        for ax, (ax_x, ax_y) in zip(grid, pairs):
            have = [p for p in done if ax_x.name in p.params and ax_y.name in p.params]
            x = ax_x.coords([p.params[ax_x.name] for p in have])
            y = ax_y.coords([p.params[ax_y.name] for p in have])
            z = np.array([p.value for p in have], dtype=float)
            if len(have):
                keys, inverse = np.unique(np.stack([x, y], 1), axis=0, return_inverse=True)
                zs = np.bincount(inverse.ravel(), weights=z) / np.bincount(inverse.ravel())
                tri = _triangulation(keys[:, 0], keys[:, 1])
            else:
                tri, zs = None, z
            subtitle = f"{ax_y.name} vs {ax_x.name}"
            if tri is not None and np.ptp(zs) > 0:
                mappable = ax.tricontourf(tri, zs, levels=levels, cmap="viridis", norm=norm,
                                          extend="neither")
            else:
                subtitle += "\n(too few distinct points to interpolate)"
            if len(have):
                dots = ax.scatter(x, y, c=z, cmap="viridis", norm=norm, s=26, edgecolor="white",
                                  lw=0.8, zorder=3)
                mappable = mappable or dots
            if best is not None and best in have:
                ax.scatter(ax_x.coords([best.params[ax_x.name]]),
                           ax_y.coords([best.params[ax_y.name]]), marker="*", s=260,
                           color=_GOLD, edgecolor="black", lw=0.7, zorder=4, clip_on=False)
            for axis, c, set_lim in ((ax_x, x, ax.set_xlim), (ax_y, y, ax.set_ylim)):
                if axis.choices is not None:
                    set_lim(-0.5, len(axis.choices) - 0.5)
                elif len(c):  # pad by hand: filled contours pin the limits to the data
                    pad = 0.06 * (np.ptp(c) or 1.0)
                    set_lim(c.min() - pad, c.max() + pad)
            ax_x.format_axis(ax.xaxis)
            ax_y.format_axis(ax.yaxis)
            ax.set(xlabel=ax_x.name + (" (log)" if ax_x.log else ""),
                   ylabel=ax_y.name + (" (log)" if ax_y.log else ""))
            ax.grid(False)
            ax.set_title(subtitle, fontsize=11)
        if mappable is not None:
            fig.colorbar(mappable, ax=grid, label=VALUE_LABEL, shrink=0.9, format="%.1f")
        fig.suptitle(title, fontsize=13, fontweight="bold")
        return save_figure(fig, path, dpi)


def plot_learning_curves(
    points: Sequence[TrialPoint], path: str | os.PathLike, *, top: int = 6,
    title: str = "Learning curves of the best trials", dpi: int = DPI, reference: str = "paper",
) -> Path:
    """Val mAP per epoch (counted from 1) of the ``top`` best completed trials in colour, with
    each one's best epoch marked; the paper point dashed; every other trial thin and grey."""
    done = ranked_trials(_valued(points, ("COMPLETE",)))
    paper = next((p for p in done if p.paper), None)
    shown = done[:top] + ([paper] if paper is not None and paper not in done[:top] else [])
    colors = mpl.colormaps["tab10"].colors
    with mpl.rc_context(STYLE):
        fig = new_figure(9, 4.8)
        ax = fig.add_subplot()
        for p in points:
            if p in shown or not p.curve:
                continue
            ax.plot(range(1, len(p.curve) + 1), _nan(p.curve), color=GREY, lw=0.8, alpha=0.45,
                    zorder=1)
        if any(p not in shown and p.curve for p in points):
            ax.plot([], [], color=GREY, lw=0.8, label="other trials")
        for i, p in enumerate(shown):
            y = _nan(p.curve)
            epochs = np.arange(1, len(y) + 1)
            color = RED if p.paper else colors[i % len(colors)]
            mark = f" ({reference})" if p.paper else ""  # the first trial: paper or defaults
            label = f"trial {p.number}{mark}: {p.value:.2f}"
            ax.plot(epochs, y, color=color, lw=2.2 if i == 0 else 1.6, ls="--" if p.paper else "-",
                    marker="o", ms=3.5, zorder=3, label=label)
            if len(y) and np.isfinite(y).any():
                b = int(np.nanargmax(y))
                ax.scatter([epochs[b]], [y[b]], s=90, facecolor="none", edgecolor=color, lw=1.8,
                           zorder=4)
        ax.set(xlabel="epoch", ylabel=VALUE_LABEL, title=title)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(loc="best", title="val mAP at the best epoch (circled)", title_fontsize=9)
        return save_figure(fig, path, dpi)


def _nan(values: Sequence[float | None]) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=float)


def plot_class_ap(
    class_names: Sequence[str], best_ap: Sequence[float], baseline_ap: Sequence[float],
    path: str | os.PathLike, *, labels: tuple[str, str] = ("best trial", "AN baseline"),
    max_classes: int = 40, title: str = "Per-class test AP", dpi: int = DPI,
) -> Path:
    """Grouped horizontal bars of per-class test AP (in %, as recorded), sorted by the
    difference (largest gain on top), the difference written beside each pair. Beyond
    ``max_classes`` classes only the largest gains and losses are drawn (half each) and the
    title says so. Classes whose AP is undefined (no positive test image) are left out and
    counted in the title."""
    names, a, b = list(class_names), _nan(best_ap), _nan(baseline_ap)  # percent, as recorded
    if not (len(names) == len(a) == len(b)):
        raise SpmlError(
            f"plot_class_ap: {len(names)} class names but {len(a)} and {len(b)} AP values"
        )
    ok, diff = np.isfinite(a) & np.isfinite(b), a - b
    idx = np.nonzero(ok)[0]
    idx = idx[np.argsort(-diff[idx], kind="stable")]
    note = ""
    if len(idx) > max_classes:
        half = max_classes // 2
        note = f"; the {half} largest gains and {half} largest losses of {len(idx)} classes"
        idx = np.concatenate([idx[:half], idx[-half:]])
    if (~ok).any():
        note += f"; {int((~ok).sum())} classes without test positives left out"
    n = len(idx)
    with mpl.rc_context(STYLE):
        fig = new_figure(9, 1.6 + 0.34 * max(n, 3))
        ax = fig.add_subplot()
        pos, h = np.arange(n)[::-1].astype(float), 0.38
        ax.barh(pos + h / 2, a[idx], height=h, color=BLUE, label=labels[0])
        ax.barh(pos - h / 2, b[idx], height=h, color=GREY, label=labels[1])
        top = max(np.nanmax(a[idx]) if n else 1.0, np.nanmax(b[idx]) if n else 1.0)
        for y, i in zip(pos, idx):
            ax.text(top * 1.02, y, f"{diff[i]:+.1f}", va="center", fontsize=9,
                    color="#1a7f37" if diff[i] >= 0 else RED)
        ax.set(yticks=pos, yticklabels=[names[i] for i in idx], ylim=(-0.7, n - 0.3),
               xlim=(0, top * 1.12), xlabel="test AP at the best val epoch (%); difference on "
               "the right")
        ax.grid(axis="y", visible=False)
        fig.legend(loc="outside lower center", ncols=2, frameon=False)
        ax.set_title(f"{title}: {labels[0]} vs {labels[1]}, sorted by difference{note}",
                     wrap=True)
        return save_figure(fig, path, dpi)


def plot_comparison(
    labels: Sequence[str], maps: Sequence[tuple[float, float, float]],
    diffs: Sequence[tuple[str, float, float, float, bool]], path: str | os.PathLike, *,
    level: float = 0.95, title: str = "Test mAP with intervals", dpi: int = DPI,
) -> Path:
    """Two panels: each system's test mAP with its interval (``maps``: value, low, high), and
    every pairwise difference (``diffs``: name, value, low, high, significant) with its paired
    interval against the zero line; significant pairs (Holm) drawn in colour."""
    n, m = len(labels), len(diffs)
    with mpl.rc_context(STYLE):
        fig = new_figure(11, 1.8 + 0.32 * max(n + m, 4))
        left, right = fig.subplots(1, 2, width_ratios=(1, 1))
        order = sorted(range(n), key=lambda i: maps[i][0])
        y = np.arange(n, dtype=float)
        v, lo, hi = (np.array([maps[i][k] for i in order]) for k in range(3))
        left.errorbar(v, y, xerr=[v - lo, hi - v], fmt="o", color=BLUE, capsize=3)
        left.set(yticks=y, yticklabels=[labels[i] for i in order], title="mAP per system",
                 xlabel=f"test mAP (%), {100 * level:g}% bootstrap interval")
        left.margins(y=0.15)
        right.margins(y=0.15)
        left.grid(axis="y", visible=False)
        y2 = np.arange(m, dtype=float)[::-1]
        for yy, (_, val, dlo, dhi, sig) in zip(y2, diffs):
            right.errorbar([val], [yy], xerr=[[val - dlo], [dhi - val]], fmt="o",
                           color=RED if sig else GREY, capsize=3)
        right.axvline(0.0, color="black", lw=0.8)
        right.set(yticks=y2, yticklabels=[d[0] for d in diffs], title="Pairwise differences",
                  xlabel=f"difference (mAP points), paired {100 * level:g}% interval;\n"
                  "red: Holm-corrected p < 0.05")
        right.grid(axis="y", visible=False)
        fig.suptitle(title)
        return save_figure(fig, path, dpi)
