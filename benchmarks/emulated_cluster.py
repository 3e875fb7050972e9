"""An emulated multi-host cluster on one machine, shared by the cluster benchmarks.

Each host is a Linux network namespace; its ranks talk over its loopback, and hosts are
joined by veth links to a bridge in the root namespace, every link shaped with ``tc`` (tbf
rate + netem delay), so cross-host traffic is really slower than intra-host traffic. gloo is
told its interface with GLOO_SOCKET_IFNAME. The namespaces are created here and always
removed (also on failure or Ctrl-C).

- ``EmulatedHosts``: the namespaces and shaped links (root and iproute2 needed);
- ``run_ranks``: one worker process per rank, inside its host's namespace (or plain
  processes on the loopback with ``no_netns``), with torchrun's environment variables;
- in the ranks: ``start_rank`` (join, then ``measure_links``: all-to-all timings inside and
  across hosts, after a barrier and after compute, and ``matmul_flops_per_s``), ``train_measured`` (a training run's step times
  and the bytes over the hosts' links, ``LinkCounter``);
- ``fitted_cluster``: the simulator's ``Cluster`` with links and the collectives' wait fitted to those timings;
- ``started_as_rank``: a benchmark's ``main`` runs its worker when launched as a rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import Any

import harness

CALIBRATION_BYTES = (4 << 10, 32 << 10, 2 << 20, 4 << 20)  # per-peer sizes of the timed all-to-alls (2 to fit the latency, 2 the bandwidth)
CALIBRATION_REPEATS = 30  # timings per size (the first 2 left out): the small ones vary by 2x from one to the next
BURST_MS = 4.0  # each rank's compute before a timed collective (CPU ms)
WAIT_BYTES = 32 << 10  # per-peer sizes up to which a timing after compute gives the collective's wait
ALL_REDUCE = "all_reduce"  # measure_links's key of the all-reduce timings
SUBNET = "10.231.{net}.{host}"


def started_as_rank(argv: list[str] | None, worker: Callable[[str], Any]) -> bool:
    """Whether this process is one of ``run_ranks``' workers (``harness.WORKER_FLAG`` SPEC), after
    running ``worker(SPEC)``; otherwise SIGTERM is made to run the launcher's cleanup (the
    namespaces) and False is returned."""
    if argv is None and sys.argv[1:2] == [harness.WORKER_FLAG]:
        worker(sys.argv[2])
        return True
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return False


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
            raise SystemExit("emulated cluster: network namespaces need root and iproute2 (ip, tc); use --no-netns")
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
        run(*_rate_limit(self.bandwidth))
        if self.delay_emulated and self.latency_ms > 0:
            try:
                run("parent", "1:1", "handle", "10:", "netem", "delay", f"{self.latency_ms / 2}ms", "limit", "100000")
            except RuntimeError as e:  # kernels without sch_netem: bandwidth only
                print(f"emulated cluster: no added delay ({e})", file=sys.stderr)
                self.delay_emulated = False

    def rate_commands(self, bandwidth: str) -> list[list[str]]:
        """Commands that set every host link's rate to ``bandwidth`` (the delay stays), runnable
        as root from any network namespace (e.g. by a rank inside one of the hosts)."""
        root = ["nsenter", f"--net=/proc/{os.getpid()}/ns/net"]  # this process's namespace holds the bridge's side
        sides = [(root, dev) for dev in self.outer] + [(["ip", "netns", "exec", ns], dev) for ns, dev in zip(self.namespaces, self.inner)]
        return [[*prefix, "tc", "qdisc", "change", "dev", dev, *_rate_limit(bandwidth)] for prefix, dev in sides]

    def _ip(self, *args: str) -> None:
        _check_call(["ip", *args])

    def __exit__(self, *exc) -> None:
        while self.created:
            subprocess.run(self.created.pop(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _rate_limit(bandwidth: str) -> list[str]:
    """The ``tc qdisc`` arguments of a host link's rate limit (the root of its qdiscs)."""
    return ["root", "handle", "1:", "tbf", "rate", bandwidth, "burst", "256kb", "latency", "100ms"]


def set_link_rates(commands: list[list[str]]) -> None:
    """Run ``EmulatedHosts.rate_commands``; raises RuntimeError naming a command that failed."""
    for cmd in commands:
        _check_call(cmd)


