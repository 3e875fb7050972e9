"""StepTimer: nested phases are charged to themselves only, and bytes are counted per step."""

from __future__ import annotations

import pytest

from distrec.components.breakdown import COLLECTIVES, COMPONENTS, StepTimer


def test_a_phase_inside_another_is_not_charged_twice(monkeypatch):
    """Seconds on a fake clock: the outer phase runs 0-10 s, the inner 2-9 s, inside it 3-4 s."""
    timer = StepTimer(skip_first=0)
    clock = iter([0.0, 2.0, 3.0, 4.0, 9.0, 10.0])
    monkeypatch.setattr(timer, "_now", lambda: next(clock))
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
