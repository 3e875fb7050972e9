"""Data: parse inputs once into a memory-mapped cache, then stream mini-batches.

Typical use::

    cache = prepare(cfg.data)                   # parses on first use, reuses afterwards
    ds = Dataset(cache, cfg.data)
    split = ds.split(cfg.data.split, seed=0)
    tables = ds.tables(dim=16)
    for batch in ds.batches(split["train"], 2048, shuffle=True, seed=0, epoch=0): ...
"""

from distrec.data.batch import Batch
from distrec.data.cache import default_cache_root, open_source, prepare, read_manifest
from distrec.data.criteo import read_criteo
from distrec.data.dataset import Dataset, num_batches, parse_split, table_index, table_rows
from distrec.data.movielens import read_movielens
from distrec.data.source import Chunk, Source, SparseFeature
from distrec.data.synthetic import SyntheticGenerator, generate, interaction_groups, read_synthetic, synthesize, zipf_exponents
from distrec.data.tabular import load_schema, read_tabular

__all__ = [
    "Batch",
    "Chunk",
    "Dataset",
    "Source",
    "SparseFeature",
    "SyntheticGenerator",
    "default_cache_root",
    "generate",
    "interaction_groups",
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
