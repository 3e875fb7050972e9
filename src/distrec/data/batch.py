"""The mini-batch that every model, trainer and sharded module consumes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distrec.kernels import compiled
from distrec.kernels.rows import numpy_views


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
    """

    dense: torch.Tensor
    sparse_values: torch.Tensor
    sparse_offsets: torch.Tensor
    labels: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.labels.shape[0]

    @property
    def num_features(self) -> int:
        return (self.sparse_offsets.numel() - 1) // max(self.batch_size, 1)

    def lengths(self) -> torch.Tensor:
        """Bag lengths as int64 [F, B]."""
        return torch.diff(self.sparse_offsets).view(self.num_features, self.batch_size)

    def feature_values(self, f: int) -> torch.Tensor:
        """Indices of feature f for the whole batch (a view)."""
        b = self.batch_size
        start = int(self.sparse_offsets[f * b])
        end = int(self.sparse_offsets[(f + 1) * b])
        return self.sparse_values[start:end]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            self.dense.to(device, non_blocking=non_blocking),
            self.sparse_values.to(device, non_blocking=non_blocking),
            self.sparse_offsets.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> Batch:
        return Batch(
            self.dense.pin_memory(),
            self.sparse_values.pin_memory(),
            self.sparse_offsets.pin_memory(),
            self.labels.pin_memory(),
        )

    def select(self, rows: torch.Tensor) -> Batch:
        """The sub-batch of the samples at ``rows`` (int64 [b']), in that order."""
        return self.select_with_positions(rows)[0]

    def select_with_positions(self, rows: torch.Tensor) -> tuple[Batch, torch.Tensor]:
        """``select(rows)``, and where each of its indices sits in ``sparse_values``: int64 [nnz'],
        so per-index data of this batch can be selected alike."""
        if rows.device.type == "cpu":
            arrays = compiled("jagged").select_bags(*numpy_views(self.sparse_values, self.sparse_offsets), self.batch_size, rows.numpy())
            values, offsets, positions = (torch.from_numpy(a) for a in arrays)
            return Batch(self.dense[rows], values, offsets, self.labels[rows]), positions
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
        return Batch(self.dense[rows], self.sparse_values[positions], new_offsets, self.labels[rows]), positions

    def slice(self, start: int, end: int) -> Batch:
        """The samples start..end-1 (a rank's share of a global batch)."""
        return self.select(torch.arange(start, end, device=self.labels.device))
