"""SPS profiles: how long one engine step takes for its tokens, its requests and their KV.

A profile folder holds `verify.csv` (the dense step cost by token count), `attention.csv`
(the cost of reading the batch's KV cache, by total KV tokens and optionally request count),
`prefill.csv` (optional: a prompt-only step's dense cost), one draft table per drafter the
card lists (by request count and drafted positions) and `card.yaml` (how it was made, the
drafters, the memory figures that size the KV cache). docs/profiles.md has the format;
`sparksim.cost.profile_files` reads and writes it, `sparksim.cost.card` types the card.
The dense lookup follows what a CUDA-graph engine does: in `step` mode a batch pads up
to the next profiled size (a batch of 121 tokens runs the 128-token graph), in `linear`
mode it interpolates; past the last profiled size both extrapolate the last slope, once
with a warning, or raise under `strict`.
"""

from __future__ import annotations

import bisect
import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sparksim.cost.card import CARD_REQUIRED, CostCard, check_card, read_card
from sparksim.cost.legacy_grid import context_weight
from sparksim.cost.profile_files import (
    DraftTable,
    ProfileWarning,
    check_profile,
    read_tables,
    write_profile,
)
from sparksim.errors import FormatError, RangeError
from sparksim.hardware import GPU_MEMORY_UTILIZATION

# the profile's public names, importable from here whichever sibling module defines them
__all__ = [
    "CARD_REQUIRED", "DraftTable", "KvModel", "LookupMode", "Profile", "ProfileWarning", "check_card",
    "check_profile", "context_weight", "load_profile", "read_card", "token_weight", "write_profile",
]

LookupMode = Literal["step", "linear"]
KvModel = Literal["per-request", "converted-grid", "none"]


