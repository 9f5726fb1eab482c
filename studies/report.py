"""``spml report``: one study as a self-contained HTML page and a Markdown file with PNG figures.

Reads what ``spml study … --out DIR`` and ``spml study confirm`` leave behind -- the Optuna
storage (``DIR/study.log`` or ``DIR/study.db``, or any ``--storage``), the per-batch Parquet
results (``DIR/results``) and ``DIR/confirm.parquet`` when present -- and writes into ``out``
(default ``DIR/report``):

* ``report.html``: inline CSS, every figure a base64 ``data:`` URI, no script, no external
  asset: one file to mail or attach;
* ``report.md``: the same content, figures linked as files beside it;
* ``figures/*.png``: 150 dpi, titled, labelled axes (for papers);
* ``an_baseline.json``: the AN probe trained for the per-class comparison (when it ran).

Sections (:data:`SECTIONS`): summary (study, loss, store provenance, trial counts, best val mAP
against the paper point, the commands that reproduce it), leaderboard (val mAP, test mAP at the
best epoch, mean ± std over seeds where confirmed), optimisation history, fANOVA parameter
importances (``optuna.importance``), slice and contour plots, learning curves, and per-class
test AP of the best trial against an AN ("assume negative", Cole et al. 2021 Eq. 3) probe trained
on the same store with the same training settings. A section that cannot be drawn says why.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import shlex
import warnings
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
import polars as pl
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    json_to_distribution,
)
from optuna.trial import FrozenTrial, TrialState

from probe.errors import MissingPathError, SpmlError
from probe.io import atomic_write_text

from . import plots
from .confirm import load_study
from .plots import ParamAxis, TrialPoint
from .report_runs import (
    INTERVAL_TOP,
    ReportRuns,
    study_provenance,
    study_training,
    train_report_runs,
)
from .results import read_results
from .storage import find_storage, parse_storage

__all__ = [
    "SECTIONS",
    "ReportOptions",
    "ReportResult",
    "build_report",
    "study_command",
]

#: (anchor, heading) of every section, in order; anchors are the headings' GitHub slugs
SECTIONS = (
    ("summary", "Summary"),
    ("leaderboard", "Leaderboard"),
    ("optimisation-history", "Optimisation history"),
    ("parameter-importances", "Parameter importances"),
    ("slice-plots", "Slice plots"),
    ("contour-plots", "Contour plots"),
    ("learning-curves", "Learning curves"),
    ("per-class-ap-vs-the-an-baseline", "Per-class AP vs the AN baseline"),
    ("intervals-and-comparison", "Intervals and comparison"),
)
_FIGURE_NAMES = ("history", "importance", "slices", "contours", "learning_curves", "class_ap",
                 "comparison")


@dataclass(frozen=True)
class ReportOptions:
    """How much the report shows and whether it trains the AN baseline."""

    top: int = 10  # leaderboard rows: enough to see the spread of good trials, fits a page
    curves: int = 6  # learning curves drawn in colour; more are unreadable in one panel
    min_importance_trials: int = 5  # fANOVA's forest on fewer completed trials means nothing
    max_pairs: int = 3  # contour plots of the most important pairs; more add little
    max_classes: int = 40  # per-class bars drawn in full up to this; beyond, largest gains/losses
    dpi: int = plots.DPI  # 150: print quality for papers
    baseline: bool = True  # train the AN probe for the per-class comparison (seconds on CPU)
    device: str = "auto"  # where the AN baseline trains: CUDA when available, else CPU
    progress: bool = False  # tqdm bar of the baseline's epochs on stderr

    def validate(self) -> None:
        """Raise ValueError naming the first setting out of range."""
        for name, low in (("top", 1), ("curves", 1), ("min_importance_trials", 2),
                          ("max_pairs", 1), ("max_classes", 2), ("dpi", 50)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                flag = {"top": "--top", "dpi": "--dpi"}.get(name, f"ReportOptions.{name}")
                raise SpmlError(f"{flag} must be an integer >= {low}; got {v!r}")


@dataclass
class ReportResult:
    html_path: Path
    md_path: Path
    figures: list[Path]
    sections: list[str]  # headings written, in order (every one of SECTIONS)
    skipped: dict[str, str] = field(default_factory=dict)  # heading → why it has no figure
    baseline_path: Path | None = None  # an_baseline.json, when the baseline was trained


# --------------------------------------------------------------------------------------------
# reading the study
# --------------------------------------------------------------------------------------------


@dataclass
class _Study:
    study: optuna.Study
    storage: str  # as given or found, for display and commands (a password is hidden)
    storage_given: bool  # --storage was given (not found in study_dir)
    study_dir: Path
    trials: list[FrozenTrial]
    points: list[TrialPoint]
    axes: list[ParamAxis]
    distributions: dict[str, BaseDistribution]
    results: dict[int, dict[str, Any]]  # Parquet rows by trial number
    confirm: list[dict[str, Any]]  # confirm.parquet rows by rank
    settings: dict[str, Any]
    loss: str
    identity: dict[str, Any]  # spml.store
    notes: list[str]  # what was found wrong with the inputs (and ignored)

    @property
    def complete(self) -> list[FrozenTrial]:
        done = [t for t in self.trials if t.state == TrialState.COMPLETE]
        return sorted(done, key=lambda t: (-t.value, t.number))

    @property
    def paper(self) -> FrozenTrial | None:
        return next((t for t in self.trials if t.user_attrs.get("spml:paper")), None)


def _open(study_dir: Path, storage: str | None, name: str | None) -> _Study:
    if not study_dir.is_dir():
        raise MissingPathError(
            f"STUDY_DIR {study_dir} is not a folder; pass the folder given to 'spml study --out'"
        )
    given = storage is not None
    storage = storage if given else find_storage(study_dir)
    spec = parse_storage(storage)
    study = load_study(storage, name)  # refuses a storage file that is not there
    trials = study.get_trials(deepcopy=False)
    attrs = study.user_attrs
    notes: list[str] = []
    results = _read_results(study_dir / "results", study.study_name, notes)
    distributions = _distributions(attrs.get("spml.space"), trials)
    confirm = _read_confirm(study_dir / "confirm.parquet", trials, notes)
    return _Study(
        study=study, storage=spec.display, storage_given=given,
        study_dir=study_dir, trials=trials,
        points=[_point(t) for t in trials], axes=[_axis(k, d) for k, d in distributions.items()],
        distributions=distributions, results=results, confirm=confirm,
        settings=attrs.get("spml.settings") or {}, loss=attrs.get("spml.loss") or "?",
        identity=attrs.get("spml.store") or {}, notes=notes,
    )


def _read_results(directory: Path, study_name: str, notes: list[str]) -> dict[int, dict]:
    if not directory.is_dir():
        notes.append(f"no results folder {directory}: test mAP and per-class AP are unknown")
        return {}
    frame = read_results(directory)
    if frame.height and "study" in frame.columns:
        frame = frame.filter(pl.col("study") == study_name)
    return {int(r["trial"]): r for r in frame.iter_rows(named=True)}


def _read_confirm(path: Path, trials: list[FrozenTrial], notes: list[str]) -> list[dict]:
    """confirm.parquet's rows, when they belong to this study (same trials, same parameters)."""
    if not path.is_file():
        return []
    rows = pl.read_parquet(path).sort("rank").to_dicts()
    by_number = {t.number: t for t in trials}
    for row in rows:
        t = by_number.get(int(row["trial"]))
        if t is None or json.loads(row["params"]) != t.params:
            notes.append(
                f"{path} does not belong to this study (its trial {row['trial']} has other "
                "parameters); confirmed results are left out -- re-run 'spml study confirm'"
            )
            return []
    return rows


