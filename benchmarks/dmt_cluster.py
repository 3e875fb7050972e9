"""DMT on an emulated multi-host cluster: flat all-to-all vs SPTT vs SPTT + tower modules.

Each host is a Linux network namespace; its ranks talk over its loopback, and hosts are
joined by veth links to a bridge in the root namespace, every link shaped with ``tc`` (tbf
rate + netem delay, default 1 Gbit/s and 0.2 ms host to host), so cross-host traffic is
really slower than intra-host traffic. gloo is told its interface with GLOO_SOCKET_IFNAME.
The namespaces are created here and always removed (also on failure or Ctrl-C).

Every scheme trains the same model (bottom MLP, sharded embedding tables, top MLP on the
concatenation) from the same initial weights on the same synthetic data and global batch,
with towers = the planted interaction groups (one tower per host):

- ``flat``: ShardedEmbeddingBagCollection, one all-to-all over all ranks;
- ``sptt``: SpttEmbeddingBagCollection, the six SPTT steps (same maths as flat);
- ``dmt_cr{K}``: SPTT with a DLRM tower module per host compressing K x (K in --compressions).

Per scheme it prints the median embedding time per iteration (forward + backward of the
embedding module: input exchange, lookup, output exchange / SPTT, tower module), the
iteration time, cross-host bytes per iteration (veth counters; with --no-netns the payload
computed from the exchange sizes) and the held-out AUC. Ratios are against ``flat`` of the
same run: ``speedup_sptt``, and ``speedup_dmt`` for the best compression whose AUC is within
0.005 of flat's. It also fits the simulator's links to all-to-all timings measured on the
same cluster (distrec.sim.calibrate) and reports predicted / measured forward output-exchange
times (the flat all-to-all, or SPTT steps (c)-(f) with the tower module).

Run as root (namespaces and tc need it):
    python benchmarks/dmt_cluster.py                      # 2 hosts x 2 ranks, 1 Gbit/s, 0.2 ms
    python benchmarks/dmt_cluster.py --quick              # fewer steps, smaller model
    python benchmarks/dmt_cluster.py --bandwidth 200mbit --latency-ms 1 --out runs/dmt_cluster
    python benchmarks/dmt_cluster.py --no-netns --hosts 1 --quick   # CI-safe: plain processes, loopback
The last line printed is one JSON object with every figure; the same is written to
OUT/dmt_cluster.json with a PNG of the times (OUT/dmt_cluster.png).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import numpy as np

AUC_TOLERANCE = 0.005  # the bound on DMT's AUC loss against flat
CALIBRATION_BYTES = (64 << 10, 512 << 10, 2 << 20, 4 << 20)  # per-peer sizes of the timed all-to-alls
SUBNET = "10.231.{net}.{host}"


# ----------------------------------------------------------------------------- namespaces


class EmulatedHosts:
    """Network namespaces joined by shaped veth links to a bridge; removed on exit."""

    def __init__(self, hosts: int, bandwidth: str, latency_ms: float) -> None:
        tag = os.getpid() % 100_000
        self.hosts, self.bandwidth, self.latency_ms = hosts, bandwidth, latency_ms
        self.net = tag % 250
        self.bridge = f"dmtbr{tag}"
        self.namespaces = [f"dmt{tag}h{h}" for h in range(hosts)]
        self.outer = [f"dmo{tag}_{h}" for h in range(hosts)]  # root side of each veth
        self.inner = [f"dmi{tag}_{h}" for h in range(hosts)]  # namespace side
        self.created: list[list[str]] = []  # undo commands, run in reverse
        self.delay_emulated = True  # False when the kernel has no netem

    def address(self, host: int) -> str:
        return SUBNET.format(net=self.net, host=host + 1)

    def __enter__(self) -> EmulatedHosts:
        if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
            raise SystemExit("dmt_cluster: network namespaces need root and iproute2 (ip, tc); use --no-netns")
        try:
            self._ip("link", "add", self.bridge, "type", "bridge")
            self.created.append(["ip", "link", "del", self.bridge])
            self._ip("link", "set", self.bridge, "up")
            for h, ns in enumerate(self.namespaces):
                self._ip("netns", "add", ns)
                self.created.append(["ip", "netns", "del", ns])
                self._ip("link", "add", self.outer[h], "type", "veth", "peer", "name", self.inner[h])
                self.created.append(["ip", "link", "del", self.outer[h]])
                self._ip("link", "set", self.inner[h], "netns", ns)
                self._ip("link", "set", self.outer[h], "master", self.bridge, "up")
                self._ip("-n", ns, "addr", "add", f"{self.address(h)}/24", "dev", self.inner[h])
                self._ip("-n", ns, "link", "set", self.inner[h], "up")
                self._ip("-n", ns, "link", "set", "lo", "up")
                # both ends shaped: a packet from host a to host b crosses two links
                self._shape([], self.outer[h])
                self._shape(["ip", "netns", "exec", ns], self.inner[h])
        except BaseException:
            self.__exit__()
            raise
        return self

    def _shape(self, prefix: list[str], dev: str) -> None:
        run = lambda *a: _check_call([*prefix, "tc", "qdisc", "add", "dev", dev, *a])  # noqa: E731
        run("root", "handle", "1:", "tbf", "rate", self.bandwidth, "burst", "256kb", "latency", "100ms")
        if self.delay_emulated and self.latency_ms > 0:
            try:
                run("parent", "1:1", "handle", "10:", "netem", "delay", f"{self.latency_ms / 2}ms", "limit", "100000")
            except RuntimeError as e:  # kernels without sch_netem: bandwidth only
                print(f"dmt_cluster: no added delay ({e})", file=sys.stderr)
                self.delay_emulated = False

    def _ip(self, *args: str) -> None:
        _check_call(["ip", *args])

    def __exit__(self, *exc) -> None:
        while self.created:
            subprocess.run(self.created.pop(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _check_call(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")


# ----------------------------------------------------------------------------- launcher


def launch(args: argparse.Namespace) -> dict:
    """Start hosts x ranks_per_host workers (in namespaces unless --no-netns); rank 0's result."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result_file = (out / "dmt_cluster.rank0.json").resolve()
    result_file.unlink(missing_ok=True)
    world = args.hosts * args.ranks_per_host
    port = 29_000 + os.getpid() % 1000
    worker = [sys.executable, os.path.abspath(__file__), "--worker", *_forward(args)]
    hosts = EmulatedHosts(args.hosts, args.bandwidth, args.latency_ms) if not args.no_netns else contextlib.nullcontext()
    procs: list[subprocess.Popen] = []
    with hosts:
        args.latency_emulated = (not args.no_netns) and hosts.delay_emulated
        for rank in range(world):
            host = rank // args.ranks_per_host
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_PORT=str(port),
                       LOCAL_WORLD_SIZE=str(args.ranks_per_host), OMP_NUM_THREADS="1", RESULT_FILE=str(result_file))
            if args.no_netns:
                env.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", HOST_IFNAME="")
                cmd = worker
            else:
                env.update(MASTER_ADDR=hosts.address(0), GLOO_SOCKET_IFNAME=hosts.inner[host], HOST_IFNAME=hosts.inner[host])
                cmd = ["ip", "netns", "exec", hosts.namespaces[host], *worker]
            procs.append(subprocess.Popen(cmd, env=env))
        try:
            _wait_all(procs)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)
    return json.loads(result_file.read_text())


