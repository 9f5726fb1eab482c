"""Scoring, marks and outputs of ``spml table`` (:mod:`studies.table`): per column, a paired
bootstrap over the same test images, averaged over the draws, finds the best single-positive row
and the rows not significantly worse than it (one-sided, Holm); Markdown, LaTeX, the tidy rows
and the commands (docs/tables.md "Marks").

Reference rows (the full-label oracle) are scored and shown below a rule but never compete: no
bold, no mark, no member of the family. A row with a non-finite cell (a diverged draw) reads
"n/a (k of n diverged)", with no mark, and is left out of the family too."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Entry", "Table", "write_outputs"]

MARK = "†"
#: method kinds shown as reference rows: scored, below a rule, never compared (the oracle sees
#: every label, so "not worse than it" is no statement about single-positive learning)
REFERENCE_KINDS = ("oracle",)


@dataclass
class Entry:
    """A row's entry in a column: the mean test mAP over its cells (draws) and its marks."""

    row: int
    column: int
    cells: list[Any]
    mean: float
    low: float
    high: float
    interval: str  # "draws" (Student t over the draws) | "images" (bootstrap over test images)
    best: bool = False
    not_worse: bool = False  # not significantly worse than the column's best (Holm)
    p_holm: float | None = None  # of the difference to the best (None: the best itself)
    n_diverged: int = 0  # cells whose test mAP is not finite
    reference: bool = False  # a reference row (the oracle): shown, never compared

    @property
    def n_draws(self) -> int:
        return 0 if self.cells[0].method.loss is None else len(
            {c.observed_seed for c in self.cells})

    @property
    def competes(self) -> bool:
        """Whether it may be the column's best or be marked: not a reference row, and every
        cell finite."""
        return not self.reference and self.n_diverged == 0 and math.isfinite(self.mean)


def entry_text(e: Entry, bold: tuple[str, str], mark: str, iv: str) -> str:
    """An entry as a cell prints it: the mean (bold for the best), its interval, the draws it
    averages and the mark; a row with a diverged draw says so instead."""
    if e.n_diverged:
        return f"n/a ({e.n_diverged} of {len(e.cells)} diverged)"
    if not math.isfinite(e.mean):
        return "n/a"
    value = f"{bold[0]}{e.mean:.2f}{bold[1]}" if e.best else f"{e.mean:.2f}"
    low_high = (iv.format(f"[{e.low:.2f}, {e.high:.2f}]")
                if math.isfinite(e.low) else "")
    draws = f" ({e.n_draws})" if e.n_draws else " (–)"
    marked = e.not_worse and not e.best and e.competes
    return f"{value} {low_high}{draws}{mark if marked else ''}".strip()


