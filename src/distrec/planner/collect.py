"""Micro-benchmarks on the real hardware, the training data of the cost models.

Two kinds of samples, appended as JSON lines to one file (resumable: sample ids already in
the file are skipped, and a sample's inputs depend only on the seed and its id):

- ``compute``: forward+backward time (ms, minimum of repeated runs after warm-up) of a multi-table embedding
  lookup on one device, for random tables of the synthetic pool with random dimensions
  that fit one device's memory (on the CPU timed in thread CPU time, see
  ``workload.compute_clock``);
- ``comm``: forward and backward all-to-all time (ms, per device) across D processes for
  random per-device dimension sums and start delays.

Every run first appends a line describing the hardware (``kind: hardware``).
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from distrec.allocator import keep_freed_memory
from distrec.errors import DistrecError
from distrec.planner.cost_models import cost_data_lines
from distrec.planner.launch import intra_op_threads, spawn_group
from distrec.planner.table_pool import DEFAULT_ROW_SCALE, TablePool, dimension_choices, make_table_pool, table_count_range
from distrec.planner.types import BYTES_PER_FLOAT, TableSpec, check_seed
from distrec.planner.workload import THREADS_PER_DEVICE, LookupWorkload, communication_step, compute_ms, measurement_device

_COMPUTE, _COMM = 0, 1  # first words of the per-sample seeds
DELAY_SPREAD_DECADES = 3.0  # comm samples' delay spreads range from max_delay_ms / 1000 to max_delay_ms
MAX_DRAWS_PER_TABLE = 50  # a compute sample stops growing when tables keep not fitting its memory


def hardware_description(device: torch.device, world_sizes: list[int]) -> dict:
    """What the costs were measured on: torch version, CPU model, device type and name."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu
    return {
        "torch": torch.__version__,
        "cpu": cpu,
        "device_type": device.type,
        "device_name": name,
        "world_sizes": sorted(world_sizes),
        "threads_per_device": THREADS_PER_DEVICE,
    }


def check_measurement(batch_size: int, world_sizes: Sequence[int], seed: int, device: str | torch.device | None) -> torch.device:
    """The device the micro-benchmarks of ``world_sizes`` run on; DistrecError, before anything
    is measured or written, for a batch size, seed or device they cannot use."""
    check_seed(seed)
    multiple = math.lcm(*world_sizes)
    if batch_size < 1 or batch_size % multiple:
        raise DistrecError(
            f"--batch-size {batch_size} is not a positive multiple of {multiple} (a batch splits evenly over {' and '.join(map(str, world_sizes))} devices); "
            f"give e.g. --batch-size {multiple * max(1, 4096 // multiple)}"
        )
    return measurement_device(device)


def done_sample_ids(path: Path) -> set[str]:
    """Ids of the samples already in a collect file (an unfinished last line is dropped);
    DistrecError if it is not text."""
    if not path.is_file():
        return set()
    ids = set()
    for line in cost_data_lines(path):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "id" in rec:
            ids.add(rec["id"])
    return ids


def _append(path: Path, record: dict) -> None:
    """Append one JSON line and flush it to disk (a crash loses at most this line)."""
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def _repair_tail(path: Path) -> None:
    """Cut a half-written last line left by an interrupted run."""
    if path.is_file():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            path.write_bytes(data[: data.rfind(b"\n") + 1])


def _sample_rng(seed: int, *key: int) -> np.random.Generator:
    """The random source of one sample: depends only on the seed and the sample's key."""
    return np.random.default_rng([seed, *key])


def compute_sample_tables(pool: TablePool, index: int, seed: int, max_tables: int, max_dim: int, memory: int):
    """The tables of compute sample ``index``: up to ``max_tables`` pool tables with random dims,
    together at most ``memory`` bytes (what one device of a plan can hold).

    Returns:
        (tables, the sample's random generator, to draw its index batches from).
    """
    rng = _sample_rng(seed, _COMPUTE, index)
    dims = np.array(dimension_choices(max_dim))
    count = int(rng.integers(1, max_tables + 1))
    tables: list[TableSpec] = []
    budget = memory
    for _ in range(MAX_DRAWS_PER_TABLE * count):
        if len(tables) == count:
            break
        dim, pid = int(rng.choice(dims)), int(rng.integers(len(pool)))
        size = int(pool.rows[pid]) * dim * BYTES_PER_FLOAT
        if size <= budget:
            tables.append(pool.table(pid, dim, f"s{index}_{len(tables)}_pool{pid}"))
            budget -= size
    return tables, rng


