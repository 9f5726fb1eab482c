"""The rows, the checks and the cells of ``spml table`` (:mod:`studies.table`): a cell is one
method on one store and draw, keyed by a hash of its resolved settings, so a rerun reads an
unchanged cell back from ``--out`` instead of training it (docs/tables.md)."""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probe.errors import plain

from .errors import TableError

if TYPE_CHECKING:
    from .grid import Grid

__all__ = ["Cell", "Column", "Method", "TableConfig", "TableError", "build_table", "plan_table"]

CELL_FORMAT = "spml-table-cell/1"
ORACLE_LOSS = "an"  # the full-label oracle: BCE on every label of the train rows (Cole et al.)


@dataclass(frozen=True)
class TableConfig:
    """What ``spml table`` builds (the stores are passed apart)."""

    losses: tuple[str, ...] | None = None  # None: every registered loss at its paper preset
    include_full: bool = False  # add the full-label oracle (AN on all labels of the train rows)
    observed_seeds: tuple[int, ...] | None = None  # None: every draw each store holds
    priors: str | None = None  # a store prior: the prior-reading losses and the zero-shot row
    tune: int = 0  # trials of one equal-budget study per loss (0: no tuned rows)
    grid: Grid | None = None  # --tune grid: the grid each loss row's setting is chosen from,
    # per draw on val (None: the rows' paper presets)
    tune_batch: int = 8  # a tuning study's trials trained stacked at once (spml study's)
    select: str = "val"  # how a tuning study scores a trial (spml study --select)
    from_studies: tuple[str, ...] = ()  # study folders whose winner becomes a row
    seed: int = 0  # every cell's training seed (init + batch order); the tuning sampler's too
    epochs: int | None = None  # None: each loss's paper preset (else the generic setting)
    batch_size: int | None = None  # None: as epochs
    lr: float | None = None  # None: as epochs
    out: str | None = None  # where cells are kept (resumable); None: nothing is kept
    device: str = "auto"
    resamples: int = 1000  # bootstrap resamples of the test images behind the marks
    level: float = 0.95  # interval coverage; marks at 1 - level
    metrics: tuple[str, ...] = ("map",)  # one table per metric (probe.metrics.METRIC_DIRECTIONS)
    stat: str = "interval"  # beside the mean: its interval, or "std" (the papers' mean ± std)
    # a row's draws train as one stacked run (draws x the trials on one pass over the batches,
    # equal to one run per cell within float rounding); False: one run per cell, the reference
    stack: bool = True

    def validate(self) -> None:
        if self.tune < 0:
            raise TableError(f"--tune must be a number of trials >= 1 (or 0: none); got "
                             f"{self.tune}")
        if self.tune and self.grid is not None:
            raise TableError("--tune: a number of trials (an Optuna study per loss) or grid "
                             "(the equal grid), not both")
        if self.grid is not None:
            self.grid.validate()
            given = [flag for flag, v in (("--batch-size", self.batch_size), ("--lr", self.lr))
                     if v is not None]
            if given:
                raise TableError(f"{given[0]} with --tune grid: the grid chooses the batch size "
                                 "and lr of every loss row; set its values with --grid "
                                 "batch_size=... lr=... instead")
        if self.tune and not self.out:
            raise TableError("--tune needs --out DIR: the tuning studies are kept there "
                             "(a rerun continues them)")
        if self.resamples < 100:
            raise TableError(f"--resamples: at least 100 for a 95% interval; got "
                             f"{self.resamples}")
        if not 0.5 <= self.level < 1.0:
            raise TableError(f"--level: a coverage in [0.5, 1), e.g. 0.95; got {self.level}")
        from probe.metrics import METRIC_DIRECTIONS

        unknown = [m for m in self.metrics if m not in METRIC_DIRECTIONS]
        if unknown or not self.metrics:
            raise TableError(f"--metrics: names from {', '.join(METRIC_DIRECTIONS)}; got "
                             f"{', '.join(unknown) or 'none'}")
        if self.stat not in ("interval", "std"):
            raise TableError(f"--stat: interval or std; got {self.stat!r}")
        for flag, v in (("--epochs", self.epochs), ("--batch-size", self.batch_size)):
            if v is not None and v < 1:
                raise TableError(f"{flag} must be a positive integer; got {v}")
        if self.lr is not None and not (0 < self.lr < math.inf):
            raise TableError(f"--lr must be a positive number; got {self.lr}")


