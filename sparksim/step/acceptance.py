"""The replay rule: what a verification step emits, given the trace's recorded acceptance.

A request at trace position t verifying ℓ drafts accepts min(ℓ, accepted[t]) of them and
emits one more token (the correction after a rejection, or the bonus after a full accept),
then moves to position t + emitted. The last step of a request is cut at its output length.
Exact at temperature 0; at temperature > 0 each step's statistics are exact for lossless
schedules and the step-to-step coupling is approximate (docs/design.md §3).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def replay_step(
    lengths: NDArray[np.int64], accepted: NDArray[np.int64], remaining: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Return (accepted drafts, emitted tokens) per request for one step (INV-1).

    `lengths` (R,) drafts verified, `accepted` (R,) the trace's accepted count at each
    request's position, `remaining` (R,) tokens each request still has to emit (≥ 1).
    The accepted drafts are the verifier's outcome, min(ℓ, accepted), before the cut;
    the tokens that count after the cut are `emit - 1` of them.
    """
    acc = np.minimum(lengths, accepted)
    return acc, np.minimum(acc + 1, remaining)
