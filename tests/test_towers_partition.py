import json

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from distrec.errors import DistrecError
from distrec.tower_partition import TowerPartition, naive_assignment
from distrec.towers.partition import (
    embed_features,
    interaction_matrix,
    partition_features,
    plot_similarity,
    tightest_ratio,
    tower_size_bounds,
)


def planted_embeddings(group_sizes, rows=256, dim=16, noise=0.3, seed=0):
    """Pooled embeddings [rows, F, dim]: features of a group follow one latent vector per sample."""
    gen = torch.Generator().manual_seed(seed)
    groups = np.repeat(np.arange(len(group_sizes)), group_sizes)
    latent = torch.randn(rows, len(group_sizes), dim, generator=gen)
    scale = torch.rand(len(groups), 1, generator=gen) + 0.5
    pooled = latent[:, groups] * scale + noise * torch.randn(rows, len(groups), dim, generator=gen)
    return pooled, groups


def names_for(n):
    return [f"C{i + 1}" for i in range(n)]


def test_interaction_matrix_is_absolute_mean_cosine():
    pooled = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(1))
    pooled[:, 2] = -2 * pooled[:, 0]
    interaction = interaction_matrix(pooled)
    cos = torch.nn.functional.cosine_similarity(pooled[:, 0], pooled[:, 1], dim=1).mean().abs()
    torch.testing.assert_close(interaction[0, 1], cos)
    torch.testing.assert_close(interaction[0, 2], torch.tensor(1.0))
    torch.testing.assert_close(interaction, interaction.T)


def test_embedding_reproduces_euclidean_distances_and_is_seeded():
    points = torch.randn(8, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    distances = torch.cdist(points, points)
    coords, stress = embed_features(distances, dims=2, steps=1500, seed=3)
    assert stress < 1e-3
    torch.testing.assert_close(torch.cdist(coords, coords), distances, atol=0.02, rtol=0)
    again, _ = embed_features(distances, dims=2, steps=1500, seed=3)
    assert torch.equal(coords, again)


def test_coherent_partition_recovers_planted_groups_where_naive_does_not():
    pooled, groups = planted_embeddings([4, 4, 4])
    names = names_for(12)
    interaction = interaction_matrix(pooled)
    coherent = partition_features(names, 3, "coherent", interaction, max_ratio=2.0, seed=0)
    naive = partition_features(names, 3, "naive")
    assert adjusted_rand_score(groups, coherent.assignment(names)) >= 0.9
    assert adjusted_rand_score(groups, naive.assignment(names)) < 0.2
    diverse = partition_features(names, 3, "diverse", interaction, max_ratio=2.0, seed=0)
    assert adjusted_rand_score(groups, diverse.assignment(names)) < 0.2


def test_balance_bound_holds_when_planted_groups_are_unbalanced():
    pooled, groups = planted_embeddings([10, 3, 3])
    names = names_for(16)
    part = partition_features(names, 3, "coherent", interaction_matrix(pooled), max_ratio=1.5)
    sizes = sorted(len(t) for t in part.towers)
    assert sum(sizes) == 16 and sizes[-1] <= 1.5 * sizes[0]
    part.validate(names)


@pytest.mark.parametrize(
    "features,towers,ratio,expected",
    [(12, 3, 2.0, (3, 6)), (12, 3, 1.0, (4, 4)), (10, 3, 1.5, (3, 4)), (26, 4, 2.0, (5, 10)), (5, 5, 3.0, (1, 1))],
)
def test_size_bounds_are_feasible_and_respect_the_ratio(features, towers, ratio, expected):
    size_min, size_max = tower_size_bounds(features, towers, ratio)
    assert (size_min, size_max) == expected
    assert towers * size_min <= features <= towers * size_max and size_max <= ratio * size_min


@pytest.mark.parametrize("args,message", [((10, 3, 1.0), "max-ratio 1.33"), ((4, 5, 2.0), "between 1 and 4"), ((8, 2, 0.5), "below 1")])
def test_size_bound_errors(args, message):
    with pytest.raises(DistrecError, match=message):
        tower_size_bounds(*args)


@pytest.mark.parametrize("features,towers,expected", [(12, 4, 1.0), (26, 4, 7 / 6), (7, 2, 4 / 3), (5, 5, 1.0)])
def test_tightest_ratio_is_the_smallest_feasible_bound(features, towers, expected):
    ratio = tightest_ratio(features, towers)
    assert ratio == pytest.approx(expected)
    size_min, size_max = tower_size_bounds(features, towers, ratio)
    assert (size_min, size_max) == (features // towers, -(-features // towers))
    if ratio > 1:
        with pytest.raises(DistrecError, match=f"max-ratio {ratio:.2f}"):
            tower_size_bounds(features, towers, ratio - 0.01)


def test_tightest_ratio_gives_towers_as_equal_as_possible():
    pooled, _ = planted_embeddings([4, 3, 3])
    names = names_for(10)
    part = partition_features(names, 3, "coherent", interaction_matrix(pooled), max_ratio=tightest_ratio(10, 3))
    assert sorted(len(t) for t in part.towers) == [3, 3, 4]


def test_naive_is_strided():
    assert naive_assignment(7, 3).tolist() == [0, 1, 2, 0, 1, 2, 0]
    part = partition_features(names_for(7), 3, "naive")
    assert part.towers == [["C1", "C4", "C7"], ["C2", "C5"], ["C3", "C6"]]


def test_save_load_round_trip_and_validation(tmp_path):
    part = TowerPartition([["a", "c"], ["b"]], "coherent", max_ratio=2.0, stress=0.5, seed=1)
    path = tmp_path / "towers.json"
    part.save(path)
    assert TowerPartition.load(path) == part
    assert part.feature_indices(["a", "b", "c"]) == [[0, 2], [1]]
    with pytest.raises(DistrecError, match="missing: \\['d'\\]"):
        part.validate(["a", "b", "c", "d"])
    path.write_text(json.dumps({"towers": [["a"], ["a"]], "strategy": "naive"}))
    with pytest.raises(DistrecError, match="two towers"):
        TowerPartition.load(path)
    path.write_text(json.dumps({"strategy": "naive"}))
    with pytest.raises(DistrecError, match="malformed"):
        TowerPartition.load(path)
    path.write_text("{")
    with pytest.raises(DistrecError, match="not valid JSON"):
        TowerPartition.load(path)
    with pytest.raises(DistrecError, match="not found"):
        TowerPartition.load(tmp_path / "missing.json")


def test_unknown_strategy_is_a_user_error():
    with pytest.raises(DistrecError, match="unknown tower strategy"):
        partition_features(names_for(4), 2, "random")


def test_plot_writes_a_png(tmp_path):
    pooled, _ = planted_embeddings([3, 3])
    names = names_for(6)
    part = partition_features(names, 2, "naive")
    path = tmp_path / "sim.png"
    plot_similarity(interaction_matrix(pooled), names, part, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
