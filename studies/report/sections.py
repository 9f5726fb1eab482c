"""The report's sections (:data:`SECTIONS`), each computed from the study and drawn into
document blocks (:mod:`studies.report.render`) with its figures (:mod:`studies.plots`);
:class:`ReportOptions` says how much they show."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from probe import __version__
from probe.errors import SpmlError
from probe.evaluation.convergence import ADVICE, count_best_is_last
from probe.evaluation.intervals import few_test_images
from probe.progress import plural
from probe.store.priors import prior_facts
from probe.store.records import draw_text
from studies import plots
from studies.results.rows import draw_of
from studies.study.space import range_text
from studies.study.storage import is_paper_trial, reference_label

from .data import StudyView, trial_point
from .render import CodeBlock, Facts, Figure, Note, Paragraph, Section, Table
from .runs import INTERVAL_TOP, ReportRuns, study_provenance, study_training

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


def _f2(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, int | float) and math.isfinite(v) else "–"


def _fv(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _int(n: Any) -> str:
    return f"{int(n):,}" if isinstance(n, int | float) else str(n)


def _skipped(i: int, reason: str) -> Section:
    return Section(*SECTIONS[i], [Note(f"Skipped: {reason}.")])


def _prior_words(name: str, prov: dict) -> str:
    """The store prior the study trained with, and where it came from."""
    rec = prov.get("priors") or {}
    p = rec.get("provenance") or {}
    facts = prior_facts(p, ("model", "weights_sha256", "tiles", "temperature", "source"))
    extras = rec.get("extras")
    if extras is not None:
        facts.append(f"extras {', '.join(extras)}" if extras else "no extras")
    return f"'{name}' (--priors {name})" + (f": {'; '.join(facts)}" if facts else "")


def source_text(provenance: dict[str, Any]) -> str:
    """Where a store's rows came from, from its provenance: an import's record (a dict: its
    dataset or kind), or the images a featurized store read (dataset and absolute root)."""
    source = provenance.get("source")
    if isinstance(source, dict):
        return str(source.get("dataset") or source.get("kind") or "?")
    from featurize.datasets import image_source

    images = image_source(provenance)
    if images is not None:
        return f"images of dataset '{images.dataset}' under {images.root}"
    return str(source or "?")


def summary_section(st: StudyView, commands: list[str]) -> Section:
    """The Summary section: the study, its store, draw, training, search space and commands."""
    s, ident, prov = st.settings, st.identity, study_provenance(st)
    inner = prov.get("provenance") or {}
    counts = {state: sum(t.state == state for t in st.trials) for state in TrialState}
    n_done = counts[TrialState.COMPLETE]
    paper_doc = st.loss_class.paper if st.loss_class is not None else ""
    sec = Section(*SECTIONS[0], [Paragraph(
        f"Study '{st.study.study_name}': {len(st.distributions)} hyperparameter(s) of loss "
        f"'{st.loss}' searched with the {s.get('sampler', '?')} sampler and "
        f"{s.get('pruner', '?')} pruning on the '{ident.get('dataset', '?')}' features. "
        "mAP values are percentages; val mAP selects the epoch and the trial, test mAP is "
        "reported at that epoch and never used to choose. Epochs are counted from 1.")])
    if not n_done:
        sec.blocks.append(Note(
            f"This study has no completed trial yet ({len(st.trials)} trial(s): "
            f"{counts[TrialState.PRUNED]} pruned, {counts[TrialState.FAIL]} failed, "
            f"{counts[TrialState.RUNNING]} running, {counts[TrialState.WAITING]} waiting). "
            "Everything that needs a completed trial is left out below and says so; run the "
            "study further and report again.", "warn"))
    sec.blocks += [Note(note, "warn") for note in st.notes]
    rows = prov.get("rows") or {}
    split = (f" (train {_int(rows['train'])} / val {_int(rows['val'])} / test "
             f"{_int(rows['test'])})" if {"train", "val", "test"} <= set(rows) else "")
    if s:
        train = study_training(st)
        if "train.lr" in st.distributions:  # one lr per trial: the leaderboard shows each
            lr_text = "lr searched (each trial's in the leaderboard)"
        else:
            lr_text = f"lr {train['lr']:g} ({train['lr_from']})"
        training = (f"{train['epochs']} epochs ({train['epochs_from']}), batch size "
                    f"{train['batch_size']} ({train['batch_size_from']}), {lr_text}, train "
                    f"seed {s.get('train_seed', '?')}")
        if train["mixed"]:
            sec.blocks.append(Note(
                "The trials of this study were trained with different settings ("
                + "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in train["mixed"].items())
                + "), so they are not comparable with each other; the values shown are the best "
                "trial's. Re-run the study in a new --out with one setting.", "warn"))
    else:
        training = "not recorded (the study was not made by 'spml study')"
    loss_text = st.loss + (f" — {paper_doc}" if paper_doc else "")
    packages = [r.get("loss_package") for r in st.results.values() if r.get("loss_package")]
    if packages:  # the distribution its trials recorded (a plugin's, or spml-probe)
        loss_text += f" (from {packages[0]})"
    draw = draw_of(prov)
    labels_text = f"draw {s.get('observed_seed', '?')}"
    if draw:
        labels_text += f" ({draw_text(draw)})"
    labels_text += f"; val labels {s.get('val_labels', '?')}"
    facts = [
        ("study", f"{st.study.study_name} in {st.storage}"),
        ("loss", loss_text),
        ("dataset", str(ident.get("dataset", "?"))),
        ("store", str(prov.get("path") or s.get("store", "?"))),
        ("store contents", f"{_int(ident.get('rows', '?'))} rows{split}, "
                           f"{ident.get('classes', '?')} classes, "
                           f"{ident.get('feature_dim', '?')}-dim "
                           f"{prov.get('store_dtype', '')} features".replace("  ", " ")),
        ("backbone", str(ident.get("backbone") or inner.get("backbone") or "?")),
        ("weights sha256", str(ident.get("weights_sha256") or "none")),
        ("source", source_text(inner)),
        ("store created", str(ident.get("created") or "?")),
        ("training", training),
        ("labels", labels_text),
        ("search", f"{s.get('sampler', '?')} sampler (seed {s.get('seed', '?')}), "
                   f"{s.get('pruner', '?')} pruner, {s.get('batch', '?')} trials stacked per "
                   f"batch, {s.get('workers', 1)} worker(s)"),
        ("trials", f"{len(st.trials)} in all: {n_done} complete, {counts[TrialState.PRUNED]} "
                   f"pruned, {counts[TrialState.FAIL]} failed"
                   + "".join(f", {counts[state]} {state.name.lower()}"
                             for state in (TrialState.RUNNING, TrialState.WAITING)
                             if counts[state])),
    ]
    if s.get("priors"):
        facts.insert(facts.index(("labels", labels_text)) + 1,
                     ("prior", _prior_words(s.get("priors"), prov)))
    best, paper = (st.complete[0] if st.complete else None), st.paper
    word = reference_label(st.study)  # "paper" only where a paper gives the values
    if best is not None:
        row = st.results.get(best.number, {})
        facts.append(("best val mAP", f"{best.value:.2f} (trial {best.number}); test mAP "
                      f"{_f2(row.get('test_map'))} at its best epoch"))
    if paper is not None and paper.state == TrialState.COMPLETE:
        row = st.results.get(paper.number, {})
        delta = (f"; best minus {word}: {best.value - paper.value:+.2f} val mAP"
                 if best else "")
        facts.append((f"{word} point", f"val mAP {paper.value:.2f} (trial {paper.number}), "
                      f"test mAP {_f2(row.get('test_map'))}{delta}"))
    elif paper is not None:
        facts.append((f"{word} point", f"trial {paper.number} is {paper.state.name.lower()}"))
    else:
        facts.append(("first trial", "none enqueued with the loss's own values (--no-paper, "
                      "the grid sampler, or none inside the space)"))
    facts.append(("generated", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
                  + f" by spml-probe {__version__} (optuna {optuna.__version__})"))
    space_rows = []
    for name, dist in st.distributions.items():
        if isinstance(dist, CategoricalDistribution):
            scale = "choice"
        else:
            scale = "log" if dist.log else "linear"
        paper_value = _fv(paper.params.get(name, "–")) if paper else "–"
        best_value = _fv(best.params.get(name, "–")) if best else "–"
        space_rows.append([name, range_text(dist), scale, paper_value, best_value])
    columns = ["parameter", "range", "scale", f"{word} value", "best trial"]
    sec.blocks += [Facts(facts), Table(columns,
                                       space_rows, id="search-space", caption="Search space"),
                   Paragraph("Reproduce: the study, its confirmation (when run) and this report."),
                   CodeBlock("\n".join(commands))]
    return sec


def leaderboard_section(st: StudyView, options: ReportOptions, ctx: ReportRuns | None = None
                 ) -> Section:
    """The Leaderboard: the completed trials, best first, with test mAP and intervals when run."""
    complete = st.complete
    if not complete:
        return Section(*SECTIONS[1], [Note("No completed trial yet: there is nothing to rank.")])
    rank = {t.number: i for i, t in enumerate(complete, 1)}
    shown = complete[: options.top]
    paper = st.paper
    if paper is not None and paper.state == TrialState.COMPLETE and paper not in shown:
        shown.append(paper)
    confirmed = {int(r["trial"]): r for r in st.confirm}
    names = list(st.distributions)
    intervals = ctx.intervals if ctx is not None else {}
    header = ["rank", "trial", "val mAP", "best epoch", "test mAP"]
    if intervals:
        header.append("test mAP 95% interval")
    if confirmed:
        header += ["confirmed test mAP", "runs"]
    header += names
    rows = []
    for t in shown:
        res = st.results.get(t.number, {})
        curve = trial_point(t).curve
        epoch = res.get("best_epoch")
        if epoch is None and curve:
            finite = [(v, -e) for e, v in enumerate(curve) if v is not None and math.isfinite(v)]
            epoch = 1 - max(finite)[1] if finite else None  # counted from 1
        mark = f" ({reference_label(st.study)})" if is_paper_trial(t) else ""
        row = [str(rank[t.number]), f"{t.number}{mark}",
               f"{t.value:.2f}", str(epoch) if epoch is not None else "–",
               _f2(res.get("test_map"))]
        if intervals:
            iv = intervals.get(t.number)
            row += [f"[{iv.low:.2f}, {iv.high:.2f}]" if iv is not None else "–"]
        if confirmed:
            c = confirmed.get(t.number)
            row += ([f"{c['test_mean']:.2f} ± {c['test_std']:.2f}"
                     f"{_ci(c.get('test_low'), c.get('test_high'))}", str(c["n_runs"])]
                    if c else ["–", "–"])
        row += [_fv(t.params[n]) if n in t.params else "–" for n in names]
        rows.append(row)
    sec = Section(*SECTIONS[1], [Paragraph(
        f"The {len(shown)} best of {len(complete)} completed trials by val mAP (the selection "
        "criterion), with test mAP at each trial's best val epoch"
        + (" and, where 'spml study confirm' re-ran a trial, its test mAP as mean ± std over "
           "seeds" if confirmed else "") + "."
        + (f" Intervals: the best {len(intervals)} trials ({_heads_source(ctx)}), 95% "
           "paired bootstrap over the test images (section 'Intervals and comparison')."
           if intervals else "")), Table(header, rows, id="leaderboard")])
    at_last = count_best_is_last([trial_point(t).curve for t in complete])
    if at_last:
        sec.blocks.append(Note(
            f"Not converged? {at_last} of {len(complete)} completed trials had their best val "
            f"mAP at their last epoch; {ADVICE}.", kind="warn"))
    if st.confirm:
        crow = [[str(r["rank"]), str(r["trial"]), f"{r['search_value']:.2f}",
                 f"{r['val_mean']:.2f}", f"{r['test_mean']:.2f} ± {r['test_std']:.2f}"
                 f"{_ci(r.get('test_low'), r.get('test_high'))}", str(r["n_runs"]),
                 *(",".join(map(str, dict.fromkeys(r[k]))) for k in ("seeds", "observed_seeds"))]
                for r in st.confirm]
        sec.blocks += [Paragraph(
            "Confirmation ('spml study confirm'): each trial re-trained with every training "
            "seed on every single-positive draw; ranked by mean val mAP (test is reported, "
            "never selected on). Standard deviations are sample standard deviations; brackets: "
            "the Student-t 95% interval of the mean over the runs."), Table(
            ["rank", "trial", "search val mAP", "val mAP (mean)", "test mAP (mean ± std)",
             "runs", "seeds", "draws"], crow, id="confirmation")]
        win = st.confirm[0]
        if win.get("refit_epochs") is not None:
            sec.blocks.append(Paragraph(
                f"Refit ('spml study confirm --refit'): trial {win['trial']} re-trained on "
                f"train + val for {win['refit_epochs']} epochs (its median best val epoch), "
                f"then tested: test mAP {_f2(win.get('refit_test_mean'))}"
                f"{_ci(win.get('refit_test_low'), win.get('refit_test_high'))}"
                f" over {len(win.get('refit_test_maps') or [])} runs, against "
                f"{win['test_mean']:.2f} trained on train only."))
    return sec


def _ci(low: float | None, high: float | None) -> str:
    """`` [low, high]``, or "" without a finite interval (one run, or a row from before it)."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return ""
    return f" [{low:.2f}, {high:.2f}]"


