"""Multi-seed confirmation: re-run a study's top-k trials over several training seeds and
single-positive draws and report test mAP as mean ± std, the way the papers report results.

The seeds of one trial train stacked (T = number of seeds, identical hyperparameters), so a
confirmation costs about one trial per configuration and draw. The winner is also written as
``best.json`` (``{"loss", "hparams", "train"}``), which ``spml finetune --from-json`` reads.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
import polars as pl
from optuna.trial import TrialState

from probe.evaluation.intervals import mean_interval, mean_std
from probe.io import atomic_write
from probe.store.protocol import PROTOCOL_SEED
from studies.results.rows import store_fingerprint
from studies.study.space import SearchSpace
from studies.study.storage import (
    StudyError,
    best_trial,
    open_existing_storage,
    parse_storage,
    ranked_trials,
)

__all__ = ["ConfirmRow", "confirm_study", "load_study", "refit_winner", "train_plus_val",
           "trained_settings", "trial_setup", "winner"]


@dataclass
class ConfirmRow:
    rank: int
    trial: int
    params: dict[str, Any]
    search_value: float  # val mAP the study saw
    test_mean: float
    test_std: float
    val_mean: float
    n_runs: int
    test_maps: list[float]
    seeds: list[int]
    observed_seeds: list[int]
    # Student-t 95% interval of the mean test mAP over the runs (seeds x draws); NaN for 1 run
    test_low: float = math.nan
    test_high: float = math.nan
    # one per run too (same order as test_maps), and what every run trained with
    val_maps: list[float] = field(default_factory=list)
    study: str | None = None
    loss: str | None = None
    lr: float | None = None
    batch_size: int | None = None
    epochs: int | None = None
    optimizer: str | None = None
    val_labels: str | None = None
    dataset: str | None = None
    store: str | None = None
    store_fingerprint: str | None = None
    spml_version: str | None = None
    # --refit (the winner only): re-trained on train + val for the epochs val selected, the
    # last epoch's test mAP per run (seeds x draws), their mean and Student-t interval
    refit_epochs: int | None = None
    refit_test_maps: list[float] = field(default_factory=list)
    refit_test_mean: float = math.nan
    refit_test_low: float = math.nan
    refit_test_high: float = math.nan


def default_out(storage: str) -> Path:
    """Where ``spml study confirm`` writes without ``--out``: beside the study, i.e. the folder
    of its storage file (where ``spml report STUDY_DIR`` looks for ``confirm.parquet``)."""
    spec = parse_storage(storage)
    if spec.kind == "postgresql":
        raise StudyError(
            "--out: a PostgreSQL study has no folder of its own; pass the folder you give to "
            "'spml report' (e.g. --out runs/coco-gr)"
        )
    return Path(spec.target).expanduser().parent


def load_study(storage: str, name: str | None, flag: str = "--storage",
               name_flag: str = "--name") -> optuna.Study:
    """Open an existing study (the only one in the storage when ``name`` is None). A file
    storage that does not exist is refused (naming ``flag``), never created; a storage of
    several studies asks for one by ``name_flag``."""
    _, opened = open_existing_storage(storage, flag)
    names = [s.study_name for s in optuna.get_all_study_summaries(opened, include_best_trial=False)]
    if not names:
        raise StudyError(f"{flag} {storage}: the storage holds no study; pass the storage "
                         "'spml study' wrote (STUDY_DIR/study.log by default, or study.db)")
    if name is None:
        if len(names) != 1:
            raise StudyError(
                f"{name_flag}: the storage {storage} holds {len(names)} studies "
                f"({', '.join(names) or 'none'}); name one, e.g. {name_flag} {names[0]}"
            )
        name = names[0]
    if name not in names:
        raise StudyError(
            f"{name_flag}: no study '{name}' in {storage} (studies: {', '.join(names) or 'none'})"
        )
    return optuna.load_study(study_name=name, storage=opened)


def confirm_study(study: optuna.Study, store_path: str, *, top_k: int = 3,
                  seeds: Sequence[int] = (0, 1, 2), observed_seeds: Sequence[int] | None = None,
                  out: str | Path | None = None, device: str = "auto",
                  log: Callable[[str], None] | None = None, progress: bool = False,
                  refit: bool = False, results: str | Path | None = None) -> list[ConfirmRow]:
    """Re-train the ``top_k`` best completed trials with every training seed in ``seeds`` on
    every draw in ``observed_seeds`` (default: the draw the study trained on, whatever its kind;
    missing ones are added as draws of the study's kind -- the store's record of the study's
    draw, else the one its ``results`` rows record -- after every check), with the batch size,
    lr and epochs its row in the study's ``results`` folder records (else the study's
    ``spml.training``); returns
    rows ranked by mean val mAP and writes ``confirm.parquet`` and ``best.json`` to ``out``.
    ``refit``: then re-train the winner on train + val for the median best epoch of its runs
    and report the last epoch's test mAP per seed and draw (:func:`refit_winner`)."""
    from probe import __version__
    from probe.engine.data import ProbeData
    from probe.evaluation.selection import train_replicates
    from probe.progress import Progress, plural
    from probe.store import add_draws, open_store
    from probe.store.records import draw_record, draw_text

    log = log or (lambda msg: None)
    as_trained = trained_settings(study)
    studied = int(as_trained.get("observed_seed", PROTOCOL_SEED))
    observed_seeds = [int(s) for s in ([studied] if observed_seeds is None else observed_seeds)]
    if top_k < 1 or not seeds or not observed_seeds:
        raise StudyError("--top-k, --seeds and --observed-seeds must each name at least one")
    loss = _loss(study)
    rows = _study_rows(results, study)  # what its trials' results rows record, read once
    recorded = _recorded_settings(rows)
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not complete:
        raise StudyError(f"study '{study.study_name}' has no completed trial to confirm yet")
    top = ranked_trials(complete)[:top_k]
    store = open_store(store_path)
    check_same_store(study, store, "STORE")
    # the draws follow the study's kind (protocol, label budget or label bias): every check
    # is made before a missing draw is written
    kind = draw_record(store.attrs, studied) if studied in store.observed_seeds() else None
    trained_on = _recorded_draw(rows)
    if kind is not None and trained_on is not None and kind != trained_on:
        raise StudyError(
            f"STORE {store_path}: its draw {studied} is {draw_text(kind)}, but study "
            f"'{study.study_name}' trained on {draw_text(trained_on)}; pass the store the study "
            "trained on")
    kind = kind or trained_on or {"kind": "protocol"}
    for s in observed_seeds:
        if s in store.observed_seeds() and draw_record(store.attrs, s) != kind:
            raise StudyError(
                f"--observed-seeds: draw {s} of {store_path} is "
                f"{draw_text(draw_record(store.attrs, s))}, but the study trained on "
                f"{draw_text(kind)}; confirm on draws of the study's kind (a new seed is added "
                "as one)")
    missing = [s for s in observed_seeds if s not in store.observed_seeds()]
    if missing:
        log(f"adding draws {', '.join(map(str, missing))} to {store_path} as the study's: "
            f"{draw_text(kind)}")
        add_draws(store_path, missing, **draw_options(kind))
    store = open_store(store_path)
    log("draws: " + "; ".join(
        f"{s} ({draw_text(draw_record(store.attrs, s))}"
        + (", the study's)" if s == studied else ")") for s in observed_seeds))
    runs: dict[int, list[tuple[float, float, int, int]]] = {t.number: [] for t in top}
    best_epochs: dict[int, list[int]] = {t.number: [] for t in top}
    ran: dict[int, Any] = {}  # the last ProbeResult of each trial: its resolved settings
    bar = Progress(len(observed_seeds) * len(top), f"confirm {study.study_name}", "run",
                   enabled=progress)
    bar.write(f"confirming the top {plural(len(top), 'trials')} of '{study.study_name}': "
              f"{plural(len(seeds), 'seeds')} x {plural(len(observed_seeds), 'draws')} each")
    # every draw's data, sharing the first's features (they differ in their draws alone)
    replicates = []
    for obs_seed in observed_seeds:
        data = ProbeData.from_store(store, device=device if device != "auto" else "cpu",
                                    observed_seed=obs_seed, priors=as_trained.get("priors"))
        if replicates:
            data = replace(replicates[0], train_observed=data.train_observed,
                                       val_observed=data.val_observed, source=data.source)
        replicates.append(data)
    for trial in top:
        hp, cfg = trial_setup(trial.params, loss, {**as_trained, **recorded.get(
            trial.number, {})}, seeds=seeds, observed_seed=observed_seeds[0], device=device)
        # every seed and draw of the trial in one stacked run
        results = train_replicates(replicates, cfg, loss, [hp] * len(seeds))
        for obs_seed, result in zip(observed_seeds, results):
            ran[trial.number] = result
            for tr, seed in zip(result.trials, seeds):
                if tr.best_epoch is not None:
                    best_epochs[trial.number].append(int(tr.best_epoch))
                runs[trial.number].append((tr.best.get("test_map", math.nan),
                                           tr.best.get("val_map", math.nan), seed, obs_seed))
            done = (f"trial {trial.number} re-trained on draw {obs_seed} "
                    f"({plural(len(seeds), 'seeds')}): test mAP {_fmt(runs[trial.number])}")
            if bar.mode == "off":  # progress off: the line still goes to the log
                bar.update()
                log(done)
            else:
                bar.step(done)
    bar.close()
    rows = []
    for trial in top:
        tests, vals, seeds_run, draws_run = (list(c) for c in zip(*runs[trial.number]))
        res = ran[trial.number]
        mean, std, iv = _stats(tests)
        rows.append(ConfirmRow(
            rank=0, trial=trial.number, params=dict(trial.params),
            search_value=float(trial.value), test_mean=mean, test_low=iv.low, test_high=iv.high,
            test_std=std, val_mean=statistics.fmean(vals), n_runs=len(tests), test_maps=tests,
            seeds=seeds_run, observed_seeds=draws_run, val_maps=vals, study=study.study_name,
            loss=loss, lr=res.trials[0].lr,
            **{k: res.config.get(k) for k in ("batch_size", "epochs", "optimizer", "val_labels")},
            dataset=res.dataset, store=res.source.get("path"),
            store_fingerprint=store_fingerprint(res.source), spml_version=__version__))
    # the winner is chosen on val (mean over seeds); test is reported, never selected on
    rows.sort(key=lambda r: (-r.val_mean, r.trial))
    for i, row in enumerate(rows, 1):
        row.rank = i
    if refit:
        win = next(t for t in top if t.number == rows[0].trial)
        epochs = max(1, round(statistics.median(best_epochs[win.number] or [1])))
        tests = refit_winner(store, loss, win.params,
                             {**as_trained, **recorded.get(win.number, {})}, epochs=epochs,
                             seeds=seeds, observed_seeds=observed_seeds, device=device)
        mean, _, iv = _stats(tests)
        rows[0].refit_epochs, rows[0].refit_test_maps, rows[0].refit_test_mean = epochs, tests, mean
        rows[0].refit_test_low, rows[0].refit_test_high = iv.low, iv.high
        log(f"trial {win.number} re-fitted on train + val for {epochs} epochs: test mAP "
            f"{mean:.2f} over {len(tests)} runs")
    if out is not None:
        _write(Path(out), rows, study)
    return rows