def _distributions(space: dict | None, trials: list[FrozenTrial]) -> dict[str, BaseDistribution]:
    if space:
        return {k: json_to_distribution(json.dumps(v)) for k, v in space.items()}
    out: dict[str, BaseDistribution] = {}
    for t in trials:
        for k, d in t.distributions.items():
            out.setdefault(k, d)
    return out


def _axis(name: str, dist: BaseDistribution) -> ParamAxis:
    if isinstance(dist, CategoricalDistribution):
        return ParamAxis(name, choices=tuple(dist.choices))
    return ParamAxis(name, log=bool(getattr(dist, "log", False)))


def _point(t: FrozenTrial) -> TrialPoint:
    iv = t.intermediate_values
    # steps are epochs counted from 1 (studies made before that, from 0); the first epoch first
    curve = tuple(iv.get(e) for e in range(min(iv), max(iv) + 1)) if iv else ()
    finite = [v for v in curve if v is not None and math.isfinite(v)]
    if t.state == TrialState.COMPLETE:
        value = t.value
    elif t.state == TrialState.PRUNED and finite:
        value = max(finite)
    else:
        value = None
    return TrialPoint(t.number, t.state.name, value, dict(t.params), curve,
                      bool(t.user_attrs.get("spml:paper")))


# --------------------------------------------------------------------------------------------
# the commands that reproduce the study
# --------------------------------------------------------------------------------------------


def _num(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)


def _range(dist: BaseDistribution) -> str:
    if isinstance(dist, CategoricalDistribution):
        return ",".join(_num(c) for c in dist.choices)
    assert isinstance(dist, FloatDistribution | IntDistribution)
    return f"{_num(dist.low)}:{_num(dist.high)}" + (":log" if dist.log else "")


def study_command(settings: dict[str, Any]) -> list[str]:
    """The ``spml study`` command line (argv) that creates this study, from its recorded
    ``spml.settings``: the flags that set a value other than the default, plus the store, loss,
    trial counts and output folder. ``spml study`` parses it back to the same settings."""
    from .study import StudySettings

    defaults = {f.name: (f.default if f.default is not MISSING else None)
                for f in fields(StudySettings)}
    s = settings
    argv = ["spml", "study", str(s["store"]), "--loss", str(s["loss"]),
            "--trials", str(s["n_trials"]), "--trials-at-once", str(s["batch"])]
    simple = (("sampler", "--sampler"), ("pruner", "--pruner"), ("storage", "--storage"),
              ("name", "--name"), ("seed", "--seed"), ("train_seed", "--train-seed"),
              ("epochs", "--epochs"), ("batch_size", "--batch-size"), ("lr", "--lr"),
              ("val_labels", "--val-labels"), ("observed_seed", "--observed-seed"),
              ("device", "--device"), ("heartbeat_seconds", "--heartbeat"),
              ("grace_seconds", "--grace"), ("workers", "--workers"))
    for key, flag in simple:
        v = s.get(key)
        if v is not None and v != defaults.get(key):
            argv += [flag, _num(v)]
    for k, v in (s.get("fixed") or {}).items():
        argv += ["--set", f"{k}={_num(v)}"]
    for k, v in (s.get("space") or {}).items():
        argv += ["--space", f"{k}={_range(json_to_distribution(json.dumps(v)))}"]
    if s.get("params"):
        argv += ["--params", ",".join(s["params"])]
    for k, values in (s.get("grid") or {}).items():
        argv += ["--grid", f"{k}={','.join(_num(v) for v in values)}"]
    if s.get("search_lr"):
        argv.append("--search-lr")
    for key, flag in (("batch_sizes", "--batch-sizes"), ("epochs_choices", "--epochs-choices")):
        if s.get(key):
            argv += [flag, ",".join(str(v) for v in s[key])]
    if s.get("enqueue_paper") is False:
        argv.append("--no-paper")
    return [*argv, "--out", str(s["out"])]


