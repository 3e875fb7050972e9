"""Data: parse inputs once into a memory-mapped cache, then stream mini-batches.

Typical use::

    cache = prepare(cfg.data)                   # parses what is not cached yet, reuses the rest
    ds = Dataset(cache, cfg.data)
    split = ds.split(cfg.data.split, seed=0)
    tables = ds.tables(dim=16)
    for batch in ds.batches(split["train"], 2048, shuffle=True, seed=0, epoch=0): ...

The mini-batch names (``Batch``, ``Dataset`` and its helpers) load torch, so they load on
first use: a process that only parses (``distrec data prepare``, its workers) never imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from distrec.data.cache import default_cache_root, prepare
from distrec.data.cache_files import read_manifest
from distrec.data.criteo import read_criteo
from distrec.data.inputs import InputFile, list_inputs
from distrec.data.movielens import read_movielens
from distrec.data.preparation import open_source
from distrec.data.source import Chunk, Source, SparseFeature
from distrec.data.split import parse_split
from distrec.data.synthetic import SyntheticGenerator, generate, interaction_groups, read_synthetic, synthesize, zipf_exponents
from distrec.data.tabular import load_schema, read_tabular

if TYPE_CHECKING:
    from distrec.data.batch import Batch
    from distrec.data.dataset import Dataset, num_batches, table_index, table_rows

_WITH_TORCH = {"Batch": "batch", "Dataset": "dataset", "num_batches": "dataset", "table_index": "dataset", "table_rows": "dataset"}

__all__ = [
    "Batch",
    "Chunk",
    "Dataset",
    "InputFile",
    "Source",
    "SparseFeature",
    "SyntheticGenerator",
    "default_cache_root",
    "generate",
    "interaction_groups",
    "list_inputs",
    "load_schema",
    "num_batches",
    "open_source",
    "parse_split",
    "prepare",
    "read_criteo",
    "read_manifest",
    "read_movielens",
    "read_synthetic",
    "read_tabular",
    "synthesize",
    "table_index",
    "table_rows",
    "zipf_exponents",
]


def __getattr__(name: str) -> Any:
    if name not in _WITH_TORCH:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WITH_TORCH[name]}"), name)
    globals()[name] = value
    return value
