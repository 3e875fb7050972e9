"""Training throughput of distrec against TorchRec's DistributedModelParallel, side by side.

The workload: 26 tables x 100,000 rows x dim 64, 13 dense features, bottom MLP
13-512-256-64, top MLP 512-256-1, dot interaction, 2,048 samples per process per step,
``--pooling-factor`` indices per bag drawn uniformly (``--distribution zipf``: Zipf, exponent
1.05), SGD lr 0.01 (``--optimizer adagrad``: Adagrad for the dense layers and row-wise Adagrad
for the embeddings, TorchRec's ``EXACT_ROWWISE_ADAGRAD``). Every table is sharded table-wise
on both sides, so the comparison is of the implementations, not of the planners.

- distrec trains through ``distrec train`` (``--nproc-per-node`` N for N processes); its
  step time is the sum of the component means of the run's ``breakdown.json``.
- TorchRec (1.8, with FBGEMM's fused CPU kernels) trains the same model, wrapped in
  ``DistributedModelParallel``, on the same synthetic rows (written once by distrec's
  generator, read by the worker), in a worker run by ``--torchrec-python`` (default: this
  interpreter) with N processes on a gloo group; its step time is the mean over the same
  steps (after the same 5 warm-up steps), each timed by the harness's clock for the device.
  TorchRec is never imported by distrec itself.

Each round runs every configuration once on each side, the two back to back (the side that
goes first alternating); rounds repeat, the median over rounds is reported, so both sides are
measured under the same machine load. Throughput is the global batch (2,048 x processes) over
the step time. The last line printed is the harness's result record: one system per side and
configuration (samples/s per round), ``ratio`` when one configuration was measured, and
``results``, which hold, per configuration, the keys
``pooling_factor``, ``procs``, ``optimizer``, ``distrec_samples_per_s``,
``torchrec_samples_per_s`` and ``ratio`` (distrec over TorchRec: the ratio of the medians),
and ``round_ratios`` (each round's two runs) with their median ``median_round_ratio``. The
machine's speed drifts over minutes, so the ratio of medians can pair distrec's median round
with another round's TorchRec; a round's two runs share their load.

With ``--profile`` each result also holds, per round, distrec's step components
(``distrec_components_ms``, from ``breakdown.json``) and the self CPU ms per step of
TorchRec's FBGEMM operators (``torchrec_fbgemm_ms``, rank 0 under ``torch.profiler``, which
slows TorchRec's timed steps: read its samples/s from a run without it).

Usage:
    python benchmarks/vs_torchrec.py --torchrec-python ../venv-torchrec/bin/python
    python benchmarks/vs_torchrec.py --pooling-factor 20 --procs 1 --optimizer adagrad --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import harness

INSTALL_HINT = (
    "TorchRec is not importable by {python}; install it into its own environment with "
    "../shared/peers/README.md's recipe (torch==2.13.0 fbgemm-gpu-cpu==1.8.0, then torchrec==1.8.0 --no-deps "
    "and its small deps) and pass --torchrec-python VENV/bin/python"
)
WARMUP_STEPS = 5  # distrec's StepTimer skips as many
ZIPF_EXPONENT = 1.05
BATCHES_PER_RANK = 8  # distinct batches the TorchRec worker cycles through


@dataclass(frozen=True)
class Workload:
    """One configuration (units: samples, rows, floats)."""

    pooling_factor: int
    procs: int
    optimizer: str
    distribution: str
    steps: int
    batch_size: int = 2048  # per process
    num_tables: int = 26
    table_rows: int = 100_000
    dim: int = 64
    num_dense: int = 13
    lr: float = 0.01
    seed: int = 1234
    device: str = "cpu"  # "cuda": every process on its own GPU, NCCL, FBGEMM's GPU kernels on TorchRec's side

    @property
    def zipf_exponent(self) -> float:
        return ZIPF_EXPONENT if self.distribution == "zipf" else 0.0

    @property
    def label(self) -> str:
        return f"pooling {self.pooling_factor}, {self.procs} proc, {self.optimizer}"


# --- distrec ---------------------------------------------------------------------------
def distrec_overrides(w: Workload) -> list[str]:
    """``--set`` arguments of ``distrec train`` for the workload (enough rows for ``steps`` steps)."""
    global_batch = w.batch_size * w.procs
    items = [
        f"data.synthetic.rows={global_batch * (w.steps + 2)}",
        f"data.synthetic.num_sparse={w.num_tables}",
        f"data.synthetic.num_dense={w.num_dense}",
        f"data.synthetic.table_rows={w.table_rows}",
        f"data.synthetic.zipf_exponent={w.zipf_exponent}",
        f"data.synthetic.pooling_factor={w.pooling_factor}",
        f"data.synthetic.seed={w.seed}",
        f"data.max_ind_range={w.table_rows}",
        "data.split=random:0.01",
        f"model.embedding_dim={w.dim}",
        "model.bottom_mlp=[512,256]",
        "model.top_mlp=[512,256]",
        "model.interaction=dot",
        f"train.batch_size={global_batch}",
        f"train.max_steps={w.steps}",
        f"train.optimizer={w.optimizer}",
        f"train.lr={w.lr}",
    ]
    return harness.set_items(items)


def run_distrec(w: Workload, out: Path) -> tuple[float, dict[str, float]]:
    """Train ``w`` with ``distrec train``; samples/s and the step's components (ms, rank 0's
    ``breakdown.json`` means, those above 0.5 ms)."""
    sharding = ["--sharding", "table_wise"] if w.procs > 1 else []
    hidden = {"CUDA_VISIBLE_DEVICES": ""} if w.device == "cpu" else {}  # distrec trains on a GPU whenever it sees one
    run = harness.distrec_train(
        out / f"distrec-{w.pooling_factor}-{w.procs}-{w.optimizer}-{time.monotonic_ns()}",
        [*distrec_overrides(w), *sharding],
        w.procs,
        cache_dir=out / "cache",
        env=hidden,
    )
    shutil.rmtree(run.out / "checkpoint", ignore_errors=True)  # about 1 GB per run: 16 of them filled a disk
    components = run.breakdown["components"]
    step_ms = run.step_ms(list(components))
    return w.batch_size * w.procs / step_ms * 1e3, {k: round(c["mean_ms"], 1) for k, c in components.items() if c["mean_ms"] > 0.5}


def write_rows(w: Workload, path: Path) -> None:
    """The workload's synthetic rows (distrec's generator), as the TorchRec worker reads them."""
    import numpy as np

    from distrec.config import SyntheticConfig
    from distrec.data.synthetic import SyntheticGenerator

    n = w.batch_size * w.procs * BATCHES_PER_RANK
    cfg = SyntheticConfig(
        rows=n,
        num_dense=w.num_dense,
        num_sparse=w.num_tables,
        table_rows=w.table_rows,
        zipf_exponent=w.zipf_exponent,
        pooling_factor=w.pooling_factor,
        seed=w.seed,
    )
    chunk = SyntheticGenerator(cfg).generate(0, n)
    # distrec's log transform is already in the generated dense columns; ids lie in [1, table_rows)
    ids = np.stack([values.reshape(n, w.pooling_factor) for values, _ in chunk.sparse], axis=1)  # [n, F, P]
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, dense=chunk.dense, labels=chunk.labels, ids=ids)
    tmp.replace(path)


# --- TorchRec (runs in the worker, under --torchrec-python) -------------------------------
def torchrec_worker(rank: int, w: Workload, rows_path: str, port: int, result_path: str, profile: bool) -> None:
    """One TorchRec process: build the DLRM, shard it table-wise with DMP, time the steps
    (with ``profile``, rank 0's under ``torch.profiler``: its FBGEMM operators' ms per step)."""
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import torchrec
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.models.dlrm import DLRM
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // w.procs))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if w.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=w.procs)
    torch.manual_seed(w.seed)
    names = [f"t{i}" for i in range(w.num_tables)]
    tables = [torchrec.EmbeddingBagConfig(name=n, embedding_dim=w.dim, num_embeddings=w.table_rows, feature_names=[n]) for n in names]
    ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=w.num_dense,
        dense_arch_layer_sizes=[512, 256, w.dim],
        over_arch_layer_sizes=[512, 256, 1],
        dense_device=device,
    )
    if w.optimizer == "sgd":
        apply_optimizer_in_backward(torch.optim.SGD, model.sparse_arch.parameters(), {"lr": w.lr})
    else:  # fused as EXACT_ROWWISE_ADAGRAD
        apply_optimizer_in_backward(RowWiseAdagrad, model.sparse_arch.parameters(), {"lr": w.lr})
    constraints = {n: ParameterConstraints(sharding_types=["table_wise"]) for n in names}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=w.procs, compute_device=device.type), constraints=constraints)
    plan = planner.collective_plan(model, None, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=device, plan=plan)
    dense_kind = torch.optim.SGD if w.optimizer == "sgd" else torch.optim.Adagrad
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda params: dense_kind(params, lr=w.lr, fused=True))
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense])

    data = np.load(rows_path)
    b = w.batch_size
    batches = []
    for i in range(BATCHES_PER_RANK):
        start = (i * w.procs + rank) * b
        ids = torch.from_numpy(data["ids"][start : start + b])  # [B, F, P]
        kjt = torchrec.KeyedJaggedTensor.from_lengths_sync(
            keys=names,
            values=ids.permute(1, 0, 2).reshape(-1).contiguous(),
            lengths=torch.full((w.num_tables * b,), w.pooling_factor, dtype=torch.int32),
        )
        dense_x, labels = torch.from_numpy(data["dense"][start : start + b]), torch.from_numpy(data["labels"][start : start + b])
        batches.append((dense_x.to(device), kjt.to(device), labels.to(device)))

    def train_step(i: int) -> None:
        dense_x, kjt, labels = batches[i % len(batches)]
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(dmp(dense_x, kjt).squeeze(1), labels)
        loss.backward()
        optimizer.step()

    def step(i: int) -> float:
        """One training step on batch ``i``; its ms."""
        return harness.timed_ms(lambda: train_step(i), device)[1]

    for i in range(WARMUP_STEPS):
        step(i)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile and rank == 0 else contextlib.nullcontext()
    with profiler:
        ms = [step(i) for i in range(WARMUP_STEPS, w.steps)]
    if rank == 0:
        ops = {}
        if profile:
            per_step = {e.key: e.self_cpu_time_total / 1e3 / len(ms) for e in profiler.key_averages() if e.key.startswith("fbgemm::")}
            ops = {name: round(t, 1) for name, t in per_step.items() if t >= 0.05}
        Path(result_path).write_text(json.dumps({"step_ms": sum(ms) / len(ms), "fbgemm_ms": ops}))
    dist.barrier()
    dist.destroy_process_group()


def torchrec_main(spec: str) -> None:
    """Entry of the worker process: spawn ``procs`` TorchRec processes, print samples/s."""
    import torch.multiprocessing as mp

    job = json.loads(spec)
    w = Workload(**job["workload"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        mp.spawn(torchrec_worker, args=(w, job["rows"], port, str(result), job["profile"]), nprocs=w.procs, join=True)
        measured = json.loads(result.read_text())
    print(json.dumps({"samples_per_s": w.batch_size * w.procs / measured["step_ms"] * 1e3, "fbgemm_ms": measured["fbgemm_ms"]}))


def run_torchrec(w: Workload, python: str, rows: Path, profile: bool) -> tuple[float, dict[str, float]]:
    """Train ``w`` with TorchRec DMP in a worker under ``python``; its samples/s and (with
    ``profile``) its FBGEMM operators' self CPU ms per step on rank 0."""
    spec = {"workload": asdict(w), "rows": str(rows), "profile": profile}
    env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // w.procs))}
    measured = harness.run_worker(__file__, spec, env=env, python=python)
    return measured["samples_per_s"], measured["fbgemm_ms"]


