"""MovieLens-100k (an ``ml-100k`` directory) as a binary click task.

``u.data`` holds ratings (user, item, rating 1-5, Unix time), ``u.user`` the users (id,
age, gender, occupation, zip code) and ``u.item`` the movies (id, title, release date,
video date, URL, 19 genre flags; latin-1 text). A rating becomes one row: label =
rating >= 4; categorical user id, item id, gender, occupation, zip prefix (first three
characters), age bucket, and the movie's genres as a multi-hot bag; dense age and release
year (standardised over users and movies; unknown = 0) and the rating time in years
since the collection started. Ratings are streamed; the user and movie tables are small.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from distrec.data.columns import parse_numbers
from distrec.data.source import (
    Chunk,
    MalformedRows,
    RowCheck,
    Source,
    SparseFeature,
    describe_error,
    existing_path,
    gather_bags,
    single_hot,
)
from distrec.data.textfile import CsvStream
from distrec.errors import DistrecError

NUM_GENRES = 19
# Age buckets of MovieLens-1M (README of ml-1m): under 18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+.
AGE_BUCKET_EDGES = np.array([18, 25, 35, 45, 50, 56])
# The ratings were collected from 1997-09-19 (Unix time 874627200) on (ml-100k README).
COLLECTION_START_S = 874_627_200
SECONDS_PER_YEAR = 365.25 * 86_400
LIKED_RATING = 4
RATINGS = np.arange(1, 6)  # the 1-5 star scale of the ml-100k README
DENSE_NAMES = ["age", "release_year", "timestamp"]
_RATING_COLUMNS = ["user_id", "item_id", "rating", "timestamp"]


def read_movielens(path: str | Path, chunk_rows: int = 262_144, strict: bool = False) -> Source:
    """Stream the ratings of an ml-100k directory as chunks of at most ``chunk_rows`` rows.

    Ratings with the wrong column count, non-numeric fields, a rating outside 1-5 or an
    unknown user or movie are skipped and counted (with ``strict``, the first one raises a DistrecError).
    """
    root = existing_path(path, kind="directory")
    for name in ("u.data", "u.user", "u.item"):
        if not (root / name).is_file():
            raise DistrecError(f"{root / name} not found; --data-format movielens needs an ml-100k directory")
    users = _Users(root / "u.user")
    items = _Items(root / "u.item")
    malformed = MalformedRows(root / "u.data", strict)
    stream = CsvStream(root / "u.data", "\t", False, malformed, chunk_rows, column_names=_RATING_COLUMNS, text_columns=_RATING_COLUMNS)
    features = [
        SparseFeature("user_id", id_bound=users.id_bound),
        SparseFeature("item_id", id_bound=items.id_bound),
        SparseFeature("gender", id_bound=users.gender.id_bound),
        SparseFeature("occupation", id_bound=users.occupation.id_bound),
        SparseFeature("zip_prefix", id_bound=users.zip_prefix.id_bound),
        SparseFeature("age_bucket", id_bound=len(AGE_BUCKET_EDGES) + 2),
        SparseFeature("genres", multi_hot=True, id_bound=NUM_GENRES + 1),
    ]
    return Source(
        description={"format": "movielens", "path": str(root)},
        label="liked",
        dense=list(DENSE_NAMES),
        features=features,
        chunks=_chunks(stream, users, items),
        malformed=malformed,
        fraction_read=stream.fraction_read,
    )


def _chunks(stream: CsvStream, users: _Users, items: _Items) -> Iterator[Chunk]:
    for batch, line_numbers in stream:
        check = RowCheck(batch.num_rows)
        fields = {}
        for name in _RATING_COLUMNS:
            fields[name], bad = parse_numbers(batch.column(name), integer=True)
            check.flag(bad | np.isnan(fields[name]), f"{name} is missing or not an integer")
        check.flag(~np.isin(fields["rating"], RATINGS), f"the rating is not one of {RATINGS.min()}-{RATINGS.max()}")
        # ids beyond int64 (unknown anyway) are clipped so the cast stays defined
        user = np.clip(np.nan_to_num(fields["user_id"], nan=0), -1, 2**62).astype(np.int64)
        item = np.clip(np.nan_to_num(fields["item_id"], nan=0), -1, 2**62).astype(np.int64)
        check.flag(~users.known(user), "unknown user id")
        check.flag(~items.known(item), "unknown item id")
        keep = check.report(stream.malformed, line_numbers)
        user, item = user[keep], item[keep]
        years = (fields["timestamp"][keep] - COLLECTION_START_S) / SECONDS_PER_YEAR
        dense = np.stack([users.age_z[user], items.year_z[item], years], axis=1).astype(np.float32)
        genres, lengths = gather_bags(items.genre_values, items.genre_offsets, item)
        sparse = [
            single_hot(user),
            single_hot(item),
            single_hot(users.gender.raw[user]),
            single_hot(users.occupation.raw[user]),
            single_hot(users.zip_prefix.raw[user]),
            single_hot(users.age_bucket[user]),
            (genres, lengths.astype(np.int32)),
        ]
        yield Chunk(dense, (fields["rating"][keep] >= LIKED_RATING).astype(np.float32), sparse)


def _read_table(path: Path, names: list[str], encoding: str = "utf8") -> pa.Table:
    """A small '|'-separated side table, every column as text."""
    try:
        return pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=names, encoding=encoding),
            parse_options=pacsv.ParseOptions(delimiter="|", quote_char=False),
            convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names}, strings_can_be_null=True),
        )
    except (pa.ArrowInvalid, OSError) as e:
        raise DistrecError(f"cannot read {path}: {describe_error(e)}; is this an ml-100k directory?") from None


def _ids(table: pa.Table, path: Path) -> np.ndarray:
    ids, bad = parse_numbers(table.column("id").combine_chunks(), integer=True)
    if bad.any() or np.isnan(ids).any() or (ids < 1).any():
        raise DistrecError(f"{path} has a missing or non-positive id; is this an ml-100k directory?")
    return ids.astype(np.int64)


def _standardise(x: np.ndarray) -> np.ndarray:
    """(x - mean) / std over the known values; unknown (NaN) becomes 0, the mean."""
    known = ~np.isnan(x)
    mean = x[known].mean() if known.any() else 0.0
    std = x[known].std() if known.sum() > 1 else 1.0
    return np.where(known, (x - mean) / (std or 1.0), 0.0)


class _Vocabulary:
    """Raw ids 1..K for the distinct strings of a column, indexed by entity id (0 = missing)."""

    def __init__(self, column: pa.ChunkedArray, ids: np.ndarray, id_bound: int) -> None:
        encoded = column.combine_chunks().dictionary_encode()
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        self.raw = np.zeros(id_bound, np.int64)
        self.raw[ids] = np.nan_to_num(codes, nan=-1).astype(np.int64) + 1
        self.id_bound = len(encoded.dictionary) + 1


class _Entities:
    """A side table's ids (in file order), ``id_bound`` (largest id + 1) and which ids exist."""

    def __init__(self, table: pa.Table, path: Path) -> None:
        self.ids = _ids(table, path)
        self.id_bound = int(self.ids.max()) + 1
        self._known = np.zeros(self.id_bound, bool)
        self._known[self.ids] = True

    def known(self, ids: np.ndarray) -> np.ndarray:
        return (ids >= 0) & (ids < self.id_bound) & self._known[np.clip(ids, 0, self.id_bound - 1)]


