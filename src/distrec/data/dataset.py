"""A prepared data set: splits, table sizes and fast, resumable mini-batches.

A data set of several files memory-maps each file's cache and numbers the rows in file
order; a batch gathers from every file its rows fall in. Raw ids become table rows at batch time: ``index = 0 if raw == 0 else 1 + (raw - 1) %
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

from distrec.config import DataConfig, SyntheticConfig
from distrec.data.batch import Batch, BatchLayout
from distrec.data.cache_files import CACHE_FORMAT_VERSION, DENSE_FILE, LABELS_FILE, SKIPPED_FILE, ids_file, offsets_file, part_directories, read_manifest
from distrec.data.dense_transforms import FIT_ROWS, DenseTransform
from distrec.data.dense_transforms import apply as apply_transforms
from distrec.data.dense_transforms import fit as fit_transforms
from distrec.data.prefetch import prefetch
from distrec.data.source import Chunk, MalformedRows, Source, SparseFeature
from distrec.data.split import split_rows
from distrec.data.synthetic import SyntheticGenerator
from distrec.errors import DistrecError
from distrec.tables import TableConfig


def table_rows(feature: SparseFeature, cfg: DataConfig) -> int:
    """Rows of ``feature``'s embedding table under ``cfg`` (at least 2: row 0 is 'missing')."""
    if feature.name in cfg.table_sizes:
        return cfg.table_sizes[feature.name]
    bound = cfg.max_ind_range if feature.id_bound is None else min(cfg.max_ind_range, feature.id_bound)
    return max(2, bound)


def table_index(raw: np.ndarray, num_rows: int) -> np.ndarray:
    """Table rows of raw ids (int64 >= 0): 0 stays 0, others wrap into rows 1..num_rows-1 as
    ``1 + (raw - 1) % (num_rows - 1)`` (``distrec.data.batch_kernels.table_row``, which
    :meth:`Dataset.batch` applies as it gathers)."""
    from distrec.data.batch_kernels import map_rows  # numba loads on first use

    raw = np.ascontiguousarray(raw, np.int64)
    out = np.empty_like(raw)
    map_rows(raw, num_rows - 1, out)
    return out


def num_batches(num_rows: int, batch_size: int, drop_last: bool = False) -> int:
    """Batches in one pass over ``num_rows`` rows."""
    return num_rows // batch_size if drop_last else -(-num_rows // batch_size)


@dataclass
class _Column:
    """One feature's raw ids: values [nnz] and, for multi-hot features, offsets [rows + 1]."""

    values: np.ndarray
    offsets: np.ndarray | None


@dataclass
class _File:
    """The rows of one input file: dense float32 [n, n_dense], labels float32 [n], one column
    per feature, and the input positions of the rows skipped as malformed (int64 [skipped],
    ascending; None when the cache does not record them)."""

    dense: np.ndarray
    labels: np.ndarray
    columns: list[_Column]
    skipped: np.ndarray | None

    @staticmethod
    def load(directory: Path, features: list[SparseFeature]) -> _File:
        """Memory-map the cache of one file."""
        manifest = read_manifest(directory)
        n = manifest["rows"]
        columns = [
            _Column(
                _memmap(directory / ids_file(f), np.int64, (d["nnz"],)),
                _memmap(directory / offsets_file(f), np.int64, (n + 1,)) if feat.multi_hot else None,
            )
            for f, (feat, d) in enumerate(zip(features, manifest["features"]))
        ]
        skipped = None
        if not manifest["malformed_rows"]:
            skipped = np.zeros(0, np.int64)
        elif (directory / SKIPPED_FILE).is_file():
            skipped = _memmap(directory / SKIPPED_FILE, np.int64, (manifest["malformed_rows"],))
        dense = _memmap(directory / DENSE_FILE, np.float32, (n, len(manifest["dense"])))
        return _File(dense, _memmap(directory / LABELS_FILE, np.float32, (n,)), columns, skipped)

    @staticmethod
    def of_chunk(chunk: Chunk, features: list[SparseFeature]) -> _File:
        """The rows of an in-memory chunk."""
        columns = []
        for feat, (values, lengths) in zip(features, chunk.sparse):
            offsets = None
            if feat.multi_hot:
                offsets = np.zeros(chunk.num_rows + 1, np.int64)
                np.cumsum(lengths, out=offsets[1:])
            columns.append(_Column(np.asarray(values, np.int64), offsets))
        return _File(chunk.dense, chunk.labels, columns, np.zeros(0, np.int64))


