"""What a study report reads: the study (its storage, trials, search space, results and
confirmations) as one read-only view, and the commands that reproduce the study."""

from __future__ import annotations

import contextlib
import json
import math
import shlex
from dataclasses import MISSING, dataclass, fields
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

from probe.errors import MissingPathError, plain
from studies.plots import ParamAxis, TrialPoint
from studies.results.confirm import load_study
from studies.results.rows import read_results, rows_of_study
from studies.study.storage import find_storage, is_paper_trial, parse_storage, ranked_trials


@dataclass
class StudyView:
    """The study as a report reads it: storage, trials, space, results, confirmations, settings."""
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
        return ranked_trials([t for t in self.trials if t.state == TrialState.COMPLETE])

    @property
    def paper(self) -> FrozenTrial | None:
        return next((t for t in self.trials if is_paper_trial(t)), None)

    @property
    def loss_class(self) -> Any:
        """The study's loss class, or None when no registered loss has its name."""
        from probe.losses import get_loss_class

        with contextlib.suppress(KeyError, ValueError):
            return get_loss_class(self.loss)
        return None


def open_study_view(study_dir: Path, storage: str | None, name: str | None) -> StudyView:
    """Open the study in ``study_dir`` (or ``storage``) as one read-only :class:`StudyView`."""
    if not study_dir.is_dir():
        raise MissingPathError(
            f"STUDY_DIR {study_dir} is not a folder; pass the folder given to 'spml study --out'"
        )
    given = storage is not None
    storage = storage if given else find_storage(study_dir)
    study = load_study(storage, name)  # refuses a storage file that is not there
    trials = study.get_trials(deepcopy=False)
    attrs = study.user_attrs
    notes: list[str] = []
    distributions = _distributions(attrs.get("spml.space"), trials)
    return StudyView(
        study=study, storage=parse_storage(storage).display, storage_given=given,
        study_dir=study_dir, trials=trials,
        points=[trial_point(t) for t in trials],
        axes=[ParamAxis(k, choices=tuple(d.choices)) if isinstance(d, CategoricalDistribution)
              else ParamAxis(k, log=bool(getattr(d, "log", False)))
              for k, d in distributions.items()],
        distributions=distributions,
        results=_read_results(study_dir / "results", study, notes),
        confirm=_read_confirm(study_dir / "confirm.parquet", trials, notes),
        settings=attrs.get("spml.settings") or {}, loss=attrs.get("spml.loss") or "?",
        identity=attrs.get("spml.store") or {}, notes=notes,
    )


def _read_results(directory: Path, study: Any, notes: list[str]) -> dict[int, dict]:
    """Trial number -> results row of ``study`` (its own rows only: :func:`rows_of_study`)."""
    if not directory.is_dir():
        notes.append(f"no results folder {directory}: test mAP and per-class AP are unknown")
        return {}
    frame = read_results(directory)
    mine = rows_of_study(frame, study)
    if frame.height and "study" in frame.columns:
        named = frame.filter(pl.col("study") == study.study_name).height
        if named > mine.height:
            notes.append(
                f"{named - mine.height} results rows in {directory} are of another study named "
                f"'{study.study_name}' (made in another storage, or made again): left out")
    return {int(r["trial"]): r for r in mine.iter_rows(named=True)}


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


def trial_point(t: FrozenTrial) -> TrialPoint:
    """A trial as the plots draw it (params, value, state, learning curve)."""
    iv = t.intermediate_values
    # steps are epochs counted from 1 (studies made before that, from 0); the first epoch first
    curve = tuple(iv.get(e) for e in range(min(iv), max(iv) + 1)) if iv else ()
    finite = [v for v in curve if v is not None and math.isfinite(v)]
    value = None
    if t.state == TrialState.COMPLETE:
        value = t.value
    elif t.state == TrialState.PRUNED and finite:  # a pruned trial: its best epoch so far
        value = max(finite)
    return TrialPoint(t.number, t.state.name, value, dict(t.params), curve,
                      is_paper_trial(t))


def _range(dist: BaseDistribution) -> str:
    if isinstance(dist, CategoricalDistribution):
        return ",".join(plain(c) for c in dist.choices)
    assert isinstance(dist, FloatDistribution | IntDistribution)
    return f"{plain(dist.low)}:{plain(dist.high)}" + (":log" if dist.log else "")


def study_command(settings: dict[str, Any]) -> list[str]:
    """The ``spml study`` command line (argv) that creates this study, from its recorded
    ``spml.settings``: the flags that set a value other than the default, plus the store, loss,
    trial counts and output folder. ``spml study`` parses it back to the same settings."""
    from studies.study.settings import StudySettings

    defaults = {f.name: (f.default if f.default is not MISSING else None)
                for f in fields(StudySettings)}
    s = settings
    argv = ["spml", "study", str(s["store"]), "--loss", str(s["loss"]),
            "--trials", str(s["n_trials"]), "--trials-at-once", str(s["batch"])]
    for key in ("sampler", "pruner", "storage", "name", "seed", "train_seed", "epochs",
                "batch_size", "lr", "val_labels", "observed_seed", "device", "heartbeat_seconds",
                "grace_seconds", "workers", "priors", "select"):
        v = s.get(key)
        if v is not None and v != defaults.get(key):
            argv += ["--" + key.removesuffix("_seconds").replace("_", "-"), plain(v)]
    for k, v in (s.get("fixed") or {}).items():
        argv += ["--set", f"{k}={plain(v)}"]
    for k, v in (s.get("space") or {}).items():
        argv += ["--space", f"{k}={_range(json_to_distribution(json.dumps(v)))}"]
    if s.get("params"):
        argv += ["--params", ",".join(s["params"])]
    for k, values in (s.get("grid") or {}).items():
        argv += ["--grid", f"{k}={','.join(plain(v) for v in values)}"]
    if s.get("search_lr"):
        argv.append("--search-lr")
    for key in ("batch_sizes", "epochs_choices"):
        if s.get(key):
            argv += ["--" + key.replace("_", "-"), ",".join(str(v) for v in s[key])]
    if s.get("enqueue_paper") is False:
        argv.append("--no-paper")
    return [*argv, "--out", str(s["out"])]


def report_commands(st: StudyView, name: str | None, store: str | None, out: Path) -> list[str]:
    """The commands that reproduce the study, its confirmation and this report (``out``)."""
    lines = []
    if st.settings.get("store") and st.settings.get("loss"):
        lines.append(shlex.join(study_command(st.settings)))
    named = ["--name", name] if name else []
    if st.confirm:
        seeds = ",".join(map(str, dict.fromkeys(int(s) for s in st.confirm[0]["seeds"])))
        draws = ",".join(map(str, dict.fromkeys(int(s) for s in st.confirm[0]["observed_seeds"])))
        confirm = ["spml", "study", "confirm", "--storage", st.storage, *named,
                   "--store", str(store or st.settings.get("store", "STORE")),
                   "--top-k", str(len(st.confirm)), "--seeds", seeds, "--observed-seeds", draws,
                   "--out", str(st.study_dir)]
        lines.append(shlex.join(confirm))
    report = ["spml", "report", str(st.study_dir)]
    if st.storage_given:
        report += ["--storage", st.storage]
    report += named
    if store:
        report += ["--store", store]
    report += ["--out", str(out)]
    return [*lines, shlex.join(report)]
