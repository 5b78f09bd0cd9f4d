"""The engine's checks inside a step: a policy's answer (every step) and INV-1/INV-2 (`--check`).

A policy's answer is checked before any kernel sees it, whatever `--check` says: a kernel
indexes the trace by ℓ, so an out-of-range ℓ would read (numpy) or write (numba) out of
bounds. The INV-1 replay check reads the trace, not the kernel that replayed it, so a
broken replay rule cannot agree with itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sparksim.errors import PolicyError
from sparksim.sim.invariants import InvariantError
from sparksim.step import kernels
from sparksim.step.batch_layout import EMITTED, OUT_LEN, ROW, ROW_END


def short(values: NDArray[Any]) -> str:
    """A policy's answer for an error message, cut to a readable length."""
    text = np.array2string(values.ravel()[:16], separator=",")
    return text + (" ..." if values.size > 16 else "")


def answer_lengths(answer: Any, m: int, max_length: int, who: Callable[[], str]) -> tuple[NDArray[np.int64], int]:
    """Return a policy's answer as ℓ and Σℓ, or raise PolicyError naming the policy, step (`who`) and value.

    ℓ must be an (m,) array of integers in 0..`max_length` (the positions drafted); the
    bounds and the sum are one pass (`kernels.verified`, which reads ℓ and indexes nothing).
    """
    lengths = answer if isinstance(answer, np.ndarray) else np.asarray(answer)
    if lengths.shape != (m,) or lengths.dtype.kind not in "iu":
        raise PolicyError(f"{who()} returned {lengths.dtype} of shape {lengths.shape} (must be "
                          f"integers of shape ({m},), one per request): {short(lengths)}")
    if lengths.dtype != np.int64:
        lengths = lengths.astype(np.int64)
    verified = kernels.verified(lengths, max_length)
    if verified < 0:
        bad = lengths[(lengths < 0) | (lengths > max_length)]
        raise PolicyError(f"{who()} returned ℓ = {int(bad[0])} (must be in 0..{max_length}, "
                          f"the positions drafted): {short(lengths)}")
    return lengths, verified


def check_tokens(lengths: NDArray[np.int64], fixed: int, max_tokens: int, who: Callable[[], str]) -> None:
    """INV-2 for one step: its `fixed` tokens plus the verified drafts within the engine's limit."""
    tokens = fixed + int(lengths.sum())
    if tokens > max_tokens:
        raise InvariantError(f"INV-2: {who()} sent B={tokens} tokens, over the engine's limit {max_tokens}")


def check_replay(trace_accepted: NDArray[np.int64], rows: NDArray[np.int64], lengths: NDArray[np.int64],
                 drafted_ok: NDArray[np.int64], emitted: int, step: int) -> None:
    """INV-1 for one step, read from the trace: each request at trace row `rows[i]` accepts
    min(ℓ, the trace's accepted) drafts and emits that plus one, cut only by its output length."""
    want = np.minimum(lengths, trace_accepted.take(rows))
    if not np.array_equal(drafted_ok[: rows.size], want):
        raise InvariantError(f"INV-1: step {step} accepted {drafted_ok[: rows.size].tolist()} "
                             f"drafts where the trace says {want.tolist()}")
    if emitted > int(want.sum()) + rows.size:
        raise InvariantError(f"INV-1: step {step} emitted {emitted} tokens, more than "
                             f"the {int(want.sum()) + rows.size} its replay allows")


def check_quiet(state: NDArray[np.int64], m: int, step: int) -> None:
    """The engine skipped a step's finish checks (`Engine._advance_plain`): none may be due."""
    due = (state[EMITTED, :m] >= state[OUT_LEN, :m]) | (state[ROW, :m] >= state[ROW_END, :m])
    if due.any():
        raise InvariantError(f"step {step}: slot {int(np.flatnonzero(due)[0])} finished or ran past its "
                             "trace rows in a step the engine counted as quiet (a slot move did not "
                             "reset Engine._quiet)")