def _wait_all(procs: list[subprocess.Popen]) -> None:
    """Wait for every worker; stop at the first failure."""
    while any(p.poll() is None for p in procs):
        failed = [p for p in procs if p.poll() not in (None, 0)]
        if failed:
            raise SystemExit(f"dmt_cluster: a worker exited with status {failed[0].returncode}")
        time.sleep(0.2)
    if any(p.returncode != 0 for p in procs):
        raise SystemExit("dmt_cluster: a worker failed")


def _forward(args: argparse.Namespace) -> list[str]:
    """The command-line options a worker needs, as given to the launcher."""
    flags = []
    for key, value in vars(args).items():
        if key in ("worker", "latency_emulated") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


# ----------------------------------------------------------------------------- worker


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from distrec.config import DataConfig, SyntheticConfig
    from distrec.data.dataset import Dataset
    from distrec.data.synthetic import SyntheticGenerator
    from distrec.parallel.topology import Topology

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    topology = Topology(args.hosts, args.ranks_per_host)
    groups = topology.build_groups()
    synthetic = SyntheticConfig(
        rows=(args.steps + 1) * args.global_batch + args.eval_rows, num_dense=13, num_sparse=args.features,
        table_rows=args.table_rows, interaction_groups=args.hosts if args.hosts > 1 else 0, seed=1234,
    )
    gen = SyntheticGenerator(synthetic)
    data = Dataset.from_chunk(gen.generate(0, synthetic.rows), gen.features, gen.dense_names,
                              DataConfig(max_ind_range=args.table_rows))
    tables = data.tables(args.dim)
    towers = [list(np.flatnonzero(gen.groups == h)) for h in range(args.hosts)] if args.hosts > 1 else [list(range(args.features))]
    b = args.global_batch // world
    steps = [data.batch(np.arange(s * args.global_batch + rank * b, s * args.global_batch + (rank + 1) * b))
             for s in range(args.steps)]
    eval_start = (args.steps + 1) * args.global_batch
    eval_local = args.eval_rows // world
    eval_batch = data.batch(np.arange(eval_start + rank * eval_local, eval_start + (rank + 1) * eval_local))

    calibration = measure_links(topology, groups, args)
    calibration["flops_per_s"] = _min_over_ranks(matmul_flops_per_s())
    schemes = ["flat", "sptt", *[f"dmt_cr{k:g}" for k in args.compressions]]
    results = {}
    for scheme in schemes:
        results[scheme] = train_scheme(scheme, tables, towers, topology, groups, steps, eval_batch, args)
        if rank == 0:
            print(f"dmt_cluster: {scheme}: {json.dumps(results[scheme])}", file=sys.stderr, flush=True)
    if rank == 0:
        Path(os.environ["RESULT_FILE"]).write_text(json.dumps({"schemes": results, "calibration": calibration}))
    dist.barrier()
    dist.destroy_process_group()


