"""Documented faults, end to end through the command line: bad input is refused with one line
naming the problem and the fix (exit 2, no traceback, no warning) before anything is written;
messages blame what is wrong; commands keep their output out of the working directory and
their stdout short.

Each command runs in an empty working directory with its cache ($DISTREC_CACHE) inside; a
refused command must leave that directory as it was (the parsed-data cache aside).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from distrec.cli import main
from distrec.errors import DistrecError
from distrec.hotline.row_files import BASE_FILE
from distrec.parallel.default_plans import uniform_plan
from distrec.parallel.plan import ShardingPlan
from distrec.planner.calibrate import SampleCosts
from distrec.planner.cost_models import CommCostNet, ComputeCostNet, ComputeEnsemble, CostModels
from distrec.planner.store import COST_MODELS_FILE
from distrec.tables import TableConfig
from test_checkpoint import forge_meta, rewrite_checksum
from test_planner_cost_models import write_synthetic_costs

REPOSITORY = Path(__file__).resolve().parents[1]
TABLES = [{"name": "a", "rows": 1000, "dim": 8, "pooling_factor": 2}, {"name": "b", "rows": 500, "dim": 16, "pooling_factor": 1}]
TINY_SYNTHETIC = ["--preset", "tiny", "--set", "data.synthetic.rows=600", "--set", "data.synthetic.table_rows=50", "--no-progress"]


@pytest.fixture(autouse=True)
def workspace(tmp_path, monkeypatch) -> Path:
    """An empty working directory holding the command's cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))
    return tmp_path


def files(root: Path) -> dict[str, int]:
    """Every file under ``root`` but the cache, with its size."""
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] != "cache"}


def refused(capsys, *argv: object) -> str:
    """Run ``distrec argv`` in the working directory; assert that it failed with exit 2 and one
    line on stderr, no traceback, and wrote nothing; return the line without its prefix."""
    before = files(Path.cwd())
    status = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("distrec: error: "), err
    assert files(Path.cwd()) == before, "a refused command wrote files"
    return lines[0].removeprefix("distrec: error: ")


@pytest.fixture
def tables_file(workspace) -> Path:
    path = workspace / "tables.yaml"
    path.write_text(yaml.safe_dump(TABLES))
    return path


@pytest.fixture(scope="module")
def block_run(tmp_path_factory) -> Path:
    """A tiny one-process run trained for 2 steps (its checkpoint lists its table blocks)."""
    run = tmp_path_factory.mktemp("blocks") / "run"
    assert main(["train", *TINY_SYNTHETIC, "--set", "train.threads=1", "--cache-dir", str(run.parent / "cache"), "--max-steps", "2", "--out", str(run)]) == 0
    return run


@pytest.fixture(scope="module")
def hotline_run(tmp_path_factory) -> Path:
    """A tiny run trained with --hotline for 3 steps (its checkpoint holds a rows file)."""
    run = tmp_path_factory.mktemp("hotline") / "run"
    argv = ["train", *TINY_SYNTHETIC, "--set", "train.threads=1", "--cache-dir", str(run.parent / "cache")]
    assert main([*argv, "--hotline", "--hot-budget", "2KB", "--max-steps", "3", "--out", str(run)]) == 0
    return run


# ----------------------------------------------------------------------------- 1. bad input


@pytest.mark.parametrize("ms,shown", [("NaN", "ms nan"), ("-1e30", "ms -1e+30")])
def test_train_cost_models_refuses_a_non_finite_or_absurd_cost_naming_file_and_line(workspace, capsys, ms, shown):
    data = write_synthetic_costs(workspace / "costs.jsonl", 20, 20)
    lines = data.read_text().splitlines()
    lines[3] = re.sub(r'"ms": [^,}]+', f'"ms": {ms}', lines[3])
    data.write_text("\n".join(lines) + "\n")
    message = refused(capsys, "plan", "train-cost-models", "--cost-data", data, "--out", workspace / "models", "--epochs", 1)
    assert f"'{data}' line 4 has {shown}" in message and "delete the line or re-collect" in message


def test_a_binary_cost_data_file_is_refused(workspace, capsys):
    data = workspace / "costs.jsonl"
    data.write_bytes(bytes(range(256)) * 4)
    message = refused(capsys, "plan", "train-cost-models", "--cost-data", data, "--out", workspace / "models")
    assert f"cost data '{data}' is not text" in message and "name another file" in message


