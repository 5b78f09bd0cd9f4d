"""What the trace importers share: the problem list (line and column of each) and value coercions.

A reader states each of its rules once, as a `Rule`: a mask over the file's records and
the message for a record that breaks it. `report` notes, for each bad record, the first
rule it breaks, and `Problems` lists them in line order. The coercions turn a column of
raw values into numbers, one rule for every reader and every parse: CSV fields arrive as
arrow strings, JSON values as a list of whatever the file held.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from sparksim.errors import FormatError
from sparksim.traces.format import MAX_POSITIONS

MAX_PROBLEMS = 20
MAX_COUNT = 2**62  # the largest round number, draft count or prompt length a file may give
_INT64 = (-(2**63), 2**63 - 1)

Column: TypeAlias = "pa.Array | list[Any]"  # trimmed CSV fields (`trim`), or the JSON values of one key


class Problems:
    """Collect problems with the place they were found; report the first MAX_PROBLEMS in line order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.items: list[tuple[int, str]] = []

    def add(self, where: str, message: str, line: int = 0) -> None:
        """Note a problem at `where` ("line 3, column 'accepted'"); `line` orders the report."""
        self.items.append((line, f"{where}: {message}"))

    @property
    def first_line(self) -> int | None:
        """The line of the first problem noted, if any."""
        return min(line for line, _ in self.items) if self.items else None

    @property
    def full(self) -> bool:
        """Whether the report is settled: a reader may stop looking further down the file."""
        return len(self.items) > MAX_PROBLEMS

    def raise_if_any(self) -> None:
        if not self.items:
            return
        texts = [text for _, text in sorted(self.items, key=lambda item: item[0])]
        if len(texts) > MAX_PROBLEMS:
            texts = [*texts[:MAX_PROBLEMS], f"(stopped after {MAX_PROBLEMS} problems)"]
        raise FormatError(self.path, texts)


@dataclass
class Rule:
    """One rule over a file's records: which break it, where (a column or key) and what to say."""

    bad: NDArray[np.bool_]  # (N,) records that break the rule
    place: str  # "column 'accepted'", "key 'labels'", or "" for the record as a whole
    message: Callable[[int], str]  # record index -> the problem, naming the bad value


def report(problems: Problems, lines: NDArray[np.int64], rules: Sequence[Rule]) -> None:
    """Note the first rule each bad record breaks (rules in the order given), for the first
    MAX_PROBLEMS + 1 bad records; `lines` (N,) holds each record's line, in file order."""
    if not rules or lines.size == 0:
        return
    bad = np.stack([rule.bad for rule in rules])  # (K, N)
    rows = np.flatnonzero(bad.any(axis=0))[: MAX_PROBLEMS + 1]
    for i, k in zip(rows.tolist(), bad[:, rows].argmax(axis=0).tolist(), strict=True):
        rule = rules[k]
        line = int(lines[i])
        problems.add(f"line {line}" + (f", {rule.place}" if rule.place else ""), rule.message(i), line)


def read_text(path: Path) -> str:
    """Return a file's text; raise FormatError when it is too large, not UTF-8 or unreadable."""
    try:
        size = path.stat().st_size
        # a round takes at least a few bytes, so this bounds the rounds a file can hold
        if size > 64 * MAX_POSITIONS:
            raise FormatError(path, [f"file is {size} bytes (limit {64 * MAX_POSITIONS})"])
        return path.read_text(encoding="utf-8-sig")  # a spreadsheet's byte-order mark is no column name
    except UnicodeDecodeError as exc:
        raise FormatError(path, [f"not UTF-8 text ({exc.reason} at byte {exc.start})"]) from None
    except OSError as exc:
        raise FormatError(path, [f"cannot read ({exc.strerror})"]) from None


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def json_lines(text: str, problems: Problems, *, fast: bool = True) -> tuple[NDArray[np.int64], list[Any]]:
    """Return (line, value) of each non-blank line of JSON text, noting the lines that are not JSON.

    `fast` first parses the lines as one JSON array when each line is sure to hold one value
    (`_one_object_per_line`), which is what a valid file of records needs; any failure, and
    `fast=False`, parse line by line.
    """
    lines = text.splitlines()
    if all(map(str.strip, lines)):  # no blank line: a line's number is its place
        numbers: Sequence[int] = range(1, len(lines) + 1)
    else:
        numbers = [no for no, line in enumerate(lines, start=1) if line.strip()]
        lines = [lines[no - 1] for no in numbers]
    if fast and _one_object_per_line(text, lines):
        try:
            values = json.loads("[" + ",".join(lines) + "]")
        except json.JSONDecodeError:
            values = None
        if values is not None and len(values) == len(lines):
            return np.array(numbers, dtype=np.int64), values
    return _json_each_line(numbers, lines, problems)


