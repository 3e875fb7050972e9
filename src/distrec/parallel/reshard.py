"""Embedding weights and their optimizer state as plan-independent blocks, for resharding.

A checkpoint stores every table as blocks ``(table, rows [a, b), columns [c, d))`` with the
block's weights and the embedding optimizer's per-row state, whatever module held them: the
single-process ``EmbeddingBagCollection`` (one block per table) or a rank's
``ShardedEmbeddingBagCollection`` (one block per shard). Loading copies, into each block a
module holds now, the overlap of every saved block of the same table, so a checkpoint loads
into any world size and any plan (or into one process) as long as the saved blocks tile the
tables, which every valid plan's shards do.

Optimizer state: tensors of the parameter's shape (Adam's moments) are copied like the
weights, exactly; one value per row (row-wise Adagrad's accumulator) is copied from the saved
block holding the new block's first column. When a column split changes, that accumulator,
which is the mean of g^2 over the old shard's columns, is carried over as an estimate for
the new shard: TorchRec's column-wise shards keep separate accumulators in the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from distrec.components.checkpoint import load_state
from distrec.models.embedding import EmbeddingBagCollection
from distrec.parallel.sharded_embedding import ShardedEmbeddingBagCollection


@dataclass(frozen=True)
class Block:
    """A rectangle of one table: rows [row_start, row_end) x columns [col_start, col_end)."""

    table: str
    row_start: int
    row_end: int
    col_start: int
    col_end: int

    def overlap(self, other: Block) -> tuple[slice, slice, slice, slice] | None:
        """(rows, cols) slices into self and (rows, cols) slices into other of the common part, or None."""
        if other.table != self.table:
            return None
        r0, r1 = max(self.row_start, other.row_start), min(self.row_end, other.row_end)
        c0, c1 = max(self.col_start, other.col_start), min(self.col_end, other.col_end)
        if r0 >= r1 or c0 >= c1:
            return None
        return (
            slice(r0 - self.row_start, r1 - self.row_start),
            slice(c0 - self.col_start, c1 - self.col_start),
            slice(r0 - other.row_start, r1 - other.row_start),
            slice(c0 - other.col_start, c1 - other.col_start),
        )


@dataclass(frozen=True)
class HeldBlock:
    """A block as a module holds it: rows ``base .. base + rows`` of ``param``."""

    block: Block
    param: nn.Parameter
    base: int

    def rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """The block's rows of ``tensor`` (a view), which is row-aligned with ``param``."""
        return tensor[self.base : self.base + self.block.row_end - self.block.row_start]


def held_blocks(embeddings: nn.Module, include_replicas: bool = True) -> list[HeldBlock]:
    """Every block of table weights that ``embeddings`` holds on this process.

    ``include_replicas=False`` leaves out the data-parallel replicas of a sharded module
    (identical on every rank, so one rank's copy is enough in a checkpoint). A module that
    wraps its tables with more layers (DMT's tower embeddings) holds them as ``bags``.
    """
    if isinstance(getattr(embeddings, "bags", None), nn.Module):
        return held_blocks(embeddings.bags, include_replicas)
    if isinstance(embeddings, EmbeddingBagCollection):
        out = []
        for t in embeddings.tables:
            start, _ = embeddings.table_rows(t.name)
            out.append(HeldBlock(Block(t.name, 0, t.num_rows, 0, t.dim), embeddings.weight, start))
        return out
    if isinstance(embeddings, ShardedEmbeddingBagCollection):
        out = [
            HeldBlock(Block(u.table, u.row_start, u.row_end, u.col_start, u.col_end), embeddings.weights[g], base)
            for u, g, base in zip(embeddings.local_units, embeddings.unit_group, embeddings.unit_base)
        ]
        if include_replicas:
            for p, i in zip(embeddings.replicas, embeddings.replicated):
                t = embeddings.tables[i]
                out.append(HeldBlock(Block(t.name, 0, t.num_rows, 0, t.dim), p, 0))
        return out
    raise TypeError(f"cannot take blocks of {type(embeddings).__name__}")


def _row_state(optimizer: Optimizer | None, param: nn.Parameter) -> dict[str, Any]:
    if optimizer is None:
        return {}
    return optimizer.state.get(param, {})


def export_blocks(embeddings: nn.Module, optimizer: Optimizer | None, include_replicas: bool = True, copy: bool = False) -> list[dict[str, Any]]:
    """This process's blocks as saveable dicts: ``block`` (fields), ``weight``, ``state``
    (row-aligned optimizer tensors) and ``scalars`` (other optimizer state, e.g. Adam's step).

    Without ``copy`` the tensors are views of the module's own: ``torch.save`` writes a
    storage that several views share once, so saving them in one call writes every fused
    weight once and needs no memory beyond the module's; save them before the rows change.
    ``copy`` clones them, for rows that change before they are saved.
    """
    out = []
    for held in held_blocks(embeddings, include_replicas):
        state = _row_state(optimizer, held.param)
        tensors = {k: held.rows(v) for k, v in state.items() if torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == held.param.shape[0]}
        weight = held.rows(held.param.detach())
        if copy:
            tensors, weight = {k: v.clone() for k, v in tensors.items()}, weight.clone()
        scalars = {k: v for k, v in state.items() if k not in tensors}
        out.append({"block": asdict(held.block), "weight": weight, "state": tensors, "scalars": scalars})
    return out


@torch.no_grad()
def import_blocks(embeddings: nn.Module, optimizer: Optimizer | None, saved: Iterable[dict[str, Any]]) -> None:
    """Fill every block ``embeddings`` holds from the overlapping ``saved`` blocks (see module doc)."""
    saved = [(Block(**s["block"]), s) for s in saved]
    for held in held_blocks(embeddings):
        weight = held.rows(held.param)
        state = optimizer.state[held.param] if optimizer is not None else {}
        for block, s in saved:
            cut = held.block.overlap(block)
            if cut is None:
                continue
            rows, cols, saved_rows, saved_cols = cut
            weight[rows, cols] = s["weight"][saved_rows, saved_cols].to(weight.device)
            for key, value in s["state"].items():
                if key not in state:
                    shape = held.param.shape if value.dim() == 2 else held.param.shape[:1]
                    state[key] = torch.zeros(shape, dtype=value.dtype, device=held.param.device)
                target = held.rows(state[key])
                if value.dim() == 2:
                    target[rows, cols] = value[saved_rows, saved_cols].to(target.device)
                elif block.col_start <= held.block.col_start < block.col_end:
                    target[rows] = value[saved_rows].to(target.device)
            state.update(s["scalars"])


def restore_embeddings(checkpoint: Path, meta: dict[str, Any], embeddings: torch.nn.Module, optimizer: Optimizer | None, rank: int) -> None:
    """Fill the blocks ``embeddings`` holds on ``rank`` (and ``optimizer``'s row state) from a checkpoint.

    Only the rank files holding overlapping blocks are read (memory-mapped). A checkpoint of
    local embeddings gives rank r the tables of saved rank r mod (saved world size).
    """
    index = meta["blocks"]
    if meta.get("embeddings") == "local":
        sources = {rank % int(meta["world_size"])}
    else:
        wanted = [h.block for h in held_blocks(embeddings)]
        sources = {entry["rank"] for entry in index if any(w.overlap(Block(**entry["block"])) for w in wanted)}
    saved = [b for r in sorted(sources) for b in load_state(checkpoint, r)["blocks"]]
    import_blocks(embeddings, optimizer, saved)
