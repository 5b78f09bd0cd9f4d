"""`dynamic-sd`: vLLM V1 Dynamic SD, one k per batch size from average per-position acceptance.

Rule (vLLM PR #32374, `vllm/v1/spec_decode/dynamic/manager.py`): for the step's batch
size R choose k* = argmax over k = 0..max_k of (1 + Σ_{i<k} s_i) / step_s(R·(1 + k) + the
other fixed tokens), a full scan without early stop (the smallest k on ties), and verify
k* drafts for every request. s_i is the running unconditional survival at position i:
verified-and-accepted over verified drafts at that position, counted from live steps
once `warmup` steps (10) have passed; before a position has counts, s_i is the initial
value `acceptance`^(i+1) (vLLM starts from profiled values). The step costs come from the
profile (vLLM's offline `batch_stats[bs][K]` table), so one k per batch size.

Lossless: k depends on R and on past steps' acceptances only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from sparksim.policies.base import Lengths, Policy, StepBatch, check_float, check_int
from sparksim.policies.path import CostTable


class DynamicSD(Policy):
    name = "dynamic-sd"
    rule = "one k per batch size: argmax of mean per-position acceptance over the step table"
    lossless = True
    paper = "vLLM V1 Dynamic SD (PR #32374)"

    def __init__(
        self, block: int, acceptance: float = 0.7, warmup: int = 10, max_k: int | None = None
    ) -> None:
        super().__init__(block)
        self.acceptance = check_float("acceptance", acceptance, 0.0, 1.0)
        self.warmup = check_int("warmup", warmup, 0)
        self.max_k = check_int("max_k", block if max_k is None else max_k, 0, block)
        self._table = CostTable()
        self._steps_seen = 0
        self._num_verified = np.zeros(block, dtype=np.int64)  # per position, after warm-up
        self._num_accepted = np.zeros(block, dtype=np.int64)

    @property
    def params(self) -> dict[str, Any]:
        return {"acceptance": self.acceptance, "warmup": self.warmup, "max_k": self.max_k}

    def survival_per_pos(self) -> NDArray[np.float64]:
        """Return the current estimate of unconditional survival s_i per position, shape (γ,)."""
        initial = self.acceptance ** np.arange(1, self.block + 1, dtype=np.float64)
        seen = self._num_verified > 0
        live = self._num_accepted / np.maximum(self._num_verified, 1)
        return np.where(seen, live, initial)

    def decide(self, batch: StepBatch) -> Lengths:
        r = batch.num_requests
        k_fit = (batch.max_tokens - batch.fixed_tokens) // r if r else 0
        k_max = max(0, min(self.max_k, batch.gamma, k_fit))
        tau = 1.0 + np.concatenate([[0.0], np.cumsum(self.survival_per_pos()[:k_max])])
        stride = max(r, 1)  # B = R·(1 + k) + the other fixed tokens
        step_s = self._table.step_s(batch.cost, batch.fixed_tokens, stride * k_max + 1)[::stride]
        k = int((tau / step_s).argmax())  # the smallest k on ties
        return np.full(r, k, dtype=np.int64)

    def observe(self, batch: StepBatch, lengths: Lengths, num_accepted: NDArray[np.int64]) -> None:
        self._steps_seen += 1
        if self._steps_seen <= self.warmup:
            return
        pos = np.arange(self.block)[:, None]  # (γ, 1)
        self._num_verified += (lengths[None, :] > pos).sum(axis=1)
        self._num_accepted += (num_accepted[None, :] > pos).sum(axis=1)