def _json_each_line(numbers: Sequence[int], lines: list[str], problems: Problems) -> tuple[NDArray[np.int64], list[Any]]:
    parsed: list[int] = []
    values = []
    for no, line in zip(numbers, lines, strict=True):
        if problems.full:
            break
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as exc:
            problems.add(f"line {no}", f"not valid JSON ({exc.msg})", no)
            continue
        parsed.append(no)
    return np.array(parsed, dtype=np.int64), values


def _one_object_per_line(text: str, lines: list[str]) -> bool:
    """Whether joining `lines` with commas into one JSON array cannot move a value across lines.

    Each line starts with "{", and no "}" is followed by "," in the text: a line then starts
    at most one value at the top of the array (a second would follow its first object's "}"
    and a comma), so an array of one value per line is one whose lines each hold one.
    """
    return all(line.lstrip().startswith("{") for line in lines) and re.search(r"\}\s*,", text) is None


# --------------------------------------------------------------------------- coercions


def as_int(value: Any) -> int | None:
    """Return `value` as an int if it is an integer (JSON int, integral float or digit string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value == int(value) else None
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                return None
            return int(f) if math.isfinite(f) and f == int(f) else None
    return None


def as_float(value: Any, *, text: bool = True) -> float | None:
    """Return `value` as a float if it is a number (or, with `text`, a string holding one)."""
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, int | float):
            return float(value)
        if text and isinstance(value, str):
            return float(value.strip())
    except (ValueError, OverflowError):  # an int too large for a float is no usable number
        return None
    return None


def missing(value: Any) -> bool:
    """Whether a JSON value counts as not given: null or a blank string."""
    return value is None or (isinstance(value, str) and value.strip() == "")


def is_count(values: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Whether each integer is a count a file may give: 0 ≤ v ≤ 2**62."""
    return (values >= 0) & (values <= MAX_COUNT)


def trim(values: pa.Array) -> pa.Array:
    """Strip the whitespace around each CSV field (the one definition both CSV parses use)."""
    return pc.utf8_trim_whitespace(values)


def empty(trimmed: pa.Array) -> NDArray[np.bool_]:
    """Whether each trimmed CSV field is empty (a missing value)."""
    return np.asarray(pc.equal(trimmed, "").to_numpy(zero_copy_only=False), dtype=np.bool_)


def int_column(values: Column, *, strict: bool = False) -> tuple[NDArray[np.int64], NDArray[np.bool_], NDArray[np.bool_]]:
    """Return (values, missing, is_int) of a column under `as_int`; `strict` takes JSON ints only
    (no integral floats or digit strings). Integers beyond int64 are clipped to its range."""
    if isinstance(values, list):
        kinds = set(map(type, values))
        none = _missing_values(values, kinds)
        if kinds <= {int}:
            try:
                return np.array(values, dtype=np.int64), none, np.ones(len(values), dtype=np.bool_)
            except OverflowError:
                pass
        got = [v if type(v) is int else None for v in values] if strict else [as_int(v) for v in values]
    else:
        none = empty(values)
        if _spelled_with(values, b"0123456789", longest=18):  # arrow reads these as int() does
            return _cast(values, none, pa.int64(), 0), none, ~none
        got = [None if no else as_int(v) for v, no in zip(values.to_pylist(), none.tolist(), strict=True)]
    lo, hi = _INT64
    out = np.array([0 if v is None else min(max(v, lo), hi) for v in got], dtype=np.int64)
    return out, none, np.array([v is not None for v in got], dtype=np.bool_)