def _kept_before_skipped(files: list[_File]) -> np.ndarray | None:
    """For each skipped row of the files' input, in input order, the kept rows before it:
    int64 [skipped], non-decreasing; kept row r then lies at input position r + the count of
    entries <= r. None when a file does not record its skipped rows."""
    positions, input_start = [np.zeros(0, np.int64)], 0
    for f in files:
        if f.skipped is None:
            return None
        positions.append(f.skipped + input_start)
        input_start += f.labels.shape[0] + f.skipped.shape[0]
    skipped = np.concatenate(positions)
    return skipped - np.arange(skipped.shape[0], dtype=np.int64)


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
        cache_dir: a cache made by :func:`distrec.data.prepare` (one file's, or a set of files').
        cfg: table sizing (``max_ind_range``, ``table_sizes``); defaults if None.

    Attributes:
        file_starts: int64 [files + 1], the first row of each input file, then the number of rows.

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
        features = [SparseFeature.from_dict(d) for d in manifest["features"]]
        parts = part_directories(cache_dir)
        files = [_File.load(directory, features) for directory in parts]
        self._setup(files, features, list(manifest["dense"]), cfg, manifest)
        self.source = read_manifest(parts[0]).get("source", {}) if parts[0] != cache_dir else manifest.get("source", {})
        self.malformed = [MalformedRows.from_manifest(read_manifest(directory)) for directory in parts]

    def _setup(self, files: list[_File], features: list[SparseFeature], dense_names: list[str], cfg: DataConfig | None, manifest: dict | None) -> None:
        self.cfg = cfg or DataConfig()
        unknown = sorted(set(self.cfg.table_sizes) - {f.name for f in features})
        if unknown:
            raise DistrecError(
                f"data.table_sizes names {unknown[0]!r}, which is not a feature of this data set (features: {', '.join(f.name for f in features)})"
            )
        self._files = files
        self.file_starts = np.zeros(len(files) + 1, np.int64)
        np.cumsum([f.labels.shape[0] for f in files], out=self.file_starts[1:])
        self._kept_before_skipped = _kept_before_skipped(files)
        self.features = features
        self.dense_names = dense_names
        self.manifest = manifest
        self.source: dict = {}
        """The description of the (first) input the cache was prepared from: format, parameters, schema."""
        self.malformed: list[MalformedRows] = []
        """The rows each input file's cache skipped, in file order: count and the first lines."""
        self.dense_transforms: list[DenseTransform] = []
        """What each batch's dense columns go through (``fit_dense_transforms``); empty: the values as cached."""
        self._generator: SyntheticGenerator | None = None
        self._set_table_rows({f.name: table_rows(f, self.cfg) for f in features})

    def _set_table_rows(self, rows: dict[str, int]) -> None:
        self.table_rows = rows
        # per feature, the divisor of the mapping into its table; 0 keeps ids that already fit (small-integer ids)
        self._rows_minus_one = [rows[f.name] - 1 if f.id_bound is None or f.id_bound > rows[f.name] else 0 for f in self.features]

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
        dataset = cls.__new__(cls)
        dataset._setup([_File.of_chunk(chunk, features)], features, dense_names, cfg, None)
        return dataset

    @property
    def draws_fresh_rows(self) -> bool:
        """Whether training epochs after the first draw fresh rows: synthetic data with
        ``data.synthetic.fresh_each_epoch`` (``distrec.data.synthetic``, draws)."""
        return self.source.get("format") == "synthetic" and self.cfg.synthetic.fresh_each_epoch

    def _synthetic(self) -> SyntheticGenerator:
        """The generator of this synthetic data set's rows (made on first use)."""
        if self._generator is None:
            self._generator = SyntheticGenerator(SyntheticConfig(**self.source["params"]))
        return self._generator

    def _drawn(self, rows: np.ndarray, draw: int) -> _File:
        """Draw ``draw`` of the synthetic rows ``rows``, in that order, as an in-memory file."""
        return _File.of_chunk(self._synthetic().draw(rows, draw), self.features)

    @property
    def num_rows(self) -> int:
        return int(self.file_starts[-1])

    @property
    def num_dense(self) -> int:
        return int(self._files[0].dense.shape[1])

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

    def tables(self, dim: int) -> list[TableConfig]:
        """One embedding table per feature, sized by ``max_ind_range`` / ``table_sizes``."""
        return [TableConfig(f.name, self.table_rows[f.name], dim, f.multi_hot) for f in self.features]

    def split(self, spec: str, seed: int = 0) -> dict[str, np.ndarray]:
        """Row ids (sorted int64) of "train", "val" and, if the spec has a test part, "test":
        ``random:VAL[:TEST]``, ``last:VAL[:TEST]`` or ``files:[VAL:]TEST`` (``distrec.data.split``)."""
        return split_rows(spec, self.file_starts, seed)

    def batch(self, rows: np.ndarray, largest_shard: int | None = None, draw: int = 0) -> Batch:
        """The samples at ``rows`` (int64 [B]), in that order, as a CPU Batch, with the layout
        the step reads on the host (``BatchLayout``: where each feature's ids start, whether
        every bag holds one id, the tables every id lies in; ``largest_shard``: the most
        samples a rank's slice of this global batch holds). ``draw`` > 0 (synthetic data
        only) takes that draw of the rows instead of the cached ones.

        Each file gathers its rows' dense features, labels and bag lengths, then every bag is
        copied to its place in the batch with its ids mapped into the feature's table
        (``distrec.data.batch_kernels``), in one pass over the ids: every id then lies in its
        table by construction.
        """
        from distrec.data.batch_kernels import scatter_bags, scatter_ids  # numba loads on first use

        rows = np.asarray(rows, np.int64)
        b = rows.shape[0]
        parts = self._by_file(rows) if draw == 0 else [(self._drawn(rows, draw), slice(None), np.arange(b))]
        dense = np.empty((b, self.num_dense), np.float32)
        labels = np.empty(b, np.float32)
        lengths = np.ones((len(self.features), b), np.int64)
        for file, at, local in parts:
            dense[at] = file.dense[local]
            labels[at] = file.labels[local]
            for f, column in enumerate(file.columns):
                if column.offsets is not None:
                    lengths[f, at] = column.offsets[local + 1] - column.offsets[local]
        if self.dense_transforms:
            apply_transforms(self.dense_transforms, dense)
        offsets = np.zeros(lengths.size + 1, np.int64)
        np.cumsum(lengths.reshape(-1), out=offsets[1:])
        values = np.empty(int(offsets[-1]), np.int64)
        starts = offsets[:-1].reshape(lengths.shape)
        for file, at, local in parts:
            for f, column in enumerate(file.columns):
                dest = np.ascontiguousarray(starts[f, at])
                if column.offsets is None:
                    scatter_ids(column.values, local, dest, values, self._rows_minus_one[f])
                else:
                    scatter_bags(column.values, column.offsets, local, dest, values, self._rows_minus_one[f])
        layout = None
        if b:
            sizes = tuple(self.table_rows[f.name] for f in self.features)
            layout = BatchLayout(tuple(offsets[::b].tolist()), bool((lengths == 1).all()), sizes, largest_shard)
        return Batch(torch.from_numpy(dense), torch.from_numpy(values), torch.from_numpy(offsets), torch.from_numpy(labels), layout)

    def fit_dense_transforms(self, rows: np.ndarray) -> None:
        """Fit the dense transforms the data's schema asks for (CSV and Parquet;
        ``distrec.data.dense_transforms``) on the training rows ``rows``; other formats keep their values."""
        requested = self.source.get("dense_transforms")
        if not requested:
            return
        rows = np.asarray(rows, np.int64)

        def blocks() -> Iterator[np.ndarray]:
            return (self._dense_of(rows[i : i + FIT_ROWS]) for i in range(0, rows.shape[0], FIT_ROWS))

        self.dense_transforms = fit_transforms(self.dense_names, requested, blocks)

    def use_dense_transforms(self, saved: list[dict]) -> None:
        """Transform the dense columns as a trained model's run did (``DenseTransform.to_dict`` each)."""
        self.dense_transforms = [DenseTransform.from_dict(d) for d in saved]

    def _dense_of(self, rows: np.ndarray) -> np.ndarray:
        """The cached dense values of ``rows`` (float32 [n, num_dense])."""
        dense = np.empty((rows.shape[0], self.num_dense), np.float32)
        for file, at, local in self._by_file(rows):
            dense[at] = file.dense[local]
        return dense

    def labels(self, rows: np.ndarray) -> np.ndarray:
        """The labels of ``rows`` (int64 [n]), in that order (float32 [n])."""
        rows = np.asarray(rows, np.int64)
        labels = np.empty(rows.shape[0], np.float32)
        for file, at, local in self._by_file(rows):
            labels[at] = file.labels[local]
        return labels

    def input_positions(self, rows: np.ndarray) -> np.ndarray:
        """The positions of ``rows`` (int64 [n]) in the input: int64 [n], from 0 over the input
        files concatenated in reading order, counting the rows skipped as malformed (a header
        line is no row), so that what is computed for a row joins back to the input's line.

        Raises:
            DistrecError: the cache skipped rows without recording where (an older distrec
                made it; ``distrec.data.prepare`` prepares such a cache again).
        """
        if self._kept_before_skipped is None:
            raise DistrecError("this data cache does not record where its skipped rows are (an older distrec made it); run distrec data prepare on its data")
        rows = np.asarray(rows, np.int64)
        return rows + np.searchsorted(self._kept_before_skipped, rows, side="right")

    def _by_file(self, rows: np.ndarray) -> list[tuple[_File, slice | np.ndarray, np.ndarray]]:
        """``rows`` grouped by file: (file, the positions in ``rows`` of its rows, those rows
        numbered within the file), by a stable O(B) radix sort of each row's file."""
        if len(self._files) == 1:
            return [(self._files[0], slice(None), rows)]
        file_of = np.searchsorted(self.file_starts, rows, side="right") - 1
        order = np.argsort(file_of.astype(np.int16 if len(self._files) < 1 << 15 else np.int32), kind="stable")
        bounds = np.searchsorted(file_of[order], np.arange(len(self._files) + 1))
        return [
            (self._files[i], order[bounds[i] : bounds[i + 1]], rows[order[bounds[i] : bounds[i + 1]]] - self.file_starts[i])
            for i in np.flatnonzero(np.diff(bounds))
        ]

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
        threads: int | None = None,
        fresh: bool = False,
    ) -> Iterator[Batch]:
        """Mini-batches over ``rows`` (all rows if None), built up to ``prefetch_depth`` ahead
        by ``threads`` background threads (default ``data.loader_threads``).

        The order depends only on (``seed``, ``epoch``) when shuffling, so batch k of an
        epoch is the same in every run; ``start_step`` starts at batch k without reading
        the batches before it (exact resume). A last short batch is kept unless ``drop_last``.
        With ``shard=(rank, world_size)`` each global batch is cut into ``world_size``
        contiguous slices of near-equal size and only slice ``rank`` is built (it may be
        empty when the batch has fewer samples than ranks); every rank gets the same number
        of batches. With ``pin``, the background thread puts each batch in page-locked memory
        (for a copy to a GPU that overlaps the step). With ``fresh`` (training) and
        :attr:`draws_fresh_rows`, epoch e > 0 takes draw e of its rows: new samples, the same
        for every run with this seed and epoch.
        """
        rows = np.arange(self.num_rows, dtype=np.int64) if rows is None else np.asarray(rows, np.int64)
        if shuffle:
            rows = rows[np.random.default_rng([seed, epoch]).permutation(rows.shape[0])]
        steps = num_batches(rows.shape[0], batch_size, drop_last)
        rank, world_size = shard
        global_batches = (rows[k * batch_size : (k + 1) * batch_size] for k in range(start_step, steps))
        shards = ((np.array_split(g, world_size)[rank], -(-g.shape[0] // world_size)) for g in global_batches)
        draw = epoch if fresh and self.draws_fresh_rows else 0
        if draw:
            self._synthetic()  # made once, before the loader threads use it
        build = (lambda shard: self.batch(*shard, draw).pin_memory()) if pin else (lambda shard: self.batch(*shard, draw))
        return prefetch(build, shards, prefetch_depth, self.cfg.loader_threads if threads is None else threads)