def measure_links(topology, groups, args) -> dict:
    """Median ms of all-to-alls of several sizes inside hosts and among peers (all groups at once)."""
    import torch
    import torch.distributed as dist

    from distrec.parallel.comm import all_to_all

    out = {}
    for name, group, members in (("intra_host", groups.intra_host, topology.ranks_per_host),
                                 ("cross_host", groups.cross_host, topology.hosts)):
        samples = []
        for size in CALIBRATION_BYTES if members > 1 else ():
            rows = size // 4
            send = torch.randn(members * rows)
            times = []
            for _ in range(6):
                dist.barrier()
                t0 = time.perf_counter()
                all_to_all(send, [rows] * members, [rows] * members, group)
                times.append((time.perf_counter() - t0) * 1e3)
            samples.append({"bytes": (members - 1) * size, "messages": members - 1, "ms": _max_over_ranks(median(times[1:]))})
        out[name] = samples
    return out


def matmul_flops_per_s() -> float:
    """FLOP/s of this process on float32 matrix products (the simulator's compute rate)."""
    import torch

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    a @ b
    t0 = time.perf_counter()
    for _ in range(20):
        a @ b
    return 20 * 2 * 256**3 / (time.perf_counter() - t0)


def _reduce(value: float, op) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=op)
    return float(t)


def _max_over_ranks(value: float) -> float:
    import torch.distributed as dist

    return _reduce(value, dist.ReduceOp.MAX)


def _min_over_ranks(value: float) -> float:
    import torch.distributed as dist

    return _reduce(value, dist.ReduceOp.MIN)


class BenchModel:
    """Bottom MLP on dense features; top MLP on cat(bottom output, embedding output)."""

    def __init__(self, embeddings, num_dense: int, width: int, dim: int) -> None:
        import torch

        from distrec.models.mlp import mlp

        self.embeddings = embeddings
        torch.manual_seed(0)  # the same dense weights on every rank and in every scheme
        self.bottom = mlp([num_dense, 64, dim], final_activation=True)
        self.top = mlp([dim + width, 128, 64, 1])
        self.dense_params = [*self.bottom.parameters(), *self.top.parameters()]

    def logits(self, batch, embedded):
        import torch

        return self.top(torch.cat([self.bottom(batch.dense), embedded.flatten(1)], dim=1)).squeeze(1)