def history_section(st: StudyView, fig_dir: Path, options: ReportOptions) -> Section:
    """The optimisation history: val mAP per trial with the best so far."""
    if not any(p.value is not None or p.state == "FAIL" for p in st.points):
        return Section(*SECTIONS[2], [Note("No trial has reported a val mAP yet: nothing to "
                                           "plot.")])
    word = reference_label(st.study)  # "paper" only where a paper gives the values
    path = plots.plot_history(st.points, fig_dir / "history.png",
                              title=f"Optimisation history: {st.study.study_name}", dpi=options.dpi,
                              reference=word)
    return Section(*SECTIONS[2], [Figure(path, (
        "Val mAP of every trial in the order it was asked; the orange line is the best "
        "completed trial so far. Pruned trials are drawn at the best val mAP they reached "
        "before the pruner stopped them; failed trials are ticks on the x axis; the star and "
        f"dashed line are the first trial ({word})."))])


def compute_importances(st: StudyView, options: ReportOptions
                        ) -> tuple[dict[str, float] | None, str]:
    """fANOVA parameter importances of the completed trials, or None and the reason why not."""
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


def importance_section(st: StudyView, imp: dict[str, float] | None, reason: str, fig_dir: Path,
                       options: ReportOptions) -> Section:
    """The parameter importances section from :func:`compute_importances`' result."""
    if imp is None:
        return _skipped(3, reason)
    path = plots.plot_importances(imp, fig_dir / "importance.png", dpi=options.dpi,
                                  title=f"Parameter importance (fANOVA, {len(st.complete)} "
                                        "completed trials)")
    return Section(*SECTIONS[3], [Figure(path, (
        "fANOVA importances (optuna.importance.get_param_importances with "
        "FanovaImportanceEvaluator, seed 0): the share of the variance of val mAP over the "
        "completed trials that each parameter explains, from a random forest fitted to them. "
        "With few trials they are rough.")), Table(["parameter", "importance"], [
            [k, f"{v:.3f}"] for k, v in imp.items()], id="importances")])


