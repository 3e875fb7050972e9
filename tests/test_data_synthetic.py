import numpy as np
import pytest
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from distrec.config import SyntheticConfig
from distrec.data.criteo import read_criteo
from distrec.data.source import Chunk
from distrec.data.synthetic import SyntheticGenerator, ZipfSampler, interaction_groups, read_synthetic, synthesize
from distrec.errors import DistrecError


def small(**kwargs) -> SyntheticConfig:
    return SyntheticConfig(**{"rows": 3000, "table_rows": 1000, "seed": 5, **kwargs})


def assert_chunks_equal(a: Chunk, b: Chunk):
    np.testing.assert_array_equal(a.dense, b.dense)
    np.testing.assert_array_equal(a.labels, b.labels)
    for (va, la), (vb, lb) in zip(a.sparse, b.sparse):
        np.testing.assert_array_equal(va, vb)
        np.testing.assert_array_equal(la, lb)


@pytest.mark.parametrize("pooling", [1, 3])
def test_same_rows_whatever_the_chunking(pooling):
    cfg = small(pooling_factor=pooling, drift_period_rows=700, interaction_groups=4)
    whole = SyntheticGenerator(cfg).generate(0, 3000)
    gen = SyntheticGenerator(cfg)  # a second generator from the same config
    pieces = Chunk.concat([gen.generate(0, 1234), gen.generate(1234, 1), gen.generate(1235, 1765)], 13, 26)
    assert_chunks_equal(whole, pieces)
    streamed = read_synthetic(cfg, chunk_rows=999)
    assert_chunks_equal(whole, Chunk.concat(list(streamed.chunks), 13, 26))
    other_seed = SyntheticGenerator(small(pooling_factor=pooling, seed=6)).generate(0, 3000)
    assert not np.array_equal(other_seed.sparse[0][0], whole.sparse[0][0])


def test_layout_ranges_and_click_rate():
    cfg = small(rows=20_000, num_dense=4, num_sparse=3, pooling_factor=2)
    gen = SyntheticGenerator(cfg)
    chunk = gen.generate(0, cfg.rows)
    assert chunk.dense.shape == (20_000, 4) and chunk.dense.dtype == np.float32
    assert (chunk.dense >= 0).all()
    assert all(f.multi_hot and f.id_bound == 1000 for f in gen.features)
    for values, lengths in chunk.sparse:
        assert (lengths == 2).all() and values.shape == (40_000,)
        assert values.min() >= 1 and values.max() <= 999
    assert 0.2 < chunk.labels.mean() < 0.3


def test_zipf_exponent_per_table():
    cfg = small(rows=20_000, num_sparse=2)
    chunk = SyntheticGenerator(cfg, exponents=[0.0, 1.5]).generate(0, cfg.rows)
    top_share = [np.bincount(values).max() / len(values) for values, _ in chunk.sparse]
    assert top_share[0] < 0.005  # exponent 0: uniform over 999 ids
    # exponent 1.5: P(rank 1) = 1 / sum_k k^-1.5, about 0.39 over 999 ranks
    assert 0.35 < top_share[1] < 0.43
    with pytest.raises(DistrecError, match="one per table"):
        SyntheticGenerator(cfg, exponents=[1.0])


def test_zipf_exponents_per_table_from_the_config():
    from distrec import config

    cfg = config.load(
        None,
        [
            "data.synthetic.rows=3000",
            "data.synthetic.table_rows=1000",
            "data.synthetic.seed=5",
            "data.synthetic.num_sparse=2",
            "data.synthetic.zipf_exponents=[0, 1.5]",
        ],
    ).data.synthetic
    assert_chunks_equal(SyntheticGenerator(cfg).generate(0, 3000), SyntheticGenerator(small(num_sparse=2), exponents=[0.0, 1.5]).generate(0, 3000))


def test_popularity_drift_moves_the_hot_rows():
    def hot(chunk, k=20):
        return set(np.argsort(np.bincount(chunk.sparse[0][0]))[-k:])

    drifting = SyntheticGenerator(small(rows=20_000, drift_period_rows=10_000))
    assert len(hot(drifting.generate(0, 10_000)) & hot(drifting.generate(10_000, 10_000))) <= 2
    steady = SyntheticGenerator(small(rows=20_000))
    assert len(hot(steady.generate(0, 10_000)) & hot(steady.generate(10_000, 10_000))) >= 15


def test_planted_groups_interact_only_within_a_group():
    cfg = small(num_sparse=8, interaction_groups=2)
    gen = SyntheticGenerator(cfg)
    groups = gen.groups
    assert sorted(np.bincount(groups).tolist()) == [4, 4]
    planted = {tuple(np.flatnonzero(groups == g)) for g in range(2)}
    assert planted != {(0, 2, 4, 6), (1, 3, 5, 7)}  # not the strided split a naive partitioner makes
    rng = np.random.default_rng(0)
    base = [rng.integers(1, 1000, (64, 1)) for _ in range(8)]
    dense = np.zeros((64, 13))

    def logit(changes):
        ids = [changes.get(f, base[f]) for f in range(8)]
        return gen._logits(dense, ids)

    for f in range(8):
        for g in range(f + 1, 8):
            a, b = base[f] % 999 + 1, base[g] % 999 + 1
            # the mixed difference is zero iff the logit is additive in features f and g
            mixed = logit({f: a, g: b}) - logit({f: a}) - logit({g: b}) + logit({})
            if groups[f] == groups[g]:
                assert np.abs(mixed).max() > 1e-3
            else:
                np.testing.assert_allclose(mixed, 0.0, atol=1e-9)
    assert (interaction_groups(small()) == -1).all()