def draw_options(record: dict[str, Any]) -> dict[str, Any]:
    """The :func:`probe.store.add_draws` options that draw another seed of ``record``'s kind."""
    if record["kind"] == "budget":
        return {"k": int(record["k"]), "fraction": float(record["fraction"])}
    if record["kind"] == "bias":
        options: dict[str, Any] = {"bias": record["bias"]}
        if record.get("class_weights") is not None:
            options["weights_by_class"] = record["class_weights"]
        return options
    return {}


def check_same_store(study: optuna.Study, store: Any, flag: str) -> None:
    """Refuse a store that is not the one the study trained on (the one "same store" rule:
    :meth:`probe.store.Store.identity`), naming what differs."""
    recorded = study.user_attrs.get("spml.store")
    if not isinstance(recorded, dict):
        return  # a study made before it recorded its store: nothing to check against
    differs = store.differs_from(recorded)
    if differs:
        shown = ", ".join(differs[:3])
        raise StudyError(
            f"{flag} {store.path}: not the store study '{study.study_name}' trained on ({shown});"
            " pass the study's store (its path is in 'spml report')")


def train_plus_val(data: Any, store: Any) -> Any:
    """``data`` with its val rows added to the train rows (features, flipped features when
    the run uses them, full labels and the same draw's single positives): what a refit
    trains on. Val stays as it was, but no longer measures anything held out."""
    import dataclasses

    import torch

    n = data.n_train
    parts = [data.train_x[:n], data.val_x]
    if data.has_flip:
        val_rows = store.split("val")
        flip = torch.from_numpy(store.features(val_rows, flip=True)).to(data.val_x)
        flip = torch.cat([flip, torch.ones_like(flip[:, :1])], 1)
        parts += [data.train_x[n:], flip]
    return dataclasses.replace(
        data, train_x=torch.cat(parts),
        train_labels=torch.cat([data.train_labels, data.val_labels]),
        train_observed=torch.cat([data.train_observed, data.val_observed]),
        n_train=n + data.val_x.shape[0], train_prior=_prior_plus_val(data.train_prior, store))


