"""SPTT from sparse inputs: equal to the flat sharded module and to plain embedding bags."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from distrec.data.batch import Batch
from distrec.models.embedding import EmbeddingBagCollection
from distrec.parallel.sharded_embedding import ShardedEmbeddingBagCollection, full_weights_fill
from distrec.parallel.sptt import FeatureLayout
from distrec.parallel.sptt_embedding import SpttEmbeddingBagCollection, sync_tower_grads, tower_plan
from distrec.parallel.topology import Topology
from distrec.tables import TableConfig
from multiprocess import run_distributed
from test_sptt import merged_towers

DIM = 4
LOCAL_BATCH = 3
# t3 has fewer rows than some towers have ranks: row-wise, a rank may hold none of it
TABLES = [TableConfig(f"t{i}", rows, DIM, multi_hot=True) for i, rows in enumerate([30, 17, 25, 3, 40, 12, 21])]
# towers of feature indices per host, by topology (the 2x3 one leaves a rank without tables)
TOWERS = {
    (2, 2): [[5, 0, 3], [6, 2, 1, 4]],
    (2, 3): [[4, 0, 6, 2, 1], [5, 3]],
    (4, 1): [[0, 5], [2], [1, 3], [4, 6]],
    (1, 4): [[6, 1, 4, 0, 3, 2, 5]],
}


def _global_batch(rows: int, max_bag: int, seed: int) -> Batch:
    """Random bags of 1..max_bag indices (max_bag=1: single-hot)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_bag + 1, (len(TABLES), rows), generator=g)
    values = torch.cat([torch.randint(0, t.num_rows, (int(lengths[f].sum()),), generator=g) for f, t in enumerate(TABLES)])
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths.reshape(-1), 0, out=offsets[1:])
    return Batch(torch.zeros(rows, 1), values, offsets, torch.zeros(rows))