def test_labels_are_learnable():
    cfg = small(rows=25_000, num_sparse=8, seed=11)
    gen = SyntheticGenerator(cfg)
    chunk = gen.generate(0, cfg.rows)
    ids = np.stack([values for values, _ in chunk.sparse], axis=1)  # [n, 8] in 1..999
    cols = (ids + 1000 * np.arange(8)).ravel()
    onehot = sparse.csr_matrix((np.ones(cols.size), (np.repeat(np.arange(cfg.rows), 8), cols)), shape=(cfg.rows, 8000))
    x = sparse.hstack([onehot, sparse.csr_matrix(chunk.dense)]).tocsr()
    model = LogisticRegression(C=0.5, solver="liblinear").fit(x[:20_000], chunk.labels[:20_000])
    auc = roc_auc_score(chunk.labels[20_000:], model.predict_proba(x[20_000:])[:, 1])
    bayes = roc_auc_score(chunk.labels, gen.click_probability(0, cfg.rows))
    assert auc > 0.6
    assert bayes > auc


def test_synthesize_writes_criteo_that_reads_back_identically(tmp_path):
    cfg = small(rows=500, table_rows=100_000)
    out = synthesize(cfg, tmp_path / "synth.tsv.gz", chunk_rows=128, progress=False)
    source = read_criteo(out)
    back = Chunk.concat(list(source.chunks), 13, 26)
    assert_chunks_equal(back, SyntheticGenerator(cfg).generate(0, 500))
    assert [p.name for p in tmp_path.iterdir()] == ["synth.tsv.gz"]


def test_synthesize_needs_the_criteo_shape(tmp_path):
    with pytest.raises(DistrecError, match="pooling_factor=1"):
        synthesize(small(pooling_factor=2), tmp_path / "s.tsv", progress=False)
    with pytest.raises(DistrecError, match="num_dense=13"):
        synthesize(small(num_dense=3), tmp_path / "s.tsv", progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("ranks, exponent", [(999, 0.0), (5, 2.0), (1, 1.0), (77_777, 1.05)])
def test_zipf_sampler_equals_binary_search(ranks, exponent):
    sampler = ZipfSampler(ranks, exponent)
    grid = np.arange(ranks) / ranks
    u = np.concatenate(
        [
            np.random.default_rng(0).random(50_000),
            sampler.cdf[:-1],
            np.nextafter(sampler.cdf[:-1], 0),
            grid,
            np.nextafter(grid[1:], 0),
            [np.nextafter(1.0, 0)],
        ]
    )
    np.testing.assert_array_equal(sampler.ranks(u), np.searchsorted(sampler.cdf, u, side="right"))


def test_a_draw_is_fresh_rows_of_the_same_data_set_in_any_row_order():
    cfg = small(rows=20_000, drift_period_rows=10_000, pooling_factor=2)
    gen = SyntheticGenerator(cfg)
    rows = np.random.default_rng(0).permutation(20_000)[:5000]
    assert_chunks_equal(gen.draw(rows, 0), Chunk(*_take(gen.generate(0, 20_000), rows)))  # draw 0: the data set
    fresh = gen.draw(rows, 3)
    assert_chunks_equal(fresh, SyntheticGenerator(cfg).draw(rows, 3))  # deterministic given the seed and the draw
    order = np.argsort(rows)
    assert_chunks_equal(Chunk(*_take(fresh, order)), gen.draw(rows[order], 3))  # a row's draw does not depend on the others
    cached = gen.draw(rows, 0)
    assert (fresh.sparse[0][0] != cached.sparse[0][0]).mean() > 0.5
    assert not np.array_equal(fresh.dense, cached.dense)
    assert not np.array_equal(gen.draw(rows, 4).labels, fresh.labels)
    assert 0.2 < fresh.labels.mean() < 0.3  # the same click model

    def hot(chunk, k=20):
        return set(np.argsort(np.bincount(chunk.sparse[0][0]))[-k:])

    # a redrawn row keeps its drift period: the same hot rows as the data set's rows of that period
    first_period = np.arange(10_000)
    assert len(hot(gen.draw(first_period, 5)) & hot(gen.draw(first_period, 0))) >= 15


def _take(chunk: Chunk, rows: np.ndarray) -> tuple:
    """The fields of the rows ``rows`` of a chunk whose features all have the same bag size."""
    sparse = []
    for values, lengths in chunk.sparse:
        width = int(lengths[0])
        sparse.append((values.reshape(-1, width)[rows].reshape(-1), lengths[rows]))
    return chunk.dense[rows], chunk.labels[rows], sparse