class Table:
    """The scored table: ``entries[(row, column)]``, and its Markdown, LaTeX and rows."""

    def __init__(self, plan: Any, cells: list[Any]) -> None:
        self.plan, self.cells = plan, cells
        self.columns, self.methods, self.config = plan.columns, plan.methods, plan.config
        self.notes = list(plan.notes)
        self.entries: dict[tuple[int, int], Entry] = {}
        for i in range(len(self.columns)):
            self._score_column(i)
        self.peaked_at_last = count_peaked_at_last(cells)
        self.notes += convergence_notes(cells, plan)
        self.notes += identical_rows_notes(self.methods, cells)

    @property
    def n_trained(self) -> int:
        """Cells trained by this run (0 when every cell was kept in ``--out``)."""
        return sum(c.trained for c in self.cells)

    def _score_column(self, i: int) -> None:
        import torch

        from probe.devices import resolve_device
        from probe.engine.data import ProbeData
        from probe.evaluation.heads import stacked_logits
        from probe.evaluation.intervals import (
            BootstrapResult,
            Interval,
            bootstrap_map,
            count_non_finite,
            few_test_images,
            mean_interval,
            paired_differences,
        )

        col, cfg = self.columns[i], self.config
        rows = list(range(len(self.methods)))
        mine = {j: [c for c in self.cells if c.column is col and c.method is
                    self.plan.method_at(i, j)] for j in rows}
        data = ProbeData.from_store(col.path, device=resolve_device(cfg.device), flip=False,
                                    observed_seed=col.draws[0])
        targets = data.test_labels.bool()
        warning = few_test_images(int(targets.shape[0]))
        if warning:
            self.notes.append(f"{col.dataset}: {warning.removeprefix('warning: ')}")
        boots = []
        for d in col.draws:
            scores = []
            for j in rows:
                c = next((c for c in mine[j] if c.observed_seed == d), mine[j][0])
                if c.head is None:
                    scores.append(torch.as_tensor(col.prior_test_scores, dtype=torch.float32,
                                                  device=data.test_x.device))
                else:
                    w = c.head.to(device=data.test_x.device, dtype=torch.float32)[None]
                    scores.append(stacked_logits(data.test_x, w)[0].float())
            boots.append(bootstrap_map(torch.stack(scores), targets, n_resamples=cfg.resamples,
                                       seed=0, level=cfg.level))
        entries = {}
        for j in rows:
            values = [c.test_map for c in mine[j]]
            diverged = count_non_finite(values)
            if len(values) >= 2 or diverged:
                iv, how = mean_interval(values, cfg.level), "draws"
            else:
                b = boots[0].intervals[j]
                iv, how = Interval(values[0], b.low, b.high, cfg.level), "images"
            method = self.plan.method_at(i, j)
            entries[j] = Entry(j, i, mine[j], iv.value, iv.low, iv.high, how,
                               n_diverged=diverged, reference=method.kind in REFERENCE_KINDS)
        competing = [j for j in rows if entries[j].competes]
        if competing:
            best = max(competing, key=lambda j: entries[j].mean)
            entries[best].best = entries[best].not_worse = True
            avg = BootstrapResult(map=torch.stack([b.map for b in boots]).mean(0),
                                  replicates=torch.stack([b.replicates for b in boots]).mean(0),
                                  intervals=[], n_resamples=cfg.resamples, seed=0, level=cfg.level)
            # one-sided: is the best better than the row (best - row > 0)? Holm over the
            # competing rows of this column only
            pairs = [(best, j) for j in competing if j != best]
            for diff in paired_differences(avg, pairs, alternative="greater"):
                e = entries[diff.b]
                e.p_holm = diff.p_holm
                e.not_worse = math.isfinite(diff.p_holm) and not diff.significant
        self.entries.update({(j, i): e for j, e in entries.items()})

    def legend(self) -> str:
        lv = f"{self.config.level:.0%}"
        alpha = f"{1 - self.config.level:.2g}"
        return (f"Test mAP (%), mean over the single-positive draws; [{lv} interval]: with two "
                "or more draws, of the mean over the draws (Student t: the spread of the draws); "
                "with one draw, over the test images (paired bootstrap, "
                f"{self.config.resamples} resamples: the spread of the test set only); (n) draws "
                "trained on, (–) no training. "
                f"**Bold**: the column's best single-positive row. {MARK}: not significantly "
                "worse than it -- a one-sided test of best − row > 0 on the paired bootstrap "
                "over the same test images (each row's scores averaged over the draws, the "
                "p-value from the bootstrap standard error), Holm-corrected over the column's "
                f"compared rows, at {alpha}. The test conditions on the trained heads: it "
                "ignores the variance over draws and training seeds, which the interval of "
                "the mean shows. Reference rows (the full-label oracle) are shown below the "
                "rule and never compared; a row with a diverged draw reads n/a and is not "
                "compared.")

    def row_order(self) -> tuple[list[int], list[int]]:
        """The rows that compete, in the table's order, then the reference rows (below a
        rule)."""
        compared, reference = [], []
        for j, m in enumerate(self.methods):
            if m.kind in REFERENCE_KINDS:
                reference.append(j)
            else:
                compared.append(j)
        return compared, reference

    def markdown(self) -> str:
        """The table as Markdown, with its legend and notes below; reference rows come after a
        row that names them. With ``--metrics`` or ``--stat std``, one table per metric
        (:meth:`metric_markdown`) before the notes."""
        config = self.config
        if tuple(config.metrics) == ("map",) and config.stat == "interval":
            return self._map_markdown()
        parts = []
        for metric in config.metrics:
            if metric == "map" and config.stat == "interval":
                parts.append(self._map_markdown(notes=False))
            else:
                parts.append(self.metric_markdown(metric))
        parts.append("\n".join(f"Note: {n}" for n in self.notes))
        return "\n".join(parts).rstrip("\n") + "\n"

    def metric_markdown(self, metric: str) -> str:
        """One metric's table: per row and column the mean over the draws of the cells'
        ``test_<metric>``, with the standard deviation (``--stat std``) or the Student-t interval
        over the draws; bold the best compared row by the metric's direction; below it, each
        compared row against the best by a Wilcoxon signed-rank test over the paired draws of
        every column (as CRISP's tables)."""
        from probe.metrics import METRIC_DIRECTIONS

        higher = METRIC_DIRECTIONS[metric]
        summary = metric_entries(self, metric)
        compared, reference = self.row_order()
        head = ["method", *(c.dataset for c in self.columns)]
        lines = [f"**test {metric}** ({'higher' if higher else 'lower'} is better; "
                 f"{'mean ± std' if self.config.stat == 'std' else 'mean [interval]'} over the "
                 "draws)", "",
                 "| " + " | ".join(head) + " |",
                 "|" + "|".join(["---"] + [":---:"] * len(self.columns)) + "|"]
        for j in compared + reference:
            if reference and j == reference[0]:
                lines.append("| " + " | ".join(["*reference (not compared)*",
                                                 *([""] * len(self.columns))]) + " |")
            texts = [summary[(j, i)].text(self.config.stat) for i in range(len(self.columns))]
            lines.append("| " + " | ".join([self.methods[j].label, *texts]) + " |")
        lines += ["", wilcoxon_line(self, metric, summary, compared), ""]
        return "\n".join(lines)

    def _map_markdown(self, notes: bool = True) -> str:
        """The test-mAP table with its marks and legend (and the notes)."""
        head = ["method", *(c.dataset for c in self.columns)]
        lines = ["| " + " | ".join(head) + " |",
                 "|" + "|".join(["---"] + [":---:"] * len(self.columns)) + "|"]
        compared, reference = self.row_order()
        for j in compared + reference:
            if reference and j == reference[0]:
                rule = ["*reference (not compared)*", *([""] * len(self.columns))]
                lines.append("| " + " | ".join(rule) + " |")
            texts = [entry_text(self.entries[(j, i)], ("**", "**"), f" {MARK}", "{}")
                     for i in range(len(self.columns))]
            lines.append("| " + " | ".join([self.methods[j].label, *texts]) + " |")
        lines += ["", self.legend()]
        if notes:
            lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def latex(self) -> str:
        """The table as a booktabs ``tabular`` (needs ``\\usepackage{booktabs}``); reference
        rows below a ``\\midrule``."""
        def esc(text: str) -> str:
            for a, b in (("\\", r"\textbackslash{}"), ("_", r"\_"), ("%", r"\%"),
                         ("&", r"\&"), ("#", r"\#")):
                text = text.replace(a, b)
            return text

        cols = "l" + "c" * len(self.columns)
        out = [f"% {esc(self.legend()).replace(MARK, 'dagger')}",
               rf"\begin{{tabular}}{{{cols}}}", r"\toprule",
               " & ".join(["Method", *(esc(c.dataset) for c in self.columns)]) + r" \\",
               r"\midrule"]
        compared, reference = self.row_order()
        for j in compared + reference:
            if reference and j == reference[0]:
                out.append(r"\midrule")
            texts = [entry_text(self.entries[(j, i)], (r"\textbf{", "}"), r"$^\dagger$",
                                     r"{{\scriptsize {}}}")
                     for i in range(len(self.columns))]
            out.append(" & ".join([esc(self.methods[j].label), *texts]) + r" \\")
        out += [r"\bottomrule", r"\end{tabular}"]
        return "\n".join(out) + "\n"

    def frame(self) -> Any:
        """One row per cell (row, store, draw) in :mod:`studies.results.export`'s tidy schema, with
        the table's own columns: ``method``, ``row_kind``, ``column``, ``cell`` (its key),
        ``command`` and the entry's ``entry_map`` / ``best`` / ``not_worse`` / ``p_holm``."""
        from studies.results.rows import FORMAT, probe_rows, tidy_frame

        rows = []
        for e in self.entries.values():
            for c in e.cells:
                extra = {"method": c.method.label, "row_kind": c.method.kind,
                         "column": c.column.dataset, "cell": c.key, "command": c.command,
                         "entry_map": e.mean, "best": e.best, "not_worse": e.not_worse,
                         "p_holm": e.p_holm}
                if c.record is not None:
                    rows += probe_rows(c.record, kind="table", extra=extra)
                else:
                    rows.append({"format": FORMAT, "kind": "table", "state": "COMPLETE",
                                 "params": json.dumps({"priors": c.method.priors}),
                                 "test_map": c.test_map, "dataset": c.column.dataset,
                                 "store": c.column.path, "store_fingerprint":
                                 c.column.fingerprint, **extra})
        return tidy_frame(rows, curves=False)

    def commands(self) -> str:
        """One ``spml probe`` command per cell that trains it (the zero-shot row trains
        nothing), with the test mAP it reproduces."""
        return "\n".join(f"# {c.method.label} | {c.column.dataset} | draw {c.observed_seed} | "
                         f"test mAP {c.test_map:.4f}\n{c.command}"
                         for c in self.cells if c.command) + "\n"


