import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from distrec.errors import DistrecError
from distrec.parallel.comm import free_port
from distrec.parallel.sptt import (
    FeatureLayout,
    blocks_to_columns,
    flat_exchange,
    local_batch_size,
    sptt_exchange,
    to_peer_order,
)
from distrec.parallel.sptt_embedding import run_topology, tower_layout, tower_plan
from distrec.parallel.topology import Topology
from distrec.tables import TableConfig

DIM = 3
LOCAL_BATCH = 2


# ---------------------------------------------------------------- pure functions


def test_to_peer_order_moves_rank_blocks_into_peer_order():
    t = Topology(hosts=2, ranks_per_host=3)
    rows = torch.arange(t.world_size * LOCAL_BATCH)  # row i belongs to rank i // b
    out = to_peer_order(rows.view(-1, 1, 1).expand(-1, 4, DIM), t)
    expected = torch.cat([rows[g * LOCAL_BATCH : (g + 1) * LOCAL_BATCH] for g in t.peer_order])
    assert torch.equal(out[:, 0, 0], expected)
    assert torch.equal(out[:, 3, 2], expected)


def test_blocks_to_columns_puts_each_source_block_side_by_side():
    a = torch.arange(6.0).view(3, 2)
    b = 100 + torch.arange(3.0).view(3, 1)
    c = torch.empty(3, 0)
    out = blocks_to_columns(torch.cat([a.reshape(-1), c.reshape(-1), b.reshape(-1)]), rows=3, widths=[2, 0, 1])
    assert torch.equal(out, torch.cat([a, b], dim=1))


def test_layout_from_towers_splits_each_tower_table_wise_over_its_host():
    t = Topology(hosts=2, ranks_per_host=3)
    layout = FeatureLayout.from_towers(t, [[7, 0, 3, 5, 1], [2, 6, 4]])
    assert layout.features_of_rank == ((7, 0), (3, 5), (1,), (2,), (6,), (4,))
    assert layout.host_feature_counts() == [5, 3]
    index = layout.global_index()
    assert [layout.exchange_order[int(index[f])] for f in range(8)] == list(range(8))


@pytest.mark.parametrize(
    "towers,message",
    [
        ([[0, 1, 2]], "partition the features into 2 towers"),
        ([[0, 1], [1, 2]], "exactly one rank"),
        ([[0, 1, 2], []], "no features"),
    ],
)
def test_layout_errors(towers, message):
    with pytest.raises(DistrecError, match=message):
        FeatureLayout.from_towers(Topology(2, 2), towers)


def test_local_batch_size_must_divide_evenly():
    assert local_batch_size(12, Topology(2, 3)) == 2
    with pytest.raises(DistrecError, match="multiple of the world size"):
        local_batch_size(10, Topology(2, 3))


def test_steps_c_to_e_give_each_rank_its_tower_for_its_peers_samples():
    """Emulate the intra-host all-to-all in-process and follow sample and feature ids."""
    t = Topology(hosts=2, ranks_per_host=3)
    layout = FeatureLayout.from_towers(t, [[4, 0, 6, 2], [1, 5, 3]])
    global_rows = t.world_size * LOCAL_BATCH
    sample = torch.arange(global_rows, dtype=torch.float64).view(-1, 1)
    # entry (sample s, feature f) holds s * 100 + f
    pooled = [(sample * 100 + torch.tensor(f, dtype=torch.float64)).unsqueeze(2) for f in layout.features_of_rank]
    for host in range(t.hosts):
        ranks = t.host_ranks(host)
        sends = [to_peer_order(pooled[g], t).reshape(t.ranks_per_host, -1) for g in ranks]
        widths = [layout.feature_counts[g] for g in ranks]
        host_features = torch.tensor([f for g in ranks for f in layout.features_of_rank[g]], dtype=torch.float64)
        for local, rank in enumerate(ranks):
            recv = torch.cat([send[local] for send in sends])
            tower = blocks_to_columns(recv, t.hosts * LOCAL_BATCH, widths)
            peer_samples = torch.cat([torch.arange(p * LOCAL_BATCH, (p + 1) * LOCAL_BATCH) for p in t.peers(rank)]).double()
            assert torch.equal(tower, peer_samples.view(-1, 1) * 100 + host_features)