@dataclass(frozen=True)
class Method:
    """A row: a loss with the settings it is given (empty: its paper preset), or the zero-shot
    prior (``loss`` None)."""

    label: str
    kind: str  # preset | grid | oracle | tuned | study | zero-shot
    loss: str | None
    hparams: dict[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    lr: float | None = None
    epochs: int | None = None
    labels: str = "observed"
    priors: str | None = None
    weight_decay: float | None = None  # None: ProbeConfig's (0)
    val_labels: str = "clean"  # a study's row keeps the val labels its study selected on
    store_identity: dict[str, Any] | None = None  # a study's row: the store it trained on

    def probe_config(self, observed_seed: int, config: TableConfig) -> Any:
        """The :class:`probe.ProbeConfig` of this row on draw ``observed_seed``."""
        from probe.engine.config import ProbeConfig

        wd = {} if self.weight_decay is None else {"weight_decay": self.weight_decay}
        return ProbeConfig(batch_size=self.batch_size, lr=self.lr, epochs=self.epochs,
                           seed=config.seed, **wd, labels=self.labels, observed_seed=observed_seed,
                           device=config.device, priors=self.priors,
                           val_labels=self.val_labels)

    def command(self, store: str, observed_seed: int, config: TableConfig) -> str:
        """The ``spml probe`` command that trains this row's cell on ``store`` and draw
        ``observed_seed`` (the same settings, hence the same test mAP)."""
        if self.loss is None:
            return ""
        parts = ["spml probe", shlex.quote(store), "--loss", self.loss]
        for flag, v in (("--labels", "full" if self.labels == "full" else None),
                        ("--val-labels", None if self.val_labels == "clean" else self.val_labels),
                        ("--priors", self.priors or None), ("--batch-size", self.batch_size),
                        ("--lr", self.lr), ("--weight-decay", self.weight_decay),
                        ("--epochs", self.epochs)):
            if v is not None:
                parts += [flag, plain(v)]
        for k in sorted(self.hparams):
            parts += ["--set", f"{k}={plain(self.hparams[k])}"]
        parts += ["--observed-seed", str(observed_seed), "--seed", str(config.seed)]
        if config.device != "auto":
            parts += ["--device", config.device]
        return " ".join(parts)


@dataclass
class Column:
    """A store: its path as given, dataset name (the column's title), draws and fingerprint."""

    path: str
    dataset: str
    draws: tuple[int, ...]
    fingerprint: str
    class_names: list[str]
    prior_test_scores: Any = None  # (N_test, C) the prior at the test rows (zero-shot row)
    prior_record: dict[str, Any] | None = None  # the prior's provenance and data hash (keys)
    draw_records: dict[int, dict[str, Any]] = field(default_factory=dict)  # seed -> record
    identity: dict[str, Any] = field(default_factory=dict)  # the store's (probe.store)


@dataclass
class Cell:
    """One method on one store and draw: its key, resolved settings and results."""

    method: Method
    column: Column
    observed_seed: int
    key: str
    settings: dict[str, Any]
    command: str
    record: dict[str, Any] | None = None  # the probe run's record (None: zero-shot)
    head: Any = None  # (D+1, C) the best-val head (None: zero-shot)
    test_map: float = math.nan
    val_map: float = math.nan
    trained: bool = False  # trained by this run (else read back from --out, or no training)


@dataclass
class Plan:
    """Everything checked: the columns, the rows before tuning, the resolved settings of each
    (column, row) and the tuning studies to run."""

    config: TableConfig
    columns: list[Column]
    methods: list[Method]
    settings: dict[tuple[int, int], dict[str, Any]]  # (column, method) -> resolved settings
    notes: list[str]
    study_settings: list[tuple[int, str, Any]]  # (column, loss, StudySettings)
    per_column: dict[tuple[int, int], Method] = field(default_factory=dict)  # a tuned row's
    # winner on each column (its own study's)

    def method_at(self, i: int, j: int) -> Method:
        """Row ``j``'s method on column ``i``."""
        return self.per_column.get((i, j), self.methods[j])


def cell_key(settings: dict[str, Any]) -> str:
    """A cell's key: the hash of its resolved settings (a changed setting is a new cell)."""
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _loss_names(config: TableConfig) -> tuple[list[str], list[str]]:
    from probe import losses as _losses

    known = _losses.available()
    notes = []
    if config.losses is None:
        names = [n for n in known if config.priors or _losses.get_loss_class(n).prior is None]
        skipped = [n for n in known if n not in names]
        if skipped:
            notes.append(f"{', '.join(skipped)} read a store prior: pass --priors NAME for "
                         "their rows and the zero-shot row")
        return names, notes
    names = list(dict.fromkeys(config.losses))
    for n in names:
        if n not in known:
            raise TableError(f"--losses: unknown loss {n!r}; expected names from 'spml losses "
                             f"list' ({', '.join(known)}), or all")
        if _losses.get_loss_class(n).prior is not None and not config.priors:
            raise TableError(f"--losses: {n} reads a store prior; pass --priors NAME (one of "
                             "the store's priors: 'spml info STORE' lists them), or drop it")
    return names, notes


def _columns(paths: Sequence[str], config: TableConfig) -> list[Column]:
    from probe.store import PROTOCOL_SEED, open_store
    from probe.store.priors import prior_names
    from probe.store.records import draw_record, draw_text
    from studies.results.rows import store_fingerprint

    if not paths:
        raise TableError("STORE: give one or more feature stores (one column each)")
    columns: list[Column] = []
    for path in paths:
        if not Path(path).exists():
            raise TableError(f"STORE {path}: no such store; pass a store from 'spml import' or "
                             "'spml featurize'")
        store = open_store(path)
        have = store.observed_seeds()
        records = {s: draw_record(dict(store.attrs), s) for s in have}
        protocol = [s for s in have if records[s]["kind"] == "protocol"]
        # default: the protocol's single-positive draws only, the literature's first (the
        # oracle trains on it); label-budget and label-bias draws are other experiments
        draws = (tuple(config.observed_seeds) if config.observed_seeds
                 else tuple(sorted(protocol, key=lambda s: (s != PROTOCOL_SEED, s))))
        missing = [d for d in draws if d not in have]
        if missing:
            raise TableError(
                f"--observed-seeds: {path} holds the draws {','.join(map(str, have))}, not "
                f"{','.join(map(str, missing))}; add them first ('spml draw {path} --seeds "
                f"{missing[0]}') or ask for the ones it holds")
        other = [d for d in draws if records[d]["kind"] != "protocol"]
        if other:
            raise TableError(
                f"--observed-seeds: draw {other[0]} of {path} is {draw_text(records[other[0]])}, "
                "not a single-positive draw of the protocol; a table averages protocol draws "
                f"only (this store's: {','.join(map(str, protocol)) or 'none'}). Compare label "
                "budgets with 'spml analyze label-budget', or add protocol draws with 'spml "
                f"draw {path} --seeds N'")
        if config.priors and config.priors not in prior_names(store):
            held = ", ".join(prior_names(store)) or "none"
            raise TableError(f"--priors: {path} holds no prior {config.priors!r} (it holds "
                             f"{held}); add it with 'spml import priors' or drop --priors")
        source = {"kind": "store", "identity": store.identity()}
        col = Column(str(path), store.dataset, draws, store_fingerprint(source) or "",
                     list(store.class_names),
                     draw_records={d: records[d] for d in draws},
                     identity=json.loads(json.dumps(store.identity(), default=str)))
        for other in columns:
            if other.dataset == col.dataset:
                same = other.class_names == col.class_names
                raise TableError(
                    f"STORE: {other.path} and {path} are both '{col.dataset}' "
                    f"({'the same class set' if same else 'with different class sets'}); one "
                    "column per dataset: give one store per dataset")
        if config.priors:
            col.prior_test_scores = store.prior(config.priors, rows=store.split("test")).scores
            col.prior_record = prior_record(store, config.priors)
        columns.append(col)
    return columns


def prior_record(store: Any, name: str) -> dict[str, Any]:
    """What identifies a store's prior in a cell's key: its name, provenance and a hash of its
    scores and extras (a prior overwritten under the same name is another prior)."""
    prior = store.prior(name)
    digest = hashlib.sha256(prior.scores.tobytes())
    for key in sorted(prior.extras):
        digest.update(key.encode())
        digest.update(prior.extras[key].tobytes())
    return {"name": name, "provenance": prior.provenance, "sha256": digest.hexdigest()[:16]}


def plan_table(paths: Sequence[str], config: TableConfig) -> Plan:
    """Check every input and resolve every (column, row)'s settings; raises
    :class:`TableError` (or the engine's own error naming the flag) before any training or
    write."""
    from probe import losses as _losses
    from studies.study.settings import StudySettings, open_study_store, preflight

    config.validate()
    if config.out and Path(config.out).exists() and not Path(config.out).is_dir():
        raise TableError(f"--out {config.out}: a file; pass a folder (it keeps the cells)")
    names, notes = _loss_names(config)
    columns = _columns(paths, config)
    given = {"batch_size": config.batch_size, "lr": config.lr, "epochs": config.epochs}
    priors = {n: config.priors if _losses.get_loss_class(n).prior is not None else None
              for n in names}  # the store prior each loss reads (None: none)
    methods = []
    if config.include_full:
        methods.append(Method(f"{ORACLE_LOSS}, full labels (oracle)", "oracle", ORACLE_LOSS,
                              labels="full", **given))
    if config.priors:
        methods.append(Method(f"zero-shot ({config.priors})", "zero-shot", None,
                              priors=config.priors))
    if config.grid is None:
        methods += [Method(n, "preset", n, priors=priors[n], **given) for n in names]
    else:
        # --tune grid: every loss row's batch size, lr and weight decay chosen per draw
        methods += [Method(n, "grid", n, priors=priors[n], epochs=config.grid.epochs)
                    for n in names]
        oracle = "; the oracle keeps its preset" if config.include_full else ""
        notes.append(f"loss rows selected by the grid ({config.grid.text()}): each draw's cell "
                     f"is the grid setting with the best val mAP on that draw, of "
                     f"{config.grid.size} trained per loss and draw, the same for every loss"
                     f"{oracle}")
    methods += [_study_method(folder, config) for folder in config.from_studies]
    for m in methods:
        for col in columns:
            if m.store_identity is not None and m.store_identity != col.identity:
                raise TableError(
                    f"--from: the study of row '{m.label}' trained on another store than "
                    f"{col.path} ({m.store_identity.get('dataset')}, created "
                    f"{m.store_identity.get('created')}); a --from row goes with its own "
                    "study's store only")
    # --tune: one equal budget for every loss -- the same trials, sampler and seed, the lr
    # searched for all (or, given --lr, for none), and no pruning (a pruner would give the
    # losses different numbers of epochs)
    study_settings = [] if not config.tune else [(i, n, StudySettings(
        store=col.path, loss=n, n_trials=config.tune, seed=config.seed,
        batch=min(config.tune_batch, config.tune), name=f"table-{col.dataset}-{n}",
        out=str(Path(config.out or ".") / "studies" / f"{col.dataset}-{n}"),
        train_seed=config.seed, select=config.select, observed_seed=col.draws[0],
        device=config.device, epochs=config.epochs, batch_size=config.batch_size, lr=config.lr,
        search_lr=config.lr is None, pruner="none",
        priors=priors[n])) for i, col in enumerate(columns) for n in names]
    for _, _, s in study_settings:
        preflight(s, open_study_store(s.store))  # what run_study checks, up front
    settings = {}
    for i, col in enumerate(columns):
        data = _load(col, col.draws[0], config)
        settings.update({(i, j): resolve_settings(m, col, data, config, notes)
                         for j, m in enumerate(methods)})
    return Plan(config, columns, methods, settings, notes, study_settings)


def _load(col: Column, draw: int, config: TableConfig) -> Any:
    from probe.devices import resolve_device
    from probe.engine.data import ProbeData

    return ProbeData.from_store(col.path, device=resolve_device(config.device),
                                observed_seed=draw, priors=config.priors)


def resolve_settings(m: Method, col: Column, data: Any, config: TableConfig,
                     notes: list[str] | None = None) -> dict[str, Any]:
    """A row's resolved settings on a column (all but the draw): what its cells' keys hash.
    Refuses, as ``spml probe`` would, settings the engine cannot train."""
    base = {"format": CELL_FORMAT, "store": col.fingerprint, "dataset": col.dataset}
    if m.loss is None:
        return {**base, "kind": "zero-shot", "priors": m.priors, "prior": col.prior_record}
    from probe.engine.trials import plan_trials

    plan = plan_trials(data, m.probe_config(col.draws[0], config), m.loss, [dict(m.hparams)])
    t = plan.training
    if notes is not None and m.kind == "preset" and "generic" in t.sources.get("epochs", ""):
        _note_generic(notes, m.loss, col.dataset, f"batch {t.batch_size}, lr {t.lr:g}, "
                      f"{t.epochs} epochs")
    resolved = trained_config(m.probe_config(col.draws[0], config))
    settings = {**base, "kind": "probe", "loss": m.loss, "loss_version": loss_version(m.loss),
                "package": package_version(), "prior": col.prior_record if m.priors else None,
                "config": resolved, "hparams": plan.hparams[0], "lr": plan.lr[0],
                "weight_decay": plan.weight_decay[0], "batch_size": t.batch_size,
                "epochs": t.epochs}
    if m.kind == "grid":
        # the grid chooses these per draw: the cell is keyed by the grid instead
        settings.update(lr=None, weight_decay=None, batch_size=None,
                        grid=config.grid.describe())
    return settings


#: ProbeConfig fields that change how fast a run goes but not what it trains: left out of a
#: cell's key (everything else is in it, read from the resolved config)
SPEED_ONLY = ("device", "deterministic", "cuda_graph", "compile", "test_curve", "eval_init",
              "test_intervals", "observed_seed")  # the draw is keyed with its record apart


def trained_config(cfg: Any) -> dict[str, Any]:
    """What a cell trains with, from its resolved :class:`probe.ProbeConfig`: every field but
    the speed-only ones (:data:`SPEED_ONLY`)."""
    import dataclasses

    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if f.name not in SPEED_ONLY}