def _prior_plus_val(prior: Any, store: Any) -> Any:
    """The train rows' prior followed by the val rows' (docs/priors.md), or None."""
    import dataclasses

    import numpy as np

    if prior is None:
        return None
    val = store.prior(prior.name, rows=store.split("val"))
    return dataclasses.replace(
        prior, scores=np.concatenate([prior.scores, val.scores]),
        extras={k: np.concatenate([v, val.extras[k]]) for k, v in prior.extras.items()})


def refit_winner(store: Any, loss: str, params: dict[str, Any], settings: dict[str, Any], *,
                 epochs: int, seeds: Sequence[int], observed_seeds: Sequence[int],
                 device: str = "auto") -> list[float]:
    """Test mAP of a trial re-trained on train + val (:func:`train_plus_val`) for exactly
    ``epochs`` epochs, one per training seed and draw (the last epoch's head: nothing is left
    to select on)."""
    import dataclasses

    from probe.engine.data import ProbeData
    from probe.engine.train import train_probe
    from probe.evaluation.heads import evaluate_heads

    tests = []
    for obs_seed in observed_seeds:
        data = ProbeData.from_store(store, device=device if device != "auto" else "cpu",
                                    observed_seed=obs_seed, priors=settings.get("priors"))
        data = train_plus_val(data, store)
        hp, cfg = trial_setup(params, loss, settings, seeds=seeds, observed_seed=obs_seed,
                              device=device)
        cfg = dataclasses.replace(cfg, epochs=int(epochs))
        result = train_probe(data, cfg, loss, [hp] * len(seeds), progress=False)
        # the last epoch's heads on test (the run's own selection used the val rows it saw)
        scored = evaluate_heads(data.test_x, data.test_labels.bool(),
                                result.final_heads.to(data.device), cfg.f1_threshold)
        tests += [float(v) for v in scored["map"].tolist()]
    return tests


