"""Deliberately odd policies used by the invariant tests (loaded as user plug-ins)."""

from __future__ import annotations

import numpy as np

from sparksim.policies.base import Lengths, Policy, StepBatch


class TooLong(Policy):
    """Verifies one more draft than the block holds: must trip INV-2."""

    name = "too-long"
    rule = "ℓ = γ + 1 (invalid on purpose)"
    lossless = True

    def decide(self, batch: StepBatch) -> Lengths:
        return np.full(batch.num_requests, batch.gamma + 1, dtype=np.int64)


class NeverDraft(Policy):
    """Plain decoding through the plug-in path: must match static γ = 0 byte for byte (INV-6)."""

    name = "never-draft"
    rule = "no drafter, ℓ = 0"
    lossless = True

    @property
    def drafts(self) -> bool:
        return False

    def decide(self, batch: StepBatch) -> Lengths:
        return np.zeros(batch.num_requests, dtype=np.int64)
