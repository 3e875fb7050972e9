"""What every benchmark needs, in one place: launching processes, interleaved rounds, results.

The benchmark scripts import it as a sibling module (``import harness``: a script's own
folder is first on ``sys.path``). It uses only distrec's public surface.

- options: :func:`add_options` declares typed command-line options from their defaults;
- launching: :func:`run_worker` (one measurement in a fresh process, optionally under another
  interpreter), :func:`distrec_train` (``distrec train``, optionally ``--nproc-per-node N``),
  :func:`launch_ranks` (one process per rank with torchrun's environment, :func:`rank_env`,
  e.g. inside network namespaces);
- timing: :func:`interleaved_rounds` runs the baseline and the candidates in turns, so that
  every one sees the same machine load; :class:`Samples` holds one system's measurements
  and gives their median and spread; :func:`timed_ms` times one call with the clock of its
  device (CUDA events on a GPU, ``time.perf_counter`` otherwise), :func:`median_ms` the
  median of several;
- training: :func:`train_epochs` trains a distrec model in this process with distrec's
  training step (for quality benchmarks);
- results: every benchmark ends with one :class:`ResultRecord` (its name, one
  :class:`SystemResult` per system and metric, the headline ratio and any further figures),
  which :func:`finish` writes atomically and prints as the last line of output;
  :func:`figure` / :func:`save_png` draw a PNG whose axes must be labelled.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import torch

import distrec
from distrec.io import atomic_write_bytes, atomic_write_json

R = TypeVar("R")
WORKER_FLAG = "--worker"
DISTREC_ROOT = str(Path(distrec.__file__).resolve().parents[1])  # the folder distrec is imported from


# ----------------------------------------------------------------------------- options


def add_options(parser: argparse.ArgumentParser, defaults: Mapping[str, Any], helps: Mapping[str, str] | None = None) -> None:
    """One ``--name-with-dashes`` option per entry of ``defaults``, typed by its default value:
    a bool gives ``--name`` / ``--no-name``, a list one or more values of its first item's
    type, anything else one value of its type. ``helps`` adds help texts by name."""
    for name, default in defaults.items():
        flag = "--" + name.replace("_", "-")
        kwargs: dict[str, Any] = {"default": default, "help": (helps or {}).get(name)}
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        elif isinstance(default, list):
            parser.add_argument(flag, nargs="+", type=type(default[0]), **kwargs)
        else:
            parser.add_argument(flag, type=type(default), **kwargs)


# ----------------------------------------------------------------------------- timing


@dataclass
class Samples:
    """Repeated measurements of one quantity of one system (e.g. ms per step)."""

    values: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.values = [float(v) for v in self.values]

    def add(self, value: float) -> None:
        self.values.append(float(value))

    @property
    def median(self) -> float:
        return float(np.median(self.values))

    @property
    def spread(self) -> float:
        """90th over 10th percentile (1.0: every measurement the same)."""
        return float(np.percentile(self.values, 90) / np.percentile(self.values, 10))

    def summary(self, digits: int = 2) -> dict[str, Any]:
        """``median``, ``p90_over_p10`` and the measurements themselves, rounded."""
        return {"median": round(self.median, digits), "p90_over_p10": round(self.spread, 3), "values": [round(v, digits) for v in self.values]}


Order = Literal["given", "alternate", "rotate"]


def round_order(count: int, round_index: int, order: Order, shuffle: np.random.Generator | None) -> list[int]:
    """The order in which ``count`` systems run in round ``round_index`` (see :func:`interleaved_rounds`)."""
    if shuffle is not None:
        return [int(k) for k in shuffle.permutation(count)]
    given = list(range(count))
    if order == "alternate":
        return given if round_index % 2 == 0 else given[::-1]
    if order == "rotate":
        first = round_index % count
        return given[first:] + given[:first]
    return given


def interleaved_rounds(
    systems: Mapping[str, Callable[[int], R]],
    rounds: int,
    shuffle_seed: int | None = None,
    after_round: Callable[[int], None] | None = None,
    order: Order = "given",
) -> dict[str, list[R]]:
    """Run every system once per round (``run(round_index)``), in turns, and collect what each returned.

    The systems run in their given order (baseline first); with ``order="alternate"`` in
    reverse every other round, with ``"rotate"`` starting one later each round; with
    ``shuffle_seed``, in a new random order every round
    (``numpy.random.default_rng(shuffle_seed).permutation``), so that none always follows
    another. Medians over the rounds then compare systems measured under the same machine load.
    """
    if shuffle_seed is not None and order != "given":
        raise ValueError("interleaved_rounds: give a shuffle_seed or an order, not both")
    names = list(systems)
    shuffle = np.random.default_rng(shuffle_seed) if shuffle_seed is not None else None
    results: dict[str, list[R]] = {name: [] for name in names}
    for r in range(rounds):
        for k in round_order(len(names), r, order, shuffle):
            results[names[k]].append(systems[names[k]](r))
        if after_round is not None:
            after_round(r)
    return results


def timed_ms(fn: Callable[[], R], device: torch.device | str = "cpu") -> tuple[R, float]:
    """Call ``fn`` once; what it returned and how long it took, ms.

    On a CUDA device the time is that of a pair of CUDA events around the call, read after
    the device synchronises, so kernels still queued when ``fn`` returns are counted; on any
    other device, the wall time (``time.perf_counter``).
    """
    device = torch.device(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        torch.cuda.synchronize(device)
        return result, float(start.elapsed_time(end))
    started = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - started) * 1e3


def median_ms(fn: Callable[[], object], repeats: int, device: torch.device | str = "cpu") -> float:
    """Median time of ``fn`` over ``repeats`` calls in this process (:func:`timed_ms`), ms."""
    return statistics.median(timed_ms(fn, device)[1] for _ in range(repeats))


# ----------------------------------------------------------------------------- launching


def last_json_line(text: str) -> Any:
    """The JSON object on the last non-empty line of a process's output."""
    return json.loads(text.strip().splitlines()[-1])