def package_version() -> str:
    """spml-probe's version (a cell trained by another release retrains)."""
    from probe import __version__

    return __version__


def loss_version(loss: str) -> dict[str, Any]:
    """A loss's declared ``version``, the distribution that ships it and a hash of its module's
    source: a cell whose loss changed -- a new release, a plugin upgrade or an edit -- retrains."""
    import inspect
    import sys

    from probe.engine.results import loss_package
    from probe.losses import get_loss_class

    cls = get_loss_class(loss)
    try:
        source = inspect.getsource(sys.modules[cls.__module__])
    except (OSError, TypeError, KeyError):  # no source to read (a frozen or built module)
        source = ""
    return {"version": getattr(cls, "version", "1"), "package": loss_package(loss),
            "source": hashlib.sha256(source.encode()).hexdigest()[:16]}


def _note_generic(notes: list[str], loss: str, dataset: str, setting: str) -> None:
    """One note per dataset and setting naming every loss without a paper preset for it, and
    saying plainly that the generic setting is a guess."""
    head = (f"no paper preset for {dataset}: a guess, the generic setting ({setting}), not "
            "tuned for this store -- give every loss the same search with --tune N (or set "
            "--lr/--epochs); at the guess: ")
    for k, note in enumerate(notes):
        if note.startswith(head):
            notes[k] = f"{note}, {loss}"
            return
    notes.append(head + loss)


