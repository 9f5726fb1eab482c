"""``spml bench table``: the paper's table stacked (every draw of a row in one pass) against one
run per cell (``spml table --no-stack``), on a COCO-shaped store *named* COCO (or the real yeast
set, ``store="yeast"``).

The store is :func:`probe.bench.engine.synthetic_store` under the dataset name ``coco``, so every
loss trains at its own COCO paper preset (epochs, batch size, lr) or the generic setting where
its paper gives none -- exactly as ``spml table coco.zarr`` would. Its train split has ``rows``
rows (COCO's is 65,665; fewer keep the bench within minutes on a laptop) and ``draws`` protocol
draws. The same table is built twice in one process, each into its own fresh ``--out`` folder:
stacked (the default) and ``--no-stack``. One run of each, no medians: a table is one long run
whose wall time is the figure; the machine and its load are printed beside it. The cells of the
two tables are compared, so the figure is never bought with a different result.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.errors import SpmlError

__all__ = ["TableBenchConfig", "bench_table", "format_table_bench"]

#: the losses a default bench builds, each at its COCO preset: stateless (an, em), scheduled
#: (gr), per-example state (em_apl) and the large-loss family's rejection (ll_r). ROLE is left
#: out: its label estimates (T, N, C) are parameters that Adam updates densely every step, as
#: the plain program does, so at COCO's shape it costs many minutes (``--losses`` adds it).
DEFAULT_LOSSES = ("an", "gr", "em", "em_apl", "ll_r")


@dataclass(frozen=True)
class TableBenchConfig:
    """One measured table (defaults: five losses, three draws, a quarter of COCO's train rows)."""

    store: str = "coco"  # coco: the COCO-shaped synthetic store; yeast: the real yeast set
    rows: int = 16_384  # train rows of the COCO-shaped store (COCO: 65,665)
    losses: tuple[str, ...] = DEFAULT_LOSSES  # the table's rows ("all": every registered loss)
    draws: int = 3  # protocol draws per row (the table's --observed-seeds)
    epochs: int | None = None  # None: each loss's COCO preset (else the same for every row)
    cache_dir: str | None = None  # where the synthetic store is kept (the bench cache)
    device: str = "auto"

    def validate(self) -> None:
        if self.store not in ("coco", "yeast"):
            raise SpmlError(f"bench table: --store is coco (the COCO-shaped synthetic store) or "
                            f"yeast (the real yeast set); got {self.store!r}")
        if self.rows < 64:
            raise SpmlError(f"bench table: --rows must be at least 64 train rows; got {self.rows}")
        if self.draws < 2:
            raise SpmlError(f"bench table: --draws must be at least 2 (stacking needs several "
                            f"draws of a row); got {self.draws}")
        if not self.losses:
            raise SpmlError("bench table: --losses names no loss; give e.g. an,gr,role or all")


def bench_table(config: TableBenchConfig | None = None, *, progress: bool = False,
                log: Any = None) -> dict[str, Any]:
    """Build the table stacked and with one run per cell; their wall times, ratio and the
    largest difference between the two tables' cells (test mAP, points), with the machine."""
    from probe.bench.engine import machine_info, synthetic_store
    from probe.store.draws import add_draws
    from probe.store.protocol import PROTOCOL_SEED

    from .cells import TableConfig, build_table

    config = config or TableBenchConfig()
    config.validate()
    if config.store == "yeast":
        from studies.study.bench import yeast_bench_store

        store = yeast_bench_store(config.cache_dir, progress=progress)
    else:
        store = synthetic_store(config.rows, cache_dir=config.cache_dir, progress=progress,
                                name="coco")
    seeds = (PROTOCOL_SEED, *range(1, config.draws))
    add_draws(store, seeds)  # draws the store holds already are kept
    losses = None if config.losses == ("all",) else tuple(config.losses)
    quiet = log or (lambda message: None)
    before = machine_info()
    seconds: dict[str, float] = {}
    tables: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="spml-bench-table-") as tmp:
        # untimed: one epoch of the first row both ways, so that neither timed table pays the
        # process's one-time costs (imports, the step-thread measurement) for the other
        for stack in (True, False):
            warm = TableConfig(losses=(losses or ("an",))[:1], observed_seeds=seeds, epochs=1,
                               device=config.device, resamples=100, stack=stack)
            build_table([str(store)], warm, progress=False, log=quiet)
        for label, stack in (("stacked", True), ("one run per cell", False)):
            table_config = TableConfig(losses=losses, observed_seeds=seeds, epochs=config.epochs,
                                       out=str(Path(tmp) / label.replace(" ", "-")),
                                       device=config.device, resamples=100, stack=stack)
            t0 = time.perf_counter()
            tables[label] = build_table([str(store)], table_config, progress=progress, log=quiet)
            seconds[label] = time.perf_counter() - t0
    stacked = {_cell_id(c): c for c in tables["stacked"].cells}
    unstacked = {_cell_id(c): c for c in tables["one run per cell"].cells}
    if set(stacked) != set(unstacked):
        raise SpmlError("bench table: the stacked and unstacked tables have different cells; "
                        "this is a bug in spml-probe")
    diff = 0.0
    for key, cell in stacked.items():
        other = unstacked[key].test_map
        if math.isfinite(cell.test_map) and math.isfinite(other):
            diff = max(diff, abs(cell.test_map - other))
        elif math.isfinite(cell.test_map) != math.isfinite(other):
            diff = math.inf  # one finite, the other not: never hidden
    from probe.store import open_store

    rows = config.rows if config.store == "coco" else int(open_store(store).n_rows)
    return {"store_kind": config.store, "rows": rows, "losses": list(losses or ["all"]),
            "draws": list(seeds),
            "epochs": config.epochs, "cells": len(stacked),
            "trained": tables["stacked"].n_trained, "seconds": seconds,
            "unstacked_over_stacked": seconds["one run per cell"] / seconds["stacked"],
            "max_test_map_difference": diff, "machine_before": before,
            "machine": machine_info(), "store": str(store)}


