"""``spml compare``: is a difference in test mAP real? Paired bootstrap over test images.

Every system (a trained head: ``spml probe --save-head`` files, a study's winners) is scored on
the same test images; :func:`probe.evaluation.intervals.bootstrap_map` gives each system's mAP an
interval and every pair ``a - b`` a paired interval and p-value, Holm-corrected across the pairs
(docs/protocol.md, "Intervals and comparisons"). :func:`check_comparable` refuses systems from
different stores, builds or splits; heads trained on different draws of one store are compared
(the difference then measures method and draw together) and :func:`draw_note` says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.errors import SpmlError

__all__ = ["CompareError", "Comparison", "System", "check_comparable", "compare_heads",
           "compare_scores", "compare_systems", "disagreement_note", "draw_note",
           "format_comparison", "load_systems", "plot", "split_study_spec", "study_systems",
           "systems_of_study"]


class CompareError(SpmlError):
    """The inputs cannot be compared; the message says which argument and why."""


@dataclass
class System:
    """One compared head: its label, where it came from and what it was trained on."""

    label: str
    path: str
    trial: int
    loss: str
    hparams: dict[str, Any]
    data: dict[str, Any]  # the head's ``data`` record (store path, build, rows, draw)
    head: Any = None  # nn.Linear


@dataclass
class Comparison:
    """mAP with intervals per system and every pairwise difference (Holm-corrected)."""

    labels: list[str]
    intervals: list[Any]  # probe.evaluation.intervals.Interval
    pairs: list[Any]  # probe.evaluation.intervals.PairedDifference
    n_images: int
    n_classes: int
    n_resamples: int
    seed: int
    level: float
    dataset: str = ""
    store: str = ""
    systems: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. the heads' draws differ (draw_note)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "spml-compare/1", "dataset": self.dataset, "store": self.store,
            "n_test_images": self.n_images, "n_classes": self.n_classes,
            "bootstrap": {"n_resamples": self.n_resamples, "seed": self.seed,
                          "level": self.level,
                          "method": ("paired bootstrap over test images: bias-corrected "
                                     "percentile intervals for systems, percentile "
                                     "intervals for differences")},
            "systems": [
                {"label": lab, **sys, "test_map": iv.value, "test_map_low": iv.low,
                 "test_map_high": iv.high}
                for lab, iv, sys in zip(self.labels, self.intervals,
                                        self.systems or [{}] * len(self.labels))
            ],
            "pairs": [
                {"a": self.labels[p.a], "b": self.labels[p.b], "diff": p.diff.value,
                 "diff_low": p.diff.low, "diff_high": p.diff.high, "p_value": p.p_value,
                 "p_holm": p.p_holm, "significant": p.significant}
                for p in self.pairs
            ],
            "notes": self.notes,
        }


def _parse_spec(spec: str) -> tuple[Path, int | None]:
    """``PATH`` (every trial in the file) or ``PATH:TRIAL``."""
    path, _, trial = spec.rpartition(":")
    if path and trial.isdigit() and not Path(spec).exists():
        return Path(path), int(trial)
    return Path(spec), None


def load_systems(specs: Sequence[str]) -> list[System]:
    """Heads saved by ``spml probe --save-head`` (``PATH`` = every trial, ``PATH:T`` = trial T),
    one :class:`System` per head, labelled ``<file>[<trial>] (<loss>)``."""
    import torch

    from probe.engine.results import load_head

    systems: list[System] = []
    for spec in specs:
        path, trial = _parse_spec(spec)
        if not path.is_file():
            raise CompareError(
                f"HEADS: {spec} is neither a file nor a folder; pass head files written by "
                "'spml probe … --save-head PATH' (optionally PATH:TRIAL) or a study folder "
                "('spml study --out DIR')")
        _, meta = load_head(path, 0)
        n = len(meta.get("trials", [])) or int(torch.load(path, map_location="cpu",
                                                          weights_only=True)["weight"].shape[0])
        for t in range(n) if trial is None else [trial]:
            head, meta = load_head(path, t)
            tr = meta["trials"][t] if t < len(meta.get("trials", [])) else {}
            name = path.stem if n == 1 else f"{path.stem}[{t}]"
            loss = meta.get("loss", "?") + (
                " full labels" if meta.get("config", {}).get("labels") == "full" else "")
            systems.append(System(label=f"{name} ({loss})", path=str(path), trial=t, loss=loss,
                                  hparams=dict(tr.get("hparams", {})),
                                  data=dict(meta.get("data", {})), head=head))
    if not systems:
        raise CompareError("HEADS: nothing to compare; pass at least two heads")
    return systems


def split_study_spec(spec: str) -> tuple[str, str | None]:
    """``DIR`` or ``DIR:NAME`` (a study folder and the name of one study in it)."""
    path, sep, name = spec.rpartition(":")
    if sep and path and name and not name.isdigit() and Path(path).is_dir() \
            and not Path(spec).exists():
        return path, name
    return spec, None


def study_systems(study_dir: str | Path, *, top: int = 3, device: str = "cpu",
                  store: str | None = None, name: str | None = None,
                  progress: bool = False) -> list[System]:
    """A study's winners as systems: its ``top`` trials by val mAP and the paper point -- the
    heads the study kept when they finished (``results/heads-*.pt``), else re-trained on its
    store with their own settings, the study's training seed and draw (what the study
    measured; the report's 'Intervals and comparison' does the same). ``name``: the study,
    where the folder's storage holds several. ``progress``: a line per head on stderr, with
    the ETA (probe.progress)."""
    from studies.results.confirm import load_study
    from studies.study.storage import find_storage

    storage = find_storage(study_dir)
    study = load_study(storage, name, flag=f"STUDY_DIR {study_dir}")
    return systems_of_study(study, str(study_dir), top=top, device=device, store=store,
                            progress=progress, heads_dir=Path(study_dir) / "results")


def systems_of_study(study: Any, where: str, *, top: int = 3, device: str = "cpu",
                     store: str | None = None, progress: bool = False,
                     heads_dir: str | Path | None = None) -> list[System]:
    """:func:`study_systems` for an opened Optuna study (``where`` labels its folder; the
    heads it kept are read from ``heads_dir``)."""
    from optuna.trial import TrialState

    from probe.engine.results import to_linear
    from probe.progress import Progress
    from studies.results.confirm import trained_settings, trial_setup
    from studies.results.rows import read_trial_heads, study_tag
    from studies.study.storage import is_paper_trial, ranked_trials, reference_label

    study_dir, loss, settings = where, study.user_attrs.get("spml.loss"), trained_settings(study)
    where = store or settings.get("store")
    if loss is None or not where:
        raise CompareError(f"HEADS: {study_dir} holds a study not made by 'spml study'")
    complete = ranked_trials(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if not complete:
        raise CompareError(f"HEADS: the study in {study_dir} has no completed trial yet")
    if Path(where).exists():  # the one "same store" rule, before anything is trained on it
        from probe.store import open_store
        from studies.results.confirm import check_same_store

        check_same_store(study, open_store(where), "--store")
    chosen = complete[:top]
    chosen += [t for t in complete if is_paper_trial(t) and t not in chosen]
    observed_seed = int(settings.get("observed_seed", 1200))
    seed = int(settings.get("train_seed", 0))
    kept = read_trial_heads(heads_dir, study_tag(study)) if heads_dir is not None else {}
    retrain = [t for t in chosen if t.number not in kept]
    systems = []
    bar = Progress(len(chosen), f"heads of {study.study_name}", "heads", enabled=progress)
    bar.write(f"{len(chosen)} head{'s' if len(chosen) != 1 else ''} of '{study.study_name}': "
              f"{len(chosen) - len(retrain)} kept by the study, {len(retrain)} re-trained with "
              "its settings")
    data = None
    with bar:
        for t in chosen:
            hp, cfg = trial_setup(t.params, loss, settings, seeds=(seed,),
                                  observed_seed=observed_seed, device=device)
            label = f"{study.study_name} trial {t.number}"
            if is_paper_trial(t):  # "paper" only where the paper gives values
                label += f" {reference_label(study)}"
            if t.number in kept:
                w, source = kept[t.number]
                head, how = to_linear(w), "kept by the study"
            else:
                from probe.engine.data import ProbeData
                from probe.engine.train import train_probe

                if data is None:
                    data = ProbeData.from_store(where, device=device,
                                                observed_seed=observed_seed,
                                                priors=settings.get("priors"))
                result = train_probe(data, cfg, loss, [hp], progress=False)
                head, source, how = result.head(0), dict(result.source), "re-trained"
            systems.append(System(label=label, path=str(study_dir), trial=t.number, loss=loss,
                                  hparams=hp, data=dict(source), head=head))
            bar.step(f"  {how} {label}")
    return systems


def draw_note(systems: Sequence[System]) -> str | None:
    """A note where the systems were trained on different draws (seed or kind), else None."""
    from probe.store.records import draw_text
    from studies.results.rows import draw_of

    draws = {s.label: f"draw {s.data.get('observed_seed')}, "
             f"{draw_text(draw_of(s.data) or {'kind': 'protocol'})}" for s in systems}
    if len(set(draws.values())) < 2:
        return None
    return ("note: the heads were trained on different draws of the store's observed labels -- "
            + "; ".join(f"{lab}: {d}" for lab, d in draws.items())
            + ". All are scored on the same fully labelled test images, so each paired "
            "difference measures the method and the draw together (e.g. what a label bias "
            "costs); to compare methods alone, train them on one draw")


def check_comparable(systems: Sequence[System]) -> None:
    """Refuse systems from different stores or splits, naming the first two that differ and
    why it matters (different draws of one store are compared: :func:`draw_note`). "The same
    store" is :func:`studies.results.rows.store_fingerprint` (the store's identity)."""
    from studies.results.rows import store_fingerprint
    if len(systems) < 2:
        raise CompareError(
            f"HEADS: need at least two heads to compare; got {len(systems)} "
            "(a file saved from several stacked trials holds one head per trial)")
    checks = (
        ("store", lambda d: store_fingerprint(d) or (d.get("path"), d.get("completed")),
         "they were trained on different stores (or different builds of one store); a "
         "difference between them mixes data with method"),
        ("split", lambda d: d.get("rows"),
         "their train/val/test splits differ, so they were not tested on the same images"),
    )
    ref = systems[0]
    for what, key, why in checks:
        for s in systems[1:]:
            if key(s.data) != key(ref.data):
                raise CompareError(
                    f"HEADS: cannot compare {ref.label} with {s.label}: different {what} "
                    f"({key(ref.data)!r} vs {key(s.data)!r}); {why}")


