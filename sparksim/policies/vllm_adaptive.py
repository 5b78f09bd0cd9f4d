"""`vllm-adaptive`: vLLM's DSpark adaptive verification as merged (PR #47808).

Source: vllm-project/vllm, `vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`,
release v0.33.0 (g4ba787ec9; the rule is unchanged from v0.28.0, the first release with it):
`get_num_tokens` l.305-373 (the budget), `reallocate_drafts` l.415-488 (the allocation),
`record_confidences` l.279-303 (the double buffer), `build_cost_tables_from_curves` l.80-128.

Rule, each step:
- Budget K from the *previous* block's confidences (the CPU double buffer, one
  `record_confidences` behind: `lag` 1); a request the buffer does not hold counts as 1.0
  at every position. Survivals sorted descending; τ(m) = S + Σ_{k<m} a_(k) with S the
  requests that sample (every decode request); cost(m) = draft_ms[R] + verify_ms[N + m],
  N the step's non-draft tokens (bonus slots and prompt chunks). K = the global argmax of
  τ(m) / cost(m) over m = 0..M (np.argmax: the smallest K on a tie; no early stop), M the
  candidates the rejection sampler's logit limit (here the engine's token cap) admits.
- Allocation: the K slots go to the top-K of this block's *fresh* survivals (ties: lower
  position, then lower request, as the earlier Triton kernel broke them).
- No EMA (the PR text's `adaptive_verification_ema_alpha` shipped in no release), no
  per-request minimum, no calibration. Without profiled costs vLLM refuses to start, so
  there is no flat table: `table` is `exact` (sparksim's price, the default), `profiled`
  (whole steps at B = R·(γ+1) on the profilers' request grid at
  VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN = 8,192 tokens of context, a step function
  between them: vLLM's start-up tables time the captured sizes and split draft from verify,
  which this approximates) or a vLLM-Ascend cost-profile file.

Lossless: K reads only the previous block's confidences and this step's shape; the fresh
survivals only rank slots within K (the paper's two-step split, §5.2; `lag=0` sizes K from
the fresh block, the argmax rule, and is flagged not lossless).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparksim.policies.base import Lengths, Policy, StepBatch, check_int
from sparksim.policies.engine_common import (
    PlannerTable,
    StaleConfidences,
    argmax_budget,
    ranked_with_floor,
)
from sparksim.policies.path import path_length, path_longest, top_k_lengths


class VllmAdaptive(Policy):
    name = "vllm-adaptive"
    rule = "K = argmax τ/cost on the previous block's survivals (new: 1.0); fresh top-K (vLLM #47808)"
    lossless = True
    paper = "vLLM PR #47808 (v0.33.0 adaptive_verification.py)"

    def __init__(self, block: int, table: Any = "exact", lag: int = 1) -> None:
        super().__init__(block)
        self.lag = check_int("lag", lag, 0, 8)
        self.lossless = self.lag > 0  # type: ignore[misc]
        self._stale = StaleConfidences(self.lag)
        self._table = PlannerTable("vllm", table, block, flat_ok=False)
        self.last_capacity: int | None = None

    @property
    def params(self) -> dict[str, Any]:
        return {"table": self._table.spec, "lag": self.lag}

    def decide(self, batch: StepBatch) -> Lengths:
        stale = np.cumprod(self._stale.rows(batch), axis=1, dtype=np.float64)
        self._stale.push(batch)
        _, ranked = ranked_with_floor(stale, 0.0)
        m = path_length(int(np.count_nonzero(ranked)), batch.fixed_tokens, batch.max_tokens)
        tau = batch.num_requests + np.concatenate(([0.0], np.cumsum(ranked[:m])))
        longest = path_longest(stale, ranked, m) if self._table.needs_longest(batch) else None
        cost = self._table.step_s(batch, batch.fixed_tokens + np.arange(m + 1, dtype=np.int64), longest)
        k = argmax_budget(tau, cost)
        self.last_capacity = k
        return top_k_lengths(batch.survival, k)