def float_column(values: Column, *, text: bool = True) -> tuple[NDArray[np.float64], NDArray[np.bool_], NDArray[np.bool_]]:
    """Return (values, missing, is_number) of a column under `as_float` (`text=False`: JSON
    strings are no numbers); NaN where not a number."""
    if isinstance(values, list):
        kinds = set(map(type, values))
        none = _missing_values(values, kinds)
        if kinds <= {int, float, type(None)}:
            try:
                return np.array(values, dtype=np.float64), none, ~none  # None reads as NaN
            except OverflowError:
                pass
        got = [as_float(v, text=text) for v in values]
    else:
        none = empty(values)
        if _spelled_with(values, b"0123456789.eE+-"):  # arrow reads these as float() does
            try:
                return _cast(values, none, pa.float64(), np.nan), none, ~none
            except pa.ArrowInvalid:
                pass  # not all numbers: say which, one by one
        got = [None if no else as_float(v) for v, no in zip(values.to_pylist(), none.tolist(), strict=True)]
    out = np.array([np.nan if v is None else v for v in got], dtype=np.float64)
    return out, none, np.array([v is not None for v in got], dtype=np.bool_)


def _missing_values(values: list[Any], kinds: set[type]) -> NDArray[np.bool_]:
    """`missing` of each JSON value (only strings need looking at)."""
    if str in kinds:
        return np.fromiter(map(missing, values), dtype=np.bool_, count=len(values))
    return np.fromiter(map(operator.is_, values, itertools.repeat(None)), dtype=np.bool_, count=len(values))


def _spelled_with(values: pa.Array, alphabet: bytes, longest: int | None = None) -> bool:
    """Whether every string of an arrow string array is written with `alphabet` only (and is at
    most `longest` characters long)."""
    if values.type != pa.string() or len(values) == 0:
        return False
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[values.offset: values.offset + len(values) + 1]
    if longest is not None and np.diff(offsets).max() > longest:
        return False
    if data_buf is None:
        return True
    allowed = np.zeros(256, dtype=np.bool_)
    allowed[list(alphabet)] = True
    return bool(allowed[np.frombuffer(data_buf, dtype=np.uint8)[offsets[0]: offsets[-1]]].all())


def _cast(values: pa.Array, none: NDArray[np.bool_], to: pa.DataType, fill: float) -> Any:
    """Cast arrow strings to `to` with pyarrow, `fill` where missing."""
    out = pc.cast(pc.if_else(pa.array(none), pa.scalar(None, pa.string()), values), to)
    return np.array(pc.fill_null(out, fill).to_numpy(zero_copy_only=False))


def text_column(values: Column, *, numbers: bool = False) -> tuple[NDArray[np.bool_], NDArray[np.object_]]:
    """Return (valid, stripped text) of a column of names: non-blank strings, and with `numbers`
    JSON ints as well (request ids). Invalid entries hold ""."""
    if isinstance(values, list):
        named = {str, int} if numbers else {str}  # the types a name may be written as
        text: NDArray[np.object_] = np.empty(len(values), dtype=np.object_)
        if set(map(type, values)) <= named:
            text[:] = list(map(str.strip, map(str, values)))
            return text != "", text
        typed = np.array([type(v) in named for v in values], dtype=np.bool_)
        text[:] = [str(v).strip() if ok else "" for v, ok in zip(values, typed.tolist(), strict=True)]
        return typed & (text != ""), text
    return ~empty(values), np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.object_)


