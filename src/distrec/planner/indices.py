"""Synthetic index batches that follow a table's pooling factor and reuse-factor histogram."""

from __future__ import annotations

import numpy as np

from distrec.planner.types import NUM_HISTOGRAM_BINS, TableSpec

_BIN = np.arange(NUM_HISTOGRAM_BINS)
# Access counts of bin k are drawn uniformly from (2**(k-1), 2**k]; bin 0 is exactly 1 and the
# open last bin (> 32768) is drawn from (32768, 65536].
_COUNT_LO = np.where(_BIN == 0, 1, 2.0 ** (_BIN - 1) + 1).astype(np.int64)
_COUNT_HI = (2**_BIN).astype(np.int64)


def sample_bags(table: TableSpec, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One batch of bags for ``table``: Poisson bag lengths with the table's mean pooling factor,
    and rows whose access counts follow its histogram.

    Every distinct row of the batch gets an access count drawn from the histogram (bin by the
    histogram's fraction, count uniform inside the bin); the counts are laid out as a shuffled
    stream, cut at the batch's total length. Rows are distinct while the table has enough of
    them. Counts above the batch's total length cannot occur, so a small batch shifts mass
    from the highest bins to the largest count that fits.

    Returns:
        (values int64 [nnz] rows in 0..num_rows-1, offsets int64 [batch_size + 1]).
    """
    lengths = rng.poisson(table.pooling_factor, size=batch_size)
    offsets = np.zeros(batch_size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return np.zeros(0, dtype=np.int64), offsets
    hist = np.asarray(table.histogram)
    mean_count = float(hist @ ((_COUNT_LO + _COUNT_HI) / 2))
    counts = np.zeros(0, dtype=np.int64)
    while counts.sum() < total:
        draw = int(1.2 * (total - counts.sum()) / mean_count) + 16
        bins = rng.choice(NUM_HISTOGRAM_BINS, size=draw, p=hist)
        counts = np.concatenate([counts, rng.integers(_COUNT_LO[bins], _COUNT_HI[bins] + 1)])
    ends = np.cumsum(counts)
    num_distinct = int(np.searchsorted(ends, total)) + 1
    counts = counts[:num_distinct]
    counts[-1] -= ends[num_distinct - 1] - total
    if num_distinct <= table.num_rows:
        rows = rng.choice(table.num_rows, size=num_distinct, replace=False)
    else:
        rows = rng.integers(table.num_rows, size=num_distinct)
    values = rng.permutation(np.repeat(rows.astype(np.int64), counts))
    return values, offsets
