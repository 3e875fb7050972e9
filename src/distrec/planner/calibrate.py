"""``distrec plan calibrate``: this machine's micro-benchmarks within a time budget, then the cost models.

1. Pilot: a few compute samples, and per world size two short all-to-all runs (their
   difference separates the cost of one sample from that of starting D processes), time
   one sample of each kind here.
2. Counts: of the budget left after the pilot, ``TRAIN_SHARE`` is kept for training; half
   of the rest buys compute samples and half all-to-all samples, shared evenly by the world
   sizes. The counts and the time estimate are printed before anything long starts.
3. Active sampling: the first ``RANDOM_SHARE`` of each count are random samples (ids
   0, 1, ...). Quick models are then trained from ``QUICK_SEEDS`` initialisations. The
   random samples' own timing re-prices a sample (a dozen pilot samples include warm-up, so
   they price it too high), and the collection budget left buys the rest, split as in 2:
   the candidates (``CANDIDATES_PER_SAMPLE`` fresh random samples per slot) whose predicted
   cost the quick models disagree on most (the relative spread of their predictions): where
   the data teaches the models least so far.
4. The final models are trained on everything; each model's held-out (test split) error is
   reported.

Sample ids are those of ``distrec plan collect`` (the inputs depend only on the seed and the
id), so a calibration is resumable and its data can be extended by ``collect``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distrec.errors import DistrecError
from distrec.planner.collect import check_measurement, comm_sample_inputs, compute_sample_tables, done_sample_ids, run_collect
from distrec.planner.cost_models import CostModels, train_cost_models
from distrec.planner.table_pool import make_table_pool

PILOT_COMPUTE = 12
PILOT_COMM = (4, 12)  # two all-to-all runs per world size: 12 - 4 samples price one sample
TRAIN_SHARE = 0.15
RANDOM_SHARE = 0.5
QUICK_SEEDS = 3
QUICK_EPOCHS, QUICK_PATIENCE = 300, 25
CANDIDATES_PER_SAMPLE = 4
MIN_COMPUTE, MIN_COMM = 40, 20  # fewer samples do not train a model worth planning with
MAX_DELAY_MS = 100.0  # as run_collect's default
MAX_TABLES = 20  # as run_collect's default


@dataclass(frozen=True)
class SampleCosts:
    """Seconds one sample takes here: a compute sample, and per world size an all-to-all
    sample plus the fixed cost of one collection run (starting its D processes)."""

    compute_s: float
    comm_s: dict[int, float]
    comm_start_s: dict[int, float]


@dataclass(frozen=True)
class SampleCounts:
    """How many samples a budget buys: compute samples, all-to-all samples per world size,
    and the estimated seconds of collecting them and of training."""

    compute: int
    comm: dict[int, int]
    collect_s: float
    train_s: float


def sample_counts(budget_s: float, costs: SampleCosts, spent_s: float = 0.0) -> SampleCounts:
    """The counts the ``budget_s - spent_s`` seconds left buy (see the module doc); DistrecError
    naming a sufficient budget if they are below the minimums.

    Example:
        >>> sample_counts(600, SampleCosts(0.5, {4: 1.0, 8: 2.0}, {4: 5.0, 8: 8.0})).comm
        {4: 117, 8: 55}
    """
    world_sizes = sorted(costs.comm_s)
    train_s = TRAIN_SHARE * budget_s
    collect_s = budget_s - spent_s - train_s
    compute = int(collect_s / 2 / costs.compute_s)
    share = collect_s / 2 / len(world_sizes)
    comm = {d: int((share - 2 * costs.comm_start_s[d]) / costs.comm_s[d]) for d in world_sizes}  # two runs: random, then chosen
    short = [f"{max(compute, 0)} compute"] if compute < MIN_COMPUTE else []
    short += [f"{max(n, 0)} all-to-all ({d} devices)" for d, n in comm.items() if n < MIN_COMM]
    if short:
        per_sample = [2 * MIN_COMPUTE * costs.compute_s] + [
            len(world_sizes) * 2 * (MIN_COMM * costs.comm_s[d] + 2 * costs.comm_start_s[d]) for d in world_sizes
        ]
        needed = (spent_s + max(per_sample)) / (1 - TRAIN_SHARE)
        bought = "is too small for one sample here" if max(compute, *comm.values()) < 1 else f"buys only {', '.join(short)} samples here"
        raise DistrecError(
            f"a budget of {budget_s / 60:.2g} min {bought}; give --budget-minutes {np.ceil(needed / 60):.0f} or more, for the {MIN_COMPUTE} compute "
            f"and {MIN_COMM} all-to-all samples per world size the models need (the samples measured so far are kept)"
        )
    spent = compute * costs.compute_s + sum(n * costs.comm_s[d] + 2 * costs.comm_start_s[d] for d, n in comm.items())
    return SampleCounts(compute, comm, spent, train_s)


def most_uncertain(candidates: list[int], predictions: np.ndarray, count: int) -> list[int]:
    """The ``count`` candidate ids whose predictions [models, candidates] spread most
    (standard deviation over the models relative to their mean)."""
    mean = np.abs(predictions.mean(axis=0)).clip(min=1e-6)
    spread = predictions.std(axis=0) / mean
    order = np.argsort(-spread, kind="stable")
    return sorted(candidates[i] for i in order[:count])


def compute_predictions(models: list[CostModels], ids: list[int], seed: int, max_dim: int) -> np.ndarray:
    """Each model's predicted lookup time (ms) of the compute samples ``ids``: [models, ids]."""
    pool = make_table_pool(0)
    tables = [compute_sample_tables(pool, i, seed, MAX_TABLES, max_dim, pool.memory_per_device)[0] for i in ids]
    out = np.zeros((len(models), len(ids)))
    for m, model in enumerate(models):
        predictor = model.predictor(next(iter(model.comm)))
        for j, ts in enumerate(tables):
            out[m, j] = predictor.device_compute(predictor.embed(ts).sum(axis=0))[0] if ts else 0.0
    return out


