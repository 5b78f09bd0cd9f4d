"""`atom-schedule`: AMD ATOM's DSpark `confidence_schedule` with ragged execution.

Source: ROCm/ATOM PR #1414, merge 888694f1253bcc1342b100fced04fd0d9f4f43b6:
`atom/spec_decode/dspark_scheduler.py` l.200-280 (`schedule_prefix_lengths_tensor`; early stop
`_GREEDY_EARLY_STOP = True`, l.32), `atom/spec_decode/verify_scheduler.py` l.43-68 (`compute_ell`,
the synthetic table l.59-63), `atom/model_engine/model_runner.py` l.2259-2356
(`_dspark_apply_ragged`, the floor l.2293). HEAD ffdf3bb5 (PR #1861, `dspark_verify.py`
`_resolve_ell` l.182-208) uses the ℓ computed two generations back (`head=true`).

Rule, on the block about to be verified (its own, fresh confidences; `head`: the ℓ each
request got from the previous block, the whole block for one without):
- c clamped to [1e-6, 1 − 1e-6], a = cumprod c, sorted descending; τ(m) = R + the top m;
  B(m) = min(R + m, len(sps) − 1); Θ(m) = τ(m)·sps[B(m)]; m* = the first m with
  Θ(m + 1) ≤ Θ(m) (the paper's greedy early stop; `early_stop=false` takes the global
  argmax, reachable in ATOM only by calling the function directly); ℓ_r = r's share of the
  top m*. Prompt tokens and the draft are outside B; a step with prompt chunks runs the
  whole block.
- The table: with `ragged` (the recipe) or `disable_sps_calib` ATOM skips calibration and
  uses the stub sps = linspace(1.0, 0.1, R·(γ+1) + 1) (`table=stub`, the default);
  `profiled` is its start-up calibration (steps/s at B = bs·(γ+1), linear between); `exact`
  is sparksim's price.
- Ragged execution verifies max(ℓ_r, max_nb) per request, max_nb the batch's largest count
  of accepted drafts last step, and the whole block when the batch holds a request the last
  step did not (ATOM also stays rectangular when rows are reordered; sparksim's row order is
  its own, so only new requests count here) (`ragged=false`: ℓ as scheduled).
Lossless: the greedy admits (r, k) on survivals ranked at or above it (paper App. A);
the floor reads only earlier steps. `early_stop=false` reads the whole fresh path to size
the cut: the argmax rule, flagged not lossless.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from sparksim.cost.engine_tables import AtomSpsTable
from sparksim.policies import path
from sparksim.policies.base import Lengths, Policy, StepBatch, check_bool
from sparksim.policies.engine_common import PlannerTable


class AtomSchedule(Policy):
    name = "atom-schedule"
    rule = "greedy early stop on fresh survivals over ATOM's SPS stub; ragged floor max_nb (ATOM #1414)"
    lossless = True
    paper = "ROCm/ATOM PR #1414 (dspark_scheduler.py @ 888694f)"

    def __init__(self, block: int, table: Any = "stub", ragged: bool = True, early_stop: bool = True,
                 head: bool = False) -> None:
        super().__init__(block)
        self.ragged = check_bool("ragged", ragged)
        self.early_stop, self.head = check_bool("early_stop", early_stop), check_bool("head", head)
        self.lossless = self.early_stop or self.head  # type: ignore[misc]
        self._spec = str(table)
        self._table = None if self._spec == "stub" else PlannerTable("atom", table, block, flat_ok=False)
        self._max_nb = 0
        self._last_ids = np.empty(0, dtype=np.int64)
        self._prev: tuple[NDArray[np.int64], Lengths] = (np.empty(0, np.int64), np.empty(0, np.int64))

    @property
    def params(self) -> dict[str, Any]:
        return {"table": self._spec, "ragged": self.ragged, "early_stop": self.early_stop, "head": self.head}

    def decide(self, batch: StepBatch) -> Lengths:
        r, gamma = batch.num_requests, batch.gamma
        full = np.full(r, gamma, dtype=np.int64)
        same_batch = bool(np.isin(batch.request_ids, self._last_ids).all())  # no request new since
        self._last_ids = batch.request_ids.copy()
        if batch.fixed_tokens > r or gamma == 0:
            return path.cap_lengths(batch, full)
        ell = self._schedule(batch)
        if self.head:  # the ℓ each request got from the previous block; none: the whole block
            ids, prev = self._prev
            order = np.argsort(batch.request_ids)
            self._prev = (batch.request_ids[order], ell[order])
            ell = full.copy()
            if ids.size:
                pos = np.minimum(np.searchsorted(ids, batch.request_ids), ids.size - 1)
                held = ids[pos] == batch.request_ids
                ell[held] = prev[pos[held]]
        if self.ragged:
            ell = full if not same_batch else np.minimum(np.maximum(ell, self._max_nb), gamma)
        return path.cap_lengths(batch, ell.astype(np.int64))

    def _schedule(self, batch: StepBatch) -> Lengths:
        r, gamma = batch.num_requests, batch.gamma
        a = np.cumprod(np.clip(batch.conf, 1e-6, 1.0 - 1e-6), axis=1, dtype=np.float64)
        ranked = np.sort(a, axis=None)[::-1]
        tau = r + np.concatenate(([0.0], np.cumsum(ranked)))
        if self._table is None:  # the recipe's stub, at every B (ATOM rebuilds it each step)
            sps = AtomSpsTable.stub(r, gamma).sps
            theta = tau * sps[np.minimum(r + np.arange(tau.size), sps.size - 1)]
        else:
            longest = path.path_longest(a, ranked, tau.size - 1) if self._table.needs_longest(batch) else None
            theta = tau / self._table.step_s(batch, batch.fixed_tokens + np.arange(tau.size, dtype=np.int64), longest)
        if self.early_stop:
            drops = np.flatnonzero(theta[1:] <= theta[:-1])
            m = int(drops[0]) if drops.size else tau.size - 1
        else:
            m = int(np.argmax(theta))
        return path.top_k_lengths(a, m, ranked)

    def observe(self, batch: StepBatch, lengths: Lengths, num_accepted: NDArray[np.int64]) -> None:
        self._max_nb = int(num_accepted.max()) if num_accepted.size else 0
