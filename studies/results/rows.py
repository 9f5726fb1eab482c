"""Results as data: one tidy schema for every trial spml trains (a study's trials, a probe run's
trials, a confirmation's re-runs), so that tables from different losses, studies and commands
concatenate (``pl.concat(..., how="diagonal_relaxed")``) and export anywhere (CSV, Parquet).

One row per trial; the columns (:data:`COLUMNS`, in this order): what it is (``format``,
``kind`` = study | probe | confirm, ``source``, ``study``, ``trial``, ``state``, ``loss``);
``params``, a JSON object with sorted keys in one scheme for every source (:func:`params_keys`:
``<loss>.<name>``, ``train.<name>``), never one column per loss knob; the metrics in percent
at the best epoch (``value`` = what the study maximised, ``val_map``, ``test_map``,
``best_epoch`` from 1, ``epochs_run``); the settings the trial trained with (``seed`` ...
``loss_package``: the distribution providing the loss); where and how (``spml_version``,
``worker``, ``seconds``). Further best-epoch metrics (``val_map_*`` / ``test_map_*``, e.g.
``test_map_low``) follow the settings and simply concatenate.

A study's per-batch Parquet files (:func:`write_batch`) add the list columns of :data:`CURVES`
(per-epoch curves, index 0 = epoch 1; ``class_ap``: test AP per class at the best epoch).
Files are written atomically, so a reader never sees half a file, also while the study runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import socket
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from probe import __version__
from probe.io import atomic_write

__all__ = ["COLUMNS", "CURVES", "FORMAT", "draw_of", "params_keys", "probe_rows", "read_results",
           "read_trial_heads", "rows_of_study", "store_fingerprint", "study_tag", "tidy_frame",
           "write_batch", "write_trial_heads"]

FORMAT = "spml-results/2"

COLUMNS: dict[str, pl.DataType] = {
    # what it is
    "format": pl.Utf8, "kind": pl.Utf8, "source": pl.Utf8, "study": pl.Utf8, "trial": pl.Int64,
    "state": pl.Utf8, "loss": pl.Utf8, "params": pl.Utf8,
    # which study of that name wrote the row (study_tag): a folder may hold two of one name
    "study_tag": pl.Utf8,
    # the metrics (percent) at the best epoch
    "value": pl.Float64, "val_map": pl.Float64, "test_map": pl.Float64, "best_epoch": pl.Int64,
    "epochs_run": pl.Int64,
    # the settings the trial trained with (draw and prior_provenance: JSON)
    "seed": pl.Int64, "observed_seed": pl.Int64, "draw": pl.Utf8, "prior": pl.Utf8,
    "prior_provenance": pl.Utf8, "lr": pl.Float64, "batch_size": pl.Int64, "epochs": pl.Int64,
    "optimizer": pl.Utf8, "weight_decay": pl.Float64, "val_labels": pl.Utf8, "select": pl.Utf8,
    "dataset": pl.Utf8, "store": pl.Utf8, "store_fingerprint": pl.Utf8, "backbone": pl.Utf8,
    "loss_package": pl.Utf8,
    # where and how
    "spml_version": pl.Utf8, "worker": pl.Utf8, "seconds": pl.Float64,
}

CURVES: dict[str, pl.DataType] = {
    "val_map_per_epoch": pl.List(pl.Float64),
    "test_map_per_epoch": pl.List(pl.Float64),
    "train_loss_per_epoch": pl.List(pl.Float64),
    "class_ap": pl.List(pl.Float64),
}

_BATCH = {**COLUMNS, **CURVES, "provenance": pl.Utf8}


def store_fingerprint(source: dict[str, Any]) -> str | None:
    """A short hash of what identifies a store (:meth:`probe.store.Store.identity`: dataset,
    shape, creation, backbone and weights), the same wherever the store is mounted; None for
    in-memory data. Records from before the identity was recorded hash what they hold (dataset,
    rows per split, creation, backbone, weights)."""
    if not source or source.get("kind") != "store":
        return None
    from probe.store.reading import identity_fingerprint

    if isinstance(source.get("identity"), dict):
        return identity_fingerprint(source["identity"])
    prov = source.get("provenance") or {}
    key = {**{k: source.get(k) for k in ("dataset", "rows", "completed")},
           **{k: prov.get(k) for k in ("created", "backbone", "weights_sha256")}}
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def probe_rows(record: dict[str, Any], *, kind: str = "probe", study: str | None = None,
               trials: Sequence[int] | None = None, numbers: Sequence[int] | None = None,
               states: Sequence[str] | None = None, params: Sequence[dict] | None = None,
               extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Tidy rows (:data:`COLUMNS` and :data:`CURVES`) of a probe run's record -- what
    :meth:`probe.ProbeResult.to_dict` returns and ``spml probe --json`` writes.

    ``trials`` picks trials (default all); ``numbers`` / ``states`` / ``params`` replace their
    trial number, state (default: ``PRUNED`` when stopped early, ``FAIL`` when non-finite, else
    ``COMPLETE``) and parameters (default: the loss's hyperparameters); ``extra`` adds or sets
    columns on every row.
    """
    cfg = record.get("config") or {}
    data = record.get("data") or {}
    all_trials = record.get("trials") or []
    picked = list(range(len(all_trials))) if trials is None else list(trials)
    rows = []
    for j, t in enumerate(picked):
        tr = all_trials[t]
        best = tr.get("best") or {}
        epochs = tr.get("epochs") or []
        if states is not None:
            state = states[j]
        elif not tr.get("finite", True) or _finite(best.get("val_map")) is None:
            state = "FAIL"
        elif tr.get("stopped_at") is not None:
            state = "PRUNED"
        else:
            state = "COMPLETE"
        hp = params_keys(params[j] if params is not None else tr.get("hparams") or {},
                         record.get("loss"))
        package = record.get("loss_package")
        rows.append({
            "format": FORMAT, "kind": kind, "source": None, "study": study,
            "trial": int(numbers[j] if numbers is not None else tr.get("trial", t)),
            "state": state, "loss": record.get("loss"),
            "params": json.dumps(hp, sort_keys=True, default=str),
            "value": _finite(best.get("val_map")), "val_map": _finite(best.get("val_map")),
            "test_map": _finite(best.get("test_map")), "best_epoch": tr.get("best_epoch"),
            "epochs_run": len(epochs), "seed": tr.get("seed"),
            "observed_seed": cfg.get("observed_seed", data.get("observed_seed")),
            "draw": _json(draw_of(data)),
            "prior": cfg.get("priors") or (data.get("priors") or {}).get("name"),
            "prior_provenance": _json((data.get("priors") or {}).get("provenance")),
            "lr": _finite(tr.get("lr")),
            **{k: cfg.get(k) for k in ("batch_size", "epochs", "optimizer")},
            "weight_decay": _finite(tr.get("weight_decay")), "val_labels": cfg.get("val_labels"),
            "select": cfg.get("select", "val"), "dataset": record.get("dataset"),
            "store": data.get("path"), "store_fingerprint": store_fingerprint(data),
            "backbone": (data.get("provenance") or {}).get("backbone"),
            "loss_package": f"{package['name']} {package['version']}" if package else None,
            "spml_version": record.get("spml_version") or __version__,
            "worker": None, "seconds": None,
            "val_map_per_epoch": [_finite(e.get("val_map")) for e in epochs],
            "test_map_per_epoch": [_finite(e.get("test_map")) for e in epochs],
            "train_loss_per_epoch": [_finite(e.get("train_loss")) for e in epochs],
            "class_ap": [_finite(v) for v in best["test_ap"]] if best.get("test_ap") else None,
            # further metrics of the best epoch (e.g. test_map_low / test_map_high intervals)
            **{k: _finite(v) for k, v in best.items()
               if k.startswith(("val_map_", "test_map_")) and isinstance(v, int | float)},
            **(extra or {}),
        })
    return rows


