import json

import pytest

from distrec.errors import DistrecError
from distrec.parallel.plan import ShardingPlan
from distrec.tables import TableConfig


def plan_json(tmp_path, rank, row_end=10):
    path = tmp_path / "plan.json"
    shard = {"rank": rank, "row_start": 0, "row_end": row_end, "col_start": 0, "col_end": 4}
    path.write_text(json.dumps({"world_size": 2, "tables": [{"table": "t", "sharding": "table_wise", "shards": [shard]}]}))
    return path


@pytest.mark.parametrize("rank, shown", [("1", "'1'"), (1.0, "1.0"), (True, "True"), (None, "None")])
def test_a_shard_field_that_is_not_an_integer_is_one_line(tmp_path, rank, shown):
    # regression: a string rank loaded, then validation died with "'<=' not supported between 'int' and 'str'"
    with pytest.raises(
        DistrecError,
        match=rf"sharding plan is malformed \(TypeError: shard rank is {shown}, not an "
        r"integer\); regenerate it with 'distrec plan'",
    ):
        ShardingPlan.load(plan_json(tmp_path, rank)).validate([TableConfig("t", 10, 4)])


def test_an_integer_plan_still_loads(tmp_path):
    plan = ShardingPlan.load(plan_json(tmp_path, 1))
    plan.validate([TableConfig("t", 10, 4)])
    assert plan.bytes_per_rank() == [0, 10 * 4 * 4]
