"""Micro-benchmark collection with real gloo processes, and the all-to-all it times."""

import json
import subprocess
import sys

import torch

from distrec.planner.collect import compute_sample_tables, run_collect
from distrec.planner.launch import spawn_group
from distrec.planner.table_pool import make_table_pool
from distrec.planner.workload import backward_all_to_all, forward_all_to_all

TINY = dict(batch_size=64, max_tables=3, max_dim=16, warmup=1, repeats=2, progress=False)


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_collect_writes_resumable_jsonl_with_two_gloo_processes(tmp_path):
    out = tmp_path / "costs.jsonl"
    run_collect(out, compute_samples=2, comm_samples=2, devices=2, **TINY)
    first = records(out)
    kinds = [r["kind"] for r in first]
    assert kinds.count("hardware") == 1 and kinds.count("compute") == 2 and kinds.count("comm") == 2
    for r in first:
        if r["kind"] == "compute":
            assert r["ms"] > 0 and 1 <= len(r["tables"]) <= 3 and r["batch_size"] == 64
        if r["kind"] == "comm":
            assert r["world_size"] == 2 and len(r["fw_ms"]) == len(r["bw_ms"]) == 2 and min(r["fw_ms"] + r["bw_ms"]) > 0
            assert min(r["delays_ms"]) == 0 and all(d % 4 == 0 for d in r["dim_sums"])
    with out.open("a") as f:
        f.write('{"kind": "compute", "id": "compute-9", "ms"')  # an interrupted write
    run_collect(out, compute_samples=3, comm_samples=2, devices=2, **TINY)
    second = records(out)
    ids = [r["id"] for r in second if "id" in r]
    assert sorted(ids) == ["comm2-0", "comm2-1", "compute-0", "compute-1", "compute-2"]
    assert second[: len(first)] == first  # earlier samples are kept as they were


def test_a_collection_run_leaves_no_semaphore_for_the_parent_to_warn_about(tmp_path):
    """Its processes end by os._exit; a multiprocessing lock they made (tqdm's) would stay
    registered, and the parent's resource tracker would warn of leaked semaphores at exit."""
    code = f"from distrec.planner.collect import run_collect; run_collect({str(tmp_path / 'c.jsonl')!r}, 0, 1, 2, **{TINY!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr, done.stderr


def test_compute_samples_depend_only_on_seed_and_id():
    pool = make_table_pool(seed=0)
    a, _ = compute_sample_tables(pool, 5, seed=1, max_tables=10, max_dim=64, memory=pool.memory_per_device)
    b, _ = compute_sample_tables(pool, 5, seed=1, max_tables=10, max_dim=64, memory=pool.memory_per_device)
    c, _ = compute_sample_tables(pool, 6, seed=1, max_tables=10, max_dim=64, memory=pool.memory_per_device)
    assert a == b and a != c
    assert all(t.num_bytes <= pool.memory_per_device for t in a)


def _check_all_to_all(rank, world, device):
    for dims in ([3, 5], [0, 5]):  # a rank may hold no tables
        batch = 4 * world
        # entry (sample, column) of rank r's pooled output encodes all three
        pooled = torch.arange(batch * dims[rank], dtype=torch.float32).view(batch, dims[rank]) + 1000 * rank
        out = forward_all_to_all(pooled, dims)
        local = batch // world
        assert out.shape == (local, sum(dims))
        start = 0
        for src, d in enumerate(dims):
            expected = torch.arange(batch * d, dtype=torch.float32).view(batch, d)[rank * local : (rank + 1) * local] + 1000 * src
            assert torch.equal(out[:, start : start + d], expected)
            start += d
        assert torch.equal(backward_all_to_all(out, dims, rank), pooled)


def test_all_to_all_layout_and_round_trip():
    spawn_group(_check_all_to_all, 2, "cpu")