@dataclass
class MetricSummary:
    """A row's figure for one metric in one column: the mean over its cells' draws, their
    standard deviation and the Student-t interval of the mean."""

    values: list[float]
    mean: float
    std: float
    low: float
    high: float
    best: bool = False

    def text(self, stat: str) -> str:
        from probe.evaluation.intervals import count_non_finite

        diverged = count_non_finite(self.values)
        if diverged:
            return f"n/a ({diverged} of {len(self.values)} diverged)"
        value = f"**{self.mean:.4f}**" if self.best else f"{self.mean:.4f}"
        if stat == "std":
            return f"{value} ± {self.std:.4f}" if len(self.values) > 1 else value
        if math.isfinite(self.low):
            return f"{value} [{self.low:.4f}, {self.high:.4f}]"
        return value


def cell_metric(cell: Any, metric: str) -> float:
    """A cell's test value of ``metric``: its test mAP, or ``test_<metric>`` of its record's
    best epoch (NaN where the run recorded none, e.g. the zero-shot row)."""
    if metric == "map":
        return float(cell.test_map)
    record = cell.record or {}
    trials = record.get("trials") or [{}]
    value = (trials[0].get("best") or {}).get(f"test_{metric}")
    return float(value) if isinstance(value, int | float) else math.nan


def metric_entries(table: Table, metric: str) -> dict[tuple[int, int], MetricSummary]:
    """Every (row, column)'s :class:`MetricSummary` of ``metric``, the best compared row of
    each column marked by the metric's direction."""
    import statistics

    from probe.evaluation.intervals import mean_interval
    from probe.metrics import METRIC_DIRECTIONS

    higher = METRIC_DIRECTIONS[metric]
    out = {}
    for (j, i), entry in table.entries.items():
        values = [cell_metric(c, metric) for c in entry.cells]
        iv = mean_interval(values, table.config.level)
        std = statistics.stdev(values) if len(values) > 1 and math.isfinite(iv.value) else 0.0
        out[(j, i)] = MetricSummary(values, iv.value, std, iv.low, iv.high)
    compared, _ = table.row_order()
    for i in range(len(table.columns)):
        candidates = [j for j in compared if math.isfinite(out[(j, i)].mean)]
        if candidates:
            sign = 1.0 if higher else -1.0
            best = max(candidates, key=lambda j: sign * out[(j, i)].mean)
            out[(best, i)].best = True
    return out


