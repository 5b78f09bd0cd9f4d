"""`greedy`: the paper's Algorithm 1, the Hardware-Aware Prefix Scheduler with early stop.

Rule: rank every drafted token (r, j) by survival a_{r,j} descending (ties: lower j, then
lower request index); start from ℓ = 0, B = fixed tokens (R bonus slots + prefill
chunks), τ = R; admit candidates one at a time and stop at the first admission that does
not raise Θ = τ · SPS(B), SPS including the draft cost. Paper: §3.2.2, Algorithm 1.

Lossless: whether (r, k) is admitted depends only on the candidates ranked at or above
it, and a_{r,k+1..γ} always rank below a_{r,k}; so x_{r,k}, which a_{r,k+1} depends on,
never influences its own admission (paper App. A; INV-8). Optimal when Θ is unimodal
along the path; on a jagged SPS it can stop at a local maximum before a cliff.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from sparksim.policies.base import Lengths, Policy, StepBatch
from sparksim.policies.path import CostTable, batch_path, path_length, sorted_head, top_k_lengths


class Greedy(Policy):
    name = "greedy"
    rule = "admit drafts by survival, stop at the first one that does not raise Θ (Alg. 1)"
    lossless = True
    paper = "§3.2.2 Algorithm 1"

    def __init__(self, block: int) -> None:
        super().__init__(block)
        self._table = CostTable()
        self._chunk = 64  # first pass of the scan: twice the last stop, so one pass usually

    def decide(self, batch: StepBatch) -> Lengths:
        head = self._head_cut(batch)
        if head is None:
            path = batch_path(batch, self._table)
            cut, ranked = path.greedy_cut(self._chunk), path.ranked
        else:
            cut, ranked = head
        self._chunk = max(64, 2 * cut + 2)
        return top_k_lengths(batch.survival, cut, ranked)

    def _head_cut(self, batch: StepBatch) -> tuple[int, NDArray[np.float64]] | None:
        """Alg. 1's cut over the path's first `_chunk` candidates alone, with those candidates
        ranked; None if it may need more.

        The walk stops at the first admission that does not raise Θ, usually well inside
        twice the last step's stop (`_chunk`): the largest `_chunk` + 1 survivals
        (`sorted_head`, the same floats as the whole sort's first ones) are the path's head,
        so the sort of all R·γ is skipped. The cut is the whole walk's when the walk stops
        inside the head or the token cap ends the path there; a walk that runs through the
        head, a head holding a zero survival (the path's length would need them counted) or a
        step-cost table not yet covering the whole path (the whole walk would grow it, and a
        strict profile raise) go to the whole sort.
        """
        survival, cost = batch.survival, batch.cost
        head = self._chunk + 1  # one past the walk: the fill reads the value after the cut
        if cost.shaped or 4 * head > survival.size:
            return None  # a small batch sorts faster than it partitions
        fixed = batch.fixed_tokens
        longest = path_length(survival.size, fixed, batch.max_tokens)  # the path's length at most
        if not self._table.covers(cost.profile, fixed + longest + 1):
            return None
        ranked = sorted_head(survival, head)
        if not ranked[-1] > 0.0:
            return None
        walk = min(longest, head - 1)
        cut = self._table.scan(cost, fixed, ranked[:walk], float(batch.num_requests), True, self._chunk)[0]
        if cut == walk < longest:
            return None  # every admission in the head raised Θ: the stop lies further on
        return cut, ranked
