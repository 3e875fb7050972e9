"""Copying the bags of selected rows out of a jagged column."""

import numpy as np
import pytest

from distrec.data.source import gather_bags
from distrec.kernels.jagged import select_bags


def reference(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bags = [values[offsets[r] : offsets[r + 1]] for r in rows]
    return (np.concatenate(bags) if bags else values[:0]), np.array([len(b) for b in bags], np.int64)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_bags_come_out_in_the_order_of_the_rows_with_their_lengths(dtype):
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 40, 500)  # empty bags included
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.integers(0, 1 << 30, int(offsets[-1])).astype(dtype)
    for rows in (np.sort(rng.choice(500, 64, replace=False)), rng.integers(0, 500, 100), np.array([499, 0, 0, 7]), np.zeros(0, np.int64)):
        got_values, got_lengths = gather_bags(values, offsets, rows)
        want_values, want_lengths = reference(values, offsets, rows)
        assert got_values.dtype == values.dtype and got_lengths.dtype == np.int64
        assert np.array_equal(got_values, want_values) and np.array_equal(got_lengths, want_lengths)


def test_a_row_past_the_column_is_refused():
    offsets = np.array([0, 2, 3], np.int64)
    with pytest.raises(IndexError):
        gather_bags(np.arange(3), offsets, np.array([2]))


def test_selected_samples_keep_every_feature_s_bags_in_the_order_of_the_rows():
    rng = np.random.default_rng(1)
    num_features, batch_size = 3, 20
    lengths = rng.integers(0, 5, num_features * batch_size)  # empty bags included
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.integers(0, 1000, int(offsets[-1]))
    for rows in (np.array([3, 0, 19, 3]), np.sort(rng.choice(batch_size, 7, replace=False)), np.zeros(0, np.int64)):
        got_values, got_offsets, positions = select_bags(values, offsets, batch_size, rows)
        bags = [(f * batch_size + r) for f in range(num_features) for r in rows]
        want_values, want_lengths = reference(values, offsets, np.array(bags, np.int64))
        assert np.array_equal(got_values, want_values) and np.array_equal(np.diff(got_offsets), want_lengths)
        assert np.array_equal(values[positions], got_values)
        assert np.array_equal(positions, np.concatenate([np.arange(offsets[b], offsets[b + 1]) for b in bags] or [np.zeros(0, np.int64)]))
    with pytest.raises(IndexError):
        select_bags(values, offsets, batch_size, np.array([batch_size]))
    with pytest.raises(IndexError):
        select_bags(values, offsets, batch_size, np.array([-1]))
