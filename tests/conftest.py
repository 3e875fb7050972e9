import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    """The real data samples beside the checkout (../shared/data); skips when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data samples not found at {SHARED_DATA}")
    return SHARED_DATA


# Modules whose tests start several processes (gloo groups, the launcher): marked
# ``multiprocess`` so that a quick run can leave them out with -m "not multiprocess".
MULTIPROCESS_MODULES = {
    "test_cli_processes",
    "test_comm_timeout",
    "test_hotline_distributed",
    "test_hotline_distributed_step",
    "test_hotline_half_tables",
    "test_parallel_sptt_embedding",
    "test_planner_collect",
    "test_planner_emit",
    "test_planner_execute",
    "test_sharded_embedding",
    "test_sptt",
    "test_table_dtype",
    "test_torchrec_format",
    "test_train_distributed",
    "test_train_dmt",
    "test_train_sptt",
    "test_train_two_d",
}


# Modules whose tests check that a technique trains what one process trains, and that a
# checkpoint resumes exactly: marked ``equivalence``. CI runs them a second time with the
# compiled kernels off (DISTREC_KERNELS=torch), the operators a GPU runs.
EQUIVALENCE_MODULES = {
    "test_hotline_distributed",
    "test_hotline_distributed_step",
    "test_hotline_half_tables",
    "test_hotline_training",
    "test_models",
    "test_models_dmt",
    "test_parallel_sptt_embedding",
    "test_sharded_embedding",
    "test_sptt",
    "test_train_distributed",
    "test_train_dmt",
    "test_train_loop",
    "test_train_sptt",
    "test_train_two_d",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = item.module.__name__ if item.module is not None else ""
        if name in MULTIPROCESS_MODULES:
            item.add_marker(pytest.mark.multiprocess)
        if name in EQUIVALENCE_MODULES:
            item.add_marker(pytest.mark.equivalence)
