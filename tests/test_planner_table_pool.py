"""The synthetic DLRM table pool and the sharding tasks drawn from it."""

import numpy as np
import pytest

from distrec.errors import DistrecError
from distrec.planner.table_pool import (
    PUBLISHED_MEAN_POOLING_FACTOR,
    PUBLISHED_MEAN_ROWS,
    TASK_MEMORY_FILL,
    dimension_choices,
    generate_tasks,
    make_table_pool,
)


@pytest.fixture(scope="module")
def pool():
    return make_table_pool(seed=3, row_scale=1 / 64)


def test_pool_matches_published_aggregates(pool):
    assert len(pool) == 856
    assert pool.rows.mean() * 64 == pytest.approx(PUBLISHED_MEAN_ROWS, rel=0.01)
    assert pool.pooling_factors.mean() == pytest.approx(PUBLISHED_MEAN_POOLING_FACTOR, rel=0.01)
    assert np.allclose(pool.histograms.sum(axis=1), 1.0)
    assert pool.memory_per_device == 64 * 2**20


def test_pool_is_deterministic_for_a_seed(pool):
    again = make_table_pool(seed=3, row_scale=1 / 64)
    other = make_table_pool(seed=4, row_scale=1 / 64)
    assert np.array_equal(pool.rows, again.rows) and np.array_equal(pool.histograms, again.histograms)
    assert not np.array_equal(pool.rows, other.rows)


def test_dimension_choices_halve_while_divisible_by_four():
    assert dimension_choices(128) == [128, 64, 32, 16, 8, 4]
    assert dimension_choices(4) == [4]
    with pytest.raises(DistrecError):
        dimension_choices(6)


@pytest.mark.parametrize("devices,count_range", [(4, (10, 60)), (8, (20, 120))])
def test_tasks_respect_table_counts_dims_and_memory(pool, devices, count_range):
    tasks = generate_tasks(pool, 40, devices, max_dim=64, seed=1)
    assert len(tasks) == 40
    counts = [len(t.tables) for t in tasks]
    assert min(counts) >= count_range[0] and max(counts) <= count_range[1]
    assert max(counts) - min(counts) > count_range[1] // 4  # the counts really vary
    for task in tasks:
        assert task.num_devices == devices and task.memory_per_device == pool.memory_per_device
        assert {t.dim for t in task.tables} <= {64, 32, 16, 8, 4}
        assert sum(t.num_bytes for t in task.tables) <= devices * task.memory_per_device * TASK_MEMORY_FILL
        assert len({t.name for t in task.tables}) == len(task.tables)


def test_tasks_are_deterministic_for_a_seed(pool):
    a = generate_tasks(pool, 5, 4, 32, seed=7)
    b = generate_tasks(pool, 5, 4, 32, seed=7)
    assert [t.pool_ids for t in a] == [t.pool_ids for t in b]
    assert [t.tables for t in a] == [t.tables for t in b]
