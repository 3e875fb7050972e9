"""The file ``distrec predict`` writes: one row per scored sample, written batch by batch.

Columns: ``row`` (int64, the sample's row in the input: its position among the input's
valid rows, counted from 0), ``score`` (float32, the click probability) and ``label``
(float32, 0 or 1, the input's label). Parquet or CSV by the file's extension. The file is
built under a temporary name beside its target and renamed when complete, so a reader sees
the previous file or the whole new one.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from distrec.errors import DistrecError
from distrec.io import atomic_path

SCHEMA = pa.schema([("row", pa.int64()), ("score", pa.float32()), ("label", pa.float32())])
FORMATS = {".parquet": "parquet", ".csv": "csv"}


def scores_format(path: Path) -> str:
    """``parquet`` or ``csv`` by ``path``'s extension; DistrecError for any other."""
    try:
        return FORMATS[Path(path).suffix.lower()]
    except KeyError:
        raise DistrecError(f"-o {str(path)!r}: name a .parquet or .csv file (the extension picks the format)") from None


class ScoresWriter:
    """Appends batches of scores to a Parquet or CSV file that appears whole when the block ends.

    Example:
        >>> with ScoresWriter(Path("scores.parquet")) as writer:
        ...     writer.write(np.arange(3), np.array([0.1, 0.5, 0.9], np.float32), np.array([0, 1, 1], np.float32))
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.format = scores_format(self.path)
        self.rows = 0
        self._stack = ExitStack()

    def __enter__(self) -> ScoresWriter:
        with ExitStack() as stack:
            temporary = stack.enter_context(atomic_path(self.path))
            if self.format == "parquet":
                self._writer = stack.enter_context(pq.ParquetWriter(temporary, SCHEMA))
            else:
                self._writer = stack.enter_context(pacsv.CSVWriter(temporary, SCHEMA))
            self._stack = stack.pop_all()
        return self

    def write(self, rows: np.ndarray, scores: np.ndarray, labels: np.ndarray) -> None:
        """Append samples: their input rows int64 [n], scores float32 [n] and labels float32 [n]."""
        self._writer.write_batch(pa.record_batch([pa.array(rows, pa.int64()), pa.array(scores, pa.float32()), pa.array(labels, pa.float32())], schema=SCHEMA))
        self.rows += len(rows)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None) -> bool | None:
        return self._stack.__exit__(kind, error, traceback)
