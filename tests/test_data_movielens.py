import numpy as np
import pytest

from distrec.data.movielens import read_movielens
from distrec.data.source import Chunk
from distrec.errors import DistrecError


def read_all(path, **kwargs):
    source = read_movielens(path, **kwargs)
    return source, Chunk.concat(list(source.chunks), len(source.dense), len(source.features))


def tiny_movielens(root, ratings):
    root.mkdir()
    (root / "u.user").write_text("1|24|M|technician|85711\n2|53|F|other|T8H1N\n3|70|M|writer|32067\n")
    flags_a = ["0"] * 19
    flags_a[1] = flags_a[2] = "1"  # Action, Adventure
    flags_b = ["0"] * 19
    (root / "u.item").write_bytes(
        ("1|Am\xe9lie (2001)|01-Jan-2001||http://x|" + "|".join(flags_a) + "\n2|unknown||||" + "|".join(flags_b) + "\n").encode("latin-1")
    )
    (root / "u.data").write_text("".join(line + "\n" for line in ratings))
    return root


def test_sample_rows_labels_and_features(shared_data):
    source, chunk = read_all(shared_data / "movielens", chunk_rows=30_000)
    assert chunk.num_rows == 80_000 and source.malformed.count == 0
    assert abs(chunk.labels.mean() - 0.55) < 0.01
    names = [f.name for f in source.features]
    assert names == ["user_id", "item_id", "gender", "occupation", "zip_prefix", "age_bucket", "genres"]
    assert source.dense == ["age", "release_year", "timestamp"]
    bounds = {f.name: f.id_bound for f in source.features}
    assert bounds["user_id"] == 944 and bounds["item_id"] == 1683 and bounds["gender"] == 3
    assert bounds["occupation"] == 22 and bounds["genres"] == 20 and bounds["age_bucket"] == 8
    for feature, (values, lengths) in zip(source.features, chunk.sparse):
        assert (values >= 1).all() and (values < feature.id_bound).all()
        assert feature.multi_hot or (lengths == 1).all()
    # first rating: user 196, item 242 (Kolya, 1996: Comedy = flag 5)
    assert chunk.sparse[0][0][0] == 196 and chunk.sparse[1][0][0] == 242
    genre_values, genre_lengths = chunk.sparse[6]
    assert genre_values[: genre_lengths[0]].tolist() == [6]
    assert genre_lengths.sum() == len(genre_values) and genre_lengths.mean() > 1.5
    assert np.abs(chunk.dense[:, :2].mean(axis=0)).max() < 0.5  # standardised
    assert 0 <= chunk.dense[:, 2].min() and chunk.dense[:, 2].max() < 1  # years since Sept 1997


def test_side_tables_and_bad_ratings(tmp_path):
    root = tiny_movielens(
        tmp_path / "ml",
        [
            "1\t1\t5\t874627200",  # ok
            "2\t2\t3\t874627200",  # ok
            "9\t1\t5\t874627200",  # unknown user
            "1\t7\t5\t874627200",  # unknown item
            "1\tx\t5\t874627200",  # non-numeric
            "1\t1\t5",  # too few columns
            "3\t1\t4\t906163200",  # ok
        ],
    )
    source, chunk = read_all(root, chunk_rows=2)
    assert chunk.labels.tolist() == [1.0, 0.0, 1.0]
    assert source.malformed.count == 4
    assert [line for line, _ in source.malformed.first] == [3, 4, 5, 6]
    genres, lengths = chunk.sparse[6]
    assert lengths.tolist() == [2, 0, 2] and genres.tolist() == [2, 3, 2, 3]
    assert chunk.sparse[5][0].tolist() == [2, 6, 7]  # age buckets 18-24, 50-55, 56+
    assert chunk.sparse[2][0].tolist() == [1, 2, 1]  # gender M, F, M in order of appearance
    assert chunk.dense[1, 1] == 0.0  # unknown release year
    np.testing.assert_allclose(chunk.dense[:, 2], [0.0, 0.0, 1.0], atol=0.01)


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(DistrecError, match="not found; check --data"):
        read_movielens(tmp_path / "nope")
    (tmp_path / "ml").mkdir()
    with pytest.raises(DistrecError, match="u.data not found"):
        read_movielens(tmp_path / "ml")


def test_strict_mode(tmp_path):
    root = tiny_movielens(tmp_path / "ml", ["1\t1\t5\t874627200", "9\t1\t5\t874627200"])
    with pytest.raises(DistrecError, match=r"u\.data: line 2: unknown user id"):
        read_all(root, strict=True)


def test_ratings_outside_one_to_five_are_malformed(tmp_path):
    # regression: a rating of 9 was accepted (and labelled liked)
    root = tiny_movielens(
        tmp_path / "ml", ["1\t1\t9\t874627200", "1\t1\t0\t874627200", "2\t2\t4\t874627200", "1\t2\t-1\t874627200", "1\t1\t99999999999999999999\t874627200"]
    )
    source, chunk = read_all(root)
    assert chunk.labels.tolist() == [1.0] and source.malformed.count == 4
    assert [line for line, _ in source.malformed.first] == [1, 2, 4, 5]
    assert all("rating" in reason for _, reason in source.malformed.first)
    with pytest.raises(DistrecError, match="line 1: the rating is not one of 1-5"):
        list(read_movielens(root, strict=True).chunks)