def train_scheme(scheme, tables, towers, topology, groups, steps, eval_batch, args) -> dict:
    """Train one scheme from the common initial weights; its timings, bytes and AUC."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from distrec.models.tower_modules import TowerModuleSpec, compression_ratio, mflops_per_sample, num_parameters
    from distrec.parallel.sharded_embedding import ShardedEmbeddingBagCollection, full_weights_fill
    from distrec.parallel.sptt import FeatureLayout
    from distrec.parallel.sptt_embedding import SpttEmbeddingBagCollection, sync_tower_grads, tower_plan
    from distrec.train.metrics import click_metrics
    from distrec.train.optim import LazyAdam

    world = topology.world_size
    layout = FeatureLayout.from_towers(topology, towers)
    gen = torch.Generator().manual_seed(7)
    full = {t.name: (torch.rand(t.num_rows, t.dim, generator=gen) * 2 - 1) * t.num_rows**-0.5 for t in tables}
    host = topology.host(dist.get_rank())
    tower, spec = None, None
    if scheme == "flat":
        embeddings = ShardedEmbeddingBagCollection.from_full_weights(tables, tower_plan(tables, layout), full)
        width = len(tables) * args.dim
    elif scheme == "sptt":
        embeddings = SpttEmbeddingBagCollection.from_fill(tables, layout, groups, full_weights_fill(tables, full))
        width = len(tables) * args.dim
    else:
        counts = layout.host_feature_counts()
        spec = TowerModuleSpec.for_compression("dlrm", counts, args.dim, float(scheme.removeprefix("dmt_cr")))
        torch.manual_seed(100 + host)
        tower = spec.build(counts[host], args.dim)
        dims = [spec.output_dim(c) for c in counts]
        embeddings = SpttEmbeddingBagCollection.from_fill(tables, layout, groups, full_weights_fill(tables, full), tower, dims)
        width = sum(dims)
    model = BenchModel(embeddings, eval_batch.dense.shape[1], width, args.dim)
    tower_params = list(tower.parameters()) if tower is not None else []
    dense_opt = torch.optim.Adam(model.dense_params + tower_params, lr=args.lr)
    sparse_opt = LazyAdam(list(embeddings.weights), lr=args.embedding_lr)
    iteration_ms, embedding_ms, output_ms = [], [], []
    counters = _LinkCounter()
    for step, batch in enumerate(steps):
        if step == args.warmup:
            counters.start()
        dist.barrier()
        t0 = time.perf_counter()
        embedded = model.embeddings(batch)
        t1 = time.perf_counter()
        detached = embedded.detach().requires_grad_()
        loss = F.binary_cross_entropy_with_logits(model.logits(batch, detached), batch.labels)
        loss.backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.dense_params]).div_(world)
        dist.all_reduce(grads)
        t2 = time.perf_counter()
        embedded.backward(detached.grad)
        t3 = time.perf_counter()
        torch.nn.utils.vector_to_parameters(grads, [p.grad for p in model.dense_params])
        if tower is not None:
            sync_tower_grads(tower, groups, world)
        dense_opt.step()
        sparse_opt.step()
        dense_opt.zero_grad(set_to_none=True)
        sparse_opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        if step >= args.warmup:
            iteration_ms.append(_max_over_ranks((t4 - t0) * 1e3))
            embedding_ms.append(_max_over_ranks((t1 - t0 + t3 - t2) * 1e3))
            output_ms.append(_max_over_ranks(embeddings.stats.output_ms))
    measured_iterations = len(steps) - args.warmup
    with torch.no_grad():
        probs = torch.sigmoid(model.logits(eval_batch, model.embeddings(eval_batch)))
    everything = [torch.empty_like(probs) for _ in range(world)]
    labels = [torch.empty_like(eval_batch.labels) for _ in range(world)]
    dist.all_gather(everything, probs)
    dist.all_gather(labels, eval_batch.labels)
    metrics = click_metrics(torch.cat(labels).numpy(), torch.cat(everything).numpy())
    b = steps[0].batch_size
    out_floats = width  # floats per sample leaving the towers
    result = {
        "embedding_ms": median(embedding_ms),
        # forward output exchange alone: flat all-to-all, or SPTT steps (c)-(f) with the tower module
        "output_exchange_ms": median(output_ms),
        "iteration_ms": median(iteration_ms),
        "auc": metrics["auc"],
        "logloss": metrics["logloss"],
        # forward and backward embedding payload between hosts: L(H-1) peers' b samples each way
        "cross_host_payload_bytes": 2 * topology.ranks_per_host * (topology.hosts - 1) * b * out_floats * 4,
        "cross_host_bytes_measured": counters.per_iteration(measured_iterations),
        "dense_params": sum(p.numel() for p in model.dense_params),
    }
    if spec is not None:
        counts = layout.host_feature_counts()
        tower_mflops = mflops_per_sample(tower, torch.zeros(8, counts[host], args.dim))
        result.update(compression=compression_ratio(spec, counts, args.dim), tower_dim=spec.dim,
                      tower_params=int(_sum_over_hosts(num_parameters(tower), topology)),
                      tower_mflops_per_sample=_sum_over_hosts(tower_mflops, topology))
    return result


def _sum_over_hosts(value: float, topology) -> float:
    """Sum over hosts of a value every rank of a host knows (local rank 0 counts it)."""
    import torch.distributed as dist

    return _reduce(value if topology.local_rank(dist.get_rank()) == 0 else 0.0, dist.ReduceOp.SUM)


class _LinkCounter:
    """Bytes sent by every host over its link (veth tx counters), summed over hosts."""

    def __init__(self) -> None:
        self.ifname = os.environ.get("HOST_IFNAME", "")
        self.start_bytes = 0

    def _tx(self) -> int:
        import torch
        import torch.distributed as dist

        mine = 0
        if self.ifname and int(os.environ["RANK"]) % int(os.environ["LOCAL_WORLD_SIZE"]) == 0:
            mine = int(Path(f"/sys/class/net/{self.ifname}/statistics/tx_bytes").read_text())
        t = torch.tensor([mine], dtype=torch.int64)
        dist.all_reduce(t)
        return int(t)

    def start(self) -> None:
        self.start_bytes = self._tx()

    def per_iteration(self, iterations: int) -> float | None:
        total = self._tx() - self.start_bytes  # collective: every rank calls it
        return total / max(iterations, 1) if self.ifname else None


# ----------------------------------------------------------------------------- report


def summarize(raw: dict, args: argparse.Namespace) -> dict:
    """Ratios against flat, the best compression within the AUC bound, the simulator's fit."""
    schemes = raw["schemes"]
    flat = schemes["flat"]
    for r in schemes.values():
        r["speedup"] = flat["iteration_ms"] / r["iteration_ms"]
        r["embedding_speedup"] = flat["embedding_ms"] / r["embedding_ms"]
    within = [k for k in schemes if k.startswith("dmt") and flat["auc"] - schemes[k]["auc"] <= AUC_TOLERANCE]
    best = max(within, key=lambda k: schemes[k]["speedup"]) if within else None
    summary = {
        "hosts": args.hosts,
        "ranks_per_host": args.ranks_per_host,
        "netns": not args.no_netns,
        "bandwidth": args.bandwidth,
        "latency_ms": args.latency_ms,
        "latency_emulated": args.latency_emulated,
        "global_batch": args.global_batch,
        "features": args.features,
        "dim": args.dim,
        "steps": args.steps,
        "schemes": schemes,
        "speedup_sptt": schemes["sptt"]["speedup"],
        "speedup_dmt": schemes[best]["speedup"] if best else None,
        "best_dmt": best,
        "simulator": simulator_fit(raw["calibration"], schemes, args),
    }
    return summary


