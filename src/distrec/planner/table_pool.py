"""A synthetic pool of tables calibrated to the DLRM 856-table data set, and sharding tasks.

The real 856-table traces (facebookresearch/dlrm_datasets) are not available here, so the
pool draws tables whose published aggregates match:

- 856 tables (``fbgemm_t856_bs65536.pt``);
- mean hash size about 4.1M rows (the NeuroShard paper, Sec. 5);
- mean pooling factor 15.8 = 887,017,990 indices / (856 tables x 65,536 samples)
  (``locality_stats_2021_t856.txt``, first block);
- reuse-factor histograms resampled around the published "Histogram of col sizes".

The spreads around those means are assumptions (log-normal rows and pooling factors, a
Dirichlet around a tilted published histogram); they give the heavy tails the data set is
known for. Rows are multiplied by ``row_scale`` so tasks fit this machine, and so is the
per-device memory of the tasks, which keeps every task's memory pressure as in the paper.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distrec.errors import DistrecError
from distrec.planner.types import BYTES_PER_FLOAT, MIN_SHARD_DIM, NUM_HISTOGRAM_BINS, TableSpec

PUBLISHED_NUM_TABLES = 856
PUBLISHED_MEAN_ROWS = 4.1e6
PUBLISHED_MEAN_POOLING_FACTOR = 887_017_990 / (856 * 65_536)

# "Histogram of col sizes" of locality_stats_2021_t856.txt: the first block
# (fbgemm_t856_bs65536.pt) and the block shared by the 16 files fbgemm_t856_bs65536_{0..15}.pt.
PUBLISHED_HISTOGRAMS = np.array(
    [
        [0.473, 0.152, 0.139, 0.112, 0.072, 0.032, 0.011, 0.005, 0.002, 0.001, 0, 0, 0, 0, 0, 0, 0],
        [0.423, 0.165, 0.167, 0.121, 0.073, 0.031, 0.011, 0.004, 0.002, 0.001, 0.001, 0, 0, 0, 0, 0, 0],
    ]
)

# Assumed spreads (not published): log-normal sigma of rows and pooling factors, their caps,
# the Dirichlet concentration and the range of the per-table tilt towards hotter/colder rows.
ROWS_LOG_SIGMA = 2.0
ROWS_RANGE = (100, 50_000_000)
POOLING_LOG_SIGMA = 1.0
POOLING_RANGE = (0.1, 300.0)
HISTOGRAM_CONCENTRATION = 40.0
HISTOGRAM_TILT = 0.5

# Sharding tasks as in the NeuroShard paper's Table 5 and its task generator: 4 GB per
# device, tasks whose tables fill at most 15/16 of the devices' total memory.
DEVICE_MEMORY_BYTES = 4 * 2**30
TASK_MEMORY_FILL = 15 / 16
TABLES_PER_DEVICE_RANGE = (2.5, 15.0)  # 4 devices: 10-60 tables, 8 devices: 20-120
DEFAULT_ROW_SCALE = 1 / 64


def parse_locality_histograms(path: str | Path) -> np.ndarray:
    """Every "Histogram of col sizes" block of a published locality_stats file: float [k, 17]."""
    p = Path(path)
    if not p.is_file():
        raise DistrecError(f"locality statistics file {str(p)!r} not found; check the path")
    blocks = p.read_text().split("Histogram of col sizes:")[1:]
    bin_line = re.compile(r"^\((\d+)(?:, \d+\]|\+): ([0-9.]+)$", re.M)
    hists = [[float(v) for _, v in bin_line.findall(b)[:NUM_HISTOGRAM_BINS]] for b in blocks]
    if not hists or any(len(h) != NUM_HISTOGRAM_BINS for h in hists):
        raise DistrecError(f"{str(p)!r} has no 17-bin 'Histogram of col sizes' blocks; is it a dlrm_datasets locality_stats file?")
    return np.array(hists)


def _calibrated_lognormal(z: np.ndarray, sigma: float, lo: float, hi: float, mean: float) -> np.ndarray:
    """exp(mu + sigma z) clipped to [lo, hi], with mu bisected so the clipped values average ``mean``."""
    low, high = np.log(lo) - 10 * sigma, np.log(hi)
    for _ in range(100):
        mu = (low + high) / 2
        if np.clip(np.exp(mu + sigma * z), lo, hi).mean() < mean:
            low = mu
        else:
            high = mu
    return np.clip(np.exp((low + high) / 2 + sigma * z), lo, hi)


@dataclass(frozen=True)
class TablePool:
    """Tables without a dimension (tasks choose one): rows, pooling factors, histograms.

    Attributes:
        rows: int64 [n] rows of each table, already scaled by ``row_scale``.
        pooling_factors: float64 [n] mean indices per sample.
        histograms: float64 [n, 17] reuse-factor histograms (fractions of distinct rows).
        row_scale: the factor applied to the published hash sizes.
    """

    rows: np.ndarray
    pooling_factors: np.ndarray
    histograms: np.ndarray
    row_scale: float

    def __len__(self) -> int:
        return self.rows.size

    def table(self, index: int, dim: int, name: str) -> TableSpec:
        """Pool table ``index`` with dimension ``dim``, named ``name``."""
        return TableSpec(name, int(self.rows[index]), dim, float(self.pooling_factors[index]), tuple(self.histograms[index]))

    @property
    def memory_per_device(self) -> int:
        """The paper's 4 GB device memory, scaled like the rows (bytes)."""
        return int(DEVICE_MEMORY_BYTES * self.row_scale)