def compare_scores(labels: Sequence[str], scores: Any, targets: Any, *, n_resamples: int = 1000,
                   seed: int = 0, level: float = 0.95) -> Comparison:
    """Compare S systems' test scores ``(S, N, C)`` against full labels ``(N, C)``."""
    from probe.evaluation.intervals import bootstrap_map, paired_differences

    if len(labels) != scores.shape[0]:
        raise CompareError(f"labels: {len(labels)} for {scores.shape[0]} systems")
    boot = bootstrap_map(scores, targets, n_resamples=n_resamples, seed=seed, level=level)
    return Comparison(labels=list(labels), intervals=boot.intervals,
                      pairs=paired_differences(boot), n_images=int(scores.shape[1]),
                      n_classes=int(scores.shape[2]), n_resamples=int(n_resamples),
                      seed=int(seed), level=float(level))


def compare_heads(specs: Sequence[str], *, store: str | None = None,
                  labels: Sequence[str] | None = None, n_resamples: int = 1000, seed: int = 0,
                  level: float = 0.95, device: str = "cpu", name: str | None = None,
                  progress: bool = False) -> Comparison:
    """Load heads, check they are comparable, score them on the store's test split (the store
    they record, or ``store``) and compare them. A study folder (``DIR``, or ``DIR:NAME`` for
    one of several studies in it; ``name`` for every folder) stands for its winners."""
    systems: list[System] = []
    for spec in specs:  # a study folder gives its winners, a file its heads
        folder, study_name = split_study_spec(spec)
        if Path(folder).is_dir():
            systems += study_systems(folder, device=device, store=store,
                                     name=study_name or name, progress=progress)
        else:
            systems += load_systems([spec])
    return compare_systems(systems, store=store, labels=labels, n_resamples=n_resamples,
                           seed=seed, level=level, device=device)


