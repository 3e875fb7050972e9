"""Distributed Hotline against the sharded trainer: bytes per step and samples/s, in the same run.

Two settings, each with both systems' trainers in the same processes and their timed steps
taking turns step by step (the order alternating), so that both see the same machine: this
one's speed drifts by up to 1.5x within minutes, and whole runs in turns paired a fast run
with a slow one. ``--rounds`` blocks of ``--timed-steps`` steps per system give a ratio each:

- ``local``: 4 ranks on this machine (``--procs``), gloo over the loopback;
- ``cluster``: 2 emulated hosts x 2 ranks (``benchmarks/emulated_cluster.py``'s ``EmulatedHosts``:
  network namespaces joined by ``tc``-shaped links, default 1 Gbit/s and 0.2 ms host to
  host; needs root). A third turn here: the sharded trainer again, with the links' rate
  raised to ``--fast-bandwidth`` for its step (the delay kept), i.e. with the same CPU work
  and its cross-host bytes almost free. Its speed over the sharded trainer's is about the
  most that removing cross-host bytes can give on this machine (``link_ceiling``).

Both systems are distrec's trainer (``distrec.train.loop.Trainer``, the step it builds for the
mode) on the same synthetic data: ``benchmarks/hotline.py``'s table mix, one table of 8M rows
and 25 of 100 rows, every feature Zipf(1.05), so that about as many inputs are popular as
there (~72% with its 16 MB of dim-64 rows; here dim 16, so the default budget of 4 MB holds
about as many rows), DLRM with bottom MLP 256-64-16 and top MLP 256, SGD, table-wise plan:

- ``sharded``: every lookup through the all-to-all, DDP for the dense layers;
- ``hotline``: ``--hotline``: hot rows replicated on every rank; the hot set is learned from
  rank 0's first ``--learn-steps`` mini-batches (sample rate 1) and the timed steps follow.
  The default 200 (205k samples, as many as ``hotline.py`` samples) makes about 71% of the
  inputs popular, as there; 30 gave 62%.

Per step (the timed steps: after the hot set's first selection and one more step; every
step starts on all ranks together): the slowest rank's wall time of the training step (samples/s = global batch / its median), and
the bytes rank r sent, averaged over ranks: the embedding all-to-alls (input exchange,
output exchange and its backward, which sends as many bytes back) plus the gradient
all-reduces (the sharded trainer's DDP: the dense gradients; Hotline's: the dense gradients
and the touched hot rows' in one all-reduce, plus one bit per hot row for the union of the
touched rows). On the emulated cluster the bytes that crossed the host links (veth
counters) are reported too; and each system's CPU time per step (a rank's process, all its
threads, mean over the ranks): with more ranks than cores the step is bound by it. On Linux
that CPU time is also split by thread: the training thread, Hotline's worker (the cold
exchange) and the rest (the communication library's threads). Every
rank computes with one thread (``OMP_NUM_THREADS=1``, ``OMP_WAIT_POLICY=PASSIVE``).

The last line printed is the harness's result record (every system's samples/s per round in
each setting; ``ratio`` = ``speedup`` when one setting ran): per setting ``bytes_ratio`` (Hotline's total bytes
per step / the sharded trainer's), ``speedup`` (the ratio of the systems' median samples/s),
``speedup_median_of_rounds`` (the median of the rounds' ratios) and
``popular_fraction``, on the cluster also ``link_ceiling`` and ``speedup_over_fast_links``
(Hotline's samples/s over the fast-link sharded trainer's; medians of the rounds' ratios),
with every figure; also written to OUT/hotline_distributed.json.

Usage (as root for the cluster setting):
    python benchmarks/hotline_distributed.py                         # both settings, ~8 minutes on 2 busy cores
    python benchmarks/hotline_distributed.py --settings local --rounds 1 --learn-steps 10 --timed-steps 5
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import median

import harness
from emulated_cluster import EmulatedHosts, LinkCounter, set_link_rates

SMALL_TABLES = 25  # hotline.py's mix: one large table, 25 of SMALL_ROWS rows
SMALL_ROWS = 100
SYSTEMS = ("sharded", "hotline")
FAST_LINKS = "sharded_fast_links"  # the cluster's third system: the sharded trainer with faster host links


def overrides(args: argparse.Namespace, out: Path, hotline: bool, cluster: bool) -> list[str]:
    """``section.key=value`` items of one system's trainer."""
    global_batch = args.batch_size * args.procs
    timed = args.rounds * args.timed_steps
    rows = global_batch * (args.learn_steps + 1 + 2 * timed + 2)  # the same data for both (about an epoch)
    steps = args.learn_steps + 1 + timed * (2 if cluster and not hotline else 1)
    small = {f"C{f + 2}": SMALL_ROWS for f in range(SMALL_TABLES)}
    items = [
        f"data.cache_dir={out / 'cache'}",
        f"data.synthetic.rows={rows}",
        f"data.synthetic.num_sparse={SMALL_TABLES + 1}",
        f"data.synthetic.table_rows={args.big_rows}",
        f"data.max_ind_range={args.big_rows}",
        f"data.table_sizes={json.dumps(small)}",
        f"data.synthetic.zipf_exponent={args.zipf}",
        "data.split=random:0.01",
        f"model.embedding_dim={args.dim}",
        "model.bottom_mlp=[256, 64]",
        "model.top_mlp=[256]",
        f"train.batch_size={global_batch}",
        f"train.max_steps={steps}",
        "train.optimizer=sgd",
        "train.lr=0.01",
        "train.threads=1",
        "train.log_every=0",
        "parallel.sharding=table_wise",
    ]
    if hotline:
        items += ["hotline.enabled=true", "hotline.sample_rate=1.0", f"hotline.relearn_every={args.learn_steps}", f"hotline.hot_budget={args.hot_budget}"]
    return items


