"""`trtllm-threshold` and `trtllm-planner`: TensorRT-LLM's DSpark verification rules.

`trtllm-threshold` — PR #15808 (merged), `tensorrt_llm/_torch/models/modeling_speculative.py`
(`confident_prefix_length`), `DSparkDecodingConfig.confidence_threshold` (0.0): each request
verifies up to the first position whose per-position sigmoid confidence is below t (all γ
when none is, or t = 0). The served engine passes t = 0.0 (`dspark.py` @ 005c932d,
`_draft_gen_block_batched`: "num_proposed is intentionally not yet consumed"), so as merged
it verifies the whole block; t > 0 is the rule the PR prepares.

`trtllm-planner` — PR #17056 (open), `_torch/speculative/dspark_planner.py` @ 52cd02d5
(`compute_verify_token_budget`, `derive_verify_len_tiers`), `dspark_schedule.py` @ 104193ca
(`schedule_verify_lens_topk`), `dspark_verify.py` @ 0b524435 (`decide_verify_lens`):
- a = survivals of the confidence snapshot `lag` steps old (the host path reads forward
  t−2's confidences: the previous block, lag 1; an unscored request counts as 1.0).
- Every request verifies at least 1 draft: τ(n') = R + Σ_r a_{r,1} + the top n' of a_{r,j≥2};
  the step sends 2R + n' tokens; T = the table's interpolated step time plus its overheads.
- The budget is the global argmax of τ/T over the tiers' budgets n' = R·(t − 1), t in
  `confidence_verify_len_tiers` (default [1, ⌈γ/2⌉, γ]; ties: the larger n'); a trim that
  does not beat the whole block by `minimum_predicted_gain` (0.01) keeps the whole block;
  with no table or a flat one the planner refuses to trim (the whole block). `table`:
  `exact` (sparksim's price, the default), `profiled` (the decomposed table its profiler
  would make from this run's profile), `flat`, or a table file.
- The slots go to the top n' of a_{r,j≥2} ≥ 1e-6 (ties: lower position, then lower request),
  from the same snapshot; `device_windows=true` (TLLM_DSPARK_DEVICE_WINDOWS, off) re-ranks
  with the fresh block on device: the paper's two-step split.
Lossless for lag ≥ 1 (nothing fresh sizes or fills the budget, or only fills it); lag 0 —
the snapshot being the verified block itself — is the argmax rule, flagged not lossless.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sparksim.policies.base import Lengths, Policy, StepBatch, check_bool, check_float, check_int
from sparksim.policies.engine_common import PlannerTable, StaleConfidences
from sparksim.policies.path import cap_lengths, top_k_lengths
from sparksim.policies.threshold import Threshold


class TrtllmThreshold(Threshold):
    name = "trtllm-threshold"
    rule = "verify up to the first per-position confidence below t; t=0 (as served) verifies all (TRT-LLM #15808)"
    paper = "TensorRT-LLM PR #15808 (confident_prefix_length)"
    fills_path = False  # t = 0 verifies every draft, zero survivals too: no fill along the path

    def __init__(self, block: int, t: float = 0.0) -> None:
        super().__init__(block, t=t)


class TrtllmPlanner(Policy):
    name = "trtllm-planner"
    rule = "budget = argmax τ/T over verify-length tiers on the previous block's survivals; floor 1 (TRT-LLM #17056)"
    lossless = True
    paper = "TensorRT-LLM PR #17056 (dspark_planner.py @ 52cd02d5)"
    # a floor of one draft per request, and a tail ranked from the snapshot: its top-k is not
    # the fill along this step's survival path (tests/test_policies_properties.py)
    fills_path = False

    def __init__(self, block: int, table: Any = "exact", lag: int = 1, tiers: str = "default",
                 min_gain: float = 0.01, device_windows: bool = False) -> None:
        super().__init__(block)
        self.lag = check_int("lag", lag, 0, 8)
        self.min_gain = check_float("min_gain", min_gain, 0.0, 1.0)
        self.device_windows = check_bool("device_windows", device_windows)
        self.lossless = self.lag > 0  # type: ignore[misc]
        raw = [1, math.ceil(block / 2), block] if tiers == "default" else str(tiers).split("/")
        self.tiers = sorted({check_int("tiers", t, 1, max(block, 1)) for t in raw})
        self._stale = StaleConfidences(self.lag)
        self._table = PlannerTable("trtllm", table, block)
        self.last_capacity: int | None = None

    @property
    def params(self) -> dict[str, Any]:
        return {"table": self._table.spec, "lag": self.lag, "tiers": "/".join(map(str, self.tiers)),
                "min_gain": self.min_gain, "device_windows": self.device_windows}

    def decide(self, batch: StepBatch) -> Lengths:
        r, gamma = batch.num_requests, batch.gamma
        full = np.full(r, gamma, dtype=np.int64)
        snap = np.cumprod(self._stale.rows(batch), axis=1, dtype=np.float64)
        self._stale.push(batch)
        if gamma == 0 or self._table.is_flat(batch):
            return cap_lengths(batch, full)
        cands = np.sort(snap[:, 1:], axis=None)[::-1]
        n_full = r * (gamma - 1)
        budgets = np.array([r * (t - 1) for t in self.tiers], dtype=np.int64)
        tau = r + snap[:, 0].sum() + np.concatenate(([0.0], np.cumsum(cands)))[budgets]
        tokens = batch.fixed_tokens + r + budgets
        longest = (np.array([1 + _top_tail(snap, int(b)).max() for b in budgets], dtype=np.int64)
                   if self._table.needs_longest(batch) else None)
        theta = tau / self._table.step_s(batch, tokens, longest)
        best = int(budgets.size - 1 - np.argmax(theta[::-1]))  # ties: the larger budget
        full_at = np.flatnonzero(budgets == n_full)
        if full_at.size and theta[best] < theta[full_at[0]] * (1.0 + self.min_gain):
            best = int(full_at[0])
        self.last_capacity = int(budgets[best])
        ranks = batch.survival if self.device_windows else snap
        return cap_lengths(batch, 1 + _top_tail(ranks, int(budgets[best])))


def _top_tail(survival: np.ndarray, k: int) -> Lengths:
    """Per request, how many of the k largest a_{r,j≥2} ≥ 1e-6 it holds (ties: lower j, lower r).

    The planner's stable sort of every tail value, position-major, cut at k: the path's
    top-k (`top_k_lengths`, whose ties go the same way) over the tail with the values below
    1e-6 set to 0, which are never candidates. Rows stay non-increasing, as it needs.
    """
    tail = survival[:, 1:]
    return top_k_lengths(np.where(tail >= 1e-6, tail, 0.0), k)