def winner(study: optuna.Study, trial_number: int | None = None) -> dict[str, Any]:
    """The study's best completed trial (or ``trial_number``) as a winner record:
    ``{"loss", "hparams", "train": {}, "probe_train": {...}, "study": {...}}``.

    ``hparams`` are the loss's (fixed + searched): they carry over to an end-to-end fine-tune.
    The probe's batch size / lr / epochs go to ``probe_train`` for information only: a linear
    head's learning rate is no fine-tuning rate, so ``spml finetune`` uses the paper's."""
    loss, settings = _loss(study), study.user_attrs.get("spml.settings", {})
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if trial_number is not None:
        complete = [t for t in complete if t.number == trial_number]
        if not complete:
            raise StudyError(f"study '{study.study_name}' has no completed trial {trial_number}")
    if not complete:
        raise StudyError(f"study '{study.study_name}' has no completed trial yet")
    best = best_trial(complete)
    loss_hp, train_hp = SearchSpace(loss, {}).split(best.params)
    probe_train = {k: settings.get(k) for k in ("batch_size", "epochs", "lr")
                   if settings.get(k) is not None}
    probe_train.update(train_hp)
    return {"loss": loss, "hparams": {**settings.get("fixed", {}), **loss_hp}, "train": {},
            "probe_train": probe_train,
            "study": {"name": study.study_name, "trial": best.number, "val_map": best.value}}


def trained_settings(study: optuna.Study) -> dict[str, Any]:
    """The settings the study's trials trained with: its spml.settings, overridden by what it
    fixed at creation (spml.training, resolved then); a searched train.* parameter of a trial
    takes its place in :func:`trial_setup`."""
    settings = study.user_attrs.get("spml.settings", {})
    trained = study.user_attrs.get("spml.training") or {}
    return {**settings, **{k: v for k, v in trained.items() if v != "searched"}}