def _cell_id(cell: Any) -> tuple[str, str, int]:
    return (cell.method.label, cell.column.dataset, int(cell.observed_seed))


def format_table_bench(report: dict[str, Any]) -> str:
    """The bench as a few lines: both wall times, their ratio, the cells' largest difference."""
    s = report["seconds"]
    before, after = report["machine_before"], report["machine"]
    if report.get("store_kind", "coco") == "yeast":
        where = f"the yeast set ({report['rows']:,} rows)"
        preset = "each loss's yeast preset or the generic setting"
    else:
        where = f"a COCO-shaped store named coco, {report['rows']:,} train rows"
        preset = "each loss's COCO preset"
    epochs = preset if report["epochs"] is None else f"{report['epochs']}"
    lines = [
        f"spml bench table: {where}; "
        f"rows {', '.join(report['losses'])}; draws {', '.join(map(str, report['draws']))}; "
        f"epochs: {epochs}",
        f"  stacked (every draw of a row in one pass): {s['stacked']:8.1f} s",
        f"  one run per cell (--no-stack):             {s['one run per cell']:8.1f} s",
        f"  ratio: {report['unstacked_over_stacked']:.2f}x faster stacked, "
        f"{report['trained']} cells each",
        f"  largest difference between the two tables' cells: "
        f"{report['max_test_map_difference']:.2g} test mAP points",
        f"  machine: {after.get('cpu', '?')}, {after.get('cpus', '?')} CPUs, torch threads "
        f"{after.get('torch_threads', '?')}; load {before.get('load_avg_1_5_15', '?')} before, "
        f"{after.get('load_avg_1_5_15', '?')} after",
    ]
    return "\n".join(lines)