def comm_sample_inputs(index: int, seed: int, world_size: int, max_dim: int, max_delay_ms: float) -> tuple[list[int], list[float]]:
    """Dimension sums and start delays (ms) of comm sample ``index``.

    Like NeuroShard's generator: a random table count, a random largest dimension and dims
    below it (as the tasks of every max-dim setting), assigned to devices by a
    mix of random and least-dimension-first choices (so balance varies), and delays drawn
    below a random spread, shifted so the earliest device starts at 0. The spread is
    log-uniform over three decades below ``max_delay_ms``, so nearly balanced devices (the
    plans the search converges to) are sampled as densely as very unbalanced ones.
    """
    rng = _sample_rng(seed, _COMM, world_size, index)
    lo, hi = table_count_range(world_size)
    task_max_dim = int(rng.choice(dimension_choices(max_dim)))
    dims = np.sort(rng.choice(dimension_choices(task_max_dim), size=int(rng.integers(lo, hi + 1))))[::-1]
    randomness = rng.random()
    sums = np.zeros(world_size, dtype=np.int64)
    for dim in dims:
        device = int(rng.integers(world_size)) if rng.random() < randomness else int(np.argmin(sums))
        sums[device] += dim
    spread = max_delay_ms * 10 ** -rng.uniform(0, DELAY_SPREAD_DECADES)
    delays = rng.uniform(0, spread, size=world_size)
    return sums.tolist(), (delays - delays.min()).round(3).tolist()


def sample_ids(samples: int | Sequence[int]) -> list[int]:
    """The sample ids a count (ids 0 .. count - 1) or an explicit list of ids stands for."""
    return list(range(samples)) if isinstance(samples, int) else sorted(set(int(i) for i in samples))