def trial_setup(params: dict[str, Any], loss: str, settings: dict[str, Any], *,
                seeds: Sequence[int], observed_seed: int, device: str = "auto"
                ) -> tuple[dict[str, Any], Any]:
    """A study trial's loss hyperparameters (fixed ones included; lr when searched) and the
    :class:`probe.engine.config.ProbeConfig` that re-trains it with every seed in ``seeds``."""
    from probe.engine.config import ProbeConfig

    loss_hp, train_hp = SearchSpace(loss, {}).split(params)
    hp = {**settings.get("fixed", {}), **loss_hp}
    if "lr" in train_hp:  # a searched lr goes with the trial
        hp["lr"] = train_hp["lr"]
    cfg = ProbeConfig(
        batch_size=train_hp.get("batch_size", settings.get("batch_size")),
        epochs=train_hp.get("epochs", settings.get("epochs")), lr=settings.get("lr"),
        seeds=tuple(int(s) for s in seeds), val_labels=settings.get("val_labels", "clean"),
        observed_seed=observed_seed, device=device,
        priors=settings.get("priors"),  # the store prior the study trained with (docs/priors.md)
    )
    return hp, cfg


def _study_rows(results: str | Path | None, study: optuna.Study) -> pl.DataFrame:
    """The study's own results rows in the folder ``results`` (:func:`rows_of_study`); none
    where there is no such folder."""
    from studies.results.rows import read_results, rows_of_study

    if results is None or not Path(results).is_dir():
        return pl.DataFrame()
    return rows_of_study(read_results(results), study)


def _recorded_settings(rows: pl.DataFrame) -> dict[int, dict[str, Any]]:
    """Batch size, lr and epochs each trial's results row records it trained with."""
    if not rows.height or "lr" not in rows.columns:
        return {}
    recorded = {}
    for row in rows.iter_rows(named=True):
        got = {k: row.get(k) for k in ("batch_size", "lr", "epochs") if row.get(k) is not None}
        if got:
            recorded[int(row["trial"])] = got
    return recorded


def _recorded_draw(rows: pl.DataFrame) -> dict[str, Any] | None:
    """The draw record (probe.store.records.draw_record) the study's results rows say its
    trials trained on, or None (no rows, or rows from before draws were recorded)."""
    if not rows.height or "draw" not in rows.columns:
        return None
    for text in rows["draw"].drop_nulls():
        return json.loads(text)
    return None


def _loss(study: optuna.Study) -> str:
    loss = study.user_attrs.get("spml.loss")
    if loss is None:
        raise StudyError(f"study '{study.study_name}' was not made by spml study (no spml.loss)")
    return loss


def _stats(tests: list[float]) -> tuple[float, float, Any]:
    """Mean, standard deviation (0 for one run) and Student-t interval of the mean."""
    return (*mean_std(tests), mean_interval(tests))


def _fmt(runs: list[tuple[float, float, int, int]]) -> str:
    tests = [r[0] for r in runs]
    mean, std, iv = _stats(tests)
    ci = f", 95% interval of the mean [{iv.low:.2f}, {iv.high:.2f}]" if len(tests) > 1 else ""
    return f"{mean:.2f} ± {std:.2f} ({len(tests)} runs{ci})"


def _write(out: Path, rows: list[ConfirmRow], study: optuna.Study) -> None:
    from probe.engine.results import write_json_atomic

    frame = pl.DataFrame([{**asdict(r), "params": json.dumps(r.params, sort_keys=True)}
                          for r in rows])
    atomic_write(out / "confirm.parquet", frame.write_parquet)
    best = rows[0]
    record = winner(study, best.trial)
    record["confirmed"] = {k: getattr(best, k) for k in ("test_mean", "test_std", "test_low",
                                                         "test_high", "n_runs", "trial")}
    if best.refit_epochs is not None:
        record["confirmed"]["refit"] = {
            **{k: getattr(best, f"refit_{k}") for k in ("epochs", "test_mean", "test_low",
                                                        "test_high", "test_maps")},
            "trained_on": "train + val"}
    write_json_atomic(out / "best.json", record)  # what spml finetune --from-json reads
