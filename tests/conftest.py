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
