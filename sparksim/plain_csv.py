"""Read a CSV file into NumPy columns as `pandas.read_csv` does, importing pandas only when needed.

Profiles and arrival logs are small CSV files of numbers; pandas, imported to read them,
would be the largest part of a short run's start-up (about 0.25 s). A *plain* file is read
here: ASCII, a header of distinct identifiers, then rows of exactly as many cells, each a
decimal number (`-12`, `0.25`, `1e-3`) or, in the columns named as text, a word that
pandas cannot read as a number, a boolean or a missing value. Any other file (quotes,
blank lines, missing cells, spaces, a byte-order mark, too many rows) is read by pandas,
whose errors say what is wrong with it.

A plain file's columns are what `read_csv` gives: int64 where every cell is an integer of
at most 18 digits, else float64 (Python's correctly rounded float(); pandas' default parser
is not promised to round every decimal so, but gives the same bits on the files tests/test_plain_csv.py
writes: thousands of values in pandas' own format, %.17g and %.3e), and
text as an object array of str.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTEGER = re.compile(r"-?[0-9]{1,18}")
# a decimal number; an integer too long for int64 is left to pandas (which may read it as uint64)
_NUMBER = re.compile(r"-?(?:[0-9]{1,18}|(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
# words pandas reads as missing, boolean or infinite (compared lower-cased)
_NOT_TEXT = frozenset({"na", "nan", "null", "none", "true", "false", "inf", "infinity"})


def read_csv_columns(path: Path, max_rows: int, text: tuple[str, ...] = ()) -> dict[str, NDArray[Any]]:
    """Return the columns `pandas.read_csv(path, nrows=max_rows + 1)` reads, by header name.

    Raises what pandas raises for a file it cannot read (OSError; ValueError, which its
    ParserError, EmptyDataError and UnicodeDecodeError are).
    """
    plain = read_plain_csv(path, max_rows, text)
    if plain is not None:
        return plain
    import pandas as pd

    df = pd.read_csv(path, nrows=max_rows + 1)
    return {str(c): df[c].to_numpy() for c in df.columns}


def to_numeric(values: NDArray[Any]) -> NDArray[np.float64]:
    """Return a column as float64, text that is not a number as NaN (`pd.to_numeric(errors="coerce")`).

    A column pandas read as booleans (every cell True or False) is text too: all NaN, not 1 and 0."""
    if values.dtype.kind == "b":
        return np.full(values.shape, np.nan)
    if values.dtype == object:  # only pandas reads text into a column meant to hold numbers
        import pandas as pd

        values = pd.to_numeric(values, errors="coerce")
    return values.astype(np.float64)


def read_plain_csv(path: Path, max_rows: int, text: tuple[str, ...] = ()) -> dict[str, NDArray[Any]] | None:
    """Return the columns of a plain CSV file of 1..max_rows rows by header name, or None if
    the file is not plain (or cannot be read): then `pandas.read_csv` must read it."""
    try:
        lines = Path(path).read_bytes().decode("ascii").split("\n")
    except (OSError, UnicodeDecodeError):
        return None
    if lines[-1] == "":
        lines.pop()
    names = lines[0].split(",") if lines else []
    rows = [line.split(",") for line in lines[1:]]
    if (not rows or len(rows) > max_rows or len(set(names)) != len(names)
            or not all(_NAME.fullmatch(n) for n in names)
            or any(len(row) != len(names) for row in rows)):
        return None
    out: dict[str, NDArray[Any]] = {}
    for name, cells in zip(names, zip(*rows, strict=True), strict=True):
        column = _text(cells) if name in text else _numbers(cells)
        if column is None:
            return None
        out[name] = column
    return out


def _numbers(cells: tuple[str, ...]) -> NDArray[Any] | None:
    if all(_INTEGER.fullmatch(c) for c in cells):
        return np.array([int(c) for c in cells], dtype=np.int64)
    if not all(_NUMBER.fullmatch(c) for c in cells):
        return None
    values = np.array([float(c) for c in cells], dtype=np.float64)  # Python's float(): correctly rounded
    return values if np.isfinite(values).all() else None


def _text(cells: tuple[str, ...]) -> NDArray[Any] | None:
    if all(_WORD.fullmatch(c) and c.lower() not in _NOT_TEXT for c in cells):
        return np.array(cells, dtype=object)
    return None
