"""``distrec train --lookup sptt``: the distributed trainer with SPTT equals the single-process run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distrec import config
from distrec.errors import DistrecError
from distrec.modes import check_mode
from distrec.tables import TableConfig
from distrec.tower_partition import TowerPartition
from distrec.train.evaluate import load_trained_model
from distrec.train.loop import train
from multiprocess import run_distributed
from tiny_runs import assert_same_parameters, tiny_config, train_losses, train_on_rank, trained_parameters

STEPS = 18  # crosses an epoch: its last batch of 30 rows splits 8, 8, 7, 7 over 4 ranks


def _cfg(root: Path, **parallel) -> config.RunConfig:
    return tiny_config(root / "cache", STEPS, **parallel)


def _sptt_run_equals_one_process(root: Path, **parallel) -> tuple[Path, dict]:
    """Train one process and 4 ranks with SPTT over towers C4 C1 C3 | C2 C5; assert equal
    losses and weights; return the SPTT run and its table -> sorted shard ranks."""
    single = root / "single"
    train(_cfg(root), single, progress=False)
    towers = root / "towers.json"
    TowerPartition([["C4", "C1", "C3"], ["C2", "C5"]], "coherent", 1.5).save(towers)
    run = root / "sptt"
    run_distributed(train_on_rank, 4, _cfg(root, lookup="sptt", towers=str(towers), **parallel), run)
    assert train_losses(run) == pytest.approx(train_losses(single), abs=1e-5)
    assert_same_parameters(trained_parameters(run), trained_parameters(single))
    plan = json.loads((run / "plan.json").read_text())
    return run, {p["table"]: sorted(s["rank"] for s in p["shards"]) for p in plan["tables"]}


def test_sptt_training_on_2_hosts_x_2_ranks_equals_one_process(tmp_path):
    run, ranks = _sptt_run_equals_one_process(tmp_path, hosts=2, ranks_per_host=2)
    assert all(len(ranks[t]) == 1 for t in ranks)
    assert set(ranks["C4"] + ranks["C1"] + ranks["C3"]) <= {0, 1} and set(ranks["C2"] + ranks["C5"]) <= {2, 3}
    assert load_trained_model(run, torch.device("cpu"))[3]["world_size"] == 4


@pytest.mark.slow  # about 85 s on the shared 2 cores: 4 processes and a one-process run
def test_sptt_training_with_row_wise_towers_of_2_hosts_equals_one_process(tmp_path):
    """4 hosts x 1 rank, 2 towers of 2 hosts, their tables split by rows (reduce-scatter at step (d))."""
    _, ranks = _sptt_run_equals_one_process(tmp_path, hosts=4, ranks_per_host=1, hosts_per_tower=2, tower_sharding="row_wise")
    assert ranks == {"C1": [0, 1], "C3": [0, 1], "C4": [0, 1], "C2": [2, 3], "C5": [2, 3]}


@pytest.mark.parametrize(
    "parallel,message",
    [
        (dict(lookup="sptt", sharding="row_wise"), "drop --embeddings local, --plan and --sharding"),
        (dict(lookup="sptt", hosts=2), "both --hosts and --ranks-per-host"),
        (dict(lookup="sptt", hosts=2, ranks_per_host=2, hosts_per_tower=3), "--hosts-per-tower 3 must divide --hosts 2"),
        (dict(lookup="ring"), "parallel.lookup"),
    ],
)
def test_sptt_config_errors(tmp_path, parallel, message):
    with pytest.raises(DistrecError, match=message):
        _cfg(tmp_path, **parallel)


def test_memory_per_rank_splits_tables_by_rows_only_without_tower_modules(tmp_path):
    tables = [TableConfig(f"C{i}", 100, 8) for i in range(1, 6)]
    plain = _cfg(tmp_path, lookup="sptt", hosts=2, ranks_per_host=2, memory_per_rank="1MB")
    assert check_mode(plain, 4, tables).name == "sptt"
    towers = tiny_config(tmp_path / "cache", STEPS, ('model.tower_module="dlrm"',), lookup="sptt", hosts=2, ranks_per_host=2, memory_per_rank="1MB")
    with pytest.raises(DistrecError, match="cannot be combined with --tower-module"):
        check_mode(towers, 4, tables)
