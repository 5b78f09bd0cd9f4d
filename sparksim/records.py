"""Flat result records: one row per request and one row per engine step, as growable columns.

Columns are `array.array` buffers (8 bytes a value, amortised O(1) appends) so a long run
keeps memory proportional to the rows kept, and the per-step path does no allocation
beyond the appends. Streaming statistics (the ITL histogram, per-position acceptance
counts, window token counts) live in `StreamStats` and cost O(1) memory whatever the horizon.
"""

from __future__ import annotations

import math
import typing
from array import array
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from sparksim.config import RunConfig


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
        if len(self._pending) >= 4096:
            self.flush()

    def flush(self) -> None:
        """Move buffered rows into the typed columns."""
        if self._pending:
            for arr, values in zip(self._arrays, zip(*self._pending, strict=True), strict=True):
                arr.extend(values)
            self._pending.clear()

    def __len__(self) -> int:
        return len(self._arrays[0]) + len(self._pending)

    def to_frame(self) -> pd.DataFrame:
        self.flush()
        data = {
            k: np.frombuffer(v, dtype=np.float64 if self.schema[k] == "d" else np.int64).copy()
            for k, v in self.cols.items()
        }
        return pd.DataFrame(data)


# ITL histogram: log-spaced bins from 1 µs to 1000 s, 200 per decade (≤ 0.6 % bin width).
_ITL_LO = 1e-6
_ITL_PER_DECADE = 200
_ITL_BINS = 9 * _ITL_PER_DECADE + 2


def itl_bin(gap_s: float) -> int:
    """Return the ITL histogram bin of an inter-token gap in seconds."""
    if gap_s <= _ITL_LO:
        return 0
    return min(int(math.log10(gap_s / _ITL_LO) * _ITL_PER_DECADE) + 1, _ITL_BINS - 1)


def itl_bin_value(idx: NDArray[np.int64]) -> NDArray[np.float64]:
    """Return the geometric centre (seconds) of ITL histogram bins."""
    return _ITL_LO * 10.0 ** ((np.asarray(idx, np.float64) - 0.5) / _ITL_PER_DECADE)


@dataclass
class StreamStats:
    """Steady-state statistics accumulated step by step in O(1) memory."""

    gamma: int
    window_start: float
    window_end: float
    itl_hist: NDArray[np.int64] = field(init=False)
    itl_sum_s: float = 0.0
    itl_count: int = 0
    joint: NDArray[np.int64] = field(init=False)  # (γ+1)² counts of (ℓ, accepted drafts)
    window_tokens: int = 0
    window_request_steps: int = 0
    window_verified: int = 0
    window_emitted_decode: int = 0

    def __post_init__(self) -> None:
        self.itl_hist = np.zeros(_ITL_BINS, dtype=np.int64)
        self.joint = np.zeros((self.gamma + 1) ** 2, dtype=np.int64)
        self._bins: dict[float, int] = {}

    @classmethod
    def for_run(cls, run: RunConfig, gamma: int) -> StreamStats:
        """The statistics of a run's steady window: its warm-up to its horizon less its cool-down."""
        return cls(gamma=gamma, window_start=run.warmup, window_end=run.duration_s - run.cooldown)

    def in_window(self, at: float) -> bool:
        return self.window_start <= at <= self.window_end

    def add_itl(self, gap_s: float, count: int) -> None:
        """Record `count` inter-token gaps of `gap_s` seconds (a NaN gap, of unknown start, is skipped)."""
        if count <= 0 or gap_s != gap_s:
            return
        b = self._bins.get(gap_s)
        if b is None:  # step times repeat (a profile is a table), so bins are memoised
            b = self._bins[gap_s] = itl_bin(gap_s)
        self.itl_hist[b] += count
        self.itl_sum_s += gap_s * count
        self.itl_count += count

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