def _check_call(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")


def run_ranks(worker: Sequence[str], hosts: int, ranks_per_host: int, bandwidth: str, latency_ms: float, no_netns: bool, name: str) -> bool:
    """Run ``worker`` once per rank of ``hosts x ranks_per_host`` (in namespaces unless ``no_netns``)
    and wait for all; whether the host-to-host delay was emulated."""
    world = hosts * ranks_per_host
    cluster = EmulatedHosts(hosts, bandwidth, latency_ms) if not no_netns else contextlib.nullcontext()
    with cluster:
        master = "127.0.0.1" if no_netns else cluster.address(0)
        port = harness.free_port()
        commands, envs = [], []
        for rank in range(world):
            host = rank // ranks_per_host
            ifname = "lo" if no_netns else cluster.inner[host]
            envs.append({**harness.rank_env(rank, world, ranks_per_host, master, port), "OMP_NUM_THREADS": "1",
                         "GLOO_SOCKET_IFNAME": ifname, "HOST_IFNAME": "" if no_netns else ifname})  # fmt: skip
            commands.append(list(worker) if no_netns else ["ip", "netns", "exec", cluster.namespaces[host], *worker])
        harness.launch_ranks(commands, envs, name)
        return (not no_netns) and cluster.delay_emulated


# ----------------------------------------------------------------------------- in the ranks


def finish_rank(spec: dict, rank: int, results: dict) -> None:
    """Rank 0 writes ``results`` to the spec's ``result_file`` for the launcher; then every rank leaves the group."""
    import torch.distributed as dist

    from distrec.io import atomic_write_json

    if rank == 0:
        atomic_write_json(spec["result_file"], results)
    dist.barrier()
    dist.destroy_process_group()


def start_rank(spec_file: str) -> tuple[dict, int, Any, dict]:
    """In a rank's worker: its spec (JSON), the joined process group's rank, the ``Topology``
    of ``spec["hosts"] x spec["ranks_per_host"]``, and the calibration (``measure_links``'s
    timings and ``flops_per_s``, the slowest rank's)."""
    import torch

    from distrec.parallel.comm import init_from_env
    from distrec.parallel.topology import Topology

    spec = json.loads(Path(spec_file).read_text())
    torch.set_num_threads(1)
    rank, _ = init_from_env(torch.device("cpu"))
    topology = Topology(spec["hosts"], spec["ranks_per_host"])
    calibration = measure_links(topology, topology.build_groups())
    calibration["flops_per_s"] = min_over_ranks(matmul_flops_per_s())
    return spec, rank, topology, calibration


def train_measured(cfg, out: Path, warmup: int, parts: dict[str, Sequence[str]]) -> tuple[dict | None, dict[str, Any], float | None]:
    """Train ``cfg`` into ``out`` with distrec's ``Trainer`` (a collective); the summary (rank 0),
    per part the slowest rank's ms of each step after ``warmup`` (the sum of the part's
    breakdown components), and the bytes per step over the hosts' links (the final
    evaluation's and checkpoint's traffic measured again and taken out; None without namespaces)."""
    import numpy as np
    import torch.distributed as dist

    from distrec.train.loop import Trainer

    trainer = Trainer(cfg, out, progress=False)
    try:
        link = LinkCounter()
        started = link.tx()
        summary = trainer.fit()
        trained = link.tx()
        trainer.evaluate_split("val")
        trainer.checkpointer.save()
        after = link.tx()
        steps = trainer.timer.steps
    finally:
        trainer.close()
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, steps)
    slowest = {
        name: np.max([[sum(s.get(c, 0.0) for c in components) for s in rank_steps[warmup:]] for rank_steps in every], axis=0)
        for name, components in parts.items()
    }
    return summary, slowest, (2 * trained - started - after) / len(steps) if link.ifname else None


