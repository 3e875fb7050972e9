import dataclasses
import json

import numpy as np
import pytest

from distrec.errors import DistrecError
from distrec.sim.cluster import Cluster, LinkParams
from distrec.sim.components import Groups, compute_ms, distinct_rows, embedding_exchange, replica_sync, touched_rows
from distrec.sim.iteration import SCHEMES, predict, predict_dmt, predict_flat, predict_two_d
from distrec.sim.scaling import best_prediction, group_choices, scaling_table, weak_scaling_efficiency
from distrec.sim.workload import Workload

UP, OUT = LinkParams(1e-4, 1e9), LinkParams(1e-3, 1.25e8)
# the emulated cluster's shape: 2 hosts x 2 ranks, small tables
SMALL = Workload(local_batch=64, num_features=4, embedding_dim=8, pooling=2, dense_mflops=0.0, dense_params=1000, table_rows=100)


def two_by_two(algorithm="ring"):
    return Cluster(2, 2, peak_flops=1e12, compute_efficiency=1.0, scale_up=UP, scale_out=OUT, all_reduce_algorithm=algorithm)


def test_small_cluster_traffic_matches_the_hand_count():
    c = two_by_two()
    flat = predict_flat(SMALL, c)
    # 4 ranks: 1 peer inside the host, 2 across; 64 samples x 1 feature per peer: the counts,
    # then 64 lengths and 128 indices in int32 (100 rows fit)
    assert flat.index_exchange.bytes == 3 * (16 + (64 + 64 * 2) * 4)
    assert flat.index_exchange.cross_host_bytes == 2 * (16 + (64 + 64 * 2) * 4)
    assert flat.index_exchange.messages == 3 * 2
    assert (flat.embedding_exchange.bytes, flat.embedding_exchange.cross_host_bytes) == (2 * 3 * 64 * 8 * 4, 2 * 2 * 64 * 8 * 4)
    assert flat.replica_sync.bytes == 0
    # ring of 4 over 2 hosts: 6 steps of 1000 bytes, 2 of the 4 edges cross hosts
    assert (flat.all_reduce.bytes, flat.all_reduce.cross_host_bytes, flat.all_reduce.messages) == (6000, 3000, 6)

    exact = predict_two_d(SMALL, c, groups=2, sync="exact")
    # groups = hosts: the all-to-all stays inside the host, 64 samples x 2 features per peer
    assert exact.all_to_all.cross_host_bytes == 0
    assert exact.index_exchange.bytes == 16 + (128 + 128 * 2) * 4
    assert exact.embedding_exchange.bytes == 2 * 128 * 8 * 4 and exact.embedding_exchange.messages == 2
    # the replica set (rank s of each host) all-gathers counts, row ids and rows of the touched rows
    rows = 2 * 100 * (1 - 0.99**256)  # 2 tables, 2 x 64 x 2 = 256 lookups each into 100 rows
    assert touched_rows(SMALL, 2) == pytest.approx(rows)
    assert exact.replica_sync.bytes == pytest.approx(2 * 8 + rows * (8 + 8 * 4))
    assert exact.replica_sync.cross_host_bytes == exact.replica_sync.bytes and exact.replica_sync.messages == 3
    assert exact.replica_sync.ms == pytest.approx(1e3 * (OUT.time_s(16) + OUT.time_s(rows * 8) + OUT.time_s(rows * 32)))

    periodic = predict_two_d(SMALL, c, groups=2, sync="periodic", sync_every=5)
    # per table shard: an all-reduce of weights (100 x 8 floats) and one of row state (100 floats), every 5 steps
    assert periodic.replica_sync.bytes == pytest.approx(2 * (3200 + 400) / 5)
    assert periodic.replica_sync.messages == pytest.approx(2 * 2 * 2 / 5)
    assert periodic.total_ms == pytest.approx(periodic.compute_ms + periodic.all_to_all.ms + periodic.replica_sync.ms + periodic.all_reduce.ms)
    # merging touched rows: all-gathers of the rows the group touched in the 5 steps (count, ids, change + count + state)
    touched = predict_two_d(SMALL, c, groups=2, sync="periodic", sync_every=5, average="touched")
    rows5 = 2 * 100 * (1 - 0.99 ** (5 * 256))
    assert touched_rows(SMALL, 2, 5) == pytest.approx(rows5)
    assert touched.replica_sync.bytes == pytest.approx((8 + rows5 * (8 + (8 + 1 + 1) * 4)) / 5)
    assert touched.replica_sync.messages == pytest.approx(3 / 5)
    merging = predict_two_d(SMALL, c.replace(row_merge_s=1e-6), groups=2, sync="periodic", sync_every=5, average="touched")
    assert merging.replica_sync.ms == pytest.approx(touched.replica_sync.ms + 1e3 * rows5 * 1e-6 / 5)
    assert merging.replica_sync.bytes == touched.replica_sync.bytes


