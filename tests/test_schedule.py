"""Learning-rate warm-up and decay."""

from __future__ import annotations

import math

import pytest
import torch

from distrec.components.schedule import LRSchedule, make_schedulers
from distrec.errors import DistrecError


def test_warmup_then_constant():
    s = LRSchedule(warmup_steps=4)
    assert [s(i) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "decay, halfway",
    [("linear", 0.5), ("cosine", 0.5), ("poly", 0.25)],
)
def test_decays_start_halfway_and_end(decay, halfway):
    s = LRSchedule(warmup_steps=2, decay=decay, decay_start_step=10, decay_steps=8)
    assert s(0) == 0.5 and s(9) == 1.0 and s(10) == 1.0
    assert s(14) == pytest.approx(halfway)
    assert s(18) == 0.0 and s(100) == 0.0


def test_cosine_quarter_point():
    s = LRSchedule(decay="cosine", decay_steps=4)
    assert s(1) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))


def test_schedulers_drive_the_learning_rate_and_resume():
    param = torch.nn.Parameter(torch.zeros(1))
    opts = [torch.optim.SGD([param], lr=0.8), torch.optim.SGD([param], lr=0.4)]
    schedulers = make_schedulers(opts, warmup_steps=2, decay="linear", decay_start_step=2, decay_steps=4)
    seen = []
    for _ in range(4):
        seen.append([opt.param_groups[0]["lr"] for opt in opts])
        for opt in opts:
            opt.step()
        for sch in schedulers:
            sch.step()
    assert seen == [[0.4, 0.2], [0.8, 0.4], [0.8, 0.4], pytest.approx([0.6, 0.3])]
    resumed_opt = torch.optim.SGD([param], lr=0.8)
    resumed = make_schedulers([resumed_opt])
    resumed[0].load_state_dict(schedulers[0].state_dict())
    resumed_opt.load_state_dict(opts[0].state_dict())
    resumed[0].step()
    schedulers[0].step()
    assert resumed_opt.param_groups[0]["lr"] == pytest.approx(opts[0].param_groups[0]["lr"]) == pytest.approx(0.2)


def test_bad_schedules_are_distrec_errors():
    with pytest.raises(DistrecError, match="decay_steps"):
        LRSchedule(decay="linear")
    with pytest.raises(DistrecError, match="train.decay is 'exp'"):
        LRSchedule(decay="exp", decay_steps=3)
