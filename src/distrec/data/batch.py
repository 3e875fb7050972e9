"""The mini-batch that every model, trainer and sharded module consumes."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from distrec.kernels import compiled, runs_compiled
from distrec.kernels.rows import numpy_views


@dataclass(frozen=True)
class BatchLayout:
    """What the loader knows of a batch's sparse part on the host, so that a training step reads
    nothing back from the device (as TorchRec's KeyedJaggedTensor keeps ``offset_per_key``).
    None in a field: not known."""

    feature_starts: tuple[int, ...] | None = None
    """F + 1 positions in ``sparse_values``: where each feature's indices start, then nnz."""
    one_per_bag: bool | None = None
    """Whether every bag holds exactly one index."""
    table_rows: tuple[int, ...] | None = None
    """The table sizes every index was checked to lie below."""
    largest_shard: int | None = None
    """The most samples any rank's slice of the global batch holds."""


@dataclass
class Batch:
    """A mini-batch of B samples with F sparse features, in a jagged feature-major layout.

    The sparse part follows TorchRec's KeyedJaggedTensor: the indices of feature 0 for
    samples 0..B-1, then those of feature 1, and so on. ``sparse_offsets[f * B + b]`` is
    where the bag of feature f for sample b starts in ``sparse_values``, and the last entry
    is the total number of indices. Indices are rows of that feature's own table.

    Attributes:
        dense: float32 [B, n_dense] dense features.
        sparse_values: int64 [nnz] row indices, feature-major.
        sparse_offsets: int64 [F * B + 1] bag boundaries into ``sparse_values``.
        labels: float32 [B] click labels in {0, 1}.
        layout: what the loader knows of the sparse part on the host (None: nothing; a sub-batch
            or a batch built by hand), carried along by ``to`` and ``pin_memory``.
    """

    dense: torch.Tensor
    sparse_values: torch.Tensor
    sparse_offsets: torch.Tensor
    labels: torch.Tensor
    layout: BatchLayout | None = None

    @property
    def batch_size(self) -> int:
        return self.labels.shape[0]

    @property
    def num_features(self) -> int:
        return (self.sparse_offsets.numel() - 1) // max(self.batch_size, 1)

    def lengths(self) -> torch.Tensor:
        """Bag lengths as int64 [F, B]."""
        return torch.diff(self.sparse_offsets).view(self.num_features, self.batch_size)

    def feature_starts(self) -> tuple[int, ...]:
        """F + 1 positions in ``sparse_values``: where each feature's indices start, then nnz;
        the loader's, else read from the offsets once (a device sync on a GPU) and kept."""
        if self.layout is None or self.layout.feature_starts is None:
            starts = tuple(self.sparse_offsets[:: self.batch_size].tolist()) if self.batch_size else (0,)
            self.layout = replace(self.layout or BatchLayout(), feature_starts=starts)
        assert self.layout.feature_starts is not None
        return self.layout.feature_starts

    def feature_values(self, f: int) -> torch.Tensor:
        """Indices of feature f for the whole batch (a view)."""
        if self.batch_size == 0:
            return self.sparse_values[:0]
        starts = self.feature_starts()
        return self.sparse_values[starts[f] : starts[f + 1]]

    def part_layout(self, whole_bags: bool) -> BatchLayout | None:
        """The layout of a batch made of some of this batch's samples (``whole_bags``: each with
        all its indices) or some of its indices: their tables' bounds still hold."""
        if self.layout is None:
            return None
        return BatchLayout(one_per_bag=self.layout.one_per_bag if whole_bags else None, table_rows=self.layout.table_rows)

    def checked_within(self, table_rows: tuple[int, ...]) -> bool:
        """Whether the loader checked that every index of feature f is below ``table_rows[f]``."""
        return self.layout is not None and self.layout.table_rows == table_rows

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return replace(
            self,
            dense=self.dense.to(device, non_blocking=non_blocking),
            sparse_values=self.sparse_values.to(device, non_blocking=non_blocking),
            sparse_offsets=self.sparse_offsets.to(device, non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> Batch:
        """The batch in page-locked host memory, so that ``to(cuda, non_blocking=True)`` overlaps."""
        return replace(
            self,
            dense=self.dense.pin_memory(),
            sparse_values=self.sparse_values.pin_memory(),
            sparse_offsets=self.sparse_offsets.pin_memory(),
            labels=self.labels.pin_memory(),
        )

    def select(self, rows: torch.Tensor) -> Batch:
        """The sub-batch of the samples at ``rows`` (int64 [b']), in that order."""
        return self.select_with_positions(rows)[0]

    def select_with_positions(self, rows: torch.Tensor) -> tuple[Batch, torch.Tensor]:
        """``select(rows)``, and where each of its indices sits in ``sparse_values``: int64 [nnz'],
        so per-index data of this batch can be selected alike."""
        if runs_compiled(rows):
            arrays = compiled("jagged").select_bags(*numpy_views(self.sparse_values, self.sparse_offsets), self.batch_size, rows.numpy())
            values, offsets, positions = (torch.from_numpy(a) for a in arrays)
            return Batch(self.dense[rows], values, offsets, self.labels[rows], self.part_layout(whole_bags=True)), positions
        lengths = self.lengths()[:, rows]  # [F, b']
        starts = self.sparse_offsets[:-1].view(self.num_features, self.batch_size)[:, rows]
        flat_lengths = lengths.reshape(-1)
        new_offsets = torch.zeros(flat_lengths.numel() + 1, dtype=torch.int64, device=rows.device)
        torch.cumsum(flat_lengths, 0, out=new_offsets[1:])
        nnz = int(new_offsets[-1])
        # position of each output index inside its bag, plus the bag's start in the source
        bag_of = torch.repeat_interleave(torch.arange(flat_lengths.numel(), device=rows.device), flat_lengths, output_size=nnz)
        within = torch.arange(nnz, device=rows.device) - new_offsets[:-1][bag_of]
        positions = starts.reshape(-1)[bag_of] + within
        return Batch(self.dense[rows], self.sparse_values[positions], new_offsets, self.labels[rows], self.part_layout(whole_bags=True)), positions

    def slice(self, start: int, end: int) -> Batch:
        """The samples start..end-1 (a rank's share of a global batch)."""
        return self.select(torch.arange(start, end, device=self.labels.device))
