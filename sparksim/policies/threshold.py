"""`threshold`: DeepSpec's evaluation mode, cut at the first low per-step confidence.

Rule: ℓ_r = the number of leading positions before the first j whose *conditional*
confidence c_{r,j} is below t (not the cumulative survival); t = 0 verifies all γ. When
the lengths overflow the engine's token limit, the lowest-survival admissions are
trimmed first. Source: DeepSpec `--confidence-threshold` (`draft_ops.py`), swept in the
paper's Fig. 5 (t = 0.0 .. 0.8); not a throughput scheduler, it ignores SPS.

Lossless: admitting x_{r,k} reads c_{r,1..k}, and c_{r,k} depends on x_{r,k-1}, never on
x_{r,k} itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparksim.policies.base import Lengths, Policy, StepBatch, check_float
from sparksim.policies.path import cap_lengths


class Threshold(Policy):
    name = "threshold"
    rule = "verify up to the first draft whose per-step confidence is below t (DeepSpec eval)"
    lossless = True
    paper = "DeepSpec --confidence-threshold; Fig. 5"

    def __init__(self, block: int, t: float = 0.5) -> None:
        super().__init__(block)
        self.t = check_float("t", t, 0.0, 1.0)

    @property
    def params(self) -> dict[str, Any]:
        return {"t": self.t}

    def decide(self, batch: StepBatch) -> Lengths:
        low = batch.conf < self.t  # (R, γ)
        first_low = low.argmax(axis=1)
        lengths = np.where(low.any(axis=1), first_low, batch.gamma).astype(np.int64)
        return cap_lengths(batch, lengths)
