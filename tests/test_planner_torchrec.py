"""``--algorithm torchrec``: TorchRec's shards as distrec placements, and the errors without TorchRec."""

import sys
import types
from dataclasses import dataclass, field

import pytest
import torch
import yaml

from distrec.errors import DistrecError
from distrec.parallel.plan import Shard
from distrec.planner import ALGORITHMS, PlanConstraints, TableSpec, plan_tables, torchrec_planner
from distrec.planner.torchrec_planner import torchrec_plan
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


def test_without_torchrec_the_error_names_the_install_command(without_torchrec):
    with pytest.raises(DistrecError) as raised:
        torchrec_plan([table()], 2, 2**20, PlanConstraints())
    message = str(raised.value)
    assert "pip install --no-deps torchrec==1.8.0" in message and "import failed: ModuleNotFoundError" in message
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
    assert str(raised.value).endswith("import failed: OSError: libfbgemm_gpu.so: undefined symbol: _ZN3c10)")


def test_pins_are_refused_before_torchrec_is_needed(without_torchrec):
    with pytest.raises(DistrecError, match="drop --pin or choose another --algorithm"):
        torchrec_plan([table("a"), table("b")], 2, 2**20, PlanConstraints({"a": 1}))


def test_cli_without_torchrec_is_a_one_line_error(without_torchrec, tmp_path, capsys):
    tables = tmp_path / "tables.yaml"
    tables.write_text(yaml.safe_dump(TABLES))
    out = tmp_path / "plan.json"
    err = user_error(capsys, "--tables", tables, "--devices", 2, "--memory-per-device", "4MB", "--algorithm", "torchrec", "-o", out)
    assert "pip install --no-deps torchrec" in err and not out.exists()


