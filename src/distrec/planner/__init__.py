"""Embedding-table sharding planner: NeuroShard (learned cost models + search) and baselines.

Stages, one module each: ``types`` (vocabulary), ``features`` (table statistics),
``table_pool`` (synthetic DLRM tables and tasks), ``indices`` (synthetic index batches),
``heuristics`` (baselines; their greedy placement is ``distrec.parallel.placement``), ``torchrec_planner``
(TorchRec's planner as a baseline, optional), ``workload`` and ``collect``
(micro-benchmarks), ``cost_models`` (neural cost models), ``search`` (NeuroShard search),
``emit`` (ShardingPlan output), ``execute`` (running a plan), ``api`` (``plan_tables``),
``table_file`` and ``data_tables`` (tables from a YAML/JSON list or measured from a data set),
``store`` (where cost data and models live).
"""

from distrec.planner.api import ALGORITHMS, format_report, parse_constraints, plan_tables
from distrec.planner.collect import run_collect
from distrec.planner.cost_models import CostModels, train_cost_models
from distrec.planner.features import reuse_histogram, table_spec_from_indices
from distrec.planner.search import SearchOptions
from distrec.planner.table_file import load_table_specs
from distrec.planner.table_pool import generate_tasks, make_table_pool
from distrec.planner.types import PlanConstraints, TableSpec

__all__ = [
    "ALGORITHMS",
    "CostModels",
    "PlanConstraints",
    "SearchOptions",
    "TableSpec",
    "format_report",
    "generate_tasks",
    "load_table_specs",
    "make_table_pool",
    "parse_constraints",
    "plan_tables",
    "reuse_histogram",
    "run_collect",
    "table_spec_from_indices",
    "train_cost_models",
]