# ---------------------------------------------------------------- distributed


def _tower_module(host: int, num_features: int) -> nn.Module:
    torch.manual_seed(100 + host)
    return nn.Sequential(nn.Flatten(), nn.Linear(num_features * DIM, 2 + host))


def _reference(layout, inputs, upstream, modules):
    """Outputs and gradients computed on the whole batch in one process (row-wise features:
    the sum of the host's partial sums)."""
    leaves = [x.clone().requires_grad_() for x in inputs]
    t = layout.topology
    by_host = []  # each host's features in host_features order
    for h in range(t.hosts):
        shared = len(layout.host_row_wise_features(h))
        whole = [leaves[g][:, : leaves[g].shape[1] - shared] for g in t.host_ranks(h)]
        # a sum, not stack(...).sum(0): the leaves' .grad from a stack alias each other in torch 2.13
        by_host += whole + ([sum(leaves[g][:, leaves[g].shape[1] - shared :] for g in t.host_ranks(h))] if shared else [])
    full = torch.cat(by_host, dim=1).index_select(1, layout.global_index())
    towers = [layout.host_features(h) for h in range(len(modules))]
    outs = []
    for r, grad in enumerate(upstream):
        rows = full[r * LOCAL_BATCH : (r + 1) * LOCAL_BATCH]
        out = rows if not modules else torch.cat([m(rows[:, tw]) for m, tw in zip(modules, towers)], dim=1)
        outs.append(out)
        (out * grad).sum().backward(retain_graph=True)
    return outs, [x.grad for x in leaves]


# (hosts, ranks per host, towers of global feature indices, one per host); F = 10 features
CONFIGS = [
    (2, 2, [[3, 9, 0, 5, 7, 1], [8, 2, 6, 4]]),
    (2, 3, [[4, 0, 7, 2, 9, 1, 3, 6], [8, 5]]),  # host 0 pools 3, 3, 2 features; host 1 pools 1, 1, 0
    (4, 1, [[0, 5], [2, 7, 9], [1, 3], [4, 6, 8]]),
    (1, 4, [[9, 1, 4, 0, 7, 3, 2, 8, 5, 6]]),
]


def merged_towers(towers: list[list[int]], hosts_per_tower: int) -> list[list[int]]:
    """The per-host towers of ``towers`` joined K hosts at a time: one tower per K hosts."""
    return [sum(towers[i : i + hosts_per_tower], []) for i in range(0, len(towers), hosts_per_tower)]


MIXED = (0, 4, 8)  # row-wise features among table-wise ones


def _variants(hosts):
    """(tower sharding, hosts per tower, row-wise features): every K dividing the hosts,
    table- and row-wise; and table-wise with the features MIXED row-wise."""
    uniform = [(sharding, k, ()) for k in range(1, hosts + 1) if hosts % k == 0 for sharding in ("table_wise", "row_wise")]
    return uniform + [("table_wise", 1, MIXED)]


def _check_exchanges(rank, hosts, ranks_per_host, towers, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=hosts * ranks_per_host)
    try:
        for sharding, k, row_wise in _variants(hosts):
            where = f"{hosts}x{ranks_per_host} K={k} {sharding} row-wise {row_wise}"
            _check_variant(rank, Topology(hosts, ranks_per_host).tower_topology(k), merged_towers(towers, k), sharding, row_wise, where)
    finally:
        dist.destroy_process_group()


