"""Make ``torchrec_plan_tiny.json``: TorchRec's planner's plan of the tiny training tables, saved
with the snippet of docs/neuroshard-vs-torchrec.md (run in a TorchRec venv, e.g. one made by
benchmarks/setup_torchrec.sh: ``venv-torchrec/bin/python tests/data/make_torchrec_plan.py``).

The tables are those of tests/tiny_runs.py (5 sparse features of 97 rows, dim 8). Constraints
give each sharding type TorchRec runs on CPU a table: C1 table-wise, C2 column-wise (blocks of
4 columns), C3 data-parallel; C4 and C5 are left to the planner.
"""

import json
import warnings
from pathlib import Path

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

warnings.simplefilter("ignore")
names = ["C1", "C2", "C3", "C4", "C5"]
ebc = EmbeddingBagCollection(
    tables=[EmbeddingBagConfig(name=n, num_embeddings=97, embedding_dim=8, feature_names=[n]) for n in names], device=torch.device("meta")
)
only = {"C1": ["table_wise"], "C2": ["column_wise"], "C3": ["data_parallel"], "C4": None, "C5": None}
constraints = {n: ParameterConstraints(sharding_types=only[n], min_partition=4, pooling_factors=[2.0]) for n in names}
topology = Topology(world_size=2, compute_device="cpu")
plan = EmbeddingShardingPlanner(topology=topology, batch_size=35, constraints=constraints).plan(ebc, [EmbeddingBagCollectionSharder()])

# the snippet of docs/neuroshard-vs-torchrec.md, as a user would run it
shapes = {c.name: [c.num_embeddings, c.embedding_dim] for c in ebc.embedding_bag_configs()}
document = {
    "world_size": topology.world_size,
    "shapes": shapes,
    "plan": {
        module: {
            table: {
                "sharding_type": ps.sharding_type,
                "compute_kernel": ps.compute_kernel,
                "ranks": ps.ranks,
                "sharding_spec": None
                if ps.sharding_spec is None
                else [{"shard_offsets": s.shard_offsets, "shard_sizes": s.shard_sizes, "placement": str(s.placement)} for s in ps.sharding_spec.shards],
            }
            for table, ps in module_plan.items()
        }
        for module, module_plan in plan.plan.items()
    },
}
Path(__file__).with_name("torchrec_plan_tiny.json").write_text(json.dumps(document, indent=1) + "\n")
