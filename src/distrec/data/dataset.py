"""A prepared data set: splits, table sizes and fast, resumable mini-batches.

Raw ids become table rows at batch time: ``index = 0 if raw == 0 else 1 + (raw - 1) %
(rows - 1)``, so row 0 of every table is the reserved "missing" row. A feature's table has
``data.table_sizes[name]`` rows if given, else ``min(max_ind_range, id_bound)`` for
small-integer-id features (MovieLens ids map one to one), else ``max_ind_range``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distrec.config import DataConfig
from distrec.data.batch import Batch, BatchLayout
from distrec.data.cache import (
    CACHE_FORMAT_VERSION,
    DENSE_FILE,
    LABELS_FILE,
    ids_file,
    offsets_file,
    read_manifest,
)
from distrec.data.prefetch import prefetch
from distrec.data.source import Chunk, Source, SparseFeature, gather_bags
from distrec.errors import DistrecError
from distrec.tables import TableConfig

SPLIT_EXAMPLES = "e.g. random:0.1, random:0.1:0.1, last:0.2 or last:0.1:0.1"


def table_rows(feature: SparseFeature, cfg: DataConfig) -> int:
    """Rows of ``feature``'s embedding table under ``cfg`` (at least 2: row 0 is 'missing')."""
    if feature.name in cfg.table_sizes:
        return cfg.table_sizes[feature.name]
    bound = cfg.max_ind_range if feature.id_bound is None else min(cfg.max_ind_range, feature.id_bound)
    return max(2, bound)