def simulator_fit(calibration: dict, schemes: dict, args: argparse.Namespace) -> dict | None:
    """Links fitted to the measured all-to-alls; predicted vs measured forward output exchange."""
    from distrec.errors import DistrecError
    from distrec.sim.calibrate import fit_link
    from distrec.sim.cluster import Cluster, LinkParams
    from distrec.sim.iteration import Workload, predict_iteration

    samples = {k: v for k, v in calibration.items() if k != "flops_per_s" and len(v) >= 2}
    if "intra_host" not in samples:
        return None
    try:
        links = {k: fit_link([s["bytes"] for s in v], [s["ms"] for s in v], [s["messages"] for s in v]) for k, v in samples.items()}
    except DistrecError as e:  # timings too noisy to fit (a busy machine)
        return {"error": str(e), "measurements": calibration}
    cross = links.get("cross_host", LinkParams(0.0, 1.0))  # unused with one host
    cluster = Cluster(args.hosts, args.ranks_per_host, peak_flops=calibration["flops_per_s"], compute_efficiency=1.0,
                      scale_up=links["intra_host"], scale_out=cross)
    out = {"links": {k: {"latency_ms": v.latency_s * 1e3, "bandwidth_MBps": v.bandwidth / 1e6} for k, v in links.items()},
           "flops_per_s": calibration["flops_per_s"], "measurements": calibration}
    for name, r in schemes.items():
        scheme, compression = ("dmt", r["compression"]) if name.startswith("dmt") else (name, 1.0)
        # only the embedding module: exchanges and, for DMT, the tower modules' compute
        workload = Workload(local_batch=args.global_batch // (args.hosts * args.ranks_per_host), num_features=args.features,
                            embedding_dim=args.dim, dense_mflops=0.0, dense_params=0,
                            tower_mflops=r.get("tower_mflops_per_sample", 0.0))
        predicted = predict_iteration(workload, cluster, scheme, compression)
        # forward only: half the exchange (forward + backward), a third of the compute (forward + 2 x backward)
        forward = predicted.embedding_exchange / 2 + predicted.compute / 3
        out[name] = {"predicted_output_exchange_ms": forward, "measured_output_exchange_ms": r["output_exchange_ms"],
                     "predicted_over_measured": forward / r["output_exchange_ms"]}
    for name in schemes:
        out[name]["predicted_speedup"] = out["flat"]["predicted_output_exchange_ms"] / out[name]["predicted_output_exchange_ms"]
        out[name]["measured_speedup"] = schemes["flat"]["output_exchange_ms"] / schemes[name]["output_exchange_ms"]
    return out


