"""Flat result records: one row per request and one row per engine step, as growable columns.

Columns are `array.array` buffers (8 bytes a value, amortised O(1) appends) so a long run
keeps memory proportional to the rows kept, and the per-step path does no allocation
beyond the appends. `ParquetColumns` streams a table to a parquet file instead, a row group
at a time, so a run of any length holds at most one row group of each table. Streaming
statistics (the ITL histogram, per-position acceptance counts, window token counts) live in
`StreamStats` and cost O(1) memory whatever the horizon.
"""

from __future__ import annotations

import json
import math
import typing
from array import array
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from sparksim.arrow_numpy import from_numpy, read_parquet_columns
from sparksim.config_sections import RunConfig

if TYPE_CHECKING:
    import pandas as pd


class RequestRecord(NamedTuple):
    """One request (a row of requests.parquet), as the simulated and the live engine write it."""

    request_id: int
    user: int  # closed loop: the user who sent it; -1 for open loop
    replica: int
    domain: int  # index into the run's domain list
    trace_request: int  # index of the first trace request replayed
    arrival_at: float
    first_token_at: float
    finish_at: float
    prompt_tokens: int
    output_tokens: int  # the request's output length
    emitted_tokens: int  # tokens it actually emitted (INV-1: equal when finished)
    decode_steps: int
    verified_drafts: int
    accepted_drafts: int  # the drafts that count, after the output-length cut
    preemptions: int
    trace_switches: int  # continuations onto another trace request of the same domain


class StepRecord(NamedTuple):
    """One engine step (a row of steps.parquet), as the simulated and the live engine write it."""

    replica: int
    step: int
    start_at: float
    step_s: float
    draft_s: float
    verify_s: float  # the target's forward: dense part + kv_s + attention compute + drafts overhead
    kv_s: float  # of verify_s: reading the batch's KV cache and prompt chunks' attention
    decision_s: float
    num_requests: int
    batch_tokens: int
    prefill_tokens: int
    verified_drafts: int
    accepted_drafts: int  # what verification accepted, Σ min(ℓ, accepted), before the output cut
    emitted_tokens: int
    context_mean: float
    kv_tokens: int  # KV tokens the decode requests held (Σ context)


def _schema(record: type[tuple[int | float, ...]]) -> dict[str, str]:
    """Column name -> array typecode ("q" int64, "d" float64), from a record's annotations."""
    return {name: "q" if kind is int else "d" for name, kind in typing.get_type_hints(record).items()}


REQUEST_COLUMNS: dict[str, str] = _schema(RequestRecord)
STEP_COLUMNS: dict[str, str] = _schema(StepRecord)
PENDING_ROWS = 4096  # rows buffered as tuples before they move into the columns in bulk