def table_index(raw: np.ndarray, num_rows: int) -> np.ndarray:
    """Table rows of raw ids (int64): 0 stays 0, others wrap into rows 1..num_rows-1."""
    # 1 + (raw - 1) % (num_rows - 1) is <= raw for raw >= 1 and is num_rows - 1 for raw == 0,
    # so the minimum with raw gives 0 for missing values without a branch. The remainder is
    # computed as x - (x // d) * d: NumPy divides by a scalar several times faster than it
    # takes a remainder.
    d = num_rows - 1
    index = raw - 1
    index -= (index // d) * d
    index += 1
    return np.minimum(index, raw, out=index)


def num_batches(num_rows: int, batch_size: int, drop_last: bool = False) -> int:
    """Batches in one pass over ``num_rows`` rows."""
    return num_rows // batch_size if drop_last else -(-num_rows // batch_size)


def parse_split(spec: str) -> tuple[str, float, float | None]:
    """``random:VAL[:TEST]`` or ``last:VAL[:TEST]`` as (kind, val fraction, test fraction or None)."""
    parts = spec.split(":")
    try:
        if parts[0] not in ("random", "last") or len(parts) not in (2, 3):
            raise ValueError
        val, test = float(parts[1]), float(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise DistrecError(f"split {spec!r} is not KIND:VAL[:TEST] with KIND random or last; {SPLIT_EXAMPLES}") from None
    if not (0 <= val < 1 and 0 <= (test or 0) < 1 and val + (test or 0) < 1):
        raise DistrecError(f"split {spec!r}: fractions must be in [0, 1) and sum below 1; {SPLIT_EXAMPLES}")
    return parts[0], val, test


@dataclass
class _Column:
    """One feature's raw ids: values [nnz] and, for multi-hot features, offsets [rows + 1]."""

    values: np.ndarray
    offsets: np.ndarray | None


def _memmap(path: Path, dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only memory map of ``path`` (an empty array for an empty file)."""
    expected = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if not path.is_file() or path.stat().st_size != expected:
        raise DistrecError(f"cache file {path} is missing or has the wrong size; delete {path.parent} and prepare again")
    if expected == 0:
        return np.zeros(shape, dtype)
    return np.asarray(np.memmap(path, dtype=dtype, mode="r", shape=shape))


class Dataset:
    """Rows of a prepared data set, memory-mapped from a cache directory or held in memory.

    Args:
        cache_dir: a cache made by :func:`distrec.data.prepare`.
        cfg: table sizing (``max_ind_range``, ``table_sizes``); defaults if None.

    Example:
        >>> ds = Dataset(prepare(cfg), cfg)
        >>> split = ds.split("last:0.2", seed=0)
        >>> for batch in ds.batches(split["train"], 2048, shuffle=True, seed=0, epoch=0):
        ...     loss = model(batch)
    """

    def __init__(self, cache_dir: str | Path, cfg: DataConfig | None = None) -> None:
        cache_dir = Path(cache_dir)
        manifest = read_manifest(cache_dir)
        if manifest.get("format_version") != CACHE_FORMAT_VERSION:
            raise DistrecError(f"cache {cache_dir} has format {manifest.get('format_version')}, not {CACHE_FORMAT_VERSION}; delete it and prepare again")
        n = manifest["rows"]
        features = [SparseFeature.from_dict(d) for d in manifest["features"]]
        columns = [
            _Column(
                _memmap(cache_dir / ids_file(f), np.int64, (d["nnz"],)),
                _memmap(cache_dir / offsets_file(f), np.int64, (n + 1,)) if feat.multi_hot else None,
            )
            for f, (feat, d) in enumerate(zip(features, manifest["features"]))
        ]
        dense = _memmap(cache_dir / DENSE_FILE, np.float32, (n, len(manifest["dense"])))
        labels = _memmap(cache_dir / LABELS_FILE, np.float32, (n,))
        self._setup(dense, labels, columns, features, list(manifest["dense"]), cfg, manifest)

    def _setup(
        self,
        dense: np.ndarray,
        labels: np.ndarray,
        columns: list[_Column],
        features: list[SparseFeature],
        dense_names: list[str],
        cfg: DataConfig | None,
        manifest: dict | None,
    ) -> None:
        self.cfg = cfg or DataConfig()
        unknown = sorted(set(self.cfg.table_sizes) - {f.name for f in features})
        if unknown:
            raise DistrecError(
                f"data.table_sizes names {unknown[0]!r}, which is not a feature of this data set (features: {', '.join(f.name for f in features)})"
            )
        self._dense = dense
        self._labels = labels
        self._columns = columns
        self.features = features
        self.dense_names = dense_names
        self.manifest = manifest
        self._set_table_rows({f.name: table_rows(f, self.cfg) for f in features})

    def _set_table_rows(self, rows: dict[str, int]) -> None:
        self.table_rows = rows
        # identity mapping when every raw id already fits the table (small-integer ids)
        self._wraps = [f.id_bound is None or f.id_bound > rows[f.name] for f in self.features]

    def override_tables(self, tables: list[TableConfig]) -> None:
        """Map raw ids into these tables (e.g. a trained model's) instead of the config's sizes."""
        if [t.name for t in tables] != self.feature_names:
            raise DistrecError(
                f"tables {[t.name for t in tables]} do not match the features {self.feature_names}; use data in the same format and schema as the model"
            )
        self._set_table_rows({t.name: t.num_rows for t in tables})

    @classmethod
    def from_source(cls, source: Source, cfg: DataConfig | None = None) -> Dataset:
        """Read every chunk of ``source`` into memory (no cache on disk), e.g. synthetic data."""
        chunk = Chunk.concat(list(source.chunks), len(source.dense), len(source.features))
        return cls.from_chunk(chunk, source.features, source.dense, cfg)

    @classmethod
    def from_chunk(cls, chunk: Chunk, features: list[SparseFeature], dense_names: list[str], cfg: DataConfig | None = None) -> Dataset:
        """A data set over the rows of one in-memory chunk (e.g. from SyntheticGenerator.generate)."""
        columns = []
        for feat, (values, lengths) in zip(features, chunk.sparse):
            offsets = None
            if feat.multi_hot:
                offsets = np.zeros(chunk.num_rows + 1, np.int64)
                np.cumsum(lengths, out=offsets[1:])
            columns.append(_Column(np.asarray(values, np.int64), offsets))
        dataset = cls.__new__(cls)
        dataset._setup(chunk.dense, chunk.labels, columns, features, dense_names, cfg, None)
        return dataset

    @property
    def num_rows(self) -> int:
        return int(self._labels.shape[0])

    @property
    def num_dense(self) -> int:
        return int(self._dense.shape[1])

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

    def tables(self, dim: int) -> list[TableConfig]:
        """One embedding table per feature, sized by ``max_ind_range`` / ``table_sizes``."""
        return [TableConfig(f.name, self.table_rows[f.name], dim, f.multi_hot) for f in self.features]

    def split(self, spec: str, seed: int = 0) -> dict[str, np.ndarray]:
        """Row ids (sorted int64) of "train", "val" and, if the spec has a test part, "test".

        ``random:VAL[:TEST]`` draws the held-out rows by a permutation seeded with ``seed``;
        ``last:VAL[:TEST]`` holds out the last rows (a time-ordered holdout: train, then
        val, then test).
        """
        kind, val, test = parse_split(spec)
        n = self.num_rows
        n_val, n_test = round(val * n), round((test or 0) * n)
        if n - n_val - n_test < 1:
            raise DistrecError(f"split {spec!r} leaves no training rows out of {n}; hold out less")
        order = np.arange(n, dtype=np.int64) if kind == "last" else np.random.default_rng(seed).permutation(n)
        parts = {
            "train": order[: n - n_val - n_test],
            "val": order[n - n_val - n_test : n - n_test],
        }
        if test is not None:
            parts["test"] = order[n - n_test :]
        return {name: np.sort(rows) for name, rows in parts.items()}

    def batch(self, rows: np.ndarray, largest_shard: int | None = None) -> Batch:
        """The samples at ``rows`` (int64 [B]), in that order, as a CPU Batch whose layout
        (``BatchLayout``) says where each feature's indices start, whether every bag holds one
        index, and that every index lies in its table (checked here, on the host, once);
        ``largest_shard``: the most samples a rank's slice of this global batch holds."""
        rows = np.asarray(rows, np.int64)
        b = rows.shape[0]
        lengths = np.ones((len(self._columns), b), np.int64)
        values = []
        sizes = tuple(self.table_rows[feature.name] for feature in self.features)
        within = True
        for f, column in enumerate(self._columns):
            if column.offsets is None:
                raw = column.values[rows]
            else:
                raw, lengths[f] = gather_bags(column.values, column.offsets, rows)
            if self._wraps[f]:
                raw = table_index(raw, sizes[f])
            elif raw.size and (raw.min() < 0 or raw.max() >= sizes[f]):
                within = False  # the model names the index and its table
            values.append(raw)
        offsets = np.zeros(len(self._columns) * b + 1, np.int64)
        np.cumsum(lengths.reshape(-1), out=offsets[1:])
        layout = None
        if b:
            layout = BatchLayout(tuple(offsets[::b].tolist()), bool((lengths == 1).all()), sizes if within else None, largest_shard)
        return Batch(
            dense=torch.from_numpy(self._dense[rows]),
            sparse_values=torch.from_numpy(np.concatenate(values) if values else np.zeros(0, np.int64)),
            sparse_offsets=torch.from_numpy(offsets),
            labels=torch.from_numpy(self._labels[rows]),
            layout=layout,
        )

    def batches(
        self,
        rows: np.ndarray | None,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int = 0,
        epoch: int = 0,
        start_step: int = 0,
        drop_last: bool = False,
        prefetch_depth: int = 4,
        shard: tuple[int, int] = (0, 1),
        pin: bool = False,
    ) -> Iterator[Batch]:
        """Mini-batches over ``rows`` (all rows if None), built ahead on a background thread.

        The order depends only on (``seed``, ``epoch``) when shuffling, so batch k of an
        epoch is the same in every run; ``start_step`` starts at batch k without reading
        the batches before it (exact resume). A last short batch is kept unless ``drop_last``.
        With ``shard=(rank, world_size)`` each global batch is cut into ``world_size``
        contiguous slices of near-equal size and only slice ``rank`` is built (it may be
        empty when the batch has fewer samples than ranks); every rank gets the same number
        of batches. With ``pin``, the background thread puts each batch in page-locked memory
        (for a copy to a GPU that overlaps the step).
        """
        rows = np.arange(self.num_rows, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
        if shuffle:
            rows = rows[np.random.default_rng([seed, epoch]).permutation(rows.shape[0])]
        steps = num_batches(rows.shape[0], batch_size, drop_last)
        rank, world_size = shard
        global_batches = (rows[k * batch_size : (k + 1) * batch_size] for k in range(start_step, steps))
        shards = ((np.array_split(g, world_size)[rank], -(-g.shape[0] // world_size)) for g in global_batches)
        built = (self.batch(r, largest) for r, largest in shards)
        return prefetch((b.pin_memory() for b in built) if pin else built, prefetch_depth)
