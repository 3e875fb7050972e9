"""StepTimer: nested phases are charged to themselves only, and bytes are counted per step."""

from __future__ import annotations

import pytest
import torch

from distrec.components.breakdown import COLLECTIVES, COMPONENTS, CudaClock, HostClock, StepTimer, clock_for


def test_a_phase_inside_another_is_not_charged_twice(monkeypatch):
    """Seconds on a fake clock: the outer phase runs 0-10 s, the inner 2-9 s, inside it 3-4 s."""
    timer = StepTimer(skip_first=0)
    clock = iter([0.0, 2.0, 3.0, 4.0, 9.0, 10.0])
    monkeypatch.setattr(timer.clock, "mark", lambda: next(clock))
    with timer.phase("gradient_all_reduce"):
        with timer.phase("replica_sync"):
            with timer.phase("optimizer"):
                pass
    timer.end_step()
    assert timer.steps[0] == {"gradient_all_reduce": 3000.0, "replica_sync": 6000.0, "optimizer": 1000.0}


def test_bytes_per_step_are_the_mean_over_every_step_of_each_collective():
    timer = StepTimer(skip_first=5)
    for step in range(4):
        if step % 2 == 1:
            timer.add_bytes("replica_sync", 1000)
        timer.add_bytes("input_all_to_all", 10)
        timer.end_step()
    assert timer.bytes_per_step() == pytest.approx({"input_all_to_all": 10, "output_all_to_all": 0, "gradient_all_reduce": 0, "replica_sync": 500})
    assert set(COLLECTIVES) <= set(COMPONENTS) and "replica_sync" in timer.summary()


def test_no_steps_no_bytes():
    assert StepTimer().bytes_per_step() == dict.fromkeys(COLLECTIVES, 0.0)


class DeferredClock:
    """A stand-in for CUDA events: marks are step numbers read only after ``settle``."""

    def __init__(self) -> None:
        self.now, self.settled = 0.0, 0

    def mark(self) -> float:
        self.now += 1.0
        return self.now

    def ms(self, start: float, end: float) -> float:
        assert self.settled, "a mark was read before its events were waited for"
        return end - start

    def settle(self) -> None:
        self.settled += 1


def test_a_device_clock_is_read_only_when_the_steps_are_or_every_settle_every_steps(monkeypatch):
    timer = StepTimer(skip_first=0)
    timer.clock = clock = DeferredClock()
    monkeypatch.setattr(StepTimer, "SETTLE_EVERY", 3)
    for _ in range(2):
        with timer.phase("optimizer"):
            pass
        timer.end_step()
    assert clock.settled == 0  # no wait for the device in a step
    assert timer.steps == [{"optimizer": 1.0}, {"optimizer": 1.0}] and clock.settled == 1
    for _ in range(3):
        timer.end_step()
    assert clock.settled == 2 and len(timer._pending) == 0


def test_the_clock_follows_the_device():
    assert isinstance(clock_for(torch.device("cpu")), HostClock) and isinstance(clock_for(None), HostClock)
    assert isinstance(clock_for(torch.device("cuda", 0)), CudaClock)