@dataclass
class FakePlanner:
    """Stands in for TorchRec's EmbeddingShardingPlanner: splits splittable tables in two column halves."""

    kwargs: dict
    seen: list = field(default_factory=list)

    def plan(self, module, sharders):
        self.seen.append((module, sharders))
        plan = {}
        for i, config in enumerate(module["tables"]):
            rows, dim = config["num_embeddings"], config["embedding_dim"]
            if "column_wise" in self.kwargs["constraints"][config["name"]].sharding_types:
                shards = [([0, 0], [rows, dim // 2], 0), ([0, dim // 2], [rows, dim - dim // 2], 1)]
                kind = "column_wise"
            else:
                shards, kind = [([0, 0], [rows, dim], i % 2)], "table_wise"
            spec = types.SimpleNamespace(shards=[types.SimpleNamespace(shard_offsets=o, shard_sizes=z, placement=f"rank:{r}/cpu") for o, z, r in shards])
            ranks = [r for _, _, r in shards]
            plan[config["name"]] = types.SimpleNamespace(sharding_type=kind, compute_kernel="fused", ranks=ranks, sharding_spec=spec)
        return types.SimpleNamespace(plan={"": plan})


@pytest.fixture
def fake_torchrec(monkeypatch):
    """A stand-in for the parts of TorchRec 1.8's API that torchrec_plan calls; returns the planners made."""
    planners = []

    def module(name, **attrs):
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))

    def make_planner(**kwargs):
        planners.append(FakePlanner(kwargs))
        return planners[-1]

    def create_topology(trainer_config, kernel_config):
        return {**trainer_config, **kernel_config}

    module("torchrec", EmbeddingBagConfig=dict, EmbeddingBagCollection=lambda tables, device: {"tables": tables, "device": device})
    module("torchrec.distributed")
    module("torchrec.distributed.embeddingbag", EmbeddingBagCollectionSharder=lambda: "sharder")
    module("torchrec.distributed.embedding_types", EmbeddingComputeKernel=types.SimpleNamespace(FUSED=types.SimpleNamespace(value="fused")))
    module("torchrec.distributed.planner", EmbeddingShardingPlanner=make_planner, ParameterConstraints=types.SimpleNamespace)
    module("torchrec.distributed.planner.storage_reservations", FixedPercentageStorageReservation=lambda percentage: ("reserve", percentage))
    module(
        "torchrec.distributed.planner.types",
        PlannerError=RuntimeError,
        TrainerConfig=dict,
        KernelConfig=dict,
        TopologyFactory=types.SimpleNamespace(create_topology=create_topology),
    )
    return planners


@pytest.mark.parametrize("device, memory_key", [("cpu", "ddr_cap_bytes"), ("cuda", "hbm_cap_bytes")])
def test_torchrec_plan_passes_tables_topology_and_constraints_and_converts_the_result(fake_torchrec, monkeypatch, device, memory_key):
    monkeypatch.setattr(torchrec_planner, "default_device", lambda: torch.device(device))
    tables = [table("a", dim=16, pooling=3.0), table("b", dim=8)]
    plan = torchrec_plan(tables, 2, 2**20, PlanConstraints(no_split=frozenset({"b"})), batch_size=4096)
    kwargs = fake_torchrec[0].kwargs
    module, sharders = fake_torchrec[0].seen[0]
    assert kwargs["topology"] == {"world_size": 2, "compute_device": device, memory_key: 2**20}
    assert kwargs["batch_size"] == 2048 and kwargs["storage_reservation"] == ("reserve", 0.0)  # per rank; the whole memory is for tables
    constraints = kwargs["constraints"]
    assert constraints["a"].sharding_types == ["table_wise", "column_wise"] and constraints["b"].sharding_types == ["table_wise"]
    assert constraints["a"].min_partition == 8 and constraints["b"].min_partition == 4  # at most `devices` column blocks, >= 4 wide
    assert constraints["a"].pooling_factors == [3.0] and constraints["a"].compute_kernels == ["fused"]
    assert str(module["device"]) == "meta" and module["tables"][0]["feature_names"] == ["a"] and sharders == ["sharder"]
    assert plan.placement("a").shards == [Shard(0, 0, 100, 0, 8), Shard(1, 0, 100, 8, 16)]
    assert plan.placement("b").sharding == "table_wise" and plan.placement("b").shards == [Shard(1, 0, 100, 0, 8)]
    plan.validate([t.to_config() for t in tables], 2**20)


def test_without_a_batch_size_torchrec_uses_its_default(fake_torchrec):
    torchrec_plan([table()], 2, 2**20, PlanConstraints())
    assert fake_torchrec[0].kwargs["batch_size"] is None


def test_a_device_type_torchrec_does_not_model_is_a_one_line_error(fake_torchrec, monkeypatch):
    def kernel_config(compute_device):
        if compute_device not in ("cpu", "cuda", "mtia"):
            raise ValueError(f"compute_device must be one of ['cpu', 'cuda', 'mtia'], got '{compute_device}'")

    monkeypatch.setattr(sys.modules["torchrec.distributed.planner.types"], "KernelConfig", kernel_config)
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


needs_torchrec = pytest.mark.skipif(not torchrec_planner.torchrec_available(), reason="TorchRec is not installed (benchmarks/setup_torchrec.sh)")


@needs_torchrec
def test_torchrec_plans_six_tables_on_two_devices():
    tables = [table(f"t{i}", rows=1000 * (i + 1), dim=8 * (i % 3 + 1), pooling=1.0 + i) for i in range(6)]
    memory = 64 * 2**20
    plan, report = plan_tables(tables, 2, memory, algorithm="torchrec", constraints=PlanConstraints(no_split=frozenset({"t0"})))
    plan.validate([t.to_config() for t in tables], memory)
    assert sorted(p.table for p in plan.tables) == sorted(t.name for t in tables)
    assert plan.placement("t0").sharding == "table_wise"
    assert all(p.sharding in ("table_wise", "column_wise") for p in plan.tables)
    assert report["algorithm"] == "torchrec" and len(report["bytes_per_device"]) == 2


@needs_torchrec
def test_torchrec_splits_a_table_larger_than_a_device_into_column_blocks():
    big = table("big", rows=40_000, dim=16, pooling=4.0)  # 2.4 MiB of weights, over one device's 2 MiB
    plan, _ = plan_tables([big, table("small", rows=1000, dim=8)], 2, 2 * 2**20, algorithm="torchrec", batch_size=256)
    placement = plan.placement("big")
    assert placement.sharding == "column_wise" and sorted(s.col_end - s.col_start for s in placement.shards) == [8, 8]
    assert sorted(s.rank for s in placement.shards) == [0, 1]


@needs_torchrec
def test_torchrec_refuses_a_plan_whose_buffers_do_not_fit_where_the_weights_do():
    tables = [table("a", rows=1000, dim=16, pooling=50.0)]  # 62.5 KiB of weights
    memory = 128 * 2**10
    plan_tables(tables, 2, memory, algorithm="size-greedy", batch_size=4096)  # fits by weight bytes
    with pytest.raises(DistrecError, match="TorchRec's planner found no plan .* input and output buffers"):
        plan_tables(tables, 2, memory, algorithm="torchrec", batch_size=4096)  # 2048 samples x 50 ids x 8 bytes of input alone
