"""Results you can take anywhere: collect probe runs, studies and confirmations into one table.

:func:`collect` reads any mix of probe run records (``spml probe --json``; a report's
``an_baseline.json``), study folders (or their ``results/`` folder or batch files),
``confirm.parquet`` files (or the folder holding one) and tables :func:`export` wrote, and
returns one polars DataFrame in the tidy schema of :mod:`studies.results.rows` (a confirmation: one
row per re-run); with ``epochs=True`` a row per trial and epoch (``epoch``,
``epoch_train_loss``, ``epoch_val_map``, ``epoch_test_map``). :func:`export` writes it as CSV or
Parquet (by the suffix); ``spml export`` is its command. Example::

    from studies.results.export import collect
    df = collect(["runs/gr-study", "runs/an-study", "probe-an.json"])
    df.group_by("loss").agg(pl.col("test_map").max())
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import polars as pl

from probe.errors import SpmlError
from studies.results.rows import (
    COLUMNS,
    CURVES,
    FORMAT,
    params_keys,
    probe_rows,
    read_results,
    tidy_frame,
    upgrade_batch,
)

__all__ = ["ExportError", "collect", "export"]

_PROBE_FORMAT = "spml-probe-result/1"
_SUFFIXES = (".csv", ".parquet")
_WHAT = ("a probe results JSON (spml probe --json), a study folder (spml study --out), its "
         "results/ folder or batch files, a confirm.parquet, or a table written by spml export")


class ExportError(SpmlError):
    """An export input or output is not what :func:`collect` / :func:`export` can use."""


def collect(paths: Iterable[str | os.PathLike], *, epochs: bool = False) -> pl.DataFrame:
    """One tidy frame of every trial in ``paths`` (see the module docstring); ``epochs=True``
    gives one row per trial and epoch. Raises :class:`ExportError` naming a path that is
    none of the accepted kinds."""
    frames, paths = [], list(paths)
    if not paths:
        raise ExportError(f"PATH: nothing to export; give one or more of: {_WHAT}")
    for p in paths:  # the batches' provenance records stay out of the table
        frame = _read(Path(p)).drop("provenance", strict=False)
        frames.append(frame.with_columns(
            pl.col("source").fill_null(pl.lit(str(p))) if "source" in frame.columns
            else pl.lit(str(p)).alias("source")))
    frame = _one_key_scheme(pl.concat(frames, how="diagonal_relaxed"))
    front = [c for c in COLUMNS if c in frame.columns]
    extra = [c for c in frame.columns if c not in COLUMNS and c not in CURVES]
    return _per_epoch(frame, front + extra) if epochs else frame.select(front + extra)


def _one_key_scheme(frame: pl.DataFrame) -> pl.DataFrame:
    """``params`` in :func:`studies.results.rows.params_keys`' scheme, also in tables written before
    it (a probe run's plain ``eps`` becomes ``<loss>.eps``)."""
    if "params" not in frame.columns or "loss" not in frame.columns or not frame.height:
        return frame
    fixed = [None if p is None else json.dumps(params_keys(json.loads(p), loss), sort_keys=True)
             for p, loss in zip(frame["params"].to_list(), frame["loss"].to_list())]
    return frame.with_columns(pl.Series("params", fixed, dtype=pl.Utf8))


def export(paths: Iterable[str | os.PathLike], out: str | os.PathLike, *,
           epochs: bool = False) -> tuple[Path, pl.DataFrame]:
    """Write :func:`collect` ``(paths, epochs=epochs)`` to ``out`` (``.csv`` or ``.parquet``,
    atomically); returns the path and the frame."""
    from probe.io import atomic_write

    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in _SUFFIXES:
        raise ExportError(f"--out: expected a file name ending in .csv or .parquet; got "
                          f"{str(out)!r}")
    frame = collect(paths, epochs=epochs)
    atomic_write(out, frame.write_csv if suffix == ".csv" else frame.write_parquet)
    return out, frame


def _read(path: Path) -> pl.DataFrame:
    if not path.exists():
        raise ExportError(f"PATH {path}: no such file or folder; expected {_WHAT}")
    if path.is_dir():
        if (path / "results").is_dir() or any(path.glob("batch-*.parquet")):
            return read_results(path / "results" if (path / "results").is_dir() else path)
        if (path / "confirm.parquet").is_file():
            return _confirm(path / "confirm.parquet")
        raise ExportError(
            f"PATH {path}: a folder with no results/ (study), batch-*.parquet or "
            f"confirm.parquet in it; expected {_WHAT}"
        )
    suffix = path.suffix.lower()
    if suffix == ".json":
        return _probe_json(path)
    if suffix == ".parquet":
        frame = pl.read_parquet(path)
        if "test_maps" in frame.columns and "rank" in frame.columns:
            return _confirm(path)
        if path.name.startswith("batch-"):
            return upgrade_batch(frame)
        if "format" in frame.columns:
            return frame
    if suffix == ".csv":
        frame = pl.read_csv(path, infer_schema_length=None)
        if "format" in frame.columns and "trial" in frame.columns:
            return frame
    raise ExportError(f"PATH {path}: not a results file spml knows; expected {_WHAT}")


def _probe_json(path: Path) -> pl.DataFrame:
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ExportError(f"PATH {path}: not readable JSON ({err}); expected {_WHAT}") from None
    if not isinstance(record, dict) or record.get("format") != _PROBE_FORMAT:
        raise ExportError(
            f"PATH {path}: a JSON file but not a probe results record (format "
            f"{_PROBE_FORMAT!r}, written by 'spml probe --json'); expected {_WHAT}"
        )
    rows = probe_rows(record, kind="probe")
    for row in rows:  # what the probe epochs recorded, before they counted from 1
        if record.get("spml_version") is None and row["best_epoch"] is not None:
            row["best_epoch"] += 1
    return tidy_frame(rows)


def _confirm(path: Path) -> pl.DataFrame:
    """confirm.parquet (one row per confirmed trial, runs as lists) as one row per run."""
    frame = pl.read_parquet(path)
    rename = {"test_maps": "test_map", "val_maps": "val_map", "seeds": "seed",
              "observed_seeds": "observed_seed"}
    runs = [c for c in rename if c in frame.columns]
    frame = frame.explode(runs).drop([c for c in rename.values() if c in frame.columns
                                      and c not in runs]).rename({k: rename[k] for k in runs})
    keep = [c for c in frame.columns if c in COLUMNS or c in ("rank", "search_value",
                                                              "test_mean", "test_std")]
    frame = frame.select(keep).with_columns(
        pl.lit(FORMAT).alias("format"), pl.lit("confirm").alias("kind"),
        pl.lit("COMPLETE").alias("state"))
    if "search_value" in frame.columns:
        frame = frame.with_columns(pl.col("search_value").alias("value"))
    return frame


def _per_epoch(frame: pl.DataFrame, columns: list[str]) -> pl.DataFrame:
    """One row per trial and epoch (epochs from 1); trials without curves keep one row with
    no epoch."""
    curves = {"train_loss_per_epoch": "epoch_train_loss", "val_map_per_epoch": "epoch_val_map",
              "test_map_per_epoch": "epoch_test_map"}
    present = [c for c in curves if c in frame.columns]
    if not present:
        return frame.select(columns).with_columns(pl.lit(None, dtype=pl.Int64).alias("epoch"))
    # the curves of one trial have one value per epoch run (index 0 = epoch 1)
    longest = pl.max_horizontal([pl.col(c).list.len().fill_null(0) for c in present])
    frame = frame.with_columns(pl.int_ranges(1, longest + 1, dtype=pl.Int64).alias("epoch"))
    frame = frame.explode(["epoch", *present])
    return frame.select([*columns, "epoch", *[pl.col(c).alias(curves[c]) for c in present],
                         *[pl.lit(None, dtype=pl.Float64).alias(curves[c]) for c in curves
                           if c not in present]])
