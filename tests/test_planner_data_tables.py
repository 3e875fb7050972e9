"""Table statistics measured from a data set: rows as training sizes them, pooling, histogram."""

import numpy as np
import pytest

from distrec.config import DataConfig
from distrec.data import Dataset
from distrec.data.source import Chunk, SparseFeature
from distrec.errors import DistrecError
from distrec.planner.data_tables import table_specs_from_dataset


@pytest.fixture
def dataset():
    """8 rows: "user" single-hot ids 1..8 (id_bound 9), "tags" bags of 0-3 hashed ids."""
    user = (np.array([1, 2, 1, 3, 1, 2, 4, 5]), np.ones(8, np.int32))
    lengths = np.array([2, 0, 3, 1, 2, 1, 0, 3], np.int32)
    tags = (np.array([7, 7, 9, 9, 9, 7, 7, 8, 9, 7, 7, 7]), lengths)
    chunk = Chunk(np.zeros((8, 1), np.float32), np.zeros(8, np.float32), [user, tags])
    features = [SparseFeature("user", id_bound=9), SparseFeature("tags", multi_hot=True)]
    return Dataset.from_chunk(chunk, features, ["d"], DataConfig(max_ind_range=50))


def test_rows_pooling_and_per_batch_histograms(dataset):
    user, tags = table_specs_from_dataset(dataset, dim=8, batch_size=4, progress=False)
    assert (user.name, user.num_rows, user.dim, user.pooling_factor) == ("user", 9, 8, 1.0)
    assert (tags.name, tags.num_rows, tags.pooling_factor) == ("tags", 50, 12 / 8)
    # user: batch 1 accesses 1,2,1,3 -> counts 2,1,1; batch 2: 1,2,4,5 -> 1,1,1,1
    assert user.histogram[:3] == pytest.approx((6 / 7, 1 / 7, 0.0))
    # tags: batch 1 (bags 2,0,3,1) -> 7x2, 9x3, 7x1 -> row 7: 3, row 9: 3; batch 2 -> 7x1, 8, 9, 7x3 -> row 7: 4, 8: 1, 9: 1
    assert tags.histogram[:4] == pytest.approx((2 / 5, 0.0, 3 / 5, 0.0))


def test_sample_rows_caps_what_is_read(dataset):
    user, tags = table_specs_from_dataset(dataset, dim=8, batch_size=4, sample_rows=4, progress=False)
    assert tags.pooling_factor == 6 / 4 and user.histogram[:2] == pytest.approx((2 / 3, 1 / 3))


def test_bad_batch_size_is_a_user_error(dataset):
    with pytest.raises(DistrecError, match="batch size 0"):
        table_specs_from_dataset(dataset, dim=8, batch_size=0, progress=False)
