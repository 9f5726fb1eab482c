"""The paper's Table 1 in one command: every method as a row, every store (dataset) as a column,
each cell the test mAP over the single-positive draws (``spml table``; docs/tables.md).

* :mod:`studies.table.cells` decides the rows (:class:`Method`: a loss at its paper preset, the
  full-label oracle, a tuned or a study's winner, the zero-shot prior), checks every input
  before anything trains, keys each cell by its resolved settings and trains the missing ones
  (kept in ``--out``, so a rerun trains nothing and a larger table only what is new);
* :mod:`studies.table.render` scores the cells of each column on the same test images (a paired
  bootstrap over them, averaged over the draws, Holm-corrected within the column), marks the
  best and the not-significantly-worse, and writes Markdown, LaTeX (booktabs), the
  :mod:`studies.export` rows and the reproducing ``spml probe`` commands.

Example::

    from studies.table import TableConfig, build_table
    table = build_table(["yeast.zarr"], TableConfig(losses=("an", "gr"), include_full=True))
    print(table.markdown())
"""

from __future__ import annotations

from .cells import Cell, Method, TableConfig, TableError, build_table, plan_table
from .render import Table, write_outputs

__all__ = ["Cell", "Method", "Table", "TableConfig", "TableError", "build_table", "plan_table",
           "write_outputs"]
