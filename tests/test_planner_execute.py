"""Executing plans on two gloo processes: every device reports compute and all-to-all times."""

import pytest

from distrec.planner.api import plan_tables
from distrec.planner.execute import COST_PARTS, execute_plans
from distrec.planner.types import TableSpec

HIST = (0.6, 0.3, 0.1) + (0.0,) * 14


@pytest.mark.parametrize("share_cores", [True, False])
def test_execute_two_plans_on_two_processes(share_cores):
    """Interleaved steps after compute in turns (CPU default) and real parallel steps give the same report."""
    tables = [TableSpec(f"t{i}", 500 * (i + 1), 8 * (i % 3 + 1), 2.0 + i, HIST) for i in range(5)]
    plans = [plan_tables(tables, 2, 10**6, algorithm=a)[0] for a in ("size-greedy", "dim-greedy")]
    results = execute_plans([(p, tables) for p in plans], batch_size=32, warmup=1, repeats=2, progress=False, step_repeats=4, share_cores=share_cores)
    assert len(results) == 2
    for r in results:
        assert set(r) == set(COST_PARTS) and all(len(v) == 2 for v in r.values())
        for d in range(2):
            assert min(r[part][d] for part in COST_PARTS) > 0
            assert r["total"][d] == pytest.approx(r["compute"][d] + r["fw_comm"][d] + r["bw_comm"][d])
