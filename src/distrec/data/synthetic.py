"""Criteo-shaped synthetic click data with a planted click model.

Row ``r`` of a data set depends only on (config, r): every random number is a hash of
(seed, stream, counter) (a counter-based generator built on the SplitMix64 finaliser,
Steele et al., OOPSLA 2014), so ``generate(start_row, n)`` returns the same rows however a
data set is cut into chunks, and any range can be produced without the rows before it.

The data:
- categorical feature f takes ``pooling_factor`` values per row (1 = single-hot); each
  is a Zipf-distributed popularity rank (exponent per table), placed on a table row by a
  random permutation rotated by a per-table offset, so hot rows are scattered and differ
  between tables. With ``drift_period_rows`` > 0 the offset changes every period:
  yesterday's hot rows go cold.
  Raw ids are table rows 1..table_rows-1 (row 0 is the "missing" row, unused here).
- dense feature j is ``log(1 + c)`` of a geometric count c, as Criteo's dense columns.
- the click probability is ``sigmoid(bias + first-order + dense + interactions)``: a
  weight per (feature, table row), a weight per dense feature, and, with
  ``interaction_groups`` = G > 0, factorisation-machine pairs ``<v_f(i), v_g(j)>``
  between the features of the same group only (the planted ground truth for the tower
  partitioner; see :attr:`SyntheticGenerator.groups`). The bias is set for about 25%
  clicks, as in Criteo.

A *draw* of a row is one realisation of it: draw 0 is the data set (what ``generate`` and
the cache hold); draw d > 0 samples the row's ids, dense values and label anew from the same
planted model and drift period (its own random streams), so training can see fresh rows
every epoch (``data.synthetic.fresh_each_epoch``) instead of memorising the same ones.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from distrec.config import SyntheticConfig
from distrec.data.criteo import CriteoWriter
from distrec.data.source import Chunk, MalformedRows, Source, SparseFeature
from distrec.errors import DistrecError

# Standard deviations of the planted logit's parts (first-order sum, dense sum,
# interaction sum); large enough that a good model reaches AUC ~0.75-0.8.
FIRST_ORDER_STD = 1.0
DENSE_STD = 0.5
INTERACTION_STD = 1.0
LATENT_DIM = 4
TARGET_CTR = 0.25  # Criteo Kaggle has about 25.6% clicks
CALIBRATION_ROWS = 16_384
MAX_TABLE_ROWS = 1 << 31  # the placement permutation is int32

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
# Kinds of random streams; a stream is (kind, feature) and counts over rows or table rows.
_RANK, _DENSE, _LABEL, _DRIFT, _WEIGHT, _LATENT = range(6)
# Extra seed words for the NumPy generators of the fixed parameters (groups, model).
_GROUPS_SEED, _MODEL_SEED = 0x6770, 0x5EED


def _mix_int(z: int) -> int:
    """SplitMix64 finaliser on a Python int (for stream keys)."""
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


def _hash(key: np.uint64, counters: np.ndarray) -> np.ndarray:
    """64 random bits per counter of stream ``key`` (uint64, same shape as ``counters``)."""
    return _mix(counters.astype(np.uint64) * np.uint64(_GOLDEN) + key)


def _uniform(key: np.uint64, counters: np.ndarray) -> np.ndarray:
    """Uniform floats in (0, 1), one per counter."""
    return ((_hash(key, counters) >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def zipf_exponents(cfg: SyntheticConfig, exponents: Sequence[float] | None = None) -> np.ndarray:
    """The Zipf exponent of each table: ``exponents`` if given (one per table), else the
    config's ``zipf_exponents`` if set, else ``zipf_exponent`` for every table."""
    exponents = exponents if exponents is not None else cfg.zipf_exponents or None
    if exponents is None:
        return np.full(cfg.num_sparse, float(cfg.zipf_exponent))
    values = np.asarray(exponents, np.float64)
    if values.shape != (cfg.num_sparse,) or (values < 0).any():
        raise DistrecError(f"give {cfg.num_sparse} non-negative Zipf exponents (one per table), not {list(exponents)}")
    return values


def interaction_groups(cfg: SyntheticConfig) -> np.ndarray:
    """The planted group of each categorical feature (int64 [num_sparse]), -1 when there are none.

    Groups are balanced and assigned by a seeded shuffle, so they are not the strided
    assignment a naive tower partitioner would guess.
    """
    if cfg.interaction_groups == 0:
        return np.full(cfg.num_sparse, -1, np.int64)
    if not 0 < cfg.interaction_groups <= cfg.num_sparse:
        raise DistrecError(f"synthetic.interaction_groups is {cfg.interaction_groups}; use 0 to {cfg.num_sparse}")
    rng = np.random.default_rng([cfg.seed, _GROUPS_SEED])
    return rng.permutation(np.arange(cfg.num_sparse) % cfg.interaction_groups).astype(np.int64)


