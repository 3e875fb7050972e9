"""Models: fused embedding bags, interactions, MLPs, DLRM/DCN assembly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from distrec.config import PRESETS, ModelConfig, apply_preset
from distrec.data.batch import Batch
from distrec.errors import DistrecError
from distrec.models.build import build_model
from distrec.models.embedding import EmbeddingBagCollection, feature_major, sample_major
from distrec.models.interaction import CatInteraction, CrossNet, DotInteraction, pair_positions, symmetric_pair_map
from distrec.models.mlp import mlp
from distrec.tables import TableConfig


def random_batch(tables: list[TableConfig], batch_size: int, num_dense: int, max_bag: int, seed: int) -> Batch:
    """A jagged batch with bag lengths in [0, max_bag] (0 = empty bag) and valid indices."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_bag + 1, (len(tables), batch_size), generator=g)
    values = [torch.randint(0, t.num_rows, (int(lengths[f].sum()),), generator=g) for f, t in enumerate(tables)]
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths.reshape(-1), 0, out=offsets[1:])
    dense = torch.randn(batch_size, num_dense, generator=g)
    labels = torch.randint(0, 2, (batch_size,), generator=g).float()
    return Batch(dense, torch.cat(values), offsets, labels)


def single_hot_batch(tables: list[TableConfig], batch_size: int, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    values = torch.cat([torch.randint(0, t.num_rows, (batch_size,), generator=g) for t in tables])
    offsets = torch.arange(values.numel() + 1)
    return Batch(torch.randn(batch_size, 3, generator=g), values, offsets, torch.ones(batch_size))


TABLES = [TableConfig("a", 7, 4), TableConfig("b", 3, 4, multi_hot=True), TableConfig("c", 11, 4)]


def reference_bags(ebc: EmbeddingBagCollection) -> list[nn.EmbeddingBag]:
    """One nn.EmbeddingBag per table holding a copy of that table's rows."""
    bags = []
    for t in ebc.tables:
        bag = nn.EmbeddingBag(t.num_rows, t.dim, mode="sum")
        with torch.no_grad():
            bag.weight.copy_(ebc.table_weight(t.name))
        bags.append(bag)
    return bags


def reference_pooled(bags: list[nn.EmbeddingBag], batch: Batch) -> torch.Tensor:
    b = batch.batch_size
    outs = []
    for f, bag in enumerate(bags):
        start = int(batch.sparse_offsets[f * b])
        offsets = batch.sparse_offsets[f * b : (f + 1) * b] - start
        outs.append(bag(batch.feature_values(f), offsets))
    return torch.stack(outs, dim=1)


@pytest.mark.parametrize("max_bag", [0, 1, 3], ids=["single-hot", "0-1-per-bag", "0-3-per-bag"])
def test_embedding_bag_collection_matches_per_table_embedding_bags(max_bag):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(TABLES)
    bags = reference_bags(ebc)
    if max_bag == 0:
        batch = single_hot_batch(TABLES, batch_size=5, seed=1)
    else:
        batch = random_batch(TABLES, batch_size=5, num_dense=2, max_bag=max_bag, seed=1)
    out = ebc(batch)
    expected = reference_pooled(bags, batch)
    assert out.shape == (5, 3, 4) and out.is_contiguous()
    torch.testing.assert_close(out, expected)
    if max_bag > 1:
        assert (batch.lengths() == 0).any(), "the test batch should contain empty bags"
    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()
    (expected * upstream).sum().backward()
    grad = ebc.weight.grad
    assert grad.is_sparse
    dense_grad = grad.to_dense()
    for t, bag in zip(ebc.tables, bags):
        start, end = ebc.table_rows(t.name)
        torch.testing.assert_close(dense_grad[start:end], bag.weight.grad)


def naive_sample_major(batch: Batch, row_offsets: list[int]) -> tuple[list[int], list[int]]:
    rows, offsets = [], [0]
    for b in range(batch.batch_size):
        for f, shift in enumerate(row_offsets):
            start, end = batch.sparse_offsets[f * batch.batch_size + b], batch.sparse_offsets[f * batch.batch_size + b + 1]
            rows += [int(v) + shift for v in batch.sparse_values[start:end]]
            offsets.append(len(rows))
    return rows, offsets


@pytest.mark.parametrize("max_bag", [1, 3])
def test_sample_major_equals_naive_reorder(max_bag):
    row_offsets = [0, 7, 10]
    if max_bag == 1:
        batch = single_hot_batch(TABLES, batch_size=6, seed=2)  # the transpose fast path
    else:
        batch = random_batch(TABLES, batch_size=6, num_dense=1, max_bag=max_bag, seed=2)
    rows, offsets, _ = sample_major(batch.sparse_values, batch.sparse_offsets, torch.tensor(row_offsets))
    assert (rows.tolist(), offsets.tolist()) == naive_sample_major(batch, row_offsets)


def test_feature_major_shifts_indices_in_place_and_knows_each_rows_bag():
    row_offsets = [0, 7, 10]
    batch = random_batch(TABLES, batch_size=6, num_dense=1, max_bag=3, seed=4)
    bags = feature_major(batch.sparse_values, batch.sparse_offsets, torch.tensor(row_offsets))
    b = batch.batch_size
    expected_rows, expected_bag = [], []
    for f, shift in enumerate(row_offsets):
        for s in range(b):
            start, end = batch.sparse_offsets[f * b + s], batch.sparse_offsets[f * b + s + 1]
            expected_rows += [int(v) + shift for v in batch.sparse_values[start:end]]
            expected_bag += [f * b + s] * int(end - start)
    assert bags.rows.tolist() == expected_rows
    assert bags.bag_of_row.tolist() == expected_bag
    assert torch.equal(bags.offsets, batch.sparse_offsets)
    single = single_hot_batch(TABLES, batch_size=4, seed=5)
    assert feature_major(single.sparse_values, single.sparse_offsets, torch.tensor(row_offsets)).bag_of_row is None


def test_embedding_gradient_entries_per_lookup_when_single_hot_and_per_row_when_multi_hot():
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(TABLES)
    single = single_hot_batch(TABLES, batch_size=9, seed=6)
    ebc(single).sum().backward()
    assert ebc.weight.grad._nnz() == single.sparse_values.numel()
    ebc.weight.grad = None
    multi = random_batch(TABLES, batch_size=9, num_dense=1, max_bag=3, seed=6)
    ebc(multi).sum().backward()
    shifted = feature_major(multi.sparse_values, multi.sparse_offsets, ebc.row_offsets).rows
    assert ebc.weight.grad._indices()[0].tolist() == sorted(set(shifted.tolist()))  # one entry per distinct row


def test_embedding_bags_over_given_rows_use_them_in_place_and_pool_them():
    rows = torch.arange(21 * 6, dtype=torch.float32).view(21, 6)[:, :4]  # strided, as a mapped file with row state
    ebc = EmbeddingBagCollection(TABLES, weight=rows)
    assert ebc.weight.data_ptr() == rows.data_ptr() and torch.equal(ebc.weight, rows)  # neither copied nor re-initialised
    batch = random_batch(TABLES, batch_size=5, num_dense=1, max_bag=3, seed=2)
    copied = EmbeddingBagCollection(TABLES)
    with torch.no_grad():
        copied.weight.copy_(rows)
    assert torch.equal(ebc(batch), copied(batch))
    with pytest.raises(DistrecError, match=r"embedding rows of shape \(20, 4\) do not fit tables of 21 rows of dim 4"):
        EmbeddingBagCollection(TABLES, weight=torch.zeros(20, 4))


def test_embedding_gradients_of_two_backward_passes_accumulate():
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(TABLES)
    batch = random_batch(TABLES, batch_size=8, num_dense=1, max_bag=3, seed=3)
    ebc(batch).square().sum().backward()
    full = ebc.weight.grad.to_dense()
    ebc.weight.grad = None
    for part in (batch.slice(0, 3), batch.slice(3, 8)):
        ebc(part).square().sum().backward()
    torch.testing.assert_close(ebc.weight.grad.to_dense(), full)


def test_embedding_init_table_views_and_state_dict():
    torch.manual_seed(0)
    tables = [TableConfig("small", 4, 3), TableConfig("big", 10_000, 3)]
    ebc = EmbeddingBagCollection(tables)
    assert ebc.table_weight("small").abs().max() <= 0.5
    assert ebc.table_weight("big").abs().max() <= 0.01
    assert ebc.table_weight("big").abs().max() > 0.009
    with torch.no_grad():
        ebc.table_weight("small")[2] = 7.0
    assert torch.equal(ebc.weight[2], torch.full((3,), 7.0))
    state = ebc.state_dict()
    assert list(state) == ["weight"]
    other = EmbeddingBagCollection(tables)
    other.load_state_dict(state)
    assert torch.equal(other.weight, ebc.weight)
    with pytest.raises(KeyError, match="no embedding table"):
        ebc.table_weight("missing")


def test_embedding_errors_are_one_line_distrec_errors():
    with pytest.raises(DistrecError, match="same dim"):
        EmbeddingBagCollection([TableConfig("a", 3, 4), TableConfig("b", 3, 8)])
    with pytest.raises(DistrecError, match="unique name"):
        EmbeddingBagCollection([TableConfig("a", 3, 4), TableConfig("a", 3, 4)])
    ebc = EmbeddingBagCollection(TABLES)
    batch = single_hot_batch(TABLES, batch_size=2, seed=0)
    batch.sparse_values[2] = 3  # feature "b" has 3 rows: index 3 would read table "c"
    with pytest.raises(DistrecError, match="'b' has index 3 but its table has 3 rows"):
        ebc(batch)
    batch.sparse_values[2] = -1
    with pytest.raises(DistrecError, match="index -1"):
        ebc(batch)
    with pytest.raises(DistrecError, match="3 sparse features but the model has 2 tables"):
        EmbeddingBagCollection(TABLES[:2])(single_hot_batch(TABLES, batch_size=2, seed=0))


def naive_dots(vectors: torch.Tensor, self_interaction: bool) -> torch.Tensor:
    n = vectors.shape[1]
    pairs = [(i, j) for i in range(n) for j in range(i if self_interaction else i + 1, n)]
    return torch.stack([(vectors[:, i] * vectors[:, j]).sum(-1) for i, j in pairs], dim=1)


@pytest.mark.parametrize("self_interaction", [False, True])
@pytest.mark.parametrize("has_dense", [False, True])
def test_dot_interaction_equals_naive_pairs(self_interaction, has_dense):
    torch.manual_seed(0)
    dense = torch.randn(4, 5, dtype=torch.float64, requires_grad=True) if has_dense else None
    sparse = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    interaction = DotInteraction(3, has_dense=has_dense, self_interaction=self_interaction)
    out = interaction(dense, sparse)
    vectors = torch.cat([dense.unsqueeze(1), sparse], 1) if has_dense else sparse
    expected = naive_dots(vectors, self_interaction)
    if has_dense:
        expected = torch.cat([dense, expected], 1)
    assert out.shape[1] == interaction.output_width(5)
    torch.testing.assert_close(out, expected)
    inputs = (sparse,) if dense is None else (dense, sparse)
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad((out * upstream).sum(), inputs)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), inputs)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(lambda *xs: interaction(*(xs if has_dense else (None, *xs))), inputs)