def slices_section(st: StudyView, fig_dir: Path, options: ReportOptions) -> Section:
    """The slice plots: val mAP against each parameter."""
    if not st.complete:
        return _skipped(4, "no completed trial to place")
    if not st.axes:
        return _skipped(4, "the study records no searched parameter")
    path = plots.plot_slices(st.points, st.axes, fig_dir / "slices.png", dpi=options.dpi)
    return Section(*SECTIONS[4], [Figure(path, (
        "Val mAP against each searched parameter (log-scale axes where the parameter is "
        "searched log-uniformly); colour is the trial number, so the drift of the sampler "
        "shows. Grey crosses: pruned trials at the best val mAP they reached."))])


def contours_section(st: StudyView, imp: dict[str, float] | None, fig_dir: Path,
                     options: ReportOptions) -> Section:
    """The contour plots of the most important parameter pairs."""
    if len(st.axes) < 2:
        return _skipped(5, "a contour plot needs two searched parameters; the study searches "
                           f"{len(st.axes)}")
    if not st.complete:
        return _skipped(5, "no completed trial to interpolate")
    by_name = {a.name: a for a in st.axes}
    names = sorted(by_name, key=lambda n: -imp.get(n, 0.0)) if imp else list(by_name)
    pairs = [(names[i], names[j]) for i in range(len(names)) for j in range(i + 1, len(names))]
    if imp:  # the pairs whose parameters explain the most variance together
        pairs.sort(key=lambda p: -(imp.get(p[0], 0.0) + imp.get(p[1], 0.0)))
    pairs = [(by_name[a], by_name[b]) for a, b in pairs[: options.max_pairs]]
    path = plots.plot_contours(st.points, pairs, fig_dir / "contours.png", dpi=options.dpi)
    chosen = ("the most important parameters by fANOVA" if imp
              else "the first parameters of the space (no importances)")
    return Section(*SECTIONS[5], [Figure(path, (
        f"Pairs of {chosen}: val mAP of the completed trials, interpolated linearly between "
        "them (Delaunay triangles, only inside their convex hull); dots are trials, the star "
        "is the best one. Sparse regions are guesses."))])


