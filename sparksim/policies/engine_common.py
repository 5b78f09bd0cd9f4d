"""What the engines' DSpark rules share: stale confidences by request, the engine's own table.

The engines' planners (vLLM, SGLang, TensorRT-LLM, ATOM; `sparksim.policies.vllm_adaptive`
and its siblings) differ in which confidences size the step's budget, which rank its slots,
and which step-cost table prices it. Two pieces recur:

- `StaleConfidences`: a ring of the last `lag` steps' conditional confidences by request id.
  A request the snapshot does not hold (new since, or every request before `lag` steps of
  history) gets confidences of 1.0: every engine that reads a snapshot treats a never-scored
  request so (vLLM `add_request` resets its stale row to 1.0; SGLang's freshness check;
  TensorRT-LLM's neutral logit 30).
- `PlannerTable`: the price the engine's planner sees. `exact` (the default) is sparksim's
  own price of the step — the engine's rule with a perfect table. `profiled` is the table
  the engine's own profiler would write from this run's profile (`sparksim profile export`,
  `sparksim.cost.engine_tables`): the engine's grid, its fixed profiling context and its lookup
  rule, which `exact` does not simplify; the gap between the two is the price of the
  engine's table. `flat` is the engine's placeholder when no table is given; a path reads
  the engine's table file.

Lags count sparksim steps: the confidences a step's batch carries are those of the block it
verifies, so lag 1 is the previous block's (one step older).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from sparksim.errors import ConfigError
from sparksim.policies.base import StepBatch

if TYPE_CHECKING:
    from sparksim.cost.engine_tables import EngineTable
    from sparksim.cost.profile import Profile

Snapshot = tuple[NDArray[np.int64], NDArray[np.float64]]  # (sorted ids, their confidence rows)


class StaleConfidences:
    """The conditional confidences of `lag` steps ago, one row per current request."""

    copied_per_path = True  # the exact bias lab copies it with the policy (`path_decider.PathDecider`)

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self._ring: deque[Snapshot] = deque(maxlen=max(lag, 1))

    def __copy__(self) -> StaleConfidences:
        new = StaleConfidences(self.lag)
        new._ring.extend(self._ring)  # the snapshots themselves are never changed in place
        return new

    def rows(self, batch: StepBatch) -> NDArray[np.float64]:
        """Return (R, γ) stale confidences for this batch's requests (1.0 where none is held)."""
        if self.lag == 0:
            return batch.conf
        out = np.ones_like(batch.conf)
        if len(self._ring) == self.lag:
            ids, conf = self._ring[0]
            if ids.size:
                pos = np.minimum(np.searchsorted(ids, batch.request_ids), ids.size - 1)
                held = ids[pos] == batch.request_ids
                out[held] = conf[pos[held]]
        return out

    def push(self, batch: StepBatch) -> None:
        """Keep this step's confidences (a copy, sorted by request id) for later steps."""
        order = np.argsort(batch.request_ids)
        self._ring.append((batch.request_ids[order], batch.conf[order].copy()))


class PlannerTable:
    """The step-cost table an engine's planner prices its budget with.

    `spec`: `profiled` (the engine's profiler's table, made from the run's profile on first
    use), `flat` (the engine's no-table placeholder, where it has one), `exact` (sparksim's
    own price of this step: what the engine charges) or a path to the engine's table file.
    """

    def __init__(self, engine: str, spec: Any, gamma: int, *, flat_ok: bool = True) -> None:
        self.engine, self.gamma = engine, gamma
        self._table: EngineTable | None = None
        self._profile_id = -1
        if hasattr(spec, "step_s"):  # a table object (a notebook's or a test's)
            self.spec, self._table = f"<{type(spec).__name__}>", spec
            return
        self.spec = str(spec)
        if self.spec == "flat" and not flat_ok:
            raise ConfigError(f"policy parameter table=flat: {engine} has no flat table (it refuses to run without one)")
        if self.spec not in ("profiled", "flat", "exact") and not Path(self.spec).is_file():
            raise ConfigError(f"policy parameter table={self.spec!r}: not profiled, flat, exact or a table file")

    def table(self, batch: StepBatch) -> EngineTable | None:
        """The engine's table for this batch's profile, or None for sparksim's exact price."""
        if self.spec == "exact":
            return None
        from sparksim.cost import engine_tables as et
        from sparksim.cost.engine_table_files import read_table
        if self._table is None or (self.spec == "profiled" and id(batch.cost.profile) != self._profile_id):
            if self.spec == "profiled":
                self._table = profiled_table(batch.cost.profile, self.engine, self.gamma)
                self._profile_id = id(batch.cost.profile)
            elif self.spec == "flat":
                self._table = et.SglangSpsTable.flat() if self.engine == "sglang" else et.TrtllmSpsTable((1,), (1.0,))
            else:
                self._table = read_table(Path(self.spec), self.engine)
        return self._table

    def step_s(self, batch: StepBatch, tokens: NDArray[np.int64],
               longest: NDArray[np.int64] | None = None) -> NDArray[np.float64]:
        """Seconds of this batch's step at each of `tokens` batch tokens, as the planner prices it.

        `longest` (the longest verified block at each, where the caller knows it) reaches
        sparksim's price when it depends on it (`StepCost.shaped`: padded attention), so
        `exact` is the price the engine charges; an engine's table has no such axis.
        """
        table = self.table(batch)
        if table is None:
            return np.asarray(batch.cost.step_s(tokens, longest), dtype=np.float64)
        return table.step_s(batch.num_requests, tokens)

    def needs_longest(self, batch: StepBatch) -> bool:
        """Whether the price at a cut depends on its longest block (`exact` on a padded profile)."""
        return self.spec == "exact" and batch.cost.shaped

    def is_flat(self, batch: StepBatch) -> bool:
        table = self.table(batch)
        return table is not None and table.is_flat


def profiled_table(profile: Profile, engine: str, gamma: int) -> EngineTable:
    """The table `engine`'s own profiler would make from `profile` (`sparksim profile export`).

    ATOM writes no file: its start-up calibration times the captured full-block graphs
    (B = bs·(γ+1), steps/s), the grid of SGLang's diagonal sweep, so it is that table.
    """
    from sparksim.cost import engine_tables as et
    from sparksim.cost.engine_table_convert import export_table
    if engine == "atom":
        diag = export_table(profile, "sglang", gamma=gamma)
        assert isinstance(diag, et.SglangSpsTable)
        return et.AtomSpsTable(diag.batch_tokens, diag.steps_per_sec, max_b=diag.batch_tokens[-1])
    return export_table(profile, engine, gamma=gamma)


def ranked_with_floor(survival: NDArray[np.float64], eps: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Return (survival with values below `eps` set to 0, its values sorted descending).

    SGLang and vLLM's top-K never verify a survival below 1e-6; 0 is never a candidate on
    sparksim's path either (`sparksim.policies.path`).
    """
    kept = np.where(survival >= eps, survival, 0.0)
    ranked = np.sort(kept, axis=None)[::-1]
    return kept, ranked


def argmax_budget(tau: NDArray[np.float64], step_s: NDArray[np.float64], *, last_on_tie: bool = False) -> int:
    """Index of the largest τ / step_s (the first on a tie, as np.argmax; or the last)."""
    theta = tau / step_s
    if last_on_tie:
        return int(theta.size - 1 - np.argmax(theta[::-1]))
    return int(np.argmax(theta))
