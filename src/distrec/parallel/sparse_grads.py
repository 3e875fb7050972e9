"""Averaging sparse (row) gradients over a process group: only rows touched somewhere travel."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def average_sparse_grads(params: list[nn.Parameter], group: dist.ProcessGroup | None = None) -> int:
    """Replace each parameter's sparse COO gradient [rows, width] by its mean over ``group`` (a
    collective; every rank passes parameters of the same shapes in the same order, with or
    without a gradient).

    Every parameter's entries travel together: one all-gather of the entry counts, one of
    the rows and one of the values, whatever the number of parameters. The result is
    uncoalesced (the row-wise optimizers coalesce). Returns the bytes this rank sent (its
    counts, distinct row ids and their values, padded to the longest rank's, to each other rank).
    """
    if not params:
        return 0
    world_size = dist.get_world_size(group)
    widths = [p.shape[1] for p in params]
    grads = [p.grad.coalesce() if p.grad is not None else None for p in params]
    rows = [g.indices()[0] if g is not None else p.new_empty(0, dtype=torch.int64) for g, p in zip(grads, params)]
    values = [g.values().reshape(-1) if g is not None else p.new_empty(0) for g, p in zip(grads, params)]
    device = params[0].device
    counts = [torch.empty(len(rows), dtype=torch.int64, device=device) for _ in range(world_size)]
    mine = torch.tensor([r.numel() for r in rows], device=device)
    dist.all_gather(counts, mine, group=group)
    counts = [c.tolist() for c in counts]  # [rank][parameter] entries
    floats = [[n * w for n, w in zip(c, widths)] for c in counts]
    all_rows, rows_sent = _all_gather_jagged(torch.cat(rows), [sum(c) for c in counts], group)
    all_values, values_sent = _all_gather_jagged(torch.cat(values), [sum(f) for f in floats], group)
    # rank r's entries of parameter t: its counts[r][t] after those of parameters before t
    row_parts = [torch.split(r, c) for r, c in zip(all_rows, counts)]
    value_parts = [torch.split(v, f) for v, f in zip(all_values, floats)]
    for t, p in enumerate(params):
        if not any(c[t] for c in counts):
            continue
        indices = torch.cat([parts[t] for parts in row_parts])
        averaged = torch.cat([parts[t] for parts in value_parts]).view(-1, widths[t]) / world_size
        p.grad = torch.sparse_coo_tensor(indices.unsqueeze(0), averaged, p.shape, check_invariants=False)  # rows of this replica set's own gradients
    return (world_size - 1) * mine.numel() * mine.element_size() + rows_sent + values_sent


def all_gather_rows(rows: torch.Tensor, values: torch.Tensor, group: dist.ProcessGroup | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """Every member's ``rows`` (int64 [m]) and ``values`` ([m, W], W the same on every member)
    over ``group`` (a collective): the members' rows and values in rank order, and the bytes
    this rank sent (its count, rows and values, padded to the longest member's, to each other member)."""
    world_size, width = dist.get_world_size(group), values.shape[1]
    count = torch.tensor([rows.numel()], device=rows.device)
    counts = [torch.empty_like(count) for _ in range(world_size)]
    dist.all_gather(counts, count, group=group)
    sizes = [int(c) for c in counts]
    all_rows, rows_sent = _all_gather_jagged(rows, sizes, group)
    all_values, values_sent = _all_gather_jagged(values.reshape(-1), [n * width for n in sizes], group)
    sent = (world_size - 1) * count.numel() * count.element_size() + rows_sent + values_sent
    return all_rows, [v.view(n, width) for v, n in zip(all_values, sizes)], sent


def _all_gather_jagged(x: torch.Tensor, lengths: list[int], group: dist.ProcessGroup | None) -> tuple[list[torch.Tensor], int]:
    """Every member's ``x`` (1-D; member r's has ``lengths[r]`` entries) over ``group`` (a
    collective), in rank order, and the bytes this rank sent: ``x`` padded with zeros to the
    longest member's (all-gather needs equal sizes), to each other member."""
    padded = torch.cat([x, x.new_zeros(max(lengths) - x.numel())])
    parts = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(parts, padded, group=group)
    return [p[:n] for p, n in zip(parts, lengths)], (len(lengths) - 1) * padded.numel() * padded.element_size()
