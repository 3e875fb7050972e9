"""Embedding tables' initial weights, made block by block so any part can be made alone.

DLRM's initialisation: every row of a table uniform in +-sqrt(1 / num_rows) (the DLRM
reference code). The values of a table are cut into blocks of ``BLOCK_ROWS`` rows, each drawn
from its own generator seeded by (seed, table, block), so a rank can make exactly the rows
and columns of its shards, and a table larger than memory can be made piece by piece, with
the same values a single process gets for the whole table.
"""

from __future__ import annotations

import numpy as np
import torch

from distrec.tables import TableConfig

BLOCK_ROWS = 65_536
"""Rows per generator block (a block of a 128-dim table is 32 MiB while it is drawn)."""


class TableInit:
    """The initial weights of ``tables``, reproducible from ``seed`` (see the module docstring).

    Example:
        >>> init = TableInit([TableConfig("a", 100_000, 8)], seed=7)
        >>> shard = torch.empty(50_000, 4)
        >>> init.fill(shard, table=0, row_start=50_000, col_start=4)  # rows 50,000.., columns 4..7
    """

    def __init__(self, tables: list[TableConfig], seed: int) -> None:
        self.tables = list(tables)
        self.seed = int(seed)

    def for_tables(self, tables: list[TableConfig]) -> TableInit:
        """The same initialisation of ``tables``: the real tables behind a model built with
        one-row stand-ins of them (``distrec.tables.stand_in_tables``), whose seed this is."""
        return TableInit(tables, self.seed)

    def _block_generator(self, table: int, block: int) -> torch.Generator:
        key = np.random.SeedSequence([self.seed, table, block]).generate_state(1, np.uint64)[0]
        return torch.Generator().manual_seed(int(key))

    @torch.no_grad()
    def fill(self, out: torch.Tensor, table: int, row_start: int = 0, col_start: int = 0) -> None:
        """Write the initial weights of rows [row_start, row_start + out rows) and columns
        [col_start, col_start + out columns) of table number ``table`` into ``out`` (any device).

        The blocks are drawn on the host, one at a time (at most ``BLOCK_ROWS`` x dim floats
        besides ``out``).
        """
        t = self.tables[table]
        rows, cols = out.shape
        row_end, col_end = row_start + rows, col_start + cols
        if row_start < 0 or row_end > t.num_rows or col_start < 0 or col_end > t.dim:
            raise ValueError(f"rows [{row_start}, {row_end}) x columns [{col_start}, {col_end}) are outside table {t.name!r} [{t.num_rows}, {t.dim}]")
        bound = (1.0 / t.num_rows) ** 0.5
        for block in range(row_start // BLOCK_ROWS, -(-row_end // BLOCK_ROWS)):
            first = block * BLOCK_ROWS
            values = torch.rand(min(BLOCK_ROWS, t.num_rows - first), t.dim, generator=self._block_generator(table, block))
            lo, hi = max(first, row_start), min(first + BLOCK_ROWS, row_end)
            part = values[lo - first : hi - first, col_start:col_end].mul_(2 * bound).sub_(bound)
            out[lo - row_start : hi - row_start].copy_(part)
