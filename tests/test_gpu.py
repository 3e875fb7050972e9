"""On CUDA devices, training equals the CPU's: one GPU, and two ranks over NCCL.

Skipped without GPUs (``-m gpu`` selects them; ``benchmarks/gpu_smoke.py`` runs them on a
GPU machine). The reference is the one-process CPU run of the same config; GPU kernels sum
in other orders, so the tolerance is 1e-4 rather than the CPU tests' 1e-5.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from distrec.parallel.comm import free_port
from distrec.train.loop import Trainer, train
from tiny_runs import assert_same_parameters, tiny_config, train_losses, trained_parameters

pytestmark = pytest.mark.gpu
STEPS = 9
GPU_TOLERANCE = 1e-4


def needs_gpus(count: int):
    return pytest.mark.skipif(torch.cuda.device_count() < count, reason=f"needs {count} CUDA device(s)")


def _reference(cache: Path, out: Path, overrides: tuple[str, ...] = ()) -> Path:
    cfg = tiny_config(cache, STEPS, overrides)
    trainer = Trainer(cfg, out, progress=False, device=torch.device("cpu"))
    try:
        trainer.fit()
    finally:
        trainer.close()
    return out


def _on_gpu(cache: Path, out: Path, overrides: tuple[str, ...] = ()) -> Path:
    cfg = tiny_config(cache, STEPS, overrides)
    trainer = Trainer(cfg, out, progress=False, device=torch.device("cuda", 0))
    try:
        trainer.fit()
    finally:
        trainer.close()
    return out


@needs_gpus(1)
@pytest.mark.parametrize("overrides", [(), ("hotline.enabled=true", "hotline.relearn_every=3", "hotline.sample_rate=1.0", "hotline.hot_budget=2KB")])
def test_one_gpu_trains_what_the_cpu_trains(tmp_path, overrides):
    cpu = _reference(tmp_path / "cache", tmp_path / "cpu", overrides)
    gpu = _on_gpu(tmp_path / "cache", tmp_path / "gpu", overrides)
    assert train_losses(gpu) == pytest.approx(train_losses(cpu), abs=GPU_TOLERANCE)
    assert_same_parameters(trained_parameters(gpu), trained_parameters(cpu), atol=GPU_TOLERANCE)


def _nccl_rank(rank: int, world_size: int, port: int, cache: Path, out: Path, sharding: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    train(tiny_config(cache, STEPS, sharding=sharding), out, progress=False)  # the trainer picks cuda:LOCAL_RANK and NCCL


@needs_gpus(2)
@pytest.mark.parametrize("sharding", ["row_wise", "column_wise"])
def test_two_ranks_over_nccl_train_what_one_cpu_process_trains(tmp_path, sharding):
    cpu = _reference(tmp_path / "cache", tmp_path / "cpu")
    mp.spawn(_nccl_rank, args=(2, free_port(), tmp_path / "cache", tmp_path / "nccl", sharding), nprocs=2, join=True)
    assert train_losses(tmp_path / "nccl") == pytest.approx(train_losses(cpu), abs=GPU_TOLERANCE)
    assert_same_parameters(trained_parameters(tmp_path / "nccl"), trained_parameters(cpu), atol=GPU_TOLERANCE)
