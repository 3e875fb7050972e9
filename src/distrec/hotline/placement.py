"""Where Hotline's threads run: computation away from the CPUs that service the disk tier.

Every cold row the prefetch worker reads from the disk tier ends in an interrupt from the
disk, handled on the CPUs the kernel routes that device's interrupts to
(``/proc/irq/N/effective_affinity_list``). A thread computing on one of those CPUs loses
time to the interrupts and the I/O completions that follow them
(``benchmarks/page_fault_interference.py``; benchmarks/results/2026-11-23-hotline-page-cache.md).
So with a disk slow tier Hotline runs
its training step on the other CPUs and the prefetch worker on the interrupt CPUs, provided
the other CPUs are enough for torch's compute threads. Linux only; elsewhere, or when the
device's interrupts cannot be found, threads are left where the scheduler puts them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SYS = Path("/sys")
PROC = Path("/proc")


def parse_cpu_list(text: str) -> frozenset[int]:
    """CPUs of a kernel CPU list such as ``"0-2,5"`` (``"0, 1"`` is accepted too)."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def device_interrupts(path: str | Path, sys_root: Path = SYS) -> list[int]:
    """Interrupt numbers of the block device holding ``path`` (its PCI function's MSI
    vectors, or its legacy ``irq``), found through sysfs; empty when there is none."""
    st_dev = os.stat(path).st_dev
    block = sys_root / "dev" / "block" / f"{os.major(st_dev)}:{os.minor(st_dev)}"
    if not block.exists():
        return []  # no block device behind the file system (tmpfs, overlay, network)
    node = block.resolve()
    if (node / "partition").exists():
        node = node.parent
    device = (node / "device").resolve() if (node / "device").exists() else node
    for directory in [device, *device.parents]:
        if (directory / "msi_irqs").is_dir():
            return sorted(int(name) for name in os.listdir(directory / "msi_irqs"))
        legacy = directory / "irq"
        if legacy.is_file() and (irq := int(legacy.read_text())) > 0:
            return [irq]
        if directory == sys_root / "devices":
            break
    return []


def interrupt_cpus(irqs: list[int], proc_root: Path = PROC) -> frozenset[int]:
    """CPUs that handle the interrupts ``irqs`` (each one's effective affinity, else the
    affinity it is allowed)."""
    cpus: set[int] = set()
    for irq in irqs:
        for name in ("effective_affinity_list", "smp_affinity_list"):
            file = proc_root / "irq" / str(irq) / name
            if file.is_file() and (text := file.read_text().strip()):
                cpus |= parse_cpu_list(text)
                break
    return frozenset(cpus)


@dataclass(frozen=True)
class ThreadPlacement:
    """CPUs for the training step's thread (``compute``) and for the prefetch worker (``prefetch``)."""

    compute: frozenset[int]
    prefetch: frozenset[int]

    @classmethod
    def away_from_disk(cls, path: str | Path, compute_threads: int, sys_root: Path = SYS, proc_root: Path = PROC) -> ThreadPlacement | None:
        """Compute on the allowed CPUs that do not handle the interrupts of the disk holding
        ``path``, prefetch on those that do; None when that leaves fewer than
        ``compute_threads`` CPUs for computing, or the interrupts are unknown."""
        if not hasattr(os, "sched_setaffinity"):
            return None
        allowed = frozenset(os.sched_getaffinity(0))
        try:
            disk = interrupt_cpus(device_interrupts(path, sys_root), proc_root) & allowed
        except (OSError, ValueError):
            return None
        compute = allowed - disk
        if not disk or len(compute) < max(1, compute_threads):
            return None
        return cls(compute, disk)

    def pin_prefetch_worker(self) -> None:
        """Pin the calling thread (the prefetch worker) to the ``prefetch`` CPUs."""
        os.sched_setaffinity(0, self.prefetch)

    @contextmanager
    def computing(self) -> Iterator[None]:
        """Run the block with the calling thread on the ``compute`` CPUs, then restore its
        CPUs (threads it starts meanwhile inherit the ``compute`` CPUs)."""
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, self.compute)
        try:
            yield
        finally:
            os.sched_setaffinity(0, before)

    def describe(self) -> dict[str, list[int]]:
        """The placement as sorted CPU lists, for reports."""
        return {"compute_cpus": sorted(self.compute), "prefetch_cpus": sorted(self.prefetch)}
