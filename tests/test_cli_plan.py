"""``distrec plan``, ``plan collect`` and ``plan train-cost-models`` from the command line."""

import json
import re

import pytest
import yaml

from distrec.cli import main
from distrec.cli.plan import warn_worse_than_the_mean
from distrec.parallel.plan import Shard, ShardingPlan, TablePlacement
from distrec.planner.api import tables_per_rank
from distrec.planner.cost_models import DEFAULT_COMPUTE_HEAD, CostModels
from distrec.planner.store import COST_DATA_FILE, COST_MODELS_FILE
from distrec.planner.table_file import load_table_specs
from test_planner_cost_models import write_synthetic_costs

TABLES = [
    {"name": "user", "rows": 20_000, "dim": 32, "pooling_factor": 1},
    {"name": "item", "rows": 5_000, "dim": 16, "pooling_factor": 12.5},
    {"name": "history", "rows": 8_000, "dim": 64, "pooling_factor": 30},
    {"name": "country", "rows": 200, "dim": 8, "pooling_factor": 1},
]  # 4.9 MB in all; "history" is 2 MB, "user" 2.56 MB


@pytest.fixture
def tables_file(tmp_path):
    path = tmp_path / "tables.yaml"
    path.write_text(yaml.safe_dump(TABLES))
    return path


@pytest.fixture(scope="module")
def cost_models_dir(tmp_path_factory):
    """Cost models for 2 devices trained by the CLI on a small synthetic cost file."""
    folder = tmp_path_factory.mktemp("planner")
    write_synthetic_costs(folder / COST_DATA_FILE, compute_samples=60, comm_samples=60)
    assert main(["plan", "train-cost-models", "--out", str(folder), "--epochs", "5"]) == 0
    return folder


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    """The default planner folder (under $DISTREC_CACHE) starts empty in every test."""
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))


def plan_cli(*args) -> int:
    return main(["plan", *map(str, args)])


