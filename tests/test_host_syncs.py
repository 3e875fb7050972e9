"""No training step waits for the device more than its mode must.

On a GPU every read of a device value on the host (``item``, ``tolist``, ``bool``, ``int``,
``float``, ``nonzero``, ``cpu``, ``numpy``) stalls the step until the device catches up. The
steps here run on the CPU with the compiled kernels off (``DISTREC_KERNELS=torch``: the
operators a GPU runs) and count those reads on the training thread, per steady-state step
(the logging interval's read excluded: it checks the loss once per interval).

The budgets, and why each read is needed:

- one process, local tables, also half-precision ones: none (index ranges, bag layout and feature bounds come from the
  loader on the host; the finite-loss check waits for the logging interval);
- sharded, SPTT, DMT: 1, the input all-to-all's split sizes (how many indices each rank
  receives must be known on the host to size the exchange, as in TorchRec's input dist);
- 2D, exact sync: 3, that and the sizes of the two variable-length all-gathers of the touched
  rows' gradients (rows, then values) within each replica set;
- 2D, periodic sync: 1, as sharded (the replicas are averaged every ``sync_every`` steps);
- Hotline in one process (the slow tier in host memory, as on a GPU): 3, the popular
  samples' count (it sizes the micro-batches), the hot-lookup counter, and the cold rows' ids
  for their update in the slow tier. On a GPU a mini-batch with no popular sample also copies
  its cold ids to the host on the training thread (otherwise the prefetch worker does, while
  the popular micro-batch computes); on the CPU that copy is no call, so it is not counted;
- Hotline on several processes: 6, the input all-to-all's sizes, the features with cold
  lookups (they decide which exchange runs), the index count of each micro-batch (2), their
  feature bounds, and the hot-lookup counter.
"""

from __future__ import annotations

import pytest

from distrec.kernels import KERNELS_ENV
from host_syncs import syncs_on_rank
from multiprocess import run_distributed
from tiny_runs import tiny_config

HOTLINE = ("hotline.enabled=true", "hotline.relearn_every=3", "hotline.sample_rate=0.5", "hotline.hot_budget=2KB", "hotline.slow_tier=host")
SPTT_2X2 = ("parallel.lookup=sptt", "parallel.hosts=2", "parallel.ranks_per_host=2")
MODES = {
    "single": (1, (), 0),
    "single, one index per bag": (1, ("data.synthetic.pooling_factor=1",), 0),
    "single, fp16 tables": (1, ("model.table_dtype=fp16",), 0),
    "local": (2, ("parallel.embeddings=local",), 0),
    "sharded": (2, (), 1),
    "sharded row-wise": (2, ("parallel.sharding=row_wise",), 1),
    "sharded, bf16 tables": (2, ("model.table_dtype=bf16",), 1),
    "sptt": (4, SPTT_2X2, 1),
    "dmt": (4, (*SPTT_2X2, "model.tower_module=dlrm"), 1),
    "2d exact": (4, ("parallel.replica_groups=2",), 3),
    "2d periodic": (4, ("parallel.replica_groups=2", "parallel.replica_sync=periodic", "parallel.sync_every=10"), 1),
    "hotline tiers": (1, HOTLINE, 3),
    "hotline replicated": (2, (*HOTLINE, "train.embedding_optimizer=adagrad"), 6),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_a_steady_state_step_reads_the_device_at_most_its_budget(mode, tmp_path, monkeypatch):
    world_size, overrides, budget = MODES[mode]
    monkeypatch.setenv(KERNELS_ENV, "torch")
    cfg = tiny_config(tmp_path / "cache", steps=100, overrides=(*overrides, "train.log_every=0"))
    if world_size == 1:
        per_rank = [syncs_on_rank(0, 1, cfg, tmp_path / "run")]
    else:
        per_rank = run_distributed(syncs_on_rank, world_size, cfg, tmp_path / "run")
    for rank, sites in enumerate(per_rank):
        assert sum(sites.values()) <= budget, f"rank {rank}: {sites}"


def test_the_counter_counts_a_read_of_the_device(tmp_path):
    import collections

    import torch

    from host_syncs import counting_syncs

    sites: collections.Counter = collections.Counter()
    with counting_syncs(sites):
        torch.ones(3).sum().item()
        bool(torch.zeros(()))
    assert sum(sites.values()) == 2