def run_collect(
    out_path: str | Path,
    compute_samples: int | Sequence[int],
    comm_samples: int | Sequence[int],
    devices: int,
    batch_size: int = 4096,
    seed: int = 0,
    pool_seed: int = 0,
    row_scale: float = DEFAULT_ROW_SCALE,
    max_tables: int = 20,
    max_dim: int = 128,
    max_delay_ms: float = 100.0,
    warmup: int = 2,
    repeats: int = 5,
    device: str | torch.device | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Measure compute and comm samples and append them to ``out_path`` (JSON lines).

    Args:
        out_path: the JSONL file; existing sample ids are kept and skipped.
        compute_samples: compute samples wanted in total (ids compute-0 ...), or the ids wanted.
        comm_samples: comm samples wanted in total for ``devices`` (ids comm{D}-0 ...), or the ids wanted.
        devices: processes of the all-to-all benchmark (the world size D).
        batch_size: samples per batch (a multiple of ``devices``).
        seed: seed of the sample inputs.
        pool_seed, row_scale: the synthetic table pool the tables come from.
        max_tables: most tables in one compute sample.
        max_dim: largest dimension; samples use max_dim, max_dim/2, ... down to 4.
        max_delay_ms: largest start delay between devices in the comm samples.
        warmup, repeats: runs discarded, and runs timed (compute: their minimum; comm: their median).
        device: device type for the benchmarks; defaults to the accelerator, else the CPU.
        progress: show tqdm progress bars (only on a terminal).
        log: gets one line as each kind of sample starts and ends (what, how many, how long).

    Returns:
        The output path.
    """
    dev = check_measurement(batch_size, [devices], seed, device)
    out = Path(out_path)
    done = done_sample_ids(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _repair_tail(out)
    _append(out, {"kind": "hardware", **hardware_description(dev, [devices])})
    show = progress and sys.stderr.isatty()
    pool = make_table_pool(pool_seed, row_scale=row_scale)
    say = log or (lambda line: None)
    wanted = sample_ids(compute_samples)
    todo = [i for i in wanted if f"compute-{i}" not in done]
    with _stage(say, "compute samples (lookups on one device)", len(todo), len(wanted), out):
        if todo:
            keep_freed_memory()  # time the lookups, not the allocator (see distrec.allocator)
            _collect_compute(out, pool, todo, len(wanted), batch_size, seed, max_tables, max_dim, warmup, repeats, dev, show)
    wanted = sample_ids(comm_samples)
    todo = [i for i in wanted if f"comm{devices}-{i}" not in done]
    with _stage(say, f"all-to-all samples on {devices} processes", len(todo), len(wanted), out):
        if todo:
            args = (str(out), todo, len(wanted), batch_size, seed, max_dim, max_delay_ms, warmup, repeats, show)
            spawn_group(_comm_worker, devices, dev.type, args)
    return out


@contextmanager
def _stage(log: Callable[[str], None], what: str, todo: int, wanted: int, out: Path) -> Iterator[None]:
    """Tell ``log`` what a stage measures before it starts and how long it took after it ends."""
    if not wanted:
        yield
        return
    if not todo:
        log(f"{what}: all {wanted} already in {out}")
        yield
        return
    log(f"{what}: measuring {todo} of {wanted}" + (f" ({wanted - todo} already in {out})" if todo < wanted else ""))
    start = time.perf_counter()
    yield
    log(f"{what}: {todo} measured in {time.perf_counter() - start:.1f} s")


def _collect_compute(out, pool, todo, total, batch_size, seed, max_tables, max_dim, warmup, repeats, device, show) -> None:
    with intra_op_threads(THREADS_PER_DEVICE):
        bar = tqdm(total=total, initial=total - len(todo), desc="compute samples", unit="sample", disable=not show)
        for i in todo:
            tables, rng = compute_sample_tables(pool, i, seed, max_tables, max_dim, pool.memory_per_device)
            workload = LookupWorkload(tables, batch_size, device, rng)
            ms = compute_ms(workload.step, device, warmup, repeats)
            _append(out, {"kind": "compute", "id": f"compute-{i}", "batch_size": batch_size, "tables": [t.to_dict() for t in tables], "ms": ms})
            bar.update()
        bar.close()


def time_all_to_alls(dim_sums: list[int], delay_ms: float, batch_size: int, device: torch.device, warmup: int, repeats: int) -> tuple[float, float]:
    """This rank's median forward and backward all-to-all times (ms) after starting ``delay_ms`` late.

    Every rank calls it with the same ``dim_sums``. Each step is laid out as the plan
    executor's: a barrier, the delay (standing for this rank's compute), then
    ``communication_step``; the forward time runs from this rank's delayed start, so it
    includes waiting for later ranks.
    """
    rank = dist.get_rank()
    pooled = torch.randn(batch_size, dim_sums[rank], device=device)
    times = []
    for _ in range(warmup + repeats):
        dist.barrier()
        time.sleep(delay_ms / 1e3)
        times.append(communication_step(pooled, dim_sums, rank, device)[1:])
    fw, bw = np.median(np.array(times[warmup:]), axis=0)
    return float(fw), float(bw)


def _comm_worker(rank, world, device, out, todo, total, batch_size, seed, max_dim, max_delay_ms, warmup, repeats, show) -> None:
    bar = tqdm(total=total, initial=total - len(todo), desc=f"comm samples ({world} devices)", unit="sample", disable=not (show and rank == 0))
    for i in todo:
        dims, delays = comm_sample_inputs(i, seed, world, max_dim, max_delay_ms)
        mine = torch.tensor(time_all_to_alls(dims, delays[rank], batch_size, device, warmup, repeats), device=device)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        if rank == 0:
            times = torch.stack(every).cpu().tolist()
            _append(
                Path(out),
                {
                    "kind": "comm",
                    "id": f"comm{world}-{i}",
                    "world_size": world,
                    "batch_size": batch_size,
                    "dim_sums": dims,
                    "delays_ms": delays,
                    "fw_ms": [t[0] for t in times],
                    "bw_ms": [t[1] for t in times],
                },
            )
            bar.update()
    bar.close()
