"""The loops numpy cannot fuse: the policies' Θ walk and fill counts, and the engine's step.

`theta_scan` walks Θ_k = τ_k / step_s[k] with τ_0 = `tau_start` and τ_k = τ_{k-1} + gains[k-1]
(summed left to right, as Algorithm 1 admits them) and returns either the first k after
which Θ stops rising (greedy) or the smallest k maximising it (argmax, two-step). In numpy
that is a cumulative sum, a division and an argmax, three passes over R·γ values at about
1 µs of call overhead each, on top of a cumulative sum as slow as the sort itself; one
compiled loop does it in one pass. `priced_scan` is the same walk pricing each B itself from
the dense table and the step's terms, where the price depends on B only: the step seconds
of a whole path (a slice, an addition and the extra terms' half-dozen operations) are never
built, and an early stop prices only the B it reaches. `stale_rows` matches two-step's
snapshot rows to this step's requests (a dozen numpy calls: an argsort, a search, a gather;
compiled, a lookup table over the ids' span, which running requests keep narrow, else a
search per request); `stale_path` gives the same rows' values sorted, compiled by editing
the snapshot's own sorted values (out go the rows of the requests that left, in the joined
ones' mean row) rather than sorting R·γ values again, and `stale_cut` walks Θ along that path
in the same call (two-step's K, where nothing but B prices a step). `count_at_least` counts, per request, the survivals at or above
the fill's threshold: a reduction along the short γ axis, which numpy does slowly.
`verified` checks a policy's answer (every ℓ within the positions drafted) and sums it, in
one pass where numpy takes a max and a sum. `compact` closes the running batch's slots over
the requests that left (numpy shifts each leaver's followers through a temporary copy).
`advance` applies one engine step to the running
batch (the replay rule of `sparksim.step.acceptance`, the state counters, the (ℓ, accepted)
histogram and the finished / out-of-trace checks): some fifteen small array operations at
R = 64, in one loop.

Each kernel exists twice. The numba versions (the `fast` extra) run when numba is installed
and `SPARKSIM_KERNELS` is not `numpy`: by default a process starts on the numpy twins and
loads numba once it has made `WARM_CALLS` kernel calls (numba's load pays only for long
runs); `SPARKSIM_KERNELS=numba` binds numba on the first call. The numpy versions run
otherwise. Both give identical
results: the same additions in the same order, the same divisions, the same tie rule
(tests/test_kernels.py draws inputs and compares them; tests/test_invariants.py compares
whole runs byte for byte). Callers look them up at call time (`kernels.theta_scan(...)`),
so `use` can switch the backend, e.g. in a test or a benchmark.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from sparksim.cost.pricing import unpadded_extra_s
from sparksim.step.acceptance import replay_step
from sparksim.step.batch_layout import (
    ACCEPTED,
    CONTEXT,
    EMITTED,
    OUT_LEN,
    ROW,
    ROW_END,
    STEPS,
    VERIFIED,
)


def first_non_improvement(values: NDArray[np.float64]) -> int:
    """Return the index before the first entry that does not exceed its predecessor (len - 1 if none)."""
    worse = values[1:] <= values[:-1]
    stop = int(worse.argmax()) if worse.size else 0
    return stop if worse.size and worse[stop] else int(values.size) - 1


def theta_scan_numpy(
    gains: NDArray[np.float64], tau_start: float, step_s: NDArray[np.float64], early_stop: bool
) -> tuple[int, float]:
    """Return (k, τ_k): the cut along `gains` (n values) priced by `step_s` (n + 1 values).

    early_stop: k is the first index whose successor does not raise Θ (n if every
    admission raises it); otherwise k is the smallest index of Θ's maximum. τ_k lets a
    caller that walks a long path in pieces carry τ into the next piece.
    """
    tau = np.concatenate((np.full(1, tau_start), gains)).cumsum()  # τ_0 .. τ_n, left to right
    theta = tau / step_s
    k = first_non_improvement(theta) if early_stop else int(theta.argmax())
    return k, float(tau[k])


def priced_scan_numpy(
    gains: NDArray[np.float64], tau_start: float, dense: NDArray[np.float64], first: int, early_stop: bool,
    fixed_s: float, attn_token_s: float, attn_mem_s: float, prefill_tokens: float, drafts_s: float,
    base_tokens: int, chunk: int = 0,
) -> tuple[int, float]:
    """`theta_scan` with step_s(B) for B = first .. first + n priced from the terms of a step
    whose price depends on B only (`StepCost.scan_terms`): dense[B] + fixed_s + extra_s(B).

    With `early_stop` and a `chunk` > 0 (a caller's guess of where the walk stops), the
    prices are made a chunk at a time, the chunk growing 4x, τ carried from one to the next:
    the walk and its floats are the whole path's, and an early stop prices what it reaches.
    """
    n = gains.size

    def step_s(lo: int, hi: int) -> NDArray[np.float64]:  # B = first + lo .. first + hi
        out = dense[first + lo : first + hi + 1] + fixed_s
        if attn_token_s or drafts_s:
            tokens = np.arange(first + lo, first + hi + 1)
            out = out + unpadded_extra_s(tokens, attn_token_s, attn_mem_s, prefill_tokens, drafts_s, base_tokens)
        return out

    if not early_stop or chunk <= 0 or chunk >= n:
        return theta_scan_numpy(gains, tau_start, step_s(0, n), early_stop)
    return chunked_walk(gains, tau_start, step_s, chunk, theta_scan_numpy)


def chunked_walk(
    gains: NDArray[np.float64], tau_start: float, step_s: Callable[[int, int], NDArray[np.float64]],
    chunk: int, scan: Callable[..., tuple[int, float]],
) -> tuple[int, float]:
    """An early-stopping `theta_scan` (`scan`) over consecutive chunks of k, the first `chunk`
    long and each next 4x the last, τ carried from one to the next; `step_s(lo, hi)` prices
    k = lo..hi, so only the chunks the walk reaches are priced. The same cut and τ as one walk."""
    n = gains.size
    lo, tau_lo = 0, tau_start
    while True:
        hi = min(n, lo + chunk)
        stop, tau_lo = scan(gains[lo:hi], tau_lo, step_s(lo, hi), True)
        if stop < hi - lo or hi == n:
            return lo + stop, tau_lo
        lo, chunk = hi, chunk * 4


def stale_rows_numpy(
    ids: NDArray[np.int64], stale_ids: NDArray[np.int64], stale_survival: NDArray[np.float64], fill: bool
) -> tuple[NDArray[np.float64], int]:
    """Return (rows (R, γ), p): one stale survival row per current request, for two-step's K.

    A request in the snapshot (`stale_ids`, `stale_survival`, C-ordered) has its own row:
    those p rows come first, in the order of `ids`; requests that left since are dropped.
    Rows p.. belong to the requests that joined since: with `fill`, the snapshot's
    per-position mean, summed first row to last (numpy's order along the rows when γ > 1;
    for γ = 1 numpy sums pairwise, so a caller passes fill=False and fills them itself).
    The path sorts values, so the order does not change K.
    """
    if ids.shape == stale_ids.shape and (ids == stale_ids).all():
        return stale_survival, ids.size
    # which current requests the snapshot holds (np.isin costs several times this at this size)
    order = np.argsort(stale_ids)
    sorted_ids = stale_ids[order]
    pos = np.minimum(np.searchsorted(sorted_ids, ids), sorted_ids.size - 1)
    present = sorted_ids[pos] == ids  # (R,)
    rows = order[pos[present]]
    if rows.size == ids.size:
        return stale_survival[rows], rows.size
    # np.vstack and np.broadcast_to cost more than the rows themselves at this size
    out = np.empty((ids.size, stale_survival.shape[1]))
    stale_survival.take(rows, axis=0, out=out[: rows.size])
    if fill:
        out[rows.size :] = stale_survival.sum(axis=0) / stale_survival.shape[0]
    return out, rows.size


def stale_path_numpy(
    ranked: NDArray[np.float64], ids: NDArray[np.int64], stale_ids: NDArray[np.int64],
    stale_survival: NDArray[np.float64],
) -> NDArray[np.float64]:
    """Return two-step's stale path for this step's requests: the values of `stale_rows` (fill
    on, γ > 1) sorted descending, shape (R·γ,).

    `ranked` is the snapshot's every survival sorted descending; the compiled twin edits it
    (drops the rows of the requests that left, merges in the joined ones' mean row), where
    this one sorts the matched rows afresh. The path needs only the values, so the two are
    the same array.
    """
    rows, _ = stale_rows_numpy(ids, stale_ids, stale_survival, True)
    flat = rows.flatten()
    flat.sort()
    return flat[::-1]


def stale_cut_numpy(
    ranked: NDArray[np.float64], ids: NDArray[np.int64], stale_ids: NDArray[np.int64],
    stale_survival: NDArray[np.float64], num_requests: int, max_tokens: int, dense: NDArray[np.float64],
    first: int, fixed_s: float, attn_token_s: float, attn_mem_s: float, prefill_tokens: float,
    drafts_s: float, base_tokens: int,
) -> int:
    """Return two-step's K on its stale path in one call: `stale_path`, cut to its positive
    survivals and to the token limit (B = first + k ≤ max_tokens), then the argmax of Θ along
    it (`priced_scan` without early stop, τ from `num_requests`); -1 where `dense` does not
    price every B of the cut (the caller grows its table and walks the path itself).
    """
    path = stale_path_numpy(ranked, ids, stale_ids, stale_survival)
    n = max(0, min(int((path > 0.0).sum()), max_tokens - first))  # positives lead: the path descends
    if first + n >= dense.size:
        return -1
    return priced_scan_numpy(path[:n], float(num_requests), dense, first, False, fixed_s, attn_token_s,
                             attn_mem_s, prefill_tokens, drafts_s, base_tokens)[0]


def count_at_least_numpy(survival: NDArray[np.float64], v: float) -> NDArray[np.int64]:
    """Return, per row of `survival` (R, γ, each row non-increasing), how many entries are ≥ v.

    The comparison is written into a zero-padded byte buffer 8·w columns wide and counted
    as the set bits of its w 64-bit words per row: a per-row sum or argmax along the short
    γ axis costs numpy more than the sort of the whole batch.
    """
    num_requests, gamma = survival.shape
    words = -(-gamma // 8)
    flags = np.zeros((num_requests, 8 * words), dtype=np.bool_)
    np.greater_equal(survival, v, out=flags[:, :gamma])
    bits = np.bitwise_count(flags.view(np.uint64))  # (R, w): one set bit per True byte
    counts = bits[:, 0] if words == 1 else bits.sum(axis=1)
    return counts.astype(np.int64)


def verified_numpy(lengths: NDArray[np.int64], max_length: int) -> int:
    """Return Σℓ over a policy's answer `lengths` (int64), or -1 if some ℓ is outside 0..max_length.

    One reduction for the bounds: seen as unsigned, a negative ℓ is past 2⁶³.
    """
    if lengths.size and int(lengths.view(np.uint64).max()) > max_length:
        return -1
    return int(lengths.sum())


def compact_numpy(state: NDArray[np.int64], last_emit: NDArray[np.float64], n: int, gone: NDArray[np.intp]) -> int:
    """Remove the running slots `gone` (ascending, below n) from columns 0..n-1 of `state`
    (fields × slots) and `last_emit`, the others keeping their order; return how many remain.

    A few leave (most finishes): each shifts the columns after it left, the last first so that
    the earlier indices hold (numpy copies overlapping slices safely); more, one gather.
    """
    if gone.size <= 4:
        for i in reversed(gone.tolist()):
            state[:, i : n - 1] = state[:, i + 1 : n]
            last_emit[i : n - 1] = last_emit[i + 1 : n]
            n -= 1
        return n
    keep = np.ones(n, dtype=np.bool_)
    keep[gone] = False
    left = n - gone.size
    state[:, :left] = state[:, :n][:, keep]
    last_emit[:left] = last_emit[:n][keep]
    return left


def advance_numpy(
    state: NDArray[np.int64], n: int, lengths: NDArray[np.int64], trace_accepted: NDArray[np.int64],
    joint: NDArray[np.int64], gamma: int,
) -> tuple[NDArray[np.int64], int, bool, bool]:
    """Apply one step to slots 0..n-1 of the batch `state`; return what the engine reads next.

    Each request verifies lengths[i] drafts against the trace's accepted count at its row
    (`replay_step`), emits, and advances ROW, EMITTED and CONTEXT by the tokens emitted,
    STEPS by one, VERIFIED by ℓ and ACCEPTED by the drafts that count after the cut. When
    `joint` ((γ + 1)² counts, flat) is not empty, each (ℓ, accepted drafts) pair is counted
    in it at ℓ·(γ + 1) + accepted (the acceptance statistics ignore the output-length cut).

    Returns (accepted drafts per request before the cut, tokens emitted in all, whether
    any request finished, whether any unfinished one ran past its trace request's rows).
    """
    rows = state[ROW, :n]
    drafted_ok, emit = replay_step(lengths, trace_accepted[rows], state[OUT_LEN, :n] - state[EMITTED, :n])
    state[ROW : CONTEXT + 1, :n] += emit  # ROW, EMITTED, CONTEXT advance together
    state[STEPS, :n] += 1
    state[VERIFIED, :n] += lengths
    state[ACCEPTED, :n] += emit - 1
    if joint.size:
        joint += np.bincount(lengths * (gamma + 1) + drafted_ok, minlength=joint.size)
    done = state[EMITTED, :n] >= state[OUT_LEN, :n]
    past = ~done & (state[ROW, :n] >= state[ROW_END, :n])
    return drafted_ok, int(emit.sum()), bool(done.any()), bool(past.any())


def _theta_scan_loop(
    gains: NDArray[np.float64], tau_start: float, step_s: NDArray[np.float64], early_stop: bool
) -> tuple[int, float]:
    """The same walk as `theta_scan_numpy`, one admission at a time (compiled by numba)."""
    tau = tau_start
    best, best_k, best_tau = tau / step_s[0], 0, tau
    for i in range(gains.size):
        tau += gains[i]
        theta = tau / step_s[i + 1]
        if theta > best:
            best, best_k, best_tau = theta, i + 1, tau
        elif early_stop:
            break
    return best_k, best_tau


def _priced_scan_loop(
    gains: NDArray[np.float64], tau_start: float, dense: NDArray[np.float64], first: int, early_stop: bool,
    fixed_s: float, attn_token_s: float, attn_mem_s: float, prefill_tokens: float, drafts_s: float,
    base_tokens: int, chunk: int = 0,
) -> tuple[int, float]:
    """The same walk as `priced_scan_numpy`, pricing each B only when the walk reaches it
    (compiled by numba; `unpadded_extra_s`'s operations, in its order; `chunk` is not needed)."""
    varies = attn_token_s != 0.0 or drafts_s != 0.0
    tau = tau_start
    best, best_k, best_tau = 0.0, 0, tau
    for k in range(gains.size + 1):
        if k:
            tau += gains[k - 1]
        b = first + k
        step = dense[b] + fixed_s
        if varies:
            extra = 0.0
            if attn_token_s != 0.0:
                extra = max(attn_token_s * (float(b) - prefill_tokens) - attn_mem_s, 0.0)
            if drafts_s != 0.0:
                extra = extra + drafts_s * (1.0 if b > base_tokens else 0.0)
            step = step + extra
        theta = tau / step
        if k == 0:
            best = theta
        elif theta > best:
            best, best_k, best_tau = theta, k, tau
        elif early_stop:
            break
    return best_k, best_tau


# the compiled self of `_priced_scan_loop`, for `_stale_cut_loop` (bound in `numba_kernels`)
_priced_scan: Callable[..., tuple[int, float]] = _priced_scan_loop


def _snapshot_rows_loop(ids: NDArray[np.int64], stale_ids: NDArray[np.int64]) -> NDArray[np.int64]:
    """Return each current request's row in two-step's snapshot, or -1 if it joined since
    (compiled by numba, for the two loops below it; `_snapshot_rows` is its compiled self).

    Running requests' ids lie close together (ids are handed out in arrival order), so a
    table over their span maps each id to its snapshot row in two passes, no sort; a wide
    span (a long-running request among new ones) sorts and searches instead.
    """
    num, old = ids.size, stale_ids.size
    rows = np.full(num, -1, dtype=np.int64)
    if num == 0 or old == 0:
        return rows
    lo, hi = min(ids.min(), stale_ids.min()), max(ids.max(), stale_ids.max())
    if hi - lo < 16 * (num + old):
        where = np.full(hi - lo + 1, -1, dtype=np.int64)
        for j in range(old):
            where[stale_ids[j] - lo] = j
        for i in range(num):
            rows[i] = where[ids[i] - lo]
    else:
        order = np.argsort(stale_ids)
        sorted_ids = stale_ids[order]
        for i in range(num):
            p = min(np.searchsorted(sorted_ids, ids[i]), old - 1)
            if sorted_ids[p] == ids[i]:
                rows[i] = order[p]
    return rows


_snapshot_rows: Callable[[NDArray[np.int64], NDArray[np.int64]], NDArray[np.int64]] = _snapshot_rows_loop


def _snapshot_mean_loop(stale_survival: NDArray[np.float64]) -> NDArray[np.float64]:
    """Return the mean of two-step's snapshot rows (a joined request's stale row), summed first
    row to last (compiled by numba, for the two loops below; `_snapshot_mean` is its compiled self)."""
    mean = stale_survival[0].copy()
    for r in range(1, stale_survival.shape[0]):
        mean += stale_survival[r]
    mean /= stale_survival.shape[0]
    return mean


_snapshot_mean: Callable[[NDArray[np.float64]], NDArray[np.float64]] = _snapshot_mean_loop


def _stale_rows_loop(
    ids: NDArray[np.int64], stale_ids: NDArray[np.int64], stale_survival: NDArray[np.float64], fill: bool
) -> tuple[NDArray[np.float64], int]:
    """The same rows as `stale_rows_numpy`, matched one request at a time (compiled by numba)."""
    num, old = ids.size, stale_ids.size
    out = np.empty((num, stale_survival.shape[1]))
    if num == old and (ids == stale_ids).all():
        out[:] = stale_survival
        return out, num
    filled = 0
    for p in _snapshot_rows(ids, stale_ids):
        if p >= 0:
            out[filled] = stale_survival[p]
            filled += 1
    if fill and filled < num:
        mean = _snapshot_mean(stale_survival)
        for i in range(filled, num):
            out[i] = mean
    return out, filled


def _stale_path_loop(
    ranked: NDArray[np.float64], ids: NDArray[np.int64], stale_ids: NDArray[np.int64],
    stale_survival: NDArray[np.float64],
) -> NDArray[np.float64]:
    """The same path as `stale_path_numpy`, by editing the snapshot's sorted values `ranked`
    (compiled by numba): one pass drops the values of the rows whose request left (sorted,
    a few) and merges in the joined requests' mean row (γ values, each once per joined
    request). No sort of the R·γ values."""
    num, old = ids.size, stale_ids.size
    gamma = stale_survival.shape[1]
    if ranked.size != old * gamma:
        raise ValueError("stale_path: ranked does not hold the snapshot's every survival")
    if num == 0:
        return np.empty(0)
    stays = np.zeros(old, dtype=np.bool_)
    present = 0
    for p in _snapshot_rows(ids, stale_ids):
        if p >= 0:
            stays[p] = True
            present += 1
    gone = np.empty((old - present) * gamma)  # the values leaving, ascending
    g = 0
    for j in range(old):
        if not stays[j]:
            for c in range(gamma):
                gone[g] = stale_survival[j, c]
                g += 1
    gone.sort()
    joined = num - present
    mean = _snapshot_mean(stale_survival) if joined else np.zeros(gamma)  # `_stale_rows_loop`'s
    mean.sort()
    size = num * gamma
    # room for g more: a leaving value missing from `ranked` keeps a value too many (checked below)
    out = np.empty(size + g)
    # gone and mean read from the top; past the last, a value no survival equals (NaN) and one
    # none is below (-inf), so the loop tests each value twice, with no bounds of its own
    gi, mi = g - 1, gamma - 1 if joined else -1
    drop = gone[gi] if gi >= 0 else np.nan
    add = mean[mi] if mi >= 0 else -np.inf
    o = 0
    for x in ranked:
        if x == drop:
            gi -= 1
            drop = gone[gi] if gi >= 0 else np.nan
            continue
        while add > x:
            out[o : o + joined] = add
            o += joined
            mi -= 1
            add = mean[mi] if mi >= 0 else -np.inf
        out[o] = x
        o += 1
    while mi >= 0:
        out[o : o + joined] = mean[mi]
        o += joined
        mi -= 1
    if o != size:  # a leaving value missing from ranked: not the snapshot's own sort
        raise ValueError("stale_path: ranked is not the snapshot's survivals sorted")
    return out[:size]


# the compiled self of `_stale_path_loop`, for `_stale_cut_loop` (bound in `numba_kernels`)
_stale_path: Callable[..., NDArray[np.float64]] = _stale_path_loop


def _stale_cut_loop(
    ranked: NDArray[np.float64], ids: NDArray[np.int64], stale_ids: NDArray[np.int64],
    stale_survival: NDArray[np.float64], num_requests: int, max_tokens: int, dense: NDArray[np.float64],
    first: int, fixed_s: float, attn_token_s: float, attn_mem_s: float, prefill_tokens: float,
    drafts_s: float, base_tokens: int,
) -> int:
    """The same K as `stale_cut_numpy`, the compiled path and walk in one call (compiled by numba)."""
    path = _stale_path(ranked, ids, stale_ids, stale_survival)
    n = path.size
    while n > 0 and not path[n - 1] > 0.0:
        n -= 1
    n = max(0, min(n, max_tokens - first))
    if first + n >= dense.size:
        return -1
    return _priced_scan(path[:n], float(num_requests), dense, first, False, fixed_s, attn_token_s,
                        attn_mem_s, prefill_tokens, drafts_s, base_tokens)[0]


def _count_at_least_loop(survival: NDArray[np.float64], v: float) -> NDArray[np.int64]:
    """The same counts as `count_at_least_numpy`, one row at a time (compiled by numba).

    Every entry is compared, with no early exit: a row's count is where its run at or above v
    ends, a different place in each row, and a branch on it is mispredicted about once a row.
    """
    num_requests, gamma = survival.shape
    counts = np.empty(num_requests, dtype=np.int64)
    for r in range(num_requests):
        c = 0
        for j in range(gamma):
            c += survival[r, j] >= v
        counts[r] = c
    return counts


def _advance_loop(
    state: NDArray[np.int64], n: int, lengths: NDArray[np.int64], trace_accepted: NDArray[np.int64],
    joint: NDArray[np.int64], gamma: int,
) -> tuple[NDArray[np.int64], int, bool, bool]:
    """The same step as `advance_numpy`, one request at a time (compiled by numba)."""
    g1 = gamma + 1
    drafted_ok = np.empty(n, dtype=np.int64)
    emitted_total, any_done, any_past = 0, False, False
    for i in range(n):
        ell = lengths[i]
        ok = min(ell, trace_accepted[state[ROW, i]])  # the replay rule (sparksim.step.acceptance)
        emit = min(ok + 1, state[OUT_LEN, i] - state[EMITTED, i])
        drafted_ok[i] = ok
        state[ROW, i] += emit
        state[EMITTED, i] += emit
        state[CONTEXT, i] += emit
        state[STEPS, i] += 1
        state[VERIFIED, i] += ell
        state[ACCEPTED, i] += emit - 1
        emitted_total += emit
        if joint.size:
            joint[ell * g1 + ok] += 1
        if state[EMITTED, i] >= state[OUT_LEN, i]:
            any_done = True
        elif state[ROW, i] >= state[ROW_END, i]:
            any_past = True
    return drafted_ok, emitted_total, any_done, any_past


def _verified_loop(lengths: NDArray[np.int64], max_length: int) -> int:
    """The same as `verified_numpy`, in one pass (compiled by numba)."""
    total = 0
    for ell in lengths:
        if ell < 0 or ell > max_length:
            return -1
        total += ell
    return total


def _compact_loop(state: NDArray[np.int64], last_emit: NDArray[np.float64], n: int, gone: NDArray[np.intp]) -> int:
    """The same removal as `compact_numpy`, one column at a time from the first slot to go (compiled by numba)."""
    w = gone[0] if gone.size else n
    g = 0
    for i in range(w, n):
        if g < gone.size and gone[g] == i:
            g += 1
            continue
        for f in range(state.shape[0]):
            state[f, w] = state[f, i]
        last_emit[w] = last_emit[i]
        w += 1
    return w


class Kernels(NamedTuple):
    """One backend's kernels."""

    theta_scan: Callable[..., Any]
    count_at_least: Callable[..., Any]
    advance: Callable[..., Any]
    priced_scan: Callable[..., Any]
    stale_rows: Callable[..., Any]
    verified: Callable[..., Any]
    stale_path: Callable[..., Any]
    compact: Callable[..., Any]
    stale_cut: Callable[..., Any]


NUMPY = Kernels(theta_scan_numpy, count_at_least_numpy, advance_numpy, priced_scan_numpy, stale_rows_numpy,
                verified_numpy, stale_path_numpy, compact_numpy, stale_cut_numpy)

# Whether numba is installed, found without importing it: importing numba loads LLVM
# (about 0.3 s and 60 MB), which a command that never steps an engine should not pay.
HAVE_NUMBA = importlib.util.find_spec("numba") is not None


@functools.cache
def numba_kernels() -> Kernels:
    """Return the numba-compiled kernels (imports numba; each compiles on its first call
    for each array layout, about 0.5 s, and is cached on disk beside this file)."""
    import numba

    global _snapshot_rows, _snapshot_mean, _priced_scan, _stale_path
    jit = numba.njit(cache=True, nogil=True)
    _snapshot_rows = jit(_snapshot_rows_loop)  # the loops below call them compiled
    _snapshot_mean = jit(_snapshot_mean_loop)
    _priced_scan = jit(_priced_scan_loop)  # kernels themselves, and `_stale_cut_loop`'s parts
    _stale_path = jit(_stale_path_loop)
    return Kernels(jit(_theta_scan_loop), jit(_count_at_least_loop), jit(_advance_loop), _priced_scan,
                   jit(_stale_rows_loop), jit(_verified_loop), _stale_path, jit(_compact_loop),
                   jit(_stale_cut_loop))


def _on_first_call(name: str) -> Callable[..., Any]:
    """Return a stand-in for kernel `name` that binds the numba kernels, then runs."""

    def first_call(*args: Any) -> Any:
        use("numba")
        return getattr(numba_kernels(), name)(*args)

    return first_call


# Loading numba and its cached kernels costs about 0.6 s per process; each compiled call
# saves 5-13 µs over its numpy twin (advance 12 µs at R = 32-256, theta_scan 6-10 µs,
# count_at_least 5 µs; 2026-12-01, EPYC VM). So it pays from roughly this many calls: a plain
# decoding step makes one (advance), a policy's step several, and a short run finishes on
# the numpy twins while a long one switches once it gets here (same results).
WARM_CALLS = 60_000
_calls_made = 0


def _warming(name: str) -> Callable[..., Any]:
    """Return a stand-in for kernel `name`: the numpy twin until WARM_CALLS kernel calls, then numba."""
    twin = getattr(NUMPY, name)

    def call(*args: Any) -> Any:
        global _calls_made
        _calls_made += 1
        if _calls_made >= WARM_CALLS:
            use("numba")
        return twin(*args)

    return call


theta_scan: Callable[[NDArray[np.float64], float, NDArray[np.float64], bool], tuple[int, float]]
count_at_least: Callable[[NDArray[np.float64], float], NDArray[np.int64]]
advance: Callable[
    [NDArray[np.int64], int, NDArray[np.int64], NDArray[np.int64], NDArray[np.int64], int],
    tuple[NDArray[np.int64], int, bool, bool],
]
priced_scan: Callable[..., tuple[int, float]]
stale_rows: Callable[[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64], bool], tuple[NDArray[np.float64], int]]
verified: Callable[[NDArray[np.int64], int], int]
stale_path: Callable[
    [NDArray[np.float64], NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]], NDArray[np.float64]
]
compact: Callable[[NDArray[np.int64], NDArray[np.float64], int, NDArray[np.intp]], int]
stale_cut: Callable[..., int]
# Whether the compiled kernels run now (a caller may pick the cheaper way to use them: two-step
# sorts every snapshot for `stale_path` to edit only then); False until numba is bound.
COMPILED = False
_CHOICE = os.environ.get("SPARKSIM_KERNELS", "").lower()
if HAVE_NUMBA and _CHOICE == "numba":  # asked for: bind (and load) numba on the first call
    BACKEND = "numba"
    theta_scan, count_at_least, advance, priced_scan, stale_rows, verified, stale_path, compact, stale_cut = (_on_first_call(name) for name in Kernels._fields)
elif HAVE_NUMBA and _CHOICE != "numpy":  # the default: numpy first, numba once it pays
    BACKEND = "numba"
    theta_scan, count_at_least, advance, priced_scan, stale_rows, verified, stale_path, compact, stale_cut = (_warming(name) for name in Kernels._fields)
else:
    BACKEND = "numpy"
    theta_scan, count_at_least, advance, priced_scan, stale_rows, verified, stale_path, compact, stale_cut = NUMPY


def use(backend: str) -> None:
    """Switch the kernels to `backend` ("numba" or "numpy"), e.g. to compare the two."""
    global theta_scan, count_at_least, advance, priced_scan, stale_rows, verified, stale_path, compact, stale_cut, BACKEND, COMPILED
    if backend == "numpy":
        theta_scan, count_at_least, advance, priced_scan, stale_rows, verified, stale_path, compact, stale_cut = NUMPY
    elif backend == "numba" and HAVE_NUMBA:
        theta_scan, count_at_least, advance, priced_scan, stale_rows, verified, stale_path, compact, stale_cut = numba_kernels()
    else:
        raise ValueError(f"kernel backend {backend!r} is not available (numba installed: "
                         f"{HAVE_NUMBA}); use 'numba' or 'numpy'")
    BACKEND = backend
    COMPILED = backend == "numba"
