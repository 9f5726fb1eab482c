"""The runs a study report compares against, trained on the study's store: the AN baseline
(Cole et al. 2021, Eq. 3) with the best trial's training settings, and the best few trials and
the paper point with their own, for their test-mAP intervals. ``st``: the report's
:class:`~studies.report.data.StudyView`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from probe.store.protocol import PROTOCOL_SEED

__all__ = ["INTERVAL_TOP", "ReportRuns", "find_store", "study_provenance", "study_training",
           "train_report_runs"]

# trials re-trained for test-mAP intervals: the best few by val mAP (plus the paper point)
INTERVAL_TOP = 3


def study_training(st: Any) -> dict[str, Any]:
    """The training settings the study's trials used: what the results rows record each trial
    trained with (the best trial's, else the first row's), else as given, else the loss's paper
    preset for the dataset, else the generic linear-probe values (probe.engine.train's resolution).
    Values that differ between the rows (a study from before settings were part of its
    identity) are listed in ``mixed``."""
    from probe.engine.config import resolve_training

    s = st.settings
    settings = resolve_training(st.loss_class, st.identity.get("dataset", ""),
                                batch_size=s.get("batch_size"), lr=s.get("lr"),
                                epochs=s.get("epochs")).to_dict()
    rows = [r for r in st.results.values() if r.get("lr") is not None]
    best = st.results.get(st.complete[0].number) if st.complete else None
    if best is not None and best.get("lr") is not None:
        row = best
    else:  # the best trial recorded none: any trial that did
        row = rows[0] if rows else {}
    settings["mixed"] = {}
    for key in ("batch_size", "lr", "epochs"):
        if row.get(key) is None:
            continue
        settings[key], settings[f"{key}_from"] = row[key], "recorded with the trials"
        seen = sorted({r[key] for r in rows if r.get(key) is not None})
        if len(seen) > 1 and f"train.{key}" not in st.distributions:
            settings["mixed"][key] = seen
    return settings


def study_provenance(st: Any) -> dict[str, Any]:
    for row in st.results.values():
        if row.get("provenance"):
            try:
                return json.loads(row["provenance"])
            except (TypeError, ValueError):
                continue
    return {}


@dataclass
class ReportRuns:
    """What the report trains on the study's store: the AN baseline and, for intervals, the
    best few trials (and the paper point) re-trained with their own settings and seed."""

    store_path: str
    data: Any  # probe.engine.data.ProbeData
    an_config: Any  # probe.engine.config.ProbeConfig
    an: Any  # probe.engine.results.ProbeResult
    observed_seed: int
    trials: dict[int, Any] = field(default_factory=dict)  # number -> ProbeResult (1 trial)
    comparison: Any = None  # studies.results.compare.Comparison over trials + AN
    intervals: dict[int, Any] = field(default_factory=dict)  # number -> Interval
    kept: list[int] = field(default_factory=list)  # trials scored with the head the study kept


def train_report_runs(st: Any, store_arg: str | None, *, device: str = "auto",
                      baseline: bool = True, progress: bool = False,
                      log: Callable[[str], None] = lambda msg: None
                      ) -> tuple[ReportRuns | None, str]:
    """Train the AN baseline and re-train the top trials on the study's store; the reason
    when it cannot (no completed trial, no or another store, baseline turned off)."""
    if not baseline:
        return None, "the AN baseline was turned off (--no-baseline)"
    if not st.complete:
        return None, "no completed trial to compare"
    store_path, why = find_store(st, store_arg)
    if store_path is None:
        return None, why
    from probe.engine.config import ProbeConfig
    from probe.engine.data import ProbeData
    from probe.engine.train import train_probe
    from probe.store import open_store

    try:
        store = open_store(store_path)
    except (ValueError, FileNotFoundError) as err:
        return None, f"the store {store_path} cannot be opened: {err}"
    differ = store.differs_from(st.identity)  # the one "same store" rule (probe.store)
    if differ:
        return None, (f"the store {store_path} is not the one the study trained on "
                      f"({', '.join(differ[:3])}; study vs store); pass the right one with "
                      "--store")
    s = st.settings
    observed_seed = int(s.get("observed_seed", PROTOCOL_SEED))
    # the baseline as 'spml probe --loss an' trains it: AN's own paper setting for the store,
    # else the generic one -- not the study's tuned lr -- on the study's draw, val labels, seed
    cfg = ProbeConfig(seed=int(s.get("train_seed", 0)), val_labels=s.get("val_labels", "clean"),
                      observed_seed=observed_seed, device=device)
    data = ProbeData.from_store(store, device=device, observed_seed=observed_seed,
                                priors=s.get("priors"))  # for the re-trained trials
    result = train_probe(data, cfg, "an", [{}], progress=progress)
    trained = result.config
    log(f"trained the AN baseline on {store_path} as 'spml probe --loss an' trains it: "
        f"{trained.get('epochs')} epochs, batch size {trained.get('batch_size')}, lr "
        f"{trained.get('lr'):g}")
    out = ReportRuns(store_path=store_path, data=data, an_config=cfg, an=result,
                     observed_seed=observed_seed)
    _retrain_top(st, out, device, log, progress)
    return out, ""


def _retrain_top(st: Any, ctx: ReportRuns, device: str, log: Callable[[str], None],
                 progress: bool = False) -> None:
    """The heads of the best :data:`INTERVAL_TOP` trials and the paper point -- those the study
    kept when each trial finished (``results/heads-*.pt``), the others re-trained with their
    own settings and the study's training seed -- then bootstrap their test mAP with the AN
    baseline's, paired over the test images (probe.evaluation.intervals)."""
    import torch

    from probe.engine.train import train_probe
    from probe.evaluation.heads import stacked_logits
    from probe.progress import Progress
    from studies.results.compare import compare_scores
    from studies.results.confirm import trained_settings, trial_setup
    from studies.results.rows import read_trial_heads, study_tag
    from studies.study.storage import reference_label

    chosen = list(st.complete[:INTERVAL_TOP])
    paper = st.paper
    if paper is not None and paper.state == TrialState.COMPLETE and paper not in chosen:
        chosen.append(paper)
    seed = int(st.settings.get("train_seed", 0))
    # the heads this study kept, if any (never another study's of the same folder)
    kept = read_trial_heads(st.study_dir / "results", study_tag(st.study))
    ctx.kept = [t.number for t in chosen if t.number in kept]
    heads: dict[int, Any] = {n: kept[n][0] for n in ctx.kept}
    retrain = [t for t in chosen if t.number not in kept]
    if ctx.kept:
        log(f"the intervals' heads: {len(ctx.kept)} kept by the study, {len(retrain)} re-trained")
    bar = Progress(len(retrain), "re-training for the intervals", "heads",
                   enabled=progress and bool(retrain))
    with bar:
        for t in retrain:
            hp, cfg = trial_setup(t.params, st.loss, trained_settings(st.study), seeds=(seed,),
                                  observed_seed=ctx.observed_seed, device=device)
            if not progress:
                log(f"re-training trial {t.number} for its test-mAP interval")
            ctx.trials[t.number] = train_probe(ctx.data, cfg, st.loss, [hp], progress=False)
            heads[t.number] = ctx.trials[t.number].best_heads[0]
            bar.step(f"  re-trained trial {t.number} for its test-mAP interval")
    numbers = [t.number for t in chosen]
    word = reference_label(st.study)  # "paper" or "defaults"
    labels = [f"trial {n}" + (f" ({word})" if paper is not None and n == paper.number else "")
              for n in numbers] + ["AN baseline"]
    w = torch.stack([heads[n].float().to(ctx.data.device) for n in numbers]
                    + [ctx.an.best_heads[0].float().to(ctx.data.device)])
    cmp = compare_scores(labels, stacked_logits(ctx.data.test_x, w), ctx.data.test_labels.bool())
    cmp.dataset, cmp.store = st.identity.get("dataset", ""), ctx.store_path
    ctx.comparison = cmp
    ctx.intervals = dict(zip(numbers, cmp.intervals))


def find_store(st: Any, store_arg: str | None) -> tuple[str | None, str]:
    if store_arg is not None:
        if Path(store_arg).exists():
            return store_arg, ""
        return None, f"--store {store_arg} does not exist"
    recorded = [p for p in (st.settings.get("store"), study_provenance(st).get("path")) if p]
    for p in recorded:
        if Path(p).exists():
            return str(p), ""
    if recorded:
        return None, (f"the AN baseline trains on the study's feature store, recorded as "
                      f"{' and '.join(dict.fromkeys(map(str, recorded)))}, which is not here; "
                      "pass it with --store")
    return None, "the study records no feature store; pass it with --store"