class Columns:
    """A table under construction: one typed array per column, appended row by row."""

    def __init__(self, schema: dict[str, str]) -> None:
        self.schema = schema
        self.cols: dict[str, array[float] | array[int]] = {k: array(t) for k, t in schema.items()}
        self._arrays = list(self.cols.values())
        self._pending: list[tuple[float | int, ...]] = []  # rows not yet moved into the columns

    def append_row(self, row: tuple[float | int, ...]) -> None:
        """Append one row, values in schema order (buffered: one tuple now, columns in bulk)."""
        self._pending.append(row)
        if len(self._pending) >= PENDING_ROWS:
            self.flush()

    def flush(self) -> None:
        """Move buffered rows into the typed columns."""
        if self._pending:
            for arr, values in zip(self._arrays, zip(*self._pending, strict=True), strict=True):
                arr.extend(values)
            self._pending.clear()

    def __len__(self) -> int:
        return len(self._arrays[0]) + len(self._pending)

    def arrays(self, names: list[str] | None = None) -> dict[str, NDArray[Any]]:
        """Return the columns (all, or those named) as NumPy arrays, each its own copy."""
        self.flush()
        return {k: np.array(self._view(k)) for k in (names or list(self.cols))}

    def _view(self, name: str, rows: int | None = None) -> NDArray[Any]:
        """A view of a column's first `rows` values (all by default): valid until it grows."""
        return np.frombuffer(self.cols[name], dtype=np.float64 if self.schema[name] == "d" else np.int64,
                             count=-1 if rows is None else rows)

    def to_frame(self) -> pd.DataFrame:
        """Return the table as a DataFrame (its own copy: the columns may grow on)."""
        import pandas as pd

        self.flush()
        # views, not copies: a DataFrame built from a dict copies its columns, so one copy of
        # a long run's table is made, not two (the views go when this returns)
        return pd.DataFrame({k: self._view(k) for k in self.cols}, copy=True)

    def write_parquet(self, path: Path) -> None:
        """Write the table to `path` as `to_frame().to_parquet(path, index=False)` does, byte for byte."""
        import pyarrow.parquet as pq

        self.flush()
        pq.write_table(self._arrow_table(arrow_schema(self.schema)), path, compression="snappy")  # pandas' options

    def _arrow_table(self, schema: Any, rows: int | None = None) -> Any:
        """The first `rows` rows (all by default) as an arrow table of `schema`; NaN becomes
        null, as `Table.from_pandas` (and so `to_parquet`) makes it."""
        import pyarrow as pa

        return pa.Table.from_arrays([from_numpy(self._view(k, rows)) for k in self.cols], schema=schema)


# pyarrow's own most rows in a row group (`ParquetWriter.write_table`): a table streamed in
# groups of this many rows is, byte for byte, the file `DataFrame.to_parquet` writes of it whole.
ROW_GROUP_ROWS = 1024 * 1024


class ParquetColumns(Columns):
    """A table streamed to a parquet file: rows gather in columns and leave a row group at a time.

    The file is the one `to_frame().to_parquet(path, index=False)` would write (same schema,
    pandas metadata, NaN as null, row groups): with the default `row_group_rows`, the same
    bytes. At most a row group and PENDING_ROWS are held at once (about 128 MiB at the
    default: 16 columns of 8 bytes). `close` writes the last group and ends the file; the
    table is then read back from `path`, never from here.
    """

    def __init__(self, schema: dict[str, str], path: Path, row_group_rows: int | None = None) -> None:
        import pyarrow.parquet as pq

        super().__init__(schema)
        self.path = path
        self.row_group_rows = row_group_rows or ROW_GROUP_ROWS  # read now: a test may shrink it
        self.rows_written = 0
        self._arrow_schema = arrow_schema(schema)
        # pandas' own write options (`to_parquet`: snappy), so the two paths write one file
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(path, self._arrow_schema, compression="snappy")

    def flush(self) -> None:
        """Move buffered rows into the columns, and every full row group out to the file."""
        super().flush()
        while len(self._arrays[0]) >= self.row_group_rows:
            self._write(self.row_group_rows)

    def __len__(self) -> int:
        return self.rows_written + super().__len__()

    def _write(self, rows: int) -> None:
        """Write the first `rows` rows held as one row group, and keep the rest."""
        assert self._writer is not None, f"{self.path}: written after close"
        group = self._arrow_table(self._arrow_schema, rows)
        self._writer.write_table(group)
        del group  # it may share the columns' buffers, which are replaced below, never resized
        self.cols = {k: v[rows:] for k, v in zip(self.schema, self._arrays, strict=True)}
        self._arrays = list(self.cols.values())
        self.rows_written += rows

    def close(self) -> Path:
        """Write what is held as the last row group, end the file and return its path.

        An empty table is written as `to_parquet` writes an empty frame.
        """
        if self._writer is None:
            return self.path
        self.flush()
        held = len(self._arrays[0])
        if held or not self.rows_written:
            self._write(held)
        self._writer.close()
        self._writer = None
        return self.path

    def arrays(self, names: list[str] | None = None) -> dict[str, NDArray[Any]]:
        """Return the columns (all, or those named), read back from the file (closing it first)."""
        return read_parquet_columns(self.close(), names)

    def to_frame(self) -> pd.DataFrame:
        """Return the whole table, read back from its file (closing it first)."""
        import pandas as pd

        return pd.read_parquet(self.close())


