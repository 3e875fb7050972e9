"""The pooled embedding lookup of a served model, in plain torch operators.

``EmbeddingBagCollection`` pools through compiled kernels on the CPU and branches on the
batch's values (single- or multi-hot bags, an index check); neither can be traced into a
``torch.export`` program. ``ServingTables`` computes the same ``Batch -> [B, F, D]`` from
the same fused rows with operators only (no branch on values, no kernel), over rows stored
as float32, float16 or 8-bit row-wise (``distrec.serving.quantize``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from distrec.data.batch import Batch
from distrec.models.embedding import EmbeddingBagCollection
from distrec.serving.formats import ServingDtype
from distrec.serving.quantize import dequantize, quantize_rows, stored_bytes


class ServingTables(nn.Module):
    """Sum-pooled bags of one fused table per model, for inference only.

    Indices are not checked against their table (the exported program cannot raise): an index
    outside its feature's rows reads a neighbouring table's row, or fails beyond the last.

    Args:
        bags: the trained tables (any device and strides; a memory map is read a block at a time).
        dtype: how the rows are stored: ``fp32``, ``fp16``, ``bf16`` or ``int8`` (row-wise, FBGEMM's layout).

    Example:
        >>> tables = ServingTables(model.embeddings, "int8")
        >>> tables(batch).shape                # B samples, F features of dimension D
        torch.Size([B, F, D])
    """

    rows: torch.Tensor
    """The stored rows of every table, stacked: float32, float16 or bfloat16 [R, D], or uint8 [R, D] (int8)."""
    scale_bias: torch.Tensor | None
    """int8: each row's float32 (scale, bias) [R, 2]; else None."""
    row_steps: torch.Tensor
    """int64 [F]: each table's first row minus the previous table's (the previous table's rows; 0 for the first)."""

    def __init__(self, bags: EmbeddingBagCollection, dtype: ServingDtype = "fp32") -> None:
        super().__init__()
        self.tables = list(bags.tables)
        self.dim = bags.dim
        self.num_vectors = bags.num_vectors
        self.dtype = dtype
        stored = quantize_rows(bags.weight, dtype)
        self.table_bytes = stored_bytes(stored)
        self.register_buffer("rows", stored["rows"])
        self.register_buffer("scale_bias", stored.get("scale_bias"))
        self.register_buffer("row_steps", torch.tensor([0, *(t.num_rows for t in self.tables[:-1])], dtype=torch.int64))

    def forward(self, batch: Batch) -> torch.Tensor:
        """Pooled embeddings of every feature: float32 [B, F, D], contiguous."""
        num_features, batch_size, values, offsets = len(self.tables), batch.batch_size, batch.sparse_values, batch.sparse_offsets
        feature_starts = offsets[:-1].view(num_features, batch_size)[:, 0]
        # each index's table start, as the running sum of the steps placed at each feature's first index
        steps = values.new_zeros(values.shape[0] + 1).scatter_add(0, feature_starts, self.row_steps)
        rows = values + torch.cumsum(steps[:-1], 0)
        if self.dtype == "fp32":
            pooled = F.embedding_bag(rows, self.rows, offsets, mode="sum", include_last_offset=True)
        else:  # the bags' rows dequantised in the order of the batch, then summed bag by bag
            looked_up = dequantize(self.rows, self.scale_bias, rows)
            pooled = F.embedding_bag(torch.arange(values.shape[0], device=values.device), looked_up, offsets, mode="sum", include_last_offset=True)
        return pooled.view(num_features, batch_size, self.dim).transpose(0, 1).contiguous()


def use_serving_tables(model: nn.Module, dtype: ServingDtype = "fp32") -> list[ServingTables]:
    """Replace every EmbeddingBagCollection inside ``model`` (its ``embeddings``, or a DMT
    model's ``embeddings.bags``) by ServingTables of ``dtype``, in place; returns them."""
    replaced = []
    for name, module in list(model.named_modules()):
        if isinstance(module, EmbeddingBagCollection):
            parent, _, attribute = name.rpartition(".")
            tables = ServingTables(module, dtype)
            setattr(model.get_submodule(parent), attribute, tables)
            replaced.append(tables)
    return replaced
