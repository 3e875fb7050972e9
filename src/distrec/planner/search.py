"""NeuroShard's search: beam search over column splits, greedy placement, grid over a dim bound.

For a set of column chunks (whole tables at first), a greedy placement puts chunks, most
expensive first (by the cost model), on the device with the lowest predicted compute cost
that has memory and whose summed dimension stays under a bound; the bound is grid-searched
over M points from the mean summed dimension to 1.5x the mean, and the cost models score
every placement (max over devices of compute + backward + forward all-to-all). The cost
models also score the baseline heuristics' greedy placements of the same chunks (most
lookups first on the device with the least summed lookups, and the size, dim and
size-lookup variants), so for the whole tables the search starts from every greedy
heuristic's plan and keeps one only if the cost models rank it best. The beam
search (width K, L steps) halves the columns of one of the N largest or N most expensive
chunks per step, keeping dimensions divisible by 4. Device compute costs are cached by the
set of chunks a device holds (Zha et al., "Pre-train and Search", MLSys 2023, Sec. 4).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from distrec.errors import DistrecError
from distrec.parallel.placement import greedy_place
from distrec.planner.cost_models import CostPredictor
from distrec.planner.heuristics import GREEDY_COSTS
from distrec.planner.types import BYTES_PER_FLOAT, Chunk, PlanConstraints, TableSpec, can_halve

State = tuple[Chunk, ...]
"""A set of column chunks covering every table, in canonical (table, first column) order."""


def _canonical(chunks) -> State:
    return tuple(sorted(chunks, key=lambda c: (c.table, c.col_start)))


@dataclass(frozen=True)
class SearchOptions:
    """The search's knobs (defaults from the NeuroShard paper) and ablation switches.

    Attributes:
        beam_width: K, states kept per beam step.
        candidates: N, the largest and the most expensive chunks tried for a split.
        max_steps: L, beam steps (column splits) at most.
        grid_points: M, dim bounds tried from the mean to ``grid_max`` x the mean, and then
            no bound, so that the grid only ever adds to the unbounded placement (a grid of
            bounds alone trades compute balance for dimension balance, which only the
            all-to-all models reward: benchmarks/results/2026-11-24-neuroshard-planner.md).
        grid_max: the largest dim bound, as a multiple of the mean summed dimension.
        grid_search: False places without a dim bound (the "no grid search" ablation).
        use_cache: False recomputes every device cost (the "no cache" ablation).
        heuristic_placements: also score the greedy heuristics' placements of every chunk set.
    """

    beam_width: int = 3
    candidates: int = 10
    max_steps: int = 10
    grid_points: int = 11
    grid_max: float = 1.5
    grid_search: bool = True
    use_cache: bool = True
    heuristic_placements: bool = True

    def __post_init__(self) -> None:
        if min(self.beam_width, self.candidates, self.grid_points) < 1 or self.max_steps < 0 or self.grid_max < 1:
            raise DistrecError(
                f"search options {self} are out of range; beam width, candidates and grid points must be >= 1, steps >= 0 and the grid maximum >= 1"
            )

    @classmethod
    def ablation(cls, name: str) -> SearchOptions:
        """``full``, ``no-split`` (no column splits beyond those a table needs to fit one device:
        the NeuroShard paper's "no beam search" ablation of its Table 3), ``no-beam`` (beam width 1: greedy splitting), ``no-grid`` or ``no-cache``."""
        variants = {
            "full": cls(),
            "no-split": cls(max_steps=0),
            "no-beam": cls(beam_width=1),
            "no-grid": cls(grid_search=False),
            "no-cache": cls(use_cache=False),
        }
        if name not in variants:
            raise DistrecError(f"unknown search variant {name!r}; choose one of: {', '.join(variants)}")
        return variants[name]


@dataclass
class SearchResult:
    """The best placement found and how the search went.

    Attributes:
        chunks: the column chunks of the plan.
        device_of: the rank of every chunk.
        costs: per-device predicted costs (ms): compute, bw_comm, fw_comm, total.
        search_time_s: wall time of the search.
        cache_lookups, cache_hits: device compute costs asked for, and found in the cache.
        states: chunk sets (split choices) evaluated.
    """

    chunks: list[Chunk]
    device_of: list[int]
    costs: dict[str, np.ndarray]
    search_time_s: float
    cache_lookups: int = 0
    cache_hits: int = 0
    states: int = 0

    @property
    def cache_hit_rate(self) -> float:
        return self.cache_hits / self.cache_lookups if self.cache_lookups else 0.0

    @property
    def max_cost(self) -> float:
        return float(self.costs["total"].max())


def narrowest_shard(table: TableSpec, splittable: bool) -> int:
    """Columns of the narrowest shard a table can be cut into by halving (its dim if not splittable)."""
    dim = table.dim
    while splittable and can_halve(dim):
        dim //= 2
    return dim


def check_feasible(tables: list[TableSpec], num_devices: int, memory_per_device: int, constraints: PlanConstraints) -> None:
    """Raise one DistrecError if no plan can hold these tables, whatever the search does."""
    mib = 2**20
    pinned_bytes = [0] * num_devices
    for t in tables:
        pinned = t.name in constraints.pins
        width = narrowest_shard(t, splittable=t.name not in constraints.no_split and not pinned)
        piece = t.num_rows * width * BYTES_PER_FLOAT
        if piece > memory_per_device:
            how = "whole" if width == t.dim else f"even split into {width}-column shards"
            raise DistrecError(
                f"table {t.name!r} needs {piece / mib:.1f} MiB on one device {how}, but a device has "
                f"{memory_per_device / mib:.1f} MiB; raise --memory-per-device, allow splitting it, or shrink the table"
            )
        if pinned:
            pinned_bytes[constraints.pins[t.name]] += t.num_bytes
    total = sum(t.num_bytes for t in tables)
    if total > num_devices * memory_per_device:
        raise DistrecError(
            f"the tables need {total / mib:.1f} MiB but {num_devices} devices hold {num_devices * memory_per_device / mib:.1f} MiB; "
            "use more devices or a larger --memory-per-device"
        )
    for rank, used in enumerate(pinned_bytes):
        if used > memory_per_device:
            raise DistrecError(f"tables pinned to rank {rank} need {used / mib:.1f} MiB, over its {memory_per_device / mib:.1f} MiB; pin fewer tables there")


@dataclass
class _Evaluation:
    cost: float
    device_of: list[int] | None = None
    device_compute: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class _ChunkInfo:
    embedding: np.ndarray  # the computation model's 32-wide table embedding
    cost: float  # predicted compute cost (ms) of the chunk alone on a device
    code: int  # random 64-bit code; a device's chunk multiset hashes to the sum of its codes
    proxies: tuple[float, ...]  # the greedy heuristics' costs of the chunk (``GREEDY_COSTS`` order)


_HASH_MASK = 2**64 - 1


class NeuroShardSearch:
    """One planning problem: tables, devices, memory, cost models, constraints and options."""

    def __init__(
        self,
        tables: list[TableSpec],
        num_devices: int,
        memory_per_device: int,
        predictor: CostPredictor,
        constraints: PlanConstraints | None = None,
        options: SearchOptions | None = None,
    ) -> None:
        self.tables = tables
        self.num_devices = num_devices
        self.memory = memory_per_device
        self.predictor = predictor
        self.constraints = constraints or PlanConstraints()
        self.options = options or SearchOptions()
        self._pin_of = {i: self.constraints.pins[t.name] for i, t in enumerate(tables) if t.name in self.constraints.pins}
        self._splittable = [t.name not in self.constraints.no_split and i not in self._pin_of for i, t in enumerate(tables)]
        self._chunks: dict[tuple[int, int], _ChunkInfo] = {}
        self._codes = np.random.default_rng(0)
        self._cache: dict[int, float] = {}
        self.cache_lookups = self.cache_hits = 0

    # -- cost model access -------------------------------------------------------------

    def _chunk(self, table: int, dim: int) -> _ChunkInfo:
        """Embedding, lone cost and hash code of a chunk of ``dim`` columns of ``table`` (memoised).

        A column shard's embedding is at least (elementwise) its share of the whole table's,
        dim / table dim: splitting a table never lowers its predicted compute, since the
        shards look up the same floats and each repeats the per-index work. The learned
        per-table cost is convex in the dimension for tables of many lookups, so without
        this floor two halves of such a table were predicted cheaper than the whole, and the
        search split tables for a gain the hardware does not give
        (benchmarks/results/2026-11-24-neuroshard-planner.md).
        """
        key = (table, dim)
        if key not in self._chunks:
            chunk = self.tables[table].with_dim(dim)
            emb = self.predictor.embed([chunk])[0]
            whole = self.tables[table].dim
            if dim < whole:
                emb = np.maximum(emb, self._chunk(table, whole).embedding * (dim / whole))
            cost = float(self.predictor.device_compute(emb)[0])
            proxies = tuple(proxy(chunk) for proxy in GREEDY_COSTS.values())
            code = int(self._codes.integers(2**63)) * 2 + 1
            self._chunks[key] = _ChunkInfo(emb, cost, code, proxies)
        return self._chunks[key]

    def _device_compute(self, set_hash: int, summed_embedding: np.ndarray) -> float:
        """Predicted compute cost (ms) of a device, cached by the hash of its chunk multiset.

        The hash is the sum (mod 2**64) of random 64-bit chunk codes (Zobrist hashing), so
        it is updated in O(1) as chunks are added; two different sets collide with
        probability about 2**-64.
        """
        self.cache_lookups += 1
        if self.options.use_cache and set_hash in self._cache:
            self.cache_hits += 1
            return self._cache[set_hash]
        cost = float(self.predictor.device_compute(summed_embedding)[0])
        if self.options.use_cache:
            self._cache[set_hash] = cost
        return cost

    # -- placement ---------------------------------------------------------------------

    def _evaluate(self, state: State) -> _Evaluation:
        """The best greedy placement of ``state`` over the grid of dim bounds.

        Chunks go most expensive first. If that order fits no device under any bound (tight
        memory), the chunks are placed largest first without a bound, as first-fit
        decreasing bin packing does, so that a state that fits is rarely lost.
        """
        opts = self.options
        info = [self._chunk(c.table, c.dim) for c in state]
        sizes = [self.tables[c.table].num_rows * c.dim * BYTES_PER_FLOAT for c in state]
        by_cost = sorted(range(len(state)), key=lambda i: (-info[i].cost, -sizes[i], i))
        mean_dim = sum(c.dim for c in state) / self.num_devices
        bounds = [*(mean_dim * np.linspace(1.0, opts.grid_max, opts.grid_points)), math.inf] if opts.grid_search else [math.inf]
        best = _Evaluation(math.inf)
        for bound in bounds:
            ev = self._place(state, info, sizes, by_cost, bound)
            if ev.cost < best.cost:
                best = ev
        if opts.heuristic_placements:
            heuristic = self._heuristic_placement(state, info, sizes)
            if heuristic.cost < best.cost:
                best = heuristic
        if best.device_of is None:
            by_size = sorted(range(len(state)), key=lambda i: (-sizes[i], -info[i].cost, i))
            best = self._place(state, info, sizes, by_size, math.inf)
        return best

    def _heuristic_placement(self, state: State, info: list[_ChunkInfo], sizes: list[int]) -> _Evaluation:
        """The best, by the search's cost, of the greedy heuristics' placements of ``state``."""
        best = _Evaluation(math.inf)
        for p in range(len(GREEDY_COSTS)):
            loads = [x.proxies[p] for x in info]
            ev = self._place(state, info, sizes, sorted(range(len(state)), key=lambda i: (-loads[i], i)), math.inf, loads)
            if ev.cost < best.cost:
                best = ev
        return best

    def _place(
        self,
        state: State,
        info: list[_ChunkInfo],
        sizes: list[int],
        order: list[int],
        bound: float,
        proxy_loads: list[float] | None = None,
    ) -> _Evaluation:
        """Greedy placement of the chunks in ``order`` under a dim bound, scored by the cost models.

        A chunk goes to the device of least predicted compute, or with ``proxy_loads`` (a
        heuristic's cost of every chunk) to the device of least summed proxy load.
        """
        dims = [c.dim for c in state]
        pins = {i: self._pin_of[c.table] for i, c in enumerate(state) if c.table in self._pin_of}
        summed = np.zeros((self.num_devices, info[0].embedding.size))
        hashes = [0] * self.num_devices
        proxy = [0.0] * self.num_devices
        counts = [0] * self.num_devices

        def device_cost(device: int) -> float:
            return self._device_compute(hashes[device], summed[device])

        def add_item(device: int, item: int) -> float:
            summed[device] += info[item].embedding
            hashes[device] = (hashes[device] + info[item].code) & _HASH_MASK
            counts[device] += 1
            if proxy_loads is None:
                return device_cost(device)
            proxy[device] += proxy_loads[item]
            return proxy[device]

        placed = greedy_place(order, sizes, dims, self.num_devices, self.memory, add_item, pins, bound)
        if placed is None:
            return _Evaluation(math.inf)
        device_of, compute = placed
        if proxy_loads is not None:
            compute = [device_cost(r) if counts[r] else 0.0 for r in range(self.num_devices)]
        dim_sums = np.zeros(self.num_devices)
        np.add.at(dim_sums, device_of, dims)
        return _Evaluation(float(self.predictor.plan_costs(np.array(compute), dim_sums)["total"].max()), device_of, compute)

    # -- splits ------------------------------------------------------------------------

    def _mandatory_splits(self) -> State:
        """Whole tables, halving any chunk too big for one device while it can be halved."""
        chunks = []
        pending = [Chunk(i, 0, t.dim) for i, t in enumerate(self.tables)]
        while pending:
            c = pending.pop()
            too_big = self.tables[c.table].num_rows * c.dim * BYTES_PER_FLOAT > self.memory
            if too_big and self._splittable[c.table] and can_halve(c.dim):
                pending.extend(c.halves())
            else:
                chunks.append(c)
        return _canonical(chunks)

    def _split_candidates(self, state: State) -> list[int]:
        """Positions of the N largest and the N most expensive chunks that can be halved."""
        n = self.options.candidates
        splittable = [i for i, c in enumerate(state) if self._splittable[c.table] and can_halve(c.dim)]
        by_size = sorted(splittable, key=lambda i: (-self.tables[state[i].table].num_rows * state[i].dim, i))[:n]
        by_cost = sorted(splittable, key=lambda i: (-self._chunk(state[i].table, state[i].dim).cost, i))[:n]
        return sorted(set(by_size) | set(by_cost))

    def run(self) -> SearchResult:
        """Search, and return the best placement found (DistrecError if none fits)."""
        start = time.perf_counter()
        root = self._mandatory_splits()
        best_state, best = root, self._evaluate(root)
        seen = {root}
        beam = [(best.cost, root)]
        for _ in range(self.options.max_steps):
            children = []
            for _, state in beam:
                for pos in self._split_candidates(state):
                    child = _canonical(state[:pos] + state[pos].halves() + state[pos + 1 :])
                    if child in seen:
                        continue
                    seen.add(child)
                    ev = self._evaluate(child)
                    children.append((ev.cost, child))
                    if ev.cost < best.cost:
                        best_state, best = child, ev
            if not children:
                break
            beam = sorted(children, key=lambda x: x[0])[: self.options.beam_width]
        if best.device_of is None:
            raise DistrecError(
                f"no placement of the tables fits {self.num_devices} devices of {self.memory / 2**20:.1f} MiB; "
                "use more devices, more memory, or fewer pins and no-split constraints"
            )
        dim_sums = np.zeros(self.num_devices)
        np.add.at(dim_sums, best.device_of, [c.dim for c in best_state])
        costs = self.predictor.plan_costs(np.array(best.device_compute), dim_sums)
        return SearchResult(list(best_state), best.device_of, costs, time.perf_counter() - start, self.cache_lookups, self.cache_hits, len(seen))