@pytest.mark.parametrize("gpus", [16, 64, 512])
def test_one_group_is_full_sharding(gpus):
    c = Cluster.from_hardware("A100", gpus)
    w = dataclasses.replace(Workload(), tower_mflops=50.0, tower_params=10_000)
    assert predict(w, c, "2d", groups=1, sync="exact") == predict_flat(w, c)
    assert predict(w, c, "dmt-2d", groups=1, compression=4.0) == predict_dmt(w, c, 4.0)


def test_all_to_all_bytes_per_rank_follow_the_group_size():
    c = Cluster.from_hardware("H100", 4096)
    w = Workload()
    per_direction = w.local_batch * w.num_features * w.embedding_dim * w.bytes_per_float
    sent = []
    for groups in group_choices(c, "2d"):
        size = c.num_gpus // groups
        t = embedding_exchange(w, c, Groups.on(c, groups))
        assert t.bytes == pytest.approx(2 * per_direction * (size - 1) / size)
        assert t.cross_host_bytes == pytest.approx(2 * per_direction * (size - min(size, 8)) / size)
        assert t.messages == 2 * (size - 1)
        sent.append((t.bytes, t.cross_host_bytes, t.messages))
    assert sent == sorted(sent, reverse=True) and sent[-1] == (0, 0, 0)  # G = N: pure data parallel tables