def test_pair_positions_and_cat_interaction():
    assert pair_positions(3, self_interaction=False).tolist() == [1, 2, 5]
    assert pair_positions(3, self_interaction=True).tolist() == [0, 1, 2, 4, 5, 8]
    assert symmetric_pair_map(3, self_interaction=False).tolist() == [3, 0, 1, 0, 3, 2, 1, 2, 3]
    assert symmetric_pair_map(2, self_interaction=True).tolist() == [0, 1, 1, 2]
    dense, sparse = torch.randn(2, 3), torch.randn(2, 4, 3)
    out = CatInteraction()(dense, sparse)
    assert torch.equal(out, torch.cat([dense, sparse[:, 0], sparse[:, 1], sparse[:, 2], sparse[:, 3]], 1))
    with pytest.raises(ValueError):
        DotInteraction(4, has_dense=True)(None, sparse)


@pytest.mark.parametrize("low_rank", [0, 2])
def test_cross_net_follows_its_formula(low_rank):
    torch.manual_seed(0)
    net = CrossNet(width=6, num_layers=3, low_rank=low_rank)
    x0 = torch.randn(5, 6)
    x = x0
    for projection in net.projections:
        if low_rank:
            down, up = projection[0], projection[1]
            assert down.weight.shape == (low_rank, 6)
            w, b = up.weight @ down.weight, up.bias
        else:
            w, b = projection.weight, projection.bias
        x = x0 * (x @ w.t() + b) + x
    torch.testing.assert_close(net(x0), x)


