import numpy as np
import pytest
import torch

from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.hotline.embedding import HotlineEmbeddingBagCollection
from distrec.hotline.hot_set import HotSet
from distrec.models.dlrm import DLRM
from distrec.tables import TableConfig

TABLES = [TableConfig("t0", 40, 8), TableConfig("t1", 25, 8), TableConfig("t2", 60, 8, multi_hot=True)]


def zipf_batch(rng: np.random.Generator, size: int, shift: int = 0) -> Batch:
    """A batch whose indices follow a Zipf-like law (rotated by ``shift``); t2 has bags of 0-3."""
    values, lengths = [], []
    for t in TABLES:
        n = rng.integers(0, 4, size) if t.multi_hot else np.ones(size, dtype=np.int64)
        ranks = np.minimum(rng.zipf(1.6, int(n.sum())) - 1, t.num_rows - 1)
        values.append((ranks + shift) % t.num_rows)
        lengths.append(n)
    lengths = np.concatenate(lengths)
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Batch(
        torch.from_numpy(rng.standard_normal((size, 4)).astype(np.float32)),
        torch.from_numpy(np.concatenate(values).astype(np.int64)),
        torch.from_numpy(offsets),
        torch.from_numpy(rng.integers(0, 2, size).astype(np.float32)),
    )


def tiny_dlrm() -> DLRM:
    torch.manual_seed(0)
    return DLRM(4, TABLES, bottom_mlp=[8], top_mlp=[8])


def all_rows(ebc: HotlineEmbeddingBagCollection) -> torch.Tensor:
    return ebc.weights(torch.arange(ebc.space.total_rows))


def test_forward_matches_the_models_embedding_bags_with_rows_in_both_tiers():
    model = tiny_dlrm()
    ebc = HotlineEmbeddingBagCollection.from_embedding_bags(model.embeddings, slow="host")
    ebc.set_hot_set(HotSet.from_global_ids(np.array([0, 1, 2, 40, 65, 66]), ebc.space, 0))
    batch = zipf_batch(np.random.default_rng(1), 16)
    assert torch.equal(ebc(batch), model.embeddings(batch))


def test_a_prefetched_lookup_is_used_instead_of_gathering(monkeypatch):
    model = tiny_dlrm()
    ebc = HotlineEmbeddingBagCollection.from_embedding_bags(model.embeddings, slow="host")
    batch = zipf_batch(np.random.default_rng(2), 8)
    lookup = ebc.lookup(batch)
    monkeypatch.setattr(ebc.store, "gather", None)  # any gather would fail
    with ebc.prefetched(lookup):
        out = ebc(batch)
    assert torch.equal(out, model.embeddings(batch))


def test_default_initialisation_is_dlrms_uniform_and_seeded():
    first = all_rows(HotlineEmbeddingBagCollection(TABLES, seed=1, slow="host"))
    assert torch.equal(first, all_rows(HotlineEmbeddingBagCollection(TABLES, seed=1, slow="host")))
    assert not torch.equal(first, all_rows(HotlineEmbeddingBagCollection(TABLES, seed=2, slow="host")))
    start = 0
    for t in TABLES:
        rows = first[start : start + t.num_rows]
        bound = (1.0 / t.num_rows) ** 0.5
        assert rows.abs().max() <= bound and rows.abs().max() > 0.8 * bound
        start += t.num_rows


def test_an_index_outside_its_table_is_a_user_error():
    ebc = HotlineEmbeddingBagCollection(TABLES, slow="host")
    batch = zipf_batch(np.random.default_rng(3), 4)
    batch.sparse_values[0] = TABLES[0].num_rows  # would silently read table t1 in a fused table
    with pytest.raises(DistrecError, match="outside"):
        ebc(batch)


def zero_touched_rows(rows: torch.Tensor, grad: torch.Tensor) -> None:
    """A row rule that zeroes every stored row with a gradient entry."""
    rows.index_fill_(0, grad.coalesce().indices()[0], 0.0)


def test_a_hot_lookup_pools_from_the_fast_tier_without_gathering(monkeypatch):
    model = tiny_dlrm()
    ebc = HotlineEmbeddingBagCollection.from_embedding_bags(model.embeddings, slow="host")
    batch = zipf_batch(np.random.default_rng(6), 16)
    ids = ebc.space.batch_ids(batch)
    untouched_rows = np.setdiff1d(np.arange(ebc.space.total_rows), ids.numpy())[:3]
    hot = np.union1d(ids.numpy(), untouched_rows)  # every row of the batch, and three it does not touch
    ebc.set_hot_set(HotSet.from_global_ids(hot, ebc.space, 0))
    slots = ebc.store.slots(ids)
    assert bool((slots >= 0).all())
    monkeypatch.setattr(ebc.store, "gather", None)  # any gather would fail
    with ebc.prefetched(ebc.hot_lookup(batch, slots)):
        out = ebc(batch)
    assert torch.equal(out, model.embeddings(batch))
    out.sum().backward()
    before = ebc.store.fast.clone()
    assert ebc.apply_gradients(zero_touched_rows)
    touched = torch.zeros(len(hot), dtype=torch.bool)
    touched[slots] = True
    assert bool((ebc.store.fast[touched] == 0).all())  # updated in place, in the fast tier
    assert (~touched).sum() == 3 and torch.equal(ebc.store.fast[~touched], before[~touched])