def arrow_schema(schema: dict[str, str]) -> Any:
    """Return the arrow schema `to_parquet` gives a frame of `schema`'s columns, its pandas
    metadata (the JSON `pyarrow.pandas_compat.construct_metadata` writes) included.

    Built by hand: `pa.Schema.from_pandas` would import pandas into every run that writes a table.
    """
    import pyarrow as pa

    kinds = {k: "float64" if t == "d" else "int64" for k, t in schema.items()}
    meta = {
        "index_columns": [], "column_indexes": [],
        "columns": [{"name": k, "field_name": k, "pandas_type": t, "numpy_type": t, "metadata": None}
                    for k, t in kinds.items()],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": metadata.version("pandas"),
    }
    return pa.schema([(k, pa.float64() if t == "float64" else pa.int64()) for k, t in kinds.items()],
                     metadata={b"pandas": json.dumps(meta).encode("utf8")})


# ITL histogram: log-spaced bins from 1 µs to 1000 s, 200 per decade (≤ 0.6 % bin width).
_ITL_LO = 1e-6
_ITL_PER_DECADE = 200
_ITL_BINS = 9 * _ITL_PER_DECADE + 2
_ITL_LOG_LO = math.log10(_ITL_LO)


def itl_bin(gap_s: float) -> int:
    """Return the ITL histogram bin of an inter-token gap in seconds."""
    if gap_s <= _ITL_LO:
        return 0
    return min(int(math.log10(gap_s / _ITL_LO) * _ITL_PER_DECADE) + 1, _ITL_BINS - 1)


def itl_bins(gaps_s: NDArray[np.float64]) -> NDArray[np.int64]:
    """Return `itl_bin` of each gap (seconds, none NaN), computed for the whole array at once.

    numpy's logarithm may differ from `itl_bin`'s in the last bits, which moves a gap across
    a bin edge only when its scaled logarithm is within rounding of an integer: those few
    (and every gap at or below 1 µs, scaled to 0) are binned by `itl_bin` itself, so every
    bin is the one the scalar function gives.
    """
    scaled = np.log10(np.maximum(gaps_s, _ITL_LO))
    scaled -= _ITL_LOG_LO
    scaled *= _ITL_PER_DECADE
    bins = scaled.astype(np.int64)
    bins += 1
    np.minimum(bins, _ITL_BINS - 1, out=bins)
    edge = np.abs(scaled - np.rint(scaled)) < 1e-6
    if edge.any():
        for i in np.flatnonzero(edge).tolist():
            bins[i] = itl_bin(float(gaps_s[i]))
    return bins


def itl_bin_value(idx: NDArray[np.int64]) -> NDArray[np.float64]:
    """Return the geometric centre (seconds) of ITL histogram bins."""
    return _ITL_LO * 10.0 ** ((np.asarray(idx, np.float64) - 0.5) / _ITL_PER_DECADE)


ITL_BUFFER = 1 << 14  # (gap, count) entries held before they are binned in bulk


