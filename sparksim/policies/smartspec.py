"""`smartspec`: one speculation length for the whole batch, by goodput from a global α.

Rule (SmartSpec, Liu et al. 2024, as in the author's vLLM fork `vllm/spec_decode/dsd.py`):
keep one global per-token acceptance rate α (EMA, α ← 0.85·α + 0.15·observed, where
observed is a step's accepted / verified drafts; initial 0.7). Every `interval` steps
choose k for all requests: goodput(k) = R·(1 − α^{k+1})/(1 − α) / step_s(B), with
B = R·(k + 1) + the other fixed tokens, enumerating k = 0, 1, .. up to `max_k` (and the
token limit) and stopping at the first k whose goodput does not exceed the best so far;
k = 0's goodput is multiplied by `no_spec_bonus` (1.1: speculate only when it beats plain
decoding by 10 %). Between recomputations k is kept (capped by the token limit if R grew).

k = 0 is plain decoding, as in dsd.py ("for k=0 it is target only"): its goodput is priced
without the drafter and without a sync pipeline's decision time (a plain step decides
nothing), and while k = 0 is kept the steps run no drafter (`drafts_at`). The
steps that recompute k still draft: sparksim prices a step before the policy sees it, so
one step in `interval` pays the drafter to be decided (dsd.py decides from its profile).

Lossless: k depends on past acceptances and the batch size only, never on this step's
drafts. Reads no confidences at all.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from sparksim.policies.base import Lengths, Policy, StepBatch, check_float, check_int
from sparksim.policies.path import CostTable
from sparksim.step.kernels import first_non_improvement


class SmartSpec(Policy):
    name = "smartspec"
    rule = "one k for all requests maximising goodput from an EMA of global acceptance"
    lossless = True
    paper = "SmartSpec (arXiv 2406.14066), author's dsd.py"

    def __init__(
        self,
        block: int,
        alpha: float = 0.7,
        decay: float = 0.85,
        interval: int = 20,
        no_spec_bonus: float = 1.1,
        max_k: int | None = None,
    ) -> None:
        super().__init__(block)
        self.alpha = check_float("alpha", alpha, 0.0, 1.0)  # current estimate, updated online
        self.initial_alpha = self.alpha
        self.decay = check_float("decay", decay, 0.0, 1.0)
        self.interval = check_int("interval", interval, 1)
        self.no_spec_bonus = check_float("no_spec_bonus", no_spec_bonus, 0.0, 100.0)
        self.max_k = check_int("max_k", block if max_k is None else max_k, 0, block)
        self._table = CostTable()
        self._k = 0
        self._steps = 0

    @property
    def params(self) -> dict[str, Any]:
        return {
            "alpha": self.initial_alpha, "decay": self.decay, "interval": self.interval,
            "no_spec_bonus": self.no_spec_bonus, "max_k": self.max_k,
        }

    def drafts_at(self, requests: int) -> bool:
        """Draft while k > 0, and on the steps that recompute k; a step of k = 0 between them is plain."""
        del requests
        if self._k > 0 or self._steps % self.interval == 0:
            return True  # `decide` runs (and counts the step)
        self._steps += 1
        return False

    def decide(self, batch: StepBatch) -> Lengths:
        r = batch.num_requests
        k_fit = (batch.max_tokens - batch.fixed_tokens) // r if r else 0
        k_max = max(0, min(self.max_k, batch.gamma, k_fit))
        if self._steps % self.interval == 0:
            self._k = first_non_improvement(self.goodput(batch, k_max))
        self._steps += 1
        return np.full(r, min(self._k, k_max), dtype=np.int64)

    def goodput(self, batch: StepBatch, k_max: int) -> NDArray[np.float64]:
        """Return goodput(k) for k = 0..k_max, tokens per second, k = 0 (no drafter) boosted."""
        k = np.arange(k_max + 1)
        a = self.alpha
        per_request = (k + 1.0) if a >= 1.0 else (1.0 - a ** (k + 1.0)) / (1.0 - a)
        stride = max(batch.num_requests, 1)  # B = R·(k + 1) + the other fixed tokens
        step_s = self._table.step_s(batch.cost, batch.fixed_tokens, stride * k_max + 1)[::stride]
        # plain decoding runs no drafter, and a sync pipeline decides nothing for it
        step_s[0] -= batch.cost.draft_s + batch.cost.decision_s
        good = batch.num_requests * per_request / step_s
        good[0] *= self.no_spec_bonus
        return good

    def observe(self, batch: StepBatch, lengths: Lengths, num_accepted: NDArray[np.int64]) -> None:
        verified = int(lengths.sum())
        if verified:
            observed = float(num_accepted.sum()) / verified
            self.alpha = self.decay * self.alpha + (1.0 - self.decay) * observed
