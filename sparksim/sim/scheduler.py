"""A replica's scheduler: its queue, admission under the KV and token limits, preemption, prompt work.

Kept apart from the step itself (`sparksim.sim.engine`: price, decide, replay, record), as
vLLM keeps its scheduler apart from its model runner. It owns the requests' cold state
(`Request`), the KV held (`kv_used`, with `sparksim.sim.prefix_cache` blocks counted once)
and the running batch's slots (`sparksim.sim.batch_slots`), and decides each step who
runs: which prompts get prefill tokens and how many running requests fit the context cap.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import simpy
from numpy.typing import NDArray

from sparksim.errors import ConfigError
from sparksim.sim.batch_slots import BatchSlots
from sparksim.sim.clock import Clock
from sparksim.sim.prefix_cache import PrefixCache
from sparksim.sim.workload import DomainSampler, RequestSpec
from sparksim.step.batch_layout import (
    ADMIT_SEQ,
    CONTEXT,
    DOM,
    RID,
    ROW,
    ROW_END,
    TRACE_CUR,
)


@dataclass(slots=True)
class Request:
    """A request's cold state: everything not needed every step, plus its hot state when parked."""

    spec: RequestSpec
    replica: int = -1
    first_token_at: float = math.nan
    finish_at: float = math.nan
    emitted: int = 0
    row: int = 0  # next trace row to replay
    row_end: int = 0  # end of the current trace request's rows
    trace_current: int = 0
    context: int = 0  # KV tokens held: prompt + emitted
    prefill_left: int = 0  # tokens still to (re)compute before decoding
    decode_steps: int = 0
    verified: int = 0
    accepted: int = 0
    preemptions: int = 0
    switches: int = 0
    admit_seq: int = 0  # first admission's order (kept on re-admission: preempt the newest)
    last_emit_at: float = math.nan  # when it last emitted a token (for ITL across gaps)
    cache_blocks: int = 0  # leading blocks of its prefix group's cached chain it references