def comm_predictions(models: list[CostModels], devices: int, ids: list[int], seed: int, max_dim: int) -> np.ndarray:
    """Each model's predicted all-to-all time (ms, summed over devices and directions) of the
    all-to-all samples ``ids`` on ``devices`` devices, their start delays standing for compute: [models, ids]."""
    inputs = [comm_sample_inputs(i, seed, devices, max_dim, MAX_DELAY_MS) for i in ids]
    out = np.zeros((len(models), len(ids)))
    for m, model in enumerate(models):
        predictor = model.predictor(devices)
        for j, (dims, delays) in enumerate(inputs):
            costs = predictor.plan_costs(np.array(delays), np.array(dims))
            out[m, j] = float((costs["fw_comm"] + costs["bw_comm"]).sum())
    return out


def calibrate(
    out_dir: Path,
    devices: list[int],
    budget_minutes: float,
    batch_size: int = 4096,
    max_dim: int = 128,
    seed: int = 0,
    device: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[CostModels, SampleCounts]:
    """Collect micro-benchmarks for ``devices`` within about ``budget_minutes`` and train the cost models.

    Writes ``out_dir/costs.jsonl`` and ``out_dir/cost_models.pt``; ``log`` gets the progress
    lines. Returns the models (their ``metrics`` hold the held-out errors) and the counts.
    """
    from distrec.planner.store import COST_DATA_FILE, COST_MODELS_FILE

    if min(devices) < 2:
        raise DistrecError(f"calibrate plans for --devices {' '.join(map(str, devices))}; give world sizes of at least 2")
    if not 0 < budget_minutes < math.inf:
        raise DistrecError(f"--budget-minutes {budget_minutes} is not a time to spend; give a positive number of minutes, e.g. 15")
    dev = check_measurement(batch_size, devices, seed, device).type
    start = time.perf_counter()
    data = out_dir / COST_DATA_FILE

    def collect(compute, comm, d):
        run_collect(data, compute, comm, d, batch_size=batch_size, seed=seed, max_dim=max_dim, device=dev, progress=progress)

    log(f"[1/4] pilot: timing {PILOT_COMPUTE} compute samples and {PILOT_COMM[1]} all-to-all samples per world size ({', '.join(map(str, devices))} devices)")
    costs = _pilot(collect, data, devices)
    counts = sample_counts(budget_minutes * 60, costs, time.perf_counter() - start)
    comm_text = ", ".join(f"{n} on {d} devices ({costs.comm_s[d]:.2f} s each)" for d, n in counts.comm.items())
    log(
        f"      this machine: {counts.compute} compute samples ({costs.compute_s:.2f} s each) and all-to-all samples {comm_text}; "
        f"about {counts.collect_s / 60:.1f} min of measuring and {counts.train_s / 60:.1f} min of training, "
        f"done in about {(time.perf_counter() - start + counts.collect_s + counts.train_s) / 60:.0f} min"
    )
    random_compute = max(PILOT_COMPUTE, int(RANDOM_SHARE * counts.compute))
    random_comm = {d: max(PILOT_COMM[1], int(RANDOM_SHARE * n)) for d, n in counts.comm.items()}
    log(f"[2/4] measuring {random_compute} random compute samples and {', '.join(f'{n} on {d} devices' for d, n in random_comm.items())}")
    costs = _measure_random(collect, data, devices, random_compute, random_comm, costs)
    log(f"[3/4] training {QUICK_SEEDS} quick models; measuring the samples they disagree on most")
    quick = [train_cost_models(data, None, seed=seed + k, epochs=QUICK_EPOCHS, patience=QUICK_PATIENCE, verbose=False) for k in range(QUICK_SEEDS)]
    chosen_compute, chosen_comm = chosen_counts(budget_minutes * 60 - counts.train_s - (time.perf_counter() - start), costs)
    log(
        f"      a sample took {costs.compute_s:.2f} s (compute) and {', '.join(f'{costs.comm_s[d]:.2f} s on {d} devices' for d in devices)}; "
        f"the budget left buys {chosen_compute} compute samples and {', '.join(f'{n} on {d} devices' for d, n in chosen_comm.items())}"
    )
    chosen = _choose(quick, chosen_compute, random_compute, lambda ids: compute_predictions(quick, ids, seed, max_dim))
    collect(chosen, 0, devices[0])
    for d in devices:
        chosen = _choose(quick, chosen_comm[d], random_comm[d], lambda ids, d=d: comm_predictions(quick, d, ids, seed, max_dim))
        collect(0, chosen, d)
    log("[4/4] training the cost models on all samples")
    models = train_cost_models(data, out_dir / COST_MODELS_FILE, seed=seed)
    measured = SampleCounts(
        random_compute + chosen_compute, {d: random_comm[d] + chosen_comm[d] for d in devices}, time.perf_counter() - start - counts.train_s, counts.train_s
    )
    return models, measured


def chosen_counts(left_s: float, costs: SampleCosts) -> tuple[int, dict[int, int]]:
    """The chosen (active) samples ``left_s`` seconds of measuring buy: half compute samples,
    half all-to-all samples shared evenly by the world sizes (one collection run each).

    Example:
        >>> chosen_counts(120, SampleCosts(0.5, {4: 1.0, 8: 2.0}, {4: 5.0, 8: 8.0}))
        (120, {4: 25, 8: 11})
    """
    share = max(left_s, 0.0) / 2 / len(costs.comm_s)
    comm = {d: max(int((share - costs.comm_start_s[d]) / costs.comm_s[d]), 0) for d in sorted(costs.comm_s)}
    return max(int(left_s / 2 / costs.compute_s), 0), comm


def _measure_random(collect: Callable, data: Path, devices: list[int], compute: int, comm: dict[int, int], pilot: SampleCosts) -> SampleCosts:
    """Measure the first ``compute`` and ``comm[d]`` random samples; the seconds per sample
    they took (the pilot's where a run measured nothing new, e.g. when resuming)."""

    def new_samples(prefix: str) -> int:
        return sum(i.startswith(prefix) for i in done_sample_ids(data))

    def timed(prefix: str, run: Callable[[], None], start_s: float, fallback: float) -> float:
        before, t = new_samples(prefix), time.perf_counter()
        run()
        count = new_samples(prefix) - before
        return max(time.perf_counter() - t - start_s, 0.0) / count if count else fallback

    compute_s = timed("compute-", lambda: collect(compute, 0, devices[0]), 0.0, pilot.compute_s)
    comm_s = {d: timed(f"comm{d}-", lambda d=d: collect(0, comm[d], d), pilot.comm_start_s[d], pilot.comm_s[d]) for d in devices}
    return SampleCosts(compute_s, {d: s or pilot.comm_s[d] for d, s in comm_s.items()}, pilot.comm_start_s)


def _pilot(collect: Callable, data: Path, devices: list[int]) -> SampleCosts:
    """Time pilot samples of ids not measured yet (they stay in the data)."""
    t = time.perf_counter()
    collect(_fresh_ids(data, "compute-", PILOT_COMPUTE), 0, devices[0])
    compute_s = (time.perf_counter() - t) / PILOT_COMPUTE
    new = (PILOT_COMM[0], PILOT_COMM[1] - PILOT_COMM[0])  # samples each of the two runs measures
    comm_s, start_s = {}, {}
    for d in devices:
        runs = []
        for count in new:
            t = time.perf_counter()
            collect(0, _fresh_ids(data, f"comm{d}-", count), d)
            runs.append(time.perf_counter() - t)
        extra = runs[1] - runs[0]  # start-up cancels: (start + 8 samples) - (start + 4 samples)
        comm_s[d] = extra / (new[1] - new[0]) if extra > 0 else runs[1] / new[1]  # load noise: all of it per sample
        start_s[d] = max(runs[0] - new[0] * comm_s[d], 0.0)
    return SampleCosts(compute_s, comm_s, start_s)


def _fresh_ids(data: Path, prefix: str, count: int) -> list[int]:
    """The first ``count`` sample ids whose ``prefix``-id is not in the data yet."""
    done = done_sample_ids(data)
    fresh: list[int] = []
    i = 0
    while len(fresh) < count:
        if f"{prefix}{i}" not in done:
            fresh.append(i)
        i += 1
    return fresh


def _choose(quick: list[CostModels], count: int, first_id: int, predict: Callable[[list[int]], np.ndarray]) -> list[int]:
    """``count`` ids among ``CANDIDATES_PER_SAMPLE * count`` fresh ones from ``first_id`` on, most uncertain first."""
    if count <= 0:
        return []
    candidates = list(range(first_id, first_id + CANDIDATES_PER_SAMPLE * count))
    return most_uncertain(candidates, predict(candidates), count)


def describe_errors(models: CostModels) -> dict[str, dict[str, float]]:
    """Each model's held-out error: test R^2, median relative error and MSE (ms^2)."""
    return {
        name: {"r2": m["test_r2"], "median_relative_error": m["test_median_relative_error"], "mse_ms2": m["test_mse"]} for name, m in models.metrics.items()
    }