def curves_section(st: StudyView, fig_dir: Path, options: ReportOptions) -> Section:
    """The learning curves: val mAP per epoch of the top trials."""
    if not st.complete:
        return _skipped(6, "no completed trial yet")
    if not any(p.curve for p in st.points if p.state == "COMPLETE"):
        return _skipped(6, "no completed trial reported per-epoch val mAP")
    path = plots.plot_learning_curves(st.points, fig_dir / "learning_curves.png",
                                      top=options.curves, dpi=options.dpi,
                                      reference=reference_label(st.study))
    return Section(*SECTIONS[6], [Figure(path, (
        f"Val mAP per epoch of the {min(options.curves, len(st.complete))} best completed "
        f"trials (and the {reference_label(st.study)} point, dashed), as reported to the "
        "pruner; the circle is each "
        "trial's best epoch, whose head gives its test mAP. Thin grey lines: the other trials, "
        "pruned ones ending where they were stopped."))])


def baseline_section(st: StudyView, ctx: ReportRuns | None, why: str, fig_dir: Path, out: Path,
                     options: ReportOptions) -> tuple[Section, Path | None]:
    """Per-class test AP of the best trial (from the Parquet results) against an AN probe
    (Cole et al. 2021, Eq. 3) trained on the same store with the best trial's training
    settings, training seed and single-positive draw."""
    if ctx is None:
        return _skipped(7, why), None
    best = st.complete[0]
    best_ap = st.results.get(best.number, {}).get("class_ap")
    if not best_ap:
        return _skipped(7, f"the results Parquet ({st.study_dir / 'results'}) holds no "
                           f"per-class AP for the best trial {best.number}"), None
    if len(best_ap) != ctx.data.n_classes:
        return _skipped(7, f"the best trial's per-class AP has {len(best_ap)} classes, the "
                           f"store {ctx.data.n_classes}"), None
    result, cfg, store_path = ctx.an, ctx.an_config, ctx.store_path
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
    trained = result.config  # resolved: AN's own paper setting for the store, else generic
    sec = Section(*SECTIONS[7], [Paragraph(
        f"AN baseline ('an', assume negative, Cole et al. 2021 Eq. 3) trained on {store_path} "
        f"as 'spml probe --loss an' trains it: {trained.get('epochs')} epochs "
        f"({trained.get('epochs_from')}), batch size {trained.get('batch_size')}, lr "
        f"{trained.get('lr'):g} ({trained.get('lr_from')}), Adam, train seed {cfg.seed}, "
        f"single-positive draw {ctx.observed_seed}, {cfg.val_labels} val labels, device "
        f"{trained.get('device')}; "
        "its epoch chosen on val mAP like every trial's. AN: val mAP "
        f"{_f2(an.best.get('val_map'))}, "
        f"test mAP {_f2(an.best.get('test_map'))} (epoch {an.best_epoch}). Best "
        f"trial {best.number}: val mAP {best.value:.2f}, test mAP "
        f"{_f2(best_row.get('test_map'))}. The best trial beats AN on {gains} of {len(diffs)} "
        f"classes; mean per-class difference {mean_diff:+.2f} AP points. Full run: "
        f"{baseline_path.name}."), Figure(path, (
            "Per-class test AP at each model's best val epoch, sorted by the difference (best "
            "trial minus AN, written on the right)."))])
    order = sorted(diffs, key=lambda r: -(r[1] - r[2]))
    if len(order) > options.max_classes:
        half = options.max_classes // 2
        order = order[:half] + order[-half:]
    sec.blocks.append(Table(["class", f"trial {best.number} AP", "AN AP", "difference"],
                            [[n, f"{a:.2f}", f"{b:.2f}", f"{a - b:+.2f}"] for n, a, b in order],
                            id="class-ap"))
    return sec, baseline_path


