"""Hotline with half-precision tables (``--table-dtype fp16|bf16``), in one process (tiers in RAM
and on disk) and on two (a replicated hot table in front of sharded ones, real gloo groups).

The rows are stored in the half dtype in every tier and checkpoint (half the bytes of float32
weights; the optimizer state stays float32), trained close to float32 Hotline and to ordinary
half training, resumed bit for bit, and rounded alike on every rank so the hot replicas stay equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from distrec.data import Dataset, prepare
from distrec.hotline.distributed import DistributedHotlineTraining
from distrec.hotline.hot_set import INDEX_BYTES_PER_ROW
from distrec.hotline.row_files import BASE_FILE
from distrec.hotline.row_state import RowLayout
from distrec.hotline.tiers import TwoTierStore
from distrec.train.loop import train
from multiprocess import run_distributed
from tiny_runs import tiny_config, train_losses, train_on_rank, trained_parameters

STEPS, STOP = 9, 5  # hot sets re-learned at steps 3 and 6; the split runs stop after 5 and resume
DIM = 8  # the tiny preset's
HOTLINE = ("hotline.enabled=true", "hotline.sample_rate=1.0", "hotline.relearn_every=3", "hotline.hot_budget=8KB")
ADAGRAD_ROWS = ("train.embedding_optimizer=adagrad", "train.embedding_lr=0.05")  # one float32 of row state
# Losses within LOSS_TOLERANCE of float32 Hotline's and of ordinary half training's at every step.
# A stored weight is off its float32 value by less than its spacing (2^-11 of it in fp16, 2^-8 in
# bf16), and unbiased rounding keeps the errors from drifting: over these 9 SGD steps the losses
# moved by about 1e-5 (fp16) and 2e-4 (bf16). A lost or misplaced row update (lr 0.5) moves the
# loss by more than 1e-2.
LOSS_TOLERANCE = 2e-3


def _cfg(cache: Path, *items: str, steps: int = STEPS, hotline: bool = True, **parallel: object):
    return tiny_config(cache, steps, (*(HOTLINE if hotline else ()), *items), **parallel)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bits of a tensor (equal bits: equal values, signed zeros and all)."""
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _assert_same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(_bits(a[name]), _bits(b[name])), name


def _train_records(run: Path) -> list[dict]:
    """What a run logged at every training step: the loss and Hotline's popular and hot-lookup fractions."""
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cache")
    prepare(_cfg(path).data, progress=False)
    return path


def _total_rows(cache: Path) -> int:
    return sum(t.num_rows for t in Dataset(prepare(_cfg(cache).data, progress=False)).tables(DIM))


# --- one process: hot rows in RAM, the others in a memory-mapped file -------------------------
@pytest.mark.parametrize("slow", ["disk", "host"])
def test_stored_rows_move_between_tiers_bit_for_bit(tmp_path, slow):
    """bf16 weights of an odd dim (one unit of padding) and lazy Adam's two float32 vectors per row:
    16-bit elements hold them apart, and rows move between the tiers without being rounded."""
    layout = RowLayout.of("adam", 5, torch.bfloat16)
    assert (layout.unit, layout.state_start, layout.width, layout.row_bytes) == (torch.int16, 6, 26, 52)
    gen = torch.Generator().manual_seed(0)
    reference = layout.empty(40)
    layout.weights(reference).copy_(torch.randn(40, 5, generator=gen))
    layout.state(reference).copy_(torch.randn(40, 10, generator=gen))  # as 16-bit halves, some are NaN patterns
    store = TwoTierStore(40, layout.width, torch.device("cpu"), init=lambda s, e: reference[s:e], slow=slow, directory=tmp_path, dtype=layout.unit)
    with store:
        assert store.slow_bytes == 40 * 52
        for hot in ([1, 4, 9], [4, 30, 39], []):
            store.set_hot(np.array(hot, dtype=np.int64))
            assert torch.equal(store.gather(torch.arange(40)), reference)
            assert store.fast.dtype == torch.int16 and layout.weights(store.fast).dtype == torch.bfloat16