def torchrec_importable(python: str) -> bool:
    done = subprocess.run([python, "-c", "import torchrec, fbgemm_gpu"], capture_output=True, text=True)
    return done.returncode == 0


def summarize(speeds: dict[Workload, dict[str, list[float]]], parts: dict[Workload, dict[str, list[dict[str, float]]]], profile: bool) -> list[dict]:
    """Per configuration: both sides' medians over the rounds, the ratio of the medians, each
    round's ratio (its two runs ran back to back, so the ratio cancels the machine's drift)
    and their median, every round's samples/s and (with ``profile``) where each step went."""
    results = []
    for w, s in speeds.items():
        d, t = harness.Samples(s["distrec"]).median, harness.Samples(s["torchrec"]).median
        round_ratios = [a / b for a, b in zip(s["distrec"], s["torchrec"])]
        results.append(
            {
                "pooling_factor": w.pooling_factor,
                "procs": w.procs,
                "optimizer": w.optimizer,
                "distrec_samples_per_s": round(d),
                "torchrec_samples_per_s": round(t),
                "ratio": round(d / t, 3),
                "median_round_ratio": round(harness.Samples(round_ratios).median, 3),
                "round_ratios": [round(x, 3) for x in round_ratios],
                "distrec_rounds": [round(x) for x in s["distrec"]],
                "torchrec_rounds": [round(x) for x in s["torchrec"]],
                **({"distrec_components_ms": parts[w]["distrec"], "torchrec_fbgemm_ms": parts[w]["torchrec"]} if profile else {}),
            }
        )
    return results