def _table_grads(module: nn.Module, reference: EmbeddingBagCollection) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(table, dense gradient of this rank's block, the reference's gradient of the same block)."""
    expected = reference.weight.grad.to_dense()
    out = []
    for u, w, start in _blocks(module):
        first, _ = reference.table_rows(u.table)
        out.append((u.table, w.grad.to_dense()[start : start + u.num_rows], expected[first + u.row_start : first + u.row_end, u.col_start : u.col_end]))
    return out


def _blocks(module):
    for k, u in enumerate(module.local_units):
        yield u, module.weights[module.unit_group[k]], module.unit_base[k]


def _layout(world: int, hosts: int, sharding: str, hosts_per_tower: int, row_wise: tuple[int, ...] = ()) -> FeatureLayout:
    """The towers of ``TOWERS``, K hosts per tower, on the topology of towers."""
    towers = merged_towers(TOWERS[(hosts, world // hosts)], hosts_per_tower)
    return FeatureLayout.from_towers(Topology(hosts, world // hosts).tower_topology(hosts_per_tower), towers, sharding, DIM, row_wise)


def _check(rank: int, world: int, hosts: int, max_bag: int, sharding: str, hosts_per_tower: int = 1, row_wise: tuple[int, ...] = ()) -> None:
    layout = _layout(world, hosts, sharding, hosts_per_tower, row_wise)
    topology = layout.topology
    groups = topology.build_groups()
    torch.manual_seed(0)
    reference = EmbeddingBagCollection(TABLES)
    full = {t.name: reference.table_weight(t.name).detach().clone() for t in TABLES}
    batch = _global_batch(world * LOCAL_BATCH, max_bag, seed=11)
    upstream = torch.randn(world * LOCAL_BATCH, len(TABLES), DIM, generator=torch.Generator().manual_seed(5))
    mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    local = batch.slice(mine.start, mine.stop)

    expected = reference(batch)
    (expected * upstream).sum().backward()

    modules = [("sptt", SpttEmbeddingBagCollection.from_fill(TABLES, layout, groups, full_weights_fill(TABLES, full)))]
    if all(layout.feature_counts):  # the flat module cannot back-propagate on a rank without tables
        flat = ShardedEmbeddingBagCollection.from_full_weights(TABLES, tower_plan(TABLES, layout), full)
        modules.insert(0, ("flat", flat))
    for name, module in modules:
        name = f"{name} {sharding} K={hosts_per_tower} row-wise {row_wise} max_bag={max_bag}"
        out = module(local)
        torch.testing.assert_close(out, expected[mine], rtol=0, atol=1e-6, msg=lambda m: f"{name} values: {m}")
        # local-mean losses: world x the global gradient, which the exchanges scale back
        (out * upstream[mine]).sum().mul(world).backward()
        for table, grad, expected_grad in _table_grads(module, reference):
            torch.testing.assert_close(grad, expected_grad, msg=lambda m: f"{name} {table} grad: {m}")

    # tower modules: the host-summed parameter gradients equal the single-process ones
    host = topology.host(rank)
    features = layout.host_features(host)
    torch.manual_seed(100 + host)
    tower = nn.Sequential(nn.Flatten(), nn.Linear(len(features) * DIM, 2))
    single = nn.Sequential(nn.Flatten(), nn.Linear(len(features) * DIM, 2))
    single.load_state_dict(tower.state_dict())
    dmt = SpttEmbeddingBagCollection.from_fill(TABLES, layout, groups, full_weights_fill(TABLES, full), tower, [2] * topology.hosts)
    out = dmt(local)
    tower_upstream = torch.randn(world * LOCAL_BATCH, 2 * topology.hosts, generator=torch.Generator().manual_seed(9))
    (out * tower_upstream[mine]).sum().mul(world).backward()
    sync_tower_grads(tower, groups, world)
    pooled = expected.detach()
    single_out = single(pooled[:, features])
    torch.testing.assert_close(out[:, 2 * host : 2 * host + 2], single_out[mine].detach(), rtol=1e-5, atol=1e-6)
    (single_out * tower_upstream[:, 2 * host : 2 * host + 2]).sum().backward()
    for p, ref in zip(tower.parameters(), single.parameters()):
        torch.testing.assert_close(p.grad, ref.grad, rtol=1e-5, atol=1e-6)
    dist.barrier()


@pytest.mark.parametrize("hosts,ranks_per_host", list(TOWERS))
def test_sptt_module_equals_flat_and_unsharded_single_and_multi_hot(hosts, ranks_per_host):
    world = hosts * ranks_per_host
    run_distributed(_run_both, world, hosts)


def _run_both(rank: int, world: int, hosts: int) -> None:
    for sharding in ("table_wise", "column_wise", "row_wise"):  # tower tables inside the host
        for max_bag in (1, 4):  # single-hot, multi-hot
            _check(rank, world, hosts, max_bag, sharding)
        _check_uneven(rank, world, hosts, sharding)
    _check(rank, world, hosts, 4, "table_wise", row_wise=(0, 4))  # the two largest tables by rows
    if hosts % 2 == 0:  # towers of 2 hosts
        _check(rank, world, hosts, 1, "table_wise", hosts_per_tower=2)
        _check(rank, world, hosts, 4, "row_wise", hosts_per_tower=2)


def _check_uneven(rank: int, world: int, hosts: int, sharding: str) -> None:
    """Ranks with fewer samples (the last batch of an epoch): padded inside, same result."""
    layout = _layout(world, hosts, sharding, 1)
    topology = layout.topology
    sizes = [LOCAL_BATCH - r % 3 for r in range(world)]  # 3, 2, 1, 3, ...
    starts = [sum(sizes[:r]) for r in range(world)]
    torch.manual_seed(0)
    reference = EmbeddingBagCollection(TABLES)
    full = {t.name: reference.table_weight(t.name).detach().clone() for t in TABLES}
    batch = _global_batch(sum(sizes), 3, seed=4)
    upstream = torch.randn(sum(sizes), len(TABLES), DIM, generator=torch.Generator().manual_seed(6))
    expected = reference(batch)
    (expected * upstream).sum().backward()
    mine = slice(starts[rank], starts[rank] + sizes[rank])
    module = SpttEmbeddingBagCollection.from_fill(TABLES, layout, topology.build_groups(), full_weights_fill(TABLES, full))
    out = module(batch.slice(mine.start, mine.stop))
    torch.testing.assert_close(out, expected[mine], rtol=0, atol=1e-6)
    (out * upstream[mine]).sum().mul(world).backward()
    for _, grad, expected_grad in _table_grads(module, reference):
        torch.testing.assert_close(grad, expected_grad)
