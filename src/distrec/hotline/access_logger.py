"""The access logger: counts (table, row) accesses of sampled mini-batches in a few MB.

Hotline (Adnan et al., ISCA 2024) learns which embedding rows are hot from a small sample
of mini-batches. Counting every row exactly would need memory proportional to the tables,
so the logger is a set-associative, cache-like counter of fixed size (the paper's: 4 MB,
2M entries, hashed keys, 2-bit SRRIP state; Sec. V-B): a global row id hashes to one set
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

An entry is one uint32 (uint64 when the row ids need more bits than a uint32 leaves for a
count), packed ``[count | tag | RRPV]``. A row id is first mixed by a bijection of the
``key_bits``-bit integers that number every row (``KeyMix``), so the hot rows of every
table spread evenly over the sets; the mixed key modulo the number of sets picks the set,
and the quotient, the tag, is all an entry keeps of the key. Set and tag give the row id
back exactly: no two rows share an entry and the hot set never holds a row by mistake. The
count takes the bits that are left and saturates; only rows far above the hot set's
boundary reach its maximum. Example: 8M rows, 4 MiB = 1M entries = 65,536 sets of 16 ways,
7-bit tags, 23-bit counts.

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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distrec.errors import DistrecError
from distrec.io import atomic_path

DEFAULT_LOGGER_BYTES = 4 << 20  # the paper's 4 MB: 1M entries of 4 bytes
DEFAULT_TOTAL_ROWS = 1 << 32  # row ids a logger accepts unless told its tables' total rows
DEFAULT_WAYS = 16
ENTRY_DTYPES = (np.dtype(np.uint32), np.dtype(np.uint64))  # the narrowest that leaves MIN_COUNT_BITS
MIN_COUNT_BITS = 8
ENTRIES_PER_HOT_ROW = 4  # on Zipf(1.05) streams 4 entries per row found 0.99-1.0 of the top 2000-5000 rows

RRPV_BITS = 2
RRPV_MAX = 3  # 2-bit RRPV: 3 = "re-referenced in the distant future" (evict first; empty entries hold it)
RRPV_INSERT = 2  # SRRIP inserts with a long re-reference interval, 2^M - 2 (Jaleel et al.)
RRPV_INSERT_ONCE = 3  # a row seen once in its mini-batch enters as "distant", 2^M - 1 (BRRIP's usual insertion)

# Odd multipliers of the splitmix64 finaliser (Steele et al., OOPSLA 2014).
_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def logger_bytes_for(hot_rows: int) -> int:
    """Bytes of a logger with ``ENTRIES_PER_HOT_ROW`` uint32 entries per row of ``hot_rows``
    (the hot set can only hold rows the logger holds; the spare entries hold the one-off
    rows that pass through every set between two accesses of a row at the boundary)."""
    return max(1, hot_rows) * ENTRIES_PER_HOT_ROW * ENTRY_DTYPES[0].itemsize


class KeyMix:
    """A bijection of the integers below ``2**bits`` (as uint64 arrays) and its inverse.

    Three xorshifts by ``ceil(bits / 2)`` (each its own inverse) around two odd multiplies
    modulo ``2**bits`` (splitmix64's rounds, narrowed): consecutive ids spread over the sets.
    """

    def __init__(self, bits: int):
        if not 1 <= bits <= 64:
            raise ValueError("bits must be in 1..64")
        self.bits = bits
        modulus = 1 << bits
        self._mask = np.uint64(modulus - 1)
        self._shift = np.uint64((bits + 1) // 2)
        self._multipliers = [np.uint64((m % modulus) | 1) for m in _MULTIPLIERS]
        self._inverses = [np.uint64(pow(int(m), -1, modulus)) for m in self._multipliers]

    def _rounds(self, x: np.ndarray, multipliers: list[np.uint64]) -> np.ndarray:
        x = np.asarray(x, dtype=np.uint64)
        for m in multipliers:
            x = x ^ (x >> self._shift)
            x = (x * m) & self._mask
        return x ^ (x >> self._shift)

    def __call__(self, keys: np.ndarray) -> np.ndarray:
        """Mixed keys, uint64, each below ``2**bits``."""
        return self._rounds(keys, self._multipliers)

    def inverse(self, mixed: np.ndarray) -> np.ndarray:
        """The keys whose mix is ``mixed``."""
        return self._rounds(mixed, self._inverses[::-1])


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
        capacity_bytes: memory of the counter in bytes, 4 per entry (8 when ``total_rows``
            leaves a uint32 too few bits for a count).
        sample_rate: fraction of mini-batches counted, in (0, 1]; the paper samples ~5%.
        ways: entries per set (associativity).
        seed: seed of the sampling decisions.
        total_rows: rows of all tables; the ids counted must be below it (fewer rows,
            narrower tags).

    Example:
        >>> logger = AccessLogger(capacity_bytes=1 << 20, sample_rate=1.0, total_rows=100)
        >>> logger.observe(np.array([5, 5, 9]))
        True
        >>> logger.top(1)
        array([5])
    """

    def __init__(self, capacity_bytes: int, sample_rate: float = 0.05, ways: int = DEFAULT_WAYS, seed: int = 0, total_rows: int = DEFAULT_TOTAL_ROWS):
        if not 0.0 < sample_rate <= 1.0:
            raise DistrecError(f"hotline sample rate is {sample_rate}; give a fraction of mini-batches in (0, 1], e.g. 0.05")
        if ways < 1 or total_rows < 1:
            raise DistrecError(f"access logger of {ways} ways for {total_rows} rows; give at least 1 way and 1 row")
        self.total_rows = int(total_rows)
        self._mix = KeyMix(max(1, (self.total_rows - 1).bit_length()))
        for dtype in ENTRY_DTYPES:
            entries = int(capacity_bytes) // dtype.itemsize
            self.ways = min(ways, max(1, entries))
            self.num_sets = entries // self.ways
            largest_tag = ((1 << self._mix.bits) - 1) // max(1, self.num_sets)
            tag_bits = largest_tag.bit_length()
            count_bits = 8 * dtype.itemsize - RRPV_BITS - tag_bits
            if self.num_sets >= 1 and count_bits >= MIN_COUNT_BITS:
                break
        else:
            raise DistrecError(f"an access logger of {capacity_bytes} bytes cannot count {total_rows} rows; give hotline.logger_size of at least 1MB")
        self._type = dtype.type
        self._tag_mask = self._type((1 << tag_bits) - 1)
        self._count_shift = self._type(RRPV_BITS + tag_bits)
        self.count_max = (1 << count_bits) - 1
        self.sample_rate = sample_rate
        self.sampled_batches = 0
        self._rng = np.random.default_rng(seed)
        self._entries = np.empty((self.num_sets, self.ways), dtype=dtype)
        self.clear()

    @property
    def nbytes(self) -> int:
        """Bytes held by the counter's entries (fixed at construction)."""
        return self._entries.nbytes

    @property
    def entries(self) -> int:
        """Rows the counter can hold at once."""
        return self._entries.size

    def clear(self) -> None:
        """Forget every count (start a new learning window)."""
        self._entries.fill(RRPV_MAX)  # count 0 = empty, predicted distant

    def _unpack(self, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(int64 counts, tags, int64 RRPVs) of packed entries."""
        counts = (entries >> self._count_shift).astype(np.int64)
        tags = (entries >> self._type(RRPV_BITS)) & self._tag_mask
        return counts, tags, (entries & self._type(RRPV_MAX)).astype(np.int64)

    def _pack(self, counts: np.ndarray, tags: np.ndarray, rrpv: np.ndarray) -> np.ndarray:
        t = self._type
        return (counts.astype(t) << self._count_shift) | (tags.astype(t) << t(RRPV_BITS)) | rrpv.astype(t)

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
        if keys[0] < 0 or keys[-1] >= self.total_rows:
            bad = keys[0] if keys[0] < 0 else keys[-1]
            raise DistrecError(f"row id {bad} is outside the access logger's {self.total_rows} rows; build the logger with the tables' total_rows")
        mixed = self._mix(keys)
        sets = (mixed % np.uint64(self.num_sets)).astype(np.int64)
        tags = mixed // np.uint64(self.num_sets)
        order = np.lexsort((mult, sets))  # by set, then ascending batch count
        tags, mult, sets = tags[order], mult[order], sets[order]
        for idx in _rounds(sets):
            self._access(sets[idx], tags[idx], mult[idx])

    def _access(self, sets: np.ndarray, tags: np.ndarray, mult: np.ndarray) -> None:
        """One SRRIP access of the keys ``tags`` (``mult`` times each) in distinct ``sets``."""
        counts, held_tags, rrpv = self._unpack(self._entries[sets])  # [m, ways] each
        match = (counts > 0) & (held_tags == tags.astype(held_tags.dtype)[:, None])
        hit = match.any(axis=1)
        aged = rrpv + (RRPV_MAX - rrpv.max(axis=1))[:, None]  # age until a way reaches 3
        # among the ways predicted distant (RRPV 3), evict the least counted (empty ways count 0)
        victim = np.where(aged == RRPV_MAX, counts, np.iinfo(np.int64).max).argmin(axis=1)
        way = np.where(hit, match.argmax(axis=1), victim)
        rows = np.arange(sets.size)
        rrpv = np.where(hit[:, None], rrpv, aged)
        rrpv[rows, way] = np.where(hit, 0, np.where(mult > 1, RRPV_INSERT, RRPV_INSERT_ONCE))
        counts[rows, way] = np.minimum(np.where(hit, counts[rows, way], 0) + mult, self.count_max)
        held_tags[rows, way] = tags
        self._entries[sets] = self._pack(counts, held_tags, rrpv)

    def save(self, path: str | Path) -> None:
        """Write the entries, the sampling state and the window's sample count (``.npz``), atomically."""
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(
                f,
                entries=self._entries,
                total_rows=np.int64(self.total_rows),
                sampled_batches=np.int64(self.sampled_batches),
                rng=np.array(json.dumps(self._rng.bit_generator.state)),
            )

    def load(self, path: str | Path) -> None:
        """Continue from a file written by ``save`` of a logger of the same size and rows."""
        try:
            with np.load(path) as saved:
                entries, total_rows = saved["entries"], int(saved["total_rows"])
                sampled, rng = int(saved["sampled_batches"]), json.loads(str(saved["rng"]))
        except (OSError, ValueError, KeyError) as e:
            raise DistrecError(f"cannot read the access logger from {str(path)!r} ({e}); pass a file written by save") from None
        self._restore(entries, total_rows, sampled, rng, f"the access logger in {str(path)!r}")

    def state_dict(self) -> dict[str, Any]:
        """What ``save`` writes, for a checkpoint's state dict (``torch.load(weights_only=True)``
        loads it): the entries as bytes (uint8 tensor), the rows, the window's sample count and
        the sampling state (JSON)."""
        return {
            "entries": torch.from_numpy(self._entries.reshape(-1).view(np.uint8).copy()),
            "total_rows": self.total_rows,
            "sampled_batches": self.sampled_batches,
            "rng": json.dumps(self._rng.bit_generator.state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()`` of a logger of the same size and rows."""
        raw = state["entries"].numpy()
        entries = raw.view(self._entries.dtype) if raw.size % self._entries.itemsize == 0 else raw
        self._restore(entries, int(state["total_rows"]), int(state["sampled_batches"]), json.loads(state["rng"]), "the saved access logger")

    def _restore(self, entries: np.ndarray, total_rows: int, sampled: int, rng: dict[str, Any], what: str) -> None:
        """Take saved entries (any shape), rows, sample count and sampling state, after checking they fit."""
        if entries.size != self._entries.size or entries.dtype != self._entries.dtype or total_rows != self.total_rows:
            raise DistrecError(
                f"{what} has {entries.size} entries for {total_rows} rows, this one {self.entries} for "
                f"{self.total_rows}; resume with the same tables and hotline.logger_size"
            )
        self._entries[...] = entries.reshape(self._entries.shape)
        self.sampled_batches = sampled
        self._rng.bit_generator.state = rng

    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(global ids, access counts) of every row the counter holds, in no particular order."""
        held = np.flatnonzero(self._entries >> self._count_shift)  # flat positions of non-empty entries
        counts, tags, _ = self._unpack(self._entries.reshape(-1)[held])
        sets = (held // self.ways).astype(np.uint64)
        ids = self._mix.inverse(tags.astype(np.uint64) * np.uint64(self.num_sets) + sets)
        return ids.astype(np.int64), counts

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
    batches: Iterable[np.ndarray],
    total_rows: int,
    ks: Sequence[int],
    capacities_bytes: Sequence[int],
    sample_rates: Sequence[float],
    ways: int = DEFAULT_WAYS,
    seed: int = 0,
) -> list[dict]:
    """The logger's recall of the true top-``k`` rows of a stream, per memory, sample rate and ``k``.

    One pass over ``batches`` (a generator will do: memory is the loggers' plus 8 bytes per
    row of all tables per sample rate, plus one for the true counts). The loggers of one
    sample rate share the seed, so they sample the same mini-batches; every id of those is
    also counted exactly, which gives what a logger of unbounded memory would find.

    Args:
        batches: the stream, one int64 array of global row ids per mini-batch.
        total_rows: rows of all tables (ids are below it).
        ks: how many of the most accessed rows to find (one result per ``k``).
        capacities_bytes: logger sizes to try, in bytes.
        sample_rates: fractions of mini-batches to sample.

    Returns:
        One dict per (capacity, sample rate, k): ``capacity_bytes``, ``logger_bytes``
        (actual), ``entries``, ``sample_rate``, ``sampled_batches``, ``k``, ``recall`` (see
        ``top_k_recall``), ``access_coverage`` (accesses to the logger's top ``k`` rows over
        accesses to the true top ``k``: what a hot set of ``k`` rows would serve, relative to
        the best) and ``unbounded_recall`` / ``unbounded_access_coverage``: the same for the
        exact counts of the sampled mini-batches.
    """
    exact = ExactCounter(total_rows)
    loggers = {(c, r): AccessLogger(c, r, ways=ways, seed=seed, total_rows=total_rows) for c in capacities_bytes for r in sample_rates}
    unbounded = {r: ExactCounter(total_rows) for r in sample_rates}
    for ids in batches:
        ids = _as_numpy_ids(ids)
        exact.record(ids)
        for r in sample_rates:
            if any([loggers[c, r].observe(ids) for c in capacities_bytes]):  # a list: every logger draws
                unbounded[r].record(ids)
    true_counts = exact.per_row
    deepest = max(ks, default=0)
    best = np.r_[0, np.cumsum(true_counts[exact.top(deepest)])]  # accesses to the true top 0, 1, 2, ... rows

    def scores(ranked: np.ndarray, k: int) -> tuple[float, float]:
        return top_k_recall(ranked, true_counts, k), float(true_counts[ranked[:k]].sum() / max(1, best[min(k, best.size - 1)]))

    unbounded_top = {r: counter.top(deepest) for r, counter in unbounded.items()}
    results = []
    for (capacity, rate), logger in loggers.items():
        ranked = logger.top(deepest)
        for k in ks:
            recall, coverage = scores(ranked, k)
            unbounded_recall, unbounded_coverage = scores(unbounded_top[rate], k)
            results.append(
                {
                    "capacity_bytes": int(capacity),
                    "logger_bytes": logger.nbytes,
                    "entries": logger.entries,
                    "sample_rate": rate,
                    "sampled_batches": logger.sampled_batches,
                    "k": int(k),
                    "recall": recall,
                    "access_coverage": coverage,
                    "unbounded_recall": unbounded_recall,
                    "unbounded_access_coverage": unbounded_coverage,
                }
            )
    return results