def compare_systems(systems: list[System], *, store: str | None = None,
                    labels: Sequence[str] | None = None, n_resamples: int = 1000,
                    seed: int = 0, level: float = 0.95, device: str = "cpu",
                    allow_one: bool = False) -> Comparison:
    """Check ``systems`` are comparable, score them on the store's test split and compare
    them (:func:`compare_heads` after loading); ``allow_one``: one system gets its interval
    and no pair."""
    import torch

    from probe.engine.data import ProbeData
    from probe.evaluation.heads import stacked_logits

    if labels:
        if len(labels) != len(systems):
            raise CompareError(
                f"--label: got {len(labels)} labels for {len(systems)} systems; give one per "
                "head (a file with T trials counts T, a study folder its re-trained trials)")
        for s, lab in zip(systems, labels):
            s.label = lab
    if not (allow_one and len(systems) == 1):
        check_comparable(systems)
    where = store or systems[0].data.get("path")
    if not where:
        raise CompareError("--store: the heads do not record their store; pass --store PATH")
    if not Path(where).exists():
        raise CompareError(f"--store: {where} does not exist (the heads' store); pass --store "
                           "PATH to where it is now")
    data = ProbeData.from_store(where, device=device,
                                observed_seed=int(systems[0].data.get("observed_seed", 0)),
                                flip=False)
    _check_store(systems[0], data.source)
    w = torch.stack([torch.cat([s.head.weight.detach().T, s.head.bias.detach()[None]])
                     for s in systems]).to(data.device).float()
    if w.shape[1] != data.test_x.shape[1] or w.shape[2] != data.n_classes:
        raise CompareError(
            f"--store: the heads map {w.shape[1] - 1} features to {w.shape[2]} classes, the "
            f"store has {data.feature_dim} features and {data.n_classes} classes")
    scores = stacked_logits(data.test_x, w)
    cmp = compare_scores([s.label for s in systems], scores, data.test_labels.bool(),
                         n_resamples=n_resamples, seed=seed, level=level)
    cmp.dataset, cmp.store = data.dataset, str(where)
    cmp.systems = [{"path": s.path, "trial": s.trial, "loss": s.loss, "hparams": s.hparams,
                    "observed_seed": s.data.get("observed_seed"), "draw": s.data.get("draw")}
                   for s in systems]
    note = draw_note(systems)
    cmp.notes = [note] if note else []
    return cmp