class Scheduler(BatchSlots):
    """Who runs each step: the queue, admission, preemption and the step's prompt work.

    The engine sets the limits and the trace arrays below before its first step.
    """

    env: Clock
    replica: int
    max_batch_tokens: int  # the engine's token limit per step
    kv_capacity: int  # KV tokens this replica holds
    reserve: int  # KV slots a step may write per request (γ + 1 when drafting)
    chunk_tokens: int  # chunked prefill: prompt tokens per step at most
    prefill_first: bool  # whole prompts first, decoding stalls (vLLM V0, DistServe)
    max_context_tokens: int  # the context cap of a decode step (DistServe)
    _capped_last: int  # rows the context cap let the last capped step take
    sampler: DomainSampler
    rng: np.random.Generator
    t_offsets: NDArray[np.int64]  # trace request i's rows are t_offsets[i]..t_offsets[i + 1]
    queue: deque[Request]  # routed here, not admitted (preempted ones go back in front)
    prefilling: deque[Request]  # admitted, prompt (re)computing
    active: dict[int, Request]  # running, by request id (their hot state is in the slots)
    kv_used: int  # KV tokens held: admitted requests' own, plus referenced cached blocks once
    ctx_sum: int  # Σ context over the running batch
    cache: PrefixCache | None
    _block: int  # the prefix cache's block size (0 without one)
    admit_counter: int
    _joins_pending: bool  # some slot may hold JOINED = 1
    _idle: simpy.Event | None  # the loop waits on it while nothing is running

    @property
    def outstanding(self) -> int:
        """Requests queued, prefilling or running here (the least-outstanding router's load)."""
        return self.n + len(self.prefilling) + len(self.queue)

    def enqueue(self, req: Request) -> None:
        """Accept a request routed to this replica; wake the loop if it is idle."""
        req.replica = self.replica
        self.queue.append(req)
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def _admit(self) -> None:
        while self.queue:
            req = self.queue[0]
            if self.n + len(self.prefilling) >= self.max_concurrency:
                return
            if (self.n + len(self.prefilling) + 1) * self.reserve > self.max_batch_tokens:
                return  # INV-2: full verification of everyone, prefilling ones included, must fit
            need = req.spec.prompt_tokens + req.emitted
            if need + self.reserve > self.kv_capacity:
                raise ConfigError(
                    f"request {req.spec.request_id} needs {need} KV tokens + {self.reserve} reserved, "
                    f"more than cluster.kv_capacity_tokens={self.kv_capacity}: it could never run"
                )
            busy = self.n + len(self.prefilling) + 1
            hit = add = 0
            if self.cache is not None and req.prefill_left > 0:
                s = req.spec
                hit = self.cache.lookup(s.prefix_group, s.prefix_tokens, s.prompt_tokens)
                # shared blocks count once: only the ones nobody holds yet join the KV held
                add = self.cache.newly_pinned(s.prefix_group, hit) - hit
            if self.kv_used + need + add * self._block + busy * self.reserve > self.kv_capacity:
                return
            self.queue.popleft()
            if self.cache is not None and req.prefill_left > 0:
                self._use_cache(req, hit)
            if req.admit_seq == 0:
                self.admit_counter += 1
                req.admit_seq = self.admit_counter
            self.kv_used += need + add * self._block
            req.context = need
            if self.cache is not None:
                self.cache.fit(self.kv_capacity - self.kv_used)
            if req.prefill_left > 0:
                self.prefilling.append(req)
            else:
                self._join(req)

    def _use_cache(self, req: Request, hit: int) -> None:
        """Admit a prompt onto its `hit` cached blocks: its prefill starts after them."""
        assert self.cache is not None
        s = req.spec
        self.cache.count(s.prompt_tokens, hit, fresh=req.admit_seq == 0)
        self.cache.acquire(s.prefix_group, hit)
        req.cache_blocks = hit
        req.prefill_left -= hit * self._block

    def _cache_computed(self, req: Request) -> None:
        """Cache the full shared blocks a prefill chunk has completed (they leave the request's own KV)."""
        assert self.cache is not None
        s = req.spec
        done = min(req.context - req.prefill_left, s.prefix_tokens) // self._block
        if done > req.cache_blocks and self.cache.extend(s.prefix_group, req.cache_blocks, done):
            req.cache_blocks = done

    def _free(self, req: Request) -> None:
        """Give back the KV a request held (finished or preempted): its own tokens, and the cached
        blocks it was the last to reference, which stay cached in the free space."""
        if self.cache is None:
            self.kv_used -= req.context
            return
        freed = self.cache.release(req.spec.prefix_group, req.cache_blocks)
        self.kv_used -= req.context - (req.cache_blocks - freed) * self._block
        req.cache_blocks = 0

    def _join(self, req: Request) -> None:
        """Move a request whose KV is complete into the running batch."""
        i = self.n
        rid = req.spec.request_id
        # one column write, fields in the order ROW .. JOINED; its first gap in the batch runs
        # from its last emission (transfer, queueing, recompute), not from the last step
        self.state[:, i] = (
            req.row, req.emitted, req.context, req.decode_steps, req.verified, req.accepted, rid,
            req.row_end, req.spec.output_tokens, req.spec.domain, req.trace_current, req.admit_seq, 1,
        )
        self.active[rid] = req
        self.ctx_sum += req.context
        self.last_emit[i] = req.last_emit_at
        self._joins_pending = True
        if self._quiet:  # the batch's fewest steps left, now with the joiner's (`_advance_plain`)
            self._quiet = min(self._quiet, req.row_end - req.row, req.spec.output_tokens - req.emitted)
        self.n += 1
        if req.row >= req.row_end and req.emitted < req.spec.output_tokens:
            self._continue_traces(np.array([i]))

    def _park(self, i: int) -> Request:
        """Copy slot i's hot state back into its Request (on finish or preemption)."""
        (row, emitted, context, steps, verified, accepted, rid, row_end, _out, _dom, trace_cur,
         _seq, _joined) = self.state[:, i].tolist()
        req = self.active.pop(rid)
        self.ctx_sum -= context
        req.row, req.row_end, req.emitted, req.context = row, row_end, emitted, context
        req.decode_steps, req.verified, req.accepted, req.trace_current = steps, verified, accepted, trace_cur
        return req

    def _continue_traces(self, idx: NDArray[np.int64]) -> None:
        """Requests past the end of their trace request continue on another of the same domain.

        `idx`: the slots whose request is past its trace rows and still to emit (the callers
        have removed the finished ones), in slot order.
        """
        st = self.state
        self._quiet = 0
        # Python ints: a numpy scalar costs more than its arithmetic
        rows, ends = st[ROW, idx].tolist(), st[ROW_END, idx].tolist()
        doms, curs = st[DOM, idx].tolist(), st[TRACE_CUR, idx].tolist()
        for i, row, end, dom, cur in zip(idx.tolist(), rows, ends, doms, curs, strict=True):
            overshoot = row - end  # tokens emitted past the old end
            switches = 0
            while row >= end:
                cur = self.sampler.next_in_domain(self.rng, dom, cur)
                start, end = int(self.t_offsets[cur]), int(self.t_offsets[cur + 1])
                # like a fresh request, replay from position 1, moved on by the overshoot
                row = min(start + 1 + overshoot, end)
                overshoot = 0
                switches += 1
            st[ROW, i], st[ROW_END, i], st[TRACE_CUR, i] = row, end, cur
            self.active[int(st[RID, i])].switches += switches

    def _preempt_if_needed(self) -> None:
        """Preempt the newest running requests (recompute) until the step's KV reservation fits."""
        while self.n > 0 and self.kv_used + self.n * self.reserve > self.kv_capacity:
            i = int(np.argmax(self.state[ADMIT_SEQ, : self.n]))
            req = self._park(i)
            # its next gap (ITL) runs from its last emission: the end of its last step, which may
            # be before now (the engine loop's time since, steps it sat out under the context
            # cap), or its prefill's or an earlier step's when it is preempted before stepping
            req.last_emit_at = float(self.last_emit[i])
            keep = np.ones(self.n, dtype=bool)
            keep[i] = False
            self._compact(keep)
            self._free(req)
            req.preemptions += 1
            req.prefill_left = req.spec.prompt_tokens + req.emitted
            self.queue.appendleft(req)

    def _plan_prefill(self, budget: int) -> list[tuple[Request, int]]:
        """Choose this step's prompt work: (request, tokens) pairs, first come first served.

        Chunked (vLLM V1): up to `chunk_tokens` within the step's token budget, a prompt may
        be split across steps. Prefill-first (vLLM V0, DistServe): whole prompts while they
        fit the engine's token limit, the first one always (an over-long prompt runs alone).
        """
        plan: list[tuple[Request, int]] = []
        if self.prefill_first:
            left = self.max_batch_tokens
            for req in self.prefilling:
                if plan and req.prefill_left > left:
                    break
                plan.append((req, req.prefill_left))
                left -= req.prefill_left
            return plan
        left = min(self.chunk_tokens, budget)
        for req in self.prefilling:
            if left <= 0:
                break
            take = min(req.prefill_left, left)
            plan.append((req, take))
            left -= take
        return plan

    def _capped_rows(self, n: int) -> tuple[int, int]:
        """Return (m, their KV tokens): how many leading running requests fit the step's
        context-token cap (≥ 1), and the contexts they hold.

        Taken in batch order and stopping at the first that does not fit, as DistServe's
        decode batching does; the rest wait, and `_rotate` moves the stepped ones behind them.
        """
        # Only the leading rows up to the cap matter, and a long batch (thousands of requests
        # waiting on the cap, as DistServe's colocated benchmark holds) mostly waits: sum a
        # prefix twice the last step's rows, growing 4x until it passes the cap. Contexts are
        # positive, so past the first prefix sum over the cap every later one is over it too.
        context, cap = self.state[CONTEXT, :n], self.max_context_tokens
        k = min(n, max(2 * self._capped_last, 64))
        while True:
            held = context[:k].cumsum()
            if k == n or held[-1] > cap:
                break
            k = min(n, 4 * k)
        self._capped_last = m = max(1, int(held.searchsorted(cap, side="right")))
        return m, int(held[m - 1])