def test_a_binary_table_file_is_refused(workspace, capsys):
    tables = workspace / "tables.yaml"
    tables.write_bytes(bytes(range(128, 256)) * 8)
    message = refused(capsys, "plan", "--tables", tables, "--devices", 2, "--memory-per-device", "1MB", "--algorithm", "size-greedy", "-o", "plan.json")
    assert f"table file '{tables}' is not text" in message


@pytest.mark.parametrize("device,problem", [("tpu", "--device tpu is not a torch device type"), ("cuda", "this machine has no cuda device")])
def test_collect_on_a_device_this_machine_lacks_says_so(workspace, capsys, device, problem):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    message = refused(capsys, "plan", "collect", "--devices", 2, "--compute-samples", 1, "--comm-samples", 0, "--device", device, "--out", workspace / "p")
    assert problem in message and "use --device cpu" in message


def test_collect_refuses_batch_size_zero(workspace, capsys):
    message = refused(capsys, "plan", "collect", "--devices", 2, "--compute-samples", 1, "--comm-samples", 0, "--batch-size", 0, "--out", workspace / "p")
    assert "--batch-size 0 is not a positive multiple of 2" in message


def test_random_plan_refuses_a_negative_seed(workspace, capsys, tables_file):
    args = ["--tables", tables_file, "--devices", 2, "--memory-per-device", "1MB", "-o", workspace / "plan.json"]
    assert "--seed -1 is negative; give a seed of 0 or more" in refused(capsys, "plan", *args, "--algorithm", "random", "--seed", -1)


@pytest.mark.parametrize("budget", ["nan", "inf"])
def test_calibrate_refuses_a_budget_that_is_not_a_time(workspace, capsys, budget):
    message = refused(capsys, "plan", "calibrate", "--budget-minutes", budget, "--out", workspace / "p")
    assert f"--budget-minutes {budget} is not a time to spend" in message


@pytest.mark.parametrize("part", ["comm", "a weight"])
def test_cost_models_missing_a_part_are_refused(workspace, capsys, tables_file, part):
    path = workspace / COST_MODELS_FILE
    CostModels(ComputeEnsemble([ComputeCostNet()]), {2: (CommCostNet.forward_model(), CommCostNet.backward_model())}, 256, {}).save(path)
    state = torch.load(path, weights_only=True)
    if part == "comm":
        del state["comm"]
    else:
        state["compute"].pop(next(iter(state["compute"])))
    torch.save(state, path)
    message = refused(capsys, "plan", "--tables", tables_file, "--devices", 2, "--memory-per-device", "1MB", "--cost-models", path, "-o", "plan.json")
    assert f"cost models '{path}'" in message and "retrain them with 'distrec plan train-cost-models'" in message
    assert ("lack comm" if part == "comm" else "their weights do not load") in message


def test_a_table_pinned_twice_is_refused(workspace, capsys, tables_file):
    args = ["--tables", tables_file, "--devices", 2, "--memory-per-device", "1MB", "--algorithm", "size-greedy", "-o", "plan.json"]
    assert "table 'a' is pinned twice (--pin a=0 and --pin a=1); pin each table once" in refused(capsys, "plan", *args, "--pin", "a=0", "--pin", "a=1")


@pytest.mark.parametrize(
    "args,problem",
    [
        (["--gpus-per-host", "0"], "a cluster of 16 GPUs in hosts of 0 is invalid"),
        (["--pooling", "nan"], "workload pooling = nan is invalid"),
        (["--gpus", "-8"], "a cluster of -8 GPUs in hosts of 8 is invalid"),
    ],
)
def test_simulate_refuses_non_positive_clusters_and_non_finite_workloads(capsys, args, problem):
    argv = ["simulate", "--hardware", "H100", "--schemes", "flat", "--gpus", "16", *args, "-o", "sim.json"]
    assert problem in refused(capsys, *argv)


