"""Engine cost tables: the step-cost tables DSpark engines' planners read, out of and into sparksim.

Each engine's verify planner prices a step with its own table, on its own grid, by its own
lookup rule, none of which is sparksim's price (`sparksim.cost.pricing`):

- SGLang (sgl-project/sglang PR #30261), `python/sglang/srt/speculative/dspark_components/
  dspark_sps.py` @ 45b76f55042711c33f1e2f0ba2a4281f7a51704a (`load_sps_table_from_path`):
  a JSON `SpsCostTable` (steps/s by batch tokens, the largest probe <= B) or
  `SpsAdditiveCostTable` (seconds: bias + α(R) + θ(B), linear, clamped). Its profiler,
  `python/sglang/benchmark/dspark_sps_profiler.py` @ 0cdfa2f8363e82641db14b68545ea9df27b2a7f4,
  sweeps the diagonal B = bs·(γ+1) with 16-token prompts.
- TensorRT-LLM (NVIDIA/TensorRT-LLM PR #17056), `tensorrt_llm/_torch/speculative/
  dspark_planner.py` @ 52cd02d5b6344ae30ef638e5f94cfe474262cde2 (`SpsCostTable`): the
  "decomposed" JSON, ms, θ(M) + fixed + α(bs), linear and clamped on both axes.
- vLLM (vllm-project/vllm PR #47808), `vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`
  v0.33.0 l.80-128 (`build_cost_tables_from_curves`): tables profiled at every start-up
  and held in memory; upstream vLLM reads and writes no file. The vLLM-family file that
  exists is vLLM-Ascend's `HardwareCostModel` JSON (vllm-project/vllm-ascend
  `vllm_ascend/spec_decode/dynamic/cost_model.py` @ 0fc719806a0b6c2c3b15a890cd72163eb0f3b5de:
  `latency_ms` by token count, whole step), so that is the `vllm` format here, read into
  vLLM's in-memory form (`VllmCostTables`).
- ATOM (ROCm/ATOM PR #1414 @ 888694f1253bcc1342b100fced04fd0d9f4f43b6,
  `atom/spec_decode/dspark_scheduler.py` `build_sps_table` L114): in memory only, no file
  format; `AtomSpsTable` exists for the policies.

`export_table` prices an engine's own grid with sparksim's one price; `write_table` and
`read_table` carry a table to and from the engine's file (refusing, with file, key, row and
value, what is not a cost curve); `import_table` writes a sparksim profile whose price
equals the table's at the table's probes.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import math
import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import pandas as pd
import yaml
from numpy.typing import NDArray

from sparksim.atomic import write_text
from sparksim.cost.pricing import StepCost, StepPrice
from sparksim.cost.profile import Profile, write_profile
from sparksim.errors import ConfigError, FormatError

FORMATS = ("sglang", "trtllm", "vllm")  # engines with a table file (ATOM has none)
# SGLang's `build_request_count_sweep(256)`, the profilers' request grid
REQUEST_GRID = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
# KV context per request while profiling: SGLang's --input-len 16; vLLM's
# VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN; TRT's sweep uses whatever its prompts give,
# 1024 is sparksim's choice
DEFAULT_CONTEXT = {"sglang": 16, "trtllm": 1024, "vllm": 8192}
DEFAULT_GAMMA = 7
FORMAT_SOURCES = {
    "sglang": "sgl-project/sglang@45b76f55042711c33f1e2f0ba2a4281f7a51704a "
              "python/sglang/srt/speculative/dspark_components/dspark_sps.py (SpsCostTable, "
              "SpsAdditiveCostTable); grid: python/sglang/benchmark/dspark_sps_profiler.py"
              "@0cdfa2f8363e82641db14b68545ea9df27b2a7f4 (diagonal sweep)",
    "trtllm": "NVIDIA/TensorRT-LLM@52cd02d5b6344ae30ef638e5f94cfe474262cde2 "
              "tensorrt_llm/_torch/speculative/dspark_planner.py (SpsCostTable, PR #17056, "
              "decomposed encoding)",
    "vllm": "vllm-project/vllm-ascend@0fc719806a0b6c2c3b15a890cd72163eb0f3b5de "
            "vllm_ascend/spec_decode/dynamic/cost_model.py (HardwareCostModel); lookup: "
            "vllm-project/vllm v0.33.0 adaptive_verification.py build_cost_tables_from_curves",
}
MONOTONE_RTOL = 1e-9  # a cost may fall by rounding, not more
KV_SPAN = 1 << 40  # imported attention.csv: one cost by request count for any KV up to this
DRAFT_SPAN = 1 << 20  # imported zero draft table: request counts it covers without extrapolating
IMPORTED_DRAFTER = "engine-step"
SIDECAR_KEPT = ("what", "source", "profile", "command", "date", "gamma", "drafter", "context_tokens", "max_rel_gap")


# --------------------------------------------------------------------------- the lookups


def _floor_probe(probes: NDArray[np.float64], at: NDArray[np.float64]) -> NDArray[np.intp]:
    """Index of the largest probe <= `at`, clamped to the first and last probe (SGLang's 1-D rule)."""
    return np.clip(np.searchsorted(probes, at, side="right") - 1, 0, probes.size - 1)


def vllm_lookup(xs: NDArray[np.float64], ys: NDArray[np.float64], at: NDArray[np.float64],
                limit: int) -> NDArray[np.float64]:
    """Return vLLM's cost at `at` from a profiled curve (xs, ys), before its floors.

    `build_cost_tables_from_curves`: the running max of the points; at or below `limit`
    (the largest captured size; everywhere when it is 0) the value at the next profiled
    size >= B (padding to the next graph); above it, linear between the profiled points
    that are themselves above it (held at the first of them just past the limit); past
    the last point, the slope of the last two.
    """
    ys = np.maximum.accumulate(ys)
    out = ys[np.minimum(np.searchsorted(xs, at, side="left"), xs.size - 1)]
    above = xs > limit
    if limit and above.any():
        out = np.where(at > limit, np.interp(at, xs[above], ys[above]), out)
    if xs.size > 1:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(at > xs[-1], ys[-1] + slope * (at - xs[-1]), out)
    return out


# --------------------------------------------------------------------------- the tables


class EngineTable(Protocol):
    """A step-cost table as one engine's planner reads it."""

    @property
    def engine(self) -> str:
        """sglang | trtllm | vllm | atom (read-only: the tables are frozen)."""

    def step_s(self, requests: int, tokens: NDArray[np.int64]) -> NDArray[np.float64]:
        """Seconds of a step of `requests` requests sending each of `tokens` batch tokens, by
        the engine's own lookup rule."""

    @property
    def is_flat(self) -> bool:
        """Whether the table is the engine's "no table" placeholder: a cost that no token count changes."""


@dataclass(frozen=True)
class SglangSpsTable:
    """SGLang's 1-D `SpsCostTable`: steps/s at probed batch tokens B (total verify tokens, R + K).

    The planner reads the largest probe <= B (a floor), clamped to the first probe below it
    and the last above it (`_lookup_sps_tensor`); `max_batch_tokens` is metadata the planner
    never reads. Without `--speculative-dspark-sps-table-path` SGLang builds `flat()`.
    """

    engine: ClassVar[str] = "sglang"
    batch_tokens: tuple[int, ...]
    steps_per_sec: tuple[float, ...]
    max_batch_tokens: int

    @classmethod
    def flat(cls, max_batch_tokens: int = 1) -> SglangSpsTable:
        """SGLang's placeholder `[1] -> [1.0]` (`build_sps_cost_table`): θ = τ* rises with
        every candidate, so the planner verifies everything."""
        return cls((1,), (1.0,), max_batch_tokens)

    @functools.cached_property
    def _arrays(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return np.asarray(self.batch_tokens, np.float64), np.asarray(self.steps_per_sec, np.float64)

    def step_s(self, requests: int, tokens: NDArray[np.int64]) -> NDArray[np.float64]:
        """1 / steps-per-second at the largest probe <= each B (clamped at both ends)."""
        probes, sps = self._arrays
        return 1.0 / sps[_floor_probe(probes, np.asarray(tokens, np.float64))]

    @property
    def is_flat(self) -> bool:
        return len(set(self.steps_per_sec)) <= 1

    def problems(self, skip: Collection[str] = ()) -> list[str]:
        """Every way the table breaks SGLang's format or is not a cost curve (keys in `skip` unread)."""
        out: list[str] = []
        b, s = "sample_batch_tokens", "sample_steps_per_sec"
        if b not in skip:
            _check_probes(b, self.batch_tokens, 1, out)
        if s not in skip:
            _check_range(s, self.steps_per_sec, out, lo=1e-2, hi=1e6, unit="steps/s",
                         low_hint="a step of more than 100 s looks like seconds per step",
                         high_hint="a step under 1 µs looks like tokens/s")
        if not {b, s} & set(skip) and _check_lengths(b, self.batch_tokens, s, self.steps_per_sec, out):
            _check_sps_not_rising(self.batch_tokens, self.steps_per_sec, out)
        if "max_batch_tokens" not in skip and b not in skip and self.batch_tokens \
                and self.max_batch_tokens < self.batch_tokens[-1]:
            out.append(f"max_batch_tokens={self.max_batch_tokens} is below the last probe "
                       f"{b}[{len(self.batch_tokens) - 1}]={self.batch_tokens[-1]}")
        return out


@dataclass(frozen=True)
class SglangAdditiveTable:
    """SGLang's `SpsAdditiveCostTable`: T(R, B) = bias + α(R) + θ(B), seconds.

    α by request count (`bs_probes`), θ by batch tokens (`m_probes`), each piecewise linear
    and clamped at both ends (`_additive_step_time_tensor`). Its profiler fits it by least
    squares over off-diagonal sweeps (`--fracs`); PR #35413 derives one from graph replays.
    """

    engine: ClassVar[str] = "sglang"
    bias_s: float
    bs_probes: tuple[int, ...]
    alpha_s: tuple[float, ...]
    m_probes: tuple[int, ...]
    theta_s: tuple[float, ...]

    @functools.cached_property
    def _arrays(self) -> tuple[NDArray[np.float64], ...]:
        return tuple(np.asarray(v, np.float64) for v in (self.bs_probes, self.alpha_s, self.m_probes, self.theta_s))

    def step_s(self, requests: int, tokens: NDArray[np.int64]) -> NDArray[np.float64]:
        """bias + α(R) + θ(B), linear between probes and clamped outside them."""
        bs, alpha, m, theta = self._arrays
        return self.bias_s + float(np.interp(requests, bs, alpha)) + np.interp(
            np.asarray(tokens, np.float64), m, theta)

    @property
    def is_flat(self) -> bool:
        return len(set(self.theta_s)) <= 1

    def problems(self, skip: Collection[str] = ()) -> list[str]:
        """SGLang's checks (bias > 0, probes increasing, lengths) and sparksim's: no term falling
        with its probe, no unit slip, every step positive (keys in `skip` unread)."""
        out: list[str] = []
        keys = ("bias_seconds", "bs_probes", "alpha_seconds", "m_probes", "theta_seconds")
        if keys[1] not in skip:
            _check_probes(keys[1], self.bs_probes, 1, out)
        if keys[3] not in skip:
            _check_probes(keys[3], self.m_probes, 0, out)
        if keys[0] not in skip:
            _check_range(keys[0], (self.bias_s,), out, lo=0.0, hi=100.0, unit="s", scalar=True,
                         high_hint="a step term over 100 s looks like milliseconds")
        for key, values in ((keys[2], self.alpha_s), (keys[4], self.theta_s)):
            if key not in skip:  # SGLang's fit may give negative terms; the sum is checked below
                _check_range(key, values, out, lo=0.0, hi=100.0, unit="s", sign="any",
                             high_hint="a step term over 100 s looks like milliseconds")
        pairs_ok = []
        for pk, pv, vk, vv in ((keys[1], self.bs_probes, keys[2], self.alpha_s),
                               (keys[3], self.m_probes, keys[4], self.theta_s)):
            ok = pk not in skip and vk not in skip and _check_lengths(pk, pv, vk, vv, out)
            if ok and pv:
                _check_not_falling(vk, vv, pk, pv, out)
            pairs_ok.append(ok and bool(pv))
        if all(pairs_ok) and keys[0] not in skip:
            least = self.bias_s + min(self.alpha_s) + min(self.theta_s)
            if not least > 0:
                out.append(f"bias_seconds + min(alpha_seconds) + min(theta_seconds) = {least:g} s: "
                           "a step would cost nothing or less")
        return out


@dataclass(frozen=True)
class TrtllmSpsTable:
    """TensorRT-LLM's decomposed `SpsCostTable` (PR #17056): T = θ(M) + fixed + α(bs), ms.

    `token_counts` are M = bs·(L+1) (bonus included); `step_time_ms` is θ(M) only; the
    optional `batch_sizes` / `batch_overhead_ms` give α(bs). Lookup is a clamped linear
    interpolation on both axes. `minimum_predicted_gain` is 0.01 when loaded from a file
    (a trim must beat verify-all by 1 %). The planner refuses to trim on a flat table
    (`is_flat`: θ constant, TRT's own definition; `flat` there is `[0] -> [1.0]`).
    """

    engine: ClassVar[str] = "trtllm"
    token_counts: tuple[int, ...]
    step_time_ms: tuple[float, ...]
    fixed_overhead_ms: float = 0.0
    batch_sizes: tuple[int, ...] = ()
    batch_overhead_ms: tuple[float, ...] = ()
    minimum_predicted_gain: float = 0.01

    @functools.cached_property
    def _arrays(self) -> tuple[NDArray[np.float64], ...]:
        return tuple(np.asarray(v, np.float64) for v in (
            self.token_counts, self.step_time_ms, self.batch_sizes, self.batch_overhead_ms))

    def batch_overhead_at(self, requests: int) -> float:
        """α(bs) in ms, linear and clamped; 0 for a table without a batch axis."""
        _, _, bs, alpha = self._arrays
        return float(np.interp(requests, bs, alpha)) if bs.size else 0.0

    def step_s(self, requests: int, tokens: NDArray[np.int64]) -> NDArray[np.float64]:
        """(θ(M) + fixed + α(R)) / 1000, each interpolated linearly and clamped at both ends."""
        m, theta, _, _ = self._arrays
        ms = np.interp(np.asarray(tokens, np.float64), m, theta)
        return (ms + self.fixed_overhead_ms + self.batch_overhead_at(requests)) / 1e3

    @property
    def is_flat(self) -> bool:
        return len(set(self.step_time_ms)) <= 1

    def problems(self, skip: Collection[str] = ()) -> list[str]:
        """TensorRT-LLM's `__post_init__` checks, plus θ not falling with M and no unit slip (keys in
        `skip` unread)."""
        out: list[str] = []
        keys = ("token_counts", "step_time_ms", "fixed_overhead_ms", "batch_sizes", "batch_overhead_ms")
        if keys[0] not in skip:
            _check_probes(keys[0], self.token_counts, 0, out)
        if keys[1] not in skip:
            _check_range(keys[1], self.step_time_ms, out, lo=1e-4, hi=1e5, unit="ms",
                         low_hint="looks like seconds", high_hint="looks like µs")
        if keys[2] not in skip:
            _check_range(keys[2], (self.fixed_overhead_ms,), out, lo=0.0, hi=1e5, unit="ms",
                         sign="nonneg", high_hint="looks like µs", scalar=True)
        if keys[3] not in skip:
            _check_probes(keys[3], self.batch_sizes, 1, out, empty_ok=True)
        if keys[4] not in skip:
            _check_range(keys[4], self.batch_overhead_ms, out, lo=0.0, hi=1e5, unit="ms",
                         sign="nonneg", high_hint="looks like µs")
        if not {keys[0], keys[1]} & set(skip) and _check_lengths(
                keys[0], self.token_counts, keys[1], self.step_time_ms, out):
            _check_not_falling(keys[1], self.step_time_ms, keys[0], self.token_counts, out)
        if not {keys[3], keys[4]} & set(skip):
            _check_lengths(keys[3], self.batch_sizes, keys[4], self.batch_overhead_ms, out)
        if "minimum_predicted_gain" not in skip and not self.minimum_predicted_gain >= 0:
            out.append(f"minimum_predicted_gain={self.minimum_predicted_gain!r} must be >= 0")
        return out


@dataclass(frozen=True)
class VllmCostTables:
    """vLLM's in-memory cost tables (PR #47808): cost(R, B) = draft_ms[R] + verify_ms[B], ms.

    Both are built from profiled curves by one rule (`vllm_lookup`; in vLLM the capture
    limit applies to the draft curve too), then floored: draft >= 0, verify >= 1e-6 ms.

    Read from vLLM-Ascend's `HardwareCostModel` file (whole-step `latency_ms` by token
    count) the verify points are its keys, the draft curve is zero (the drafting is inside
    each step's latency) and `cudagraph_limit` is the largest key, so the whole table is a
    step function: the value at the next key >= B. That is the Ascend lookup, "the nearest
    profiled key >= B", at every B up to the largest key; past it Ascend holds the largest
    key's latency and vLLM's rule extrapolates the last two keys' slope (as sparksim's
    profiles do).
    """

    engine: ClassVar[str] = "vllm"
    verify_tokens: tuple[int, ...]
    verify_ms: tuple[float, ...]
    draft_requests: tuple[int, ...]
    draft_ms: tuple[float, ...]
    cudagraph_limit: int

    @functools.cached_property
    def _arrays(self) -> tuple[NDArray[np.float64], ...]:
        return tuple(np.asarray(v, np.float64) for v in (
            self.verify_tokens, self.verify_ms, self.draft_requests, self.draft_ms))

    def draft_at(self, requests: int) -> float:
        """draft_ms[R], floored at 0."""
        _, _, xs, ys = self._arrays
        at = np.asarray([requests], np.float64)
        return max(float(vllm_lookup(xs, ys, at, self.cudagraph_limit)[0]), 0.0)

    def step_s(self, requests: int, tokens: NDArray[np.int64]) -> NDArray[np.float64]:
        """(draft_ms[R] + verify_ms[B]) / 1000 by vLLM's table rule."""
        xs, ys, _, _ = self._arrays
        verify = np.maximum(vllm_lookup(xs, ys, np.asarray(tokens, np.float64), self.cudagraph_limit), 1e-6)
        return (self.draft_at(requests) + verify) / 1e3

    @property
    def is_flat(self) -> bool:
        """vLLM has no placeholder (it refuses to start unprofiled); True only for a constant verify curve."""
        return len(set(self.verify_ms)) <= 1

    def problems(self, skip: Collection[str] = ()) -> list[str]:
        """Every way the table breaks the vLLM-Ascend file, named by the file's keys (`latency_ms["B"]`).

        The file holds one whole-step curve: a table with a draft cost, or a capture limit
        below its largest token count, has no place in it.
        """
        out: list[str] = []
        if not _check_lengths("verify_tokens", self.verify_tokens, "verify_ms", self.verify_ms, out):
            return out
        if not self.verify_tokens:
            out.append("latency_ms is empty: a table needs at least one token count")
        names = [f'latency_ms["{b}"]' for b in self.verify_tokens]
        for i, (b, name) in enumerate(zip(self.verify_tokens, names, strict=True)):
            if b < 1:
                out.append(f"{name}: token counts must be >= 1")
            if i and b <= self.verify_tokens[i - 1]:
                out.append(f"{name} repeats token count {b}")
        for name, v in zip(names, self.verify_ms, strict=True):
            _check_range(name, (v,), out, lo=1e-4, hi=1e5, unit="ms", scalar=True,
                         low_hint="looks like seconds", high_hint="looks like µs")
        for i in range(1, len(self.verify_ms)):
            if self.verify_ms[i] < self.verify_ms[i - 1] - MONOTONE_RTOL * abs(self.verify_ms[i - 1]):
                out.append(f"{names[i]}={self.verify_ms[i]!r} falls below {names[i - 1]}="
                           f"{self.verify_ms[i - 1]!r}: a step that gets cheaper with more tokens is not "
                           "a cost curve")
        if any(v != 0 for v in self.draft_ms):
            out.append(f"draft_ms={list(self.draft_ms)}: the vLLM-Ascend file holds whole steps only "
                       "(fold the draft cost into latency_ms)")
        if self.verify_tokens and self.cudagraph_limit != self.verify_tokens[-1]:
            out.append(f"cudagraph_limit={self.cudagraph_limit}: the file's lookup pads to the next key "
                       f"up to its largest ({self.verify_tokens[-1]}), so the limit must be that key")
        return out


@dataclass(frozen=True)
class AtomSpsTable:
    """ATOM's in-memory SPS table (PR #1414 `build_sps_table`): steps/s for B = 0..max_b.

    Dense `sps[B]` is piecewise linear between the points and held flat outside them; a
    lookup clamps B to [0, max_b]. ATOM keeps it in float32; this keeps float64 (its
    values differ from ATOM's by float32 rounding, ~1e-7 relative).
    """

    engine: ClassVar[str] = "atom"
    token_points: tuple[int, ...]
    sps_points: tuple[float, ...]
    max_b: int

    @classmethod
    def stub(cls, requests: int, gamma: int) -> AtomSpsTable:
        """ATOM's placeholder without calibration (`compute_ell`, verify_scheduler.py L59-63):
        `linspace(1.0, 0.1, R·(γ+1) + 1)` over B = 0..R(γ+1), unitless, rebuilt every step;
        stored point by point so every integer B reads linspace's own value."""
        return _atom_stub(requests * (gamma + 1) + 1)

    @functools.cached_property
    def _arrays(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return np.asarray(self.token_points, np.float64), np.asarray(self.sps_points, np.float64)

    @property
    def sps(self) -> NDArray[np.float64]:
        """steps/s at the points, as an array (the stub's: at every B = 0..max_b)."""
        return self._arrays[1]

    def step_s(self, requests: int, tokens: NDArray[np.int64]) -> NDArray[np.float64]:
        """1 / sps[min(max(B, 0), max_b)], sps linear between points and flat outside them."""
        points, sps = self._arrays
        at = np.clip(np.asarray(tokens, np.float64), 0, self.max_b)
        return 1.0 / np.interp(at, points, sps)

    @property
    def is_flat(self) -> bool:
        return len(set(self.sps_points)) <= 1


@functools.lru_cache(maxsize=256)
def _atom_stub(n: int) -> AtomSpsTable:
    """The stub of `n` points (cached: a policy asks for it every step, as ATOM rebuilds it)."""
    return AtomSpsTable(tuple(range(n)), tuple(np.linspace(1.0, 0.1, n).tolist()), n - 1)


# --------------------------------------------------------------------------- checks


def _check_lengths(ka: str, a: Sequence[Any], kb: str, b: Sequence[Any], out: list[str]) -> bool:
    """Append a problem unless `a` and `b` have the same length; return whether they do."""
    if len(a) != len(b):
        out.append(f"{ka} has {len(a)} entries but {kb} has {len(b)}: they must pair up")
        return False
    return True


def _check_probes(key: str, probes: Sequence[int], lo: int, out: list[str], *, empty_ok: bool = False) -> None:
    """Probes must be integers >= `lo`, strictly increasing (and at least one unless `empty_ok`)."""
    if not probes and not empty_ok:
        out.append(f"{key} is empty: a table needs at least one probe")
    for i, p in enumerate(probes):
        if p < lo:
            out.append(f"{key}[{i}]={p} must be >= {lo}")
        if i and p <= probes[i - 1]:
            out.append(f"{key}[{i}]={p} is not above {key}[{i - 1}]={probes[i - 1]}: probes must strictly increase")


def _check_range(key: str, values: Sequence[float], out: list[str], *, lo: float, hi: float, unit: str,
                 sign: str = "positive", low_hint: str = "", high_hint: str = "", scalar: bool = False) -> None:
    """Every value finite, of its `sign` (positive, nonneg or any) and within [lo, hi] `unit`.

    A value past the range is named with the unit it more likely is (`low_hint`, `high_hint`).
    """
    for i, v in enumerate(values):
        name = key if scalar else f"{key}[{i}]"
        if not math.isfinite(v):
            out.append(f"{name}={v!r} is not a finite number")
        elif sign == "positive" and v <= 0:
            out.append(f"{name}={v!r} must be > 0 {unit}")
        elif sign == "nonneg" and v < 0:
            out.append(f"{name}={v!r} must be >= 0 {unit}")
        elif abs(v) > hi:
            out.append(f"{name}={v!r} {unit} is implausible: {high_hint}")
        elif 0 < abs(v) < lo:
            out.append(f"{name}={v!r} {unit} is implausible: {low_hint}")


def _check_not_falling(key: str, values: Sequence[float], probe_key: str, probes: Sequence[int],
                       out: list[str]) -> None:
    """A step's time must not fall as its probe grows (by more than `MONOTONE_RTOL` relative)."""
    for i in range(1, len(values)):
        if values[i] < values[i - 1] - MONOTONE_RTOL * abs(values[i - 1]):
            out.append(f"{key}[{i}]={values[i]!r} falls below {key}[{i - 1}]={values[i - 1]!r} as "
                       f"{probe_key} grows {probes[i - 1]} -> {probes[i]}: a step that gets cheaper with "
                       "more work is not a cost curve")


def _check_sps_not_rising(probes: Sequence[int], sps: Sequence[float], out: list[str]) -> None:
    """SGLang's steps/s must not rise as batch tokens grow (its profiler warns only above 10 %)."""
    for i in range(1, len(sps)):
        if sps[i] > sps[i - 1] * (1 + MONOTONE_RTOL):
            out.append(f"sample_steps_per_sec[{i}]={sps[i]!r} rises above sample_steps_per_sec[{i - 1}]="
                       f"{sps[i - 1]!r} as sample_batch_tokens grows {probes[i - 1]} -> {probes[i]}: a "
                       "step that runs faster with more tokens means the table is not a cost curve "
                       "(SGLang's profiler only warns above a 10 % rise; sparksim refuses any)")


# --------------------------------------------------------------------------- files


def check_format(fmt: str) -> str:
    """Return `fmt` if it names an engine table file format; else ConfigError listing them."""
    if fmt not in FORMATS:
        raise ConfigError(f"format {fmt!r} is not one of {', '.join(FORMATS)} "
                          "(ATOM keeps its table in memory: it has no file format)")
    return fmt


def sidecar_path(path: Path | str) -> Path:
    """The card written beside an exported table: `<file>.card.yaml`."""
    path = Path(path)
    return path.with_name(path.name + ".card.yaml")


class _Keys:
    """Typed reads of a JSON object's keys: each missing or mistyped key is a problem and goes in `bad`."""

    def __init__(self, doc: dict[str, Any], out: list[str]) -> None:
        self.doc, self.out = doc, out
        self.bad: set[str] = set()

    def _get(self, key: str, default: Any) -> Any:
        if key in self.doc:
            return self.doc[key]
        if default is None:
            self.out.append(f"missing key {key!r}")
            self.bad.add(key)
        return default

    def _items(self, key: str, default: Any, want: str) -> tuple[Any, ...]:
        raw = self._get(key, default)
        if key in self.bad:
            return ()
        if not isinstance(raw, list | tuple):
            self.out.append(f"{key}={raw!r} must be a list of {want}s")
            self.bad.add(key)
            return ()
        for i, v in enumerate(raw):
            if not _is_json(v, want):
                self.out.append(f"{key}[{i}]={v!r} is not a JSON {want}")
                self.bad.add(key)
        return tuple(raw) if key not in self.bad else ()

    def ints(self, key: str, default: tuple[int, ...] | None = None) -> tuple[int, ...]:
        return self._items(key, default, "integer")

    def floats(self, key: str, default: tuple[float, ...] | None = None) -> tuple[float, ...]:
        return tuple(float(v) for v in self._items(key, default, "number"))

    def one(self, key: str, want: str, default: float | None = None) -> Any:
        raw = self._get(key, default)
        if key in self.bad:
            return math.nan if want == "number" else 0
        if not _is_json(raw, want):
            self.out.append(f"{key}={raw!r} is not a JSON {want}")
            self.bad.add(key)
            return math.nan if want == "number" else 0
        return float(raw) if want == "number" else int(raw)


def _is_json(value: Any, want: str) -> bool:
    """Whether `value` decoded from JSON is an `integer` (not a bool, not 8.0) or a `number`."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if want == "integer" else isinstance(value, int | float)


def _read_sglang(doc: dict[str, Any], text: str, out: list[str]) -> EngineTable:
    """SGLang's two tables, told apart as `load_sps_table_from_path` does: the text names `bias_seconds`."""
    k = _Keys(doc, out)
    table: SglangSpsTable | SglangAdditiveTable
    if '"bias_seconds"' in text:
        table = SglangAdditiveTable(k.one("bias_seconds", "number"), k.ints("bs_probes"),
                                    k.floats("alpha_seconds"), k.ints("m_probes"), k.floats("theta_seconds"))
    else:
        table = SglangSpsTable(k.ints("sample_batch_tokens"), k.floats("sample_steps_per_sec"),
                               k.one("max_batch_tokens", "integer"))
    out.extend(table.problems(k.bad))
    return table


TRT_V2_KEYS = ("cost_tables", "engine_fingerprint", "engine_fingerprint_sha256", "measurements", "schema_version")


def _read_trtllm(doc: dict[str, Any], text: str, out: list[str]) -> EngineTable:
    """TensorRT-LLM's decomposed table; the schema-v2 exact (G, V) table (PR #18392) is refused."""
    v2 = [key for key in TRT_V2_KEYS if key in doc]
    if v2:
        out.append(f"keys {v2} mark TensorRT-LLM's schema-v2 exact (G, V) table (PR #18392), which "
                   "sparksim does not read; give the decomposed table (token_counts, step_time_ms)")
    meta = doc.get("_meta", {})
    if not isinstance(meta, dict):
        out.append(f"_meta={meta!r} must be an object")
        meta = {}
    if meta.get("encoding", "decomposed") != "decomposed":
        out.append(f"_meta.encoding={meta['encoding']!r}: only the decomposed encoding "
                   "(step_time_ms = θ(M), plus fixed and batch overheads) is read")
    if meta.get("lookup", "interp") != "interp":
        out.append(f"_meta.lookup={meta['lookup']!r}: TensorRT-LLM interpolates whatever this says (its "
                   "loader only warns); sparksim refuses a table made for another lookup")
    k = _Keys(doc, out)
    table = TrtllmSpsTable(k.ints("token_counts"), k.floats("step_time_ms"),
                           k.one("fixed_overhead_ms", "number", 0.0), k.ints("batch_sizes", ()),
                           k.floats("batch_overhead_ms", ()), k.one("minimum_predicted_gain", "number", 0.01))
    out.extend(table.problems(k.bad))
    return table


def _read_vllm(doc: dict[str, Any], text: str, out: list[str]) -> EngineTable:
    """vLLM-Ascend's `HardwareCostModel` file, as vLLM's in-memory tables (see `VllmCostTables`)."""
    if doc.get("schema_version", 1) != 1:
        out.append(f"schema_version={doc['schema_version']!r}: only version 1 is known")
    raw = doc.get("latency_ms")
    if not isinstance(raw, dict):
        out.append("missing key 'latency_ms' (an object of whole-step ms by token count; sparksim "
                   "reads neither `sps` nor `curves`)" if raw is None else
                   f"latency_ms={raw!r} must be an object of ms by token count")
        raw = {}
    points: dict[int, float] = {}
    for key, v in raw.items():
        if not (isinstance(key, str) and key.strip().isdigit()):
            out.append(f'latency_ms["{key}"]: the key is not a token count (a positive integer)')
        elif not _is_json(v, "number"):
            out.append(f'latency_ms["{key}"]={v!r} is not a JSON number')
        elif int(key) in points:
            out.append(f'latency_ms["{key}"] repeats token count {int(key)}')
        else:
            points[int(key)] = float(v)
    tokens = tuple(sorted(points))
    table = VllmCostTables(tokens, tuple(points[t] for t in tokens), (1,), (0.0,), tokens[-1] if tokens else 0)
    if raw or not out:
        out.extend(table.problems())
    return table


READERS = {"sglang": _read_sglang, "trtllm": _read_trtllm, "vllm": _read_vllm}


def read_table(path: Path | str, fmt: str) -> EngineTable:
    """Read an engine's table file of format `fmt`; FormatError lists every problem, with key, row and value."""
    check_format(fmt)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise FormatError(path, [f"cannot be read ({exc.strerror})"]) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(path, [f"not JSON ({exc})"]) from None
    if not isinstance(doc, dict):
        raise FormatError(path, [f"must be a JSON object of the {fmt} table's keys"])
    out: list[str] = []
    table = READERS[fmt](doc, text, out)
    if out:
        raise FormatError(path, out)
    return table


def _payload(table: SglangSpsTable | SglangAdditiveTable | TrtllmSpsTable | VllmCostTables) -> dict[str, Any]:
    """The engine's JSON object for `table`."""
    if isinstance(table, SglangSpsTable):
        return {"sample_batch_tokens": list(table.batch_tokens), "sample_steps_per_sec": list(table.steps_per_sec),
                "max_batch_tokens": table.max_batch_tokens}
    if isinstance(table, SglangAdditiveTable):
        return {"bias_seconds": table.bias_s, "bs_probes": list(table.bs_probes),
                "alpha_seconds": list(table.alpha_s), "m_probes": list(table.m_probes),
                "theta_seconds": list(table.theta_s)}
    if isinstance(table, TrtllmSpsTable):
        return {"token_counts": list(table.token_counts), "step_time_ms": list(table.step_time_ms),
                "fixed_overhead_ms": table.fixed_overhead_ms, "batch_sizes": list(table.batch_sizes),
                "batch_overhead_ms": list(table.batch_overhead_ms),
                "minimum_predicted_gain": table.minimum_predicted_gain,
                "_meta": {"encoding": "decomposed", "lookup": "interp",
                          "producer": "sparksim profile export (sparksim.cost.engine_tables)"}}
    return {"schema_version": 1, "profile_kind": "sparksim_export", "source": "sparksim profile export",
            "fingerprint": {},
            "latency_ms": {str(t): ms for t, ms in zip(table.verify_tokens, table.verify_ms, strict=True)}}


def write_table(table: EngineTable, path: Path | str, card: dict[str, Any] | None = None) -> Path:
    """Write `table` in its engine's file format (atomically), and `card` beside it as `<file>.card.yaml`.

    A table that `read_table` would refuse is not written: FormatError names each problem.
    """
    path = Path(path)
    if not isinstance(table, SglangSpsTable | SglangAdditiveTable | TrtllmSpsTable | VllmCostTables):
        raise ConfigError(f"a {table.engine} table has no file format (ATOM keeps its table in memory)")
    payload = _payload(table)
    problems = table.problems()
    if problems:
        raise FormatError(path, problems)
    write_text(path, json.dumps(payload, indent=1) + "\n")
    if card is not None:
        write_text(sidecar_path(path), yaml.safe_dump(card, sort_keys=False, width=100))
    return path


# --------------------------------------------------------------------------- export


def default_gamma(profile: Profile, drafter: str | None = None) -> int:
    """The drafter's block γ: its card's `gamma`, else the most positions its table holds, else 7.

    As `sparksim.sim.runner` bounds a run's traces by the drafter (`_bounded_by_drafter`).
    """
    if not profile.drafters:
        return DEFAULT_GAMMA
    table = profile.drafters.get(drafter or profile.default_drafter or "")
    if table is None:
        raise ConfigError(f"drafter {drafter!r} is not in profile {profile.name!r} "
                          f"(its drafters: {sorted(profile.drafters)})")
    block = ((profile.card.get("drafters") or {}).get(table.name) or {}).get("gamma")
    if block is not None:
        return int(block)
    return table.max_positions or DEFAULT_GAMMA


def _drafter_for(profile: Profile, fmt: str, gamma: int, drafter: str | None) -> str | None:
    """The drafter whose cost the exported steps pay (None: plain decoding, γ = 0)."""
    if gamma == 0:
        return None
    if not profile.drafters:
        raise ConfigError(
            f"profile {profile.name!r} has no draft table, but a {fmt} table prices the whole DSpark "
            f"step (drafting γ={gamma} positions, then verifying): use a profile with its drafter's "
            "table, or export plain decoding with --gamma 0")
    if drafter is not None and drafter not in profile.drafters:
        raise ConfigError(f"drafter {drafter!r} is not in profile {profile.name!r} "
                          f"(its drafters: {sorted(profile.drafters)})")
    return drafter or profile.default_drafter


def grid_cells(profile: Profile, fmt: str, gamma: int, batch_sizes: Sequence[int] | None = None
               ) -> list[tuple[int, int]]:
    """The (R, L) steps the engine's profiler times, those whose R·(L+1) tokens the profile reaches.

    sglang and vllm: the diagonal, every request count verifying its whole block (L = γ);
    trtllm: every request count at every L = 1..γ (one engine build per L).
    """
    sizes = tuple(REQUEST_GRID if batch_sizes is None else batch_sizes)
    if not sizes or any(r < 1 for r in sizes) or list(sizes) != sorted(set(sizes)):
        raise ConfigError(f"batch sizes {list(sizes)} must be request counts >= 1, strictly increasing")
    lengths = range(1, gamma + 1) if fmt == "trtllm" else range(gamma, gamma + 1)
    if not lengths:
        raise ConfigError("trtllm's sweep verifies L = 1..γ drafts per request: gamma=0 has no grid")
    cells = [(r, n) for r in sizes for n in lengths if r * (n + 1) <= profile.max_tokens]
    if not cells:
        least = sizes[0] * (lengths[0] + 1)
        raise ConfigError(f"profile {profile.name!r} reaches {profile.max_tokens} tokens, but {fmt}'s grid "
                          f"starts at R={sizes[0]} x (L+1)={lengths[0] + 1} = {least} tokens")
    return cells


def step_price(profile: Profile, requests: int, verified: int, *, gamma: int, drafter: str | None,
               context: int) -> StepPrice:
    """sparksim's price of one decode step, as the engine charges it (`StepCost.price`).

    `requests` requests of `context` KV tokens each, the drafter drafting γ positions (0:
    plain decoding), each request verifying `verified`, with the engine loop's time before
    the step where the profile measured one.
    """
    cost = StepCost.for_step(profile, requests=requests, kv_tokens=requests * context, kv_longest=context,
                             positions=gamma, drafter=drafter,
                             overhead_s=profile.loop_s(gamma > 0, "decode", requests))
    return cost.price(np.full(requests, verified, np.int64))


def export_table(profile: Profile, fmt: str, *, gamma: int, drafter: str | None = None,
                 context: int | None = None, batch_sizes: Sequence[int] | None = None) -> EngineTable:
    """Return the table `fmt`'s engine profiler would make on `profile`, each point priced by sparksim.

    - sglang: the diagonal sweep, B = R·(γ+1), steps/s = 1 / step (context 16, the
      profiler's --input-len); a 1-D `SglangSpsTable`.
    - trtllm: θ(M) = the dense work (and attention compute) at M = bs·(L+1), α(bs) =
      drafting, KV reads at `context` (1024, sparksim's choice: TRT's sweep uses whatever
      its prompts give) and the per-request loop time, fixed = the loop's intercept. This
      splits sparksim's price exactly wherever it is additive in (bs, M); an MLA profile's
      attention compute past the KV read is not, and `export_card` records the gap.
    - vllm: whole steps at B = R·(γ+1) and context 8192 (the start-up profiling context),
      in the vLLM-Ascend file's form (see `VllmCostTables`).
    """
    check_format(fmt)
    if gamma < 0:
        raise ConfigError(f"gamma={gamma} must be >= 0")
    ctx = DEFAULT_CONTEXT[fmt] if context is None else context
    if ctx < 0:
        raise ConfigError(f"context={ctx} must be >= 0 tokens")
    name = _drafter_for(profile, fmt, gamma, drafter)
    prices = {(r, n): step_price(profile, r, n, gamma=gamma, drafter=name, context=ctx)
              for r, n in grid_cells(profile, fmt, gamma, batch_sizes)}
    tokens = tuple(r * (n + 1) for r, n in prices)
    if fmt == "sglang":
        return SglangSpsTable(tokens, tuple(1.0 / p.total_s for p in prices.values()), tokens[-1])
    if fmt == "vllm":
        return VllmCostTables(tokens, tuple(p.total_s * 1e3 for p in prices.values()), (1,), (0.0,), tokens[-1])
    return _decomposed(prices, profile, gamma)


def _decomposed(prices: dict[tuple[int, int], StepPrice], profile: Profile, gamma: int) -> TrtllmSpsTable:
    """Split the priced (bs, L) steps into θ(M) + fixed + α(bs), ms (TRT's decomposed encoding).

    fixed is the engine loop's intercept; α(bs) the terms sparksim prices by request count
    (drafting, KV reads, the drafts overhead, the loop's per-request part); θ(M) the mean of
    what the steps reaching M tokens cost beyond those: exactly the dense work (and linear
    attention compute) when the price is additive. Where it is not (an MLA profile's
    attention compute past its KV read, max(read(bs), flops(M))), θ is raised to its
    running maximum, as sparksim's profile loader cleans a table, and the card records the
    gap to sparksim's price.
    """
    loop_a_ms, _ = profile.loop_table.get(("drafting" if gamma else "plain", "decode"), (0.0, 0.0))
    alpha: dict[int, float] = {}
    rest: dict[int, list[float]] = {}
    for (r, n), p in prices.items():
        alpha.setdefault(r, max((p.draft_s + p.kv_s + p.drafts_s + p.overhead_s) * 1e3 - loop_a_ms, 0.0))
        rest.setdefault(r * (n + 1), []).append(p.total_s * 1e3 - loop_a_ms - alpha[r])
    m, bs = sorted(rest), sorted(alpha)
    theta = np.maximum.accumulate([float(np.mean(rest[t])) for t in m])
    return TrtllmSpsTable(tuple(m), tuple(theta.tolist()), loop_a_ms, tuple(bs), tuple(alpha[r] for r in bs))


def export_card(profile: Profile, table: EngineTable, fmt: str, *, gamma: int, drafter: str | None = None,
                context: int | None = None, batch_sizes: Sequence[int] | None = None,
                command: str = "") -> dict[str, Any]:
    """The sidecar card of an exported table: what priced it, on which grid, after which engine commit.

    `max_rel_gap` is the largest relative gap, over the grid, between the table's own
    lookup and sparksim's price of the same step (0 up to rounding unless a trtllm split
    is inexact).
    """
    ctx = DEFAULT_CONTEXT[fmt] if context is None else context
    name = _drafter_for(profile, fmt, gamma, drafter)
    cells = grid_cells(profile, fmt, gamma, batch_sizes)
    exact = np.array([step_price(profile, r, n, gamma=gamma, drafter=name, context=ctx).total_s for r, n in cells])
    looked = np.array([table.step_s(r, np.array([r * (n + 1)]))[0] for r, n in cells])
    card = profile.card
    return {
        "what": f"a {fmt} engine cost table priced by sparksim from the {profile.source} profile "
                f"{profile.name!r}; not a measurement of {fmt}",
        "source": profile.source,
        "hardware": card.get("hardware"), "model": card.get("model"), "dtype": card.get("dtype"),
        "profile": {"path": str(profile.path or profile.name), "source": profile.source,
                    "command": card.get("command"), "date": card.get("date")},
        "command": command,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "engine": fmt,
        "format": FORMAT_SOURCES[fmt],
        "gamma": gamma, "drafter": name, "context_tokens": ctx,
        "context_note": {"sglang": "the profiler's --input-len 16",
                         "trtllm": "sparksim's choice: TensorRT-LLM's sweep uses whatever its prompts give",
                         "vllm": "VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN's default"}[fmt],
        "grid": {"requests": sorted({r for r, _ in cells}), "verified": sorted({n for _, n in cells}),
                 "batch_tokens": sorted({r * (n + 1) for r, n in cells})},
        "max_rel_gap": float(np.max(np.abs(looked - exact) / exact)),
    }


# --------------------------------------------------------------------------- import


def _profile_tables(table: EngineTable) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, str]]:
    """verify.csv, the extra files and what each holds, so the profile's price at a probe is the table's.

    The token term goes in verify.csv at the table's own probes (a probe below 1 token is no
    batch and is dropped); a term by request count (SGLang's α, TensorRT-LLM's batch
    overhead) goes in attention.csv, by request count and constant in KV tokens: the table
    was measured at one context, so it prices none. Between probes the profile pads up to
    the next one, as a CUDA-graph engine runs a batch (`sparksim.cost.profile`); an engine's
    planner may read the same table otherwise there (SGLang's 1-D floor, TensorRT-LLM's
    and SGLang-additive's linear interpolation).
    """
    # costs go as text, the table's own digits: write_profile's %.9g would move them by up to 5e-9
    def by_requests(requests: Sequence[int], ms: Sequence[float]) -> pd.DataFrame:
        return pd.DataFrame([(r, kv, repr(float(v))) for r, v in zip(requests, ms, strict=True) for kv in (0, KV_SPAN)],
                            columns=["requests", "kv_tokens", "attn_ms"])

    def verify(tokens: Sequence[int], ms: Sequence[float]) -> pd.DataFrame:
        keep = [(t, repr(float(v))) for t, v in zip(tokens, ms, strict=True) if t >= 1]
        return pd.DataFrame(keep, columns=["tokens", "step_ms"])

    if isinstance(table, SglangSpsTable):
        return (verify(table.batch_tokens, [1e3 / s for s in table.steps_per_sec]), {},
                {"verify.csv": "1000 / sample_steps_per_sec at sample_batch_tokens"})
    if isinstance(table, SglangAdditiveTable):
        lo = min(table.alpha_s)  # α may be negative; attention.csv may not
        return (verify(table.m_probes, [(table.bias_s + lo + t) * 1e3 for t in table.theta_s]),
                {"attention.csv": by_requests(table.bs_probes, [(a - lo) * 1e3 for a in table.alpha_s])},
                {"verify.csv": "(bias + min α + θ(m)) x 1000 at m_probes >= 1",
                 "attention.csv": "(α(bs) - min α) x 1000 by bs_probes, the same at every KV size"})
    if isinstance(table, TrtllmSpsTable):
        extra = {"attention.csv": by_requests(table.batch_sizes, table.batch_overhead_ms)} if table.batch_sizes else {}
        return (verify(table.token_counts, [t + table.fixed_overhead_ms for t in table.step_time_ms]), extra,
                {"verify.csv": "step_time_ms + fixed_overhead_ms at token_counts >= 1",
                 **({"attention.csv": "batch_overhead_ms by batch_sizes, the same at every KV size"} if extra else {})})
    if isinstance(table, VllmCostTables):
        ms = np.maximum(np.maximum.accumulate(np.asarray(table.verify_ms, np.float64)), 1e-6)
        return (verify(table.verify_tokens, ms.tolist()), {},
                {"verify.csv": "latency_ms at its token counts (whole steps)"})
    raise ConfigError(f"a {table.engine} table has no file to import")


def _read_sidecar(path: Path) -> dict[str, Any]:
    """The export card beside `path`, if any (an empty dict when there is none)."""
    card_path = sidecar_path(path)
    if not card_path.is_file():
        return {}
    try:
        card = yaml.safe_load(card_path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FormatError(card_path, [f"cannot be read as YAML ({exc})"]) from None
    if not isinstance(card, dict):
        raise FormatError(card_path, ["must be a mapping of fields"])
    return card


def import_table(path: Path | str, fmt: str, out: Path | str, *, gamma: int, model: str | None = None,
                 hardware: str | None = None) -> Path:
    """Write a sparksim profile (source: imported) whose price at the table's probes is the table's.

    The engine's step time includes drafting, so the profile's drafter (`engine-step`, a
    block drafter of block γ) costs nothing: a DSpark run on it drafts its γ positions and
    pays only the table. No KV cost beyond the table's own profiling context, no prefill
    table (prompt chunks are priced by verify.csv) and no engine loop: only what the table
    holds. Model and hardware come from the options, else from the export card beside the
    file (`<file>.card.yaml`). Returns the profile folder.
    """
    path, out = Path(path), Path(out)
    table = read_table(path, fmt)
    if gamma < 0:
        raise ConfigError(f"gamma={gamma} must be >= 0")
    if table.is_flat:
        raise ConfigError(f"{path}: the {fmt} table is flat (one cost whatever the tokens): the engine's "
                          "no-table placeholder holds no measurement to import")
    side = _read_sidecar(path)
    model = model or side.get("model")
    hardware = hardware or side.get("hardware")
    missing = [flag for flag, value in (("--model", model), ("--hardware", hardware)) if not value]
    if missing:
        raise ConfigError(f"{' and '.join(missing)} needed: {path} has no export card "
                          f"({sidecar_path(path).name}) that names them")
    verify, extra, terms = _profile_tables(table)
    drafters: dict[str, Any] = {}
    if gamma:
        extra[f"draft-{IMPORTED_DRAFTER}.csv"] = pd.DataFrame(
            {"positions": [gamma, gamma], "requests": [1, DRAFT_SPAN], "draft_ms": [0.0, 0.0]})
        drafters = {"drafters": {IMPORTED_DRAFTER: {
            "file": f"draft-{IMPORTED_DRAFTER}.csv", "kind": "block", "gamma": gamma,
            "source": f"zero: the {fmt} table's step times include drafting"}},
            "default_drafter": IMPORTED_DRAFTER}
    command = shlex.join(["sparksim", "profile", "import", str(path), "--format", fmt, "--out", str(out),
                          "--gamma", str(gamma), *(["--model", model] if model else []),
                          *(["--hardware", hardware] if hardware else [])])
    card = {
        "source": "imported",
        "hardware": str(hardware), "model": str(model), "dtype": str(side.get("dtype") or "unknown"),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "engine": f"{fmt}'s cost table, imported: its step times at its probes; between probes this "
                  "profile pads up to the next probe",
        "imported_from": {"engine": fmt, "file": str(path),
                          "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                          "format_commit": FORMAT_SOURCES[fmt],
                          "sidecar_card": {"path": str(sidecar_path(path)), **{
                              k: side[k] for k in SIDECAR_KEPT if k in side}} if side else None},
        "imported_terms": terms,
        **drafters,
        "caveats": "An engine table, not a sparksim profile: no KV cost past its profiling context, prompt "
                   "chunks priced as verify tokens, the drafter's cost inside every step.",
    }
    return write_profile(out, verify, card, extra=extra)