class _Users(_Entities):
    """u.user as arrays indexed by user id."""

    def __init__(self, path: Path) -> None:
        table = _read_table(path, ["id", "age", "gender", "occupation", "zip"])
        super().__init__(table, path)
        ids = self.ids
        age, _ = parse_numbers(table.column("age").combine_chunks())
        self.age_z = np.zeros(self.id_bound)
        self.age_z[ids] = _standardise(age)
        self.age_bucket = np.zeros(self.id_bound, np.int64)
        self.age_bucket[ids] = np.where(np.isnan(age), 0, np.searchsorted(AGE_BUCKET_EDGES, age, side="right") + 1)
        self.gender = _Vocabulary(table.column("gender"), ids, self.id_bound)
        self.occupation = _Vocabulary(table.column("occupation"), ids, self.id_bound)
        self.zip_prefix = _Vocabulary(pc.utf8_slice_codeunits(table.column("zip"), 0, 3), ids, self.id_bound)


class _Items(_Entities):
    """u.item as arrays indexed by movie id; genres as a jagged column of raw ids 1..19."""

    def __init__(self, path: Path) -> None:
        flags = [f"genre{g}" for g in range(NUM_GENRES)]
        table = _read_table(path, ["id", "title", "release_date", "video_date", "url", *flags], encoding="latin1")
        super().__init__(table, path)
        ids = self.ids
        year, _ = parse_numbers(pc.utf8_slice_codeunits(table.column("release_date"), -4).combine_chunks(), integer=True)
        self.year_z = np.zeros(self.id_bound)
        self.year_z[ids] = _standardise(year)
        on = np.zeros((self.id_bound, NUM_GENRES), bool)
        on[ids] = np.stack([pc.equal(table.column(f), "1").fill_null(False).to_numpy() for f in flags], axis=1)
        self.genre_offsets = np.zeros(self.id_bound + 1, np.int64)
        np.cumsum(on.sum(axis=1), out=self.genre_offsets[1:])
        self.genre_values = np.nonzero(on)[1].astype(np.int64) + 1  # row-major: by movie, then genre