def make_table_pool(
    seed: int = 0,
    num_tables: int = PUBLISHED_NUM_TABLES,
    row_scale: float = DEFAULT_ROW_SCALE,
    reference_histograms: np.ndarray | None = None,
) -> TablePool:
    """Draw the synthetic table pool (deterministic for a seed).

    Args:
        seed: random seed.
        num_tables: tables in the pool (856 like the published data set).
        row_scale: multiply every table's rows (and the task memory) by this, e.g. 1/64.
        reference_histograms: float [k, 17] histograms to resample around (e.g. from
            ``parse_locality_histograms``); defaults to ``PUBLISHED_HISTOGRAMS``.
    """
    if not 0 < row_scale <= 1:
        raise DistrecError(f"row scale {row_scale} must be in (0, 1]; it shrinks the published table sizes")
    rng = np.random.default_rng(seed)
    ref = PUBLISHED_HISTOGRAMS if reference_histograms is None else np.asarray(reference_histograms, dtype=np.float64)
    rows = _calibrated_lognormal(rng.standard_normal(num_tables), ROWS_LOG_SIGMA, *ROWS_RANGE, PUBLISHED_MEAN_ROWS)
    pooling = _calibrated_lognormal(rng.standard_normal(num_tables), POOLING_LOG_SIGMA, *POOLING_RANGE, PUBLISHED_MEAN_POOLING_FACTOR)
    base = ref[rng.integers(len(ref), size=num_tables)]
    tilt = np.exp(rng.uniform(-HISTOGRAM_TILT, HISTOGRAM_TILT, size=(num_tables, 1)) * np.arange(NUM_HISTOGRAM_BINS))
    tilted = base * tilt
    alpha = HISTOGRAM_CONCENTRATION * tilted / tilted.sum(axis=1, keepdims=True) + 1e-3
    histograms = rng.gamma(alpha)
    histograms = np.round(histograms / histograms.sum(axis=1, keepdims=True), 6)
    histograms /= histograms.sum(axis=1, keepdims=True)
    scaled_rows = np.maximum(np.round(rows * row_scale), 1).astype(np.int64)
    return TablePool(scaled_rows, pooling, histograms, row_scale)


@dataclass(frozen=True)
class ShardingTask:
    """Tables to place on ``num_devices`` devices of ``memory_per_device`` bytes each."""

    tables: list[TableSpec]
    num_devices: int
    memory_per_device: int
    pool_ids: tuple[int, ...]


def dimension_choices(max_dim: int) -> list[int]:
    """max_dim, max_dim/2, ... while divisible by 4 (the paper's task generator)."""
    if max_dim < MIN_SHARD_DIM or max_dim % MIN_SHARD_DIM:
        raise DistrecError(f"maximum dimension {max_dim} must be a multiple of {MIN_SHARD_DIM}")
    dims = []
    while max_dim % MIN_SHARD_DIM == 0:
        dims.append(max_dim)
        max_dim //= 2
    return dims


def table_count_range(num_devices: int) -> tuple[int, int]:
    """Inclusive range of tables per task: 10-60 for 4 devices, 20-120 for 8 (paper's Table 5)."""
    lo, hi = TABLES_PER_DEVICE_RANGE
    return int(lo * num_devices), int(hi * num_devices)


def generate_tasks(
    pool: TablePool,
    num_tasks: int,
    num_devices: int,
    max_dim: int,
    seed: int = 0,
    memory_per_device: int | None = None,
    attempts_per_draw: int = 256,
) -> list[ShardingTask]:
    """Random sharding tasks: a table count, tables drawn from the pool, dims from the choices.

    As the paper's generator, a draw whose tables exceed 15/16 of the devices' total memory is
    rejected; candidates are drawn ``attempts_per_draw`` at a time and the table count is
    redrawn if none fits.

    Args:
        pool: the table pool.
        num_tasks: tasks to generate.
        num_devices: devices per task.
        max_dim: the largest dimension; tables get max_dim, max_dim/2, ... (multiples of 4).
        seed: random seed (tasks are deterministic for a seed).
        memory_per_device: bytes per device; defaults to the pool's scaled 4 GB.
    """
    rng = np.random.default_rng(seed)
    dims = np.array(dimension_choices(max_dim))
    memory = pool.memory_per_device if memory_per_device is None else memory_per_device
    budget = num_devices * memory * TASK_MEMORY_FILL
    lo, hi = table_count_range(num_devices)
    tasks = []
    while len(tasks) < num_tasks:
        count = int(rng.integers(lo, hi + 1))
        ids = rng.integers(len(pool), size=(attempts_per_draw, count))
        task_dims = rng.choice(dims, size=(attempts_per_draw, count))
        total = (pool.rows[ids] * task_dims * BYTES_PER_FLOAT).sum(axis=1)
        fits = np.flatnonzero(total <= budget)
        if fits.size == 0:
            continue
        row = fits[0]
        tables = [pool.table(int(pid), int(dim), f"t{k:03d}_pool{pid}") for k, (pid, dim) in enumerate(zip(ids[row], task_dims[row]))]
        tasks.append(ShardingTask(tables, num_devices, memory, tuple(int(i) for i in ids[row])))
    return tasks
