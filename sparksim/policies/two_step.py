"""`two-step`: DSpark's production rule, capacity from stale survivals, slots to fresh ones.

Rule (paper §5.2): the step's verify capacity K is the argmax of Θ = τ · SPS(B) over the
whole survival-sorted path (no early stop) built from the survivals of `delay` steps ago;
at execution the K slots go to the top-K of this step's *fresh* survivals (ties: lower j,
then lower request index), capped by the engine's token limit. `delay=2` is the paper's
two-step-ahead; `delay=1` is vLLM's variant (PR #47808 sizes the budget from a one-step-old
buffer); `delay=0` is argmax on fresh survivals.

Which stale rows size K (membership changes between the snapshot and now): the path has
one row per request in *this* step. A request still present uses its own row from the
snapshot; a request that left since is dropped; a request that joined since (no row in
the snapshot) gets the snapshot's per-position mean survival. R, the fixed tokens and the
token limit are this step's: the scheduler knows them before the step. No fresh survival
of any request enters K. Before `delay` steps of history exist (or when the snapshot is
empty) K = `initial_budget` × R, as vLLM-Ascend's `initial_verify_budget_per_req`.

Graph sizes: when the profile's card lists CUDA-graph capture sizes, B = fixed + K is
rounded to the captured size just below or just above it, whichever has the higher stale
Θ (the smaller on a tie; a size the path cannot reach is skipped); a B beyond the largest
captured size runs eagerly and is kept.

EMA (`ema` = α > 0): each request's conditional confidences are smoothed across the steps
it has been in, c̄ ← α·c̄ + (1 − α)·c, before the snapshot's survival is taken
(vLLM-Ascend's `adaptive_verification_ema_alpha`, 0.8). Smoothing touches K only; the
fill always ranks the raw fresh survivals.

Lossless for delay ≥ 1: K is fixed before the step's tokens exist, and the top-K of
survivals non-increasing in j admits (r, k) on what ranks above it only. delay = 0 reads
fresh survivals to size K, so such an instance is flagged not lossless (`lossless`,
`label()`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sparksim.errors import ConfigError
from sparksim.policies.base import Lengths, Policy, StepBatch, check_float, check_int
from sparksim.policies.path import (
    CostTable,
    batch_path,
    num_positive,
    path_length,
    round_to_captured,
    sorted_survival,
    top_k_lengths,
)
from sparksim.step import kernels

# (the request ids as bytes, survival (R, γ), the same survivals sorted descending (R·γ,) when
# already sorted, else None). The ids are kept as bytes: comparing two byte strings costs a
# fifth of comparing arrays.
Snapshot = tuple[bytes, NDArray[np.float64], NDArray[np.float64] | None]


class TwoStep(Policy):
    name = "two-step"
    rule = "K = argmax Θ on survivals `delay` steps old; the K slots go to the fresh top-K"
    lossless = True
    paper = "§5.2 (production); vLLM PR #47808 with delay=1"

    def __init__(
        self, block: int, delay: int = 2, ema: float = 0.0, initial_budget: int | None = None
    ) -> None:
        super().__init__(block)
        self.delay = check_int("delay", delay, 0)
        self.ema = check_float("ema", ema, 0.0, 1.0)
        if self.ema == 1.0:
            raise ConfigError("policy parameter ema=1.0 is out of range ([0, 1)): it never updates")
        default_budget = min(5, block)
        self.initial_budget = check_int(
            "initial_budget", default_budget if initial_budget is None else initial_budget, 0, block
        )
        if self.delay == 0:
            # Sizing K from this step's own survivals is the argmax rule, which leaks x_k
            # into its own admission (App. A); the instance says so wherever it is shown.
            self.lossless = False  # type: ignore[misc]
        self._history: deque[Snapshot] = deque(maxlen=max(self.delay, 1))
        self._ema_ids = np.empty(0, dtype=np.int64)  # sorted
        self._ema_conf = np.empty((0, block))
        self._table = CostTable()
        # every snapshot sorted, for `kernels.stale_path` to edit, where the snapshot holds the
        # raw survivals (no EMA) and the kernels run compiled (the numpy twin sorts afresh)
        self._edits = self.ema == 0.0 and block > 1
        self.last_capacity: int | None = None  # K of the latest step (within the token cap)

    @property
    def params(self) -> dict[str, Any]:
        return {"delay": self.delay, "ema": self.ema, "initial_budget": self.initial_budget}

    def decide(self, batch: StepBatch) -> Lengths:
        survival = batch.survival if self.ema == 0.0 else self._smoothed_survival(batch)
        ids = batch.request_ids.tobytes()
        stale = self._history[0] if self.delay and len(self._history) == self.delay else None
        # Sorted where K `delay` steps on can read it: as it is where membership holds, or
        # edited for the requests that came and went (`kernels.stale_path`, compiled: no sort
        # of its own), and the fill then reads its K-th value. Otherwise (the numpy kernels
        # sort the matched rows afresh, and the fill needs only the K-th value, a partition)
        # only where membership held over the last `delay` steps, taken to hold over the next.
        # (Sorted or not, the values and the lengths are the same; only the work differs.)
        steady = stale is not None and stale[0] == ids and self.ema == 0.0
        fresh_ranked = sorted_survival(survival) if self.delay == 0 or steady or (self._edits and kernels.COMPILED) else None
        # Copies: should the engine reuse its batch buffers, a stale snapshot that aliased
        # them would silently turn fresh, and K would read this step's survivals.
        snapshot: Snapshot = (ids, survival.copy(), fresh_ranked)
        if self.delay == 0:
            stale = snapshot
        k = self.capacity(batch, stale, ids)
        self._history.append(snapshot)
        self.last_capacity = k
        return top_k_lengths(batch.survival, k, fresh_ranked if self.ema == 0.0 else None)

    def capacity(self, batch: StepBatch, stale: Snapshot | None, now_ids: bytes | None = None) -> int:
        """Return K sized from `stale` (ids, survival, ranked) for this step's requests and costs.

        Reads only `stale`, and of `batch` only its request ids, fixed tokens, token limit
        and costs, never its survivals (the test perturbs them and checks K). K never
        exceeds what the token limit admits: the stale path has one row per current request
        and is cut at that limit. `now_ids`: this step's request ids as bytes, when the caller has them.
        """
        if stale is None or not stale[0]:
            budget = path_length(batch.survival.size, batch.fixed_tokens, batch.max_tokens)
            return min(self.initial_budget * batch.num_requests, budget)
        ids, survival, ranked = stale
        if ids == (batch.request_ids.tobytes() if now_ids is None else now_ids):
            return self._best_budget(batch, survival, ranked)  # the snapshot's own rows
        stale_ids = np.frombuffer(ids, dtype=batch.request_ids.dtype)
        pairwise = survival.shape[1] == 1  # numpy sums one column pairwise, not row by row
        if ranked is not None and not pairwise and not batch.cost.shaped:
            # the snapshot's sorted values edited for who came and went (a shaped price reads
            # the matched rows themselves), and Θ walked along them in the same kernel call
            # where no graph size rounds K (this runs most steps: somebody came or went)
            if not self._table.captured_sizes(batch.cost):
                k = self._table.stale_cut(batch.cost, batch.fixed_tokens, batch.num_requests, batch.max_tokens,
                                          ranked, batch.request_ids, stale_ids, survival)
                if k >= 0:
                    return k
            return self._best_budget(batch, survival,
                                     kernels.stale_path(ranked, batch.request_ids, stale_ids, survival))
        rows, present = kernels.stale_rows(batch.request_ids, stale_ids, survival, not pairwise)
        if pairwise and present < rows.shape[0]:  # joined since: the snapshot's mean
            rows[present:] = survival.sum(axis=0) / survival.shape[0]
        return self._best_budget(batch, rows, None)

    def _best_budget(self, batch: StepBatch, survival: NDArray[np.float64],
                     ranked: NDArray[np.float64] | None) -> int:
        """K = the argmax of Θ over the whole path of `survival` (`ranked`: its values sorted, when
        known), rounded to a captured graph size. Where neither the longest block nor graph sizes
        matter, one priced walk (`CostTable.scan`) without a `Path`: this runs every step."""
        cost, table = batch.cost, self._table
        captured = table.captured_sizes(cost)
        if captured or cost.shaped or ranked is None:
            path = batch_path(batch, table, survival=survival, ranked=ranked)
            return round_to_captured(path, path.best_cut(), captured)
        n = path_length(num_positive(ranked), batch.fixed_tokens, batch.max_tokens)
        return table.scan(cost, batch.fixed_tokens, ranked[:n], float(batch.num_requests), False)[0]

    def _smoothed_survival(self, batch: StepBatch) -> NDArray[np.float64]:
        ids, conf = batch.request_ids, batch.conf
        pos = np.minimum(np.searchsorted(self._ema_ids, ids), max(self._ema_ids.size - 1, 0))
        seen = (self._ema_ids[pos] == ids) if self._ema_ids.size else np.zeros(ids.size, bool)
        prev = self._ema_conf[pos] if self._ema_ids.size else conf
        smoothed = np.where(seen[:, None], self.ema * prev + (1.0 - self.ema) * conf, conf)
        order = np.argsort(ids)
        self._ema_ids, self._ema_conf = ids[order], smoothed[order]
        return np.cumprod(smoothed, axis=1, dtype=np.float64)