def wilcoxon_line(table: Table, metric: str, summary: dict[tuple[int, int], MetricSummary],
                  compared: list[int]) -> str:
    """Each compared row against the row that is best in most columns: a two-sided Wilcoxon
    signed-rank test over the paired (column, draw) values (scipy.stats.wilcoxon; CRISP's
    Table 12 pairs trials and datasets likewise)."""
    from scipy.stats import wilcoxon

    wins = {j: sum(summary[(j, i)].best for i in range(len(table.columns))) for j in compared}
    if not wins or max(wins.values()) == 0:
        return "Wilcoxon: no compared row has a finite value."
    best = max(compared, key=lambda j: wins[j])
    parts = []
    for j in compared:
        if j == best:
            continue
        a, b = [], []
        for i in range(len(table.columns)):
            a += summary[(best, i)].values
            b += summary[(j, i)].values
        pairs = [(x, y) for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)]
        if len(pairs) < 2 or all(x == y for x, y in pairs):
            parts.append(f"{table.methods[j].label} –")
            continue
        p = float(wilcoxon([x for x, _ in pairs], [y for _, y in pairs]).pvalue)
        parts.append(f"{table.methods[j].label} p={p:.3g}")
    n = sum(len(summary[(best, i)].values) for i in range(len(table.columns)))
    return (f"Wilcoxon signed-rank (two-sided, no correction) of each row against "
            f"{table.methods[best].label} over {n} paired draws: " + "; ".join(parts)
            + (". With fewer than 6 pairs no p can fall below 0.05." if n < 6 else "."))