@pytest.mark.parametrize(
    "flags,problem",
    [
        (["--sync-every", 5], "--sync-every sets how often a periodic sync averages the replicas; add --replica-sync periodic or drop it"),
        (["--replica-sync", "periodic"], "--replica-sync periodic averages the replicas of replica groups, and the run has one group; add --replica-groups G"),
        (["--sample-rate", 0.5], "--sample-rate applies to Hotline, which this run does not use; add --hotline or drop --sample-rate"),
        (["--hot-budget", "1MB", "--relearn-every", 5], "--hot-budget applies to Hotline, which this run does not use; add --hotline or drop --hot-budget"),
        (["--sharding", "row_wise", "--plan", "plan.json"], "--plan places every table, so --sharding would be ignored; drop one of them"),
    ],
)
def test_train_refuses_a_flag_its_run_would_ignore(capsys, flags, problem):
    assert problem in refused(capsys, "train", *TINY_SYNTHETIC, "--max-steps", 1, *flags)


@pytest.mark.parametrize(
    "section,problem",
    [
        ("parallel:\n  sync_every: 5\n", "--sync-every sets how often a periodic sync"),
        ("parallel:\n  replica_sync: periodic\n", "the run has one group"),
        ("parallel:\n  sharding: row_wise\n  plan: plan.json\n", "--plan places every table"),
    ],
)
def test_a_config_file_setting_what_its_run_would_ignore_is_refused(workspace, capsys, section, problem):
    (workspace / "run.yaml").write_text(section)
    assert problem in refused(capsys, "train", "--config", "run.yaml", "--max-steps", 1, "--no-progress")


def test_a_preset_with_a_config_file_that_sets_the_architecture_is_refused(workspace, capsys):
    (workspace / "run.yaml").write_text("model:\n  embedding_dim: -3\n")  # the preset would drop even this unread
    message = refused(capsys, "train", "--config", "run.yaml", "--preset", "tiny", "--max-steps", 1, "--no-progress")
    assert (
        message
        == "--preset tiny replaces the architecture that config file 'run.yaml' sets in its model: section; drop --preset, or set model.preset in the file"
    )


def test_hotline_settings_in_a_config_file_without_hotline_are_kept_for_later(workspace, capsys):
    """A config file may hold Hotline's settings with Hotline off (switched on by --hotline):
    only the flags, which say the user meant them for this run, are refused."""
    from distrec import config

    (workspace / "run.yaml").write_text("hotline:\n  enabled: false\n  hot_budget: 1MB\n  sample_rate: 0.5\n")
    assert config.load(workspace / "run.yaml").hotline.hot_budget == "1MB"


def test_resuming_a_periodic_2d_run_as_one_group_drops_its_replica_sync(tmp_path):
    from distrec import config
    from distrec.train.run import resume_config

    saved = config.load(None, ["parallel.replica_groups=2", "parallel.replica_sync=periodic", "parallel.sync_every=3"], preset="tiny")
    config.save(saved, tmp_path / "config.yaml")
    resumed = resume_config(tmp_path, None, 10, None, parallel={"replica_groups": 1})
    assert (resumed.parallel.replica_groups, resumed.parallel.replica_sync, resumed.parallel.sync_every) == (1, "exact", 10)
    assert resume_config(tmp_path, None, 10, None).parallel.sync_every == 3


# ----------------------------------------------------------------------------- 2. messages that blame the right thing


def test_bench_hotline_blames_a_hot_budget_that_holds_no_row(capsys):
    message = refused(capsys, "bench", "hotline", *TINY_SYNTHETIC, "--hot-budget", "0", "--batches", 2, "--train-steps", 0, "--out", "bench")
    assert "a hot budget of 0 bytes (--hot-budget, hotline.hot_budget) holds no row" in message and "logger_size" not in message


def test_calibrate_names_a_budget_too_small_for_one_sample_and_the_minimum(workspace, capsys, monkeypatch):
    def slow_pilot(collect, data, devices):  # what the pilot measured: samples slower than the whole budget
        return SampleCosts(compute_s=5.0, comm_s={2: 5.0}, comm_start_s={2: 10.0})

    monkeypatch.setattr("distrec.planner.calibrate._pilot", slow_pilot)
    message = refused(capsys, "plan", "calibrate", "--budget-minutes", 0.05, "--devices", 2, "--out", workspace / "p")
    assert message.startswith("a budget of 0.05 min is too small for one sample here; give --budget-minutes ")
    assert "for the 40 compute and 20 all-to-all samples per world size the models need" in message
    assert not re.search(r"-\d", message)  # no negative count


@pytest.mark.filterwarnings("error")  # matplotlib's legend warning fails the test
def test_report_on_an_empty_metrics_log_is_one_line(workspace, capsys):
    run = workspace / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    message = refused(capsys, "report", run)
    assert f"'{run / 'metrics.jsonl'}' holds no training loss or validation AUC" in message and "nothing to plot" in message


