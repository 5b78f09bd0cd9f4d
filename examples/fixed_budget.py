"""A worked example of your own verification policy: a fixed verification budget per request.

Rule: each step verifies the `per_request` × R drafts with the highest survivals across the
batch (R requests), so the step sends B = R + per_request · R tokens whatever the load.
It is what a static γ would be if the drafts went where they are most likely accepted.

Lossless: the number of admissions K = per_request · R is fixed before the step's drafts
exist, and the top K of survivals that are non-increasing along each request's block is a
prefix of every request's block, so admitting x_{r,k} never depends on a_{r,k+1} (the same
argument as two-step's fill, DSpark §5.2).

Run it:   sparksim run --policy examples/fixed_budget.py:FixedBudget --set policy.per_request=3 --check
Bias lab: sparksim bias --policy examples/fixed_budget.py:FixedBudget:per_request=1
docs/writing-a-policy.md walks through every line.
"""

from __future__ import annotations

from typing import Any

from sparksim.policies.base import Lengths, Policy, StepBatch, check_int
from sparksim.policies.path import cap_lengths, top_k_lengths


class FixedBudget(Policy):
    name = "fixed-budget"
    rule = "verify the per_request·R highest-survival drafts of the batch"
    lossless = True
    paper = "examples/fixed_budget.py (a worked example)"

    def __init__(self, block: int, per_request: int = 2) -> None:
        super().__init__(block)
        # validate at the boundary: a bad value names the parameter (ConfigError)
        self.per_request = check_int("per_request", per_request, 0, block)

    @property
    def params(self) -> dict[str, Any]:
        return {"per_request": self.per_request}  # recorded in summary.json and the label

    def decide(self, batch: StepBatch) -> Lengths:
        k = self.per_request * batch.num_requests
        lengths = top_k_lengths(batch.survival, k)  # (R,) prefixes of each block
        return cap_lengths(batch, lengths)  # never over the engine's token limit (INV-2)
