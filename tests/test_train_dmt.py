"""``distrec train --lookup sptt --tower-module``: distributed DMT-DLRM and DMT-DCN equal the single-process ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from distrec import config
from distrec.errors import DistrecError
from distrec.models.build import build_model
from distrec.models.dcn import DCN
from distrec.models.dlrm import DLRM
from distrec.models.dmt import TowerEmbeddings
from distrec.tables import TableConfig
from distrec.tower_partition import TowerPartition
from distrec.train.evaluate import evaluate_checkpoint, load_trained_model
from distrec.train.loop import Trainer, train
from distrec.train.run import check_run, resume_config
from multiprocess import run_distributed
from tiny_runs import tiny_config, train_losses, train_on_rank

STEPS = 18  # crosses an epoch: its last batch of 30 rows splits 8, 8, 7, 7 over 4 ranks
TOWERS = [["C4", "C1", "C3"], ["C2", "C5"]]
# the tiny preset's DLRM, or a DCN of the same size (dense features through a bottom MLP)
ARCH = {
    "dlrm": (),
    "dcn": ('model.arch="dcn"', "model.cross_layers=2", "model.deep_mlp=[16]", "model.bottom_mlp=[16]"),
}
MODEL_CLASS = {"dlrm": DLRM, "dcn": DCN}


def _cfg(root: Path, module: str = "dlrm", steps: int = STEPS, arch: str = "dlrm", **parallel) -> config.RunConfig:
    towers = root / "towers.json"
    if not towers.exists():
        TowerPartition(TOWERS, "coherent", 1.5).save(towers)
    cfg = tiny_config(root / "cache", steps, ARCH[arch], towers=str(towers), **parallel)
    cfg.model.tower_module = module
    cfg.model.tower_compression = 2.0
    cfg.train.optimizer = "adam"
    cfg.train.lr = 0.05
    return cfg


def _assert_same_models(a: torch.nn.Module, b: torch.nn.Module, atol: float = 2e-5) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(y, x, rtol=0, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize(
    "arch,module,tower_sharding", [("dlrm", "dlrm", "table_wise"), ("dlrm", "dcn", "column_wise"), ("dcn", "dlrm", "column_wise"), ("dcn", "dcn", "table_wise")]
)
def test_dmt_on_2_hosts_x_2_ranks_equals_the_single_process_dmt_model(tmp_path, arch, module, tower_sharding):
    single = tmp_path / "single"
    summary = train(_cfg(tmp_path, module, arch=arch), single, progress=False)
    run = tmp_path / "dmt"
    sptt = dict(lookup="sptt", hosts=2, ranks_per_host=2, tower_sharding=tower_sharding)
    run_distributed(train_on_rank, 4, _cfg(tmp_path, module, arch=arch, **sptt), run)
    losses = train_losses(run)
    assert losses == pytest.approx(train_losses(single), abs=2e-5)
    assert np.mean(losses[-4:]) < np.mean(losses[:4])
    expected, _, _, _ = load_trained_model(single, torch.device("cpu"))
    got, _, _, meta = load_trained_model(run, torch.device("cpu"))
    assert isinstance(got, MODEL_CLASS[arch]) and isinstance(got.embeddings, TowerEmbeddings) and meta["towers"]["rank"] == [0, 2]
    plan = json.loads((run / "plan.json").read_text())
    assert {p["sharding"] for p in plan["tables"]} == {tower_sharding}
    # Adam divides a gradient by its running norm + 1e-8, so an entry whose gradient stays
    # near zero turns the sums' rounding (~1e-10) into steps of up to lr x 1e-10 / 1e-8 =
    # 5e-4 (measured: 1.1e-3 in 82 of 3,880 table entries); a misrouted lookup moves ~lr = 0.05
    _assert_same_models(expected, got, atol=5e-3)
    # the run reports the DMT paper's Table 4-5 columns next to the baseline's
    cost = json.loads((run / "summary.json").read_text())["dmt"]
    assert cost == summary["dmt"]
    # (DMT-DLRM adds the tower modules; DMT-DCN's cross network also shrinks with its input)
    assert cost["compression"] > 1 and cost["dense_parameters"] != cost["baseline_dense_parameters"]
    assert cost["mflops_per_sample"] > 0 and cost["baseline_mflops_per_sample"] > 0
    # distrec evaluate gathers every tower from the ranks that held it (AUC of models equal
    # but for the entries above)
    assert evaluate_checkpoint(run, None, None, progress=False, split="all")["auc"] == pytest.approx(
        evaluate_checkpoint(single, None, None, progress=False, split="all")["auc"], abs=1e-4
    )


def _tower_state_by_rank(rank: int, world_size: int, cfg: config.RunConfig, out: Path) -> None:
    """Train, then check that each host's ranks hold equal tower weights and, after one more
    backward and the intra-host sync, equal tower gradients."""
    trainer = Trainer(cfg, out, progress=False)
    trainer.fit()
    batch = next(trainer.dataset.batches(trainer.splits["train"], cfg.train.batch_size, shuffle=False, shard=(rank, world_size)))
    trainer.train_step.backward(batch, normalizer=cfg.train.batch_size / world_size)
    trainer.train_step.sync_gradients()
    params = trainer.model.tower_parameters()
    mine = torch.cat([torch.cat([p.detach().flatten(), p.grad.flatten()]) for p in params])
    sizes: list[int] = [0] * world_size
    dist.all_gather_object(sizes, mine.numel())
    padded = torch.nn.functional.pad(mine, (0, max(sizes) - mine.numel()))
    gathered = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(gathered, padded)
    host_peer = rank ^ 1  # 2 hosts x 2 ranks: ranks 0, 1 on host 0 and 2, 3 on host 1
    assert trainer.model.embeddings.host == rank // 2
    assert sizes[host_peer] == mine.numel() and sizes[rank ^ 2] != mine.numel()  # the towers differ in size
    torch.testing.assert_close(gathered[host_peer], padded, rtol=0, atol=0)
    assert all(p.grad.abs().sum() > 0 for p in params)


def test_tower_weights_and_gradients_equal_across_the_ranks_of_a_host(tmp_path):
    run_distributed(_tower_state_by_rank, 4, _cfg(tmp_path, steps=6, lookup="sptt", hosts=2, ranks_per_host=2), tmp_path / "run")


@pytest.mark.parametrize("arch,module", [("dlrm", "dlrm"), ("dcn", "dcn")])
def test_resumed_dmt_run_equals_an_uninterrupted_one(tmp_path, arch, module):
    cfg = dict(lookup="sptt", hosts=2, ranks_per_host=1)
    straight = tmp_path / "straight"
    run_distributed(train_on_rank, 2, _cfg(tmp_path, module, arch=arch, **cfg), straight)
    resumed = tmp_path / "resumed"
    run_distributed(train_on_rank, 2, _cfg(tmp_path, module, steps=STEPS // 2, arch=arch, **cfg), resumed)
    run_distributed(train_on_rank, 2, resume_config(resumed, None, STEPS, None), resumed, True)
    assert train_losses(resumed) == pytest.approx(train_losses(straight), abs=1e-6)
    expected, _, _, _ = load_trained_model(straight, torch.device("cpu"))
    got, _, _, _ = load_trained_model(resumed, torch.device("cpu"))
    _assert_same_models(expected, got)


def test_dmt_needs_sptt_in_a_multi_process_run_and_towers(tmp_path):
    with pytest.raises(DistrecError, match="needs --lookup sptt"):
        check_run(_cfg(tmp_path), 4, progress=False)
    with pytest.raises(DistrecError, match="needs towers"):
        config.load(None, ['model.tower_module="dlrm"'], preset="tiny")


@pytest.mark.parametrize("preset", ["dcn", "tiny"])
@pytest.mark.parametrize("module", ["dlrm", "dcn"])
def test_every_preset_takes_either_tower_module(preset, module):
    cfg = config.load(None, [f'model.tower_module="{module}"', "parallel.hosts=2", "parallel.ranks_per_host=1"], preset=preset)
    tables = [TableConfig(f"C{i}", 10, cfg.model.embedding_dim) for i in range(4)]
    model = build_model(cfg.model, 3, tables, towers=[[0, 2], [1, 3]])
    assert isinstance(model, MODEL_CLASS[cfg.model.arch]) and model.embeddings.spec.kind == module
