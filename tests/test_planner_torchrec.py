"""``--algorithm torchrec``: TorchRec's shards as distrec placements, and the errors without TorchRec."""

import sys
import types
from dataclasses import dataclass, field

import pytest
import torch
import yaml

from distrec.errors import DistrecError
from distrec.parallel.plan import Shard, ShardingPlan
from distrec.planner import ALGORITHMS, PlanConstraints, TableSpec, plan_tables, torchrec_planner
from distrec.planner.torchrec_planner import placement_from_shards, torchrec_plan
from test_cli_plan import TABLES, user_error

HISTOGRAM = (1.0,) + (0.0,) * 16


def table(name="t", rows=100, dim=16, pooling=2.0):
    return TableSpec(name, rows, dim, pooling, HISTOGRAM)


@pytest.fixture
def without_torchrec(monkeypatch):
    """TorchRec cannot be imported, whether or not it is installed."""
    monkeypatch.setitem(sys.modules, "torchrec", None)


def test_torchrec_is_an_algorithm_after_the_heuristics():
    assert ALGORITHMS[-1] == "torchrec"


def test_table_wise_shard_is_the_whole_table_on_its_rank():
    placement = placement_from_shards(table(), "table_wise", [(1, 0, 100, 0, 16)])
    assert placement.sharding == "table_wise" and placement.shards == [Shard(1, 0, 100, 0, 16)]


def test_column_shards_become_a_valid_column_wise_plan():
    t = table(dim=16)
    placement = placement_from_shards(t, "column_wise", [(0, 0, 100, 0, 8), (1, 0, 100, 8, 8)])
    assert placement.sharding == "column_wise"
    assert placement.shards == [Shard(0, 0, 100, 0, 8), Shard(1, 0, 100, 8, 16)]
    ShardingPlan(2, [placement]).validate([t.to_config()], memory_per_rank=100 * 8 * 4)


def test_table_column_wise_is_column_wise_and_one_full_shard_is_table_wise():
    t = table(dim=16)
    assert placement_from_shards(t, "table_column_wise", [(0, 0, 100, 0, 4), (0, 0, 100, 4, 12)]).sharding == "column_wise"
    assert placement_from_shards(t, "column_wise", [(1, 0, 100, 0, 16)]).sharding == "table_wise"


@pytest.mark.parametrize("sharding_type", ["row_wise", "table_row_wise"])
def test_row_shards_become_a_valid_row_wise_plan(sharding_type):
    t = table(rows=100, dim=16)
    placement = placement_from_shards(t, sharding_type, [(0, 0, 50, 0, 16), (1, 50, 50, 0, 16)])
    assert placement.sharding == "row_wise" and placement.shards[1] == Shard(1, 50, 100, 0, 16)
    ShardingPlan(2, [placement]).validate([t.to_config()])


def test_data_parallel_is_a_full_replica_per_rank():
    t = table()
    placement = placement_from_shards(t, "data_parallel", [(0, 0, 100, 0, 16), (1, 0, 100, 0, 16)])
    assert placement.sharding == "data_parallel"
    ShardingPlan(2, [placement]).validate([t.to_config()])


@pytest.mark.parametrize(
    "sharding_type, shards",
    [
        ("grid_shard", [(0, 0, 100, 0, 16)]),  # a TorchRec type distrec has no equivalent of
        ("table_row_wise", [(0, 0, 50, 0, 8), (1, 50, 50, 8, 8)]),  # row shards that split columns too
        ("column_wise", [(0, 0, 60, 0, 16), (1, 60, 40, 0, 16)]),  # "column" shards that split rows
        ("table_wise", []),
    ],
)
def test_layouts_distrec_cannot_run_are_one_line_errors(sharding_type, shards):
    with pytest.raises(DistrecError, match="choose another --algorithm") as raised:
        placement_from_shards(table(), sharding_type, shards)
    assert "\n" not in str(raised.value) and "'t'" in str(raised.value)


def test_without_torchrec_the_error_names_the_install_command(without_torchrec):
    with pytest.raises(DistrecError) as raised:
        torchrec_plan([table()], 2, 2**20, PlanConstraints())
    message = str(raised.value)
    assert "pip install torchrec fbgemm-gpu-cpu" in message and "import failed: ModuleNotFoundError" in message
    assert "\n" not in message
    assert not torchrec_planner.torchrec_available()  # the sharding benchmark then leaves it out