def test_mlp_layers_activation_and_init():
    torch.manual_seed(0)
    net = mlp([13, 512, 64], final_activation=True)
    kinds = [type(m).__name__ for m in net]
    assert kinds == ["Linear", "ReLU", "Linear", "ReLU"]
    assert [type(m).__name__ for m in mlp([8, 4, 1])] == ["Linear", "ReLU", "Linear"]
    std = net[0].weight.std().item()
    assert abs(std - (2 / (13 + 512)) ** 0.5) < 0.005
    assert (net(torch.randn(3, 13)) >= 0).all()


def preset(name: str) -> ModelConfig:
    cfg = ModelConfig()
    apply_preset(cfg, name)
    return cfg


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_builds_and_gives_one_logit_per_sample(name):
    torch.manual_seed(0)
    cfg = preset(name)
    tables = [TableConfig(f"t{i}", 5 + i, cfg.embedding_dim) for i in range(3)]
    model = build_model(cfg, 4, tables)
    batch = random_batch(tables, batch_size=6, num_dense=4, max_bag=2, seed=0)
    logits = model(batch)
    assert logits.shape == (6,) and logits.dtype == torch.float32
    logits.sum().backward()
    assert model.embeddings.weight.grad.is_sparse
    sparse_ids = {id(p) for p in model.sparse_parameters()}
    dense = model.dense_parameters()
    assert sparse_ids == {id(model.embeddings.weight)}
    assert len(dense) + 1 == len(list(model.parameters()))
    assert all(p.grad is not None and not p.grad.is_sparse for p in dense)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(interaction="cat"),
        dict(self_interaction=True),
        dict(arch="dcn", dcn_structure="stacked", cross_low_rank=2),
        dict(arch="dcn", bottom_mlp=[8]),
    ],
)
@pytest.mark.parametrize("num_dense", [0, 3])
def test_architecture_variants(overrides, num_dense):
    torch.manual_seed(0)
    cfg = preset("tiny")
    for key, value in overrides.items():
        setattr(cfg, key, value)
    tables = [TableConfig(f"t{i}", 4, cfg.embedding_dim) for i in range(2)]
    model = build_model(cfg, num_dense, tables)
    assert model(random_batch(tables, batch_size=3, num_dense=num_dense, max_bag=2, seed=1)).shape == (3,)