class ZipfSampler:
    """Inverse-CDF sampling of ranks 0..num_ranks-1 with P(rank) proportional to (rank + 1) ** -exponent.

    The search for the rank of a uniform u starts at a guide table entry (the rank of the
    largest multiple of 1/num_ranks below u; "indexed search", Chen and Asau 1974) and
    steps forward, usually zero or one step: several times faster than a binary search
    over the CDF. Memory: 12 bytes per rank.
    """

    def __init__(self, num_ranks: int, exponent: float) -> None:
        cdf = np.cumsum(np.arange(1, num_ranks + 1, dtype=np.float64) ** -exponent)
        cdf /= cdf[-1]
        cdf[-1] = 1.0
        self.cdf = cdf
        # entry j: the rank of a value a little below j / num_ranks, so that rounding in
        # u * num_ranks can never start the search past the answer
        below = np.arange(num_ranks) / num_ranks * (1 - 2.0**-40)
        self._guide = np.searchsorted(cdf, below, side="right").astype(np.int32)

    def ranks(self, u: np.ndarray) -> np.ndarray:
        """The rank of each uniform in [0, 1): the same as ``searchsorted(cdf, u, side="right")``."""
        flat = u.reshape(-1)
        rank = self._guide[(flat * len(self._guide)).astype(np.int64)].astype(np.int64)
        behind = np.flatnonzero(self.cdf[rank] <= flat)
        while behind.size:
            rank[behind] += 1
            behind = behind[self.cdf[rank[behind]] <= flat[behind]]
        return rank.reshape(u.shape)