def test_train_cost_models_prints_test_mse_and_saves_with_hardware(cost_models_dir, capsys):
    capsys.readouterr()
    assert main(["plan", "train-cost-models", "--out", str(cost_models_dir), "--epochs", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("compute: test MSE") for line in out)
    summary = json.loads(out[-1])
    assert summary["hardware"]["cpu"] == "test cpu" and set(summary["test_mse"]) == {"compute", "fw_comm_2", "bw_comm_2"}
    assert (cost_models_dir / COST_MODELS_FILE).is_file()
    assert {m.head_kind for m in CostModels.load(cost_models_dir / COST_MODELS_FILE).compute.members} == {DEFAULT_COMPUTE_HEAD}  # the command's default head


def test_neuroshard_plan_is_written_valid_and_reported(tables_file, cost_models_dir, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert plan_cli("--tables", tables_file, "--devices", 2, "--memory-per-device", "3MB", "--cost-models", cost_models_dir, "-o", out) == 0
    printed = capsys.readouterr().out
    plan = ShardingPlan.load(out)
    specs = load_table_specs(tables_file)
    plan.validate([t.to_config() for t in specs], 3 * 10**6)
    assert all((s.col_end - s.col_start) % 4 == 0 for p in plan.tables for s in p.shards)
    summary = json.loads(printed.splitlines()[-1])
    assert summary["algorithm"] == "neuroshard" and summary["devices"] == 2 and 0 <= summary["cache_hit_rate"] <= 1
    assert (
        "predicted cost (max over devices)" in printed and "cache hit rate" in printed and "measured on cpu test cpu" in printed and printed.count("rank ") == 2
    )


def test_constraints_are_honoured(tables_file, cost_models_dir, tmp_path):
    out = tmp_path / "plan.json"
    args = ["--tables", tables_file, "--devices", 2, "--memory-per-device", "3MB", "--cost-models", cost_models_dir, "-o", out]
    assert plan_cli(*args, "--pin", "country=1", "--no-split", "history", "--no-split", "user") == 0
    plan = ShardingPlan.load(out)
    assert [s.rank for s in plan.placement("country").shards] == [1]
    assert plan.placement("history").sharding == plan.placement("user").sharding == "table_wise"


@pytest.mark.parametrize("algorithm", ["random", "size-greedy", "dim-greedy", "lookup-greedy", "size-lookup-greedy"])
def test_heuristics_need_no_cost_models(tables_file, tmp_path, algorithm):
    out = tmp_path / "plan.json"
    assert plan_cli("--tables", tables_file, "--devices", 2, "--memory-per-device", "4MB", "--algorithm", algorithm, "-o", out) == 0
    ShardingPlan.load(out).validate([t.to_config() for t in load_table_specs(tables_file)], 4 * 10**6)


def test_tables_measured_from_a_prepared_data_set(tmp_path, capsys):
    out = tmp_path / "plan.json"
    status = plan_cli(
        "--data-format",
        "synthetic",
        "--set",
        "data.synthetic.rows=3000",
        "--set",
        "data.synthetic.num_sparse=4",
        "--set",
        "data.synthetic.pooling_factor=3",
        "--set",
        "data.max_ind_range=500",
        "--cache-dir",
        tmp_path / "data",
        "--dim",
        8,
        "--batch-size",
        512,
        "--no-progress",
        "--devices",
        2,
        "--memory-per-device",
        "1MB",
        "--algorithm",
        "lookup-greedy",
        "-o",
        out,
    )
    assert status == 0
    plan = ShardingPlan.load(out)
    assert len(plan.tables) == 4 and all(s.col_end == 8 for p in plan.tables for s in p.shards)
    assert all(s.row_end <= 500 for p in plan.tables for s in p.shards)


def test_collect_then_train_from_the_default_folder(tmp_path, capsys):
    status = main(
        [
            "plan",
            "collect",
            "--devices",
            "2",
            "--compute-samples",
            "12",
            "--comm-samples",
            "12",
            "--batch-size",
            "32",
            "--max-dim",
            "8",
            "--device",
            "cpu",
            "--no-progress",
        ]
    )
    assert status == 0
    data = tmp_path / "cache" / "planner" / COST_DATA_FILE
    printed = capsys.readouterr()
    assert json.loads(printed.out.splitlines()[-1])["cost_data"] == str(data)
    kinds = [json.loads(line)["kind"] for line in data.read_text().splitlines()]
    assert kinds.count("compute") == 12 and kinds.count("comm") == 12
    stages = printed.err.splitlines()  # one line as each kind of sample starts and one as it ends, even off a terminal
    assert stages[0] == "distrec: compute samples (lookups on one device): measuring 12 of 12"
    assert re.fullmatch(r"distrec: compute samples \(lookups on one device\): 12 measured in [0-9.]+ s", stages[1])
    assert stages[2] == "distrec: all-to-all samples on 2 processes: measuring 12 of 12"
    assert re.fullmatch(r"distrec: all-to-all samples on 2 processes: 12 measured in [0-9.]+ s", stages[3]) and len(stages) == 4
    assert main(["plan", "collect", "--devices", "2", "--compute-samples", "12", "--comm-samples", "14", "--batch-size", "32", "--max-dim", "8"]) == 0
    assert capsys.readouterr().err.splitlines()[:2] == [
        f"distrec: compute samples (lookups on one device): all 12 already in {data}",
        f"distrec: all-to-all samples on 2 processes: measuring 2 of 14 (12 already in {data})",
    ]
    assert main(["plan", "train-cost-models", "--epochs", "2"]) == 0
    assert (tmp_path / "cache" / "planner" / COST_MODELS_FILE).is_file()
    printed = capsys.readouterr()
    r2 = {m[1]: float(m[2]) for m in re.finditer(r"^(\w+): test MSE .*\(R\^2 (-?[0-9.]+)", printed.out, re.M)}
    assert set(r2) == {"compute", "fw_comm_2", "bw_comm_2"}
    warned = set(re.findall(r"^distrec: warning: the (\w+) cost model has held-out R\^2", printed.err, re.M))
    assert warned == {name for name, value in r2.items() if value < 0}  # two epochs: whichever models are worse than the mean


def test_models_worse_than_the_mean_get_one_warning_line_each(capsys):
    metrics = {"compute": {"test_r2": 0.93}, "fw_comm_4": {"test_r2": -0.52}, "bw_comm_4": {"test_r2": -0.004}}
    warn_worse_than_the_mean(metrics, calibrated=False)
    assert capsys.readouterr().err.splitlines() == [
        f"distrec: warning: the {name} cost model has held-out R^2 {r2}, worse than predicting the mean; "
        "collect more samples ('distrec plan collect' with a larger --comm-samples, or 'distrec plan calibrate') and train again"
        for name, r2 in (("fw_comm_4", "-0.52"), ("bw_comm_4", "-0.00"))
    ]
    warn_worse_than_the_mean({"compute": {"test_r2": -1.5}}, calibrated=True)
    assert capsys.readouterr().err == (
        "distrec: warning: the compute cost model has held-out R^2 -1.50, worse than predicting the mean; calibrate again with a larger --budget-minutes\n"
    )


def test_the_plan_summary_lists_what_each_rank_holds(tables_file, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert plan_cli("--tables", tables_file, "--devices", 2, "--memory-per-device", "4MB", "--algorithm", "size-greedy", "-o", out) == 0
    held = re.findall(r"^    holds (.*)$", capsys.readouterr().out, re.M)
    plan = ShardingPlan.load(out)
    assert [sorted(line.split(", ")) for line in held] == [sorted(p.table for p in plan.tables if p.shards[0].rank == r) for r in range(2)]


def test_split_tables_are_listed_with_their_ranges():
    plan = ShardingPlan(
        3,
        [
            TablePlacement("user", "table_wise", [Shard(1, 0, 100, 0, 16)]),
            TablePlacement("item", "column_wise", [Shard(0, 0, 50, 0, 8), Shard(2, 0, 50, 8, 16)]),
            TablePlacement("history", "row_wise", [Shard(r, 40 * r, 40 * r + 40, 0, 4) for r in range(3)]),
            TablePlacement("country", "data_parallel", [Shard(r, 0, 9, 0, 4) for r in range(3)]),
        ],
    )
    assert tables_per_rank(plan) == [
        ["item cols 0:8", "history rows 0:40", "country (replica)"],
        ["user", "history rows 40:80", "country (replica)"],
        ["item cols 8:16", "history rows 80:120", "country (replica)"],
    ]


def user_error(capsys, *args) -> str:
    """Run ``distrec plan ARGS``, check it failed as a user error, return its one stderr line."""
    capsys.readouterr()
    assert plan_cli(*args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("distrec: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_user_errors_are_one_line(tables_file, cost_models_dir, tmp_path, capsys):
    base = ["--devices", 2, "--memory-per-device", "3MB", "-o", tmp_path / "plan.json"]
    with_models = ["--tables", tables_file, *base, "--cost-models", cost_models_dir]
    err = user_error(capsys, "--tables", tables_file, *base)
    assert "distrec plan collect" in err and "distrec plan train-cost-models" in err
    assert "cost models" in user_error(capsys, "--tables", tables_file, *base, "--cost-models", tmp_path / "nothing")
    assert "'nope'" in user_error(capsys, *with_models, "--pin", "nope=1")
    assert "'nope'" in user_error(capsys, *with_models, "--no-split", "nope")
    assert "outside 0..1" in user_error(capsys, *with_models, "--pin", "user=5")
    assert "table=rank" in user_error(capsys, *with_models, "--pin", "user")
    assert "needs 2.4 MiB on one device whole" in user_error(
        capsys,
        "--tables",
        tables_file,
        "--devices",
        2,
        "--memory-per-device",
        "2MB",
        "-o",
        tmp_path / "p.json",
        "--cost-models",
        cost_models_dir,
        "--no-split",
        "user",
    )
    assert "use more devices" in user_error(
        capsys, "--tables", tables_file, "--devices", 2, "--memory-per-device", "2MB", "-o", tmp_path / "p.json", "--algorithm", "dim-greedy"
    )
    assert "no communication model for 4 devices" in user_error(
        capsys, "--tables", tables_file, "--devices", 4, "--memory-per-device", "3MB", "-o", tmp_path / "p.json", "--cost-models", cost_models_dir
    )
    assert "not a size" in user_error(capsys, "--tables", tables_file, "--devices", 2, "--memory-per-device", "lots", "-o", tmp_path / "p.json")
    assert "exactly one of --tables" in user_error(capsys, *base)
    assert "exactly one of --tables" in user_error(capsys, "--tables", tables_file, "--data-format", "synthetic", *base)
    assert "needs --devices" in user_error(capsys, "--tables", tables_file)
    assert "not found" in user_error(capsys, "--tables", tmp_path / "missing.yaml", *base)
    assert not (tmp_path / "plan.json").exists() and not (tmp_path / "p.json").exists()


def test_format_torchrec_writes_the_same_plan_as_torchrec_parameter_shardings(tables_file, tmp_path, capsys):
    common = ["--tables", tables_file, "--devices", 2, "--memory-per-device", "3MB", "--algorithm", "size-greedy"]
    assert plan_cli(*common, "-o", tmp_path / "distrec.json") == 0
    assert plan_cli(*common, "--format", "torchrec", "--torchrec-module", "model.ebc", "-o", tmp_path / "torchrec.json") == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["format"] == "torchrec"
    document = json.loads((tmp_path / "torchrec.json").read_text())
    assert document["world_size"] == 2 and set(document["plan"]["model.ebc"]) == {t["name"] for t in TABLES}
    assert all(p["compute_kernel"] == "fused" for p in document["plan"]["model.ebc"].values())
    assert ShardingPlan.load(tmp_path / "torchrec.json").to_dict() == ShardingPlan.load(tmp_path / "distrec.json").to_dict()


@pytest.mark.parametrize(
    "args,message", [(["--devices", "1"], "give world sizes of at least 2"), (["--budget-minutes", "0"], "give a positive number of minutes")]
)
def test_calibrate_refuses_a_single_device_or_no_budget_before_measuring(tmp_path, capsys, args, message):
    assert message in user_error(capsys, "calibrate", *args, "--out", tmp_path / "cal")
    assert not (tmp_path / "cal").exists()


def test_the_commands_algorithm_choices_are_the_planners():
    from distrec.cli import plan
    from distrec.planner.api import ALGORITHMS

    assert plan.ALGORITHMS == ALGORITHMS
