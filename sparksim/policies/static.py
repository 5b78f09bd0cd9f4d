"""`static` (MTP-γ): verify the same γ drafts for every request, every step.

Rule: ℓ_r = γ for all r. γ = 1 is DeepSeek's former production MTP-1; γ = 0 is plain
decoding (no drafter runs, no draft cost). Lossless: the rule reads no confidence at all.
Paper: the baseline of §5.4 (DSpark-5 vs MTP-1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparksim.policies.base import Lengths, Policy, StepBatch, check_int


class Static(Policy):
    name = "static"
    rule = "ℓ_r = γ for every request (MTP-γ); γ = 0 is plain decoding"
    lossless = True
    paper = "§5.4 baseline (MTP-1)"

    def __init__(self, block: int, gamma: int = 1) -> None:
        super().__init__(block)
        self.gamma = check_int("gamma", gamma, 0, block)

    @property
    def draft_positions(self) -> int:
        return self.gamma  # MTP-γ drafts γ positions; γ = 0 runs no drafter

    @property
    def params(self) -> dict[str, Any]:
        return {"gamma": self.gamma}

    def decide(self, batch: StepBatch) -> Lengths:
        return np.full(batch.num_requests, self.gamma, dtype=np.int64)
