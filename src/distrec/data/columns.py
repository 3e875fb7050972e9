"""Vectorised conversions of Arrow columns to NumPy: numbers, hex hashes, hashed strings, bags.

Every function works on whole columns (Arrow kernels or NumPy over the Arrow buffers);
none loops over rows in Python. Raw ids follow ``distrec.data.source``: 0 is missing.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distrec.errors import DistrecError

# Accepted spellings when a fast Arrow cast fails and rows must be checked one by one
# (in a vectorised regex); the accepted text is then read as float64, so an integer of
# any length parses (beyond 2**53 it is rounded, as float64 rounds it).
_INTEGER = r"^[-+]?\d+$"
_FLOAT = r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$"

# At most 15 hex digits, so that value + 1 fits in a non-negative int64.
MAX_HEX_DIGITS = 15

# 64-bit FNV-1a (Fowler, Noll, Vo; http://www.isthe.com/chongo/tech/comp/fnv/).
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Zero-copy views of a string or binary column.

    Returns (starts int64 [n], lengths int64 [n], data uint8 [bytes]): value i is
    ``data[starts[i]:starts[i] + lengths[i]]``; nulls have length 0.
    """
    offsets, data = _offsets_and_data(arr)
    offsets = offsets.astype(np.int64)
    starts = offsets[:-1]
    lengths = np.diff(offsets)
    if arr.null_count:
        lengths[np.asarray(arr.is_null())] = 0
    return starts, lengths, data


def _offsets_and_data(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Views of a string or binary column's buffers: offsets (int32 or int64 [n + 1]; value i
    is ``data[offsets[i]:offsets[i + 1]]``, a null's bytes are meaningless) and data uint8."""
    if not (pa.types.is_string(arr.type) or pa.types.is_binary(arr.type) or pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)):
        raise TypeError(f"expected a string or binary column, got {arr.type}")
    _, offsets_buf, data_buf = arr.buffers()
    offset_type = np.int64 if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type) else np.int32
    n = len(arr)
    offsets = np.frombuffer(offsets_buf, offset_type)[arr.offset : arr.offset + n + 1] if offsets_buf is not None else np.zeros(n + 1, offset_type)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets, data


def parse_hex(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Hex strings (e.g. Criteo's ``68fd1e64``) to raw ids ``value + 1``; null or empty -> 0.

    Returns (raw int64 [n], bad bool [n]) where ``bad`` marks values that are not 1 to 15
    hex digits (their raw id is 0).
    """
    from distrec.data.text_kernels import parse_hex_ids  # numba loads on first use

    offsets, data = _offsets_and_data(arr)
    nulls = np.asarray(arr.is_null()) if arr.null_count else np.zeros(0, bool)
    raw, bad = np.empty(len(arr), np.int64), np.zeros(len(arr), bool)
    parse_hex_ids(offsets, data, nulls, MAX_HEX_DIGITS, raw, bad)
    return raw, bad


def hash_strings(arr: pa.Array) -> np.ndarray:
    """Deterministic 62-bit hashes (FNV-1a) of strings as raw ids >= 1; null or empty -> 0.

    Non-string columns are first cast to strings, so ``7`` and ``"7"`` hash alike.
    Returns int64 [n].
    """
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) or pa.types.is_binary(arr.type)):
        arr = pc.cast(arr, pa.string())
    starts, lengths, data = string_buffers(arr)
    h = np.full(len(arr), _FNV_OFFSET, np.uint64)
    last = max(data.size - 1, 0)
    for k in range(int(lengths.max(initial=0))):
        active = lengths > k
        byte = data[np.minimum(starts + k, last)] if data.size else np.zeros(len(arr), np.uint8)
        h = np.where(active, (h ^ byte) * _FNV_PRIME, h)
    return np.where(lengths > 0, (h >> np.uint64(2)).astype(np.int64) + 1, 0)


def _has_non_ascii(arr: pa.Array) -> np.ndarray:
    """bool [n]: which values of a string column hold a byte above 127."""
    starts, lengths, data = string_buffers(arr)
    high = np.zeros(data.size + 1, np.int64)
    np.cumsum(data >= 0x80, out=high[1:])
    return high[starts + lengths] > high[starts]


def parse_numbers(arr: pa.Array, integer: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A numeric, boolean or text column as finite float64 values (NaN where missing).

    Text is parsed as integers when ``integer`` is set, else as decimals; empty text is
    missing. Returns (values float64 [n], bad bool [n]) where ``bad`` marks text that is
    not a finite number of that kind (``nan``, ``inf`` and numbers beyond float64's range
    are bad) and infinite numeric values; bad entries are NaN. A NaN in a numeric column
    (as pandas writes a missing value) is missing, not bad.
    """
    bad = np.zeros(len(arr), bool)
    text = pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
    if text:
        try:
            arr = pc.cast(arr, pa.int64() if integer else pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            # slow path, only for batches holding a bad value: find the bad rows. A number is
            # ASCII; values with other bytes (maybe not even UTF-8: text is not checked) are bad
            non_ascii = _has_non_ascii(arr)
            arr = pc.if_else(pa.array(non_ascii), pa.scalar(None, arr.type), arr) if non_ascii.any() else arr
            trimmed = pc.utf8_trim_whitespace(arr)
            trimmed = pc.if_else(pc.equal(trimmed, ""), pa.scalar(None, trimmed.type), trimmed)
            ok = pc.match_substring_regex(trimmed, _INTEGER if integer else _FLOAT).fill_null(True)
            bad = ~np.asarray(ok) | non_ascii
            arr = pc.cast(pc.if_else(ok, trimmed, pa.scalar(None, trimmed.type)), pa.float64())
    elif not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_boolean(arr.type)):
        raise DistrecError(f"a numeric column has type {arr.type}; use a number column for dense values and labels")
    # int64 beyond 2**53 does not fit float64 exactly; rounding it is fine for features
    values = np.asarray(pc.cast(arr, pa.float64(), safe=False).fill_null(np.nan).to_numpy(zero_copy_only=False), np.float64)
    if not text and not pa.types.is_floating(arr.type):  # integers and booleans are always finite
        return values, bad
    non_finite = ~np.isfinite(values)
    if text:
        bad |= non_finite & ~np.asarray(arr.is_null())
    else:
        bad |= non_finite & ~np.isnan(values)
    if bad.any():
        values = np.where(bad, np.nan, values)
    return values, bad


def bags(arr: pa.Array, separator: str | None) -> tuple[np.ndarray, np.ndarray]:
    """A multi-valued categorical column as hashed bags (values int64 [nnz], lengths int32 [n]).

    ``arr`` is a list column, or text split at ``separator``. Empty items are dropped and a
    null cell is an empty bag.
    """
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            arr = pc.cast(arr, pa.string())
        arr = pc.split_pattern(arr, separator)
    n = len(arr)
    counts = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    items = hash_strings(pc.list_flatten(arr))
    owner = np.repeat(np.arange(n), counts)
    keep = items != 0
    return items[keep], np.bincount(owner[keep], minlength=n).astype(np.int32)