def _check_store(system: System, source: dict[str, Any]) -> None:
    """The store the heads are scored on must be the store they were made from (its path may
    differ: a store can be moved): the one "same store" rule,
    :meth:`probe.store.Store.differs_from` on the identity the heads recorded. Heads from
    before stores had an identity are checked by their build and split."""
    recorded = system.data.get("identity")
    if isinstance(recorded, dict):
        from probe.store import open_store

        differs = open_store(source["path"]).differs_from(recorded)
        if differs:
            raise CompareError(
                f"--store: {source.get('path')} is not the store the heads were made from "
                f"({', '.join(differs[:3])}; {system.path}); pass the store the heads were "
                "trained on")
        return
    for what, key in (("build", "completed"), ("split", "rows")):
        if system.data.get(key) != source.get(key):
            raise CompareError(
                f"--store: {source.get('path')} is not the store the heads were made from: "
                f"different {what} ({system.data.get(key)!r} in {system.path} vs "
                f"{source.get(key)!r}); pass the store the heads were trained on")


def _letter(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"S{i + 1}"


def format_comparison(cmp: Comparison) -> str:
    """A table a reader understands without the docs: mAP with intervals, then every pair."""
    from probe.evaluation.intervals import few_test_images

    pct = f"{100 * cmp.level:g}%"
    where = f" on {cmp.dataset}" if cmp.dataset else ""
    width = max(len(lab) for lab in cmp.labels)
    lines = [
        f"Test mAP{where}: {cmp.n_images} test images, {cmp.n_classes} classes. Brackets: "
        f"{pct} interval from {cmp.n_resamples} bootstrap resamples of the test images "
        f"(seed {cmp.seed}).",
    ]
    warning = few_test_images(cmp.n_images)
    if warning:
        lines.append(warning)
    lines += ["", f"     {'system':<{width}}  test mAP  {pct} interval"]
    for i in sorted(range(len(cmp.labels)), key=lambda i: -cmp.intervals[i].value):
        iv = cmp.intervals[i]
        lines.append(f"  {_letter(i)}  {cmp.labels[i]:<{width}}  {iv.value:8.2f}  "
                     f"[{iv.low:.2f}, {iv.high:.2f}]")
    lines += ["", f"Differences (paired on the same images; p-values Holm-corrected over "
              f"{len(cmp.pairs)} pair{'s' if len(cmp.pairs) != 1 else ''}):",
              f"  {'pair':<7}  {'mAP diff':>8}  {pct + ' interval':<18}  {'p':>6}  "
              f"{'p(Holm)':>7}  verdict"]
    for p, a, b, diff, lo, hi in _oriented(cmp.pairs):
        if p.significant:
            verdict = f"{_letter(a)} is better"
        elif lo <= 0 <= hi:
            verdict = "no clear difference (interval contains 0)"
        else:
            verdict = "no clear difference after correction"
        lines.append(f"  {_letter(a)} - {_letter(b)}    {diff:+8.2f}  "
                     f"{f'[{lo:+.2f}, {hi:+.2f}]':<18}  {p_text(p.p_value):>6}  "
                     f"{p_text(p.p_holm):>7}  {verdict}")
    lines += ["", f"'better' means the Holm-corrected p < {1 - cmp.level:.2g}: the difference "
              "is larger than the variation from which test images happen to be in the set. "
              "It says nothing about other training seeds or draws (see 'spml study confirm')."]
    alpha = 1 - cmp.level
    odd = [f"{_letter(p.a)} - {_letter(p.b)}" for p in cmp.pairs
           if (p.p_value < alpha) != (p.diff.low > 0 or p.diff.high < 0)]
    if odd:
        lines += ["", f"note ({', '.join(odd)}): " + disagreement_note(
            alpha, "the verdict column follows the Holm-corrected p")]
    lines += ["", *cmp.notes] if cmp.notes else []
    return "\n".join(lines)


def disagreement_note(alpha: float, follows: str = "the verdict follows the interval") -> str:
    """Why a paired interval and its p value can disagree (one line, for every output), and
    which of the two the output's verdict follows."""
    return (f"the interval and p disagree: the interval is the bootstrap's percentiles of the "
            f"paired difference, p a normal test on the bootstrap's standard error; they part "
            f"near the {alpha:g} threshold when the resampled differences are skewed -- "
            f"{follows}")


def _oriented(pairs: Sequence[Any]) -> list[tuple[Any, int, int, float, float, float]]:
    """The pairs by Holm-corrected p, each as higher minus lower: (pair, a, b, diff, low, high)."""
    oriented = []
    for p in sorted(pairs, key=lambda p: p.p_holm):
        if p.diff.value >= 0:
            a, b, sign = p.a, p.b, 1
        else:  # turned round: the higher system first
            a, b, sign = p.b, p.a, -1
        low, high = sorted((sign * p.diff.low, sign * p.diff.high))
        oriented.append((p, a, b, sign * p.diff.value, low, high))
    return oriented


def p_text(p: float) -> str:
    """A p value as the outputs' columns print it."""
    if not math.isfinite(p):
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def p_phrase(p: float) -> str:
    """A p value as a sentence states it: "p < 0.001", "p = 0.031" (:func:`p_text`'s
    precision)."""
    if math.isfinite(p) and p < 0.001:
        return "p < 0.001"
    return f"p = {p_text(p)}"


def plot(cmp: Comparison, path: str | Path, *, title: str | None = None) -> Path:
    """The comparison figure (:func:`studies.plots.plot_comparison`): intervals per system and
    per pair, significant pairs in colour."""
    from studies.plots import plot_comparison

    maps = [(iv.value, iv.low, iv.high) for iv in cmp.intervals]
    diffs = [(f"{cmp.labels[a]} - {cmp.labels[b]}", diff, lo, hi, p.significant)
             for p, a, b, diff, lo, hi in _oriented(cmp.pairs)]
    where = f" on {cmp.dataset}" if cmp.dataset else ""
    return plot_comparison(cmp.labels, maps, diffs, path, level=cmp.level,
                           title=title or f"Test mAP{where} ({cmp.n_images} images, "
                           f"{cmp.n_resamples} paired bootstrap resamples)")
