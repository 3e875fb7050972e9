"""TowerPartition: features grouped into towers, as ``distrec partition`` writes them and
``--towers`` reads them; and the towers a run uses (``resolve_towers``).

The description itself, below both the partitioner that makes it (``distrec.towers``) and
the parallel modes that place tables by it (``distrec.parallel``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from distrec.errors import DistrecError
from distrec.io import atomic_write_json, read_json

STRATEGIES = ("coherent", "diverse", "naive")


@dataclass
class TowerPartition:
    """Features grouped into towers (tower t is placed on host t).

    Attributes:
        towers: feature names of each tower.
        strategy: "coherent", "diverse" or "naive".
        max_ratio: the balance bound K used (largest tower <= K x smallest); None for naive.
        stress: final stress of the feature coordinates; None for naive.
        seed: seed of the coordinates and the k-means.
    """

    towers: list[list[str]]
    strategy: str
    max_ratio: float | None = None
    stress: float | None = None
    seed: int = 0

    @property
    def num_towers(self) -> int:
        return len(self.towers)

    def assignment(self, names: Sequence[str]) -> np.ndarray:
        """int64 [F]: the tower of each feature in ``names`` order."""
        self.validate(names)
        tower_of = {name: t for t, tower in enumerate(self.towers) for name in tower}
        return np.array([tower_of[name] for name in names], dtype=np.int64)

    def feature_indices(self, names: Sequence[str]) -> list[list[int]]:
        """Each tower as indices into ``names`` (the input of ``FeatureLayout.from_towers``)."""
        self.validate(names)
        index = {name: i for i, name in enumerate(names)}
        return [[index[name] for name in tower] for tower in self.towers]

    def validate(self, names: Sequence[str] | None = None) -> None:
        """Check the towers are non-empty and disjoint, and cover exactly ``names`` if given."""
        if self.strategy not in STRATEGIES:
            raise DistrecError(f"tower partition strategy {self.strategy!r} is unknown; use one of: {', '.join(STRATEGIES)}")
        listed = [name for tower in self.towers for name in tower]
        if not self.towers or any(not tower for tower in self.towers):
            raise DistrecError("tower partition has an empty tower; regenerate it with 'distrec partition'")
        if len(listed) != len(set(listed)):
            raise DistrecError("tower partition lists a feature in two towers; regenerate it with 'distrec partition'")
        if names is not None and set(listed) != set(names):
            missing, unknown = sorted(set(names) - set(listed)), sorted(set(listed) - set(names))
            raise DistrecError(
                f"tower partition does not match the model's features (missing: {missing or 'none'}, "
                f"unknown: {unknown or 'none'}); regenerate it for this data with 'distrec partition'"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TowerPartition:
        try:
            part = cls(
                towers=[[str(name) for name in tower] for tower in d["towers"]],
                strategy=str(d["strategy"]),
                max_ratio=None if d.get("max_ratio") is None else float(d["max_ratio"]),
                stress=None if d.get("stress") is None else float(d["stress"]),
                seed=int(d.get("seed", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise DistrecError(f"tower partition is malformed ({type(e).__name__}: {e}); regenerate it with 'distrec partition'") from None
        part.validate()
        return part

    def save(self, path: str | Path) -> None:
        """Write the partition as JSON (atomically)."""
        atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> TowerPartition:
        return cls.from_dict(read_json(path, "tower partition", "check the --towers path or run 'distrec partition'", "regenerate it with 'distrec partition'"))


def naive_assignment(num_features: int, num_towers: int) -> np.ndarray:
    """int64 [F]: the strided baseline, feature i in tower ``i % T``."""
    check_tower_count(num_features, num_towers)
    return np.arange(num_features, dtype=np.int64) % num_towers


def resolve_towers(names: Sequence[str], towers_file: str | None, num_towers: int | None) -> list[list[int]]:
    """Each tower as indices into ``names``: from a ``distrec partition`` file, else strided over ``num_towers``."""
    if towers_file is not None:
        return TowerPartition.load(towers_file).feature_indices(names)
    if num_towers is None:
        raise DistrecError("towers are needed; pass --towers FILE from 'distrec partition' (or --hosts H for H strided towers)")
    strided = naive_assignment(len(names), num_towers)
    return [[int(f) for f in np.flatnonzero(strided == t)] for t in range(num_towers)]


def check_tower_count(num_features: int, num_towers: int) -> None:
    """DistrecError unless 1 <= ``num_towers`` <= ``num_features``."""
    if not 1 <= num_towers <= num_features:
        raise DistrecError(f"{num_towers} towers for {num_features} features; use between 1 and {num_features} towers")