@dataclass
class StreamStats:
    """Steady-state statistics accumulated step by step in O(1) memory.

    Inter-token gaps arrive as (gap, count) entries, a step's worth at a time; they wait in a
    fixed buffer and are binned and summed ITL_BUFFER entries at once, in arrival order, so
    the histogram, the count and the running sum (added left to right) are the ones adding
    each gap in turn gives, bit for bit. Reading `itl_hist`, `itl_sum_s` or `itl_count`
    folds the buffer in first.
    """

    gamma: int
    window_start: float
    window_end: float
    joint: NDArray[np.int64] = field(init=False)  # (γ+1)² counts of (ℓ, accepted drafts)
    window_tokens: int = 0
    window_request_steps: int = 0
    window_verified: int = 0
    window_emitted_decode: int = 0

    def __post_init__(self) -> None:
        self._hist = np.zeros(_ITL_BINS, dtype=np.int64)
        self._sum_s = 0.0
        self._count = 0
        self._gaps = np.empty(ITL_BUFFER, dtype=np.float64)
        self._counts = np.empty(ITL_BUFFER, dtype=np.int64)
        self._held = 0
        self.joint = np.zeros((self.gamma + 1) ** 2, dtype=np.int64)

    @classmethod
    def for_run(cls, run: RunConfig, gamma: int) -> StreamStats:
        """The statistics of a run's steady window: its warm-up to its horizon less its cool-down."""
        return cls(gamma=gamma, window_start=run.warmup, window_end=run.duration_s - run.cooldown)

    def in_window(self, at: float) -> bool:
        return self.window_start <= at <= self.window_end

    @property
    def itl_hist(self) -> NDArray[np.int64]:
        """Gaps per ITL histogram bin (`itl_bin`)."""
        self._fold()
        return self._hist

    @property
    def itl_sum_s(self) -> float:
        """The gaps' sum in seconds, added in arrival order."""
        self._fold()
        return self._sum_s

    @itl_sum_s.setter
    def itl_sum_s(self, value: float) -> None:
        self._fold()
        self._sum_s = value

    @property
    def itl_count(self) -> int:
        """How many gaps were recorded."""
        self._fold()
        return self._count

    def add_itl(self, gap_s: float, count: int) -> None:
        """Record `count` inter-token gaps of `gap_s` seconds (a NaN gap, of unknown start, is skipped)."""
        if count <= 0 or gap_s != gap_s:
            return
        k = self._held
        if k == ITL_BUFFER:
            self._fold()
            k = 0
        self._gaps[k] = gap_s
        self._counts[k] = count
        self._held = k + 1

    def add_itls(self, gaps_s: NDArray[np.float64]) -> None:
        """Record one inter-token gap per entry of `gaps_s`, as `add_itl(gap, 1)` for each in turn."""
        size = gaps_s.size
        if size > ITL_BUFFER - self._held:
            self._fold()
            if size > ITL_BUFFER:
                self._fold_entries(gaps_s, np.ones(size, dtype=np.int64))
                return
        k = self._held
        self._gaps[k : k + size] = gaps_s
        self._counts[k : k + size] = 1
        self._held = k + size

    def _fold(self) -> None:
        """Bin and sum the buffered entries and empty the buffer."""
        if self._held:
            k, self._held = self._held, 0
            self._fold_entries(self._gaps[:k], self._counts[:k])

    def _fold_entries(self, gaps_s: NDArray[np.float64], counts: NDArray[np.int64]) -> None:
        keep = gaps_s == gaps_s  # a NaN gap, of unknown start, is skipped
        if not keep.all():
            gaps_s, counts = gaps_s[keep], counts[keep]
        if not gaps_s.size:
            return
        # float weights sum integers exactly below 2**53 gaps a bin
        self._hist += np.bincount(itl_bins(gaps_s), weights=counts, minlength=_ITL_BINS).astype(np.int64)
        # gap × count is the float `add_itl` added one entry at a time; accumulate adds left
        # to right (not pairwise), so the sum is the same float as one entry per call
        self._sum_s = float(np.add.accumulate(np.concatenate(([self._sum_s], gaps_s * counts)))[-1])
        self._count += int(counts.sum())

    def itl_quantiles(self, qs: list[float]) -> list[float]:
        """Return ITL quantiles (seconds) from the histogram; nan if no gap was recorded."""
        if self.itl_count == 0:
            return [math.nan] * len(qs)
        cum = np.cumsum(self.itl_hist)
        out = []
        for q in qs:
            idx = int(np.searchsorted(cum, q * cum[-1], side="left"))
            out.append(float(itl_bin_value(np.array([idx]))[0]))
        return out
