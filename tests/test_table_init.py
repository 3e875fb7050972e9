"""Block-wise table initialisation: any part alone equals the same part of the whole."""

import numpy as np
import pytest
import torch

from distrec.models.embedding import EmbeddingBagCollection
from distrec.models.table_init import BLOCK_ROWS, TableInit
from distrec.tables import TableConfig, stand_in_tables

TABLES = [TableConfig("a", 2 * BLOCK_ROWS + 1_000, 6), TableConfig("b", 2 * BLOCK_ROWS + 1_000, 6), TableConfig("c", 10, 6)]


def whole(init: TableInit, table: int) -> torch.Tensor:
    t = init.tables[table]
    out = torch.empty(t.num_rows, t.dim)
    init.fill(out, table)
    return out


def test_any_block_equals_that_part_of_the_whole_table():
    init = TableInit(TABLES, seed=11)
    full = whole(init, 0)
    rng = np.random.default_rng(0)
    for _ in range(8):
        r0, r1 = sorted(rng.integers(0, TABLES[0].num_rows + 1, size=2))
        c0, c1 = sorted(rng.choice(7, size=2, replace=False))
        part = torch.empty(r1 - r0, c1 - c0)
        init.fill(part, 0, int(r0), int(c0))
        assert torch.equal(part, full[r0:r1, c0:c1])
    edge = torch.empty(2, 6)
    init.fill(edge, 0, BLOCK_ROWS - 1)  # the last row of one block and the first of the next
    assert torch.equal(edge, full[BLOCK_ROWS - 1 : BLOCK_ROWS + 1])
    with pytest.raises(ValueError, match="outside table"):
        init.fill(torch.empty(2, 6), 0, TABLES[0].num_rows - 1)


def test_values_are_dlrm_uniform_and_depend_on_seed_and_table():
    init = TableInit(TABLES, seed=11)
    a, b = whole(init, 0), whole(init, 1)
    bound = (1.0 / TABLES[0].num_rows) ** 0.5
    assert a.abs().max() <= bound and a.abs().max() > 0.99 * bound and abs(float(a.mean())) < 0.01 * bound
    assert not torch.equal(a, b)  # same shape, another table: other values
    assert torch.equal(a, whole(TableInit(TABLES, seed=11), 0)) and not torch.equal(a, whole(TableInit(TABLES, seed=12), 0))
    assert whole(init, 2).abs().max() <= (1.0 / 10) ** 0.5


def test_collection_draws_one_seed_whatever_the_table_sizes():
    """One-row stand-ins draw the seed the real tables would: a rank can make its shards of
    the real tables from a model built with stand-ins, and the layers built after the
    embeddings get the same initial weights either way."""
    torch.manual_seed(5)
    real = EmbeddingBagCollection(TABLES)
    after_real = torch.rand(3)
    torch.manual_seed(5)
    stand_in = EmbeddingBagCollection(stand_in_tables(TABLES))
    assert torch.equal(torch.rand(3), after_real)
    assert stand_in.weight.shape[0] == len(TABLES) and stand_in.initializer.seed == real.initializer.seed
    made = stand_in.initializer.for_tables(TABLES)
    assert all(torch.equal(whole(made, i), real.table_weight(t.name)) for i, t in enumerate(TABLES))