def _study_method(folder: str, config: TableConfig) -> Method:
    """``--from STUDY_DIR``: the study's winner as a row on its store's column."""
    from studies.results.compare import split_study_spec
    from studies.results.confirm import load_study
    from studies.study.storage import find_storage

    path, name = split_study_spec(folder)
    if not Path(path).is_dir():
        raise TableError(f"--from {folder}: not a folder; pass a 'spml study --out' folder")
    study = load_study(find_storage(path), name, flag=f"--from {folder}")
    return _winner_method(study, f"searched ({study.study_name})", "study", config)


def _winner_method(study: Any, what: str, kind: str, config: TableConfig) -> Method:
    from optuna.trial import TrialState

    from studies.results.confirm import trained_settings, trial_setup
    from studies.study.storage import best_trial

    loss = study.user_attrs.get("spml.loss")
    if loss is None:
        raise TableError(f"--from: study '{study.study_name}' was not made by 'spml study'")
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not complete:
        raise TableError(f"study '{study.study_name}' has no completed trial yet")
    best = best_trial(complete)
    settings = trained_settings(study)
    if "observed_seed" not in settings:
        raise TableError(f"--from: study '{study.study_name}' records no draw (observed_seed); "
                         "it was made by an older spml: re-run it, or compare it with 'spml "
                         "compare'")
    hp, cfg = trial_setup(best.params, loss, settings, seeds=(config.seed,),
                          observed_seed=int(settings["observed_seed"]))
    return Method(f"{loss}, {what}", kind, loss, hparams=dict(hp), batch_size=cfg.batch_size,
                  lr=cfg.lr, epochs=cfg.epochs, priors=cfg.priors, val_labels=cfg.val_labels,
                  store_identity=study.user_attrs.get("spml.store"))


