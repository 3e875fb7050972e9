"""Table descriptions from a YAML or JSON file, for ``distrec plan --tables FILE``."""

from __future__ import annotations

from pathlib import Path

import yaml

from distrec.errors import DistrecError
from distrec.planner.table_pool import PUBLISHED_HISTOGRAMS
from distrec.planner.types import TableSpec

DEFAULT_HISTOGRAM = tuple(float(x) for x in PUBLISHED_HISTOGRAMS[1] / PUBLISHED_HISTOGRAMS[1].sum())
"""Used when a table gives no histogram: the published DLRM 2021 "Histogram of col sizes"."""


def load_table_specs(path: str | Path) -> list[TableSpec]:
    """Read ``[{name, rows, dim, pooling_factor, histogram?}, ...]`` (or ``{tables: [...]}``).

    YAML and JSON both parse (JSON is YAML). A table without ``histogram`` gets
    ``DEFAULT_HISTOGRAM``. Raises DistrecError naming the file and entry on any problem.

    Example file::

        - {name: user_id, rows: 1000000, dim: 64, pooling_factor: 1}
        - {name: item_history, rows: 200000, dim: 32, pooling_factor: 24.5}
    """
    p = Path(path)
    if not p.is_file():
        raise DistrecError(f"table file {str(p)!r} not found; check the --tables path")
    try:
        doc = yaml.safe_load(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DistrecError(f"table file {str(p)!r} is not text (byte {e.start} is not UTF-8); give a YAML/JSON list of tables") from None
    except yaml.YAMLError as e:
        raise DistrecError(f"table file {str(p)!r} is not valid YAML/JSON ({str(e).splitlines()[0]}); fix its syntax") from None
    entries = doc.get("tables") if isinstance(doc, dict) else doc
    if not isinstance(entries, list) or not entries:
        raise DistrecError(f"table file {str(p)!r} must hold a non-empty list of tables (or a 'tables:' list)")
    tables = [TableSpec.from_dict(e, f"{p.name} entry {i}", DEFAULT_HISTOGRAM) for i, e in enumerate(entries)]
    names = [t.name for t in tables]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise DistrecError(f"table file {str(p)!r} names tables {duplicates} more than once; give every table a unique name")
    return tables
