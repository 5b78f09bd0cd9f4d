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


class Negative(Policy):
    """Verifies −1 drafts: the kernels would index the trace backwards."""

    name = "negative"
    rule = "ℓ = −1 (invalid on purpose)"
    lossless = True

    def decide(self, batch: StepBatch) -> Lengths:
        return np.full(batch.num_requests, -1, dtype=np.int64)


class WrongShape(Policy):
    """Answers for one request more than the batch holds: the kernels would write past it."""

    name = "wrong-shape"
    rule = "R + 1 lengths (invalid on purpose)"
    lossless = True

    def decide(self, batch: StepBatch) -> Lengths:
        return np.ones(batch.num_requests + 1, dtype=np.int64)


class Floats(Policy):
    """Answers fractional lengths: a silent cast would verify what the policy never chose."""

    name = "floats"
    rule = "ℓ = 1.5 (invalid on purpose)"
    lossless = True

    def decide(self, batch: StepBatch) -> Lengths:
        return np.full(batch.num_requests, 1.5)  # type: ignore[return-value]


class ListOfInts(Policy):
    """Answers a plain list of valid integers: accepted, as any sequence of integers is."""

    name = "list-of-ints"
    rule = "ℓ = 1 as a Python list"
    lossless = True

    def decide(self, batch: StepBatch) -> Lengths:
        return [1] * batch.num_requests  # type: ignore[return-value]


class NoPositions(Policy):
    """Drafts every step but says a pass-based drafter drafts no position: must be refused."""

    name = "no-positions"
    rule = "positions_at = 0 (invalid on purpose)"
    lossless = True

    def positions_at(self, requests: int) -> int:
        return 0

    def decide(self, batch: StepBatch) -> Lengths:
        return np.zeros(batch.num_requests, dtype=np.int64)
