import threading

import numpy as np
import pytest
import torch

from distrec.config import DataConfig
from distrec.data import Dataset, num_batches, table_index, table_rows
from distrec.data.prefetch import THREAD_NAME, prefetch
from distrec.data.source import Chunk, SparseFeature
from distrec.errors import DistrecError
from distrec.tables import TableConfig


def toy(n=10, cfg=None) -> Dataset:
    """Rows r: dense [r, -r], label r % 2, 'a' = r (single-hot), 'b' = bag [r+1]*(r % 3) (multi-hot)."""
    r = np.arange(n)
    lengths = (r % 3).astype(np.int32)
    chunk = Chunk(
        dense=np.stack([r, -r], axis=1).astype(np.float32),
        labels=(r % 2).astype(np.float32),
        sparse=[(r.astype(np.int64), np.ones(n, np.int32)), (np.repeat(r + 1, lengths).astype(np.int64), lengths)],
    )
    features = [SparseFeature("a", id_bound=n), SparseFeature("b", multi_hot=True, id_bound=n + 1)]
    return Dataset.from_chunk(chunk, features, ["x", "y"], cfg)


def test_batch_layout_is_feature_major():
    batch = toy().batch(np.array([5, 2, 3]))
    assert batch.dense.tolist() == [[5, -5], [2, -2], [3, -3]]
    assert batch.labels.tolist() == [1, 0, 1]
    assert batch.lengths().tolist() == [[1, 1, 1], [2, 2, 0]]
    assert batch.sparse_offsets.tolist() == [0, 1, 2, 3, 5, 7, 7]
    assert batch.feature_values(0).tolist() == [5, 2, 3]
    assert batch.feature_values(1).tolist() == [6, 6, 3, 3]
    assert batch.dense.dtype == torch.float32 and batch.sparse_values.dtype == torch.int64


def test_table_index_and_sizes():
    raw = np.array([0, 1, 2, 99, 100, 101, 1 << 40], np.int64)
    expected = [0 if x == 0 else 1 + (x - 1) % 99 for x in raw.tolist()]
    assert table_index(raw.copy(), 100).tolist() == expected
    cfg = DataConfig(max_ind_range=50, table_sizes={"c": 7})
    assert table_rows(SparseFeature("a"), cfg) == 50
    assert table_rows(SparseFeature("b", id_bound=20), cfg) == 20
    assert table_rows(SparseFeature("b", id_bound=90), cfg) == 50
    assert table_rows(SparseFeature("c", id_bound=90), cfg) == 7
    assert table_rows(SparseFeature("d", id_bound=1), cfg) == 2


