"""Table 3 of the GR paper: GR with k̂, v and the robust L on and off, the learned-(k̂, v)
row and the AN baseline (:func:`run_ablation`, ``spml analyze ablation``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from probe.engine.config import TRAINER_KEYS, ProbeConfig
from probe.engine.data import ProbeData
from probe.engine.results import ProbeResult
from probe.progress import Progress

from .common import (
    GR_SWITCHES,
    AnalysisResult,
    AnalyzeError,
    check_fixed,
    load_data,
    pin_training,
    run_config,
    run_settings,
    score_cells,
    scores_caption,
    train_runs,
    trial_scores,
)


@dataclass(frozen=True)
class AblationRow:
    """One row of Table 3: its loss and switches, and the paper's marks (k̂, v, L)."""

    name: str
    loss: str
    switches: dict[str, bool]
    marks: tuple[str, str, str]  # ✓ on, × off, ◦ learned (Table 3's symbols)


def _gr_row(name: str, k: bool, v: bool, robust: bool, learn: bool = False) -> AblationRow:
    def mark(on: bool) -> str:
        if learn:  # learned, not switched
            return "◦"
        return "✓" if on else "×"

    switches = {"use_k": k, "use_v": v, "robust": robust}
    if learn:
        switches["learn_kv"] = True
    return AblationRow(name, "gr", switches, (mark(k), mark(v), "✓" if robust else "×"))


#: Table 3 in the paper's order: the AN baseline, the 7 combinations of k̂ / v / L, the "◦" row
ABLATION_ROWS: tuple[AblationRow, ...] = (
    AblationRow("AN (baseline)", "an", {}, ("×", "×", "×")),
    _gr_row("k̂", True, False, False),
    _gr_row("v", False, True, False),
    _gr_row("L", False, False, True),
    _gr_row("k̂ + v", True, True, False),
    _gr_row("k̂ + L", True, False, True),
    _gr_row("v + L", False, True, True),
    _gr_row("GR (k̂ + v + L)", True, True, True),
    _gr_row("learned k̂, v + L", True, True, True, learn=True),
)
_REFERENCE_ROW = "GR (k̂ + v + L)"


@dataclass
class AblationResult(AnalysisResult):
    """Table 3 on this store: per row val and test mAP (mean ± std over seeds)."""

    rows: list[dict[str, Any]]
    settings: dict[str, Any]
    hparams: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    kind, title, paper = "ablation", "GR ablation (paper Table 3)", "Table 3"

    def tables(self):
        n = len(self.settings["seeds"])
        header = ["row", "k̂", "v", "L", "loss", "val mAP", "test mAP", "95% interval",
                  "best epoch"]
        rows = [[r["name"], *r["marks"], r["loss"], *score_cells(r, n),
                 ",".join("-" if e is None else str(e) for e in r["best_epochs"])]
                for r in self.rows]
        cap = (scores_caption(n) + "; ✓ on, × off (k̂ ≡ 0, v ≡ 1, q1 = q2 = q3 = 0.01), ◦ "
               "learned by gradient descent; best epoch counted from 1")
        return [(cap, header, rows)]


def ablation_hparams(hparams: dict[str, Any] | None) -> dict[str, Any]:
    """Validate the GR hyperparameters shared by the ablation's rows (not the switches)."""
    return check_fixed("gr", hparams, GR_SWITCHES, "the ablation sets the switches per row")


def run_ablation(
    data: ProbeData | str,
    config: ProbeConfig | None = None,
    hparams: dict[str, Any] | None = None,
    *,
    rows: Sequence[AblationRow] = ABLATION_ROWS,
    progress: bool = False,
) -> AblationResult:
    """Train every row of Table 3 (``rows``) on ``data`` (or a store path) and collect val /
    test mAP.

    ``hparams``: GR hyperparameters for every GR row (single values; the switches are the
    rows'); unset ones come from the paper preset for the store's dataset, else GR's defaults.
    The GR row with everything on trains first; its resolved batch size, lr and epochs are
    then used for every other row (the AN baseline included). The seeds of a row stack.
    """
    config, seeds = run_config(config)
    hp = ablation_hparams(hparams)
    if not rows:
        raise AnalyzeError("run_ablation: no rows to train")
    data = load_data(data, config)
    order = sorted(range(len(rows)), key=lambda i: rows[i].name != _REFERENCE_ROW)
    results: dict[int, ProbeResult] = {}
    with Progress(len(rows), "ablation rows", "run", enabled=progress) as bar:
        for i in order:
            row = rows[i]
            row_hp = {**hp, **row.switches} if row.loss == "gr" else {
                k: v for k, v in hp.items() if k in TRAINER_KEYS}
            results[i] = train_runs(data, config, row.loss, [row_hp], seeds, progress)
            if len(results) == 1:
                config = pin_training(config, results[i])
            bar.update(1)
    out_rows = [{"name": row.name, "loss": row.loss, "marks": list(row.marks),
                 "switches": row.switches, **trial_scores(results[i], range(len(seeds))),
                 "hparams": results[i].trials[0].hparams} for i, row in enumerate(rows)]
    first = results[order[0]]
    notes = list(first.config.get("notes", []))
    if any(row.loss == "an" for row in rows):
        notes.append("the AN row trains the 'an' loss (−log p, −log(1−p)), the paper's "
                     "baseline; GR with k̂, v and L all off would give (1 − e^(−0.01·a))/0.01 "
                     "of AN's entry loss a (q = 0.01), not exactly AN")
    return AblationResult(out_rows, run_settings(data, first, seeds), hp, notes)
