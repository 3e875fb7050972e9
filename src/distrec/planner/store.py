"""Where the planner keeps this machine's cost data and trained cost models.

By default both live in one folder, ``planner/`` under the distrec cache root
(``$DISTREC_CACHE``, else ``~/.cache/distrec``, as the data cache): ``costs.jsonl`` is what
``distrec plan collect`` measures, ``cost_models.pt`` what ``distrec plan
train-cost-models`` trains from it and ``distrec plan`` reads. Each command takes another
folder (or file) instead.
"""

from __future__ import annotations

from pathlib import Path

from distrec.config import DataConfig
from distrec.data.cache import default_cache_root
from distrec.errors import DistrecError
from distrec.planner.cost_models import CostModels

COST_DATA_FILE = "costs.jsonl"
COST_MODELS_FILE = "cost_models.pt"


def planner_dir(path: str | Path | None = None) -> Path:
    """``path``, else ``planner/`` under the distrec cache root."""
    return Path(path).expanduser() if path is not None else default_cache_root(DataConfig()) / "planner"


def cost_models_path(path: str | Path | None = None) -> Path:
    """The cost-models file: ``path`` itself if it names a file, else ``cost_models.pt`` in that folder."""
    p = planner_dir(path)
    return p / COST_MODELS_FILE if p.is_dir() or p.suffix != ".pt" else p


def load_cost_models(path: str | Path | None = None) -> CostModels:
    """The trained cost models at ``path`` (a folder or a .pt file; default ``planner_dir()``).

    Raises DistrecError naming the two commands that produce them when there are none.
    """
    p = cost_models_path(path)
    if not p.is_file():
        folder = "" if path is None else f" --out {p.parent}"
        raise DistrecError(
            f"no cost models at {str(p)!r}; measure this machine with 'distrec plan collect --devices D{folder}' and train "
            f"them with 'distrec plan train-cost-models{folder}', or plan without them with --algorithm size-lookup-greedy"
        )
    return CostModels.load(p)