def run_tuning(plan: Plan, log: Callable[[str], None]) -> None:
    """``--tune N``: one N-trial study per loss and column (the same sampler, seed and
    selection rule for all); each winner is the cell of a "tuned" row after its loss's row."""
    from studies.results.confirm import load_study
    from studies.study.run import run_study
    from studies.study.storage import find_storage

    winners: dict[tuple[int, str], Method] = {}
    for i, loss, settings in plan.study_settings:
        log(f"tuning {loss} on {plan.columns[i].dataset}: {settings.n_trials} trials "
            f"({settings.sampler}, seed {settings.seed}, --select {settings.select}) -> "
            f"{settings.out}")
        # the table scores the winners on test itself: no test-split verdict inside a study
        run_study(settings, log=lambda m: log("  " + m), verdict=False)
        study = load_study(find_storage(settings.out), settings.name)
        winners[(i, loss)] = _winner_method(study, f"tuned ({settings.n_trials} trials)",
                                            "tuned", plan.config)
    if not winners:
        return
    rows: list[tuple[int | None, str | None]] = []  # (old row, tuned loss)
    for j, m in enumerate(plan.methods):
        rows.append((j, None))
        if m.kind == "preset" and (0, m.loss) in winners:
            rows.append((None, m.loss))
    settings, per_column = {}, {}
    for i, col in enumerate(plan.columns):
        data = _load(col, col.draws[0], plan.config)
        for j, (old, loss) in enumerate(rows):
            if old is not None:
                settings[(i, j)] = plan.settings[(i, old)]
            else:
                per_column[(i, j)] = winners[(i, loss)]
                settings[(i, j)] = resolve_settings(winners[(i, loss)], col, data, plan.config)
    plan.methods = [plan.methods[old] if old is not None else winners[(0, loss)]
                    for old, loss in rows]
    plan.settings, plan.per_column = settings, per_column


