"""`sglang-dspark`: SGLang's DSpark verify planner in its three ragged modes.

Source: sgl-project/sglang, `python/sglang/srt/speculative/dspark_components/dspark_planner.py`
@ 00c3cffac9ff9fe6ca7a67a430c878664837e871 (`HostConfidenceBudgetPlanner.compute_budget`,
`compute_verify_token_budget`, `_two_steps_prior_survival`), `.../dspark_schedule.py` @
98984213ca90b9d0f5ad2099efcda7c469ab4e49 (`schedule_verify_lens_topk_from_survival`, the
fill), `dspark_sps.py` @ 45b76f55042711c33f1e2f0ba2a4281f7a51704a (the tables),
`srt/speculative/ragged_verify.py` @ 02d548f314373ad861130ad9b9e13fc7c1e9ba59 (the modes).

Rule (`SGLANG_RAGGED_VERIFY_MODE`):
- `static`: every request verifies its whole block; no planner.
- `compact` (serving): K = argmax_k τ*(k) / T(R, R + k) over survivals `lag` steps old
  (`SGLANG_DSPARK_CONFIDENCE_RELAY_LAG_STEPS`, 2; a request the relay does not hold counts
  as 1.0), candidates ≥ 1e-6 only, τ*(k) = R + the top k of them; T the SPS table (1-D:
  1/steps-per-second at the largest probe ≤ B; additive: bias + α(R) + θ(R + K)); the first
  K on a tie. With `min_gain` g > 0 (PR #35413 sets 0.05 for a capture-derived table) a
  trim must beat verify-all by g or K = all. The K slots go to the top-K of the fresh
  survivals ≥ 1e-6 (ties: lower position, then lower request). A step with prompt chunks
  (extend / mixed) gets no budget: the whole block.
- `cap-accept` (diagnostic): the plan of `compact`, but the target runs the whole block and
  commits only the planned prefix: ℓ as `compact`, priced as `static`.
`table=flat` is SGLang's default without `--speculative-dspark-sps-table-path` ([1] → 1.0
steps/s): θ rises with every candidate, so the planner verifies everything — the "no-op"
its users report. `profiled` is `dspark_sps_profiler`'s diagonal table from this run's
profile (B = bs·(γ+1) at 16 prompt tokens); `exact` (the default) is sparksim's own price.

Not a path policy in sparksim's sense (`tests/test_policies_properties.py`): static mode
and steps with prompt chunks verify whole blocks, survival-0 drafts included, as SGLang does.
Lossless for lag ≥ 1: K reads only old survivals, the fresh ones rank slots (the paper's
§5.2 two-step rule); lag = 0 is the argmax rule (flagged not lossless).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparksim.errors import ConfigError
from sparksim.policies import path
from sparksim.policies.base import Lengths, Policy, StepBatch, check_float, check_int
from sparksim.policies.engine_common import (
    PlannerTable,
    StaleConfidences,
    argmax_budget,
    ranked_with_floor,
)

MODES = ("static", "compact", "cap-accept")
EPS = 1e-6  # DSparkScheduleConfig.survival_eps


class SglangDspark(Policy):
    name = "sglang-dspark"
    rule = "K = argmax τ*/T on survivals 2 steps old over SGLang's SPS table; fresh top-K (ragged modes)"
    lossless = True
    paper = "SGLang dspark_planner.py @ 00c3cff; SGLANG_RAGGED_VERIFY_MODE"

    def __init__(self, block: int, mode: str = "compact", table: Any = "exact", lag: int = 2,
                 min_gain: float = 0.0) -> None:
        super().__init__(block)
        if mode not in MODES:
            raise ConfigError(f"policy parameter mode={mode!r}: one of {', '.join(MODES)}")
        self.mode = mode
        self.lag = check_int("lag", lag, 0, 8)
        self.min_gain = check_float("min_gain", min_gain, 0.0, 1.0)
        self.lossless = self.lag > 0 or mode == "static"  # type: ignore[misc]
        self.pays_full_block = mode == "cap-accept"
        self._stale = StaleConfidences(self.lag)
        self._table = PlannerTable("sglang", table, block)
        self.last_capacity: int | None = None

    @property
    def params(self) -> dict[str, Any]:
        return {"mode": self.mode, "table": self._table.spec, "lag": self.lag, "min_gain": self.min_gain}

    def decide(self, batch: StepBatch) -> Lengths:
        full = np.full(batch.num_requests, batch.gamma, dtype=np.int64)
        if self.mode == "static":
            return path.cap_lengths(batch, full)
        stale = np.cumprod(self._stale.rows(batch), axis=1, dtype=np.float64)
        self._stale.push(batch)
        if batch.fixed_tokens > batch.num_requests:  # prompt chunks in the step: no budget
            return path.cap_lengths(batch, full)
        kept, ranked = ranked_with_floor(stale, EPS)
        n = path.path_length(int(np.count_nonzero(ranked)), batch.fixed_tokens, batch.max_tokens)
        tau = batch.num_requests + np.concatenate(([0.0], np.cumsum(ranked[:n])))
        longest = path.path_longest(kept, ranked, n) if self._table.needs_longest(batch) else None
        step_s = self._table.step_s(batch, batch.num_requests + np.arange(n + 1, dtype=np.int64), longest)
        k = argmax_budget(tau, step_s)
        if self.min_gain and tau[k] / step_s[k] < (1.0 + self.min_gain) * tau[n] / step_s[n]:
            k = n
        self.last_capacity = k
        fresh, fresh_ranked = ranked_with_floor(batch.survival, EPS)
        return path.top_k_lengths(fresh, k, fresh_ranked)
