"""Legacy context grids: a verify.csv priced by (tokens, context), converted on load to dense + attention.

Before attention.csv, a profile's verify.csv held one row of step costs per context C,
measured with R = ceil(B / tokens_per_request) requests each holding C tokens of KV cache,
and a step was priced at the batch's mean context by interpolating between rows. sparksim
prices every step as dense(B) + attention(R, K) now; `convert` rewrites such a grid into
that form when it loads, so one pricing rule remains:

- dense(B) = the grid's row at its smallest context C₀: what a step pays with C₀ tokens of
  KV per request (the grid measured no less, and priced any less as C₀);
- attention(R, K) = the grid's growth above that row, grid(B, c) − grid(B, C₀), at
  c = K / R tokens per request, averaged over the grid's columns B with R requests; linear
  in context between rows and past the last (`context_weight`, the rule the grid was read
  by), 0 at or below C₀, linear in R between request counts.

It is exact where the grid's growth with context depends on its requests alone (a KV
read, as in a roofline's grid): every step the grid measured (B = R · tokens_per_request,
any context) costs what the grid says. It is not exact in general, and cannot be: growth
that also depends on the tokens (attention FLOPs grow with queries × context) is averaged
over each R's columns; and a step whose verified tokens per request differ from
tokens_per_request pays its own R requests' KV above C₀ where the grid charged ceil(B /
tokens_per_request) requests' (plain decoding of R requests paid R / 8 requests' KV), while
the dense row keeps the KV of ceil(B / tokens_per_request) requests at C₀ that the grid
measured. tests/test_legacy_grid.py measures each on synthetic grids.
"""

from __future__ import annotations

import bisect
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

LEGACY_TOKENS_PER_REQUEST = 8  # a legacy card without `tokens_per_request` was measured with 8


class Converted(NamedTuple):
    """A legacy grid as the tables a profile holds now, and the note that says how."""

    dense_ms: NDArray[np.float64]  # (T,) the grid at its smallest context
    attn_requests: NDArray[np.float64]  # (A,) request counts, empty for one
    attn_kv_tokens: NDArray[np.float64]  # (K,) total KV tokens, empty for a one-context grid
    attn_ms: NDArray[np.float64]  # (A or 1, K) growth above the smallest context
    note: str


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


def convert(tokens: NDArray[np.float64], contexts: NDArray[np.float64], grid: NDArray[np.float64],
            tokens_per_request: int = LEGACY_TOKENS_PER_REQUEST) -> Converted:
    """Return the dense row and attention table of a (C, T) grid over `contexts` × `tokens`."""
    dense = grid[0].copy()
    lo, hi = f"{contexts[0]:.12g}", f"{contexts[-1]:.12g}"
    remake = "remake it with `sparksim profile` (attention.csv) to price KV as measured"
    if contexts.size == 1:
        note = (f"converted on load from a legacy context grid with one context row ({lo} tokens "
                f"per request): dense(B) is that row and KV is not priced beyond it; {remake}")
        return Converted(dense, np.empty(0), np.empty(0), np.empty((0, 0)), note)
    per_column = np.ceil(tokens / tokens_per_request)  # (T,) the requests each column held
    requests = np.unique(per_column)  # (A,)
    growth = np.maximum(grid - grid[:1], 0.0)  # (C, T) a dip below the first row is noise
    by_requests = np.stack([growth[:, per_column == r].mean(axis=1) for r in requests], axis=1)  # (C, A)
    # every row's own breakpoints (R·c) are on the common axis, so reading a row linearly
    # between these points, and past the last at its slope, is that row's rule exactly
    kv = np.unique(np.outer(requests, contexts))  # (K,)
    per_request = (kv[None, :] / requests[:, None]).ravel()  # (A·K,) context each request holds
    k, w = context_weight(contexts, per_request)
    row = np.repeat(np.arange(requests.size), kv.size)  # (A·K,)
    ms = ((1.0 - w) * by_requests[k, row] + w * by_requests[k + 1, row]).reshape(requests.size, kv.size)
    note = (f"converted on load from a legacy context grid (verify.csv at contexts {lo}..{hi}, "
            f"R = ceil(B / {tokens_per_request}) requests a row): dense(B) is the grid at context "
            f"{lo}; attention(R, K) is the grid's growth above it at K / R tokens per request "
            f"(0 below {lo}: those steps pay {lo} tokens a request, as the grid clamped them). "
            f"Exact only where the grid's growth depends on its requests alone; {remake}")
    return Converted(dense, requests if requests.size > 1 else np.empty(0), kv, ms, note)