def record(speeds: dict[Workload, dict[str, list[float]]], results: list[dict], config: dict) -> harness.ResultRecord:
    """The result record: one system per side and configuration, its samples/s per round."""
    systems = [
        harness.SystemResult(f"{side} ({w.label})", "throughput", "samples/s", harness.Samples(s[side]))
        for w, s in speeds.items()
        for side in ("distrec", "torchrec")
    ]
    ratio = results[0]["ratio"] if len(results) == 1 else None
    return harness.ResultRecord("vs_torchrec", systems, ratio, {"config": config, "distribution": config["distribution"], "results": results})


# --- the comparison ----------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pooling-factor", type=int, nargs="+", default=[1, 20], help="indices per bag (default 1 20)")
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2], help="processes (default 1 2)")
    parser.add_argument("--optimizer", choices=["sgd", "adagrad"], nargs="+", default=["sgd", "adagrad"])
    parser.add_argument("--distribution", choices=["uniform", "zipf"], default="uniform", help=f"index distribution (zipf: exponent {ZIPF_EXPONENT})")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported (default 3)")
    parser.add_argument("--steps", type=int, default=20, help=f"training steps per run, the first {WARMUP_STEPS} untimed (default 20)")
    parser.add_argument("--torchrec-python", default=sys.executable, help="python of an environment with TorchRec (default: this one)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="train both sides on the CPU (default) or one GPU per process (NCCL)")
    parser.add_argument("--out", help="folder for the runs and data (default: a temporary folder)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also report where each side's step goes: distrec's breakdown.json, TorchRec's FBGEMM operators under torch.profiler (slows TorchRec's timed steps)",
    )
    parser.add_argument(harness.WORKER_FLAG, dest="worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        torchrec_main(args.worker)
        return
    if not torchrec_importable(args.torchrec_python):
        print(INSTALL_HINT.format(python=args.torchrec_python), file=sys.stderr)
        raise SystemExit(2)
    if args.steps <= WARMUP_STEPS:
        raise SystemExit(f"--steps must exceed the {WARMUP_STEPS} warm-up steps")

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        workloads = [
            Workload(p, n, o, args.distribution, args.steps, device=args.device) for p in args.pooling_factor for n in args.procs for o in args.optimizer
        ]
        rows = {}
        for w in workloads:
            key = (w.pooling_factor, w.procs)
            if key not in rows:
                rows[key] = out / f"rows-{w.distribution}-{w.pooling_factor}-{w.procs}.npz"
                write_rows(w, rows[key])
        speeds: dict[Workload, dict[str, list[float]]] = {w: {"distrec": [], "torchrec": []} for w in workloads}
        parts: dict[Workload, dict[str, list[dict[str, float]]]] = {w: {"distrec": [], "torchrec": []} for w in workloads}

        def side(w: Workload, name: str):
            def run(r: int) -> None:
                if name == "distrec":
                    speed, components = run_distrec(w, out)
                else:
                    speed, components = run_torchrec(w, args.torchrec_python, rows[(w.pooling_factor, w.procs)], args.profile)
                speeds[w][name].append(speed)
                parts[w][name].append(components)

            return run

        def report(r: int) -> None:
            for w in workloads:
                d, t = speeds[w]["distrec"][-1], speeds[w]["torchrec"][-1]
                print(f"round {r + 1}/{args.rounds} {w.label:<28} distrec {d:9,.0f}  torchrec {t:9,.0f}  ratio {d / t:5.2f}", flush=True)

        # a round runs each configuration's two sides back to back, the side that goes first alternating
        turns = {f"{name} {w.label}": side(w, name) for w in workloads for name in ("distrec", "torchrec")}
        harness.interleaved_rounds(turns, args.rounds, after_round=report, order="alternate")

    results = summarize(speeds, parts, args.profile)
    print(f"\n{'pooling':>7} {'procs':>5} {'optimizer':>9} {'distrec/s':>10} {'torchrec/s':>10} {'ratio':>6} {'of rounds':>9}")
    for r in results:
        print(
            f"{r['pooling_factor']:>7} {r['procs']:>5} {r['optimizer']:>9} {r['distrec_samples_per_s']:>10,} {r['torchrec_samples_per_s']:>10,} "
            f"{r['ratio']:>6.2f} {r['median_round_ratio']:>9.2f}"
        )
    harness.finish(record(speeds, results, {k: v for k, v in vars(args).items() if k != "worker"}))


if __name__ == "__main__":
    main()