def _check_variant(rank, t, towers, sharding, row_wise, config):
    """SPTT on topology ``t`` (hosts = towers) equals the flat exchange and the one-process reference."""
    groups = t.build_groups()
    assert dist.get_process_group_ranks(groups.intra_host) == t.host_ranks(t.host(rank))
    assert dist.get_process_group_ranks(groups.cross_host) == t.peers(rank)
    layout = FeatureLayout.from_towers(t, towers, sharding, row_wise=row_wise)
    # reduce-scatter may add 3 or more partial sums in another order than the reference
    exact = dict(rtol=0, atol=0) if not layout.row_wise_features or t.ranks_per_host < 3 else {}
    gen = torch.Generator().manual_seed(7)
    global_rows = t.world_size * LOCAL_BATCH
    inputs = [torch.randn(global_rows, count, DIM, generator=gen) for count in layout.feature_counts]
    upstream = [torch.randn(LOCAL_BATCH, layout.num_features, DIM, generator=gen) for _ in range(t.world_size)]
    expected, expected_grads = _reference(layout, inputs, upstream, [])
    exchanges = {
        "flat": lambda x: flat_exchange(x, layout, rank),
        "sptt": lambda x: sptt_exchange(x, layout, groups),
        "sptt, rows already in peer order": lambda x: sptt_exchange(to_peer_order(x, t), layout, groups, rows_in_peer_order=True),
    }
    for name, exchange in exchanges.items():
        x = inputs[rank].clone().requires_grad_()
        out = exchange(x)
        (out * upstream[rank]).sum().backward()
        where = f"{config} rank {rank} {name}"
        torch.testing.assert_close(out, expected[rank], **exact, msg=lambda m: f"{where} output: {m}")
        torch.testing.assert_close(x.grad, expected_grads[rank], rtol=0, atol=0, msg=lambda m: f"{where} grad: {m}")

    # with tower modules: only their outputs cross hosts; parameter gradients summed inside the host
    host_counts = layout.host_feature_counts()
    modules = [_tower_module(h, n) for h, n in enumerate(host_counts)]
    tower_dims = [2 + h for h in range(t.hosts)]
    tower_upstream = [torch.randn(LOCAL_BATCH, sum(tower_dims), generator=gen) for _ in range(t.world_size)]
    expected, expected_grads = _reference(layout, inputs, tower_upstream, modules)
    mine = _tower_module(t.host(rank), host_counts[t.host(rank)])
    x = inputs[rank].clone().requires_grad_()
    out = sptt_exchange(x, layout, groups, tower_module=mine, tower_dims=tower_dims)
    (out * tower_upstream[rank]).sum().backward()
    where = f"{config} rank {rank} sptt with tower modules"
    torch.testing.assert_close(out, expected[rank], msg=lambda m: f"{where} output: {m}")
    torch.testing.assert_close(x.grad, expected_grads[rank], msg=lambda m: f"{where} grad: {m}")
    for p, ref in zip(mine.parameters(), modules[t.host(rank)].parameters()):
        dist.all_reduce(p.grad, group=groups.intra_host)
        torch.testing.assert_close(p.grad, ref.grad, msg=lambda m: f"{where} parameter grad: {m}")


def _exchange_worker(rank, ports):
    for (hosts, ranks_per_host, towers), port in zip(CONFIGS, ports):
        if rank < hosts * ranks_per_host:
            _check_exchanges(rank, hosts, ranks_per_host, towers, port)


def test_sptt_equals_flat_all_to_all_in_values_and_gradients():
    """2x2, 2x3, 4x1 and 1x4 on random inputs, one process group after the other; each with
    towers of every K hosts dividing the hosts, table- and row-wise."""
    ports: list[int] = []
    while len(ports) < len(CONFIGS):  # distinct, so no rank can join an earlier group's store
        port = free_port()
        ports += [port] if port not in ports else []
    mp.spawn(_exchange_worker, args=(ports,), nprocs=max(h * l for h, l, _ in CONFIGS))


def test_layout_from_towers_column_wise_gives_every_rank_of_a_host_all_its_features_and_a_column_range():
    t = Topology(2, 3)
    layout = FeatureLayout.from_towers(t, [[4, 0], [1, 3, 2]], "column_wise", dim=8)
    assert layout.features_of_rank == ((4, 0),) * 3 + ((1, 3, 2),) * 3
    assert layout.columns_of_rank == ((0, 3), (3, 5), (5, 8)) * 2
    assert layout.host_feature_counts() == [2, 3] and layout.exchange_order == [4, 0, 1, 3, 2]
    assert layout.widths(8) == [6, 4, 6, 9, 6, 9]
    # host 0's blocks side by side: rank 0 holds columns 0..2 of features 4 and 0, then ranks 1 and 2
    index = layout.column_index(t.host_ranks(0), 8)
    blocks = torch.cat([torch.arange(6), torch.arange(6, 10), torch.arange(10, 16)])
    assert blocks[index].view(2, 8).tolist() == [[0, 1, 2, 6, 7, 10, 11, 12], [3, 4, 5, 8, 9, 13, 14, 15]]
    with pytest.raises(DistrecError, match="at least 3 embedding columns"):
        FeatureLayout.from_towers(t, [[4, 0], [1, 3, 2]], "column_wise", dim=2)