@dataclass
class Profile:
    """A step's cost as a real engine pays it: dense work by tokens, KV by requests and context.

    A step with T new tokens (verified drafts, bonus slots and prompt chunks), R decode
    requests holding K tokens of KV cache in all, and prompt chunks (q tokens after a
    prefix of p) costs

        dense(T) + attention(R, K) + Σ_chunks prefill_attention(q, p) + draft(R, positions)

    `step_ms` (verify.csv) is the dense part: a step of T tokens with no KV to read
    (weights, linear layers, LM head, launch overheads, the CUDA-graph staircase).
    `attention.csv` prices reading K KV tokens (by request count when it has a `requests`
    column); `prefill.csv`, when present, prices a step that carries only prompt tokens (an
    engine's prefill iteration runs other kernels than a decode step); the card's
    `cost_model.prefill_attention_ms_per_token_sq` prices a chunk's causal attention
    against its prefix, coef · ((p + q)² − p²).

    `card` is the card as read (provenance included); `spec` holds the keys sparksim reads,
    typed and range-checked (`sparksim.cost.card`): `load_profile` parses it from the card,
    a profile built by hand passes its own. A legacy context grid was converted to these
    tables on load (`kv_conversion` says how; `sparksim.cost.legacy_grid`).
    """

    name: str
    card: dict[str, Any]
    tokens: NDArray[np.float64]  # (T,) profiled batch sizes in tokens, increasing
    step_ms: NDArray[np.float64]  # (T,) dense cost, non-decreasing in tokens after clean-up
    drafters: dict[str, DraftTable] = field(default_factory=dict)
    default_drafter: str | None = None
    attn_requests: NDArray[np.float64] = field(default_factory=lambda: np.empty(0))  # (A,) or empty
    attn_kv_tokens: NDArray[np.float64] = field(default_factory=lambda: np.empty(0))  # (K,)
    attn_ms: NDArray[np.float64] = field(default_factory=lambda: np.empty((0, 0)))  # (A or 1, K)
    prefill_tokens: NDArray[np.float64] = field(default_factory=lambda: np.empty(0))  # (P,)
    prefill_ms: NDArray[np.float64] = field(default_factory=lambda: np.empty(0))  # (P,)
    mode: LookupMode = "step"
    strict: bool = False
    path: Path | None = None
    spec: CostCard = field(default_factory=CostCard)
    kv_conversion: str | None = None  # how a legacy context grid became these tables
    _warned: set[str] = field(default_factory=set, repr=False)
    _draft_cache: dict[tuple[str, int, int], float] = field(default_factory=dict, repr=False)
    _scalar: tuple[list[float], list[float], float] | None = field(default=None, repr=False)
    _dense_memo: dict[float, float] = field(default_factory=dict, repr=False)  # verify_s_scalar's
    _dense_table: NDArray[np.float64] = field(default_factory=lambda: np.empty(0), repr=False)  # verify_s's
    _attn_lists: tuple[list[float], list[list[float]], list[float]] | None = field(default=None, repr=False)
    # attention_s's rows and weight for a request count: (w, row below, row above)
    _attn_rows: dict[float, tuple[float, list[float], list[float]]] = field(default_factory=dict, repr=False)
    _prefill_lists: tuple[list[float], list[float]] | None = field(default=None, repr=False)

    @property
    def source(self) -> str:
        return str(self.card.get("source", "unknown"))

    @property
    def kv_model(self) -> KvModel:
        """How KV traffic is priced: an attention table (made from a legacy grid or not), or not at all."""
        if not self.attn_kv_tokens.size:
            return "none"
        return "per-request" if self.kv_conversion is None else "converted-grid"

    @property
    def max_tokens(self) -> int:
        """The largest profiled batch, in tokens."""
        return int(self.tokens[-1])

    # The card's figures, read once (the engine asks some of them every step).

    @functools.cached_property
    def prefill_attention_coef_ms(self) -> float:
        """ms per token² of causal prefill attention (0 if the card has none)."""
        return self.spec.cost_model.prefill_attention_ms_per_token_sq

    @functools.cached_property
    def attention_compute_coef_ms(self) -> float:
        """ms per (query token × KV token) of decode attention (0: none).

        A step's attention costs max(the KV read, this × Σ queries × context); 0 keeps it
        memory-bound, as GQA models are.
        """
        return self.spec.cost_model.attention_ms_per_query_kv_token

    @functools.cached_property
    def attention_kv_padded(self) -> bool:
        """True when attention runs over the batch padded to its longest context (and longest
        verified block): a step pays for R × the longest context where a paged-attention
        engine pays for the sum (the live engine's batched attention)."""
        return self.spec.cost_model.attention_kv == "padded"

    @functools.cached_property
    def attention_compute_adds(self) -> bool:
        """True when the attention FLOPs add to attention.csv instead of overlapping it (a CPU
        engine pays both, one after the other; a GPU overlaps memory and compute)."""
        return self.spec.cost_model.attention_compute == "sum"

    @functools.cached_property
    def decision_table(self) -> dict[str, tuple[float, float]]:
        """Per policy name, (a ms, b ms per request) of its decision step (`cost_model.decision_ms`).

        Measured by `sparksim profile live`: what the engine spends on the critical path asking a
        policy for ℓ (building its batch, reading the cost model, `decide`, checking the answer).
        """
        table = self.spec.cost_model.decision_ms or {}
        return {name: (v.a_ms, v.b_ms_per_request) for name, v in table.items()}

    def decision_s(self, policy: str, requests: int) -> float:
        """Seconds a step spends deciding for `requests` requests under `policy` (0 if not profiled)."""
        a, b = self.decision_table.get(policy, (0.0, 0.0))
        return (a + b * requests) / 1e3

    @functools.cached_property
    def verify_drafts_ms(self) -> tuple[float, float]:
        """(a ms, b ms per request) a step pays once it verifies any draft (`cost_model.verify_drafts_ms`).

        Exact rejection sampling (the drafter's probabilities gathered, the residual built and
        sampled) and the drafts scattered into the target's input: measured by `sparksim profile
        live` as the jump between plain-decoding and drafting points. (0, 0) when not profiled.
        """
        v = self.spec.cost_model.verify_drafts_ms
        return (0.0, 0.0) if v is None else (v.a_ms, v.b_ms_per_request)

    def verify_drafts_s(self, requests: int) -> float:
        """Seconds a step of `requests` requests adds once it verifies any draft."""
        a, b = self.verify_drafts_ms
        return (a + b * requests) / 1e3 if requests else 0.0

    @functools.cached_property
    def loop_table(self) -> dict[tuple[str, str], tuple[float, float]]:
        """(mode, kind) -> (a ms, b ms per running request) of the engine loop's time before a step.

        `cost_model.loop_ms.{plain|drafting}.{decode|prefill}`, measured by `sparksim profile
        live` from the idle gaps between a live session's steps: finishing requests, making the
        next ones, forming the batch, bookkeeping — the engine's own time outside its step
        functions. Empty for an engine whose host work overlaps its steps (a GPU's).
        """
        table = self.spec.cost_model.loop_ms or {}
        return {(mode, kind): (v.a_ms, v.b_ms_per_request) for mode, kinds in table.items()
                for kind, v in kinds.items()}

    def loop_s(self, drafting: bool, kind: str, requests: int) -> float:
        """Seconds the engine loop spends before a `kind` (decode or prefill) step with `requests` running."""
        a, b = self.loop_table.get(("drafting" if drafting else "plain", kind), (0.0, 0.0))
        return (a + b * requests) / 1e3

    @functools.cached_property
    def captured_sizes(self) -> tuple[int, ...]:
        """CUDA-graph capture sizes from the card, if it lists them."""
        return tuple(sorted(self.spec.graph_capture_sizes or ()))

    @functools.cached_property
    def step_limit(self) -> float:
        """Largest batch that pads up in `step` mode: the largest CUDA-graph size if the card
        lists them (beyond it the engine runs eagerly and cost interpolates); 0 if it lists
        none (`graph_capture_sizes: []`: an eager engine, as `sparksim profile` without graphs
        and the live CPU engine run, pads no batch); no limit if the card does not say."""
        if self.spec.graph_capture_sizes is None:
            return float("inf")
        sizes = self.captured_sizes
        return float(sizes[-1]) if sizes else 0.0

    @functools.cached_property
    def gpus_per_replica(self) -> int:
        """GPUs one replica of this profile occupies (the card's `gpus_per_replica`, else 1)."""
        return self.spec.gpus_per_replica or 1

    # ------------------------------------------------------------------ dense (verify.csv)

    def verify_s(self, tokens: ArrayLike) -> NDArray[np.float64]:
        """Return the dense step time in seconds for each batch size in `tokens` (shape kept).

        The step without its KV reads (add `attention_s`).
        """
        if isinstance(tokens, np.ndarray) and tokens.dtype.kind in "iu" and tokens.size:
            dense = self._dense_upto(int(tokens.min()), int(tokens.max()))
            if dense is not None:
                return dense[tokens]
        t = np.asarray(tokens, dtype=np.float64)
        if t.size and float(t.max()) > self.tokens[-1]:
            self._extrapolated("tokens", float(t.max()), float(self.tokens[-1]))
        out = _lookup_1d(self.tokens, self.step_ms[None, :], t.ravel(), self.mode, self.step_limit)[0]
        return (out / 1e3).reshape(t.shape)

    def _dense_upto(self, low: int, high: int) -> NDArray[np.float64] | None:
        """`verify_s` at every whole batch size 0..N-1 (N > high), or None where that would leave
        the profiled range (extrapolation warns, so it is asked for, never tabulated).

        The lookup is elementwise, so the table holds the floats a call at those sizes gives;
        the path policies' prices (a few thousand consecutive sizes a step) read it instead of
        redoing the lookup. Grown by doubling within the profiled sizes, to 2^20 sizes.
        """
        if low < 0 or high > self.tokens[-1] or high >= 1 << 20:  # (a table of 8 MB at most)
            return None
        table = self._dense_table
        if high >= table.size:
            size = min(max(2 * table.size, 1024, high + 1), int(self.tokens[-1]) + 1, 1 << 20)
            t = np.arange(size, dtype=np.float64)
            out = _lookup_1d(self.tokens, self.step_ms[None, :], t, self.mode, self.step_limit)[0]
            table = self._dense_table = out / 1e3
        return table

    def verify_s_scalar(self, tokens: float) -> float:
        """Return `verify_s` for one batch size: the engine's per-step fast path (no arrays).

        The same rule (`token_weight`) on Python lists; a test holds the two paths equal on
        random profiles. Each batch size inside the table is worked out once and remembered
        (a run asks the same few sizes every step).
        """
        seconds = self._dense_memo.get(tokens)
        if seconds is not None:
            return seconds
        cols, ms, limit = self._scalar_tables()
        if tokens > cols[-1]:
            return float(self.verify_s(tokens))  # extrapolates, and warns once (never remembered)
        j, w = token_weight(cols, tokens, limit)
        if len(cols) == 1:
            seconds = ms[0] * (1.0 + w) / 1e3
        else:
            seconds = ((1.0 - w) * ms[j] + w * ms[j + 1]) / 1e3
        if len(self._dense_memo) < 1 << 16:
            self._dense_memo[tokens] = seconds
        return seconds

    def _scalar_tables(self) -> tuple[list[float], list[float], float]:
        """Python-list copies of the dense table for scalar lookups: (tokens, ms, step limit).

        The step limit is -inf in `linear` mode so a single comparison picks the branch.
        """
        if self._scalar is None:
            limit = self.step_limit if self.mode == "step" else -math.inf
            self._scalar = (self.tokens.tolist(), self.step_ms.tolist(), limit)
        return self._scalar

    # ------------------------------------------------------------------ KV and prefill

    def attention_s(self, requests: float, kv_tokens: float) -> float:
        """Return the time in seconds to read `kv_tokens` of KV cache for `requests` requests.

        Linear in KV tokens between rows (a memory-bound kernel), extrapolating the last
        slope with one warning; linear in requests between rows, clamped at the ends.
        0 for a profile without an attention table.
        The engine asks once per step, so this reads Python lists, not arrays.
        """
        kv, rows, req = self._attention_lists()
        if not kv or requests <= 0:
            return 0.0
        if kv_tokens > kv[-1]:
            self._extrapolated("kv_tokens", kv_tokens, kv[-1])
        if len(rows) == 1:
            return _interp_extrapolate(kv, rows[0], kv_tokens) / 1e3
        pair = self._attn_rows.get(requests)  # R changes only when a request joins or leaves
        if pair is None:
            i = min(max(bisect.bisect_right(req, requests) - 1, 0), len(req) - 2)
            w = min(max((requests - req[i]) / (req[i + 1] - req[i]), 0.0), 1.0)
            pair = (w, rows[i], rows[i + 1])
            if len(self._attn_rows) < 1 << 16:
                self._attn_rows[requests] = pair
        w, below, above = pair
        lo, hi = _interp_pair(kv, below, above, kv_tokens)
        return ((1.0 - w) * lo + w * hi) / 1e3

    def _attention_lists(self) -> tuple[list[float], list[list[float]], list[float]]:
        """Python-list copies of the attention table: (KV tokens, rows of ms, request counts)."""
        if self._attn_lists is None:
            self._attn_lists = (self.attn_kv_tokens.tolist(), self.attn_ms.tolist(),
                                self.attn_requests.tolist())
        return self._attn_lists

    @property
    def has_prefill_table(self) -> bool:
        return self.prefill_tokens.size > 0

    def prefill_dense_s(self, tokens: float) -> float:
        """Return the dense time in seconds of a step that carries only `tokens` prompt tokens.

        From prefill.csv (linear: prefill steps run eagerly, no graph staircase) when the
        profile has one, else from the dense verify table. Below its first row, the first
        row's cost, as the verify table's: a step reads the weights whatever its tokens.
        """
        if not self.has_prefill_table:
            return self.verify_s_scalar(tokens)
        if tokens > self.prefill_tokens[-1]:
            self._extrapolated("prefill tokens", tokens, float(self.prefill_tokens[-1]))
        if self._prefill_lists is None:
            self._prefill_lists = (self.prefill_tokens.tolist(), self.prefill_ms.tolist())
        x, ms = self._prefill_lists
        return (ms[0] if tokens < x[0] else _interp_extrapolate(x, ms, tokens)) / 1e3

    def prefill_attention_s(self, chunk: float, prefix: float) -> float:
        """Return the causal attention time in seconds of a `chunk`-token prompt piece after `prefix`."""
        return self.prefill_attention_coef_ms * ((prefix + chunk) ** 2 - prefix**2) / 1e3

    def chunks_attention_s(self, chunks: Sequence[tuple[float, float]], start: float = 0.0) -> float:
        """Return `start` plus the attention time in seconds of a step's prompt `chunks`, (tokens,
        prefix) each: each piece's own causal attention, added one by one; where attention is
        padded (`attention_kv_padded`: the live engine's dense-mask attention over the batch),
        every piece pays the longest one's queries against the longest context.
        """
        if self.attention_kv_padded and len(chunks) > 1:
            take = max(t for t, _ in chunks)
            context = max(t + p for t, p in chunks)
            return start + len(chunks) * self.prefill_attention_s(take, context - take)
        for take, prefix in chunks:
            start += self.prefill_attention_s(take, prefix)
        return start

    def prefill_s(self, prompt_lengths: ArrayLike) -> float:
        """Return the time in seconds of one prefill-only step over whole prompts (a prefill pool)."""
        if isinstance(prompt_lengths, list) and all(type(t) is int for t in prompt_lengths):
            # a pool's batch, once per batch: whole numbers sum exactly in any order (below 2^53),
            # so Python's sums are numpy's float sums, without the arrays
            tokens, squares = float(sum(prompt_lengths)), float(sum(t * t for t in prompt_lengths))
        else:
            p = np.asarray(prompt_lengths, np.float64)
            tokens, squares = float(p.sum()), float((p**2).sum())
        if self.attention_kv_padded:  # every prompt pays the longest one's: the chunks' one rule
            whole = [(float(t), 0.0) for t in np.asarray(prompt_lengths, np.float64).tolist()]
            return self.prefill_dense_s(tokens) + self.chunks_attention_s(whole)
        return self.prefill_dense_s(tokens) + self.prefill_attention_coef_ms * squares / 1e3

    # ------------------------------------------------------------------ drafting

    def drafter(self, name: str | None = None) -> DraftTable | None:
        """Return the named drafter's table, the default one for None, or None if there is none."""
        key = name or self.default_drafter
        if key is None:
            return None
        if key not in self.drafters:
            raise RangeError(
                f"profile {self.name!r} has no drafter {key!r} (it has {sorted(self.drafters) or 'none'})"
            )
        return self.drafters[key]

    def draft_s(self, requests: ArrayLike, positions: int | None = None,
                drafter: str | None = None) -> NDArray[np.float64]:
        """Return the drafter's time in seconds for `requests` requests drafting `positions` each.

        `positions=None` drafts the table's full block (its last positions row). A full-block
        table (no positions column) costs the same whatever is drafted; 0 positions or 0
        requests cost nothing; no drafter at all costs nothing.
        """
        r = np.asarray(requests, dtype=np.float64)
        table = self.drafter(drafter) if self.drafters else None
        if table is None or positions == 0:
            return np.zeros_like(r)
        grid = table.ms
        if table.by_positions and positions is not None:
            grid = self._positions_row(table, float(positions))
        elif table.by_positions:
            grid = table.ms[-1:]
        out = _lookup_1d(table.requests, grid, r.ravel(), self.mode)[0]
        if r.size and float(r.max()) > table.requests[-1]:
            self._extrapolated("draft requests", float(r.max()), float(table.requests[-1]))
        out = np.where(r.ravel() <= 0, 0.0, out)
        return (out / 1e3).reshape(r.shape)

    def draft_s_scalar(self, requests: int, positions: int | None = None,
                       drafter: str | None = None) -> float:
        """Return `draft_s` for one (requests, positions) pair (the engine's per-step fast path)."""
        if requests <= 0 or not self.drafters or positions == 0:
            return 0.0
        key = (drafter or "", int(requests), -1 if positions is None else int(positions))
        cached = self._draft_cache.get(key)
        if cached is None:
            cached = float(self.draft_s(int(requests), positions, drafter))
            self._draft_cache[key] = cached
        return cached

    def draft_step_s(self, requests: int, positions: int, drafter: str | None, kv_tokens: float
                     ) -> float:
        """Return one drafting step's seconds: the table at (requests, positions) plus its KV reads."""
        if requests <= 0 or not self.drafters or positions == 0:
            return 0.0
        table = self.drafter(drafter)
        assert table is not None
        base = self.draft_s_scalar(requests, positions, drafter)
        return base + table.kv_ms(positions, kv_tokens) / 1e3 if table.kv_ms_per_token else base

    def _positions_row(self, table: DraftTable, positions: float) -> NDArray[np.float64]:
        pos = table.positions
        if positions > pos[-1]:
            msg = (f"profile {self.name!r}: drafter {table.name!r} is profiled up to {pos[-1]:g} "
                   f"positions; {positions:g} asked, extrapolating the last slope")
            if self.strict:
                raise RangeError(msg + " (an error under --strict)")
            if f"positions:{table.name}" not in self._warned:
                self._warned.add(f"positions:{table.name}")
                warnings.warn(msg, ProfileWarning, stacklevel=4)
        if pos.size == 1:
            return table.ms[:1] * (positions / pos[0])
        i = min(max(int(np.searchsorted(pos, positions, side="right")) - 1, 0), pos.size - 2)
        w = (positions - pos[i]) / (pos[i + 1] - pos[i])
        if positions < pos[0]:  # below the first row: scale towards 0 cost at 0 positions
            return table.ms[:1] * (positions / pos[0])
        return (1.0 - w) * table.ms[i : i + 1] + w * table.ms[i + 1 : i + 2]

    # ------------------------------------------------------------------ memory

    def kv_capacity_tokens(self, utilisation: float = GPU_MEMORY_UTILIZATION) -> int | None:
        """Return the KV tokens one replica holds, from the card's memory figures (None: unknown).

        (hbm_bytes × utilisation − weights_bytes − activation_reserve_bytes) / kv_bytes_per_token,
        all per replica (every GPU of it). Raises FormatError when the figures cannot hold
        the weights.
        """
        mem = self.spec.memory
        if mem is None:
            return None
        free = utilisation * mem.hbm_bytes - mem.weights_bytes - mem.activation_reserve_bytes
        if free <= 0:
            raise FormatError(self.path or Path(self.name), [
                f"card.yaml: memory.hbm_bytes={mem.hbm_bytes} x utilisation {utilisation} cannot hold "
                f"memory.weights_bytes={mem.weights_bytes} + memory.activation_reserve_bytes="
                f"{mem.activation_reserve_bytes}"])
        return int(free // mem.kv_bytes_per_token)

    def _extrapolated(self, what: str, value: float, last: float) -> None:
        msg = (
            f"profile {self.name!r}: {what}={value:g} is past the last profiled {what} "
            f"({last:g}); extrapolating the last slope linearly"
        )
        if self.strict:
            raise RangeError(msg + " (an error under --strict)")
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(msg, ProfileWarning, stacklevel=3)


def load_profile(path: Path | str, *, mode: LookupMode = "step", strict: bool = False) -> Profile:
    """Load and validate the profile folder at `path`; raise FormatError listing every problem."""
    path = Path(path)
    problems: list[str] = []
    tables = read_tables(path, problems)
    if problems or tables is None:
        raise FormatError(path, problems or ["unreadable profile"])
    return Profile(
        name=path.name, card=tables.card, tokens=tables.tokens, step_ms=tables.step_ms,
        drafters=tables.drafters, default_drafter=tables.default_drafter,
        attn_requests=tables.attn_requests, attn_kv_tokens=tables.attn_kv_tokens, attn_ms=tables.attn_ms,
        prefill_tokens=tables.prefill_tokens, prefill_ms=tables.prefill_ms, mode=mode, strict=strict,
        path=path, spec=tables.spec, kv_conversion=tables.kv_conversion,
    )


def _interp_extrapolate(x: Sequence[float], y: Sequence[float], at: float) -> float:
    """Interpolate y(x) linearly at `at`: from (0, 0) below x[0], the last slope past x[-1].

    Plain Python on lists (or arrays): the engine asks it every step.
    """
    return _interp_rows(x, (y,), at)[0]


def _interp_pair(x: Sequence[float], y0: Sequence[float], y1: Sequence[float], at: float) -> tuple[float, float]:
    """`_interp_extrapolate` of two rows over the same x at once (one search; the engine asks
    every step for the KV read between two request rows)."""
    lo, hi = _interp_rows(x, (y0, y1), at)
    return lo, hi


def _interp_rows(x: Sequence[float], ys: Sequence[Sequence[float]], at: float) -> list[float]:
    """The one interpolation rule, for each row of `ys` over the same `x` (one search)."""
    if at <= x[0]:
        return [float(y[0] * at / x[0]) if x[0] > 0 else float(y[0]) for y in ys]
    if at >= x[-1]:
        if len(x) == 1:
            return [float(y[0] * at / x[0]) for y in ys]
        off, dx = at - x[-1], x[-1] - x[-2]
        return [float(y[-1] + off * (y[-1] - y[-2]) / dx) for y in ys]
    j = bisect.bisect_right(x, at) - 1
    off, dx = at - x[j], x[j + 1] - x[j]
    return [float((y[j + 1] - y[j]) / dx * off + y[j]) for y in ys]


def token_weight(tokens: Any, t: Any, step_limit: float = math.inf) -> tuple[Any, Any]:
    """Return (j, w): the dense cost at `t` batch tokens is (1 − w)·col[j] + w·col[j + 1].

    The one rule in batch tokens, for scalars (Python lists) and arrays alike: up to
    `step_limit` (the largest CUDA graph) a batch pads up to the next profiled size (w is
    0 or 1); past it, cost interpolates between sizes (an eager step, as vLLM runs it);
    past the last size, the last segment's slope extrapolates (w > 1); below the first,
    the first size's cost. A one-column table has no segment: its cost is col[0]·(1 + w),
    constant up to its size and proportional past it.
    """
    if isinstance(tokens, list):
        last = len(tokens) - 1
        if last == 0:
            return 0, max(t / tokens[0] - 1.0, 0.0)
        hi = min(max(bisect.bisect_left(tokens, t), 1), last)
        if t > tokens[-1]:
            return last - 1, (t - tokens[-2]) / (tokens[-1] - tokens[-2])
        if t <= step_limit:
            return hi - 1, float(t > tokens[0])
        return hi - 1, min(max((t - tokens[hi - 1]) / (tokens[hi] - tokens[hi - 1]), 0.0), 1.0)
    last = tokens.size - 1
    if last == 0:
        return np.zeros(t.shape, np.intp), np.maximum(t / tokens[0] - 1.0, 0.0)
    hi = np.clip(np.searchsorted(tokens, t, side="left"), 1, last)
    lo = hi - 1
    w = np.clip((t - tokens[lo]) / (tokens[hi] - tokens[lo]), 0.0, 1.0)
    w = np.where(t <= step_limit, (t > tokens[0]).astype(np.float64), w)
    beyond = (t - tokens[-2]) / (tokens[-1] - tokens[-2])
    past = t > tokens[-1]
    return np.where(past, last - 1, lo), np.where(past, beyond, w)


def _lookup_1d(
    x: NDArray[np.float64], grid: NDArray[np.float64], t: NDArray[np.float64], mode: LookupMode,
    step_limit: float = np.inf,
) -> NDArray[np.float64]:
    """Look up every row of `grid` (C, T) at points `t` (N,); return (C, N) (`token_weight`'s rule).

    `step` pads up to the next profiled point within `step_limit`; `linear` interpolates.
    """
    j, w = token_weight(x, t, step_limit if mode == "step" else -np.inf)
    if x.size == 1:
        return grid[:, :1] * (1.0 + w)[None, :]
    return (1.0 - w) * grid[:, j] + w * grid[:, j + 1]