def plot(summary: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from distrec.io import atomic_write_bytes

    names = list(summary["schemes"])
    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = np.arange(len(names))
    ax.bar(x - 0.2, [summary["schemes"][n]["iteration_ms"] for n in names], 0.4, label="iteration")
    ax.bar(x + 0.2, [summary["schemes"][n]["embedding_ms"] for n in names], 0.4, label="embedding (fwd+bwd)")
    ax.set_xticks(x, names)
    ax.set_ylabel("ms per iteration (median)")
    delay = f"{summary['latency_ms']} ms" if summary["latency_emulated"] else "no added delay"
    link = f"{summary['bandwidth']}, {delay}" if summary["netns"] else "one machine, loopback"
    ax.set_title(f"{summary['hosts']} hosts x {summary['ranks_per_host']} ranks, {link}")
    ax.legend()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    atomic_write_bytes(path, buffer.getvalue())


def print_table(summary: dict) -> None:
    from distrec.sim.report import format_table

    rows = []
    for name, r in summary["schemes"].items():
        measured = r["cross_host_bytes_measured"]
        rows.append({"scheme": name, "iteration_ms": r["iteration_ms"], "embedding_ms": r["embedding_ms"],
                     "speedup": r["speedup"], "auc": r["auc"],
                     "cross_MB_payload": r["cross_host_payload_bytes"] / 1e6,
                     "cross_MB_link": measured / 1e6 if measured is not None else "-"})
    print(format_table(rows, digits=3))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--bandwidth", default="1gbit", help="tc rate of every host link (default 1gbit)")
    p.add_argument("--latency-ms", type=float, default=0.2, help="host-to-host delay (ms, default 0.2)")
    p.add_argument("--global-batch", type=int, default=4096)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--table-rows", type=int, default=5000)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--eval-rows", type=int, default=16384)
    p.add_argument("--lr", type=float, default=0.003, help="Adam learning rate of the dense layers and tower modules")
    p.add_argument("--embedding-lr", type=float, default=0.03, help="row-wise (lazy) Adam learning rate of the tables")
    p.add_argument("--compressions", type=float, nargs="+", default=[2, 4, 8])
    p.add_argument("--no-netns", action="store_true", help="plain processes on the loopback (CI-safe)")
    p.add_argument("--quick", action="store_true", help="a short run: fewer steps, smaller batch and model")
    p.add_argument("--out", default="runs/dmt_cluster", help="folder of the JSON and PNG results")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick and not args.worker:
        args.steps, args.global_batch, args.eval_rows, args.dim, args.table_rows = 20, 1024, 4096, 16, 1000
        args.warmup = 3
    world = args.hosts * args.ranks_per_host
    if args.global_batch % world or args.eval_rows % world or args.steps <= args.warmup:
        p.error("--global-batch and --eval-rows must be multiples of hosts x ranks-per-host, --steps > --warmup")
    if args.hosts > args.features:
        p.error("need at least one feature per host (--features >= --hosts)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup on kill too
    summary = summarize(launch(args), args)
    out = Path(args.out)
    from distrec.io import atomic_write_json

    atomic_write_json(out / "dmt_cluster.json", summary)
    plot(summary, out / "dmt_cluster.png")
    print_table(summary)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
