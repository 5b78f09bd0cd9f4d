"""One decode replica as a SimPy process: admit, verify, replay acceptance, emit, repeat.

The running batch is a struct of arrays (one slot per running request, rows 0..n-1, laid
out in `sparksim.step.batch_layout`), so a step is a fixed number of array operations whatever
R is: plan it (prompt work, who advances, its price: `sparksim.cost.pricing.StepCost`), gather
the trace rows' confidences, ask the policy for ℓ and check the answer, pay the price the
policy was shown (`StepCost.price`), then replay acceptance (`sparksim.step.acceptance`) and
advance every request in one pass (`sparksim.step.kernels.advance`), and record the step.
Python loops run only over requests that join, finish, are preempted or run out of trace
— events, not steps.

Prompts are prefilled in the step's token budget (chunked, "colocated") or arrive from a
prefill pool with their KV cache ("disaggregated"); preempted requests are recomputed
in-engine the same way as a colocated prefill, and emit nothing when it completes. With
prefix caching on (colocated), a prompt's cached prefix blocks (`sparksim.sim.prefix_cache`) are
skipped by its prefill and counted once in the KV cache, however many requests share them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy
from numpy.typing import NDArray

from sparksim.config import Scenario
from sparksim.cost.pricing import StepCost, known_decision_s
from sparksim.cost.profile import Profile
from sparksim.errors import PolicyError
from sparksim.policies.base import Policy, StepBatch, drafted_positions
from sparksim.sim.clock import Clock
from sparksim.sim.prefix_cache import PrefixCache
from sparksim.sim.scheduler import Request, Scheduler
from sparksim.sim.step_checks import answer_lengths, check_quiet, check_replay, check_tokens
from sparksim.sim.workload import DomainSampler
from sparksim.step import kernels
from sparksim.step.batch_layout import (
    CONTEXT,
    EMITTED,
    JOINED,
    OUT_LEN,
    RID,
    ROW,
    ROW_END,
    STEPS,
)
from sparksim.step.records import Columns, StepRecord, StreamStats
from sparksim.traces.format import TraceSet


def kv_capacity_tokens(scenario: Scenario, profile: Profile) -> int | None:
    """Return the KV-cache slots of one replica (None: unlimited).

    'auto' sizes the cache from the profile card's memory figures (HBM × utilisation −
    weights − activation reserve, over KV bytes per token), as vLLM does at start-up; a
    card without them leaves the cache unlimited.
    """
    cl = scenario.cluster
    if cl.kv_capacity_tokens == "unlimited":
        return None
    if cl.kv_capacity_tokens == "auto":
        return profile.kv_capacity_tokens(cl.gpu_memory_utilization)
    return int(cl.kv_capacity_tokens)


_NO_JOINT = np.zeros(0, dtype=np.int64)  # `kernels.advance` counts nothing into it


@dataclass(slots=True)
class _Step:
    """A planned step: who runs it, its prompt work and its price (ℓ aside)."""

    start_at: float
    n: int  # running requests
    m: int  # of them, the ones this step advances (rows 0..m-1)
    plan: list[tuple[Request, int]]  # prompt work: (request, tokens)
    irregular: bool  # some request's gap is not one step long (ITL)
    kv_tokens: int  # KV tokens the m decode requests hold
    decision_s: float  # known decision time (sync pipeline), 0 under zos
    loop_s: float  # the engine loop's host time waited before it (cost_model.loop_ms)
    cost: StepCost


class Engine(Scheduler):
    """A decode replica: its queue, its running batch and the step loop."""

    def __init__(
        self,
        env: Clock,
        replica: int,
        scenario: Scenario,
        profile: Profile,
        traces: TraceSet,
        policy: Policy,
        sampler: DomainSampler,
        rng: np.random.Generator,
        stats: StreamStats,
        step_records: Columns | None,
        finish: Callable[[Request], None],
        check: bool = False,
    ) -> None:
        self.env = env
        self.replica = replica
        self.profile = profile
        self.traces = traces
        self.policy = policy
        self.sampler = sampler
        self.rng = rng
        self.stats = stats
        self.step_records = step_records
        self.finish = finish
        self.check = check  # check INV-1 and B (INV-2) step by step as it happens
        cl = scenario.cluster
        self.chunk_tokens = cl.prefill.chunk_tokens
        self.max_concurrency = cl.max_concurrency
        self.max_batch_tokens = cl.max_batch_tokens
        self.kv_capacity = kv_capacity_tokens(scenario, profile) or 1 << 62
        self.cluster = cl
        self.sync_decision = cl.pipeline == "sync"
        self.measure_decision = cl.pipeline == "sync" and cl.decision_s == "measured"
        self.drafts = policy.drafts
        self.draft_positions = drafted_positions(policy, profile, scenario.policy.drafter, traces.gamma)
        self.drafter = scenario.policy.drafter
        self.attn_padded = profile.attention_kv_padded  # attention over the longest context, not the sum
        self.prefill_first = cl.prefill.schedule == "prefill-first"
        # the engine loop's own time before a step (a CPU engine's host work; none on a GPU profile)
        self.loop = bool(profile.loop_table)
        self.max_context_tokens = cl.max_context_tokens or (1 << 62)
        self.observes = type(policy).observe is not Policy.observe  # skip a no-op call per step
        self.asks_drafting = type(policy).drafts_at is not Policy.drafts_at
        # a pass-based drafter stops where the policy says this step's verification does
        table = profile.drafter(scenario.policy.drafter) if self.drafts and profile.drafters else None
        self.asks_positions = (type(policy).positions_at is not Policy.positions_at
                               and table is not None and table.kind != "block")
        self._drafting = False
        # the most drafts a request may verify: the positions drafted, within the trace's block
        self.max_length = min(self.draft_positions, traces.gamma) if self.drafts else 0
        self._step_max = self.max_length  # this step's: fewer where the policy drafts fewer positions
        self._zeros = np.zeros(scenario.cluster.max_concurrency, dtype=np.int64)  # ℓ of plain steps
        self.reserve = traces.gamma + 1 if self.drafts else 1  # KV slots a step may write
        self.gamma = traces.gamma
        # trace arrays, flat: row i is one (request, position); shared by the replicas, and the
        # confidences, survivals and acceptances read only for a policy that drafts (plain
        # decoding reads none; `--check` reads the acceptances itself)
        no_rows = np.empty((0, traces.gamma))
        self.t_conf = traces.conf64 if self.drafts else no_rows
        self.t_surv = traces.survival if self.drafts else no_rows
        self.t_acc = traces.accepted64 if self.drafts else np.empty(0, dtype=np.int64)
        self.t_offsets = traces.offsets

        self._init_slots(self.max_concurrency)
        self._irregular = False  # some running request sat out a step since it last emitted
        self._capped_last = 0  # rows the context cap let the last capped step take (`_capped_rows`)
        self._joins_pending = False  # some slot may hold JOINED = 1 (False: none does)
        self.active: dict[int, Request] = {}
        self.queue: deque[Request] = deque()
        self.prefilling: deque[Request] = deque()
        # KV tokens held: every admitted request's own, plus the cached prefix blocks running
        # requests reference (counted once); unreferenced cached blocks sit in the free space
        self.kv_used = 0
        pc = scenario.cluster.prefix_cache
        self.cache = (PrefixCache(pc.block_tokens)
                      if pc.enabled and cl.prefill.mode == "colocated" else None)
        self._block = pc.block_tokens if self.cache is not None else 0
        self.ctx_sum = 0  # Σ context over the running batch (its mean prices attention)
        self.step_index = 0
        self.admit_counter = 0
        self._idle: simpy.Event | None = None
        self.process = env.process(self._loop())

    # ------------------------------------------------------------------ the step loop

    def _loop(self) -> Generator[simpy.Event, Any, None]:
        """Step until the simulation ends: plan, price, decide, run (a timeout), apply, record."""
        env = self.env
        while True:
            if self.queue:
                self._admit()
            loop_s = 0.0
            if self.loop and (self.n or self.prefilling):
                # before a step the host finishes the last one's requests and forms this one
                # (cost_model.loop_ms): a prompt-only step's, or a decode step's
                kind = "prefill" if self.prefilling and self.prefill_first else "decode"
                loop_s = self.profile.loop_s(self.drafts, kind, self.n)
                if not env.skip(loop_s):  # nobody can see this wait: no event is due before it ends
                    yield env.timeout(loop_s)
            if self.kv_used + self.n * self.reserve > self.kv_capacity:
                self._preempt_if_needed()
            if self.n == 0 and not self.prefilling:
                self._idle = env.event()
                yield self._idle
                self._idle = None
                continue
            step = self._plan(loop_s)
            lengths, verified, batch, decision_s = self._decide(step)
            priced = verified
            if batch is not None and self.policy.pays_full_block:
                priced = step.m * batch.gamma
                price = step.cost.price(np.full(step.m, batch.gamma, dtype=np.int64), priced)
            else:
                price = step.cost.price(lengths, verified)
            step_s = price.draft_s + price.verify_s + decision_s  # the loop's time was waited above
            if not env.skip(step_s):
                yield env.timeout(step_s)
            emitted, accepted = self._apply(step, lengths, verified, batch, step_s)
            if self.step_records is not None:
                self.step_records.append_row(StepRecord(
                    self.replica, self.step_index, step.start_at, step_s, price.draft_s, price.verify_s,
                    price.kv_s, decision_s, step.m, step.cost.base_tokens + priced,
                    step.cost.prefill_tokens, verified, accepted, emitted,
                    step.cost.context, step.kv_tokens,
                ))
            self.step_index += 1

    # ------------------------------------------------------------------ the step's stages

    def _plan(self, loop_s: float) -> _Step:
        """Plan a step: its prompt work, which running requests it advances, and its price.

        All n running requests advance unless a prefill-first iteration stalls them (m = 0)
        or the context cap leaves some waiting (m < n).
        """
        n = self.n
        plan = self._plan_prefill(self.max_batch_tokens - n * self.reserve) if self.prefilling else []
        m, kv_tokens = n, self.ctx_sum
        if plan and self.prefill_first:
            m, kv_tokens = 0, 0
        elif n and self.ctx_sum > self.max_context_tokens:
            m, kv_tokens = self._capped_rows(n)
        irregular = self._irregular or m < n  # some gap is not one step long
        self._irregular = m < n
        drafting = self.drafts and m > 0 and (not self.asks_drafting or self.policy.drafts_at(m))
        self._drafting = drafting  # a step without drafts verifies none (`_decide`)
        decision_s = 0.0  # known before the policy runs (sync pipeline), so its Θ counts it
        if drafting and self.sync_decision:
            decision_s = known_decision_s(self.cluster, self.profile, self.policy.name, m)
        positions = self.draft_positions if drafting else 0
        if drafting and self.asks_positions:
            positions = self._positions_at(m)
        cost = StepCost.for_step(
            self.profile, requests=m, kv_tokens=kv_tokens,
            kv_longest=int(self.state[CONTEXT, :m].max()) if self.attn_padded and m else 0,
            chunks=[(take, req.context - req.prefill_left) for req, take in plan] if plan else (),
            positions=positions, drafter=self.drafter,
            loop_s=loop_s, decision_s=decision_s,
        )
        return _Step(self.env.now, n, m, plan, irregular, kv_tokens, decision_s, loop_s, cost)

    def _decide(self, step: _Step) -> tuple[NDArray[np.int64], int, StepBatch | None, float]:
        """Ask the policy for ℓ (plain decoding and prompt-only steps verify nothing) and check it;
        return ℓ, Σℓ, the batch it saw (None: no policy ran) and the decision's seconds."""
        m = step.m
        if not self._drafting:
            return self._zeros[:m], 0, None, step.decision_s
        st = self.state
        rows = st[ROW, :m]
        batch = StepBatch.from_rows(  # the rows' confidences are gathered if the policy reads them
            request_ids=st[RID, :m].copy(),  # policies may keep it across steps
            rows=rows.copy(),  # and read the batch after the step, when the slots have moved on
            conf_table=self.t_conf,
            survival_table=self.t_surv,
            fixed_tokens=step.cost.base_tokens,
            max_tokens=self.max_batch_tokens,
            cost=step.cost,
            step_index=self.step_index,
            accepted=self.t_acc.take(rows) if self.policy.reads_outcome else None,
        )
        t0 = time.perf_counter() if self.measure_decision else 0.0
        answer = self.policy.decide(batch)
        decision_s = time.perf_counter() - t0 if self.measure_decision else step.decision_s
        # checked every step, before any kernel sees it; under --check, B within the limit (INV-2)
        lengths, verified = answer_lengths(answer, m, self._step_max, self._who)
        if self.check:
            check_tokens(lengths, step.cost.base_tokens, self.max_batch_tokens, self._who)
        return lengths, verified, batch, decision_s

    def _positions_at(self, m: int) -> int:
        """The positions a pass-based drafter drafts this step (`Policy.positions_at`), checked."""
        p = self.policy.positions_at(m)
        if isinstance(p, bool) or not isinstance(p, int | np.integer) or not 1 <= p <= self.draft_positions:
            raise PolicyError(f"{self._who()}: positions_at({m}) = {p!r}: must be an integer in "
                              f"1..{self.draft_positions} (drafts_at says when not to draft)")
        self._step_max = min(self.max_length, int(p))
        return int(p)

    def _who(self) -> str:
        return f"step {self.step_index}: policy {self.policy.label()!r}"

    def _apply(self, step: _Step, lengths: NDArray[np.int64], verified: int, batch: StepBatch | None,
               step_s: float) -> tuple[int, int]:
        """Apply a finished step: replay acceptance, emit, finish, rotate; return (emitted, accepted).

        `accepted` is what the trace says the verified drafts earned, Σ min(ℓ, accepted), before
        any output-length cut: the step record carries it, so INV-1 checks the replay against it.
        """
        now = self.env.now
        stats = self.stats
        st = self.state
        m, n = step.m, step.n
        in_window = stats.window_start <= now <= stats.window_end
        emitted_total = accepted_total = 0
        if m > 0:
            # the replay rule, every slot's counters and the (ℓ, accepted) histogram
            # (acceptance statistics ignore the output-length cut), in one pass
            rows = st[ROW, :m].copy() if self.check else None
            if verified:
                joint = stats.joint if in_window else _NO_JOINT
                drafted_ok, emitted_total, any_done, any_past = kernels.advance(
                    st, m, lengths, self.t_acc, joint, self.gamma
                )
                self._quiet = 0
            else:
                drafted_ok = self._zeros[:m]  # nothing accepted (the engine never writes `_zeros`)
                emitted_total, any_done, any_past = self._advance_plain(m)
            if verified and (self.step_records is not None or self.check):
                accepted_total = int(drafted_ok.sum())  # the record's: what the trace accepted
            if rows is not None:
                check_replay(self.traces.accepted64, rows, lengths, drafted_ok, emitted_total, self.step_index)
            self.kv_used += emitted_total
            self.ctx_sum += emitted_total
            if self.cache is not None:  # new tokens take free space: the oldest cached blocks go
                self.cache.fit(self.kv_capacity - self.kv_used)
            if batch is not None and self.observes:
                self.policy.observe(batch, lengths, drafted_ok)
            if in_window:
                # a request that ran the step before waited the loop's time, then this step
                self._record_itl(m, n, now, step.loop_s + step_s, step.irregular)
                stats.window_tokens += emitted_total
                stats.window_request_steps += m
                stats.window_verified += verified
                stats.window_emitted_decode += emitted_total
                if not verified:  # m pairs (ℓ = 0, accepted = 0)
                    stats.joint[0] += m
            self.last_emit[:m] = now
            if self._joins_pending:
                st[JOINED, :m] = 0
                self._joins_pending = m < n  # the ones that sat out keep theirs
            stepped = m
            if any_done:
                done = st[EMITTED, : self.n] >= st[OUT_LEN, : self.n]
                gone = done.nonzero()[0]  # (1-D: np.flatnonzero without its wrapper)
                finished = [self._park(i) for i in gone.tolist()]
                # before the callbacks: a closed-loop user resubmits at once, and routing must
                # see this replica's load
                if m < n:  # capped: leave and rotate in one move of the m stepped columns
                    self._step_out(~done[:m], m)
                    stepped = 0
                else:  # (the whole batch stepped: nothing to rotate)
                    self._compact(~done, gone)
                for req in finished:
                    self._free(req)
                    req.finish_at = req.last_emit_at = now
                    self.finish(req)
            if m < n and 0 < stepped < self.n:
                # the stepped requests queue behind the ones that waited (DistServe's rotation)
                self._rotate(stepped)
            st = self.state
            if any_past:  # some request ran out of trace rows
                past = st[ROW, : self.n] >= st[ROW_END, : self.n]
                self._continue_traces(past.nonzero()[0])
        for req, take in step.plan:
            req.prefill_left -= take
            if self.cache is not None and req.spec.prefix_group >= 0:
                self._cache_computed(req)
        while self.prefilling and self.prefilling[0].prefill_left == 0:
            self._prefill_done(self.prefilling.popleft(), now, in_window)
        return emitted_total, accepted_total

    def _advance_plain(self, m: int) -> tuple[int, bool, bool]:
        """Apply a step that verifies no draft to slots 0..m-1; return (emitted, any done, any past).

        `kernels.advance` with every ℓ = 0, in one slice addition: each running request (none
        has finished: finished ones leave the batch) emits its bonus token, one trace row on.
        A request is due (finishes, or runs past its trace rows) after the step when it had
        at most one step left before it: the least of OUT_LEN − EMITTED and ROW_END − ROW,
        one subtraction of two adjacent rows from two others (`batch_layout`). When the whole
        batch steps, `_quiet` carries that least count less the steps taken since, so steady
        steps skip the measure too. A join lowers it to the joiner's own count where that is
        fewer; every other change to the slots (a compaction or rotation, a trace
        continuation, a step that verified drafts) resets it to 0, "unknown". Under `--check`
        a skipped check is done anyway and must find nothing (`check_quiet`).
        """
        st = self.state
        whole = m == self.n
        quiet = self._quiet if whole else 0
        if quiet == 0:  # the fewest steps any of the m has left (measured after the batch changed)
            quiet = int((st[ROW_END : OUT_LEN + 1, :m] - st[ROW : EMITTED + 1, :m]).min())
        st[ROW : STEPS + 1, :m] += 1  # ROW, EMITTED, CONTEXT and STEPS advance together
        if quiet > 1:  # the usual step: nobody is due
            self._quiet = quiet - 1 if whole else 0
            if self.check:
                check_quiet(st, m, self.step_index)
            return m, False, False
        self._quiet = 0
        done = st[EMITTED, :m] >= st[OUT_LEN, :m]
        out = st[ROW, :m] >= st[ROW_END, :m]
        return m, bool(done.any()), bool((out & ~done).any())

    def _record_itl(self, m: int, n: int, now: float, gap_s: float, irregular: bool) -> None:
        """Record the inter-token gaps of the m requests this step advanced.

        Regularly, a request that also ran the step before waited exactly `gap_s` (the engine
        loop's time before this step, then the step) and one that joined since waited from its
        last emission (prefill, transfer, queueing, recompute). After a step some running
        request sat out (a prefill-first iteration, the context cap), every gap is read from
        its slot's last emission.
        """
        stats = self.stats
        if irregular:
            stats.add_itls(now - self.last_emit[:m])
            return
        # the joined ones, in slot order, which is the order they joined in: joins append, and
        # compaction and rotation keep the order of the slots that have not stepped yet
        num_joined = 0
        if self._joins_pending:
            joined = self.state[JOINED, :n].nonzero()[0]
            for last_at in self.last_emit[joined].tolist():  # a few: the ones that just joined
                stats.add_itl(now - last_at, 1)
            num_joined = joined.size
        stats.add_itl(gap_s, n - num_joined)

    def _prefill_done(self, req: Request, now: float, in_window: bool) -> None:
        """A (re)computed prompt is complete: a fresh one emits its first token, then decodes."""
        fresh = req.emitted == 0
        if fresh:
            req.emitted = 1
            req.context += 1
            self.kv_used += 1
            if self.cache is not None:
                self.cache.fit(self.kv_capacity - self.kv_used)
            req.first_token_at = req.last_emit_at = now
            if in_window:
                self.stats.window_tokens += 1
        if req.emitted >= req.spec.output_tokens:
            self._free(req)
            req.finish_at = now
            self.finish(req)
            return
        self._join(req)