def _cell_paths(out: str, key: str) -> tuple[Path, Path]:
    return Path(out) / "cells" / f"{key}.json", Path(out) / "heads" / f"{key}.pt"


def _read_cell(cell: Cell, out: str | None) -> bool:
    """Fill ``cell`` from ``--out`` when it was trained before with the same settings."""
    if out is None:
        return False
    rec_path, head_path = _cell_paths(out, cell.key)
    if not (rec_path.is_file() and head_path.is_file()):
        return False
    saved = json.loads(rec_path.read_text())
    if saved.get("format") != CELL_FORMAT or saved.get("settings") != json.loads(
            json.dumps(saved_settings(cell), default=str)):
        return False
    from probe.engine.results import load_head

    head, _ = load_head(head_path, 0)
    _fill(cell, saved["record"], head)
    if cell.method.kind == "grid":  # its command names the setting the grid chose
        cell.command = saved.get("command", cell.command)
    return True


def saved_settings(cell: Cell) -> dict[str, Any]:
    """What a kept cell records and is checked against: its row's settings, its draw's seed
    and the draw's record."""
    return {**cell.settings, "observed_seed": cell.observed_seed,
            "draw": cell.column.draw_records.get(cell.observed_seed)}


def stale_cells(cells: list[Cell], out: str | None) -> dict[str, int]:
    """Of the cells to train, those ``--out`` holds under an older key (the same row, store and
    draw, other settings): how many retrain because each setting changed (``{"prior": 2}``)."""
    if out is None or not (Path(out) / "cells").is_dir():
        return {}
    kept: dict[tuple[str, str, int], dict[str, Any]] = {}
    for path in sorted((Path(out) / "cells").glob("*.json")):
        try:
            saved = json.loads(path.read_text())
            settings = saved["settings"]
            kept[(saved["method"], settings["dataset"], int(settings["observed_seed"]))] = settings
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged or foreign file: no cell of ours
    changed: dict[str, int] = {}
    for c in cells:
        old = kept.get((c.method.label, c.column.dataset, c.observed_seed))
        if old is None:
            continue
        new = json.loads(json.dumps(saved_settings(c), default=str))
        for name in sorted(set(old) | set(new)):
            if _changed(name, old, new):
                changed[name] = changed.get(name, 0) + 1
    return changed


