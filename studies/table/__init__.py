"""The paper's Table 1 in one command (``spml table``; docs/tables.md): every method a row, every
store (dataset) a column, each cell the test mAP over the single-positive draws.

* :mod:`studies.table.cells` -- the rows (:class:`Method`), every check before anything trains,
  and the cells, keyed by their resolved settings and kept in ``--out`` (a rerun trains nothing);
* :mod:`studies.table.render` -- per column a paired bootstrap over the test images marks the best
  and the not-significantly-worse (Holm); Markdown, LaTeX, tidy rows and ``spml probe`` commands.

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