# ----------------------------------------------------------------------------- 3. clutter


def run_on_terminal(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``distrec argv`` with its stderr on a 100 x 40 pseudo-terminal that redraws a
    progress bar at every update; its exit status and what the terminal showed."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    env = {**os.environ, "TQDM_MININTERVAL": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "distrec", *argv], cwd=cwd, stdout=subprocess.DEVNULL, stderr=terminal, env=env)
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # EIO: the command closed its end
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    return proc.wait(), shown.decode(errors="replace")


def test_data_synth_shows_its_progress_on_a_terminal_unless_told_not_to(workspace):
    status, shown = run_on_terminal(["data", "synth", "-o", "synthetic.tsv", "--rows", "70000"], workspace)
    percents = {int(p) for p in re.findall(r"writing synthetic\.tsv:\s+(\d+)%", shown)}
    assert status == 0 and {0, 100} < percents, shown  # and some between
    status, shown = run_on_terminal(["data", "synth", "-o", "quiet.tsv", "--rows", "70000", "--no-progress"], workspace)
    assert status == 0 and "writing" not in shown


def test_partition_writes_its_figure_beside_the_partition_not_in_the_working_directory(workspace, capsys, hotline_run):
    out = workspace / "towers" / "towers.json"
    before = files(workspace)
    argv = ["partition", "--checkpoint", hotline_run, "--towers", 2, "--steps", 20, "--sample-rows", 256, "-o", out, "--no-progress"]
    assert main([str(a) for a in argv]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["plot"] == str(out.with_suffix(".png"))
    assert set(files(workspace)) - set(before) == {"towers/towers.json", "towers/towers.png"}


@pytest.mark.parametrize("output", ["runs/first/metrics.jsonl", "towers.json", "towers.png", "plan.json", "breakdown.png", "breakdown-curves.png"])
def test_the_readme_tours_outputs_are_ignored_by_git(output):
    if shutil.which("git") is None or not (REPOSITORY / ".git").exists():
        pytest.skip("not a git checkout")
    assert subprocess.run(["git", "-C", str(REPOSITORY), "check-ignore", "--quiet", "--no-index", output]).returncode == 0


# ----------------------------------------------------------------------------- 4. Hotline's rows file cut short


def test_a_hotline_rows_file_cut_short_is_one_line_naming_its_size_not_a_bus_error(workspace, capsys, hotline_run):
    """The rows file is cut after the checkpoint's checksums were checked (here: they are made
    to match the cut file), so only the check before mapping it stands between the command and
    SIGBUS at the first row read past the file's end."""
    run = Path(shutil.copytree(hotline_run, workspace / "run"))
    rows = run / "checkpoint" / BASE_FILE
    full = rows.stat().st_size
    os.truncate(rows, full // 2)
    rewrite_checksum(run / "checkpoint", BASE_FILE)
    message = refused(capsys, "evaluate", "--checkpoint", run, "--no-progress")
    assert f"the embedding rows file '{rows}' has {full // 2} bytes, expected {full}" in message and "resume from another checkpoint" in message


TRUNCATED_MID_RUN = """
import os, sys
from distrec.hotline.training import HotlineTraining
step, path = HotlineTraining.step, sys.argv[1]
def step_then_cut(self, *args, **kwargs):
    self.steps_done = getattr(self, "steps_done", 0) + 1
    if self.steps_done == 3:  # another program cuts the file mid-run
        os.truncate(path, os.path.getsize(path) // 2)
    return step(self, *args, **kwargs)
HotlineTraining.step = HotlineTraining.__call__ = step_then_cut
from distrec.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_slow_tier_file_cut_short_mid_run_is_one_line_not_a_bus_error(workspace):
    rows = workspace / "rows.f32"
    np.zeros((26 * 50, 8 + 1), np.float32).tofile(rows)  # the tiny preset's 26 tables of 50 rows: dim 8 and Adagrad's row state
    argv = ["train", *TINY_SYNTHETIC, "--set", "train.threads=1", "--hotline", "--hot-budget", "2KB", "--relearn-every", 2, "--sample-rate", 1]
    argv += ["--set", f"hotline.slow_tier_file={rows}", "--max-steps", 6, "--out", workspace / "run"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", TRUNCATED_MID_RUN, str(rows), *map(str, argv)], capture_output=True, text=True, env=env)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("distrec: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"the slow tier's file '{rows}' was truncated to {rows.stat().st_size} bytes while in use (it had 46800)" in errors[0]
    assert "truncate -s 46800 FILE) and resume from the last checkpoint" in errors[0]


def test_a_plan_listing_a_table_twice_names_the_table():
    tables = [TableConfig(f"t{i}", 10, 4) for i in range(2)]
    plan = uniform_plan(tables, 2, "table_wise").to_dict()
    plan["tables"].append(plan["tables"][0])
    with pytest.raises(DistrecError, match=r"lists table\(s\) t0 more than once"):
        ShardingPlan.from_dict(plan).validate(tables)


def test_resume_refuses_a_tower_partition_that_changed_since_the_run(tmp_path):
    from distrec.tower_partition import TowerPartition
    from distrec.train.loop import train
    from distrec.train.run import resume_config
    from tiny_runs import tiny_config

    towers = tmp_path / "towers.json"
    TowerPartition([["C4", "C1", "C3"], ["C2", "C5"]], "coherent").save(towers)
    cfg = tiny_config(tmp_path / "cache", 3, towers=str(towers))
    cfg.model.tower_module, cfg.model.tower_compression = "dlrm", 2.0
    train(cfg, tmp_path / "run", progress=False)
    assert resume_config(tmp_path / "run", None, 5, None).parallel.towers == str(towers)  # unchanged: resumes
    TowerPartition([["C2", "C1", "C3"], ["C4", "C5"]], "coherent").save(towers)  # two features swapped, sizes kept
    with pytest.raises(DistrecError, match="differs from the towers .* was trained with"):
        resume_config(tmp_path / "run", None, 5, None)
    towers.unlink()
    with pytest.raises(DistrecError, match="no longer loads"):
        resume_config(tmp_path / "run", None, 5, None)


def test_a_second_distrec_cannot_train_into_a_run_directory_in_use(tmp_path, capsys):
    from distrec.cli.train import holding_run

    run = tmp_path / "run"
    with holding_run(run):  # as a training distrec holds it
        code = main(["train", "--preset", "tiny", "--max-steps", "1", "--no-progress", "--out", str(run), "--overwrite"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"is training in {str(run)!r}; wait for it to end, or pass another --out" in err[0]
    assert not run.exists()


@pytest.mark.parametrize(
    "argv", [["train", "--preset", "tiny", "--max-steps", "1", "--no-progress", "--out"], ["data", "synth", "--rows", "10", "--no-progress", "-o"]]
)
def test_a_path_under_a_file_is_one_line_naming_it(tmp_path, capsys, argv):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = main([*argv, str(blocker / "inside" / "x.parquet")])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("distrec: error:")]
    assert code == 2 and len(err) == 1 and "a-file" in err[0] and "Traceback" not in err[0]


def test_evaluate_refuses_the_runs_own_rows_once_its_data_changed(shared_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DISTREC_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "criteo.tsv"
    shutil.copy(shared_data / "criteo" / "criteo_kaggle_tiny.tsv", data)
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--data-format", "criteo", "--data", str(data), "--max-steps", "2", "--no-progress", "--out", str(run)]) == 0
    capsys.readouterr()
    lines = data.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[1:] + lines[:1]))  # the same rows, edited order: other val rows
    code = main(["evaluate", "--checkpoint", str(run), "--no-progress"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("distrec: error:")]
    assert code == 2 and len(err) == 1 and "cannot score the run's own rows on different data" in err[0]


# ----------------------------------------------------------------------------- 5. files edited with their checksums recorded again


def resume_args(run: Path) -> list[object]:
    return ["train", "--resume", run, "--max-steps", 4, "--no-progress"]


@pytest.mark.parametrize(
    "ids,problem",
    [
        (np.array([1, "x", None], dtype=object), "holds Python objects, which loading would run as code"),
        (np.array([3.5, 1e12]), "holds float64 of shape (2,), not int64 row ids"),
        (np.array([7, 3], dtype=np.int64), "holds ids that are not ascending unique rows below 1300"),
    ],
)
def test_a_hot_set_file_of_objects_or_nonsense_is_one_line_and_never_unpickled(workspace, capsys, hotline_run, ids, problem):
    run = Path(shutil.copytree(hotline_run, workspace / "run"))
    path = run / "checkpoint" / "hotline-hot-ids.npy"
    np.save(path, ids, allow_pickle=True)
    rewrite_checksum(run / "checkpoint", path.name)
    assert f"the hot set file '{path}' {problem}; resume from another checkpoint" in refused(capsys, *resume_args(run))


def test_nan_rows_in_a_hotline_rows_file_are_named_on_resume_and_evaluate(workspace, capsys, hotline_run):
    run = Path(shutil.copytree(hotline_run, workspace / "run"))
    path = run / "checkpoint" / BASE_FILE
    rows = np.load(path)
    rows[5:9] = np.nan
    np.save(path, rows)
    rewrite_checksum(run / "checkpoint", BASE_FILE)
    assert f"the embedding rows in '{run / 'checkpoint'}' hold NaN or infinity (row 5 first)" in refused(capsys, *resume_args(run))
    message = refused(capsys, "evaluate", "--checkpoint", run, "--no-progress", "--split", "all")  # the mapped rows are not read whole: the scores show it
    assert re.search(r"the model predicts NaN for \d+ of 600 rows: its weights hold NaN or infinity; score an earlier checkpoint", message), message


@pytest.mark.parametrize(
    "edit,problem",
    [
        (lambda meta: meta.pop("tables"), "holds no tables"),
        (lambda meta: meta["tables"][0].update(num_rows="many"), 'has a malformed tables entry {"name": "C1", "num_rows": "many"'),
        (lambda meta: meta["blocks"][0].update(rank=3), "has a malformed blocks entry"),
        (lambda meta: meta["blocks"][0]["block"].update(row_end=10**6), "has a malformed blocks entry"),
        (lambda meta: meta["blocks"][0]["block"].pop("col_end"), "has a malformed blocks entry"),
        (lambda meta: meta.pop("num_dense"), "holds no num_dense"),
        (lambda meta: meta["config"]["train"].update(lr="fast"), "holds an invalid config (config key 'train.lr' expects float, got 'fast')"),
    ],
)
@pytest.mark.parametrize("command", ["evaluate", "resume"])
def test_a_meta_json_lacking_or_garbling_the_runs_entries_is_one_line(workspace, capsys, block_run, edit, problem, command):
    run = Path(shutil.copytree(block_run, workspace / "run"))
    forge_meta(run / "checkpoint", edit)
    argv = ["evaluate", "--checkpoint", run, "--no-progress"] if command == "evaluate" else resume_args(run)
    message = refused(capsys, *argv)
    assert message.startswith(f"checkpoint metadata '{run / 'checkpoint' / 'meta.json'}' {problem}") and "resume from an earlier checkpoint" in message


def test_a_hand_edited_run_config_is_named_on_resume_and_evaluate_scores_with_the_checkpoints_own(workspace, capsys, block_run):
    run = Path(shutil.copytree(block_run, workspace / "run"))
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["train"]["lr"] = -1.0
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    message = refused(capsys, *resume_args(run))
    assert (
        message
        == f"the run's settings '{run / 'config.yaml'}' are invalid (train.lr is -1.0; it must be positive); put back the value the run was trained with"
    )
    assert main(["evaluate", "--checkpoint", str(run), "--no-progress"]) == 0  # the checkpoint keeps the config it trained with
    assert "auc" in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("dense,sparse,shown", [(12, 26, "12 dense and [C1"), (13, 25, "13 dense and [C1, C2, C3, C4, C5, C6, ... (19 more)]")])
def test_evaluate_refuses_data_of_another_width_than_the_model(workspace, capsys, block_run, dense, sparse, shown):
    names = [f"I{i}" for i in range(1, dense + 1)] + [f"C{i}" for i in range(1, sparse + 1)]
    lines = [",".join(["label", *names])] + [",".join([str(r % 2), *(str(r + c) for c in range(len(names)))]) for r in range(40)]
    (workspace / "clicks.csv").write_text("\n".join(lines) + "\n")
    schema = {"label": "label", "dense": names[:dense], "categorical": names[dense:]}
    (workspace / "schema.yaml").write_text(yaml.safe_dump(schema))
    message = refused(capsys, "evaluate", "--checkpoint", block_run, "--data", "clicks.csv", "--data-format", "csv", "--schema", "schema.yaml", "--no-progress")
    assert f"the data has different features than the model: {shown}" in message and "the model's 13 and [C1" in message
