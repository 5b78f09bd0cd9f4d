"""`argmax`: Algorithm 1's path without the early stop; the best Θ anywhere on it.

Rule: rank every (r, j) by survival descending (ties as in greedy), evaluate Θ = τ · SPS(B)
after each admission along the whole path, and cut where Θ is largest (the shortest cut
on ties). Paper: the "retrospective global search" of §3.2.2 and Appendix A.

NOT lossless: a_{r,k+1} depends on the sampled x_{r,k}, and a high a_{r,k+1} can lift a
later Θ enough to admit x_{r,k} itself, so the sampled token leaks into its own
admission (App. A: a target distribution (0.7, 0.3) comes out as (0.85, 0.15)). Carry it
as an optimistic reference, never as a legal policy.
"""

from __future__ import annotations

from sparksim.policies.base import Lengths, Policy, StepBatch
from sparksim.policies.path import CostTable, batch_path, top_k_lengths


class Argmax(Policy):
    name = "argmax"
    rule = "cut the survival-sorted path where Θ peaks, no early stop (NOT lossless)"
    lossless = False
    paper = "§3.2.2 retrospective search; App. A counterexample"

    def __init__(self, block: int) -> None:
        super().__init__(block)
        self._table = CostTable()

    def decide(self, batch: StepBatch) -> Lengths:
        path = batch_path(batch, self._table)
        return top_k_lengths(batch.survival, path.best_cut(), path.ranked)