def params_keys(params: dict[str, Any], loss: str | None) -> dict[str, Any]:
    """The one key scheme of the ``params`` column, whatever the source: a loss hyperparameter
    as ``<loss>.<name>`` (``gr.b_T``), a training setting as ``train.<name>`` -- the names a
    study's trials carry; a probe run's plain names (``b_T``, ``lr``) are prefixed so."""
    from probe.engine.config import TRAINER_KEYS

    named = {}
    for k, v in params.items():
        if "." in k or not loss:  # already qualified, or no loss to qualify it with
            named[k] = v
        elif k in TRAINER_KEYS:
            named[f"train.{k}"] = v
        else:
            named[f"{loss}.{k}"] = v
    return named


def draw_of(data: dict[str, Any]) -> dict[str, Any] | None:
    """The draw record of a run's ``data`` (probe.store.records.draw_record); a record written
    before draws were recorded: from its label budget, else the protocol's; None off a store."""
    if data.get("draw"):
        return dict(data["draw"])
    if data.get("label_budget"):
        return {"kind": "budget", **data["label_budget"]}
    return {"kind": "protocol"} if data.get("kind") == "store" else None


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


def tidy_frame(rows: Iterable[dict[str, Any]], curves: bool = True) -> pl.DataFrame:
    """Rows as a frame in the tidy schema: :data:`COLUMNS` first in their order and types,
    then any further columns (e.g. interval bounds), then (with ``curves``) :data:`CURVES`."""
    rows = list(rows)
    schema = dict(COLUMNS)
    if curves:
        schema.update(CURVES)
    extra = dict.fromkeys(k for row in rows for k in row if k not in schema and k not in CURVES)
    names = [*COLUMNS, *extra]
    if curves:
        names += list(CURVES)
    records = [{k: row.get(k) for k in names} for row in rows]
    frame = pl.DataFrame(records, schema_overrides=schema, infer_schema_length=None)
    if not rows:
        frame = pl.DataFrame(schema={k: schema.get(k, pl.Utf8) for k in names})
    return frame.select(names)