def _changed(name: str, old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether setting ``name`` differs; the resolved ``config`` counts only for its fields that
    are not keyed on their own as well (an --epochs change is said once, as epochs)."""
    if name != "config" or not (isinstance(old.get(name), dict) and isinstance(new.get(name),
                                                                               dict)):
        return old.get(name) != new.get(name)
    fields = (set(old[name]) | set(new[name])) - set(new)
    return any(old[name].get(f) != new[name].get(f) for f in fields)


def _fill(cell: Cell, record: dict[str, Any], head: Any) -> None:
    import torch

    best = record["trials"][0].get("best") or {}
    cell.record = record
    cell.head = torch.cat([head.weight.detach().T, head.bias.detach()[None]]).float()
    cell.test_map = float(best.get("test_map", math.nan))
    cell.val_map = float(best.get("val_map", math.nan))


def _write_cell(cell: Cell, result: Any, out: str,
                extra: dict[str, Any] | None = None) -> None:
    from probe.engine.results import save_head
    from probe.io import atomic_write_text

    rec_path, head_path = _cell_paths(out, cell.key)
    save_head(head_path, result)  # the head first: the record, written last, marks it whole
    payload = {"format": CELL_FORMAT, "settings": saved_settings(cell),
               "method": cell.method.label, "command": cell.command,
               "record": result.to_dict(), **(extra or {})}
    atomic_write_text(rec_path, json.dumps(payload, sort_keys=True, default=str))


def draw_dependent(m: Method) -> bool:
    """Whether a row's result depends on the single-positive draw: not the zero-shot row (no
    training) nor the oracle (all labels of the train rows); those get one cell, used on every
    draw."""
    return m.loss is not None and m.labels != "full"


def make_cells(plan: Plan) -> list[Cell]:
    """Every (column, row, draw) cell with its key and command (nothing trained yet)."""
    cells = []
    for i, col in enumerate(plan.columns):
        for j in range(len(plan.methods)):
            m = plan.method_at(i, j)
            for d in (col.draws if draw_dependent(m) else col.draws[:1]):
                s = plan.settings[(i, j)]
                key_settings = s
                if m.loss is not None:
                    key_settings = {**s, "observed_seed": d, "draw": col.draw_records[d]}
                cells.append(Cell(m, col, d, cell_key(key_settings), s,
                                  m.command(col.path, d, plan.config)))
    return cells


def train_cells(plan: Plan, cells: list[Cell], *, progress: bool = True,
                log: Callable[[str], None] = print) -> None:
    """Read back every cell ``--out`` holds and train the others: per column and row, the
    row's draws still to train as one stacked run (``TableConfig.stack``; one run per cell
    without), each cell kept in ``--out`` as soon as its group is trained; progress with ETA
    over cells."""
    import torch

    from probe.metrics import mean_average_precision
    from probe.progress import Progress, plural
    from probe.store import open_store

    config = plan.config
    todo = []
    for c in cells:
        if c.method.loss is None:
            store = open_store(c.column.path)
            labels = torch.from_numpy(store.labels(store.split("test"))).bool()
            scores = torch.as_tensor(c.column.prior_test_scores, dtype=torch.float32)
            c.test_map = float(mean_average_precision(labels, logits=scores).map)
        elif not _read_cell(c, config.out):
            todo.append(c)
    log(f"{plural(len(cells), 'cells')}: {len(cells) - len(todo)} kept or without training, "
        f"{len(todo)} to train")
    changed = stale_cells(todo, config.out)
    if changed:
        what = ", ".join(f"{name} ({n})" for name, n in changed.items())
        log(f"retraining cells kept in {config.out} whose settings changed: {what}")
    with Progress(len(todo), "table", "cell", enabled=progress) as bar:
        for col in plan.columns:
            mine = [c for c in todo if c.column is col]
            if not mine:
                continue
            # every draw a cell of this column trains on: the store's features loaded once,
            # each further draw's labels beside them (ProbeData.with_draw)
            datas: dict[int, Any] = {}
            for d in col.draws:
                if not any(c.observed_seed == d for c in mine):
                    continue
                if datas:
                    datas[d] = next(iter(datas.values())).with_draw(col.path, d)
                else:
                    datas[d] = _load(col, d, config)
            for group in _groups(mine, config.stack):
                m = group[0].method
                draws = ",".join(str(c.observed_seed) for c in group)
                bar.set_postfix(f"{col.dataset} {m.label} draw{'s' if len(group) > 1 else ''} "
                                f"{draws}")
                if m.kind == "grid":
                    _train_grid_group(group, datas, config)
                else:
                    for c, result in zip(group, _train_group(group, datas, config)):
                        if config.out:
                            _write_cell(c, result, config.out)
                        _fill(c, result.to_dict(), result.head(0))
                        c.trained = True
                bar.update(len(group))


def _groups(cells: list[Cell], stack: bool) -> list[list[Cell]]:
    """The cells of one column in training groups: per row (method), its draws together
    (``stack``), or each cell alone."""
    rows: dict[int, list[Cell]] = {}
    for c in cells:
        rows.setdefault(id(c.method), []).append(c)
    if stack:
        return list(rows.values())
    return [[c] for row in rows.values() for c in row]


def _train_group(group: list[Cell], datas: dict[int, Any], config: TableConfig) -> list[Any]:
    """One row's cells on their draws, one result each: one stacked run of the draws
    (:func:`probe.evaluation.selection.train_cells`), or, alone, one run."""
    from probe.evaluation.selection import train_cells as train_stacked

    m = group[0].method
    pairs = [(m.probe_config(c.observed_seed, config), datas[c.observed_seed]) for c in group]
    return train_stacked(pairs, m.loss, dict(m.hparams), stack=config.stack)


def _train_grid_group(group: list[Cell], datas: dict[int, Any], config: TableConfig) -> None:
    """``--tune grid``: every grid setting on each of the row's draws (stacked), then per draw
    the setting with the best val mAP becomes the cell (its command names that setting)."""
    import dataclasses

    from .grid import choose, train_grid

    m = group[0].method
    base = m.probe_config(group[0].observed_seed, config)
    # draws stack when the cells differ in their train draw alone (val on clean labels)
    stack = config.stack and m.val_labels == "clean"
    if stack:
        runs = train_grid(base, m.loss, dict(m.hparams), config.grid,
                          [datas[c.observed_seed] for c in group])
    else:
        runs = [train_grid(base, m.loss, dict(m.hparams), config.grid,
                           [datas[c.observed_seed]], stack=config.stack)[0] for c in group]
    for c, mine in zip(group, runs):
        chosen = choose(mine)
        picked = dataclasses.replace(m, batch_size=chosen.batch_size, lr=chosen.lr,
                                     weight_decay=chosen.weight_decay)
        c.command = picked.command(c.column.path, c.observed_seed, config)
        result = chosen.result
        if config.out:
            _write_cell(c, result, config.out,
                        {"grid_runs": [run.summary() for run in mine],
                         "chosen": chosen.summary()})
        _fill(c, result.to_dict(), result.head(0))
        c.trained = True


def build_table(paths: Sequence[str], config: TableConfig | None = None, *,
                progress: bool = True, log: Callable[[str], None] = print) -> Any:
    """Check, tune (``--tune``), train the missing cells, then score and mark every column:
    returns a :class:`studies.table.Table` (``markdown()``, ``latex()``, ``frame()``)."""
    from .render import Table

    config = config or TableConfig()
    plan = plan_table(paths, config)
    for note in plan.notes:
        log(f"note: {note}")
    if plan.study_settings:
        run_tuning(plan, log)
    cells = make_cells(plan)
    train_cells(plan, cells, progress=progress, log=log)
    return Table(plan, cells)