def _val_curve(cell: Any) -> list[Any]:
    record = cell.record or {}
    trials = record.get("trials") or [{}]
    return [epoch.get("val_map") for epoch in trials[0].get("epochs") or []]


def count_peaked_at_last(cells: list[Any]) -> tuple[int, int]:
    """(cells whose best val mAP is at their last epoch, cells with a val curve): val mAP was
    still rising when training stopped (:func:`probe.evaluation.convergence.best_is_last`)."""
    from probe.evaluation.convergence import best_is_last

    curves = [_val_curve(c) for c in cells if c.record is not None]
    curves = [curve for curve in curves if len(curve) >= 2]
    return sum(best_is_last(curve) for curve in curves), len(curves)


def convergence_notes(cells: list[Any], plan: Any) -> list[str]:
    """A note when cells peaked at their last epoch, naming the flags that fix it."""
    at_last, of = count_peaked_at_last(cells)
    if not at_last:
        return []
    config = getattr(plan, "config", None)  # the table's settings (None: not known)
    if getattr(config, "grid", None) is not None:  # --tune grid chose each cell's lr
        fix = ("Train longer (--epochs sets the grid's epochs) or give the grid larger "
               "learning rates (--grid lr=...).")
    else:
        fix = ("Train longer (--epochs), at a larger learning rate (--lr), or let each loss "
               "search them (--tune N).")
    return [f"{at_last} of {of} trained cells peaked at their last epoch (val mAP still "
            f"rising): their losses are compared before they converged. {fix}"]


def identical_rows_notes(methods: list[Any], cells: list[Any], rtol: float = 1e-5,
                         atol: float = 1e-6) -> list[str]:
    """A note for each pair of rows that trained the same heads on every store and draw
    (within ``rtol``/``atol``): at these settings they are one method (e.g. OPML at α = β = 1
    is ZLPR)."""
    import torch

    heads: dict[str, dict[tuple[str, int], Any]] = {}
    for c in cells:
        if c.head is not None and c.method.kind not in REFERENCE_KINDS:
            heads.setdefault(c.method.label, {})[(c.column.path, c.observed_seed)] = c.head
    labels = [m.label for m in methods if m.label in heads]
    notes = []
    for a_index, a in enumerate(labels):
        for b in labels[a_index + 1:]:
            if heads[a].keys() != heads[b].keys():
                continue
            same = all(torch.allclose(heads[a][k], heads[b][k], rtol=rtol, atol=atol)
                       for k in heads[a])
            if same:
                notes.append(f"{a} and {b} trained the same heads on every store and draw "
                             f"(within rtol {rtol:g}): at these settings they are one method, "
                             "shown twice.")
    return notes


def write_outputs(table: Table, out: str | Path) -> list[Path]:
    """Write ``table.md``, ``table.tex``, ``cells.parquet``, ``cells.csv`` and
    ``commands.sh`` into ``out`` (each atomically, and only where its bytes change: a rerun
    that trained nothing leaves every file as it was); returns their paths."""
    import io

    from probe.io import atomic_write

    out = Path(out)
    frame = table.frame()
    parquet, csv = io.BytesIO(), io.BytesIO()
    frame.write_parquet(parquet)
    frame.write_csv(csv)
    files = {"table.md": table.markdown().encode(), "table.tex": table.latex().encode(),
             "cells.parquet": parquet.getvalue(), "cells.csv": csv.getvalue(),
             "commands.sh": table.commands().encode()}
    for name, data in files.items():
        if not ((out / name).is_file() and (out / name).read_bytes() == data):
            atomic_write(out / name, lambda fh, data=data: fh.write(data))
    return [out / name for name in files]