class SyntheticGenerator:
    """Generates rows of the synthetic data set described by a SyntheticConfig.

    Args:
        cfg: the data set (rows, features, table size, Zipf exponent, pooling, groups,
            drift, seed).
        exponents: optional Zipf exponent per table (overrides the config's exponents).

    Example:
        >>> gen = SyntheticGenerator(SyntheticConfig(table_rows=1000, seed=7))
        >>> chunk = gen.generate(start_row=4096, n=2048)   # rows 4096..6143
        >>> chunk.dense.shape, len(chunk.sparse)
        ((2048, 13), 26)
    """

    def __init__(self, cfg: SyntheticConfig, exponents: Sequence[float] | None = None) -> None:
        if not 2 <= cfg.table_rows <= MAX_TABLE_ROWS:
            raise DistrecError(f"synthetic.table_rows is {cfg.table_rows}; use 2 to {MAX_TABLE_ROWS}")
        if cfg.num_sparse < 1 or cfg.num_dense < 0 or cfg.pooling_factor < 1 or cfg.drift_period_rows < 0:
            raise DistrecError("synthetic needs num_sparse >= 1, num_dense >= 0, pooling_factor >= 1, drift_period_rows >= 0")
        self.cfg = cfg
        self.exponents = zipf_exponents(cfg, exponents)
        self.groups = interaction_groups(cfg)
        self._ranks = cfg.table_rows - 1  # raw ids 1..table_rows-1
        samplers = {e: ZipfSampler(self._ranks, e) for e in np.unique(self.exponents)}
        self._zipf = [samplers[e] for e in self.exponents]
        rng = np.random.default_rng([cfg.seed, _MODEL_SEED])
        self._placement = rng.permutation(self._ranks).astype(np.int32)
        self._offset = rng.integers(0, self._ranks, cfg.num_sparse)
        self._dense_mean_count = np.exp(rng.uniform(0.0, 5.0, cfg.num_dense))
        seed_key = _mix_int((cfg.seed * _GOLDEN) & _MASK64)
        self._keys = {(kind, f): np.uint64(_mix_int(seed_key ^ ((kind << 40) | f))) for kind in range(6) for f in range(cfg.num_sparse)}
        self._seed_key = seed_key
        self._first_scale = FIRST_ORDER_STD / math.sqrt(cfg.num_sparse)
        pairs = sum(math.comb(int(n), 2) for n in np.bincount(self.groups[self.groups >= 0]))
        # a pair's dot product of LATENT_DIM uniform entries of std s has variance LATENT_DIM * s**4
        self._latent_scale = (INTERACTION_STD**2 / (pairs * LATENT_DIM)) ** 0.25 if pairs else 0.0
        self._dense_weight = np.zeros(cfg.num_dense)
        self._dense_center = np.zeros(cfg.num_dense)
        self._bias = 0.0
        self._calibrate(rng)

    def _calibrate(self, rng: np.random.Generator) -> None:
        """Scale the dense weights to DENSE_STD and set the bias for TARGET_CTR on a sample."""
        rows = np.arange(CALIBRATION_ROWS, dtype=np.int64)
        dense = self._dense(rows)
        if self.cfg.num_dense:
            self._dense_center = dense.mean(axis=0)
            direction = rng.standard_normal(self.cfg.num_dense)
            self._dense_weight = DENSE_STD * direction / np.linalg.norm(direction) / np.maximum(dense.std(axis=0), 1e-6)
        logits = self._logits(dense, self._ids(rows))
        lo, hi = -20.0, 20.0
        for _ in range(50):  # bisection on the mean click probability
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if np.mean(1 / (1 + np.exp(-(logits + mid)))) < TARGET_CTR else (lo, mid)
        self._bias = (lo + hi) / 2

    @property
    def features(self) -> list[SparseFeature]:
        return [SparseFeature(f"C{f + 1}", self.cfg.pooling_factor > 1, self.cfg.table_rows) for f in range(self.cfg.num_sparse)]

    @property
    def dense_names(self) -> list[str]:
        return [f"I{j + 1}" for j in range(self.cfg.num_dense)]

    def _key(self, kind: int, f: int, draw: int) -> np.uint64:
        """The key of stream (kind, f) in draw ``draw`` (draw 0: the data set's streams)."""
        if draw == 0:
            return self._keys[kind, f]
        return np.uint64(_mix_int(self._seed_key ^ ((kind << 40) | f) ^ _mix_int((draw * _GOLDEN) & _MASK64)))

    def _dense(self, rows: np.ndarray, draw: int = 0) -> np.ndarray:
        """float64 [n, num_dense]: log(1 + geometric counts)."""
        d = self.cfg.num_dense
        u = _uniform(self._key(_DENSE, 0, draw), rows[:, None] * d + np.arange(d))
        return np.log1p(np.floor(-np.log(u) * self._dense_mean_count))

    def _ids(self, rows: np.ndarray, draw: int = 0) -> list[np.ndarray]:
        """Per feature, raw ids int64 [n, pooling_factor] of rows ``rows`` (any order)."""
        p, m = self.cfg.pooling_factor, self._ranks
        counters = rows[:, None] * p + np.arange(p)
        periods = np.unique(rows // self.cfg.drift_period_rows, return_inverse=True) if self.cfg.drift_period_rows else None
        ids = []
        for f in range(self.cfg.num_sparse):
            slot = self._zipf[f].ranks(_uniform(self._key(_RANK, f, draw), counters))
            slot += self._row_offsets(f, rows.shape[0], periods)[:, None]  # < 2m: wrap by one subtraction
            slot -= m * (slot >= m)
            ids.append(self._placement[slot].astype(np.int64) + 1)
        return ids

    def _row_offsets(self, f: int, n: int, periods: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        """Feature f's rank-to-slot offset for each of n rows, in [0, m): fixed, or drifting per
        period (``periods``: the distinct drift periods of the rows and each row's index among them)."""
        offset = np.full(n, self._offset[f])
        if periods is not None:
            distinct, of_row = periods
            shifts = _hash(self._keys[_DRIFT, f], distinct) % np.uint64(self._ranks)
            offset += shifts.astype(np.int64)[of_row]
            offset -= self._ranks * (offset >= self._ranks)
        return offset

    def _logits(self, dense: np.ndarray, ids: list[np.ndarray]) -> np.ndarray:
        """The planted logit without the bias, float64 [n]."""
        logit = (dense - self._dense_center) @ self._dense_weight
        n = dense.shape[0]
        group_sum = np.zeros((max(self.cfg.interaction_groups, 1), n, LATENT_DIM))
        square_sum = np.zeros(n)
        for f, idx in enumerate(ids):
            w = _uniform(self._keys[_WEIGHT, f], idx) * 2 - 1
            logit += (math.sqrt(3) * self._first_scale) * w.mean(axis=1)
            if self.groups[f] >= 0:
                v = _uniform(self._keys[_LATENT, f], idx[:, :, None] * LATENT_DIM + np.arange(LATENT_DIM)) * 2 - 1
                e = (math.sqrt(3) * self._latent_scale) * v.mean(axis=1)  # pooled [n, LATENT_DIM]
                group_sum[self.groups[f]] += e
                square_sum += (e * e).sum(axis=1)
        if self.cfg.interaction_groups:
            # sum over pairs within each group of <e_f, e_g> = (|sum e|^2 - sum |e|^2) / 2
            logit += 0.5 * ((group_sum**2).sum(axis=(0, 2)) - square_sum)
        return logit

    def _probability(self, dense: np.ndarray, ids: list[np.ndarray]) -> np.ndarray:
        return 1 / (1 + np.exp(-(self._logits(dense, ids) + self._bias)))

    def click_probability(self, start_row: int, n: int) -> np.ndarray:
        """The planted click probability of rows start_row..start_row+n-1 (float64 [n]): the Bayes-optimal score."""
        rows = np.arange(start_row, start_row + n, dtype=np.int64)
        return self._probability(self._dense(rows), self._ids(rows))

    def generate(self, start_row: int, n: int) -> Chunk:
        """Rows start_row..start_row+n-1 as a Chunk (the same whatever the chunking)."""
        return self.draw(np.arange(start_row, start_row + n, dtype=np.int64), 0)

    def draw(self, rows: np.ndarray, draw: int) -> Chunk:
        """Draw ``draw`` of the rows ``rows`` (int64 [n], any order) as a Chunk in that order:
        draw 0 is the data set's rows, each other draw fresh rows of the same distribution."""
        rows = np.asarray(rows, np.int64)
        dense = self._dense(rows, draw)
        ids = self._ids(rows, draw)
        labels = (_uniform(self._key(_LABEL, 0, draw), rows) < self._probability(dense, ids)).astype(np.float32)
        lengths = np.full(rows.shape[0], self.cfg.pooling_factor, np.int32)
        return Chunk(dense.astype(np.float32), labels, [(idx.reshape(-1), lengths) for idx in ids])

    def chunks(self, chunk_rows: int) -> Iterator[Chunk]:
        """The whole data set (``cfg.rows`` rows) in chunks of at most ``chunk_rows`` rows."""
        for start in range(0, self.cfg.rows, chunk_rows):
            yield self.generate(start, min(chunk_rows, self.cfg.rows - start))


def dataset_params(cfg: SyntheticConfig) -> dict:
    """The settings that fix the data set's rows (draw 0): all but ``fresh_each_epoch``, which
    only says what training reads after the first epoch."""
    params = dataclasses.asdict(cfg)
    del params["fresh_each_epoch"]
    return params


def generate(cfg: SyntheticConfig, start_row: int, n: int) -> Chunk:
    """Rows start_row..start_row+n-1 of the data set ``cfg`` (builds a generator each call)."""
    return SyntheticGenerator(cfg).generate(start_row, n)


def read_synthetic(cfg: SyntheticConfig, chunk_rows: int = 262_144) -> Source:
    """The synthetic data set as a Source, like a file's."""
    gen = SyntheticGenerator(cfg)
    return Source(
        description={
            "format": "synthetic",
            "params": dataset_params(cfg),
            "interaction_groups": gen.groups.tolist(),
        },
        label="label",
        dense=gen.dense_names,
        features=gen.features,
        chunks=gen.chunks(chunk_rows),
        malformed=MalformedRows("synthetic"),
        num_rows=cfg.rows,
    )


SYNTH_CHUNK_ROWS = 32_768
"""Rows ``synthesize`` generates and writes at a time: about 0.2 s of work on one core, so its
progress bar moves several times a second (the default 200,000 rows are 7 steps)."""


def synthesize(cfg: SyntheticConfig, out: str | Path, chunk_rows: int = SYNTH_CHUNK_ROWS, progress: bool = True) -> Path:
    """Write the synthetic data set as a Criteo TSV (``.gz`` compresses), atomically.

    Reading it back with ``--data-format criteo`` gives the same rows. Needs the Criteo
    shape: 13 dense, 26 single-hot categorical features. With ``progress`` a bar on stderr
    (when it is a terminal) counts the rows written. Returns the path written.
    """
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    gen = SyntheticGenerator(cfg)
    try:
        with (
            CriteoWriter(tmp, gzip=out.suffix == ".gz") as writer,
            tqdm(total=cfg.rows, unit=" rows", unit_scale=True, desc=f"writing {out.name}", disable=None if progress else True) as bar,
        ):
            for chunk in gen.chunks(chunk_rows):
                writer.write(chunk)
                bar.update(chunk.num_rows)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out
