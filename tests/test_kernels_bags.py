"""The bag kernels: pooling and grouping by row equal the torch operators bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distrec.errors import DistrecError
from distrec.kernels import bags as kernels
from distrec.kernels import rows as row_kernels
from distrec.kernels.bags import Segments, feature_segments
from distrec.models import embedding
from distrec.models.embedding import EmbeddingBagCollection, feature_major, group_by_row
from distrec.tables import TableConfig
from test_models import random_batch


def _feature_major_batch(seed: int, batch_size: int = 6, rows: tuple[int, ...] = (5, 3000, 9), max_bag: int = 4, dim: int = 8):
    """Values and offsets of a feature-major batch with empty bags, table bases and sizes, a weight."""
    g = torch.Generator().manual_seed(seed)
    num_rows = torch.tensor(rows)
    base = torch.cumsum(num_rows, 0) - num_rows
    lengths = torch.randint(0, max_bag + 1, (len(rows) * batch_size,), generator=g)
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    values = torch.cat([torch.randint(0, r, (int(lengths[f * batch_size : (f + 1) * batch_size].sum()),), generator=g) for f, r in enumerate(rows)])
    return values, offsets, base, num_rows, torch.randn(int(num_rows.sum()), dim, generator=g)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("seed", "dim"), [(0, 8), (1, 8), (2, 1), (3, 13), (4, 64)])
def test_pool_equals_embedding_bag_transposed_to_sample_major(monkeypatch, seed, dim, threads):
    """Each row width has its own compiled kernel (the sum kept in registers)."""
    monkeypatch.setattr(row_kernels, "MIN_ROWS_PER_THREAD", 1)  # split even this small batch
    values, offsets, base, num_rows, weight = _feature_major_batch(seed, dim=dim)
    pooled = kernels.pool(weight, feature_segments(values, offsets, base, num_rows), threads)
    bags = feature_major(values, offsets, base)
    expected = F.embedding_bag(bags.rows, weight, bags.offsets, mode="sum", include_last_offset=True)
    assert torch.equal(pooled, expected.view(3, 6, -1).transpose(0, 1).reshape(18, -1))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_group_equals_a_stable_sort_of_all_rows(monkeypatch, seed, threads):
    """Tables of 5 and 9 rows are grouped by counting their rows, the one of 3000 rows by a
    radix sort (two passes); each row's lookups stay in order, as a stable sort keeps them."""
    monkeypatch.setattr(row_kernels, "MIN_ROWS_PER_THREAD", 1)
    values, offsets, base, num_rows, _ = _feature_major_batch(seed, max_bag=30)
    rows, bounds, picks = kernels.group(feature_segments(values, offsets, base, num_rows), threads)
    bags = feature_major(values, offsets, base)
    expected_rows, expected_bounds, order = group_by_row(bags.rows, int(num_rows.sum()))
    bag = bags.bag_of_row[order]
    assert torch.equal(rows, expected_rows) and torch.equal(bounds, expected_bounds)
    assert torch.equal(picks, (bag % 6) * 3 + bag // 6)  # bag f * B + b pools to output row b * F + f


@pytest.mark.parametrize("threads", [1, 2])
def test_grouping_by_counting_keeps_to_each_tables_entries_when_no_row_repeats(monkeypatch, threads):
    """Every lookup of table 0 a distinct row, and rows after its last one: the counting pass
    fills its table's entries to the last one and no further (the next table's entries are
    grouped by another thread)."""
    monkeypatch.setattr(row_kernels, "MIN_ROWS_PER_THREAD", 1)
    values = torch.tensor([3, 0, 2, 1, 1, 0, 1, 0])  # table 0 (6 rows): 3, 0, 2, 1; table 1 (2 rows): 1, 0, 1, 0
    segments = feature_segments(values, torch.arange(9), torch.tensor([0, 6]), torch.tensor([6, 2]))
    assert 6 <= kernels.COUNTING_SORT_ROWS_PER_LOOKUP * 4  # both tables are grouped by counting
    rows, bounds, picks = kernels.group(segments, threads)
    assert rows.tolist() == [0, 1, 2, 3, 6, 7] and bounds.tolist() == [0, 1, 2, 3, 4, 6, 8]
    assert picks.tolist() == [2, 6, 4, 0, 3, 7, 1, 5]  # bag f * 4 + b pools to output row b * 2 + f


def test_group_merges_segments_of_one_table_in_order():
    """Two segments of table 1 (as a sharded lookup receives them from two ranks) are one group."""
    values = torch.tensor([4, 1, 4, 0, 4, 2, 1])
    offsets = torch.tensor([0, 2, 3, 4, 7])
    segments = Segments(
        values,
        offsets,
        bag_start=torch.tensor([0, 2, 3, 4]),
        table=torch.tensor([1, 0, 1]),
        out_start=torch.tensor([0, 2, 3]),
        out_stride=torch.tensor([1, 1, 1]),
        table_base=torch.tensor([0, 10]),
        table_rows=torch.tensor([10, 5]),
        num_out=4,
    )
    rows, bounds, picks = kernels.group(segments)
    assert rows.tolist() == [0, 11, 12, 14] and bounds.tolist() == [0, 1, 3, 4, 7]
    assert picks.tolist() == [2, 0, 3, 3, 0, 1, 3]
    pooled = kernels.pool(torch.arange(15.0).unsqueeze(1), segments)
    assert pooled.squeeze(1).tolist() == [25.0, 14.0, 0.0, 37.0]


def test_pool_stops_at_an_index_outside_its_table():
    values, offsets, base, num_rows, weight = _feature_major_batch(2)
    values[-1] = 9  # the last feature's table has 9 rows
    with pytest.raises(kernels.IndexOutsideTable) as raised:
        kernels.pool(weight, feature_segments(values, offsets, base, num_rows))
    assert raised.value.position == values.numel() - 1


TABLES = [TableConfig("a", 7, 4), TableConfig("b", 300, 4), TableConfig("c", 11, 4)]


@pytest.mark.parametrize("seed", [0, 1])
def test_collection_pools_and_differentiates_as_the_torch_operators(monkeypatch, seed):
    batch = random_batch(TABLES, batch_size=9, num_dense=1, max_bag=5, seed=seed)
    results = []
    for by_kernels in (True, False):
        monkeypatch.setattr(embedding, "pools_by_kernels", lambda weight, use=by_kernels: use)
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(TABLES)
        out = ebc(batch)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results.append((out, ebc.weight.grad))
    (out, grad), (expected_out, expected_grad) = results
    assert torch.equal(out, expected_out)
    assert torch.equal(grad._indices(), expected_grad._indices()) and torch.equal(grad._values(), expected_grad._values())


def test_collection_names_the_feature_of_an_index_outside_its_table():
    batch = random_batch(TABLES, batch_size=4, num_dense=1, max_bag=3, seed=3)
    start = int(batch.sparse_offsets[4])  # the first value of feature "b"
    assert batch.sparse_offsets[8] > start
    batch.sparse_values[start] = 300
    with pytest.raises(DistrecError, match="'b' has index 300 but its table has 300 rows"):
        EmbeddingBagCollection(TABLES)(batch)
