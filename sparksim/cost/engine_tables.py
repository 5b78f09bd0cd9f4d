"""Engine cost tables: the step-cost tables DSpark engines' planners read, as sparksim holds them.

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

Each table lists what breaks its engine's format or is not a cost curve (`problems`:
lengths that pair up, probes rising, costs in range and not falling). Their files are `sparksim.cost.engine_table_files`;
pricing an engine's grid with sparksim's price and importing a table as a profile is
`sparksim.cost.engine_table_convert`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

MONOTONE_RTOL = 1e-9  # a cost may fall by rounding, not more


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
