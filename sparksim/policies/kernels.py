"""The two loops along the path that numpy cannot fuse: the Θ walk and the fill's row counts.

`theta_scan` walks Θ_k = τ_k / step_s[k] with τ_0 = `tau_start` and τ_k = τ_{k-1} + gains[k-1]
(summed left to right, as Algorithm 1 admits them) and returns either the first k after
which Θ stops rising (greedy) or the smallest k maximising it (argmax, two-step). In numpy
that is a cumulative sum, a division and an argmax, three passes over R·γ values at about
1 µs of call overhead each, on top of a cumulative sum as slow as the sort itself; one
compiled loop does it in one pass. `count_at_least` counts, per request, the survivals at
or above the fill's threshold: a reduction along the short γ axis, which numpy does slowly.

Each kernel exists twice. The numba versions (the `fast` extra) run when numba imports and
`SPARKSIM_KERNELS` is not `numpy`; the numpy versions run otherwise. Both give bit-identical
results: the same additions in the same order, the same divisions, the same tie rule
(tests/test_policies_kernels.py draws inputs and compares them). Policies call them as
`kernels.theta_scan(...)`, looked up at call time, so a test can swap the backend.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

_TAU_HEAD = np.zeros(1)


def theta_scan_numpy(
    gains: NDArray[np.float64], tau_start: float, step_s: NDArray[np.float64], early_stop: bool
) -> tuple[int, float]:
    """Return (k, τ_k): the cut along `gains` (n values) priced by `step_s` (n + 1 values).

    early_stop: k is the first index whose successor does not raise Θ (n if every
    admission raises it); otherwise k is the smallest index of Θ's maximum. τ_k lets a
    caller that walks a long path in pieces carry τ into the next piece.
    """
    head = _TAU_HEAD.copy()
    head[0] = tau_start
    tau = np.concatenate((head, gains)).cumsum()  # τ_0 .. τ_n, left to right from τ_0
    theta = tau / step_s
    if early_stop:
        worse = theta[1:] <= theta[:-1]
        stop = int(worse.argmax()) if worse.size else 0
        k = stop if worse.size and worse[stop] else gains.size
    else:
        k = int(theta.argmax())
    return k, float(tau[k])


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


def _count_at_least_loop(survival: NDArray[np.float64], v: float) -> NDArray[np.int64]:
    """The same counts as `count_at_least_numpy`, one row at a time (compiled by numba).

    Rows are non-increasing (survivals are products of confidences in [0, 1]), so a row's
    count is its leading run at or above v and the walk stops at the first entry below.
    """
    num_requests, gamma = survival.shape
    counts = np.zeros(num_requests, dtype=np.int64)
    for r in range(num_requests):
        for j in range(gamma):
            if survival[r, j] < v:
                break
            counts[r] += 1
    return counts


def _compile() -> tuple[str, Callable[..., Any] | None, Callable[..., Any] | None]:
    if os.environ.get("SPARKSIM_KERNELS", "").lower() == "numpy":
        return "numpy", None, None
    try:
        import numba
    except ImportError:
        return "numpy", None, None
    # Compiled on first call for each array layout (≈0.5 s), cached on disk beside this file.
    jit = numba.njit(cache=True, nogil=True)
    return "numba", jit(_theta_scan_loop), jit(_count_at_least_loop)


BACKEND, numba_theta_scan, numba_count_at_least = _compile()

theta_scan: Callable[[NDArray[np.float64], float, NDArray[np.float64], bool], tuple[int, float]]
count_at_least: Callable[[NDArray[np.float64], float], NDArray[np.int64]]
theta_scan = numba_theta_scan or theta_scan_numpy
count_at_least = numba_count_at_least or count_at_least_numpy


def use(backend: str) -> None:
    """Switch the kernels to `backend` ("numba" or "numpy"), e.g. to compare the two."""
    global theta_scan, count_at_least, BACKEND
    if backend == "numpy":
        theta_scan, count_at_least = theta_scan_numpy, count_at_least_numpy
    elif backend == "numba" and numba_theta_scan is not None and numba_count_at_least is not None:
        theta_scan, count_at_least = numba_theta_scan, numba_count_at_least
    else:
        raise ValueError(f"kernel backend {backend!r} is not available (numba installed: "
                         f"{numba_theta_scan is not None}); use 'numba' or 'numpy'")
    BACKEND = backend
