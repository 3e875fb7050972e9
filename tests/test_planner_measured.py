"""Choosing among candidate plans by timing their devices: the measured-cheapest plan is kept."""

import numpy as np
import pytest
import torch

from distrec.planner.api import format_report, plan_tables
from distrec.planner.cost_models import CommCostNet, ComputeCostNet, ComputeEnsemble, CostModels
from distrec.planner.measured import DeviceTimer, choose_measured
from distrec.planner.search import Placement, SearchOptions
from distrec.planner.types import Chunk, TableSpec

HIST = (0.5, 0.5) + (0.0,) * 15
TABLES = [TableSpec(name, 512, 8, 2.0, HIST) for name in ("slow", "b", "c")]
FAKE_MS = {"slow": 1000.0, "b": 500.0, "c": 1.0}  # per table; a device costs the sum


@pytest.fixture(scope="module")
def predictor():
    torch.manual_seed(0)
    return CostModels(ComputeEnsemble([ComputeCostNet()]), {2: (CommCostNet(4, 2), CommCostNet(2, 2))}, 256, {}).predictor(2)


def candidate(device_of: list[int], predicted_compute: list[float]) -> Placement:
    """The three whole tables on 2 devices, with made-up predicted costs (no all-to-all)."""
    compute = np.array(predicted_compute)
    zeros = np.zeros(2)
    return Placement([Chunk(i, 0, 8) for i in range(3)], device_of, {"compute": compute, "bw_comm": zeros, "fw_comm": zeros, "total": compute})


class FakeTimer:
    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def __call__(self, tables):
        self.asked.append(sorted(t.name for t in tables))
        return sum(FAKE_MS[t.name] for t in tables)


def test_the_measured_cheapest_candidate_is_kept_not_the_predicted_one(predictor):
    predicted_best = candidate([0, 0, 1], [5.0, 4.0])  # "slow" shares device 0 with "b"
    runner_up = candidate([0, 1, 1], [6.0, 6.0])  # "slow" alone: measured cheaper
    timer = FakeTimer()
    choice = choose_measured([predicted_best, runner_up], TABLES, predictor, timer)
    assert choice.index == 1 and choice.candidates == 2
    expected = predictor.plan_costs(np.array([1000.0, 501.0]), np.array([8.0, 16.0]))
    assert choice.max_cost == pytest.approx(expected["total"].max())
    assert timer.asked[:2] == [["b", "slow"], ["c"]]  # the predicted-dearest device first


def test_a_candidate_stops_being_timed_once_one_device_is_dearer_than_the_best(predictor):
    fast = candidate([0, 1, 1], [5.0, 4.0])
    slow_first = candidate([0, 0, 1], [7.0, 1.0])  # its dearest device holds "slow" and "b": 1500 ms
    timer = FakeTimer()
    choice = choose_measured([slow_first, fast], TABLES, predictor, timer)
    assert choice.index == 1
    assert choice.devices_timed == 3 and timer.asked[-1] == ["b", "slow"]  # its other device never timed


def test_device_timer_times_once_per_set_of_tables():
    timer = DeviceTimer(batch_size=64, device="cpu")
    first = timer(TABLES[:2])
    assert first > 0
    assert timer(list(reversed(TABLES[:2]))) == first  # same tables, any order: the cached time
    assert timer(TABLES[1:]) != first


def test_plan_tables_times_the_candidates_and_reports_them(predictor):
    models = CostModels(ComputeEnsemble([ComputeCostNet()]), {2: (CommCostNet(4, 2), CommCostNet(2, 2))}, 256, {})
    tables = [TableSpec(f"t{i}", 256 * (i + 1), 8 * (1 + i % 2), 1.0 + i, HIST) for i in range(5)]
    options = SearchOptions(max_steps=2, grid_points=3, measured_plans=2)
    plan, report = plan_tables(tables, 2, 2**20, models, options=options)
    plan.validate([t.to_config() for t in tables], 2**20)
    measured = report["measured"]
    assert 2 <= measured["candidates"] <= 2 + 4 and 0 <= measured["kept"] < measured["candidates"]
    assert measured["devices_timed"] >= 2 and measured["max_ms"] == max(measured["ms"]["total"])
    assert "timed" in format_report(report)
    unmeasured = plan_tables(tables, 2, 2**20, models, options=SearchOptions(max_steps=2, grid_points=3, measured_plans=0))[1]
    assert "measured" not in unmeasured