def _commands(st: _Study, name: str | None, store: str | None, out: Path) -> list[str]:
    lines = []
    if st.settings.get("store") and st.settings.get("loss"):
        lines.append(shlex.join(study_command(st.settings)))
    if st.confirm:
        first = st.confirm[0]
        seeds = list(dict.fromkeys(int(s) for s in first["seeds"]))
        draws = list(dict.fromkeys(int(s) for s in first["observed_seeds"]))
        lines.append(shlex.join([
            "spml", "study", "confirm", "--storage", st.storage,
            *(["--name", name] if name else []),
            "--store", str(store or st.settings.get("store", "STORE")),
            "--top-k", str(len(st.confirm)), "--seeds", ",".join(map(str, seeds)),
            "--observed-seeds", ",".join(map(str, draws)), "--out", str(st.study_dir),
        ]))
    report = ["spml", "report", str(st.study_dir)]
    if st.storage_given:
        report += ["--storage", st.storage]
    report += [*(["--name", name] if name else []), *(["--store", store] if store else []),
               "--out", str(out)]
    lines.append(shlex.join(report))
    return lines


# --------------------------------------------------------------------------------------------
# document blocks, rendered to HTML and to Markdown from the same list
# --------------------------------------------------------------------------------------------


@dataclass
class _Para:
    text: str


@dataclass
class _Facts:
    items: list[tuple[str, str]]


@dataclass
class _Table:
    header: list[str]
    rows: list[list[str]]
    id: str = ""
    caption: str = ""


@dataclass
class _Fig:
    path: Path
    caption: str


@dataclass
class _Code:
    text: str


@dataclass
class _Note:
    text: str
    kind: str = "skip"  # "skip": the section has no figure; "warn": something about the inputs


@dataclass
class _Section:
    anchor: str
    title: str
    blocks: list[Any] = field(default_factory=list)


def _f2(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, int | float) and math.isfinite(v) else "–"