def test_a_broken_fbgemm_library_is_the_same_one_line_error(tmp_path, monkeypatch):
    package = tmp_path / "torchrec"
    package.mkdir()
    (package / "__init__.py").write_text("raise OSError('libfbgemm_gpu.so: undefined symbol: _ZN3c10\\nmore detail')\n")
    for name in [m for m in sys.modules if m == "torchrec" or m.startswith("torchrec.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DistrecError) as raised:
        torchrec_plan([table()], 2, 2**20, PlanConstraints())
    assert str(raised.value).endswith("(import failed: OSError: libfbgemm_gpu.so: undefined symbol: _ZN3c10)")


def test_pins_are_refused_before_torchrec_is_needed(without_torchrec):
    with pytest.raises(DistrecError, match="drop --pin or choose another --algorithm"):
        torchrec_plan([table("a"), table("b")], 2, 2**20, PlanConstraints({"a": 1}))


def test_cli_without_torchrec_is_a_one_line_error(without_torchrec, tmp_path, capsys):
    tables = tmp_path / "tables.yaml"
    tables.write_text(yaml.safe_dump(TABLES))
    out = tmp_path / "plan.json"
    err = user_error(capsys, "--tables", tables, "--devices", 2, "--memory-per-device", "4MB", "--algorithm", "torchrec", "-o", out)
    assert "pip install torchrec" in err and not out.exists()


@dataclass
class FakePlanner:
    """Stands in for TorchRec's EmbeddingShardingPlanner: splits splittable tables in two column halves."""

    topology: dict
    constraints: dict
    seen: list = field(default_factory=list)

    def plan(self, module, sharders):
        self.seen.append((self.topology, self.constraints, module, sharders))
        plan = {}
        for i, config in enumerate(module["tables"]):
            rows, dim = config["num_embeddings"], config["embedding_dim"]
            if "column_wise" in self.constraints[config["name"]].sharding_types:
                shards = [([0, 0], [rows, dim // 2]), ([0, dim // 2], [rows, dim - dim // 2])]
                ranks, kind = [0, 1], "column_wise"
            else:
                shards, ranks, kind = [([0, 0], [rows, dim])], [i % 2], "table_wise"
            spec = types.SimpleNamespace(shards=[types.SimpleNamespace(shard_offsets=o, shard_sizes=z) for o, z in shards])
            plan[config["name"]] = types.SimpleNamespace(sharding_type=kind, compute_kernel="fused", ranks=ranks, sharding_spec=spec)
        return types.SimpleNamespace(plan={"": plan})


@pytest.fixture
def fake_torchrec(monkeypatch):
    """A stand-in for the parts of TorchRec's API that torchrec_plan calls; returns the planners made."""
    planners = []

    def module(name, **attrs):
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))

    def make_planner(topology, constraints):
        planners.append(FakePlanner(topology, constraints))
        return planners[-1]

    module("torchrec", EmbeddingBagConfig=dict, EmbeddingBagCollection=lambda tables, device: {"tables": tables, "device": device})
    module("torchrec.distributed")
    module("torchrec.distributed.embeddingbag", EmbeddingBagCollectionSharder=lambda: "sharder")
    module("torchrec.distributed.embedding_types", EmbeddingComputeKernel=types.SimpleNamespace(FUSED=types.SimpleNamespace(value="fused")))
    module("torchrec.distributed.planner", EmbeddingShardingPlanner=make_planner, Topology=dict, ParameterConstraints=types.SimpleNamespace)
    module("torchrec.distributed.planner.types", PlannerError=RuntimeError)
    return planners


@pytest.mark.parametrize("device, memory_key", [("cpu", "ddr_cap"), ("cuda", "hbm_cap")])
def test_torchrec_plan_passes_tables_topology_and_constraints_and_converts_the_result(fake_torchrec, monkeypatch, device, memory_key):
    monkeypatch.setattr(torchrec_planner, "default_device", lambda: torch.device(device))
    tables = [table("a", dim=16, pooling=3.0), table("b", dim=8)]
    plan = torchrec_plan(tables, 2, 2**20, PlanConstraints(no_split=frozenset({"b"})))
    topology, constraints, module, sharders = fake_torchrec[0].seen[0]
    assert topology == {"world_size": 2, "compute_device": device, memory_key: 2**20}
    assert constraints["a"].sharding_types == ["table_wise", "column_wise"] and constraints["b"].sharding_types == ["table_wise"]
    assert constraints["a"].pooling_factors == [3.0] and constraints["a"].compute_kernels == ["fused"]
    assert str(module["device"]) == "meta" and module["tables"][0]["feature_names"] == ["a"] and sharders == ["sharder"]
    assert plan.placement("a").shards == [Shard(0, 0, 100, 0, 8), Shard(1, 0, 100, 8, 16)]
    assert plan.placement("b").sharding == "table_wise" and plan.placement("b").shards == [Shard(1, 0, 100, 0, 8)]
    plan.validate([t.to_config() for t in tables], 2**20)


def test_a_device_type_torchrec_does_not_model_is_a_one_line_error(fake_torchrec, monkeypatch):
    def topology(world_size, compute_device, **memory):
        assert compute_device in ("cpu", "cuda", "mtia"), f"unsupported compute device {compute_device}"

    monkeypatch.setattr(sys.modules["torchrec.distributed.planner"], "Topology", topology)
    monkeypatch.setattr(torchrec_planner, "default_device", lambda: torch.device("mps"))
    with pytest.raises(DistrecError, match="does not support mps devices; choose another --algorithm"):
        torchrec_plan([table()], 2, 2**20, PlanConstraints())


def test_torchrec_finding_no_plan_is_a_one_line_error(fake_torchrec, monkeypatch):
    def no_plan(self, module, sharders):
        raise RuntimeError("Unable to find a plan for this model because of insufficient storage.\nPossible solutions: ...")

    monkeypatch.setattr(FakePlanner, "plan", no_plan)
    with pytest.raises(DistrecError, match=r"no plan for 2 devices of 1.0 MiB \(RuntimeError: Unable to find a plan .*raise --memory-per-device") as raised:
        torchrec_plan([table()], 2, 2**20, PlanConstraints())
    assert "\n" not in str(raised.value)


def test_torchrec_plans_six_tables_on_two_devices():
    pytest.importorskip("torchrec")
    tables = [table(f"t{i}", rows=1000 * (i + 1), dim=8 * (i % 3 + 1), pooling=1.0 + i) for i in range(6)]
    memory = 64 * 2**20
    plan, report = plan_tables(tables, 2, memory, algorithm="torchrec", constraints=PlanConstraints(no_split=frozenset({"t0"})))
    plan.validate([t.to_config() for t in tables], memory)
    assert sorted(p.table for p in plan.tables) == sorted(t.name for t in tables)
    assert plan.placement("t0").sharding == "table_wise"
    assert all(p.sharding in ("table_wise", "column_wise") for p in plan.tables)
    assert report["algorithm"] == "torchrec" and len(report["bytes_per_device"]) == 2