def write_batch(directory: str | os.PathLike, rows: Sequence[dict[str, Any]]) -> Path | None:
    """Write one batch of trial rows (the tidy columns, ``params`` and the store's
    ``provenance`` may be dicts: stored as JSON) as ``batch-<host>-<pid>-<uuid>.parquet``."""
    if not rows:
        return None
    records = [{"format": FORMAT, **row} for row in rows]
    for rec in records:
        if not isinstance(rec.get("params"), str):
            rec["params"] = json.dumps(rec.get("params") or {}, sort_keys=True, default=str)
        if isinstance(rec.get("provenance"), dict):
            rec["provenance"] = json.dumps(rec["provenance"], sort_keys=True, default=str)
    frame = tidy_frame(records)
    if "provenance" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Utf8).alias("provenance"))
    name = f"batch-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}.parquet"
    return atomic_write(Path(directory) / name, frame.write_parquet)


HEADS_FORMAT = "spml-study-heads/2"
#: the user attributes that make a study itself (spml.study.create): its tag hashes them
STUDY_IDENTITY_KEYS = ("spml.loss", "spml.store", "spml.space", "spml.fixed", "spml.training")
#: a random id a study gets when it is made (spml.study.create): no other study has it
MADE_ATTR = "spml.made"


def study_tag(study: Any) -> str:
    """Which study kept a file: ``<name>:<hash of its identity>`` (loss, store, search space,
    fixed and training settings, and the id it was made with). Two studies in one folder --
    two names, one name made again with other settings, or one name and the same settings in
    two storages -- never share a tag."""
    attrs = study.user_attrs
    identity = {key: attrs.get(key) for key in STUDY_IDENTITY_KEYS}
    if attrs.get(MADE_ATTR) is not None:  # studies made before the id keep their tag
        identity[MADE_ATTR] = attrs[MADE_ATTR]
    text = json.dumps(identity, sort_keys=True, default=str)
    return f"{study.study_name}:{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def rows_of_study(frame: pl.DataFrame, study: Any) -> pl.DataFrame:
    """The rows of ``frame`` (:func:`read_results`) that ``study`` wrote: of its name and tag
    (:func:`study_tag`), and of its name without a tag (rows written before rows carried one).
    Rows of another study of the same name -- made in another storage, or made again -- that
    keeps its results in the same folder are left out."""
    if not frame.height or "study" not in frame.columns:
        return frame
    mine = pl.col("study") == study.study_name
    if "study_tag" in frame.columns:
        tag = pl.col("study_tag")
        mine = mine & (tag.is_null() | (tag == study_tag(study)))
    return frame.filter(mine)


