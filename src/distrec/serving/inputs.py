"""The input signature of an exported model: dense features and jagged sparse features.

For B samples, F sparse features and ``num_dense`` dense features:

- ``dense``: float32 [B, num_dense], the dense features after the data format's transform;
- ``values``: int64 [nnz], table rows of every bag, feature-major: feature 0's bags for
  samples 0..B-1, then feature 1's, and so on (each row within its feature's own table);
- ``lengths``: int32 [F * B], ``lengths[f * B + b]`` rows in the bag of feature f, sample b.

This is TorchRec's ``KeyedJaggedTensor`` layout (one values and one lengths tensor over all
keys, key-major), so a TorchRec-fed serving stack passes its tensors as they are. B and nnz
are dynamic; F and ``num_dense`` are fixed by the model.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.export import Dim

from distrec.data.batch import Batch

INPUT_NAMES = ("dense", "values", "lengths")
MAX_BATCH = 1 << 24
"""The largest batch size an exported program accepts (samples)."""


class JaggedInputs(NamedTuple):
    """One batch in the exported program's signature (see the module's doc)."""

    dense: torch.Tensor
    values: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def of_batch(cls, batch: Batch) -> JaggedInputs:
        """A distrec Batch (labels dropped) in this signature."""
        return cls(batch.dense, batch.sparse_values, torch.diff(batch.sparse_offsets).to(torch.int32))

    def batch(self) -> Batch:
        """The Batch a distrec model reads (its labels are zeros)."""
        offsets = torch.cat([self.lengths.new_zeros(1, dtype=torch.int64), torch.cumsum(self.lengths, 0, dtype=torch.int64)])
        return Batch(self.dense, self.values, offsets, self.dense.new_zeros(self.dense.shape[0]))


def example_inputs(num_dense: int, table_rows: list[int], batch_size: int = 3, seed: int = 0) -> JaggedInputs:
    """``batch_size`` random samples for tables of ``table_rows`` rows (one per feature): dense
    values in [0, 1), bags of 0 to 2 random rows of their feature's table (to trace a model with, or to check an export)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (len(table_rows) * batch_size,), generator=generator, dtype=torch.int32)
    limits = torch.tensor(table_rows).repeat_interleave(batch_size).repeat_interleave(lengths.long())
    values = (torch.rand(limits.shape, generator=generator, dtype=torch.float64) * limits).long()
    return JaggedInputs(torch.rand(batch_size, num_dense, generator=generator), values, lengths)


def dynamic_shapes(num_features: int) -> dict[str, dict[int, object]]:
    """The dynamic dimensions of each input (``torch.export``'s ``dynamic_shapes``): the batch
    size B (from 1 to ``MAX_BATCH``), nnz, and F * B."""
    batch = Dim("batch", min=1, max=MAX_BATCH)
    return {"dense": {0: batch}, "values": {0: Dim("nnz", min=0)}, "lengths": {0: num_features * batch}}


def describe_inputs(num_dense: int, num_features: int) -> list[dict[str, object]]:
    """The signature as JSON-ready records: name, dtype, shape (symbolic), meaning."""
    return [
        {"name": "dense", "dtype": "float32", "shape": ["B", num_dense], "meaning": "dense features after the transform of 'dense_features'"},
        {
            "name": "values",
            "dtype": "int64",
            "shape": ["nnz"],
            "meaning": "table rows of every bag, feature-major: feature 0's bags for samples 0..B-1, then feature 1's, ... "
            "(rows of each feature's own table, see 'sparse_features')",
        },
        {"name": "lengths", "dtype": "int32", "shape": [f"{num_features}*B"], "meaning": "lengths[f*B + b]: rows in the bag of feature f, sample b"},
    ]
