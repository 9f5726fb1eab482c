"""Scoring, marks and outputs of ``spml table`` (:mod:`studies.table`): per column, a paired
bootstrap over the same test images, averaged over the draws, finds the best row and the rows not
significantly worse (Holm); Markdown, LaTeX, the tidy rows and the commands (docs/tables.md)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Entry", "Table", "write_outputs"]

MARK = "†"


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

    @property
    def n_draws(self) -> int:
        return 0 if self.cells[0].method.loss is None else len(
            {c.observed_seed for c in self.cells})


class Table:
    """The scored table: ``entries[(row, column)]``, and its Markdown, LaTeX and rows."""

    def __init__(self, plan: Any, cells: list[Any]) -> None:
        self.plan, self.cells = plan, cells
        self.columns, self.methods, self.config = plan.columns, plan.methods, plan.config
        self.notes = list(plan.notes)
        self.entries: dict[tuple[int, int], Entry] = {}
        for i in range(len(self.columns)):
            self._score_column(i)

    @property
    def n_trained(self) -> int:
        """Cells trained by this run (0 when every cell was kept in ``--out``)."""
        return sum(c.trained for c in self.cells)

    def _score_column(self, i: int) -> None:
        import torch

        from probe.engine.data import ProbeData, resolve_device
        from probe.evaluation.heads import stacked_logits
        from probe.evaluation.intervals import (
            BootstrapResult,
            Interval,
            bootstrap_map,
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
            if len(values) >= 2:
                iv, how = mean_interval(values, cfg.level), "draws"
            else:
                b = boots[0].intervals[j]
                iv, how = Interval(values[0], b.low, b.high, cfg.level), "images"
            entries[j] = Entry(j, i, mine[j], iv.value, iv.low, iv.high, how)
        finite = [j for j in rows if math.isfinite(entries[j].mean)]
        if finite:
            best = max(finite, key=lambda j: entries[j].mean)
            entries[best].best = entries[best].not_worse = True
            avg = BootstrapResult(map=torch.stack([b.map for b in boots]).mean(0),
                                  replicates=torch.stack([b.replicates for b in boots]).mean(0),
                                  intervals=[], n_resamples=cfg.resamples, seed=0, level=cfg.level)
            for diff in paired_differences(avg, [(best, j) for j in rows if j != best]):
                e = entries[diff.b]
                e.p_holm = diff.p_holm
                e.not_worse = math.isfinite(e.mean) and not diff.significant
        self.entries.update({(j, i): e for j, e in entries.items()})

    def _cell_text(self, e: Entry, bold: tuple[str, str], mark: str, iv: str) -> str:
        if not math.isfinite(e.mean):
            return "n/a"
        value = f"{bold[0]}{e.mean:.2f}{bold[1]}" if e.best else f"{e.mean:.2f}"
        low_high = (iv.format(f"[{e.low:.2f}, {e.high:.2f}]")
                    if math.isfinite(e.low) else "")
        draws = f" ({e.n_draws})" if e.n_draws else " (–)"
        return f"{value} {low_high}{draws}{mark if e.not_worse and not e.best else ''}".strip()

    def legend(self) -> str:
        lv = f"{self.config.level:.0%}"
        return (f"Test mAP (%), mean over the single-positive draws; [{lv} interval] of the mean "
                "over the draws (Student t), or with one draw over the test images (paired "
                f"bootstrap, {self.config.resamples} resamples); (n) draws trained on (the oracle "
                "needs one: it sees every label), (–) no training. "
                f"**Bold**: the column's best; {MARK}: not significantly worse than it (paired "
                "bootstrap over the same test images, averaged over the draws, "
                f"Holm-corrected within the column, at {1 - self.config.level:.2g}).")

    def markdown(self) -> str:
        """The table as Markdown, with its legend and notes below."""
        head = ["method", *(c.dataset for c in self.columns)]
        lines = ["| " + " | ".join(head) + " |",
                 "|" + "|".join(["---"] + [":---:"] * len(self.columns)) + "|"]
        for j, m in enumerate(self.methods):
            texts = [self._cell_text(self.entries[(j, i)], ("**", "**"), f" {MARK}", "{}")
                     for i in range(len(self.columns))]
            lines.append("| " + " | ".join([m.label, *texts]) + " |")
        lines += ["", self.legend()]
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def latex(self) -> str:
        """The table as a booktabs ``tabular`` (needs ``\\usepackage{booktabs}``)."""
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
        for j, m in enumerate(self.methods):
            texts = [self._cell_text(self.entries[(j, i)], (r"\textbf{", "}"), r"$^\dagger$",
                                     r"{{\scriptsize {}}}")
                     for i in range(len(self.columns))]
            out.append(" & ".join([esc(m.label), *texts]) + r" \\")
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