def test_model_state_dict_round_trips_and_embeddings_are_replaceable():
    torch.manual_seed(0)
    cfg = preset("tiny")
    tables = [TableConfig(f"t{i}", 6, cfg.embedding_dim) for i in range(2)]
    model = build_model(cfg, 2, tables)
    copy = build_model(cfg, 2, tables)
    copy.load_state_dict(model.state_dict())
    batch = random_batch(tables, batch_size=4, num_dense=2, max_bag=2, seed=0)
    assert torch.equal(copy(batch), model(batch))

    class Constant(nn.Module):
        def forward(self, b):
            return torch.ones(b.batch_size, len(tables), cfg.embedding_dim)

    copy.embeddings = Constant()
    assert copy(batch).shape == (4,)
    assert copy.sparse_parameters() == []


def test_build_model_rejects_bad_configs():
    cfg = preset("tiny")
    with pytest.raises(DistrecError, match="embedding_dim"):
        build_model(cfg, 2, [TableConfig("a", 3, cfg.embedding_dim + 1)])
    for key, value in (("arch", "mlp"), ("interaction", "cross"), ("dcn_structure", "mixed")):
        bad = preset("tiny")
        setattr(bad, key, value)
        if key == "dcn_structure":
            bad.arch = "dcn"
        with pytest.raises(DistrecError):
            build_model(bad, 2, [TableConfig("a", 3, cfg.embedding_dim)])


def test_split_batch_gradients_equal_full_batch_for_the_whole_model():
    torch.manual_seed(0)
    cfg = preset("tiny")
    tables = [TableConfig(f"t{i}", 9, cfg.embedding_dim) for i in range(3)]
    model = build_model(cfg, 2, tables)
    batch = random_batch(tables, batch_size=10, num_dense=2, max_bag=2, seed=4)
    loss = nn.functional.binary_cross_entropy_with_logits
    loss(model(batch), batch.labels, reduction="sum").backward()
    full = {n: p.grad.to_dense() if p.grad.is_sparse else p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    for rows in (torch.tensor([0, 3, 4]), torch.tensor([1, 2, 5, 6, 7, 8, 9])):
        part = batch.select(rows)
        loss(model(part), part.labels, reduction="sum").backward()
    for name, p in model.named_parameters():
        grad = p.grad.to_dense() if p.grad.is_sparse else p.grad
        torch.testing.assert_close(grad, full[name], msg=name)


def test_output_width_of_the_dlrm_benchmark_shape():
    assert DotInteraction(26).output_width(64) == 64 + 27 * 26 // 2
    assert DotInteraction(26, self_interaction=True).output_width(64) == 64 + 27 * 28 // 2
    assert DotInteraction(26, has_dense=False).output_width(64) == 26 * 25 // 2
