import json

import numpy as np
import pytest
import torch

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.hotline.hot_set import HotSet, hot_row_bytes, is_popular, select_hot_set, split_batch
from distrec.hotline.rows import RowSpace, find_sorted
from distrec.tables import TableConfig

TABLES = [TableConfig("a", 10, 4), TableConfig("b", 6, 4)]
SPACE = RowSpace.from_tables(TABLES)


def make_batch(bags: list[list[list[int]]], n_dense: int = 2) -> Batch:
    """A Batch from bags[f][b] = indices of feature f for sample b."""
    lengths = [len(bag) for feature in bags for bag in feature]
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), 0)
    values = torch.tensor([i for feature in bags for bag in feature for i in bag], dtype=torch.int64)
    b = len(bags[0])
    return Batch(torch.arange(b * n_dense, dtype=torch.float32).view(b, n_dense), values, offsets, torch.arange(b) % 2 * 1.0)


def sample_bags(batch: Batch) -> list[tuple[tuple[int, ...], ...]]:
    """Per sample, its bag of every feature."""
    offsets = batch.sparse_offsets.tolist()
    values = batch.sparse_values.tolist()
    f, b = batch.num_features, batch.batch_size
    return [tuple(tuple(values[offsets[i * b + s] : offsets[i * b + s + 1]]) for i in range(f)) for s in range(b)]


def test_row_space_maps_batches_to_global_ids():
    batch = make_batch([[[1], [9, 0]], [[5], []]])
    assert SPACE.batch_ids(batch).tolist() == [1, 9, 0, 15]
    table, rows = SPACE.to_table_rows(np.array([0, 9, 10, 15]))
    assert table.tolist() == [0, 0, 1, 1] and rows.tolist() == [0, 9, 0, 5]
    with pytest.raises(DistrecError):
        SPACE.batch_ids(make_batch([[[1]], [[6]]]))  # row 6 is outside table b


def test_selection_takes_exactly_the_top_rows_that_fit():
    ids = np.array([3, 12, 0, 7, 15, 9])
    counts = np.array([50, 40, 40, 30, 0, 10])  # 12 and 0 tie: the smaller id ranks first
    row = hot_row_bytes(4)
    assert row == 4 * 4 + 8
    hot = select_hot_set(ids, counts, SPACE, row, budget_bytes=3 * row)
    assert {k: v.tolist() for k, v in hot.rows.items()} == {"a": [0, 3], "b": [2]}
    assert hot.budget_bytes == 3 * row
    hot = select_hot_set(ids, counts, SPACE, row, budget_bytes=3 * row - 1)
    assert hot.global_ids(SPACE).tolist() == [0, 3]
    everything = select_hot_set(ids, counts, SPACE, row, budget_bytes=10**6)
    assert everything.global_ids(SPACE).tolist() == [0, 3, 7, 9, 12]  # never-counted row 15 stays cold


def test_selection_stops_at_the_first_row_that_does_not_fit():
    ids, counts = np.array([1, 11, 2]), np.array([9, 8, 7])
    hot = select_hot_set(ids, counts, SPACE, row_bytes=[10, 100], budget_bytes=105)
    assert hot.global_ids(SPACE).tolist() == [1]


def test_save_load_round_trip(tmp_path):
    hot = HotSet.from_global_ids(np.array([12, 3, 0]), SPACE, 1234)
    path = tmp_path / "hot.json"
    hot.save(path)
    loaded = HotSet.load(path, TABLES)
    assert loaded.budget_bytes == 1234
    assert loaded.global_ids(SPACE).tolist() == [0, 3, 12]
    assert [p.name for p in tmp_path.iterdir()] == ["hot.json"]


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"tables": {}}),
        json.dumps({"budget_bytes": -1, "tables": {}}),
        json.dumps({"budget_bytes": 1, "tables": {"a": [1], "c": []}}),
        json.dumps({"budget_bytes": 1, "tables": {"a": [1], "b": [6]}}),
        json.dumps({"budget_bytes": 1, "tables": {"a": [3, 1], "b": []}}),
    ],
)
def test_load_rejects_bad_files(tmp_path, content):
    path = tmp_path / "hot.json"
    path.write_text(content)
    with pytest.raises(DistrecError):
        HotSet.load(path, TABLES)


def test_load_of_a_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(DistrecError, match="not found"):
        HotSet.load(tmp_path / "none.json")


def test_popular_mask_on_a_hand_made_batch():
    # hot rows: a{1, 2}, b{0}
    hot_ids = torch.from_numpy(HotSet.from_global_ids(np.array([1, 2, 10]), SPACE, 0).global_ids(SPACE))
    batch = make_batch(
        [
            [[1], [1, 2], [3], [], [2, 2]],  # feature a
            [[0], [0], [0], [], [5]],  # feature b
        ]
    )
    mask = is_popular(batch, find_sorted(hot_ids, SPACE.batch_ids(batch))[0])
    assert mask.tolist() == [True, True, False, True, False]
    empty = is_popular(batch, find_sorted(torch.empty(0, dtype=torch.int64), SPACE.batch_ids(batch))[0])
    assert empty.tolist() == [False, False, False, True, False]  # only the sample touching nothing


def test_split_then_merge_recovers_the_batch():
    gen = torch.Generator().manual_seed(0)
    b, f = 16, 2
    lengths = torch.randint(0, 4, (f * b,), generator=gen)
    values = torch.cat([torch.randint(0, TABLES[i].num_rows, (int(lengths[i * b : (i + 1) * b].sum()),), generator=gen) for i in range(f)])
    offsets = torch.zeros(f * b + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    batch = Batch(torch.randn(b, 3, generator=gen), values, offsets, torch.randint(0, 2, (b,), generator=gen).float())
    hot_ids = torch.tensor([0, 1, 2, 3, 10, 11])
    mask = is_popular(batch, find_sorted(hot_ids, SPACE.batch_ids(batch))[0])
    assert 0 < int(mask.sum()) < b
    popular, positions, rest, rest_positions = split_batch(batch, mask)
    assert torch.equal(batch.sparse_values[positions], popular.sparse_values)
    assert torch.equal(batch.sparse_values[rest_positions], rest.sparse_values)
    assert popular.batch_size + rest.batch_size == b
    assert all(i in (0, 1, 2, 3) for i in popular.feature_values(0).tolist())
    assert all(i in (0, 1) for i in popular.feature_values(1).tolist())
    parts = {True: iter(sample_bags(popular)), False: iter(sample_bags(rest))}
    dense = {True: iter(popular.dense), False: iter(rest.dense)}
    labels = {True: iter(popular.labels.tolist()), False: iter(rest.labels.tolist())}
    for s, is_pop in enumerate(mask.tolist()):
        assert next(parts[is_pop]) == sample_bags(batch)[s]
        assert torch.equal(next(dense[is_pop]), batch.dense[s])
        assert next(labels[is_pop]) == batch.labels[s].item()