def write_trial_heads(directory: str | os.PathLike, numbers: Sequence[int], heads: Any,
                      source: dict[str, Any], study: str) -> Path | None:
    """Keep what the paired bootstrap needs of finished trials: their best-epoch heads
    ``(T, D+1, C)`` (bias in the last row; float32), the trial numbers, the run's data record
    and the study's tag (:func:`study_tag`), as ``heads-<study>-<host>-<pid>-<uuid>.pt`` beside
    the batch files (written atomically). The study's summary, ``spml compare STUDY_DIR`` and
    the report then score these heads on the test split instead of re-training them."""
    if not len(numbers):
        return None
    import torch

    payload = {"format": HEADS_FORMAT, "study": study, "trials": [int(n) for n in numbers],
               "heads": heads.detach().float().cpu().contiguous(),
               "data": json.loads(json.dumps(source, default=str))}
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", study.partition(":")[0])[:60]
    name = f"heads-{safe}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}.pt"
    return atomic_write(Path(directory) / name, lambda fh: torch.save(payload, fh))


def read_trial_heads(directory: str | os.PathLike, study: str
                     ) -> dict[int, tuple[Any, dict[str, Any]]]:
    """Trial number -> (best-epoch head ``(D+1, C)``, data record) of every head
    :func:`write_trial_heads` kept in ``directory`` for the study tagged ``study``
    (:func:`study_tag`); heads of any other study in the folder, and files from before heads
    carried their study, are never read (those trials are re-trained instead)."""
    directory = Path(directory)
    if not directory.is_dir():
        return {}
    import torch

    out = {}
    for path in sorted(directory.glob("heads-*.pt")):
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # a damaged file: those trials are re-trained instead
            continue
        if not isinstance(payload, dict) or payload.get("format") != HEADS_FORMAT:
            continue
        if payload.get("study") != study:
            continue
        for i, n in enumerate(payload["trials"]):
            out[int(n)] = (payload["heads"][i], payload["data"])
    return out


def upgrade_batch(frame: pl.DataFrame) -> pl.DataFrame:
    """A batch written before the tidy schema (spml-results/1: ``val_map`` a per-epoch list,
    ``best_epoch`` from 0, ``class_ap`` on 0–1, one ``param.<name>`` column per parameter) in
    today's shape."""
    if "format" in frame.columns:
        return frame
    cols = []
    if "val_map" in frame.columns and isinstance(frame.schema["val_map"], pl.List):
        frame = frame.rename({"val_map": "val_map_per_epoch"})
        cols.append(pl.col("value").alias("val_map"))
    if "best_epoch" in frame.columns:
        cols.append(pl.col("best_epoch") + 1)
    if "class_ap" in frame.columns:
        cols.append(pl.col("class_ap").list.eval(pl.element() * 100.0))
    frame = frame.with_columns(*cols, pl.lit("spml-results/1").alias("format"),
                               pl.lit("study").alias("kind"))
    return frame.drop([c for c in frame.columns if c.startswith("param.")])


def read_results(directory: str | os.PathLike) -> pl.DataFrame:
    """All finished batches of a study's results folder as one tidy frame, sorted by trial
    (an empty frame in the schema if none; older batches upgraded). Safe while workers write."""
    files = sorted(Path(directory).glob("batch-*.parquet"))
    if not files:
        return tidy_frame([])
    frame = pl.concat([upgrade_batch(pl.read_parquet(f)) for f in files], how="diagonal_relaxed")
    front = [c for c in COLUMNS if c in frame.columns]
    rest = [c for c in frame.columns if c not in COLUMNS]
    return frame.select(front + rest).sort("trial")
