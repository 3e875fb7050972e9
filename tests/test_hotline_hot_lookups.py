"""find_hot_lookups: the one-pass kernel against the torch operators it replaces."""

import pytest
import torch

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.hotline.hot_lookups import HotLookups, cold_feature_bits, find_hot_lookups, split_lookups, split_with_operators, touched_bits
from distrec.hotline.hot_set import is_popular
from distrec.hotline.rows import RowSpace, find_sorted
from distrec.kernels import compiled
from distrec.tables import TableConfig

TABLES = [TableConfig("a", 1000, 4), TableConfig("b", 7, 4), TableConfig("c", 300, 4)]
SPACE = RowSpace.from_tables(TABLES)


def random_batch(batch_size: int, max_bag: int, seed: int) -> Batch:
    """Bags of 0..max_bag indices, drawn with repeats from each table."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_bag + 1, (len(TABLES) * batch_size,), generator=gen)
    per_feature = lengths.view(len(TABLES), batch_size).sum(1).tolist()
    values = torch.cat([torch.randint(0, t.num_rows, (n,), generator=gen) for t, n in zip(TABLES, per_feature)])
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return Batch(torch.randn(batch_size, 2, generator=gen), values, offsets, torch.zeros(batch_size))


@pytest.mark.parametrize("max_bag, hot_fraction", [(1, 0.5), (4, 0.9), (3, 0.0), (2, 1.0)])
def test_the_kernel_finds_what_the_torch_operators_find(max_bag, hot_fraction):
    batch = random_batch(64, max_bag, seed=max_bag)
    gen = torch.Generator().manual_seed(1)
    hot_ids = torch.nonzero(torch.rand(SPACE.total_rows, generator=gen) < hot_fraction).view(-1)
    found = find_hot_lookups(batch, SPACE, hot_ids)
    hot, positions = find_sorted(hot_ids, SPACE.batch_ids(batch))
    assert torch.equal(found.hot, hot)
    assert torch.equal(found.positions[hot], positions[hot])
    assert torch.equal(found.popular, is_popular(batch, hot))
    assert torch.equal(found.touched, touched_bits(positions[hot], hot_ids.numel()))
    assert torch.equal(found.cold_features, cold_feature_bits(batch, hot, len(TABLES)))
    if 0 < hot_fraction < 1:
        assert 0 < int(hot.sum()) < hot.numel()


def batch_tensors(batch: Batch) -> tuple[torch.Tensor, ...]:
    """A batch's tensors (its host-side layout aside)."""
    return batch.dense, batch.sparse_values, batch.sparse_offsets, batch.labels


@pytest.mark.parametrize("max_bag, hot_fraction", [(1, 0.5), (4, 0.9), (3, 0.0), (2, 1.0)])
def test_the_kernel_splits_a_batch_as_the_torch_operators_do(max_bag, hot_fraction):
    batch = random_batch(64, max_bag, seed=max_bag + 10)
    gen = torch.Generator().manual_seed(2)
    found = find_hot_lookups(batch, SPACE, torch.nonzero(torch.rand(SPACE.total_rows, generator=gen) < hot_fraction).view(-1))
    split, expected = split_lookups(batch, found), split_with_operators(batch, found)
    for got, want in zip(split, expected):
        fields = batch_tensors(got) if isinstance(got, Batch) else got
        for a, b in zip(fields, batch_tensors(want) if isinstance(want, Batch) else want, strict=True):
            assert torch.equal(a, b)
    assert split.popular.batch_size == int(found.popular.sum())
    assert split.other_cold.sparse_values.numel() == int((~found.hot).sum())
    if 0 < hot_fraction < 1:
        assert 0 < split.popular.batch_size < batch.batch_size and split.other_hot.rows.numel() > 0


