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

from sparksim.policies.base import Lengths, Policy, StepBatch
from sparksim.policies.path import CostTable, batch_path, top_k_lengths


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
        path = batch_path(batch, self._table)
        cut = path.greedy_cut(self._chunk)
        self._chunk = max(64, 2 * cut + 2)
        return top_k_lengths(batch.survival, cut, path.ranked)