def _fv(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _int(n: Any) -> str:
    return f"{int(n):,}" if isinstance(n, int | float) else str(n)


# --------------------------------------------------------------------------------------------
# sections
# --------------------------------------------------------------------------------------------





def _summary(st: _Study, commands: list[str]) -> _Section:
    sec = _Section(*SECTIONS[0])
    s, ident, prov = st.settings, st.identity, study_provenance(st)
    inner = prov.get("provenance") or {}
    counts = {state: sum(t.state == state for t in st.trials) for state in TrialState}
    n_done = counts[TrialState.COMPLETE]
    paper_doc = ""
    try:
        from probe.losses import get_loss_class

        paper_doc = get_loss_class(st.loss).paper
    except (KeyError, ValueError):
        pass
    sec.blocks.append(_Para(
        f"Study '{st.study.study_name}': {len(st.distributions)} hyperparameter(s) of loss "
        f"'{st.loss}' searched with the {s.get('sampler', '?')} sampler and "
        f"{s.get('pruner', '?')} pruning on the '{ident.get('dataset', '?')}' features. "
        "mAP values are percentages; val mAP selects the epoch and the trial, test mAP is "
        "reported at that epoch and never used to choose. Epochs are counted from 1."
    ))
    if not n_done:
        sec.blocks.append(_Note(
            f"This study has no completed trial yet ({len(st.trials)} trial(s): "
            f"{counts[TrialState.PRUNED]} pruned, {counts[TrialState.FAIL]} failed, "
            f"{counts[TrialState.RUNNING]} running, {counts[TrialState.WAITING]} waiting). "
            "Everything that needs a completed trial is left out below and says so; run the "
            "study further and report again.", "warn"))
    for note in st.notes:
        sec.blocks.append(_Note(note, "warn"))
    rows = prov.get("rows") or {}
    split = (f" (train {_int(rows['train'])} / val {_int(rows['val'])} / test "
             f"{_int(rows['test'])})" if {"train", "val", "test"} <= set(rows) else "")
    if s:
        train = study_training(st)
        training = (f"{train['epochs']} epochs ({train['epochs_from']}), batch size "
                    f"{train['batch_size']} ({train['batch_size_from']}), lr {train['lr']:g} "
                    f"({train['lr_from']}), train seed {s.get('train_seed', '?')}")
        if train["mixed"]:
            sec.blocks.append(_Note(
                "The trials of this study were trained with different settings ("
                + "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in train["mixed"].items())
                + "), so they are not comparable with each other; the values shown are the best "
                "trial's. Re-run the study in a new --out with one setting.", "warn"))
    else:
        training = "not recorded (the study was not made by 'spml study')"
    facts = [
        ("study", f"{st.study.study_name} in {st.storage}"),
        ("loss", st.loss + (f" — {paper_doc}" if paper_doc else "")),
        ("dataset", str(ident.get("dataset", "?"))),
        ("store", str(prov.get("path") or s.get("store", "?"))),
        ("store contents", f"{_int(ident.get('rows', '?'))} rows{split}, "
                           f"{ident.get('classes', '?')} classes, "
                           f"{ident.get('feature_dim', '?')}-dim "
                           f"{prov.get('store_dtype', '')} features".replace("  ", " ")),
        ("backbone", str(ident.get("backbone") or inner.get("backbone") or "?")),
        ("weights sha256", str(ident.get("weights_sha256") or "none")),
        ("source", str((inner.get("source") or {}).get("dataset")
                       or (inner.get("source") or {}).get("kind") or "?")),
        ("store created", str(ident.get("created") or "?")),
        ("training", training),
        ("labels", f"single-positive draw {s.get('observed_seed', '?')}; val labels "
                   f"{s.get('val_labels', '?')}"),
        ("search", f"{s.get('sampler', '?')} sampler (seed {s.get('seed', '?')}), "
                   f"{s.get('pruner', '?')} pruner, {s.get('batch', '?')} trials stacked per "
                   f"batch, {s.get('workers', 1)} worker(s)"),
        ("trials", f"{len(st.trials)} in all: {n_done} complete, {counts[TrialState.PRUNED]} "
                   f"pruned, {counts[TrialState.FAIL]} failed"
                   + (f", {counts[TrialState.RUNNING]} running"
                      if counts[TrialState.RUNNING] else "")
                   + (f", {counts[TrialState.WAITING]} waiting"
                      if counts[TrialState.WAITING] else "")),
    ]
    best, paper = (st.complete[0] if st.complete else None), st.paper
    if best is not None:
        row = st.results.get(best.number, {})
        facts.append(("best val mAP", f"{best.value:.2f} (trial {best.number}); test mAP "
                      f"{_f2(row.get('test_map'))} at its best epoch"))
    if paper is not None and paper.state == TrialState.COMPLETE:
        row = st.results.get(paper.number, {})
        delta = (f"; best minus paper: {best.value - paper.value:+.2f} val mAP"
                 if best else "")
        facts.append(("paper point", f"val mAP {paper.value:.2f} (trial {paper.number}), test "
                      f"mAP {_f2(row.get('test_map'))}{delta}"))
    elif paper is not None:
        facts.append(("paper point", f"trial {paper.number} is {paper.state.name.lower()}"))
    else:
        facts.append(("paper point", "none enqueued (--no-paper, the grid sampler, or no "
                      "paper values inside the space)"))
    from probe import __version__

    facts.append(("generated", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
                  + f" by spml-probe {__version__} (optuna {optuna.__version__})"))
    sec.blocks.append(_Facts(facts))
    space_rows = []
    for name, dist in st.distributions.items():
        if isinstance(dist, CategoricalDistribution):
            rng, scale = "{" + ", ".join(map(str, dist.choices)) + "}", "choice"
        else:
            rng, scale = f"[{dist.low:g}, {dist.high:g}]", "log" if dist.log else "linear"
        space_rows.append([
            name, rng, scale,
            _fv(paper.params.get(name, "–")) if paper else "–",
            _fv(best.params.get(name, "–")) if best else "–",
        ])
    sec.blocks.append(_Table(["parameter", "range", "scale", "paper value", "best trial"],
                             space_rows, id="search-space", caption="Search space"))
    sec.blocks.append(_Para("Reproduce: the study, its confirmation (when run) and this report."))
    sec.blocks.append(_Code("\n".join(commands)))
    return sec


def _leaderboard(st: _Study, options: ReportOptions, ctx: ReportRuns | None = None
                 ) -> _Section:
    sec = _Section(*SECTIONS[1])
    complete = st.complete
    if not complete:
        sec.blocks.append(_Note("No completed trial yet: there is nothing to rank."))
        return sec
    rank = {t.number: i for i, t in enumerate(complete, 1)}
    shown = complete[: options.top]
    paper = st.paper
    if paper is not None and paper.state == TrialState.COMPLETE and paper not in shown:
        shown.append(paper)
    confirmed = {int(r["trial"]): r for r in st.confirm}
    names = list(st.distributions)
    header = ["rank", "trial", "val mAP", "best epoch", "test mAP"]
    intervals = ctx.intervals if ctx is not None else {}
    if intervals:
        header += ["test mAP 95% interval"]
    if confirmed:
        header += ["confirmed test mAP", "runs"]
    header += names
    rows = []
    for t in shown:
        res = st.results.get(t.number, {})
        curve = _point(t).curve
        epoch = res.get("best_epoch")
        if epoch is None and curve:
            finite = [(v, -e) for e, v in enumerate(curve) if v is not None and math.isfinite(v)]
            epoch = 1 - max(finite)[1] if finite else None  # counted from 1
        mark = " (paper)" if t.user_attrs.get("spml:paper") else ""
        row = [str(rank[t.number]), f"{t.number}{mark}",
               f"{t.value:.2f}", str(epoch) if epoch is not None else "–",
               _f2(res.get("test_map"))]
        if intervals:
            iv = intervals.get(t.number)
            row += [f"[{iv.low:.2f}, {iv.high:.2f}]" if iv is not None else "–"]
        if confirmed:
            c = confirmed.get(t.number)
            row += ([f"{c['test_mean']:.2f} ± {c['test_std']:.2f}{_ci(c)}", str(c["n_runs"])]
                    if c else ["–", "–"])
        row += [_fv(t.params[n]) if n in t.params else "–" for n in names]
        rows.append(row)
    sec.blocks.append(_Para(
        f"The {len(shown)} best of {len(complete)} completed trials by val mAP (the selection "
        "criterion), with test mAP at each trial's best val epoch"
        + (" and, where 'spml study confirm' re-ran a trial, its test mAP as mean ± std over "
           "seeds" if confirmed else "") + "."
        + (f" Intervals: the best {len(intervals)} trials re-trained by this report, 95% "
           "paired bootstrap over the test images (section 'Intervals and comparison')."
           if intervals else "")
    ))
    sec.blocks.append(_Table(header, rows, id="leaderboard"))
    from probe.convergence import ADVICE, count_best_is_last

    at_last = count_best_is_last([_point(t).curve for t in complete])
    if at_last:
        sec.blocks.append(_Note(
            f"Not converged? {at_last} of {len(complete)} completed trials had their best val "
            f"mAP at their last epoch; {ADVICE}.", kind="warn"))
    if st.confirm:
        crow = []
        for r in st.confirm:
            seeds = ",".join(str(s) for s in dict.fromkeys(r["seeds"]))
            draws = ",".join(str(s) for s in dict.fromkeys(r["observed_seeds"]))
            crow.append([str(r["rank"]), str(r["trial"]), f"{r['search_value']:.2f}",
                         f"{r['val_mean']:.2f}",
                         f"{r['test_mean']:.2f} ± {r['test_std']:.2f}{_ci(r)}",
                         str(r["n_runs"]), seeds, draws])
        sec.blocks.append(_Para(
            "Confirmation ('spml study confirm'): each trial re-trained with every training "
            "seed on every single-positive draw; ranked by mean val mAP (test is reported, "
            "never selected on). Standard deviations are sample standard deviations; brackets: "
            "the Student-t 95% interval of the mean over the runs."
        ))
        sec.blocks.append(_Table(
            ["rank", "trial", "search val mAP", "val mAP (mean)", "test mAP (mean ± std)",
             "runs", "seeds", "draws"], crow, id="confirmation"))
        win = st.confirm[0]
        if win.get("refit_epochs") is not None:
            refit_ci = _ci({"test_low": win.get("refit_test_low"),
                            "test_high": win.get("refit_test_high")})
            sec.blocks.append(_Para(
                f"Refit ('spml study confirm --refit'): trial {win['trial']} re-trained on "
                f"train + val for {win['refit_epochs']} epochs (its median best val epoch), "
                f"then tested: test mAP {_f2(win.get('refit_test_mean'))}"
                f"{refit_ci}"
                f" over {len(win.get('refit_test_maps') or [])} runs, against "
                f"{win['test_mean']:.2f} trained on train only."))
    return sec


def _ci(row: dict[str, Any]) -> str:
    """`` [low, high]`` of a confirmation row's interval over runs (rows written before the
    interval existed, or of one run, have none)."""
    low, high = row.get("test_low"), row.get("test_high")
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return ""
    return f" [{low:.2f}, {high:.2f}]"


def _history(st: _Study, fig_dir: Path, options: ReportOptions) -> _Section:
    sec = _Section(*SECTIONS[2])
    if not any(p.value is not None or p.state == "FAIL" for p in st.points):
        sec.blocks.append(_Note("No trial has reported a val mAP yet: nothing to plot."))
        return sec
    path = plots.plot_history(st.points, fig_dir / "history.png",
                              title=f"Optimisation history: {st.study.study_name}", dpi=options.dpi)
    sec.blocks.append(_Fig(path, (
        "Val mAP of every trial in the order it was asked; the orange line is the best "
        "completed trial so far. Pruned trials are drawn at the best val mAP they reached "
        "before the pruner stopped them; failed trials are ticks on the x axis; the star and "
        "dashed line are the paper's values.")))
    return sec


def _importances(st: _Study, options: ReportOptions) -> tuple[dict[str, float] | None, str]:
    n, k = len(st.complete), len(st.distributions)
    if k < 2:
        which = f" ({next(iter(st.distributions))})" if k else ""
        return None, (f"the study searches {k} parameter{which}: an importance ranks parameters "
                      "against each other, so there is nothing to rank")
    minimum = options.min_importance_trials
    if n < minimum:
        return None, (f"only {n} completed trial(s); fANOVA needs at least {minimum} to "
                      "separate the parameters' effects")
    if len({t.value for t in st.complete}) < 2:
        return None, "every completed trial has the same val mAP: there is no variance to explain"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = optuna.importance.get_param_importances(
                st.study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
    except ImportError:
        return None, ("Optuna's fANOVA needs scikit-learn, which is not installed "
                      "(pip install scikit-learn)")
    except (ValueError, RuntimeError) as err:
        return None, f"Optuna could not compute them: {err}"
    if not values or not all(math.isfinite(v) for v in values.values()):
        return None, "Optuna's fANOVA returned no finite importances for these trials"
    return dict(values), ""


def _importance_section(st: _Study, imp: dict[str, float] | None, reason: str, fig_dir: Path,
                        options: ReportOptions) -> _Section:
    sec = _Section(*SECTIONS[3])
    if imp is None:
        sec.blocks.append(_Note(f"Skipped: {reason}."))
        return sec
    path = plots.plot_importances(imp, fig_dir / "importance.png", dpi=options.dpi,
                                  title=f"Parameter importance (fANOVA, {len(st.complete)} "
                                        "completed trials)")
    sec.blocks.append(_Fig(path, (
        "fANOVA importances (optuna.importance.get_param_importances with "
        "FanovaImportanceEvaluator, seed 0): the share of the variance of val mAP over the "
        "completed trials that each parameter explains, from a random forest fitted to them. "
        "With few trials they are rough.")))
    sec.blocks.append(_Table(["parameter", "importance"],
                             [[k, f"{v:.3f}"] for k, v in imp.items()], id="importances"))
    return sec


def _slices(st: _Study, fig_dir: Path, options: ReportOptions) -> _Section:
    sec = _Section(*SECTIONS[4])
    if not st.complete:
        sec.blocks.append(_Note("Skipped: no completed trial to place."))
        return sec
    if not st.axes:
        sec.blocks.append(_Note("Skipped: the study records no searched parameter."))
        return sec
    path = plots.plot_slices(st.points, st.axes, fig_dir / "slices.png", dpi=options.dpi)
    sec.blocks.append(_Fig(path, (
        "Val mAP against each searched parameter (log-scale axes where the parameter is "
        "searched log-uniformly); colour is the trial number, so the drift of the sampler "
        "shows. Grey crosses: pruned trials at the best val mAP they reached.")))
    return sec


def _contours(st: _Study, imp: dict[str, float] | None, fig_dir: Path,
              options: ReportOptions) -> _Section:
    sec = _Section(*SECTIONS[5])
    if len(st.axes) < 2:
        sec.blocks.append(_Note("Skipped: a contour plot needs two searched parameters; the "
                                f"study searches {len(st.axes)}."))
        return sec
    if not st.complete:
        sec.blocks.append(_Note("Skipped: no completed trial to interpolate."))
        return sec
    by_name = {a.name: a for a in st.axes}
    names = sorted(by_name, key=lambda n: -imp.get(n, 0.0)) if imp else list(by_name)
    pairs = [(names[i], names[j]) for i in range(len(names)) for j in range(i + 1, len(names))]
    if imp:  # the pairs whose parameters explain the most variance together
        pairs.sort(key=lambda p: -(imp.get(p[0], 0.0) + imp.get(p[1], 0.0)))
    pairs = [(by_name[a], by_name[b]) for a, b in pairs[: options.max_pairs]]
    path = plots.plot_contours(st.points, pairs, fig_dir / "contours.png", dpi=options.dpi)
    chosen = ("the most important parameters by fANOVA" if imp
              else "the first parameters of the space (no importances)")
    sec.blocks.append(_Fig(path, (
        f"Pairs of {chosen}: val mAP of the completed trials, interpolated linearly between "
        "them (Delaunay triangles, only inside their convex hull); dots are trials, the star "
        "is the best one. Sparse regions are guesses.")))
    return sec


def _curves(st: _Study, fig_dir: Path, options: ReportOptions) -> _Section:
    sec = _Section(*SECTIONS[6])
    if not st.complete:
        sec.blocks.append(_Note("Skipped: no completed trial yet."))
        return sec
    if not any(p.curve for p in st.points if p.state == "COMPLETE"):
        sec.blocks.append(_Note("Skipped: no completed trial reported per-epoch val mAP."))
        return sec
    path = plots.plot_learning_curves(st.points, fig_dir / "learning_curves.png",
                                      top=options.curves, dpi=options.dpi)
    sec.blocks.append(_Fig(path, (
        f"Val mAP per epoch of the {min(options.curves, len(st.complete))} best completed "
        "trials (and the paper point, dashed), as reported to the pruner; the circle is each "
        "trial's best epoch, whose head gives its test mAP. Thin grey lines: the other trials, "
        "pruned ones ending where they were stopped.")))
    return sec


def _baseline(st: _Study, ctx: ReportRuns | None, why: str, fig_dir: Path, out: Path,
              options: ReportOptions) -> tuple[_Section, Path | None]:
    """Per-class test AP of the best trial (from the Parquet results) against an AN probe
    (Cole et al. 2021, Eq. 3) trained on the same store with the best trial's training
    settings, training seed and single-positive draw."""
    sec = _Section(*SECTIONS[7])

    def skip(reason: str) -> tuple[_Section, None]:
        sec.blocks.append(_Note(f"Skipped: {reason}."))
        return sec, None

    if ctx is None:
        return skip(why)
    best = st.complete[0]
    best_ap = st.results.get(best.number, {}).get("class_ap")
    if not best_ap:
        return skip(f"the results Parquet ({st.study_dir / 'results'}) holds no per-class AP "
                    f"for the best trial {best.number}")
    if len(best_ap) != ctx.data.n_classes:
        return skip(f"the best trial's per-class AP has {len(best_ap)} classes, the store "
                    f"{ctx.data.n_classes}")
    result, cfg, store_path = ctx.an, ctx.an_config, ctx.store_path
    observed_seed = ctx.observed_seed
    baseline_path = result.write_json(out / "an_baseline.json")
    an = result.trials[0]
    an_ap = an.best.get("test_ap") or []
    names = list(result.class_names)
    path = plots.plot_class_ap(names, best_ap, an_ap, fig_dir / "class_ap.png",
                               labels=(f"best trial {best.number} ({st.loss})", "AN baseline"),
                               max_classes=options.max_classes, dpi=options.dpi)
    diffs = [(n, a, b) for n, a, b in zip(names, best_ap, an_ap)  # AP in percent
             if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]
    gains = sum(a > b for _, a, b in diffs)
    mean_diff = sum(a - b for _, a, b in diffs) / len(diffs) if diffs else math.nan
    best_row = st.results.get(best.number, {})
    sec.blocks.append(_Para(
        f"AN baseline ('an', assume negative, Cole et al. 2021 Eq. 3) trained on {store_path} "
        f"with the best trial's training settings: {cfg.epochs} epochs, batch size "
        f"{cfg.batch_size}, lr {cfg.lr:g}, Adam, train seed {cfg.seed}, single-positive draw "
        f"{observed_seed}, {cfg.val_labels} val labels, device {result.config.get('device')}; "
        "its epoch chosen on val mAP like every trial's. AN: val mAP "
        f"{_f2(an.best.get('val_map'))}, "
        f"test mAP {_f2(an.best.get('test_map'))} (epoch {an.best_epoch}). Best "
        f"trial {best.number}: val mAP {best.value:.2f}, test mAP "
        f"{_f2(best_row.get('test_map'))}. The best trial beats AN on {gains} of {len(diffs)} "
        f"classes; mean per-class difference {mean_diff:+.2f} AP points. Full run: "
        f"{baseline_path.name}."
    ))
    sec.blocks.append(_Fig(path, (
        "Per-class test AP at each model's best val epoch, sorted by the difference (best trial "
        "minus AN, written on the right).")))
    order = sorted(diffs, key=lambda r: -(r[1] - r[2]))
    if len(order) > options.max_classes:
        half = options.max_classes // 2
        order = order[:half] + order[-half:]
    sec.blocks.append(_Table(["class", f"trial {best.number} AP", "AN AP", "difference"],
                             [[n, f"{a:.2f}", f"{b:.2f}", f"{a - b:+.2f}"] for n, a, b in order],
                             id="class-ap"))
    return sec, baseline_path


def _comparison_section(st: _Study, ctx: ReportRuns | None, why: str, fig_dir: Path,
                        options: ReportOptions) -> _Section:
    """The re-trained top trials, the paper point and the AN baseline: test mAP with 95%
    intervals and every paired difference (studies.compare), as a table and a figure."""
    from .compare import plot

    sec = _Section(*SECTIONS[8])
    if ctx is None or ctx.comparison is None:
        sec.blocks.append(_Note(f"Skipped: {why or 'nothing was re-trained'}."))
        return sec
    cmp = ctx.comparison
    sec.blocks.append(_Para(
        f"The best {min(INTERVAL_TOP, len(st.complete))} trials by val mAP"
        + (", the paper's values" if st.paper is not None else "")
        + " and the AN baseline, re-trained on the study's store with their own settings "
        f"(training seed {st.settings.get('train_seed', 0)}, single-positive draw "
        f"{ctx.observed_seed}) and scored on the same {cmp.n_images} test images. Intervals: "
        f"{cmp.n_resamples} paired bootstrap resamples of the test images (class-wise AP "
        "recomputed on each); differences are paired and their p-values Holm-corrected over "
        f"the {len(cmp.pairs)} pairs. They measure test-set variation only, not training "
        "seeds or draws ('spml study confirm')."))
    rows = []
    for label, iv in zip(cmp.labels, cmp.intervals):
        rows.append([label, f"{iv.value:.2f}", f"[{iv.low:.2f}, {iv.high:.2f}]"])
    sec.blocks.append(_Table(["system", "test mAP", "95% interval"], rows, id="intervals"))
    prow = []
    for p in sorted(cmp.pairs, key=lambda p: p.p_holm):
        a, b, sign = (p.a, p.b, 1) if p.diff.value >= 0 else (p.b, p.a, -1)
        lo, hi = sorted((sign * p.diff.low, sign * p.diff.high))
        verdict = f"{cmp.labels[a]} better" if p.significant else "no clear difference"
        prow.append([f"{cmp.labels[a]} - {cmp.labels[b]}", f"{sign * p.diff.value:+.2f}",
                     f"[{lo:+.2f}, {hi:+.2f}]", f"{p.p_value:.3f}", f"{p.p_holm:.3f}", verdict])
    sec.blocks.append(_Table(["pair", "difference", "95% interval", "p", "p (Holm)",
                              "verdict"], prow, id="comparison"))
    drift = [(n, r.trials[0].best.get("test_map"), st.results.get(n, {}).get("test_map"))
             for n, r in ctx.trials.items()]
    drift = [(n, a, b) for n, a, b in drift
             if isinstance(a, float) and isinstance(b, float) and abs(a - b) > 0.01]
    if drift:
        sec.blocks.append(_Note("Re-training did not reproduce the study's test mAP exactly "
                                "for " + ", ".join(f"trial {n} ({a:.2f} vs {b:.2f})"
                                                   for n, a, b in drift)
                                + "; the table shows the re-trained heads.", kind="warn"))
    path = plot(cmp, fig_dir / "comparison.png")
    sec.blocks.append(_Fig(path, (
        "Left: test mAP with its 95% bootstrap interval. Right: every pairwise difference "
        "(higher minus lower) with its paired interval; red where the Holm-corrected p < 0.05.")))
    return sec


# --------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------

_CSS = """
:root { color-scheme: light; }
body { margin: 0; background: #eef1f5; color: #1f2328;
  font: 15px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
  "DejaVu Sans", sans-serif; }
main { max-width: 1120px; margin: 24px auto; padding: 28px 40px 48px; background: #fff;
  border-radius: 10px; box-shadow: 0 1px 4px rgba(0,0,0,.08); }
h1 { font-size: 28px; margin: 0 0 4px; }
h1 + p.sub { margin-top: 0; color: #57606a; }
h2 { font-size: 21px; margin: 40px 0 12px; padding-bottom: 6px; border-bottom: 2px solid #d8dee4; }
nav.toc { background: #f6f8fa; border: 1px solid #d8dee4; border-radius: 8px; padding: 10px 16px;
  margin: 16px 0 8px; }
nav.toc ol { margin: 4px 0; padding-left: 22px; columns: 2; }
nav.toc a { color: #0969da; text-decoration: none; }
.scroll { overflow-x: auto; margin: 10px 0 16px; }
table { border-collapse: collapse; font-size: 13.5px; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding: 4px 0; color: #57606a; }
th, td { padding: 5px 10px; border-bottom: 1px solid #e3e7eb; text-align: right;
  white-space: nowrap; }
th { background: #f6f8fa; font-weight: 600; border-bottom: 2px solid #d0d7de; }
th:first-child, td:first-child { text-align: left; }
tbody tr:nth-child(even) td { background: #fafbfc; }
table.facts th { text-align: left; background: none; border-bottom: 1px solid #e3e7eb;
  color: #57606a; vertical-align: top; width: 150px; }
table.facts td { text-align: left; white-space: normal; }
pre { background: #f6f8fa; border: 1px solid #d8dee4; border-radius: 6px; padding: 10px 14px;
  font-size: 13px; white-space: pre-wrap; word-break: break-word; }
figure { margin: 14px 0 22px; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid #e3e7eb;
  border-radius: 6px; }
figcaption { color: #57606a; font-size: 13.5px; margin-top: 6px; }
.note { border-left: 4px solid #bf8700; background: #fff8c5; padding: 8px 14px;
  border-radius: 4px; margin: 10px 0; }
.note.warn { border-color: #cf222e; background: #ffebe9; }
footer { margin-top: 40px; color: #8c959f; font-size: 12.5px; }
"""


def _render_html(title: str, subtitle: str, sections: list[_Section], dpi: int) -> str:
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{e(title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>", "<main>",
           f"<h1>{e(title)}</h1>", f'<p class="sub">{e(subtitle)}</p>',
           '<nav class="toc"><strong>Contents</strong><ol>']
    out += [f'<li><a href="#{s.anchor}">{e(s.title)}</a></li>' for s in sections]
    out.append("</ol></nav>")
    for s in sections:
        out.append(f'<section id="{s.anchor}">')
        out.append(f"<h2>{e(s.title)}</h2>")
        for b in s.blocks:
            if isinstance(b, _Para):
                out.append(f"<p>{e(b.text)}</p>")
            elif isinstance(b, _Note):
                out.append(f'<p class="note {b.kind}">{e(b.text)}</p>')
            elif isinstance(b, _Code):
                out.append(f"<pre><code>{e(b.text)}</code></pre>")
            elif isinstance(b, _Facts):
                rows = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in b.items)
                out.append(f'<div class="scroll"><table class="facts">{rows}</table></div>')
            elif isinstance(b, _Table):
                ident = f' id="{b.id}"' if b.id else ""
                cap = f"<caption>{e(b.caption)}</caption>" if b.caption else ""
                head = "".join(f"<th>{e(h)}</th>" for h in b.header)
                body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>"
                               for r in b.rows)
                out.append(f'<div class="scroll"><table{ident}>{cap}<thead><tr>{head}</tr>'
                           f"</thead><tbody>{body}</tbody></table></div>")
            elif isinstance(b, _Fig):
                png = b.path.read_bytes()
                data = base64.b64encode(png).decode("ascii")
                # shown at print size (CSS px are 1/96 in), shrunk to the page when wider
                width = round(int.from_bytes(png[16:20], "big") * 96 / dpi)
                out.append(f'<figure><img src="data:image/png;base64,{data}" width="{width}" '
                           f'alt="{e(b.caption)}">'
                           f"<figcaption>{e(b.caption)}</figcaption></figure>")
        out.append("</section>")
    out += ["<footer>Written by spml report (spml-probe). Self-contained: figures are embedded; "
            "no scripts, no external files.</footer>", "</main>", "</body>", "</html>", ""]
    return "\n".join(out)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _render_md(title: str, subtitle: str, sections: list[_Section], base: Path) -> str:
    out = [f"# {title}", "", f"_{subtitle}_", "", "**Contents:** "
           + " · ".join(f"[{s.title}](#{s.anchor})" for s in sections), ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, _Para):
                out += [b.text, ""]
            elif isinstance(b, _Note):
                out += [f"> **{'Note' if b.kind == 'warn' else 'Skipped'}:** {b.text}", ""]
            elif isinstance(b, _Code):
                out += ["```sh", b.text, "```", ""]
            elif isinstance(b, _Facts):
                out += [f"- **{k}**: {v}" for k, v in b.items] + [""]
            elif isinstance(b, _Table):
                if b.caption:
                    out += [f"**{b.caption}**", ""]
                out.append("| " + " | ".join(_md_cell(h) for h in b.header) + " |")
                out.append("|" + "|".join(":--" if i == 0 else "--:"
                                          for i in range(len(b.header))) + "|")
                out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in b.rows]
                out.append("")
            elif isinstance(b, _Fig):
                rel = os.path.relpath(b.path, base).replace(os.sep, "/")
                out += [f"![{_md_cell(b.caption)}]({rel})", "", f"*{b.caption}*", ""]
    return "\n".join(out)