def test_split_micro_batches_hold_each_sample_s_bags_hot_and_cold():
    # 2 samples x 2 features: sample 0 looks up hot rows only, sample 1 a cold one in each feature
    values, offsets = torch.tensor([5, 6, 7, 8, 9, 10]), torch.tensor([0, 1, 3, 4, 6])
    batch = Batch(torch.tensor([[0.0], [1.0]]), values, offsets, torch.tensor([0.0, 1.0]))
    positions = torch.tensor([0, -1, 2, 3, 4, -1])
    found = HotLookups(positions >= 0, positions, torch.tensor([True, False]), torch.zeros(1, dtype=torch.uint8), torch.tensor([0b11], dtype=torch.uint8))
    split = split_lookups(batch, found)
    assert split.popular.sparse_values.tolist() == [5, 8] and split.popular.dense.tolist() == [[0.0]]
    assert [t.tolist() for t in split.popular_hot] == [[0, 3], [0, 1, 2], [0, 1]]
    assert split.other.sparse_values.tolist() == [6, 7, 9, 10] and split.other.sparse_offsets.tolist() == [0, 2, 4]
    assert [t.tolist() for t in split.other_hot] == [[2, 4], [0, 1, 2], [0, 1]]
    assert split.other_cold.sparse_values.tolist() == [6, 10] and split.other_cold.sparse_offsets.tolist() == [0, 1, 2]
    assert split.other_cold.labels.tolist() == [1.0]


@pytest.mark.parametrize("count", [0, 5, 8, 61])
def test_set_bits_lists_the_positions_that_touched_bits_set(count):
    gen = torch.Generator().manual_seed(count)
    positions = torch.unique(torch.randint(0, max(count, 1), (count // 2,), generator=gen))
    packed = touched_bits(positions, count)
    if count % 8:
        packed[-1] |= 0x80  # a bit past count is not a position
    assert torch.equal(compiled("hot_lookups").set_bits(packed, count), positions)


def test_take_and_clear_rows_moves_the_rows_out_and_zeroes_them():
    source = torch.arange(24, dtype=torch.float32).view(6, 4)
    expected_rest = source.clone()
    rows = torch.tensor([4, 1, 5])
    out = torch.empty(3, 4)
    compiled("hot_lookups").take_and_clear_rows(source, rows, out)
    assert torch.equal(out, expected_rest[rows])
    assert torch.equal(source[rows], torch.zeros(3, 4))
    assert torch.equal(source[[0, 2, 3]], expected_rest[[0, 2, 3]])


def test_touched_bits_set_one_bit_per_looked_up_row():
    assert touched_bits(torch.tensor([0, 9, 9, 3]), 11).tolist() == [0b1001, 0b10]


def test_cold_feature_bits_name_the_features_with_an_index_not_hot():
    # 2 samples x 10 features; bags: feature 0 [a, b], feature 1 [] [c], feature 9 [d], the rest empty
    offsets = torch.tensor([0, 2, 2, 2, 3] + [3] * 14 + [3, 4])
    batch = Batch(torch.zeros(2, 1), torch.zeros(4, dtype=torch.int64), offsets, torch.zeros(2))
    assert cold_feature_bits(batch, torch.tensor([True, False, True, False]), 10).tolist() == [0b1, 0b10]  # features 0 and 9
    assert cold_feature_bits(batch, torch.ones(4, dtype=torch.bool), 10).tolist() == [0, 0]
    empty = Batch(torch.zeros(0, 1), torch.zeros(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), torch.zeros(0))
    assert cold_feature_bits(empty, torch.zeros(0, dtype=torch.bool), 10).tolist() == [0, 0]


def test_an_empty_batch_and_bad_indices():
    empty = Batch(torch.zeros(0, 2), torch.zeros(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), torch.zeros(0))
    found = find_hot_lookups(empty, SPACE, torch.tensor([3, 1001]))
    assert found.hot.numel() == 0 and found.popular.numel() == 0 and found.touched.tolist() == [0]
    batch = random_batch(8, 2, seed=0)
    batch.sparse_values[-1] = TABLES[-1].num_rows  # one past the last table's end
    with pytest.raises(DistrecError, match="outside their tables"):
        find_hot_lookups(batch, SPACE, torch.tensor([3, 1001]))
    with pytest.raises(DistrecError, match="outside their tables"):  # a table whose every row is hot is read without a search
        find_hot_lookups(batch, SPACE, torch.arange(SPACE.total_rows))
    narrow = Batch(batch.dense, batch.sparse_values[: int(batch.sparse_offsets[16])], batch.sparse_offsets[:17], batch.labels)
    with pytest.raises(DistrecError, match="sparse features"):
        find_hot_lookups(narrow, SPACE, torch.tensor([3, 1001]))
