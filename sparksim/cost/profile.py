"""SPS profiles: how long one engine step takes for its tokens, its requests and their KV.

A profile folder holds `verify.csv` (the dense step cost by token count), `attention.csv`
(the cost of reading the batch's KV cache, by total KV tokens and optionally request count),
`prefill.csv` (optional: a prompt-only step's dense cost), one draft table per drafter the
card lists (by request count and drafted positions) and `card.yaml` (how it was made, the
drafters, the memory figures that size the KV cache). docs/profiles.md has the format.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import yaml
from numpy.typing import ArrayLike, NDArray

from sparksim.atomic import atomic_dir
from sparksim.errors import FormatError, RangeError
from sparksim.hardware import GPU_MEMORY_UTILIZATION

LookupMode = Literal["step", "linear"]
KvModel = Literal["per-request", "legacy-grid", "none"]
SOURCES = ("measured", "analytic", "calibrated", "published", "synthetic", "imported")
CARD_REQUIRED = ("source", "hardware", "model", "dtype", "date", "command")
VERIFY_REQUIRED = ("tokens", "step_ms")
VERIFY_OPTIONAL = ("context", "p10_ms", "p90_ms", "min_ms", "max_ms")
DRAFT_REQUIRED = ("requests", "draft_ms")
DRAFT_OPTIONAL = ("positions", "min_ms", "max_ms")
ATTENTION_REQUIRED = ("kv_tokens", "attn_ms")
ATTENTION_OPTIONAL = ("requests", "min_ms", "max_ms")
PREFILL_REQUIRED = ("tokens", "prefill_ms")
PREFILL_OPTIONAL = ("min_ms", "max_ms")
DRAFTER_KINDS = ("mtp", "block", "autoregressive")
MEMORY_FIELDS = ("hbm_bytes", "weights_bytes", "kv_bytes_per_token", "activation_reserve_bytes")
MAX_PROFILE_ROWS = 1_000_000  # a profile is a small table; more rows than this is a broken file


class ProfileWarning(UserWarning):
    """A profile was cleaned up or extrapolated; results may be less trustworthy."""


@dataclass
class DraftTable:
    """One drafter's time by request count and drafted positions per request.

    `ms` is a (P, D) grid: row p holds the cost of drafting `positions[p]` positions for
    every request count in `requests`. A table without a positions column (the older
    two-column `draft.csv`) has `positions` empty and one row: it always drafts its full
    block, whatever a policy verifies.
    """

    name: str
    requests: NDArray[np.float64]  # (D,) profiled request counts, increasing
    positions: NDArray[np.float64]  # (P,) profiled drafted positions, increasing; empty: full block
    ms: NDArray[np.float64]  # (P, D) drafting time in ms, or (1, D) for a full-block table
    kind: str = "block"  # mtp | block | autoregressive (as the card describes it)
    layers: int | None = None
    kv_ms_per_token: float = 0.0  # reading its KV cache, per context token (0: in the table)
    info: dict[str, Any] = field(default_factory=dict)  # the card's description, verbatim

    def kv_ms(self, positions: int, kv_tokens: float) -> float:
        """Return ms to read its KV cache over `kv_tokens` context tokens for one drafting step.

        A block drafter reads it once per step; a pass-based one (mtp, autoregressive) once
        per drafted position.
        """
        passes = 1 if self.kind == "block" else positions
        return self.kv_ms_per_token * kv_tokens * passes

    @classmethod
    def full_block(cls, name: str, requests: ArrayLike, draft_ms: ArrayLike) -> DraftTable:
        """Return a table that drafts its full block at every request count (two-column form)."""
        return cls(name=name, requests=np.asarray(requests, np.float64), positions=np.empty(0),
                   ms=np.asarray(draft_ms, np.float64)[None, :])

    @property
    def by_positions(self) -> bool:
        return self.positions.size > 0

    @property
    def max_positions(self) -> int | None:
        return int(self.positions[-1]) if self.by_positions else None


@dataclass
class Profile:
    """A step's cost as a real engine pays it: dense work by tokens, KV by requests and context.

    A step with T new tokens (verified drafts, bonus slots and prompt chunks), R decode
    requests holding K tokens of KV cache in all, and prompt chunks (q tokens after a
    prefix of p) costs

        dense(T) + attention(R, K) + Σ_chunks prefill_attention(q, p) + draft(R, positions)

    `step_ms` (verify.csv) is the dense part: a (C, T) grid whose C = 1 row prices a step of
    T tokens with no KV to read (weights, linear layers, LM head, launch overheads, the
    CUDA-graph staircase). `attention.csv` prices reading K KV tokens (by request count when
    it has a `requests` column); `prefill.csv`, when present, prices a step that carries only
    prompt tokens (an engine's prefill iteration runs other kernels than a decode step);
    the card's `cost_model.prefill_attention_ms_per_token_sq` prices a chunk's causal
    attention against its prefix, coef · ((p + q)² − p²).

    A legacy profile (verify.csv with a `context` column, C > 1 rows, measured with the card's
    `tokens_per_request` requests per row) has no attention table: its steps are priced at
    the batch's mean context by interpolating between rows, as sparksim did before
    (`kv_model == "legacy-grid"`).
    """

    name: str
    card: dict[str, Any]
    tokens: NDArray[np.float64]  # (T,) profiled batch sizes in tokens, increasing
    contexts: NDArray[np.float64]  # (C,) legacy: profiled context lengths; [nan] if none
    step_ms: NDArray[np.float64]  # (C, T) dense cost, monotone in tokens after clean-up
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
    _warned: set[str] = field(default_factory=set, repr=False)
    _draft_cache: dict[tuple[str, int, int], float] = field(default_factory=dict, repr=False)
    _scalar: tuple[list[list[float]], list[float], list[float], float] | None = field(
        default=None, repr=False
    )
    _attn_lists: tuple[list[float], list[list[float]], list[float]] | None = field(default=None, repr=False)
    _prefill_lists: tuple[list[float], list[float]] | None = field(default=None, repr=False)

    @property
    def source(self) -> str:
        return str(self.card.get("source", "unknown"))

    @property
    def has_context(self) -> bool:
        return not bool(np.isnan(self.contexts[0]))

    @functools.cached_property
    def kv_model(self) -> KvModel:
        """How KV traffic is priced: an attention table, a legacy context grid, or not at all."""
        if self.attn_kv_tokens.size:
            return "per-request"
        return "legacy-grid" if self.has_context else "none"

    @property
    def max_tokens(self) -> int:
        """The largest profiled batch, in tokens."""
        return int(self.tokens[-1])

    @functools.cached_property
    def prefill_attention_coef_ms(self) -> float:
        """ms per token² of causal prefill attention (the card's cost model; 0 if it has none)."""
        cm = self.card.get("cost_model") or {}
        return float(cm.get("prefill_attention_ms_per_token_sq", 0.0)) if isinstance(cm, dict) else 0.0

    @functools.cached_property
    def attention_compute_coef_ms(self) -> float:
        """ms per (query token × KV token) of decode attention (the card's cost model; 0: none).

        A step's attention costs max(the KV read, this × Σ queries × context); 0 keeps it
        memory-bound, as GQA models are.
        """
        cm = self.card.get("cost_model") or {}
        return float(cm.get("attention_ms_per_query_kv_token", 0.0)) if isinstance(cm, dict) else 0.0

    @functools.cached_property
    def decision_table(self) -> dict[str, tuple[float, float]]:
        """Per policy name, (a ms, b ms per request) of its decision step (card `cost_model.decision_ms`).

        Measured by `sparksim profile live`: what the engine spends on the critical path asking a
        policy for ℓ (building its batch, reading the cost model, `decide`, checking the answer).
        """
        cm = self.card.get("cost_model") or {}
        table = cm.get("decision_ms", {}) if isinstance(cm, dict) else {}
        return {str(k): (float(v["a_ms"]), float(v["b_ms_per_request"])) for k, v in (table or {}).items()}

    def decision_s(self, policy: str, requests: int) -> float:
        """Seconds a step spends deciding for `requests` requests under `policy` (0 if not profiled)."""
        a, b = self.decision_table.get(policy, (0.0, 0.0))
        return (a + b * requests) / 1e3

    @functools.cached_property
    def verify_drafts_ms(self) -> tuple[float, float]:
        """(a ms, b ms per request) a step pays once it verifies any draft (card `cost_model.verify_drafts_ms`).

        Exact rejection sampling (the drafter's probabilities gathered, the residual built and
        sampled) and the drafts scattered into the target's input: measured by `sparksim profile
        live` as the jump between plain-decoding and drafting points. (0, 0) when not profiled.
        """
        cm = self.card.get("cost_model") or {}
        v = cm.get("verify_drafts_ms") if isinstance(cm, dict) else None
        return (float(v["a_ms"]), float(v["b_ms_per_request"])) if isinstance(v, dict) else (0.0, 0.0)

    def verify_drafts_s(self, requests: int) -> float:
        """Seconds a step of `requests` requests adds once it verifies any draft."""
        a, b = self.verify_drafts_ms
        return (a + b * requests) / 1e3 if requests else 0.0

    @functools.cached_property
    def loop_table(self) -> dict[tuple[str, str], tuple[float, float]]:
        """(mode, kind) -> (a ms, b ms per running request) of the engine loop's time before a step.

        Card `cost_model.loop_ms.{plain|drafting}.{decode|prefill}`, measured by `sparksim
        profile live` from the idle gaps between a live session's steps: finishing requests,
        making the next ones, forming the batch, bookkeeping — the engine's own time outside its
        step functions. Empty for an engine whose host work overlaps its steps (a GPU's).
        """
        cm = self.card.get("cost_model") or {}
        table = cm.get("loop_ms") if isinstance(cm, dict) else None
        return {(str(mode), str(kind)): (float(v["a_ms"]), float(v["b_ms_per_request"]))
                for mode, kinds in (table or {}).items() for kind, v in kinds.items()}

    def loop_s(self, drafting: bool, kind: str, requests: int) -> float:
        """Seconds the engine loop spends before a `kind` (decode or prefill) step with `requests` running."""
        a, b = self.loop_table.get(("drafting" if drafting else "plain", kind), (0.0, 0.0))
        return (a + b * requests) / 1e3

    @functools.cached_property
    def attention_kv_padded(self) -> bool:
        """True when the card's `cost_model.attention_kv` is `padded`: the engine's attention runs over
        the batch padded to its longest context (and its longest verified block), so a step pays
        for R × the longest context where a paged-attention engine pays for the sum (the live
        engine's batched attention). Default `sum`."""
        cm = self.card.get("cost_model") or {}
        return isinstance(cm, dict) and cm.get("attention_kv", "sum") == "padded"

    @functools.cached_property
    def attention_compute_adds(self) -> bool:
        """True when the card's `cost_model.attention_compute` is `sum`: the attention FLOPs add to
        attention.csv instead of overlapping it (`max`, the default, as a GPU overlaps memory and
        compute). A CPU engine pays both, one after the other (the live engine's profile)."""
        cm = self.card.get("cost_model") or {}
        return isinstance(cm, dict) and cm.get("attention_compute", "max") == "sum"

    @functools.cached_property
    def step_limit(self) -> float:
        """Largest batch that pads up in `step` mode: the largest CUDA-graph size if the card
        lists them (beyond it the engine runs eagerly and cost interpolates), else no limit."""
        sizes = self.captured_sizes
        return float(sizes[-1]) if sizes else float("inf")

    @functools.cached_property
    def captured_sizes(self) -> tuple[int, ...]:
        """CUDA-graph capture sizes from the card, if it lists them."""
        sizes = self.card.get("graph_capture_sizes") or ()
        return tuple(sorted(int(s) for s in sizes))

    @functools.cached_property
    def gpus_per_replica(self) -> int:
        """GPUs one replica of this profile occupies (the card's `gpus_per_replica`, else 1)."""
        return int(self.card.get("gpus_per_replica", 1) or 1)

    # ------------------------------------------------------------------ dense (verify.csv)

    def verify_s(self, tokens: ArrayLike, context: ArrayLike | None = None) -> NDArray[np.float64]:
        """Return the dense step time in seconds for each batch size in `tokens`.

        For a per-request profile this is the step without its KV reads (add `attention_s`).
        For a legacy grid, `context` (tokens of KV cache per request) broadcasts against
        `tokens` and is interpolated linearly between profiled contexts.
        """
        t = np.asarray(tokens, dtype=np.float64)
        if context is not None and self.has_context:
            # one batch size at many contexts is a valid question too: broadcast both ways
            t = np.broadcast_arrays(t, np.asarray(context, np.float64))[0]
        rows = self._lookup_tokens(t.ravel())  # (C, N)
        if not self.has_context or rows.shape[0] == 1:
            out = rows[0]
        else:
            c = np.broadcast_to(
                np.asarray(self._default_context() if context is None else context, np.float64),
                t.shape,
            ).ravel()
            out = self._interp_context(rows, c)
        return (out / 1e3).reshape(t.shape)

    def verify_s_scalar(self, tokens: float, context: float = 0.0) -> float:
        """Return `verify_s` for one batch size: the engine's per-step fast path (no arrays).

        The same rules (`token_weight`, `context_weight`) on Python lists; a test holds the
        two paths equal on random profiles.
        """
        rows, cols, ctx, limit = self._scalar_tables()
        if tokens > cols[-1] or (ctx and context > ctx[-1]):
            return float(self.verify_s(tokens, context))  # extrapolates, and warns once
        j, w = token_weight(cols, tokens, limit)
        if len(cols) == 1:
            vals = [row[0] * (1.0 + w) for row in rows]
        else:
            vals = [(1.0 - w) * row[j] + w * row[j + 1] for row in rows]
        if len(vals) == 1:
            return vals[0] / 1e3
        k, w = context_weight(ctx, context)
        return ((1.0 - w) * vals[k] + w * vals[k + 1]) / 1e3

    # ------------------------------------------------------------------ KV and prefill

    def attention_s(self, requests: float, kv_tokens: float) -> float:
        """Return the time in seconds to read `kv_tokens` of KV cache for `requests` requests.

        Linear in KV tokens between rows (a memory-bound kernel), extrapolating the last
        slope with one warning; linear in requests between rows, clamped at the ends.
        0 for a profile without an attention table (legacy grids price KV in verify_s).
        The engine asks once per step, so this reads Python lists, not arrays.
        """
        kv, rows, req = self._attention_lists()
        if not kv or requests <= 0:
            return 0.0
        if kv_tokens > kv[-1]:
            self._extrapolated("kv_tokens", kv_tokens, kv[-1])
        if len(rows) == 1:
            return _interp_extrapolate(kv, rows[0], kv_tokens) / 1e3
        i = min(max(bisect.bisect_right(req, requests) - 1, 0), len(req) - 2)
        w = min(max((requests - req[i]) / (req[i + 1] - req[i]), 0.0), 1.0)
        lo = _interp_extrapolate(kv, rows[i], kv_tokens)
        hi = _interp_extrapolate(kv, rows[i + 1], kv_tokens)
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
        profile has one, else from the dense verify table.
        """
        if not self.has_prefill_table:
            return self.verify_s_scalar(tokens, 0.0)
        if tokens > self.prefill_tokens[-1]:
            self._extrapolated("prefill tokens", tokens, float(self.prefill_tokens[-1]))
        if self._prefill_lists is None:
            self._prefill_lists = (self.prefill_tokens.tolist(), self.prefill_ms.tolist())
        return _interp_extrapolate(*self._prefill_lists, tokens) / 1e3

    def prefill_attention_s(self, chunk: float, prefix: float) -> float:
        """Return the causal attention time in seconds of a `chunk`-token prompt piece after `prefix`."""
        return self.prefill_attention_coef_ms * ((prefix + chunk) ** 2 - prefix**2) / 1e3

    def prefill_s(self, prompt_lengths: ArrayLike) -> float:
        """Return the time in seconds of one prefill-only step over whole prompts (a prefill pool)."""
        p = np.asarray(prompt_lengths, np.float64)
        return self.prefill_dense_s(float(p.sum())) + self.prefill_attention_coef_ms * float(
            (p**2).sum()) / 1e3

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
        mem = self.card.get("memory")
        if not isinstance(mem, dict):
            return None
        free = utilisation * float(mem["hbm_bytes"]) - float(mem["weights_bytes"]) - float(
            mem.get("activation_reserve_bytes", 0))
        if free <= 0:
            raise FormatError(self.path or Path(self.name), [
                f"card.yaml: memory.hbm_bytes={mem['hbm_bytes']} x utilisation {utilisation} cannot hold "
                f"memory.weights_bytes={mem['weights_bytes']} + memory.activation_reserve_bytes="
                f"{mem.get('activation_reserve_bytes', 0)}"])
        return int(free // float(mem["kv_bytes_per_token"]))

    # ------------------------------------------------------------------ helpers

    def _scalar_tables(self) -> tuple[list[list[float]], list[float], list[float], float]:
        """Python-list copies of the grid for scalar lookups: (rows, tokens, contexts, step limit).

        `contexts` is empty for a profile without a context column; the step limit is
        +inf in `linear` mode so a single comparison picks the branch.
        """
        if self._scalar is None:
            limit = self.step_limit if self.mode == "step" else -math.inf
            ctx = self.contexts.tolist() if self.has_context and self.contexts.size > 1 else []
            self._scalar = (self.step_ms.tolist(), self.tokens.tolist(), ctx, limit)
        return self._scalar

    def _default_context(self) -> float:
        return float(self.contexts[0])

    def _lookup_tokens(self, t: NDArray[np.float64]) -> NDArray[np.float64]:
        if t.size and float(t.max()) > self.tokens[-1]:
            self._extrapolated("tokens", float(t.max()), float(self.tokens[-1]))
        return _lookup_1d(self.tokens, self.step_ms, t, self.mode, self.step_limit)

    def _interp_context(
        self, rows: NDArray[np.float64], c: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        ctx = self.contexts
        if c.size and float(c.max()) > ctx[-1]:
            self._extrapolated("context", float(c.max()), float(ctx[-1]))
        lo, w = context_weight(ctx, c)
        n = np.arange(c.size)
        return (1.0 - w) * rows[lo, n] + w * rows[lo + 1, n]

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


def context_weight(contexts: Any, context: Any) -> tuple[Any, Any]:
    """Return (k, w): a legacy grid's cost at `context` is (1 − w)·row[k] + w·row[k + 1].

    The one interpolation rule in context, for scalars (Python lists) and arrays alike:
    linear between profiled contexts, the first row below them (w clipped at 0), the last
    two rows' slope past them (w > 1).
    """
    if isinstance(contexts, list):
        k = min(max(bisect.bisect_right(contexts, context) - 1, 0), len(contexts) - 2)
        return k, max((context - contexts[k]) / (contexts[k + 1] - contexts[k]), 0.0)
    k = np.clip(np.searchsorted(contexts, context, side="right") - 1, 0, contexts.size - 2)
    return k, np.maximum((context - contexts[k]) / (contexts[k + 1] - contexts[k]), 0.0)


def _interp_extrapolate(x: Sequence[float], y: Sequence[float], at: float) -> float:
    """Interpolate y(x) linearly at `at`: from (0, 0) below x[0], the last slope past x[-1].

    Plain Python on lists (or arrays): the engine asks it every step.
    """
    if at <= x[0]:
        return float(y[0] * at / x[0]) if x[0] > 0 else float(y[0])
    if at >= x[-1]:
        if len(x) == 1:
            return float(y[0] * at / x[0])
        return float(y[-1] + (at - x[-1]) * (y[-1] - y[-2]) / (x[-1] - x[-2]))
    j = bisect.bisect_right(x, at) - 1
    return float((y[j + 1] - y[j]) / (x[j + 1] - x[j]) * (at - x[j]) + y[j])


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


# --------------------------------------------------------------------------- loading


def _read_csv(path: Path, required: tuple[str, ...], optional: tuple[str, ...], problems: list[str]
              ) -> pd.DataFrame | None:
    if not path.is_file():
        problems.append(f"{path.name}: file is missing")
        return None
    try:
        df = pd.read_csv(path, nrows=MAX_PROFILE_ROWS + 1)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        problems.append(f"{path.name}: cannot be parsed as CSV ({exc})")
        return None
    if len(df) > MAX_PROFILE_ROWS:
        problems.append(f"{path.name}: more than {MAX_PROFILE_ROWS} rows")
        return None
    ok = True
    for col in required:
        if col not in df.columns:
            problems.append(f"{path.name}: missing column {col!r} (has {list(df.columns)})")
            ok = False
    for col in df.columns:
        if col not in required and col not in optional:
            problems.append(f"{path.name}: unknown column {col!r}")
    if not ok:
        return None
    if df.empty:
        problems.append(f"{path.name}: no rows")
        return None

    def plain(value: Any) -> str:
        # a number as a person writes it (8, -0.25, nan), not np.float64(8.0); text quoted
        if isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
            num = float(value)
            return str(int(num)) if num.is_integer() else repr(num)
        return repr(value)

    # rows count from 1 as a person reads the file: the first data row under the header is row 1
    for col in df.columns:
        if col not in required and col not in optional:
            continue
        vals = pd.to_numeric(df[col], errors="coerce")
        bad = ~np.isfinite(vals.to_numpy(dtype=np.float64))
        if bad.any():
            row = int(np.argmax(bad))
            problems.append(
                f"{path.name}: column {col!r} row {row + 1} is not a finite number ({plain(df[col].iloc[row])})"
            )
            ok = False
            continue
        positive = ("tokens", "requests", "step_ms", "positions")
        neg = vals.to_numpy() <= 0 if col in positive else vals.to_numpy() < 0
        if neg.any():
            row = int(np.argmax(neg))
            problems.append(f"{path.name}: column {col!r} row {row + 1} out of range ({plain(vals.iloc[row])})")
            ok = False
        df[col] = vals
    return df if ok else None


def check_card(card: Any, problems: list[str], *, kind: str = "profile") -> dict[str, Any]:
    """Append a problem for each missing or bad card field; return the card as a dict."""
    if not isinstance(card, dict):
        problems.append("card.yaml: must be a mapping of fields")
        return {}
    for key in CARD_REQUIRED if kind == "profile" else ():
        if key not in card or card[key] in (None, ""):
            problems.append(f"card.yaml: missing field {key!r}")
    src = card.get("source")
    if kind == "profile" and src is not None and src not in SOURCES:
        problems.append(f"card.yaml: source={src!r} is not one of {list(SOURCES)}")
    return card


def read_card(path: Path, problems: list[str]) -> Any:
    """Read a card.yaml with the safe loader; append a problem if it is missing or not YAML."""
    if not path.is_file():
        problems.append("card.yaml: file is missing")
        return None
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        problems.append(f"card.yaml: not valid YAML ({exc})")
        return None


def check_profile(path: Path | str) -> list[str]:
    """Return every problem found in the profile folder at `path` (empty if it is valid)."""
    problems: list[str] = []
    _parse(Path(path), problems)
    return problems


def load_profile(path: Path | str, *, mode: LookupMode = "step", strict: bool = False) -> Profile:
    """Load and validate the profile folder at `path`; raise FormatError listing every problem."""
    path = Path(path)
    problems: list[str] = []
    prof = _parse(path, problems)
    if problems or prof is None:
        raise FormatError(path, problems or ["unreadable profile"])
    prof.mode = mode
    prof.strict = strict
    return prof


def _parse(path: Path, problems: list[str]) -> Profile | None:
    if not path.is_dir():
        problems.append("not a directory")
        return None
    card = check_card(read_card(path / "card.yaml", problems), problems)
    vdf = _read_csv(path / "verify.csv", VERIFY_REQUIRED, VERIFY_OPTIONAL, problems)
    drafters, default = _parse_drafters(path, card, problems)
    attn = _parse_attention(path, problems)
    prefill = _parse_prefill(path, problems)
    _check_cost_card(card, problems)
    if vdf is None or drafters is None or attn is None or prefill is None:
        return None
    name = path.name
    tokens, contexts, grid = _grid(vdf, problems, name)
    if grid is None:
        return None
    if attn[1].size and "context" in vdf.columns:
        problems.append("verify.csv: a profile with attention.csv prices KV there; drop the "
                        "legacy 'context' column")
        return None
    return Profile(
        name=name, card=card, tokens=tokens, contexts=contexts, step_ms=grid,
        drafters=drafters, default_drafter=default,
        attn_requests=attn[0], attn_kv_tokens=attn[1], attn_ms=attn[2],
        prefill_tokens=prefill[0], prefill_ms=prefill[1], path=path,
    )


def _parse_drafters(
    path: Path, card: dict[str, Any], problems: list[str]
) -> tuple[dict[str, DraftTable] | None, str | None]:
    """Read every drafter table the card lists (`drafters:`), or the lone `draft.csv`."""
    listed = card.get("drafters")
    if listed is None:  # one drafter: draft.csv, described (if at all) by the card's `drafter`
        if not (path / "draft.csv").exists():
            return {}, None
        found = card.get("drafter")
        info: dict[str, Any] = found if isinstance(found, dict) else {}
        listed = {str(info.get("name", "default")): {**info, "file": "draft.csv"}}
        default: str | None = next(iter(listed))
    else:
        if not isinstance(listed, dict) or not listed:
            problems.append("card.yaml: drafters must map each drafter's name to its description")
            return None, None
        default = card.get("default_drafter") or next(iter(listed))
        if default not in listed:
            problems.append(f"card.yaml: default_drafter={default!r} is not one of {sorted(listed)}")
            return None, None
    tables: dict[str, DraftTable] = {}
    for dname, info in listed.items():
        if not isinstance(info, dict):
            problems.append(f"card.yaml: drafters.{dname} must be a mapping")
            continue
        kind = info.get("kind", "block")
        if kind not in DRAFTER_KINDS:
            problems.append(f"card.yaml: drafters.{dname}.kind={kind!r} is not one of {list(DRAFTER_KINDS)}")
            continue
        file = str(info.get("file", f"draft-{dname}.csv"))
        df = _read_csv(path / file, DRAFT_REQUIRED, DRAFT_OPTIONAL, problems)
        if df is None:
            continue
        table = _draft_grid(df, str(dname), file, problems, path.name)
        if table is None:
            continue
        table.kind = kind
        layers = info.get("layers", info.get("num_layers"))
        table.layers = int(layers) if layers is not None else None
        coef = info.get("kv_ms_per_token", 0.0)
        if not _nonneg(coef):
            problems.append(f"card.yaml: drafters.{dname}.kv_ms_per_token={coef!r} must be a number >= 0")
            continue
        table.kv_ms_per_token = float(coef)
        table.info = dict(info)
        tables[str(dname)] = table
    return (tables, default) if len(tables) == len(listed) else (None, None)


def _draft_grid(df: pd.DataFrame, name: str, file: str, problems: list[str], pname: str
                ) -> DraftTable | None:
    if "positions" not in df.columns:
        df = df.sort_values("requests")
        if df["requests"].duplicated().any():
            problems.append(f"{file}: duplicate request counts")
            return None
        ms = _monotone(df["draft_ms"].to_numpy(np.float64)[None, :], file, pname)
        return DraftTable(name, df["requests"].to_numpy(np.float64), np.empty(0), ms)
    if df.duplicated(["positions", "requests"]).any():
        problems.append(f"{file}: duplicate (positions, requests) rows")
        return None
    if (df["positions"] <= 0).any():
        problems.append(f"{file}: positions must be >= 1 (0 positions cost nothing by definition)")
        return None
    wide = df.pivot(index="positions", columns="requests", values="draft_ms").sort_index()
    wide = wide.reindex(sorted(wide.columns), axis=1)
    if wide.isna().any().any():
        p, r = np.argwhere(wide.isna().to_numpy())[0]
        problems.append(f"{file}: every positions row needs the same request counts "
                        f"(positions={wide.index[p]:g} lacks requests={wide.columns[r]:g})")
        return None
    ms = _monotone(wide.to_numpy(np.float64), file, pname)
    return DraftTable(name, wide.columns.to_numpy(np.float64), wide.index.to_numpy(np.float64), ms)


def _parse_attention(
    path: Path, problems: list[str]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]] | None:
    """Read attention.csv: (requests rows or empty, kv_tokens columns, (A, K) ms grid)."""
    empty = (np.empty(0), np.empty(0), np.empty((0, 0)))
    file = path / "attention.csv"
    if not file.exists():
        return empty
    df = _read_csv(file, ATTENTION_REQUIRED, ATTENTION_OPTIONAL, problems)
    if df is None:
        return None
    if "requests" not in df.columns:
        df = df.assign(requests=1.0)
        single = True
    else:
        single = False
        if (df["requests"] <= 0).any():
            problems.append("attention.csv: requests must be >= 1")
            return None
    if df.duplicated(["requests", "kv_tokens"]).any():
        problems.append("attention.csv: duplicate (requests, kv_tokens) rows")
        return None
    wide = df.pivot(index="requests", columns="kv_tokens", values="attn_ms").sort_index()
    wide = wide.reindex(sorted(wide.columns), axis=1)
    if wide.isna().any().any():
        problems.append("attention.csv: every requests row needs the same kv_tokens values")
        return None
    ms = _monotone(wide.to_numpy(np.float64), "attention.csv", path.name)
    req = np.empty(0) if single else wide.index.to_numpy(np.float64)
    if req.size == 1:
        req = np.empty(0)
    return req, wide.columns.to_numpy(np.float64), ms


def _parse_prefill(path: Path, problems: list[str]
                   ) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
    file = path / "prefill.csv"
    if not file.exists():
        return np.empty(0), np.empty(0)
    df = _read_csv(file, PREFILL_REQUIRED, PREFILL_OPTIONAL, problems)
    if df is None:
        return None
    df = df.sort_values("tokens")
    if df["tokens"].duplicated().any():
        problems.append("prefill.csv: duplicate token counts")
        return None
    ms = _monotone(df["prefill_ms"].to_numpy(np.float64)[None, :], "prefill.csv", path.name)[0]
    return df["tokens"].to_numpy(np.float64), ms


def _check_cost_card(card: dict[str, Any], problems: list[str]) -> None:
    """Check the card's cost-model and memory figures (they price prefill and size the KV cache)."""
    cm = card.get("cost_model")
    if cm is not None:
        coef = cm.get("prefill_attention_ms_per_token_sq") if isinstance(cm, dict) else None
        if not isinstance(cm, dict) or (coef is not None and not _nonneg(coef)):
            problems.append(f"card.yaml: cost_model.prefill_attention_ms_per_token_sq={coef!r} "
                            "must be a number >= 0")
        dec = cm.get("decision_ms") if isinstance(cm, dict) else None
        for name, v in (dec.items() if isinstance(dec, dict) else [] if dec is None else [("", dec)]):
            if not (isinstance(v, dict) and _nonneg(v.get("a_ms")) and _nonneg(v.get("b_ms_per_request"))):
                problems.append(f"card.yaml: cost_model.decision_ms.{name}={v!r} must be a mapping with "
                                "a_ms and b_ms_per_request >= 0")
        vd = cm.get("verify_drafts_ms") if isinstance(cm, dict) else None
        if vd is not None and not (isinstance(vd, dict) and _nonneg(vd.get("a_ms"))
                                   and _nonneg(vd.get("b_ms_per_request"))):
            problems.append(f"card.yaml: cost_model.verify_drafts_ms={vd!r} must be a mapping with "
                            "a_ms and b_ms_per_request >= 0")
        loop = cm.get("loop_ms") if isinstance(cm, dict) else None
        if loop is not None:
            _check_loop_card(loop, problems)
        kv_how = cm.get("attention_kv", "sum") if isinstance(cm, dict) else "sum"
        if kv_how not in ("sum", "padded"):
            problems.append(f"card.yaml: cost_model.attention_kv={kv_how!r} must be sum or padded")
        how = cm.get("attention_compute", "max") if isinstance(cm, dict) else "max"
        if how not in ("max", "sum"):
            problems.append(f"card.yaml: cost_model.attention_compute={how!r} must be max or sum")
    mem = card.get("memory")
    if mem is None:
        return
    if not isinstance(mem, dict):
        problems.append("card.yaml: memory must be a mapping of byte counts")
        return
    for key in MEMORY_FIELDS:
        val = mem.get(key, 0 if key == "activation_reserve_bytes" else None)
        if not _nonneg(val) or (key in ("hbm_bytes", "kv_bytes_per_token") and float(val or 0) <= 0):
            problems.append(f"card.yaml: memory.{key}={val!r} must be a positive number of bytes")
            return
    # whether they fit at the scenario's cluster.gpu_memory_utilization is the run's check
    # (Profile.kv_capacity_tokens); a card is refused only when no utilisation could hold them
    if float(mem["hbm_bytes"]) <= float(mem["weights_bytes"]) + float(mem.get("activation_reserve_bytes", 0)):
        problems.append(
            f"card.yaml: memory.hbm_bytes={mem['hbm_bytes']} cannot hold memory.weights_bytes="
            f"{mem['weights_bytes']} + memory.activation_reserve_bytes={mem.get('activation_reserve_bytes', 0)}")


def _check_loop_card(loop: Any, problems: list[str]) -> None:
    """`cost_model.loop_ms`: {plain|drafting: {decode|prefill: {a_ms, b_ms_per_request}}}, every figure >= 0."""
    if not isinstance(loop, dict) or not loop:
        problems.append(f"card.yaml: cost_model.loop_ms={loop!r} must map plain/drafting to decode/prefill fits")
        return
    for mode, kinds in loop.items():
        if mode not in ("plain", "drafting") or not isinstance(kinds, dict):
            problems.append(f"card.yaml: cost_model.loop_ms.{mode}: the modes are plain and drafting, "
                            "each a mapping of decode/prefill fits")
            continue
        for kind, v in kinds.items():
            if kind not in ("decode", "prefill") or not (
                    isinstance(v, dict) and _nonneg(v.get("a_ms")) and _nonneg(v.get("b_ms_per_request"))):
                problems.append(f"card.yaml: cost_model.loop_ms.{mode}.{kind}={v!r}: the kinds are decode "
                                "and prefill, each a mapping with a_ms and b_ms_per_request >= 0")


def _nonneg(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        and value >= 0


def _grid(
    vdf: pd.DataFrame, problems: list[str], name: str
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64] | None]:
    empty = np.empty(0)
    if "context" in vdf.columns:
        if vdf.duplicated(["context", "tokens"]).any():
            problems.append("verify.csv: duplicate (context, tokens) rows")
            return empty, empty, None
        wide = vdf.pivot(index="context", columns="tokens", values="step_ms").sort_index()
        wide = wide.reindex(sorted(wide.columns), axis=1)
        if wide.isna().any().any():
            ctx, tok = np.argwhere(wide.isna().to_numpy())[0]
            problems.append(
                "verify.csv: every context must be profiled at the same token counts "
                f"(context={wide.index[ctx]:g} lacks tokens={wide.columns[tok]:g})"
            )
            return empty, empty, None
        contexts = wide.index.to_numpy(np.float64)
        tokens = wide.columns.to_numpy(np.float64)
        grid = wide.to_numpy(np.float64)
    else:
        if vdf["tokens"].duplicated().any():
            problems.append("verify.csv: duplicate token counts")
            return empty, empty, None
        vdf = vdf.sort_values("tokens")
        contexts = np.array([np.nan])
        tokens = vdf["tokens"].to_numpy(np.float64)
        grid = vdf["step_ms"].to_numpy(np.float64)[None, :]
    return tokens, contexts, _monotone(grid, "verify.csv", name)


def _monotone(grid: NDArray[np.float64], file: str, name: str) -> NDArray[np.float64]:
    """Force cost non-decreasing in batch size, as vLLM does; warn where the data dipped."""
    clean = np.maximum.accumulate(grid, axis=1)
    dips = int((clean > grid).sum())
    if dips:
        warnings.warn(
            f"profile {name!r}: {file} cost falls with batch size at {dips} point(s); "
            "raised to the running maximum (measurement noise or a broken profile)",
            ProfileWarning,
            stacklevel=4,
        )
    return clean


# --------------------------------------------------------------------------- writing


def write_profile(
    path: Path | str,
    verify: pd.DataFrame,
    card: Mapping[str, Any],
    draft: pd.DataFrame | None = None,
    *,
    extra: Mapping[str, pd.DataFrame] | None = None,
) -> Path:
    """Write a profile folder atomically and check that it loads; return its path.

    `extra` maps further file names (attention.csv, prefill.csv, draft-NAME.csv) to tables.
    """
    path = Path(path)
    with atomic_dir(path) as tmp:
        _sizes_as_int(verify).to_csv(tmp / "verify.csv", index=False, float_format="%.9g")
        if draft is not None:
            _sizes_as_int(draft).to_csv(tmp / "draft.csv", index=False, float_format="%.9g")
        for fname, table in (extra or {}).items():
            _sizes_as_int(table).to_csv(tmp / fname, index=False, float_format="%.9g")
        (tmp / "card.yaml").write_text(yaml.safe_dump(dict(card), sort_keys=False, width=100))
        with warnings.catch_warnings():
            # the written copy's clean-up warnings would name the temporary folder; loading
            # the profile repeats them under its real name
            warnings.simplefilter("ignore", ProfileWarning)
            problems = check_profile(tmp)
        if problems:
            raise FormatError(path, problems)
    return path


def _sizes_as_int(df: pd.DataFrame) -> pd.DataFrame:
    """Return `df` with whole-number size columns as integers: "%.6g" would round 1048576 to 1.04858e+06."""
    out = df.copy()
    for col in ("tokens", "context", "requests", "positions", "kv_tokens"):
        if col in out.columns and pd.api.types.is_float_dtype(out[col]):
            vals = out[col].to_numpy(np.float64)
            if np.all(np.isfinite(vals)) and np.all(vals == np.round(vals)):
                out[col] = vals.astype(np.int64)
    return out
