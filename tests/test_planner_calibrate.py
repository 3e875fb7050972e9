"""``distrec plan calibrate``: what a budget buys, which samples active sampling picks, the models' disagreement."""

import json
import re

import numpy as np
import pytest

from distrec.errors import DistrecError
from distrec.planner.calibrate import (
    MIN_COMM,
    MIN_COMPUTE,
    SampleCosts,
    _fresh_ids,
    _measure_random,
    chosen_counts,
    comm_predictions,
    compute_predictions,
    most_uncertain,
    sample_counts,
)
from distrec.planner.collect import done_sample_ids
from distrec.planner.cost_models import train_cost_models
from test_planner_cost_models import write_synthetic_costs

COSTS = SampleCosts(compute_s=0.5, comm_s={4: 1.0, 8: 2.0}, comm_start_s={4: 5.0, 8: 8.0})


def test_a_budget_buys_half_compute_half_all_to_all_after_training_and_start_ups():
    counts = sample_counts(600, COSTS, spent_s=30)
    collect = 600 * 0.85 - 30
    assert counts.compute == int(collect / 2 / 0.5)
    assert counts.comm == {4: int((collect / 4 - 10) / 1.0), 8: int((collect / 4 - 16) / 2.0)}
    assert counts.collect_s <= collect and counts.train_s == pytest.approx(90)


def test_a_budget_too_small_names_one_that_suffices():
    with pytest.raises(DistrecError, match="buys only .* samples here; give --budget-minutes") as raised:
        sample_counts(60, COSTS, spent_s=20)
    assert "\n" not in str(raised.value)
    minutes = int(re.search(r"--budget-minutes (\d+)", str(raised.value)).group(1))
    counts = sample_counts(minutes * 60, COSTS, spent_s=20)  # the named budget is enough
    assert counts.compute >= MIN_COMPUTE and min(counts.comm.values()) >= MIN_COMM


def test_the_budget_left_buys_chosen_samples_half_compute_half_all_to_all():
    assert chosen_counts(120, COSTS) == (120, {4: 25, 8: 11})  # 30 s per world size: one start-up, then samples
    assert chosen_counts(-5, COSTS) == (0, {4: 0, 8: 0})  # an overrun budget buys nothing more


def test_random_samples_reprice_a_sample_from_what_they_took(tmp_path, monkeypatch):
    """A fake clock: each new sample takes its kind's seconds, each all-to-all run adds its start-up."""
    data, clock = tmp_path / "costs.jsonl", [0.0]
    per_sample, start_up = {"compute-": 0.25, "comm4-": 0.5, "comm8-": 0.75}, {4: 5.0, 8: 8.0}
    monkeypatch.setattr("distrec.planner.calibrate.time.perf_counter", lambda: clock[0])

    def collect(compute: int, comm: int, devices: int) -> None:
        prefix, count = ("compute-", compute) if compute else (f"comm{devices}-", comm)
        new = _fresh_ids(data, prefix, count)[: count - sum(i.startswith(prefix) for i in done_sample_ids(data))]
        with data.open("a") as f:
            f.writelines(json.dumps({"id": f"{prefix}{i}"}) + "\n" for i in new)
        clock[0] += len(new) * per_sample[prefix] + (start_up[devices] if comm else 0.0)

    collect(4, 0, 4)  # as if the pilot measured some already
    costs = _measure_random(collect, data, [4, 8], 20, {4: 10, 8: 6}, COSTS)
    assert costs.compute_s == pytest.approx(0.25) and costs.comm_s == pytest.approx({4: 0.5, 8: 0.75})
    again = _measure_random(collect, data, [4, 8], 20, {4: 10, 8: 6}, COSTS)  # nothing new to measure: the pilot's prices
    assert again == COSTS


def test_most_uncertain_takes_the_largest_relative_spread():
    predictions = np.array([[10.0, 1.0, 100.0, 5.0], [10.0, 2.0, 110.0, 5.5]])  # spreads 0, 1/3, 1/21, 1/21
    assert most_uncertain([7, 8, 9, 10], predictions, 2) == [8, 9]
    assert most_uncertain([7, 8, 9, 10], predictions, 1) == [8]


def test_fresh_ids_skip_the_samples_already_measured(tmp_path):
    data = tmp_path / "costs.jsonl"
    data.write_text("".join(json.dumps({"kind": "comm", "id": f"comm4-{i}"}) + "\n" for i in (0, 1, 3)))
    assert _fresh_ids(data, "comm4-", 3) == [2, 4, 5]
    assert _fresh_ids(data, "comm8-", 2) == [0, 1]


@pytest.fixture(scope="module")
def quick_models(tmp_path_factory):
    data = write_synthetic_costs(tmp_path_factory.mktemp("costs") / "costs.jsonl", compute_samples=60, comm_samples=40)
    return [train_cost_models(data, None, seed=s, epochs=10, verbose=False) for s in (0, 0, 1)]


def test_models_disagree_only_when_trained_differently(quick_models):
    same, other = quick_models[:2], quick_models[::2]
    ids = list(range(6))
    for predict in (lambda m: compute_predictions(m, ids, seed=0, max_dim=16), lambda m: comm_predictions(m, 2, ids, seed=0, max_dim=16)):
        agreeing, disagreeing = predict(same), predict(other)
        assert agreeing.shape == (2, 6) and np.all(agreeing > 0)
        np.testing.assert_allclose(agreeing[0], agreeing[1])  # the same seed gives the same model
        assert np.abs(disagreeing[0] - disagreeing[1]).max() > 1e-3
