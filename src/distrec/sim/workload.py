"""The model and batch of one training iteration, as the simulator sees them."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from distrec.errors import DistrecError


@dataclass(frozen=True)
class Workload:
    """The model and batch of one training iteration.

    Attributes:
        local_batch: samples per GPU (b).
        num_features: sparse features, one table each (F).
        embedding_dim: floats per pooled embedding (D).
        pooling: mean indices per feature and sample.
        dense_mflops: forward MFLOPs per sample of the dense layers (bottom, interaction, top).
        dense_params: replicated dense parameters, all-reduced every iteration (fp32 gradients).
        tower_mflops: DMT only: forward MFLOPs per sample of all tower modules together.
        tower_params: DMT only: parameters of one host's tower module.
        table_rows: rows of every table, or of each table (F values) (2D: the size of a replica
            and of its touched rows).
        row_state_floats: row-wise optimizer state per row (1 for row-wise Adagrad), averaged
            with the weights by 2D ``periodic`` sync.
        zipf_exponent: how lookups spread over a table's rows (2D ``exact`` sync moves the
            distinct rows): row i drawn with probability proportional to ``i ** -zipf_exponent``;
            0 is uniform (the most distinct rows).
        bytes_per_float: bytes per exchanged embedding, gradient or table value.
        bytes_per_index: bytes per sparse index, bag length or row id.
    """

    local_batch: int = 1024
    num_features: int = 256
    embedding_dim: int = 128
    pooling: float = 1.0
    dense_mflops: float = 200.0
    dense_params: int = 10_000_000
    tower_mflops: float = 0.0
    tower_params: int = 0
    table_rows: int | tuple[int, ...] = 1_000_000
    row_state_floats: int = 1
    zipf_exponent: float = 0.0
    bytes_per_float: int = 4
    bytes_per_index: int = 8

    def __post_init__(self) -> None:
        positive = ("local_batch", "num_features", "embedding_dim", "bytes_per_float", "bytes_per_index")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "table_rows" and not (0 < value < math.inf if f.name in positive else 0 <= value < math.inf):
                raise DistrecError(f"workload {f.name} = {value} is invalid; use a {'positive' if f.name in positive else 'non-negative'} finite value")
        rows = self.rows_per_table()
        if len(rows) != self.num_features or min(rows) < 1:
            raise DistrecError(
                f"workload table_rows = {self.table_rows} is invalid; give one positive row count, or one for each of the {self.num_features} tables"
            )

    def rows_per_table(self) -> tuple[int, ...]:
        """Rows of each of the F tables."""
        return tuple(self.table_rows) if isinstance(self.table_rows, (tuple, list)) else (self.table_rows,) * self.num_features