def run_worker(script: str | Path, spec: Mapping[str, Any], env: Mapping[str, str] | None = None, python: str | None = None) -> Any:
    """Run ``python script --worker SPEC_JSON`` in a fresh process; the JSON of its last line.

    A fresh process inherits no allocator state, caches or threads from another system.
    ``python`` runs it under another interpreter (e.g. a virtual environment with a peer
    library); distrec's own folder then goes first on its ``PYTHONPATH``, since the script
    imports this harness, which imports distrec.
    """
    env = {**os.environ, **(env or {})}
    if python is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (DISTREC_ROOT, env.get("PYTHONPATH")) if p)
    command = [python or sys.executable, os.path.abspath(script), WORKER_FLAG, json.dumps(spec)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{Path(script).name}: worker {json.dumps(spec)} failed:\n{done.stderr[-3000:]}")
    return last_json_line(done.stdout)


def set_items(items: Sequence[str]) -> list[str]:
    """``--set`` arguments of ``distrec train`` for ``section.key=value`` items."""
    return [arg for item in items for arg in ("--set", item)]


@dataclass
class TrainedRun:
    """A ``distrec train`` run: its output folder, ``summary.json`` and ``breakdown.json``, and wall time (s)."""

    out: Path
    summary: dict[str, Any]
    breakdown: dict[str, Any]
    wall_s: float

    def step_ms(self, components: Sequence[str], statistic: str = "mean_ms") -> float:
        """The breakdown's ``statistic`` summed over ``components`` (ms per step)."""
        return sum(self.breakdown["components"][c][statistic] for c in components)


def distrec_train(
    out: str | Path, arguments: Sequence[str], procs: int = 1, cache_dir: str | Path | None = None, env: Mapping[str, str] | None = None
) -> TrainedRun:
    """``distrec train --no-progress --out OUT ARGUMENTS`` (with ``--nproc-per-node`` when ``procs > 1``),
    with ``env`` added to this process's environment."""
    out = Path(out)
    command = [sys.executable, "-m", "distrec", "train", "--no-progress", "--overwrite", "--out", str(out), *arguments]
    if cache_dir is not None:
        command += ["--cache-dir", str(cache_dir)]
    if procs > 1:
        command += ["--nproc-per-node", str(procs)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise SystemExit(f"distrec train --out {out} failed:\n{done.stderr[-3000:]}")
    return TrainedRun(out, json.loads((out / "summary.json").read_text()), json.loads((out / "breakdown.json").read_text()), time.perf_counter() - started)


def free_port() -> int:
    """A TCP port free on this machine now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world_size: int, ranks_per_host: int, master_addr: str, master_port: int) -> dict[str, str]:
    """torchrun's environment variables of ``rank`` (hosts hold consecutive ranks)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank % ranks_per_host),
        "LOCAL_WORLD_SIZE": str(ranks_per_host),
        "GROUP_RANK": str(rank // ranks_per_host),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def launch_ranks(commands: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]], name: str) -> None:
    """Start one process per rank (``commands[r]`` with ``os.environ`` + ``envs[r]``) and wait
    for all; at the first failure stop the others and exit naming it."""
    procs = [subprocess.Popen(list(cmd), env={**os.environ, **env}) for cmd, env in zip(commands, envs, strict=True)]
    try:
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                raise SystemExit(f"{name}: rank {failed[0]} exited with status {procs[failed[0]].returncode}")
            time.sleep(0.2)
        failed = [r for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            raise SystemExit(f"{name}: rank {failed[0]} exited with status {procs[failed[0]].returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)


# ----------------------------------------------------------------------------- training


def train_epochs(
    model: Any,
    dataset: Any,
    rows: np.ndarray,
    epochs: int,
    batch_size: int,
    seed: int,
    lr: float,
    embedding_lr: float,
    after_epoch: Callable[[int], None] | None = None,
) -> None:
    """``epochs`` shuffled passes over ``rows`` of a ``distrec.data.Dataset`` with distrec's
    training step (Adam for the dense parameters, lazy Adam for the tables), in this process.
    ``after_epoch(epoch)`` (epochs counted from 1) runs after each pass, e.g. to evaluate;
    it gets the model in eval mode and training resumes in train mode."""
    from distrec.components.optim import make_optimizers
    from distrec.components.step import TrainStep

    step = TrainStep(model, make_optimizers(model, "adam", lr, "adam", embedding_lr))
    for epoch in range(epochs):
        model.train()
        for batch in dataset.batches(rows, batch_size, shuffle=True, seed=seed, epoch=epoch):
            step(batch)
        if after_epoch is not None:
            model.eval()
            after_epoch(epoch + 1)


# ----------------------------------------------------------------------------- results


@dataclass
class SystemResult:
    """One system's measurements of one metric, one value per round (or per seed, run, ...).

    ``extra`` holds further figures of the system (e.g. its memory), written beside these.
    """

    system: str
    metric: str
    unit: str
    rounds: Samples
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return self.rounds.median

    def to_json(self) -> dict[str, Any]:
        return {"system": self.system, "metric": self.metric, "unit": self.unit, "rounds": self.rounds.values, "median": self.median, **self.extra}


RECORD_KEYS = ("benchmark", "systems", "ratio")


@dataclass
class ResultRecord:
    """What every benchmark reports, the last line it prints.

    ``benchmark`` is the script's name; ``systems`` one entry per system and metric (its
    rounds and their median); ``ratio`` the headline comparison (the candidate's median over
    the baseline's, as the benchmark defines it; None when it compares several configurations,
    whose ratios are then among the extra figures); ``extra`` every further figure, written
    beside these keys.
    """

    benchmark: str
    systems: list[SystemResult]
    ratio: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        clash = [k for k in RECORD_KEYS if k in self.extra]
        if clash:
            raise ValueError(f"{self.benchmark}: extra figures may not be named {', '.join(clash)}")
        return {"benchmark": self.benchmark, "systems": [s.to_json() for s in self.systems], "ratio": self.ratio, **self.extra}


def finish(record: ResultRecord, path: str | Path | None = None) -> dict[str, Any]:
    """Write ``record`` to ``path`` (JSON, atomically), then print it as the last line of output; its JSON."""
    result = record.to_json()
    if path is not None:
        atomic_write_json(Path(path), result)
    print(json.dumps(result), flush=True)
    return result


def figure(panels: int = 1, width: float = 5.5, height: float = 4.0) -> tuple[Any, list[Any]]:
    """A matplotlib Figure (no display needed) with ``panels`` axes side by side."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * panels, height))
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, panels, i + 1) for i in range(panels)]


def bars(ax: Any, categories: Sequence[str], series: Mapping[str, Sequence[float]], ylabel: str, errors: Mapping[str, Sequence[float]] | None = None) -> None:
    """Grouped bars: one group per category, one bar per series (a legend when more than one)."""
    x = np.arange(len(categories))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        yerr = errors.get(label) if errors else None
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, yerr=yerr, capsize=3 if yerr is not None else 0, label=label)
    ax.set_xticks(x, list(categories))
    ax.set_ylabel(ylabel)
    if len(series) > 1:
        ax.legend()


def save_png(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` as a PNG (atomically); every axes must have a y label, and an x label or tick labels."""
    for ax in fig.axes:
        if not ax.get_ylabel() or not (ax.get_xlabel() or any(t.get_text() for t in ax.get_xticklabels())):
            raise ValueError(f"a panel of {Path(path).name} has unlabelled axes; give it a y label and an x label or tick labels")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    atomic_write_bytes(Path(path), buffer.getvalue())
    return Path(path)