def test_exact_sync_moves_the_touched_rows():
    c = Cluster.from_hardware("H100", 64)
    assert distinct_rows(10, 10**12) == pytest.approx(10) and distinct_rows(10**6, 100) == pytest.approx(100)
    big = dataclasses.replace(Workload(), table_rows=10**12)  # no collisions: every lookup a new row
    for groups in (2, 4, 8):
        size = 64 // groups
        rows = big.num_features * big.local_batch * big.pooling  # F/S tables x S b p lookups
        t = replica_sync(big, c, Groups.on(c, groups), "exact")
        tables = -(-big.num_features // size)
        assert t.bytes == pytest.approx((groups - 1) * (8 * tables + rows * (8 + 4 * big.embedding_dim)), rel=1e-6)
        doubled = replica_sync(dataclasses.replace(big, pooling=2 * big.pooling), c, Groups.on(c, groups), "exact")
        assert doubled.bytes - 8 * tables * (groups - 1) == pytest.approx(2 * (t.bytes - 8 * tables * (groups - 1)), rel=1e-6)
    tiny = dataclasses.replace(Workload(), table_rows=10)  # every row touched: the shard's F/S x 10 rows
    assert touched_rows(tiny, 16) == pytest.approx(256 / 16 * 10)
    # tables of given sizes: a small one wholly touched, a huge one once per lookup
    two = Workload(local_batch=32, num_features=2, pooling=1, table_rows=(10, 10**12))
    assert touched_rows(two, 16) == pytest.approx((10 + 16 * 32) / 16)


def test_skewed_access_touches_fewer_rows_as_sampled():
    """Zipf access (as distrec's synthetic data draws it): the expected distinct rows match a
    sampled count, and are fewer than uniform access touches."""
    rng = np.random.default_rng(0)
    rows, lookups, exponent = 5000, 2048, 1.05
    p = np.arange(1, rows + 1, dtype=np.float64) ** -exponent
    sampled = np.mean([np.unique(rng.choice(rows, lookups, p=p / p.sum())).size for _ in range(20)])
    assert distinct_rows(lookups, rows, exponent) == pytest.approx(sampled, rel=0.02)
    assert distinct_rows(lookups, rows, exponent) < 0.6 * distinct_rows(lookups, rows)
    skewed = Workload(local_batch=256, num_features=4, pooling=2, table_rows=rows, zipf_exponent=exponent)
    assert touched_rows(skewed, 4) == pytest.approx(distinct_rows(4 * 256 * 2, rows, exponent))  # 4 tables over 4 ranks


def test_periodic_sync_moves_each_tables_rows():
    c = two_by_two()
    sizes = dataclasses.replace(SMALL, table_rows=(100, 300, 50, 50))  # 500 rows, 250 per rank, 2 table shards
    t = replica_sync(sizes, c, Groups.on(c, 2), "periodic", 1)
    assert t.bytes == pytest.approx(250 * (8 + 1) * 4) and t.messages == 2 * 2 * 2
    assert replica_sync(dataclasses.replace(SMALL, table_rows=125), c, Groups.on(c, 2), "periodic", 1) == t
    with pytest.raises(DistrecError, match="one for each of the 4 tables"):
        dataclasses.replace(SMALL, table_rows=(100, 300))


def test_periodic_sync_costs_one_k_th_per_step():
    c = Cluster.from_hardware("A100", 256)
    w = Workload()
    once = replica_sync(w, c, Groups.on(c, 8), "periodic", 1)
    assert once.bytes > 0 and once.cross_host_bytes == once.bytes  # replicas of a shard sit on different hosts
    for k in (2, 10, 50):
        every = replica_sync(w, c, Groups.on(c, 8), "periodic", k)
        assert every.as_dict() == pytest.approx((once * (1 / k)).as_dict())
    assert replica_sync(w, c, Groups.on(c, 1), "periodic", 1).bytes == 0


def test_group_layouts():
    c = Cluster.from_hardware("H100", 64)  # 8 hosts of 8
    assert Groups.on(c, 2) == Groups(2, 32, group_per_host=8, replicas_per_host=1)
    assert Groups.on(c, 16) == Groups(16, 4, group_per_host=4, replicas_per_host=2)
    assert Groups.on(c, 2, "strided") == Groups(2, 32, group_per_host=4, replicas_per_host=2)
    assert Groups.on(c, 16, "strided") == Groups(16, 4, group_per_host=1, replicas_per_host=8)
    assert (Groups.on(c, 16, "strided").group_hosts, Groups.on(c, 16, "strided").replica_hosts) == (4, 2)
    w = Workload()
    # TorchRec's layout: the replicas of a shard share a host, the group spreads over all hosts
    contiguous, strided = (predict_two_d(w, c, groups=4, layout=layout) for layout in ("contiguous", "strided"))
    assert strided.replica_sync.cross_host_bytes == 0 < contiguous.replica_sync.cross_host_bytes
    assert strided.replica_sync.bytes == contiguous.replica_sync.bytes
    assert strided.embedding_exchange.cross_host_bytes > contiguous.embedding_exchange.cross_host_bytes
    assert predict_two_d(w, c, groups=1, layout="strided").total_ms == predict_flat(w, c).total_ms
    assert group_choices(c, "2d", "strided") == [1, 2, 4, 8, 16, 32, 64]
    with pytest.raises(DistrecError, match="3 replica groups do not divide"):
        Groups.on(c, 3, "strided")
    with pytest.raises(DistrecError, match="strided replica groups do not tile hosts of 8"):
        Groups.on(Cluster.from_hardware("H100", 96), 12, "strided")
    with pytest.raises(DistrecError, match="use the contiguous layout"):
        predict_two_d(w, c, groups=2, compression=4.0, layout="strided")
    with pytest.raises(DistrecError, match="unknown replica layout"):
        Groups.on(c, 2, "diagonal")  # type: ignore[arg-type]


def test_dmt_two_d_with_one_host_per_group_is_two_d():
    c = Cluster.from_hardware("H100", 64)
    two_d = predict_two_d(Workload(), c, groups=8)
    assert predict_two_d(Workload(), c, groups=8, compression=4.0) == two_d
    assert (
        predict_two_d(Workload(), c, groups=2, compression=4.0).embedding_exchange.cross_host_bytes
        < predict_two_d(Workload(), c, groups=2).embedding_exchange.cross_host_bytes
    )


def test_best_groups_is_the_fastest_choice():
    c = Cluster.from_hardware("H100", 1024)
    w = Workload()
    assert group_choices(c, "dmt-2d") == [1, 2, 4, 8, 16, 32, 64, 128]
    assert group_choices(c, "2d")[-1] == 1024 and group_choices(c, "flat") == [1]
    best = best_prediction(w, c, "2d", sync="periodic", sync_every=10)
    assert best.total_ms == min(predict(w, c, "2d", groups=g, sync="periodic", sync_every=10).total_ms for g in group_choices(c, "2d"))
    assert best_prediction(w, c, "2d", groups=4).groups == 4
    assert best_prediction(w, c, "flat", groups=4).groups == 1


def test_group_errors():
    c = Cluster.from_hardware("H100", 16)
    with pytest.raises(DistrecError, match="3 replica groups do not divide 16"):
        predict_two_d(Workload(), c, groups=3)
    with pytest.raises(DistrecError, match="SPTT needs whole hosts"):
        predict_two_d(Workload(), c, groups=4, compression=4.0)
    with pytest.raises(DistrecError, match="use 2d or dmt-2d"):
        predict(Workload(), c, "flat", groups=2)
    with pytest.raises(DistrecError, match="unknown replica sync"):
        predict_two_d(Workload(), c, groups=2, sync="lazy")  # type: ignore[arg-type]
    with pytest.raises(DistrecError, match="K >= 1"):
        predict_two_d(Workload(), c, groups=2, sync_every=0)
    with pytest.raises(DistrecError, match="does not tile"):
        predict_two_d(Workload(), Cluster.from_hardware("H100", 24), groups=2)  # groups of 12 on hosts of 8
    with pytest.raises(DistrecError, match="table_rows = 0"):
        Workload(table_rows=0)


def test_weak_scaling_efficiency_is_relative_to_the_smallest_size():
    rows = scaling_table(Workload(), hardware=("V100", "H100"), gpu_counts=(64, 16, 4096), schemes=SCHEMES)
    eff = weak_scaling_efficiency(rows, SCHEMES)
    for name in ("V100", "H100"):
        mine = [r for r in rows if r["hardware"] == name]
        assert [r["gpus"] for r in mine] == [16, 64, 4096]
        for scheme in SCHEMES:
            assert eff[name][scheme]["16"] == 1.0
            assert eff[name][scheme]["4096"] == pytest.approx(mine[0][f"{scheme}_ms"] / mine[-1][f"{scheme}_ms"])
        # full sharding's all-to-all grows with N; 2D keeps it inside a group, so at 4,096 GPUs its
        # communication (the step minus the compute both schemes share) is under a quarter of flat's
        compute = compute_ms(Workload(), Cluster.from_hardware(name, 4096), towers=False)
        assert mine[-1]["2d_ms"] - compute < (mine[-1]["flat_ms"] - compute) / 4
        assert eff[name]["2d"]["4096"] > eff[name]["flat"]["4096"]
        assert mine[-1]["dmt-2d_ms"] < mine[-1]["2d_ms"] < mine[-1]["flat_ms"]


def test_simulate_two_d_command(capsys, tmp_path):
    from distrec.cli import main

    plot = tmp_path / "eff.png"
    argv = ["simulate", "--schemes", "flat", "dmt", "2d", "dmt-2d", "--hardware", "H100", "--gpus", "16", "64", "4096", "--plot", str(plot)]
    assert main([*argv, "--replica-groups", "2", "--replica-sync", "exact"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert lines[0].split() == [
        "hardware", "gpus", "hosts", "flat_ms", "dmt_ms", "2d_ms", "dmt-2d_ms", "2d_groups", "dmt-2d_groups",
        "efficiency_flat", "efficiency_dmt", "efficiency_2d", "efficiency_dmt-2d",
    ]  # fmt: skip
    eff = result["weak_scaling_efficiency"]["H100"]
    assert set(eff) == {"flat", "dmt", "2d", "dmt-2d"} and all(set(e) == {"16", "64", "4096"} and e["16"] == 1.0 for e in eff.values())
    assert [r["2d_groups"] for r in result["rows"]] == [2, 2, 2] and result["replica_sync"] == "exact"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and result["plot"] == str(plot)
    assert main(argv[:-2]) == 0  # the fastest G at each size, no plot
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["replica_groups"] == "fastest" and result["replica_layout"] == "contiguous" and "plot" not in result
    assert [r["dmt-2d_groups"] for r in result["rows"]][0] <= 2


def test_simulate_two_d_command_errors(capsys):
    from distrec.cli import main

    assert main(["simulate", "--schemes", "2d", "--gpus", "16", "--replica-groups", "3"]) == 2
    assert "distrec: error: 3 replica groups do not divide 16 GPUs" in capsys.readouterr().err
    assert main(["simulate", "--schemes", "dmt-2d", "--gpus", "16", "--replica-groups", "4"]) == 2
    assert "distrec: error: SPTT needs whole hosts in each group" in capsys.readouterr().err
    # the strided layout is 2D's; DMT x 2D keeps contiguous groups of hosts
    assert main(["simulate", "--hardware", "H100", "--gpus", "64", "--replica-layout", "strided", "--replica-groups", "16"]) == 2
    assert "distrec: error: SPTT needs whole hosts in each group" in capsys.readouterr().err
    assert main(["simulate", "--hardware", "H100", "--gpus", "64", "--schemes", "2d", "dmt-2d", "--replica-layout", "strided"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"][0]["dmt-2d_groups"] <= 8