def _heads_source(ctx: ReportRuns) -> str:
    """Where the intervals' heads came from, as the run did it: kept by the study when its
    trials finished, or re-trained by this report."""
    kept, retrained = len(ctx.kept), len(ctx.trials)
    if not retrained:
        return "the trials' heads as the study kept them when they finished"
    if not kept:
        return "re-trained by this report on the study's store with their own settings"
    return (f"{plural(kept, 'heads')} as the study kept them, {retrained} re-trained by this "
            "report with their own settings")


def comparison_section(st: StudyView, ctx: ReportRuns | None, why: str, fig_dir: Path,
                       options: ReportOptions) -> Section:
    """The top trials, the paper point and the AN baseline: test mAP with 95%
    intervals and every paired difference (studies.results.compare), as a table and a figure."""
    from studies.results.compare import plot

    if ctx is None or ctx.comparison is None:
        return _skipped(8, why or "nothing was re-trained")
    cmp = ctx.comparison
    heads_how = _heads_source(ctx)
    sec = Section(*SECTIONS[8], [Paragraph(
        f"The best {min(INTERVAL_TOP, len(st.complete))} trials by val mAP"
        + (f", the first trial ({reference_label(st.study)})" if st.paper is not None else "")
        + f" and the AN baseline ({heads_how}; training "
        f"seed {st.settings.get('train_seed', 0)}, single-positive draw {ctx.observed_seed}), "
        f"scored on the same {cmp.n_images} test images. Intervals: "
        f"{cmp.n_resamples} paired bootstrap resamples of the test images (class-wise AP "
        "recomputed on each); differences are paired and their p-values Holm-corrected over "
        f"the {len(cmp.pairs)} pairs. They measure test-set variation only, not training "
        "seeds or draws ('spml study confirm').")])
    warning = few_test_images(cmp.n_images)
    if warning:
        sec.blocks.append(Note(warning.removeprefix("warning: ").capitalize(), "warn"))
    rows = [[label, f"{iv.value:.2f}", f"[{iv.low:.2f}, {iv.high:.2f}]"]
            for label, iv in zip(cmp.labels, cmp.intervals)]
    sec.blocks.append(Table(["system", "test mAP", "95% interval"], rows, id="intervals"))
    prow = []
    for p in sorted(cmp.pairs, key=lambda p: p.p_holm):
        a, b, sign = (p.a, p.b, 1) if p.diff.value >= 0 else (p.b, p.a, -1)
        lo, hi = sorted((sign * p.diff.low, sign * p.diff.high))
        verdict = f"{cmp.labels[a]} better" if p.significant else "no clear difference"
        prow.append([f"{cmp.labels[a]} - {cmp.labels[b]}", f"{sign * p.diff.value:+.2f}",
                     f"[{lo:+.2f}, {hi:+.2f}]", f"{p.p_value:.3f}", f"{p.p_holm:.3f}", verdict])
    sec.blocks.append(Table(["pair", "difference", "95% interval", "p", "p (Holm)",
                             "verdict"], prow, id="comparison"))
    drift = [(n, r.trials[0].best.get("test_map"), st.results.get(n, {}).get("test_map"))
             for n, r in ctx.trials.items()]
    drift = [(n, a, b) for n, a, b in drift
             if isinstance(a, float) and isinstance(b, float) and abs(a - b) > 0.01]
    if drift:
        sec.blocks.append(Note("Re-training did not reproduce the study's test mAP exactly "
                               "for " + ", ".join(f"trial {n} ({a:.2f} vs {b:.2f})"
                                                  for n, a, b in drift)
                               + "; the table shows the re-trained heads.", kind="warn"))
    path = plot(cmp, fig_dir / "comparison.png")
    sec.blocks.append(Figure(path, (
        "Left: test mAP with its 95% bootstrap interval. Right: every pairwise difference "
        "(higher minus lower) with its paired interval; red where the Holm-corrected p < 0.05.")))
    return sec