def test_tower_topology_makes_each_tower_of_k_hosts_one_host_of_its_ranks():
    towers = Topology(hosts=4, ranks_per_host=2).tower_topology(2)
    assert towers == Topology(hosts=2, ranks_per_host=4)
    assert towers.host_ranks(1) == [4, 5, 6, 7] and towers.peers(5) == [1, 5]
    assert Topology(3, 2).tower_topology(1) == Topology(3, 2)
    for k in (0, 3):
        with pytest.raises(DistrecError, match=f"--hosts-per-tower {k} must divide the 4 hosts"):
            Topology(4, 1).tower_topology(k)


def test_layout_row_wise_gives_every_rank_of_a_host_all_its_features_and_the_plan_splits_rows():
    t = Topology(2, 3)
    layout = FeatureLayout.from_towers(t, [[2, 0], [1]], "row_wise")
    assert layout.row_wise_features == {0, 1, 2} and layout.features_of_rank == ((2, 0),) * 3 + ((1,),) * 3
    assert layout.host_feature_counts() == [2, 1] and layout.widths(4) == [8, 8, 8, 4, 4, 4]
    tables = [TableConfig("a", 10, 4), TableConfig("b", 2, 4), TableConfig("c", 7, 4)]  # b: rank 4 holds none of it
    plan = tower_plan(tables, layout)
    shards = {p.table: [(s.rank, s.row_start, s.row_end) for s in p.shards] for p in plan.tables}
    assert {p.sharding for p in plan.tables} == {"row_wise"}
    assert shards == {"a": [(0, 0, 3), (1, 3, 7), (2, 7, 10)], "b": [(3, 0, 1), (5, 1, 2)], "c": [(0, 0, 2), (1, 2, 5), (2, 5, 7)]}
    plan.validate(tables)


def test_run_topology_takes_towers_of_k_hosts_within_a_replica_group():
    assert run_topology(8, hosts=4, ranks_per_host=2, hosts_per_tower=2) == Topology(2, 4)
    assert run_topology(8, hosts=4, ranks_per_host=2, replica_groups=2, hosts_per_tower=2) == Topology(1, 4)
    with pytest.raises(DistrecError, match="--hosts-per-tower 2 must divide the 1 hosts"):
        run_topology(4, hosts=2, ranks_per_host=2, replica_groups=2, hosts_per_tower=2)


def test_tower_layout_splits_by_rows_the_largest_tables_of_a_rank_over_the_limit():
    t = Topology(2, 2)
    tables = [TableConfig("a", 1000, 4), TableConfig("b", 10, 4), TableConfig("c", 10, 4), TableConfig("d", 500, 4)]  # 16000, 160, 160, 8000 B
    layout = tower_layout(tables, t, [[0, 1], [2, 3]], "table_wise", memory_per_rank=9000)
    assert layout.row_wise_features == {0}
    assert layout.features_of_rank == ((1, 0), (0,), (2,), (3,)) and layout.host_features(0) == [1, 0]
    assert [p.sharding for p in tower_plan(tables, layout).tables] == ["row_wise", "table_wise", "table_wise", "table_wise"]
    # a's half (8000) and b (160) are 8160 B on rank 0, so b is split too
    assert tower_layout(tables, t, [[0, 1], [2, 3]], "table_wise", memory_per_rank=8100).row_wise_features == {0, 1}
    assert tower_layout(tables, t, [[0, 1], [2, 3]], "table_wise").row_wise_features == frozenset()
    with pytest.raises(DistrecError, match="MiB limit"):  # half of a is 8000 B
        tower_layout(tables, t, [[0, 1], [2, 3]], "table_wise", memory_per_rank=5000)
    with pytest.raises(DistrecError, match="column-wise towers cannot also split tables by rows"):
        tower_layout(tables, t, [[0, 1], [2, 3]], "column_wise", memory_per_rank=5000)  # half the columns of a: 8000 B
