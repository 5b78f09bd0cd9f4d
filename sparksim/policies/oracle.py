"""`oracle`: verifies only drafts the target will accept, as many as pays by realised Θ.

Rule: with A = Σ_r accepted_r realised acceptances this step (from the trace), every
verified accepted draft is worth exactly one token, so the step's realised throughput
after verifying n of them is Θ(n) = (R + n) / step_s(fixed + n). The oracle takes the n
in 0..A (within the token cap) that maximises it, the smallest on ties, and spreads the
n slots over the accepted prefixes position by position (all requests' first accepted
draft, then their second, ...; ties by request index). When Θ is largest with every
accepted draft verified, ℓ_r = accepted_r exactly; on a jagged SPS it may stop at a
graph size, or verify nothing when drafting does not pay.

An upper bound, not a policy: it reads `StepBatch.accepted`, the outcome no engine knows
before verifying (reads_outcome, upper_bound). Not lossless. Source: the testbed's
reference ceiling (docs/design.md §1), not the paper.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from sparksim.errors import ConfigError
from sparksim.policies.base import Lengths, Policy, StepBatch
from sparksim.policies.path import CostTable, Path, path_length


class Oracle(Policy):
    name = "oracle"
    rule = "verify only drafts that will be accepted, as many as maximise realised Θ (UPPER BOUND)"
    lossless = False
    paper = "testbed upper bound (reads realised acceptances)"
    upper_bound = True
    reads_outcome = True

    def __init__(self, block: int) -> None:
        super().__init__(block)
        self._table = CostTable()

    def decide(self, batch: StepBatch) -> Lengths:
        if batch.accepted is None:
            raise ConfigError("policy 'oracle' needs the realised acceptances (StepBatch.accepted)")
        accepted = np.clip(batch.accepted, 0, batch.gamma)  # (R,)
        n_max = path_length(int(accepted.sum()), batch.fixed_tokens, batch.max_tokens)
        # Every verified draft passes: a path of n_max gains of exactly 1.
        path = Path.build(
            np.ones(n_max), n_max, batch.num_requests, batch.fixed_tokens, batch.cost, self._table,
            survival=(np.arange(batch.gamma) < accepted[:, None]).astype(np.float64),  # (R, γ)
        )
        return fill_by_position(accepted, path.best_cut())


def fill_by_position(accepted: NDArray[np.int64], n: int) -> Lengths:
    """Return ℓ ≤ accepted holding n slots, filled level by level.

    Every request's first accepted draft, then every second one, ...; within a level,
    lower request index first. This is the path order over survivals that are 1 on accepted drafts (ties: lower j,
    then lower r), without sorting R·γ equal values.
    """
    levels = np.arange(int(accepted.max(initial=0)))  # (J,)
    per_level = (accepted[None, :] > levels[:, None]).sum(axis=1)  # (J,) requests reaching j+1
    full = int(np.searchsorted(np.cumsum(per_level), n, side="right"))  # levels fully filled
    left = n - int(per_level[:full].sum())  # slots in the partial level `full`
    lengths = np.minimum(accepted, full)
    reach = accepted > full
    return lengths + (reach & (np.cumsum(reach) <= left))