@pytest.fixture(scope="module")
def one_process(cache, tmp_path_factory) -> dict[str, Path]:
    """SGD runs: float32 Hotline, fp16 and bf16 Hotline, ordinary fp16 training."""
    root = tmp_path_factory.mktemp("one-process")
    runs = {"hot-fp32": (), "hot-fp16": ("model.table_dtype=fp16",), "hot-bf16": ("model.table_dtype=bf16",)}
    for name, items in runs.items():
        train(_cfg(cache, *items), root / name, progress=False)
    train(_cfg(cache, "model.table_dtype=fp16", hotline=False), root / "plain-fp16", progress=False)
    return {name: root / name for name in [*runs, "plain-fp16"]}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tiers_and_checkpoint_store_half_rows(cache, one_process, dtype):
    name = "hot-fp16" if dtype == torch.float16 else "hot-bf16"
    half, full = _summary(one_process[name])["hotline"], _summary(one_process["hot-fp32"])["hotline"]
    total = _total_rows(cache)
    assert half["relearns"] == 2 and half["hot_rows"] > 0
    assert (half["slow_tier_bytes"], full["slow_tier_bytes"]) == (total * DIM * 2, total * DIM * 4)  # the disk file halves
    assert half["fast_tier_bytes"] == half["hot_rows"] * (DIM * 2 + INDEX_BYTES_PER_ROW)
    assert half["hot_rows"] > full["hot_rows"]  # the same budget holds more rows
    rows = np.load(one_process[name] / "checkpoint" / BASE_FILE, mmap_mode="r")
    assert rows.dtype == np.int16 and rows.shape == (total, DIM)  # 16-bit weights
    weight = trained_parameters(one_process[name])["embeddings.weight"]
    assert weight.dtype == dtype and torch.equal(_bits(weight), torch.from_numpy(np.array(rows)))


@pytest.mark.parametrize("name", ["hot-fp16", "hot-bf16"])
def test_tiers_train_close_to_float32_hotline_and_ordinary_half_training(one_process, name):
    losses = np.array(train_losses(one_process[name]))
    assert losses.size == STEPS
    for reference in ("hot-fp32", "plain-fp16"):
        np.testing.assert_allclose(losses, train_losses(one_process[reference]), rtol=0, atol=LOSS_TOLERANCE, err_msg=reference)
    assert not np.array_equal(losses, train_losses(one_process["hot-fp32"]))  # rows really were rounded


def test_tiers_resume_exactly_with_row_state(cache, tmp_path, caplog):
    """Row-wise Adagrad: its float32 state travels in the stored rows; the split run resumes
    the rows, the state, the hot set, the logger and the rounding streams."""
    items = ("model.table_dtype=fp16", *ADAGRAD_ROWS)
    train(_cfg(cache, *items), tmp_path / "straight", progress=False)
    train(_cfg(cache, *items, steps=STOP), tmp_path / "split", progress=False)
    caplog.clear()
    train(_cfg(cache, *items), tmp_path / "split", resume=True, progress=False)
    assert "never engaged" not in caplog.text  # the resumed counters, not fresh ones
    _assert_same_bits(trained_parameters(tmp_path / "split"), trained_parameters(tmp_path / "straight"))
    assert _train_records(tmp_path / "split") == _train_records(tmp_path / "straight")  # losses and fractions, counted on after the resume
    hot = _summary(tmp_path / "split")["hotline"]
    assert hot["relearns"] == 2 and hot["slow_tier_bytes"] == _total_rows(cache) * (DIM * 2 + 4)  # fp16 weights, float32 state
    rows = np.load(tmp_path / "split" / "checkpoint" / BASE_FILE, mmap_mode="r")
    assert rows.dtype == np.int16 and rows.shape[1] == DIM + 2


# --- two processes: a replicated hot table, the other rows sharded -----------------------------
def _train_recording_hot_rows(rank: int, world_size: int, cfg, out: Path, resume: bool = False) -> dict:
    """``train_on_rank``, recording after every step the bits of the hot table and of its row-wise state."""
    record: dict = {"weights": [], "state": []}
    step = DistributedHotlineTraining.step

    def recorded(self, batch, normalizer=None):
        loss = step(self, batch, normalizer)
        hot = self.embeddings.hot_weight
        record["weights"].append(_bits(hot).clone())
        record["state"].append(_bits(self.sparse_optimizer.state[hot]["sum"]).clone())
        record["dtype"] = hot.dtype
        return loss

    DistributedHotlineTraining.step = DistributedHotlineTraining.__call__ = recorded
    train_on_rank(rank, world_size, cfg, out, resume)
    return record