# ----------------------------------------------------------------------------- launcher


def run_setting(setting: str, args: argparse.Namespace) -> dict:
    """Every round of the setting's systems on its ranks: rank 0's figures (``rounds``, per
    system a list) and, on the cluster, whether the links' delay was emulated."""
    from distrec import config
    from distrec.data import prepare
    from distrec.io import atomic_write_json

    out = Path(args.out).resolve() / setting
    out.mkdir(parents=True, exist_ok=True)
    cluster = setting == "cluster"
    configs = {name: overrides(args, out.parent, name == "hotline", cluster) for name in SYSTEMS}
    prepare(config.load(None, configs["sharded"]).data, progress=False)  # once, before the ranks read it
    result_file = out / "result.json"
    result_file.unlink(missing_ok=True)
    per_host = args.procs // 2 if cluster else args.procs
    hosts = EmulatedHosts(2, args.bandwidth, args.latency_ms) if cluster else contextlib.nullcontext()
    with hosts:
        link_rates = {"fast": hosts.rate_commands(args.fast_bandwidth), "shaped": hosts.rate_commands(args.bandwidth)} if cluster else None
        spec = {
            "configs": configs,
            "out": str(out),
            "rounds": args.rounds,
            "timed_steps": args.timed_steps,
            "first_timed": args.learn_steps + 1,
            "result_file": str(result_file),
            "link_rates": link_rates,
        }
        spec_file = out / "spec.json"
        atomic_write_json(spec_file, spec)
        worker = [sys.executable, os.path.abspath(__file__), harness.WORKER_FLAG, str(spec_file)]
        master = hosts.address(0) if cluster else "127.0.0.1"
        port = harness.free_port()
        commands, envs = [], []
        for rank in range(args.procs):
            ifname = hosts.inner[rank // per_host] if cluster else "lo"
            envs.append({**harness.rank_env(rank, args.procs, per_host, master, port), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
                         "GLOO_SOCKET_IFNAME": ifname, "HOST_IFNAME": ifname if cluster else ""})  # fmt: skip
            commands.append(["ip", "netns", "exec", hosts.namespaces[rank // per_host], *worker] if cluster else worker)
        harness.launch_ranks(commands, envs, f"hotline_distributed ({setting})")
    return {"rounds": json.loads(result_file.read_text()), "latency_emulated": hosts.delay_emulated if cluster else None}


# ----------------------------------------------------------------------------- worker


def worker(spec_file: str) -> None:
    """One rank: both trainers learn (untimed), then their timed steps take turns step by
    step, in ``rounds`` blocks (on the cluster the sharded trainer's turn comes twice: with
    the shaped links and with fast ones); rank 0 writes each block's figures."""
    import torch
    import torch.distributed as dist

    from distrec import config
    from distrec.io import atomic_write_json
    from distrec.parallel.comm import init_from_env
    from distrec.train.loop import Trainer

    spec = json.loads(Path(spec_file).read_text())
    torch.set_num_threads(1)
    rank, _ = init_from_env(torch.device("cpu"))
    trainers = {name: Trainer(config.load(None, spec["configs"][name]), Path(spec["out"]) / name, progress=False) for name in SYSTEMS}
    try:
        turns = {name: Turns(trainer) for name, trainer in trainers.items()}
        for system in turns.values():
            system.untimed(spec["first_timed"])  # Hotline's hot set is learned and selected here
        labels = [*SYSTEMS, FAST_LINKS] if spec["link_rates"] else list(SYSTEMS)
        turn_of = {label: turns["sharded" if label == FAST_LINKS else label] for label in labels}
        rounds: dict[str, list[dict]] = {label: [] for label in labels}
        for r in range(spec["rounds"]):
            records = {label: StepRecords() for label in labels}

            def turn(label: str):
                def step(s: int) -> None:
                    with fast_links(spec["link_rates"], rank) if label == FAST_LINKS else contextlib.nullcontext():
                        turn_of[label].timed(records[label])

                return step

            harness.interleaved_rounds({label: turn(label) for label in labels}, spec["timed_steps"], order="alternate")  # step by step
            for label in labels:
                rounds[label].append(records[label].figures(turn_of[label]))  # a collective
                if rank == 0:
                    print(f"hotline_distributed: round {r} {label}: {json.dumps(rounds[label][-1])}", file=sys.stderr, flush=True)
    finally:
        for trainer in trainers.values():
            trainer.close()
    if rank == 0:
        atomic_write_json(spec["result_file"], rounds)
    dist.barrier()
    dist.destroy_process_group()


@contextlib.contextmanager
def fast_links(link_rates: dict[str, list[list[str]]], rank: int):
    """Within the block the emulated host links run at the fast rate (rank 0 sets it; a collective)."""
    import torch.distributed as dist

    if rank == 0:
        set_link_rates(link_rates["fast"])
    dist.barrier()
    try:
        yield
    finally:
        dist.barrier()
        if rank == 0:
            set_link_rates(link_rates["shaped"])
        dist.barrier()


class Turns:
    """One trainer's steps on its own batches, untimed or timed into a ``StepRecords``."""

    def __init__(self, trainer) -> None:
        t = trainer.cfg.train
        self.trainer = trainer
        self.training = getattr(trainer.mode, "training", None)  # Hotline's step, None for the sharded trainer
        self.dense_bytes = sum(p.numel() * p.element_size() for p in trainer.model.dense_parameters())
        self.batches = self._epochs()
        self.normalizer = t.batch_size / trainer.world_size
        self.link = LinkCounter()

    def _epochs(self) -> Iterator:
        """This rank's batches, epoch after epoch."""
        t, trainer = self.trainer.cfg.train, self.trainer
        for epoch in itertools.count():
            yield from trainer.dataset.batches(
                trainer.splits["train"], t.batch_size, shuffle=True, seed=t.seed, epoch=epoch, shard=(trainer.rank, trainer.world_size)
            )

    def untimed(self, steps: int) -> None:
        """``steps`` steps, nothing recorded (the breakdown still closes each)."""
        for _ in range(steps):
            self.trainer.train_step(next(self.batches), normalizer=self.normalizer)
            self.trainer.timer.end_step()

    def timed(self, records: StepRecords) -> None:
        """One step, its wall and CPU time, bytes and breakdown added to ``records``."""
        batch = next(self.batches)
        counters = dict(vars(self.training.counters)) if self.training else {}
        threads, tx = thread_cpu_seconds(), self.link.tx()
        started, cpu_started = time.perf_counter(), time.process_time()
        self.trainer.train_step(batch, normalizer=self.normalizer)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        records.threads.append(cpu_by_thread_kind(threads, thread_cpu_seconds()))
        records.cross_host.append(self.link.tx() - tx)
        self.trainer.timer.end_step()
        stats = self.trainer.telemetry.exchange()
        records.seconds.append(seconds)
        records.cpu_seconds.append(cpu_seconds)
        records.exchanged.append(stats.input_bytes + 2 * stats.output_bytes)  # the output exchange's backward sends as much back
        records.reduced.append(self.training.embeddings.reduce_bytes if self.training else self.dense_bytes)
        records.components.append(self.trainer.timer.steps[-1])
        if self.training:
            for k, v in vars(self.training.counters).items():
                records.counters[k] = records.counters.get(k, 0) + v - counters[k]


class StepRecords:
    """What a rank measured in one system's timed steps of a round."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.cpu_seconds: list[float] = []
        self.exchanged: list[int] = []
        self.reduced: list[int] = []
        self.cross_host: list[int] = []
        self.threads: list[dict[str, float]] = []
        self.components: list[dict[str, float]] = []
        self.counters: dict[str, int] = {}

    def figures(self, turns: Turns) -> dict:
        """The round's figures over the ranks (a collective): the slowest rank's step time per
        step, bytes and CPU averaged over the ranks, rank 0's breakdown."""
        import numpy as np
        import torch.distributed as dist

        from distrec.components.breakdown import COMPONENTS

        n = len(self.seconds)
        threads: dict[str, float] = {}
        for step in self.threads:
            for kind, seconds in step.items():
                threads[kind] = threads.get(kind, 0.0) + seconds / n
        per_rank: list = [None] * dist.get_world_size()
        dist.all_gather_object(
            per_rank, (self.seconds, float(np.mean(self.exchanged)), float(np.mean(self.reduced)), float(np.mean(self.cpu_seconds)), threads)
        )
        slowest = np.max([s for s, _, _, _, _ in per_rank], axis=0)
        all_to_all = float(np.mean([a for _, a, _, _, _ in per_rank]))
        all_reduce = float(np.mean([r for _, _, r, _, _ in per_rank]))
        kinds = sorted({kind for *_, threads in per_rank for kind in threads})
        batch_size = turns.trainer.cfg.train.batch_size
        figures = {
            "samples_per_s": batch_size / float(np.median(slowest)),
            "step_ms": {"median": float(np.median(slowest)) * 1e3, "min": float(slowest.min()) * 1e3},
            "cpu_ms_per_step": float(np.mean([c for _, _, _, c, _ in per_rank])) * 1e3,  # a rank's process CPU time (all its threads), mean over ranks
            "cpu_ms_per_step_by_thread": {kind: float(np.mean([threads.get(kind, 0.0) for *_, threads in per_rank])) * 1e3 for kind in kinds},
            "all_to_all_bytes_per_step": all_to_all,
            "all_reduce_bytes_per_step": all_reduce,
            "total_bytes_per_step": all_to_all + all_reduce,
            "cross_host_bytes_per_step": float(np.mean(self.cross_host)) if turns.link.ifname else None,
            "rank0_components_ms": {c: float(np.median([s.get(c, 0.0) for s in self.components])) for c in COMPONENTS if c != "data_loading"},
        }
        if turns.training:
            figures.update(
                popular_fraction=self.counters["popular_samples"] / self.counters["samples"],  # rank 0's samples of the timed steps
                hot_lookup_fraction=self.counters["hot_lookups"] / self.counters["lookups"],
                hot_rows=int(turns.training.embeddings.hot_ids.numel()),
            )
        return figures


def thread_cpu_seconds() -> dict[int, float]:
    """CPU seconds (user + system) so far of each thread of this process, by native thread id
    (from ``/proc/self/task``; empty where there is none)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    seconds = {}
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14 and 15 of stat)
    return seconds


def cpu_by_thread_kind(start: dict[int, float], end: dict[int, float]) -> dict[str, float]:
    """CPU seconds between two ``thread_cpu_seconds`` readings, summed per kind of thread:
    ``training`` (the main thread), ``hotline_worker`` (the cold exchange's) and ``other``."""
    from distrec.hotline.distributed import COLD_EXCHANGE_THREAD

    workers = {t.native_id for t in threading.enumerate() if t.name.startswith(COLD_EXCHANGE_THREAD)}
    kinds: dict[str, float] = {}
    for tid, seconds in end.items():
        kind = "training" if tid == os.getpid() else "hotline_worker" if tid in workers else "other"
        kinds[kind] = kinds.get(kind, 0.0) + seconds - start.get(tid, 0.0)
    return kinds


# ----------------------------------------------------------------------------- report


def summarize(measured: dict) -> dict:
    """Per system the median round (by samples/s; bytes are the same in every round), and the ratios."""
    rounds: dict[str, list[dict]] = measured["rounds"]
    medians = {name: median(r["samples_per_s"] for r in runs) for name, runs in rounds.items()}
    pick = {name: min(runs, key=lambda r: abs(r["samples_per_s"] - medians[name])) for name, runs in rounds.items()}
    base, hot = pick["sharded"], pick["hotline"]
    result = {
        "bytes_ratio": round(hot["total_bytes_per_step"] / base["total_bytes_per_step"], 4),
        "all_to_all_ratio": round(hot["all_to_all_bytes_per_step"] / base["all_to_all_bytes_per_step"], 4),
        "speedup": round(medians["hotline"] / medians["sharded"], 3),
        "speedup_per_round": [round(h["samples_per_s"] / s["samples_per_s"], 3) for h, s in zip(rounds["hotline"], rounds["sharded"])],
        "popular_fraction": round(hot["popular_fraction"], 4),
        "systems": {
            name: {**r, "samples_per_s_median": medians[name], "samples_per_s_per_round": [x["samples_per_s"] for x in rounds[name]]}
            for name, r in pick.items()
        },
    }
    # the two systems of a round ran minutes apart at most, so each round's ratio sees the same machine
    result["speedup_median_of_rounds"] = round(median(result["speedup_per_round"]), 3)
    if measured["latency_emulated"] is not None:
        result["latency_emulated"] = measured["latency_emulated"]  # False: the kernel has no netem, the links only limit the rate
    if FAST_LINKS in rounds:  # what the sharded trainer gains when its cross-host bytes cost (almost) nothing
        ceiling = [round(f["samples_per_s"] / s["samples_per_s"], 3) for f, s in zip(rounds[FAST_LINKS], rounds["sharded"])]
        over_fast = [round(h["samples_per_s"] / f["samples_per_s"], 3) for h, f in zip(rounds["hotline"], rounds[FAST_LINKS])]
        result.update(link_ceiling=round(median(ceiling), 3), link_ceiling_per_round=ceiling, speedup_over_fast_links=round(median(over_fast), 3))
    if base["cross_host_bytes_per_step"]:
        result["cross_host_bytes_ratio"] = round(hot["cross_host_bytes_per_step"] / base["cross_host_bytes_per_step"], 4)
    return result


def print_table(results: dict[str, dict]) -> None:
    print(
        f"\n{'setting':<8} {'system':<18} {'samples/s':>10} {'CPU ms/step':>12} {'a2a MB/step':>12} {'all-reduce MB/step':>19} {'total ratio':>12} {'popular':>8}"
        "  CPU ms/step by thread"
    )
    for setting, r in results.items():
        for name, s in r["systems"].items():
            ratio = r["bytes_ratio"] if name == "hotline" else 1.0
            print(
                f"{setting:<8} {name:<18} {s['samples_per_s_median']:>10,.0f} {s['cpu_ms_per_step']:>12.1f} {s['all_to_all_bytes_per_step'] / 1e6:>12.3f} "
                f"{s['all_reduce_bytes_per_step'] / 1e6:>19.3f} {ratio:>12.3f} {s.get('popular_fraction', 0.0):>8.3f}"
                f"  {', '.join(f'{kind} {ms:.1f}' for kind, ms in s['cpu_ms_per_step_by_thread'].items())}"
            )
        print(f"{setting:<8} speedup {r['speedup']:.3f} (rounds: {r['speedup_per_round']}, their median {r['speedup_median_of_rounds']:.3f})")
        if "link_ceiling" in r:
            print(
                f"{setting:<8} link ceiling {r['link_ceiling']:.3f} (rounds: {r['link_ceiling_per_round']}); "
                f"Hotline over the sharded trainer with fast links {r['speedup_over_fast_links']:.3f}"
            )


def main() -> None:
    if sys.argv[1:2] == [harness.WORKER_FLAG]:
        worker(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = dict(procs=4, batch_size=1024, big_rows=8_000_000, dim=16, zipf=1.05, hot_budget="4MB", learn_steps=200, timed_steps=20, rounds=3,
                    bandwidth="1gbit", latency_ms=0.2, fast_bandwidth="100gbit")  # fmt: skip
    harness.add_options(parser, defaults, {
        "batch_size": "samples per rank and step (the global batch is procs times this)",
        "big_rows": "rows of the large table (hotline.py's: 8M)",
        "learn_steps": "steps before the hot set is selected (rank 0's mini-batches, all sampled)",
        "timed_steps": "timed steps of each system per round, after the hot set's selection and one more step",
        "rounds": "rounds (blocks of timed steps; rounds x timed steps below learn steps, so the hot set stays); medians are reported",
        "bandwidth": "tc rate of every emulated host link",
        "latency_ms": "emulated host-to-host delay (ms)",
        "fast_bandwidth": "tc rate of the host links while the cluster's third system (the sharded trainer with fast links) trains",
    })  # fmt: skip
    parser.add_argument("--settings", nargs="+", default=["local", "cluster"], choices=["local", "cluster"])
    parser.add_argument("--out", default="runs/bench-hotline-distributed", help="folder for the runs and the cache")
    args = parser.parse_args()
    if args.procs % 2 or args.rounds * args.timed_steps >= args.learn_steps:
        parser.error("--procs must be even (2 emulated hosts) and --rounds x --timed-steps below --learn-steps (one hot set)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the namespaces are removed on kill too
    results = {setting: summarize(run_setting(setting, args)) for setting in args.settings}
    print_table(results)
    systems = [
        harness.SystemResult(f"{name} ({setting})", "throughput", "samples/s", harness.Samples(s["samples_per_s_per_round"]))
        for setting, r in results.items()
        for name, s in r["systems"].items()
    ]
    ratio = results[args.settings[0]]["speedup"] if len(args.settings) == 1 else None
    harness.finish(
        harness.ResultRecord("hotline_distributed", systems, ratio, {"config": vars(args), "baseline": "sharded", **results}),
        Path(args.out) / "hotline_distributed.json",
    )


if __name__ == "__main__":
    main()
