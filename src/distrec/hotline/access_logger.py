"""The access logger: counts (table, row) accesses of sampled mini-batches in bounded memory.

Hotline (Adnan et al., ISCA 2024) learns which embedding rows are hot from a small sample
of mini-batches. Counting every row exactly would need memory proportional to the tables,
so the logger is a set-associative, cache-like counter: a global row id hashes to one set
of ``ways`` entries; a hit adds to the entry's count, a miss evicts an entry chosen by
SRRIP (static re-reference interval prediction, Jaleel et al., ISCA 2010) with 2-bit
re-reference prediction values (RRPV): hits set RRPV 0, new entries start at 2, and the
victim is a way at 3, after ageing the whole set until one way reaches 3. Rows that recur
stay; rows seen once are the first to go, so scans of cold rows cannot flush the heavy
hitters. Two changes to plain SRRIP, both for the flood of one-off rows that a Zipf
stream sends through every set: a row seen once in its mini-batch enters at RRPV 3
("distant", as bimodal RRIP inserts), so one-off rows replace each other instead of
ageing the set; and among the ways at 3 the least counted is evicted, not the first. On
Zipf(1.05) streams this raised the recall of the top 2000 rows from 0.71-0.86 to
0.99-1.0 with 4 entries per row (see ``measure_recall``).

Each mini-batch updates the counter at once: its ids are deduplicated and counted
(``np.unique``), then accessed in rounds, each round touching at most one key in every
set, all sets together in vectorised numpy (so the Python loop runs once per round, about
the largest number of distinct keys of the batch falling into one set, not once per id).
Within a set the keys are accessed in ascending order of their batch count, as if the most
frequent keys of the batch were the most recently used, so they survive the batch.

``ExactCounter`` counts every access exactly (memory: 8 bytes per row of all tables); it
serves tests and the recall measurement, not training.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from distrec.errors import DistrecError
from distrec.io import atomic_path

KEY_BYTES = 8  # int64 global row id per entry (-1 = empty)
COUNT_BYTES = 4  # uint32 saturating access count per entry
RRPV_BYTES = 1  # uint8 holding the 2-bit RRPV per entry
BYTES_PER_ENTRY = KEY_BYTES + COUNT_BYTES + RRPV_BYTES  # 13 bytes

RRPV_MAX = 3  # 2-bit RRPV: 3 = "re-referenced in the distant future" (evict first)
RRPV_INSERT = 2  # SRRIP inserts with a long re-reference interval, 2^M - 2 (Jaleel et al.)
RRPV_INSERT_ONCE = 3  # a row seen once in its mini-batch enters as "distant", 2^M - 1 (BRRIP's usual insertion)
COUNT_MAX = np.iinfo(np.uint32).max
DEFAULT_WAYS = 16
ENTRIES_PER_HOT_ROW = 4  # logger entries per hot row; on Zipf(1.05) streams 4 found 0.99-1.0 of the top 2000-5000 rows
EMPTY_KEY = -1

# Odd multipliers of the splitmix64 finaliser (Steele et al., OOPSLA 2014): a bijective
# 64-bit mix, so consecutive row ids spread evenly over the sets.
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def logger_bytes_for(hot_rows: int) -> int:
    """Logger capacity (bytes) large enough to learn a hot set of ``hot_rows`` rows.

    The hot set can only hold rows the logger holds, so the logger needs at least one
    entry per hot row; ``ENTRIES_PER_HOT_ROW`` per row leaves room for the one-off rows
    that pass through every set between two accesses of a row at the hot set's boundary.
    """
    return max(1, hot_rows) * ENTRIES_PER_HOT_ROW * BYTES_PER_ENTRY


def _mix64(keys: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser of int64 keys, as uint64 (wrapping arithmetic)."""
    z = keys.astype(np.uint64)
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _as_numpy_ids(ids: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    return np.asarray(ids, dtype=np.int64).reshape(-1)


def _rounds(sets: np.ndarray) -> list[np.ndarray]:
    """Split positions of a set-sorted array into rounds holding each set at most once.

    Round j holds the j-th position of every set that has more than j; within a set the
    rounds follow the array order.
    """
    first_of_set = np.flatnonzero(np.r_[True, sets[1:] != sets[:-1]])
    rank = np.arange(sets.size) - np.repeat(first_of_set, np.diff(np.r_[first_of_set, sets.size]))
    by_round = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[by_round], np.arange(int(rank.max()) + 2))
    return [by_round[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def top_rows(ids: np.ndarray, counts: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` ids with the largest counts, most accessed first (ties: smaller id first)."""
    order = np.lexsort((ids, -counts.astype(np.int64)))
    return ids[order[:k]]


class AccessLogger:
    """A bounded-memory counter of global row accesses that samples whole mini-batches.

    Args:
        capacity_bytes: memory of the counter in bytes, ``BYTES_PER_ENTRY`` (13) per entry.
        sample_rate: fraction of mini-batches counted, in (0, 1]; the paper samples ~5%.
        ways: entries per set (associativity).
        seed: seed of the sampling decisions.

    Example:
        >>> logger = AccessLogger(capacity_bytes=1 << 20, sample_rate=1.0)
        >>> logger.observe(np.array([5, 5, 9]))
        True
        >>> logger.top(1)
        array([5])
    """

    def __init__(self, capacity_bytes: int, sample_rate: float = 0.05, ways: int = DEFAULT_WAYS, seed: int = 0):
        if not 0.0 < sample_rate <= 1.0:
            raise DistrecError(f"hotline sample rate is {sample_rate}; give a fraction of mini-batches in (0, 1], e.g. 0.05")
        entries = int(capacity_bytes) // BYTES_PER_ENTRY
        if entries < 1 or ways < 1:
            raise DistrecError(f"access logger of {capacity_bytes} bytes and {ways} ways holds no entry; give at least {BYTES_PER_ENTRY} bytes and 1 way")
        self.ways = min(ways, entries)
        self.num_sets = entries // self.ways
        self.sample_rate = sample_rate
        self.sampled_batches = 0
        self._rng = np.random.default_rng(seed)
        self._keys = np.empty((self.num_sets, self.ways), dtype=np.int64)
        self._counts = np.empty((self.num_sets, self.ways), dtype=np.uint32)
        self._rrpv = np.empty((self.num_sets, self.ways), dtype=np.uint8)
        self.clear()

    @property
    def nbytes(self) -> int:
        """Bytes held by the counter's entries (fixed at construction)."""
        return self._keys.nbytes + self._counts.nbytes + self._rrpv.nbytes

    def clear(self) -> None:
        """Forget every count (start a new learning window)."""
        self._keys.fill(EMPTY_KEY)
        self._counts.fill(0)
        self._rrpv.fill(RRPV_MAX)

    def observe(self, ids: np.ndarray | torch.Tensor) -> bool:
        """Count the global row ids of one mini-batch with probability ``sample_rate``.

        Returns whether the mini-batch was sampled; ids are copied to the host only then.
        """
        if self._rng.random() >= self.sample_rate:
            return False
        self.record(ids)
        self.sampled_batches += 1
        return True

    def record(self, ids: np.ndarray | torch.Tensor) -> None:
        """Count every id of one mini-batch (no sampling)."""
        keys, mult = np.unique(_as_numpy_ids(ids), return_counts=True)
        if keys.size == 0:
            return
        sets = (_mix64(keys) % np.uint64(self.num_sets)).astype(np.int64)
        order = np.lexsort((mult, sets))  # by set, then ascending batch count
        keys, mult, sets = keys[order], mult[order], sets[order]
        for idx in _rounds(sets):
            self._access(sets[idx], keys[idx], mult[idx])

    def _access(self, sets: np.ndarray, keys: np.ndarray, mult: np.ndarray) -> None:
        """One SRRIP access of ``keys`` (``mult`` times each) in distinct ``sets``."""
        match = self._keys[sets] == keys[:, None]  # [m, ways]
        hit = match.any(axis=1)
        rrpv = self._rrpv[sets]
        aged = rrpv + (RRPV_MAX - rrpv.max(axis=1))[:, None].astype(np.uint8)  # age until a way reaches 3
        counts = self._counts[sets]
        # among the ways predicted distant (RRPV 3), evict the least counted (empty ways count 0)
        victim = np.where(aged == RRPV_MAX, counts.astype(np.int64), np.iinfo(np.int64).max).argmin(axis=1)
        way = np.where(hit, match.argmax(axis=1), victim)
        rows = np.arange(sets.size)
        rrpv = np.where(hit[:, None], rrpv, aged)
        rrpv[rows, way] = np.where(hit, 0, np.where(mult > 1, RRPV_INSERT, RRPV_INSERT_ONCE))
        held = np.where(hit, counts[rows, way], 0).astype(np.uint64)
        self._rrpv[sets] = rrpv
        self._keys[sets, way] = keys
        self._counts[sets, way] = np.minimum(held + mult.astype(np.uint64), COUNT_MAX)

    def save(self, path: str | Path) -> None:
        """Write the entries, the sampling state and the window's sample count (``.npz``), atomically."""
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(
                f,
                keys=self._keys,
                counts=self._counts,
                rrpv=self._rrpv,
                sampled_batches=np.int64(self.sampled_batches),
                rng=np.array(json.dumps(self._rng.bit_generator.state)),
            )

    def load(self, path: str | Path) -> None:
        """Continue from a file written by ``save`` of a logger of the same size."""
        try:
            with np.load(path) as saved:
                keys, counts, rrpv = saved["keys"], saved["counts"], saved["rrpv"]
                sampled, rng = int(saved["sampled_batches"]), json.loads(str(saved["rng"]))
        except (OSError, ValueError, KeyError) as e:
            raise DistrecError(f"cannot read the access logger from {str(path)!r} ({e}); pass a file written by save") from None
        if keys.shape != self._keys.shape:
            raise DistrecError(
                f"the access logger in {str(path)!r} has {keys.size} entries, this one {self._keys.size}; resume with the same hotline.logger_size"
            )
        self._keys[...], self._counts[...], self._rrpv[...] = keys, counts, rrpv
        self.sampled_batches = sampled
        self._rng.bit_generator.state = rng

    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(global ids, access counts) of every row the counter holds, in no particular order."""
        held = self._keys != EMPTY_KEY
        return self._keys[held], self._counts[held].astype(np.int64)

    def top(self, k: int) -> np.ndarray:
        """The ``k`` most counted global ids, most accessed first."""
        return top_rows(*self.counts(), k)


class ExactCounter:
    """Exact access counts of every row (8 bytes per row of all tables), for tests and recall."""

    def __init__(self, total_rows: int):
        self._counts = np.zeros(total_rows, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return self._counts.nbytes

    @property
    def per_row(self) -> np.ndarray:
        """int64 [total_rows]: the access count of every global row id (a view)."""
        return self._counts

    def clear(self) -> None:
        self._counts.fill(0)

    def record(self, ids: np.ndarray | torch.Tensor) -> None:
        """Count every id of one mini-batch."""
        keys, mult = np.unique(_as_numpy_ids(ids), return_counts=True)
        self._counts[keys] += mult

    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(global ids, access counts) of every row accessed at least once, ids ascending."""
        ids = np.flatnonzero(self._counts)
        return ids, self._counts[ids]

    def top(self, k: int) -> np.ndarray:
        """The ``k`` most accessed global ids, most accessed first."""
        return top_rows(*self.counts(), k)


def top_k_recall(found: np.ndarray, true_counts: np.ndarray, k: int) -> float:
    """Fraction of the true top-``k`` rows among ``found`` (its first ``k`` entries).

    A found row counts as correct when its true count reaches the ``k``-th largest true
    count, so rows tied at the boundary are all acceptable.
    """
    if k < 1:
        raise ValueError("k must be at least 1")
    kth = np.partition(true_counts, true_counts.size - k)[true_counts.size - k]
    found = np.asarray(found[:k], dtype=np.int64)
    return float(np.count_nonzero(true_counts[found] >= kth)) / k


def measure_recall(
    batches: Sequence[np.ndarray],
    total_rows: int,
    k: int,
    capacities_bytes: Sequence[int],
    sample_rates: Sequence[float],
    ways: int = DEFAULT_WAYS,
    seed: int = 0,
) -> list[dict]:
    """The logger's recall of the true top-``k`` rows of a stream, per memory and sample rate.

    Args:
        batches: the stream, one int64 array of global row ids per mini-batch.
        total_rows: rows of all tables (ids are below it).
        k: how many of the most accessed rows to find.
        capacities_bytes: logger sizes to try, in bytes.
        sample_rates: fractions of mini-batches to sample.

    Returns:
        One dict per (capacity, sample rate): ``capacity_bytes``, ``logger_bytes`` (actual),
        ``sample_rate``, ``sampled_batches``, ``recall`` (see ``top_k_recall``) and
        ``access_coverage``: accesses to the logger's top ``k`` rows over accesses to the
        true top ``k`` (what a hot set of ``k`` rows would serve, relative to the best).
    """
    exact = ExactCounter(total_rows)
    for ids in batches:
        exact.record(ids)
    true_counts = exact.per_row
    best = true_counts[exact.top(k)].sum()
    results = []
    for capacity in capacities_bytes:
        for rate in sample_rates:
            logger = AccessLogger(capacity, rate, ways=ways, seed=seed)
            for ids in batches:
                logger.observe(ids)
            found = logger.top(k)
            results.append(
                {
                    "capacity_bytes": int(capacity),
                    "logger_bytes": logger.nbytes,
                    "sample_rate": rate,
                    "sampled_batches": logger.sampled_batches,
                    "recall": top_k_recall(found, true_counts, k),
                    "access_coverage": float(true_counts[found].sum() / best),
                }
            )
    return results