def _train_failing_after_stop(rank: int, world_size: int, cfg, out: Path) -> None:
    """``train_on_rank``, failing on every rank at the step after ``STOP`` (checkpointed there)."""
    step = DistributedHotlineTraining.step

    def failing(self, batch, normalizer=None):
        if self.counters.steps == STOP + 1:
            raise RuntimeError("a fault after the checkpoint")
        return step(self, batch, normalizer)

    DistributedHotlineTraining.step = DistributedHotlineTraining.__call__ = failing
    train_on_rank(rank, world_size, cfg, out)


@pytest.fixture(scope="module")
def two_processes(cache, tmp_path_factory) -> dict[str, object]:
    """SGD runs on 2 ranks: float32 and fp16 Hotline, the ordinary sharded trainer in fp16."""
    root = tmp_path_factory.mktemp("two-processes")
    for name, items, hotline in [("hot-fp32", (), True), ("hot-fp16", ("model.table_dtype=fp16",), True), ("plain-fp16", ("model.table_dtype=fp16",), False)]:
        run_distributed(train_on_rank, 2, _cfg(cache, *items, hotline=hotline, sharding="row_wise"), root / name)
    return {name: root / name for name in ("hot-fp32", "hot-fp16", "plain-fp16")}


def test_replicated_hot_table_and_shards_store_half_rows(two_processes):
    half, full = _summary(two_processes["hot-fp16"])["hotline"], _summary(two_processes["hot-fp32"])["hotline"]
    assert half["relearns"] == 2 and half["hot_rows"] > 0
    assert half["replicated_bytes"] == half["hot_rows"] * (DIM * 2 + INDEX_BYTES_PER_ROW)
    assert half["hot_rows"] > full["hot_rows"]  # the same budget holds more rows
    assert trained_parameters(two_processes["hot-fp16"])["embeddings.weight"].dtype == torch.float16


def test_replicated_training_is_close_to_float32_hotline_and_the_sharded_half_trainer(two_processes):
    losses = np.array(train_losses(two_processes["hot-fp16"]))
    assert losses.size == STEPS
    for reference in ("hot-fp32", "plain-fp16"):
        np.testing.assert_allclose(losses, train_losses(two_processes[reference]), rtol=0, atol=LOSS_TOLERANCE, err_msg=reference)
    assert not np.array_equal(losses, train_losses(two_processes["hot-fp32"]))  # rows really were rounded


def test_replicas_stay_equal_and_a_resumed_run_is_exact(cache, tmp_path):
    """Row-wise Adagrad: every rank rounds the hot rows alike (identical replicas and state
    after every step), and a run that fails after its checkpoint at step 5, in the middle of
    the window the hot set of step 6 is learned from, resumes to end bit for bit where the run
    left alone does (shards, hot set, rank 0's logger and the rounding streams restored)."""
    cfg = _cfg(cache, "model.table_dtype=fp16", *ADAGRAD_ROWS, sharding="row_wise")
    ranks = run_distributed(_train_recording_hot_rows, 2, cfg, tmp_path / "straight")
    assert ranks[0]["dtype"] == torch.float16
    assert len(ranks[0]["weights"]) == STEPS
    for w0, w1, s0, s1 in zip(ranks[0]["weights"], ranks[1]["weights"], ranks[0]["state"], ranks[1]["state"], strict=True):
        assert torch.equal(w0, w1) and torch.equal(s0, s1)
    before, after = ranks[0]["weights"][4], ranks[0]["weights"][5]  # no re-learning between them
    assert before.numel() and not torch.equal(before, after)  # the hot rows were trained
    failing = _cfg(cache, "model.table_dtype=fp16", *ADAGRAD_ROWS, f"train.checkpoint_every={STOP}", sharding="row_wise")
    with pytest.raises(AssertionError, match="a fault after the checkpoint"):
        run_distributed(_train_failing_after_stop, 2, failing, tmp_path / "split")
    run_distributed(train_on_rank, 2, cfg, tmp_path / "split", True)
    _assert_same_bits(trained_parameters(tmp_path / "split"), trained_parameters(tmp_path / "straight"))
    assert _train_records(tmp_path / "split") == _train_records(tmp_path / "straight")  # losses and fractions, counted on after the resume
    assert _summary(tmp_path / "split")["hotline"] == _summary(tmp_path / "straight")["hotline"]