def test_tables_wrap_ids_into_small_tables():
    dataset = toy(cfg=DataConfig(table_sizes={"a": 4}))
    assert dataset.tables(8) == [TableConfig("a", 4, 8, False), TableConfig("b", 11, 8, True)]
    assert dataset.batch(np.arange(10)).feature_values(0).tolist() == [0, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    dataset.override_tables([TableConfig("a", 100, 8), TableConfig("b", 3, 8, True)])
    batch = dataset.batch(np.array([9, 5]))
    assert batch.feature_values(0).tolist() == [9, 5] and batch.feature_values(1).tolist() == [2, 2]
    with pytest.raises(DistrecError, match="do not match the features"):
        dataset.override_tables([TableConfig("a", 4, 8)])
    with pytest.raises(DistrecError, match="table_sizes names 'zz'"):
        toy(cfg=DataConfig(table_sizes={"zz": 4}))


def test_random_split_is_disjoint_covering_and_seeded():
    dataset = toy(1000)
    split = dataset.split("random:0.1:0.2", seed=1)
    assert [len(split[k]) for k in ("train", "val", "test")] == [700, 100, 200]
    assert np.array_equal(np.sort(np.concatenate(list(split.values()))), np.arange(1000))
    assert np.array_equal(dataset.split("random:0.1:0.2", seed=1)["val"], split["val"])
    assert not np.array_equal(dataset.split("random:0.1:0.2", seed=2)["val"], split["val"])
    assert set(dataset.split("random:0.1", seed=1)) == {"train", "val"}


def test_last_split_holds_out_the_tail():
    split = toy(100).split("last:0.2")
    assert split["train"].tolist() == list(range(80)) and split["val"].tolist() == list(range(80, 100))
    split = toy(100).split("last:0.1:0.1")
    assert split["val"].tolist() == list(range(80, 90)) and split["test"].tolist() == list(range(90, 100))


@pytest.mark.parametrize("spec", ["random", "foo:0.1", "random:x", "random:1.2", "last:0.5:0.5", "last:0.1:0.1:0.1"])
def test_bad_split_spec(spec):
    with pytest.raises(DistrecError, match="e.g. random:0.1"):
        toy().split(spec)


def test_split_without_training_rows():
    with pytest.raises(DistrecError, match="leaves no training rows"):
        toy(2).split("random:0.5:0.4")


def rows_of(batches):
    return [b.dense[:, 0].long().tolist() for b in batches]


def test_batches_are_deterministic_and_resumable():
    dataset = toy(103)
    rows = np.arange(3, 103)
    first = rows_of(dataset.batches(rows, 16, shuffle=True, seed=4, epoch=2))
    assert rows_of(dataset.batches(rows, 16, shuffle=True, seed=4, epoch=2)) == first
    assert rows_of(dataset.batches(rows, 16, shuffle=True, seed=4, epoch=3)) != first
    assert sorted(sum(first, [])) == rows.tolist()  # every row once per epoch
    assert [len(b) for b in first] == [16] * 6 + [4] and len(first) == num_batches(100, 16)
    assert rows_of(dataset.batches(rows, 16, shuffle=True, seed=4, epoch=2, start_step=4)) == first[4:]
    assert rows_of(dataset.batches(rows, 16, shuffle=True, seed=4, epoch=2, drop_last=True)) == first[:6]
    assert rows_of(dataset.batches(None, 50, shuffle=False)) == [list(range(50)), list(range(50, 100)), [100, 101, 102]]


def test_resume_does_not_build_skipped_batches(monkeypatch):
    dataset = toy(100)
    built = []
    original = dataset.batch
    monkeypatch.setattr(dataset, "batch", lambda rows, *rest: built.append(rows.copy()) or original(rows, *rest))
    list(dataset.batches(None, 10, shuffle=True, seed=0, start_step=8))
    assert len(built) == 2


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]


def test_early_stop_and_errors_leave_no_thread():
    dataset = toy(1000)
    for i, _ in enumerate(dataset.batches(None, 10, shuffle=True)):
        if i == 3:
            break
    assert prefetch_threads() == []

    def make(k):
        if k == 5:
            raise ValueError("bad batch")
        return k

    with pytest.raises(ValueError, match="bad batch"):
        list(prefetch(make, range(10), threads=3))
    assert prefetch_threads() == []
    assert list(prefetch(lambda k: k * k, range(100), depth=3, threads=2)) == [k * k for k in range(100)]


def test_table_rows_of_extreme_ids_match_the_remainder():
    raw = np.array([0, 1, 2, 3, 1 << 32, (1 << 32) + 1, (1 << 53) - 1, 1 << 53, (1 << 53) + 1, (1 << 62) + 12345, (1 << 63) - 1], np.int64)
    raw = np.concatenate([raw, np.random.default_rng(0).integers(0, 1 << 62, 10_000)])
    for rows in (2, 3, 7, 100_000, (1 << 31) - 1, 1 << 40):
        expected = [0 if x == 0 else 1 + (x - 1) % (rows - 1) for x in raw.tolist()]
        assert table_index(raw, rows).tolist() == expected, rows


def test_batches_from_several_threads_are_the_batches_of_one():
    dataset = toy(1000)
    one = rows_of(dataset.batches(None, 37, shuffle=True, seed=1, threads=1))
    assert rows_of(dataset.batches(None, 37, shuffle=True, seed=1, threads=3, prefetch_depth=6)) == one