def _write_text(path: Path, text: str) -> Path:
    return atomic_write_text(path, text)


def build_report(
    study_dir: str | os.PathLike,
    *,
    storage: str | None = None,
    name: str | None = None,
    store: str | None = None,
    out: str | os.PathLike | None = None,
    options: ReportOptions | None = None,
    log: Callable[[str], None] | None = None,
) -> ReportResult:
    """Write ``report.html``, ``report.md`` and ``figures/*.png`` for the study in ``study_dir``.

    ``storage``: the study's storage when it is not ``study_dir/study.log`` or ``study.db``
    (e.g. PostgreSQL); ``name``: the study, when the storage holds several; ``store``: the
    feature store for the AN baseline (default: the path the study recorded); ``out``: where
    to write (default ``study_dir/report``). Raises FileNotFoundError / :class:`StudyError`
    (ValueErrors) when ``study_dir`` holds no study or the storage has no such study. A study
    with no completed trial still gets a report, which says so.
    """
    options = options or ReportOptions()
    options.validate()
    log = log or (lambda msg: None)
    study_dir = Path(study_dir)
    st = _open(study_dir, storage, name)
    out_dir = Path(out) if out is not None else study_dir / "report"
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    commands = _commands(st, name, store, out_dir)
    log(f"study {st.study.study_name}: {len(st.trials)} trials; drawing figures")
    imp, imp_reason = _importances(st, options)
    ctx, why = train_report_runs(st, store, device=options.device, baseline=options.baseline,
                                 progress=options.progress, log=log)
    sections = [
        _summary(st, commands),
        _leaderboard(st, options, ctx),
        _history(st, fig_dir, options),
        _importance_section(st, imp, imp_reason, fig_dir, options),
        _slices(st, fig_dir, options),
        _contours(st, imp, fig_dir, options),
        _curves(st, fig_dir, options),
    ]
    baseline_section, baseline_path = _baseline(st, ctx, why, fig_dir, out_dir, options)
    sections.append(baseline_section)
    sections.append(_comparison_section(st, ctx, why, fig_dir, options))
    figures = [b.path for s in sections for b in s.blocks if isinstance(b, _Fig)]
    for stem in _FIGURE_NAMES:  # a figure of an earlier report that this one could not draw
        old = fig_dir / f"{stem}.png"
        if old.exists() and old not in figures:
            old.unlink()
    skipped = {s.title: b.text.removeprefix("Skipped: ").rstrip(".") for s in sections
               for b in s.blocks if isinstance(b, _Note) and b.kind == "skip"}
    title = f"Study report: {st.study.study_name}"
    subtitle = (f"loss {st.loss} on {st.identity.get('dataset', '?')}; {len(st.trials)} trials; "
                f"{st.storage}")
    page = _render_html(title, subtitle, sections, options.dpi)
    html_path = _write_text(out_dir / "report.html", page)
    md_path = _write_text(out_dir / "report.md", _render_md(title, subtitle, sections, out_dir))
    return ReportResult(html_path=html_path, md_path=md_path, figures=figures,
                        sections=[s.title for s in sections], skipped=skipped,
                        baseline_path=baseline_path)