def measure_links(topology, groups) -> dict:
    """Median ms of all-to-alls of several sizes inside hosts and among peers (all groups at
    once), and of all-reduces over every rank (``ALL_REDUCE`` key, a check of the simulator's
    ring, not fitted).

    Each all-to-all is timed twice: after a barrier (``ms``: the links, every member ready)
    and as training meets it (``ms_after_compute``): each rank computes for ``BURST_MS`` of
    its CPU time, then calls the collective with no barrier, so that the timing also holds
    the wait for the last member and the scheduling of ranks that share cores. The
    all-reduces are timed the second way."""
    import torch
    import torch.distributed as dist

    from distrec.parallel.comm import all_to_all

    def timed(collective: Callable[[], Any], before: Callable[[], Any]) -> float:
        times = []
        for _ in range(CALIBRATION_REPEATS):
            before()
            t0 = time.perf_counter()
            collective()
            times.append((time.perf_counter() - t0) * 1e3)
        return max_over_ranks(median(times[2:]))

    def burst() -> None:
        compute_burst(BURST_MS)

    out: dict[str, list[dict]] = {}
    for name, group, members in (("intra_host", groups.intra_host, topology.ranks_per_host),
                                 ("cross_host", groups.cross_host, topology.hosts)):  # fmt: skip
        samples = []
        for size in CALIBRATION_BYTES if members > 1 else ():
            rows = size // 4
            send = torch.randn(members * rows)

            def exchange() -> None:
                all_to_all(send, [rows] * members, [rows] * members, group)

            samples.append(
                {"bytes": (members - 1) * size, "messages": members - 1, "ms": timed(exchange, dist.barrier), "ms_after_compute": timed(exchange, burst)}
            )
        out[name] = samples
    world = dist.get_world_size()
    reduced = [torch.randn(size // 4) for size in CALIBRATION_BYTES[1:]]
    out[ALL_REDUCE] = [{"bytes": x.numel() * 4, "ranks": world, "ms": timed(lambda: dist.all_reduce(x), burst)} for x in reduced]
    return out


def compute_burst(ms: float) -> None:
    """Matrix products until this thread has used ``ms`` of CPU time."""
    import torch

    a = torch.randn(128, 128)
    start = time.thread_time()
    while (time.thread_time() - start) * 1e3 < ms:
        a @ a


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


def max_over_ranks(value: float) -> float:
    import torch.distributed as dist

    return _reduce(value, dist.ReduceOp.MAX)


def min_over_ranks(value: float) -> float:
    import torch.distributed as dist

    return _reduce(value, dist.ReduceOp.MIN)


class LinkCounter:
    """Bytes sent by every host over its link (veth tx counters), summed over hosts."""

    def __init__(self) -> None:
        self.ifname = os.environ.get("HOST_IFNAME", "")

    def tx(self) -> int:
        """The hosts' bytes sent so far (a collective: every rank calls it; 0 without namespaces)."""
        import torch
        import torch.distributed as dist

        mine = 0
        if self.ifname and int(os.environ["LOCAL_RANK"]) == 0:
            mine = int(Path(f"/sys/class/net/{self.ifname}/statistics/tx_bytes").read_text())
        t = torch.tensor([mine], dtype=torch.int64)
        dist.all_reduce(t)
        return int(t)


# ----------------------------------------------------------------------------- the simulator's cluster


def fitted_cluster(calibration: dict, hosts: int, ranks_per_host: int, all_reduce_algorithm: str = "auto"):
    """(``distrec.sim.cluster.Cluster`` with links fitted to ``measure_links``'s timings after a
    barrier, as collective wait the median extra time of its small all-to-alls after compute,
    and the measured FLOP/s at efficiency 1; the fitted links and wait as a dict) or (None,
    an error or None)."""
    from distrec.errors import DistrecError
    from distrec.sim.calibrate import fit_link
    from distrec.sim.cluster import Cluster, LinkParams

    samples = {k: v for k, v in calibration.items() if k != ALL_REDUCE and isinstance(v, list) and len(v) >= 2}  # the links' timings
    if "intra_host" not in samples:
        return None, None
    try:
        links = {k: fit_link([s["bytes"] for s in v], [s["ms"] for s in v], [s["messages"] for s in v]) for k, v in samples.items()}
    except DistrecError as e:  # timings too noisy to fit (a busy machine)
        return None, str(e)
    # what a collective of small messages takes longer when the ranks come from computing
    waits = [s["ms_after_compute"] - s["ms"] for v in samples.values() for s in v if s["bytes"] <= WAIT_BYTES * s["messages"]]
    wait_ms = max(0.0, median(waits))
    cross = links.get("cross_host", LinkParams(0.0, 1.0))  # unused with one host
    cluster = Cluster(
        hosts,
        ranks_per_host,
        peak_flops=calibration["flops_per_s"],
        compute_efficiency=1.0,
        scale_up=links["intra_host"],
        scale_out=cross,
        all_reduce_algorithm=all_reduce_algorithm,
        shared_nic=True,  # one veth link per host namespace
        collective_wait_s=wait_ms / 1e3,
    )
    return cluster, {"collective_wait_ms": wait_ms, **{k: {"latency_ms": v.latency_s * 1e3, "bandwidth_MBps": v.bandwidth / 1e6} for k, v in links.items()}}
