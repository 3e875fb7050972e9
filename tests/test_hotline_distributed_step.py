"""Distributed Hotline's step on real gloo groups: what its gradient all-reduce carries, the
non-popular micro-batch's exchange running beside the popular micro-batch's compute, and the
logger sampling only mini-batches a later re-learning reads."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from distrec.data import Dataset, prepare
from distrec.data.batch import Batch
from distrec.hotline.distributed import replicated_hot_embeddings
from distrec.hotline.hot_lookups import hot_bags, touched_bits
from distrec.models.build import build_model
from distrec.parallel.default_plans import uniform_plan
from distrec.train.loop import Trainer
from multiprocess import run_distributed
from tiny_runs import tiny_config

HOTLINE = ("hotline.enabled=true", "hotline.sample_rate=1.0", "hotline.relearn_every=3", "hotline.hot_budget=8KB")
HANDSHAKE_SECONDS = 60.0  # only a failing (sequential) step waits this long


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cache")
    prepare(tiny_config(path, 1).data, progress=False)
    return path


def _touched_rows_reduce(rank: int, world_size: int, cache: Path) -> dict:
    cfg = tiny_config(cache, 1)
    tables = Dataset(prepare(cfg.data, progress=False)).tables(cfg.model.embedding_dim)
    model = build_model(cfg.model, 13, tables, device="cpu")
    emb = replicated_hot_embeddings(model, tables, uniform_plan(tables, world_size, "table_wise"), torch.device("cpu"))
    emb.set_hot_ids(torch.arange(0, emb.space.total_rows, 5), None)
    rows, dim = emb.hot_weight.shape
    looked_up = torch.tensor([[1, 4, 4, 9], [4, 7, rows - 1, 7]][rank])  # rank 0 and rank 1 share row 4
    # one sample whose first 4 bags hold one of the lookups each, looked up from the hot table
    offsets = torch.tensor([0, 1, 2, 3] + [4] * (len(tables) - 3))  # F + 1 bounds (F >= 4)
    batch = Batch(torch.zeros(1, 13), looked_up.clone(), offsets, torch.zeros(1))

    def hot_lookups() -> torch.Tensor:
        with emb.local_only(), emb.known_rows(hot_bags(batch, torch.ones(4, dtype=torch.bool), looked_up)):
            return emb(batch)

    # a step that stops after its hot lookups' backward, before its sync (a failed step): the
    # next step must not see its gradients
    emb.share_touched_rows(touched_bits(looked_up, rows))
    hot_lookups().sum().backward()
    emb.share_touched_rows(touched_bits(looked_up, rows))
    pooled = hot_lookups()  # output gradient 1 on rank 0, 2 on rank 1
    pooled.backward(torch.full_like(pooled, float(rank + 1)))
    dense = nn.Parameter(torch.zeros(3))
    dense.grad = torch.full((3,), float(rank))
    emb.sync_gradients([dense])
    sparse = emb.hot_weight.grad
    return {
        "rows": rows,
        "dim": dim,
        "indices": sparse.indices()[0].tolist(),
        "values": sparse.values().clone(),
        "dense": dense.grad.clone(),
        "reduce_bytes": emb.reduce_bytes,
    }


def test_one_all_reduce_carries_the_dense_gradients_and_only_the_touched_hot_rows(cache):
    results = run_distributed(_touched_rows_reduce, 2, cache)
    r = results[0]
    union = sorted({1, 4, 9, 7, r["rows"] - 1})
    for rank in range(2):
        assert results[rank]["indices"] == union
        # sums per rank (rank 0: 1 -> 1, 4 -> 2, 9 -> 1; rank 1: 4 -> 2, 7 -> 4, last -> 2), averaged
        expected = torch.tensor([{1: 0.5, 4: 2.0, 9: 0.5, 7: 2.0}.get(i, 1.0) for i in union]).unsqueeze(1).expand(-1, r["dim"])
        torch.testing.assert_close(results[rank]["values"], expected, rtol=0, atol=0)
        torch.testing.assert_close(results[rank]["dense"], torch.full((3,), 0.5), rtol=0, atol=0)
    # float32 dense gradients and touched rows, one bit per hot row for their union
    assert r["reduce_bytes"] == 4 * (3 + len(union) * r["dim"]) + (r["rows"] + 7) // 8


def _overlapped_steps(rank: int, world_size: int, cache: Path, out: Path) -> dict:
    """Train with a handshake: the popular micro-batch's forward waits until the cold exchange
    has started in another thread, and that exchange until the forward has started; run one
    after the other, or both in the main thread, one would wait until HANDSHAKE_SECONDS and
    fail the step, so every step must overlap them."""
    trainer = Trainer(tiny_config(cache, 9, HOTLINE, sharding="table_wise"), out, progress=False)
    emb = trainer.model.embeddings
    cold_forward, forward = emb.cold_forward, emb.forward
    seen = {"handshakes": 0}
    cold_started, popular_started = threading.Event(), threading.Event()

    def cold_side(batch):
        if threading.current_thread() is threading.main_thread():  # no popular micro-batch on this rank, or evaluation
            return cold_forward(batch)
        cold_started.set()
        if not popular_started.wait(HANDSHAKE_SECONDS):
            raise AssertionError("the popular micro-batch did not start while the cold exchange ran")
        popular_started.clear()
        return cold_forward(batch)

    def popular_side(batch):
        if emb._local_only and torch.is_grad_enabled():
            popular_started.set()
            if not cold_started.wait(HANDSHAKE_SECONDS):
                raise AssertionError("the cold exchange did not start while the popular micro-batch ran")
            cold_started.clear()
            seen["handshakes"] += 1
        return forward(batch)

    emb.cold_forward, emb.forward = cold_side, popular_side
    try:
        trainer.fit()
        training = trainer.mode.training
        stats, logger = training.stats(), training.logger
    finally:
        trainer.close()
    return {"handshakes": seen["handshakes"], "popular_fraction": stats["popular_fraction"], "sampled": logger.sampled_batches if logger else None}


def test_the_cold_exchange_runs_in_a_worker_while_the_popular_micro_batch_computes(cache, tmp_path):
    results = run_distributed(_overlapped_steps, 2, cache, tmp_path / "run")
    for r in results:
        assert r["popular_fraction"] > 0
        assert r["handshakes"] >= 1  # and every step with a popular micro-batch passed the handshake
    # rank 0's logger sampled the mini-batches of steps 0-5 (read at the re-learnings at steps
    # 3 and 6), none after the last re-learning of the 9 steps
    assert [r["sampled"] for r in results] == [6, None]
