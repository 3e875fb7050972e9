import numpy as np
import pytest
import torch

from distrec.errors import DistrecError
from distrec.hotline.access_logger import (
    DEFAULT_LOGGER_BYTES,
    AccessLogger,
    ExactCounter,
    KeyMix,
    logger_bytes_for,
    measure_recall,
    top_k_recall,
)

ENTRY = 4  # bytes of a uint32 entry


def zipf_stream(num_rows: int, batches: int, ids_per_batch: int, exponent: float = 1.05, seed: int = 0) -> list[np.ndarray]:
    """Batches of global ids drawn from a finite Zipf law over shuffled row ids."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, num_rows + 1) ** exponent
    p /= p.sum()
    rank_to_row = rng.permutation(num_rows)
    return [rank_to_row[rng.choice(num_rows, size=ids_per_batch, p=p)] for _ in range(batches)]


def test_memory_is_fixed_by_capacity_not_by_stream_length():
    logger = AccessLogger(capacity_bytes=10_000, sample_rate=1.0, ways=8, total_rows=10**9)
    assert logger.nbytes == logger.num_sets * logger.ways * ENTRY <= 10_000
    before = logger.nbytes
    rng = np.random.default_rng(1)
    for _ in range(200):
        logger.observe(rng.integers(0, 10**9, size=5_000))
    ids, counts = logger.counts()
    assert logger.nbytes == before
    assert ids.size == logger.num_sets * logger.ways  # full, yet not grown
    assert counts.min() >= 1


def test_counts_are_exact_when_every_key_fits():
    stream = zipf_stream(500, batches=20, ids_per_batch=300, seed=2)
    logger = AccessLogger(capacity_bytes=600 * ENTRY, sample_rate=1.0, ways=600, total_rows=500)  # fully associative
    exact = ExactCounter(500)
    for ids in stream:
        logger.record(torch.from_numpy(ids))
        exact.record(ids)
    ids, counts = logger.counts()
    np.testing.assert_array_equal(counts, exact.per_row[ids])
    np.testing.assert_array_equal(np.sort(ids), exact.counts()[0])


def test_recall_of_zipf_top_rows_is_high_for_a_large_enough_logger():
    stream = zipf_stream(200_000, batches=60, ids_per_batch=20_000, seed=3)
    small, large = measure_recall(stream, total_rows=200_000, ks=[1000], capacities_bytes=[600, 80_000], sample_rates=[0.5], seed=4)
    assert large["logger_bytes"] <= 80_000
    assert 20 <= large["sampled_batches"] <= 40
    assert large["recall"] >= 0.95
    assert small["recall"] < large["recall"]
    assert small["unbounded_recall"] == large["unbounded_recall"] >= large["recall"]  # the same sampled mini-batches


def test_a_reused_row_survives_a_scan_longer_than_the_associativity():
    logger = AccessLogger(capacity_bytes=4 * ENTRY, sample_rate=1.0, ways=4, total_rows=1000)  # one set of 4 ways
    logger.record(np.array([7, 7]))
    logger.record(np.array([7]))  # re-referenced: predicted to recur soon
    for key in range(100, 150):  # 50 rows seen once each; LRU would have evicted 7 after 4
        logger.record(np.array([key]))
    ids, counts = logger.counts()
    assert counts[ids == 7].tolist() == [3]
    assert ids.size == 4
    logger.clear()  # a new learning window forgets it
    assert logger.counts()[0].size == 0


def test_batch_keys_are_inserted_least_frequent_first():
    logger = AccessLogger(capacity_bytes=2 * ENTRY, sample_rate=1.0, ways=2, total_rows=1000)
    logger.record(np.array([1, 2, 2, 3, 3, 3, 4]))
    ids, counts = logger.counts()
    assert dict(zip(ids.tolist(), counts.tolist())) == {2: 2, 3: 3}
    assert logger.top(1).tolist() == [3]


def test_counts_saturate_at_the_bits_the_tag_leaves():
    logger = AccessLogger(capacity_bytes=ENTRY, sample_rate=1.0, ways=1, total_rows=1 << 20)  # one entry: 20-bit tag
    assert logger.count_max == 2**10 - 1
    for _ in range(3):
        logger.record(np.full(400, 5))
    assert logger.counts()[0].tolist() == [5]
    assert logger.counts()[1].tolist() == [logger.count_max]


def test_sampling_is_seeded_and_follows_the_rate():
    def decisions(seed: int) -> list[bool]:
        logger = AccessLogger(capacity_bytes=1000, sample_rate=0.25, seed=seed, total_rows=2)
        return [logger.observe(np.array([1])) for _ in range(400)]

    first = decisions(5)
    assert first == decisions(5)
    assert first != decisions(6)
    assert 70 <= sum(first) <= 130


def test_top_k_recall_accepts_ties_at_the_boundary():
    true_counts = np.array([9, 5, 5, 1, 0])
    assert top_k_recall(np.array([0, 2]), true_counts, 2) == 1.0
    assert top_k_recall(np.array([0, 3]), true_counts, 2) == 0.5


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(capacity_bytes=1000, sample_rate=0.0),
        dict(capacity_bytes=3, sample_rate=0.5),
        dict(capacity_bytes=1000, sample_rate=0.5, ways=0),
        dict(capacity_bytes=8, sample_rate=0.5, total_rows=2**60),  # one entry: no bits left for a count
    ],
)
def test_bad_settings_are_user_errors(kwargs):
    with pytest.raises(DistrecError):
        AccessLogger(**kwargs)


def test_a_logger_sized_for_the_hot_set_finds_most_hot_rows():
    stream = zipf_stream(50_000, batches=20, ids_per_batch=20_000, seed=7)
    (result,) = measure_recall(stream, 50_000, ks=[2_000], capacities_bytes=[logger_bytes_for(2_000)], sample_rates=[1.0])
    assert result["recall"] >= 0.97
    assert result["access_coverage"] >= 0.99


def test_the_least_counted_distant_way_is_evicted():
    logger = AccessLogger(capacity_bytes=2 * ENTRY, sample_rate=1.0, ways=2, total_rows=1000)
    logger.record(np.array([9] * 5))  # way 0, count 5
    logger.record(np.array([6, 6]))  # way 1, count 2
    logger.record(np.array([8]))  # both ways age to RRPV 3; plain SRRIP would evict way 0
    assert sorted(logger.counts()[0].tolist()) == [8, 9]


def test_rows_seen_once_replace_each_other():
    logger = AccessLogger(capacity_bytes=2 * ENTRY, sample_rate=1.0, ways=2, total_rows=1000)
    logger.record(np.array([9, 9]))
    logger.record(np.array([1]))
    logger.record(np.array([2]))  # replaces 1 (distant, count 1), not 9
    assert sorted(logger.counts()[0].tolist()) == [2, 9]


def test_the_key_mix_is_a_bijection_that_spreads_consecutive_ids():
    for bits in (1, 5, 17, 33, 63):
        mix = KeyMix(bits)
        keys = np.random.default_rng(bits).integers(0, 2**bits, 5_000, dtype=np.uint64)
        mixed = mix(keys)
        assert mixed.max() < 2**bits
        np.testing.assert_array_equal(mix.inverse(mixed), keys)
    mixed = KeyMix(12)(np.arange(4096))
    assert np.unique(mixed).size == 4096
    per_set = np.bincount((KeyMix(23)(np.arange(100_000)) % np.uint64(1000)).astype(np.int64), minlength=1000)
    assert per_set.std() < 1.3 * np.sqrt(100)  # about Poisson's spread: no set gets a run of ids


def test_row_ids_come_back_exactly_from_set_and_tag():
    total_rows = 8_000_003
    logger = AccessLogger(capacity_bytes=64 * 1024, sample_rate=1.0, total_rows=total_rows)
    ids = np.array([0, 1, 2, 4095, 4096, 7_999_999, total_rows - 1])
    logger.record(np.repeat(ids, np.arange(1, ids.size + 1)))
    held, counts = logger.counts()
    assert dict(zip(held.tolist(), counts.tolist())) == dict(zip(ids.tolist(), range(1, ids.size + 1)))
    with pytest.raises(DistrecError, match="outside"):
        logger.record(np.array([total_rows]))


def test_the_default_logger_is_the_papers_size_with_four_bytes_an_entry():
    logger = AccessLogger(DEFAULT_LOGGER_BYTES, total_rows=8_002_500)
    assert logger.nbytes == 4 << 20 and logger.entries == 1 << 20
    assert logger.count_max == 2**23 - 1  # 65,536 sets leave 7 bits of the 23-bit key for the tag
    huge = AccessLogger(DEFAULT_LOGGER_BYTES, total_rows=2**40)
    assert (huge.nbytes, huge.entries, huge.count_max) == (4 << 20, 1 << 19, 2**37 - 1)  # uint64 entries: a uint32 would leave 6 bits


def test_save_and_load_continue_the_window(tmp_path):
    logger = AccessLogger(4096, sample_rate=0.5, seed=3, total_rows=1000)
    for i in range(10):
        logger.observe(np.arange(i, 100 + i))
    logger.save(tmp_path / "logger.npz")
    resumed = AccessLogger(4096, sample_rate=0.5, seed=99, total_rows=1000)
    resumed.load(tmp_path / "logger.npz")
    assert resumed.sampled_batches == logger.sampled_batches
    for a, b in zip(logger.counts(), resumed.counts()):
        np.testing.assert_array_equal(a, b)
    assert [logger.observe(np.array([1])) for _ in range(20)] == [resumed.observe(np.array([1])) for _ in range(20)]
    with pytest.raises(DistrecError, match="same tables"):
        AccessLogger(4096, sample_rate=0.5, total_rows=2000).load(tmp_path / "logger.npz")


def test_a_state_dict_round_trip_through_a_checkpoint_file_continues_the_window(tmp_path):
    """``state_dict`` (distributed Hotline's rank 0 keeps it in its checkpoint file) loads with
    ``weights_only=True`` and continues like ``save``/``load``."""
    logger = AccessLogger(4096, sample_rate=0.5, seed=3, total_rows=1000)
    for i in range(10):
        logger.observe(np.arange(i, 100 + i))
    torch.save(logger.state_dict(), tmp_path / "state.pt")
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    resumed = AccessLogger(4096, sample_rate=0.5, seed=99, total_rows=1000)
    resumed.load_state_dict(saved)
    assert resumed.sampled_batches == logger.sampled_batches
    for a, b in zip(logger.counts(), resumed.counts()):
        np.testing.assert_array_equal(a, b)
    assert [logger.observe(np.array([1])) for _ in range(20)] == [resumed.observe(np.array([1])) for _ in range(20)]
    with pytest.raises(DistrecError, match="same tables"):
        AccessLogger(8192, sample_rate=0.5, total_rows=1000).load_state_dict(saved)
