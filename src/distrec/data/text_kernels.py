"""Parsing text bytes in compiled loops (numba): hex hashes, and whole clean Criteo lines.

Profiled on 1M synthetic Criteo rows (272 MB, one core): Arrow's CSV parse 1.9-2.4 s, hex
columns in NumPy (a digit matrix, a table lookup and a shift per digit position, each a
pass) 2.2 s, the counts' casts and transforms 0.6 s. :func:`parse_hex_ids` reads each byte
of a hex column once; :func:`parse_clean_criteo` tokenizes and converts a block of Criteo
lines in one pass over its bytes, without building Arrow columns, and gives up (-1) at the
first line it does not accept in full, so that the caller parses that block with Arrow and
checks it value by value. numba loads on the first call (about a second), not on import.
"""

from __future__ import annotations

import numba
import numpy as np

# Hex digit value of every byte, 255 for bytes that are not hex digits.
HEX_VALUE = np.full(256, 255, np.uint8)
for _digits, _base in ((b"0123456789", 0), (b"abcdef", 10), (b"ABCDEF", 10)):
    HEX_VALUE[np.frombuffer(_digits, np.uint8)] = np.arange(len(_digits), dtype=np.uint8) + _base

_TAB, _NEWLINE, _MINUS, _ZERO, _NINE = 9, 10, 45, 48, 57
# A count of at most 18 digits fits int64 whatever its digits; longer ones go to Arrow.
_MAX_COUNT_DIGITS = 18


@numba.njit(nogil=True, cache=True)
def parse_hex_ids(offsets, data, nulls, max_digits, raw, bad):  # pragma: no cover - compiled
    """Write ``value + 1`` of the hex text of each value into ``raw`` (0 for a null or empty
    value, and for a bad one, which is also flagged in ``bad``).

    Args:
        offsets: int32 or int64 [n + 1], value i is ``data[offsets[i]:offsets[i + 1]]``.
        data: uint8 [bytes] the text.
        nulls: bool [n] which values are null, or empty when none is.
        max_digits: the most hex digits of a good value.
        raw: int64 [n] out.
        bad: bool [n] out, set where a value has more digits or a byte that is not a hex digit.
    """
    table = HEX_VALUE
    for i in range(raw.shape[0]):
        start = offsets[i]
        end = offsets[i + 1]
        raw[i] = 0
        if end == start or (nulls.shape[0] > 0 and nulls[i]):
            continue
        if end - start > max_digits:
            bad[i] = True
            continue
        value = 0
        ok = True
        for k in range(start, end):
            digit = table[data[k]]
            if digit == 255:
                ok = False
                break
            value = (value << 4) | np.int64(digit)
        if ok:
            raw[i] = value + 1
        else:
            bad[i] = True


@numba.njit(nogil=True, cache=True)
def parse_clean_criteo(data, max_hex_digits, labels, counts, raw):  # pragma: no cover - compiled
    """Parse a block of whole Criteo lines, every one of which must be clean; the rows parsed,
    or -1 at the first line that is not.

    A clean line is ``0`` or ``1``, then 13 counts (empty, or an optional ``-`` and 1 to 18
    digits), then 26 hashes (empty, or 1 to ``max_hex_digits`` hex digits), separated by
    single tabs and ended by a newline (or the end of the block). Anything else (a carriage
    return, a space, a plus sign, a wrong field count, an empty line) is left to Arrow.

    Args:
        data: uint8 [bytes] the block.
        max_hex_digits: the most digits of a hash.
        labels: float32 [>= rows] out.
        counts: float64 [>= rows, 13] out: each count as float64, 0 where it is missing or
            negative (``max(count, 0)``, before the caller's log1p).
        raw: int64 [26, >= rows] out: raw ids ``hash + 1``, 0 where missing.
    """
    table = HEX_VALUE
    n = data.shape[0]
    num_counts = counts.shape[1]
    num_hashes = raw.shape[0]
    pos = 0
    row = 0
    while pos < n:
        c = data[pos]
        if (c != _ZERO and c != _ZERO + 1) or pos + 1 >= n or data[pos + 1] != _TAB:
            return -1
        labels[row] = c - _ZERO
        pos += 2
        for j in range(num_counts):
            negative = pos < n and data[pos] == _MINUS
            if negative:
                pos += 1
            value = 0
            start = pos
            while pos < n and _ZERO <= data[pos] <= _NINE:
                value = value * 10 + np.int64(data[pos] - _ZERO)
                pos += 1
            digits = pos - start
            if digits > _MAX_COUNT_DIGITS or (negative and digits == 0) or pos >= n or data[pos] != _TAB:
                return -1
            pos += 1
            counts[row, j] = 0.0 if negative else np.float64(value)
        for f in range(num_hashes):
            start = pos
            value = 0
            while pos < n:
                c = data[pos]
                if c == _TAB or c == _NEWLINE:
                    break
                digit = table[c]
                if digit == 255:
                    return -1
                value = (value << 4) | np.int64(digit)
                pos += 1
            if pos - start > max_hex_digits:
                return -1
            raw[f, row] = value + 1 if pos > start else 0
            if f + 1 < num_hashes:
                if pos >= n or data[pos] != _TAB:
                    return -1
                pos += 1
        if pos < n:
            if data[pos] != _NEWLINE:
                return -1
            pos += 1
        row += 1
    return row
