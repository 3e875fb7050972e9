"""Tower partitioner (DMT's TP, Luo et al., MLSys 2024): group features into balanced towers.

From a trained model's pooled embeddings ``[B, F, D]``:

1. interaction matrix ``I(i, j) = |mean over the batch of cosine(E_i, E_j)|``;
2. distances ``1 - I`` (``coherent``: features that interact share a tower) or ``I``
   (``diverse``: they are spread over towers);
3. coordinates X in ``dims`` dimensions minimising the stress
   ``sum over pairs i < j of (||X_i - X_j|| - D_ij)^2`` with Adam (seeded);
4. constrained k-means (the ``k-means-constrained`` package) into T towers whose sizes lie
   in ``[size_min, size_max]`` with ``size_max <= max_ratio x size_min``.

``naive`` is the strided baseline: feature i goes to tower ``i % T``.

Example:
    >>> interaction = interaction_matrix(pooled)                      # doctest: +SKIP
    >>> part = partition_features(names, 4, "coherent", interaction)  # doctest: +SKIP
    >>> part.save("towers.json"); plot_similarity(interaction, names, part, "towers.png")  # doctest: +SKIP
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from k_means_constrained import KMeansConstrained

from distrec.errors import DistrecError
from distrec.io import atomic_write_bytes
from distrec.tower_partition import STRATEGIES, TowerPartition, check_tower_count, naive_assignment


def interaction_matrix(pooled: torch.Tensor) -> torch.Tensor:
    """``[F, F]`` |mean over samples of cosine(E_i, E_j)| of pooled embeddings ``[B, F, D]``."""
    unit = torch.nn.functional.normalize(pooled, dim=2)
    return torch.einsum("bid,bjd->ij", unit, unit).div_(pooled.shape[0]).abs_()


def feature_distances(interaction: torch.Tensor, strategy: str) -> torch.Tensor:
    """Target distances: ``1 - I`` for coherent towers, ``I`` for diverse ones."""
    if strategy == "coherent":
        return 1 - interaction
    if strategy == "diverse":
        return interaction.clone()
    raise DistrecError(f"strategy {strategy!r} has no distances; use coherent or diverse")


def embed_features(distances: torch.Tensor, dims: int = 4, steps: int = 500, lr: float = 0.05, seed: int = 0) -> tuple[torch.Tensor, float]:
    """Coordinates ``[F, dims]`` whose pairwise distances approximate ``distances`` (Adam on stress).

    Returns the coordinates and their final stress (sum over pairs of squared errors).
    """
    num = distances.shape[0]
    gen = torch.Generator().manual_seed(seed)
    coords = (0.1 * torch.randn(num, dims, generator=gen, dtype=torch.float64)).to(distances.device).requires_grad_()
    target = distances.to(torch.float64)
    upper = torch.triu_indices(num, num, offset=1, device=distances.device)
    optimizer = torch.optim.Adam([coords], lr=lr)

    def stress() -> torch.Tensor:
        diff = coords[upper[0]] - coords[upper[1]]
        # the epsilon keeps the gradient of the norm finite where two points coincide
        return (diff.square().sum(1).add(1e-12).sqrt() - target[upper[0], upper[1]]).square().sum()

    for _ in range(steps):
        optimizer.zero_grad()
        loss = stress()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return coords.detach(), float(stress())


def tower_size_bounds(num_features: int, num_towers: int, max_ratio: float) -> tuple[int, int]:
    """``(size_min, size_max)`` for T towers over F features with ``size_max <= K x size_min``.

    Among the feasible bounds (``T x size_min <= F <= T x size_max``) picks the widest range,
    preferring the larger minimum on ties, so k-means may follow the data as far as K allows.
    """
    check_tower_count(num_features, num_towers)
    if max_ratio < 1:
        raise DistrecError(f"--max-ratio {max_ratio} is below 1; the largest tower cannot be smaller than the smallest")
    size_min = np.arange(1, num_features // num_towers + 1)
    largest_allowed = np.floor(max_ratio * size_min + 1e-9).astype(np.int64)
    size_max = np.minimum(largest_allowed, num_features - (num_towers - 1) * size_min)
    feasible = (num_towers * size_max >= num_features) & (size_max >= size_min)
    if not feasible.any():
        raise DistrecError(
            f"{num_features} features cannot form {num_towers} towers with max size <= {max_ratio} x min size; "
            f"use --max-ratio {tightest_ratio(num_features, num_towers):.2f} or more, or a number of towers that divides {num_features}"
        )
    width = np.where(feasible, size_max - size_min, -1)
    best = np.flatnonzero(width == width.max())[-1]
    return int(size_min[best]), int(size_max[best])


def tightest_ratio(num_features: int, num_towers: int) -> float:
    """The smallest balance bound K that ``num_features`` features in ``num_towers`` towers can
    meet: ``ceil(F/T) / floor(F/T)`` (1.0 when T divides F; the paper's R = 1 otherwise)."""
    check_tower_count(num_features, num_towers)
    return -(-num_features // num_towers) / (num_features // num_towers)


def constrained_kmeans(coords: torch.Tensor, num_towers: int, max_ratio: float, seed: int = 0) -> np.ndarray:
    """int64 [F]: tower of each feature, balanced by ``tower_size_bounds``."""
    size_min, size_max = tower_size_bounds(coords.shape[0], num_towers, max_ratio)
    kmeans = KMeansConstrained(n_clusters=num_towers, size_min=size_min, size_max=size_max, random_state=seed)
    return kmeans.fit_predict(coords.detach().cpu().numpy().astype(np.float64)).astype(np.int64)


def partition_features(
    names: Sequence[str],
    num_towers: int,
    strategy: str,
    interaction: torch.Tensor | None = None,
    max_ratio: float = 2.0,
    dims: int = 4,
    steps: int = 500,
    seed: int = 0,
) -> TowerPartition:
    """Group ``names`` into ``num_towers`` towers.

    Args:
        names: feature names, in the order of the rows of ``interaction``.
        num_towers: T (one tower per host).
        strategy: "coherent", "diverse" or "naive".
        interaction: ``[F, F]`` from ``interaction_matrix`` (unused by naive).
        max_ratio: K, the bound on largest / smallest tower size.
        dims, steps, seed: the coordinate embedding's dimensions, Adam steps and seed.
    """
    if strategy not in STRATEGIES:
        raise DistrecError(f"unknown tower strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    if strategy == "naive":
        labels, stress, ratio = naive_assignment(len(names), num_towers), None, None
    else:
        if interaction is None or interaction.shape != (len(names), len(names)):
            raise ValueError(f"strategy {strategy} needs an interaction matrix of shape ({len(names)}, {len(names)})")
        coords, stress = embed_features(feature_distances(interaction, strategy), dims, steps, seed=seed)
        labels, ratio = constrained_kmeans(coords, num_towers, max_ratio, seed), max_ratio
    # towers numbered by their first feature, features kept in input order
    firsts = sorted(np.unique(labels), key=lambda t: int(np.flatnonzero(labels == t)[0]))
    towers = [[names[i] for i in np.flatnonzero(labels == t)] for t in firsts]
    return TowerPartition(towers, strategy, ratio, stress, seed)


def plot_similarity(interaction: torch.Tensor, names: Sequence[str], partition: TowerPartition, path: str | Path) -> None:
    """Write a PNG of the interaction matrix with features ordered by tower (DMT paper, Fig. 9)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    order = [i for tower in partition.feature_indices(names) for i in tower]
    matrix = interaction.detach().cpu().numpy()[np.ix_(order, order)]
    fig = Figure(figsize=(7, 6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(matrix, cmap="viridis", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, label="feature interaction")
    for edge in np.cumsum([len(t) for t in partition.towers])[:-1] - 0.5:
        ax.axhline(edge, color="white", linewidth=1)
        ax.axvline(edge, color="white", linewidth=1)
    if len(order) <= 64:
        labels = [names[i] for i in order]
        ax.set_xticks(range(len(order)), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(len(order)), labels, fontsize=6)
    ax.set_title(f"feature interaction, {partition.num_towers} {partition.strategy} towers")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    atomic_write_bytes(path, buffer.getvalue())
