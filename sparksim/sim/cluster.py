"""The serving cluster in SimPy: arrivals, the prefill pool, the router and the decode replicas.

`Cluster` wires the workload's arrival process to the engines. With disaggregated
prefill a request queues for the prefill instances (TTFT includes that queue); a free
instance takes every waiting prompt that fits its token budget, first come first served,
as one batch; each emits its first token when the batch ends, waits for its KV transfer,
and is routed to a decode replica. With colocated prefill it is routed on arrival and its prompt is
chunked into the replica's steps.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections import deque
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from sparksim.config import Scenario, resolve_path
from sparksim.cost.profile import Profile
from sparksim.policies import make_policy
from sparksim.sim.clock import Clock
from sparksim.sim.engine import Engine, kv_capacity_tokens
from sparksim.sim.prefix_cache import PrefixCache
from sparksim.sim.scheduler import Request
from sparksim.sim.workload import (
    DomainSampler,
    RequestSpec,
    interarrival_s,
    load_arrivals,
    lognormal_length,
    prefix_of,
    seed_streams,
)
from sparksim.step.records import (
    REQUEST_COLUMNS,
    STEP_COLUMNS,
    Columns,
    ParquetColumns,
    RequestRecord,
    StreamStats,
)
from sparksim.traces.format import TraceSet


class Cluster:
    """Everything one simulation runs: build it, then `run()` to the horizon."""

    def __init__(
        self,
        scenario: Scenario,
        profile: Profile,
        traces: TraceSet,
        prefill_profile: Profile | None = None,
        base_dir: Path | None = None,
        records_dir: Path | None = None,
    ) -> None:
        """`records_dir`: stream the request and step tables to parquet files there
        (`records.ParquetColumns`) instead of holding them; None keeps them in memory."""
        self.scenario = scenario
        self.env = Clock()
        self.profile = profile
        self.prefill_profile = prefill_profile or profile
        self.traces = traces
        self.base_dir = base_dir
        streams = seed_streams(scenario.seed, scenario.workload)
        self.rng_workload, self.rng_users = streams.workload, streams.users
        self.rng_prefix, self.rng_prefix_users = streams.prefix, streams.prefix_users
        rng_traces = streams.traces
        self.sampler = DomainSampler(traces, scenario.workload.mix)
        run = scenario.run
        self.stats = StreamStats.for_run(run, traces.gamma)
        self.request_records = (Columns(REQUEST_COLUMNS) if records_dir is None
                                else ParquetColumns(REQUEST_COLUMNS, records_dir / "requests.parquet"))
        self.step_records = None if not run.records.steps else (
            Columns(STEP_COLUMNS) if records_dir is None
            else ParquetColumns(STEP_COLUMNS, records_dir / "steps.parquet"))
        pol = scenario.policy
        self.policies = [
            make_policy(pol.name, traces.gamma, pol.params) for _ in range(scenario.cluster.replicas)
        ]
        self.engines = [
            Engine(
                self.env, i, scenario, profile, traces, self.policies[i], self.sampler,
                rng_traces, self.stats, self.step_records, self._finished,
            )
            for i in range(scenario.cluster.replicas)
        ]
        self._prefill_queue: deque[Request] = deque()
        pf = scenario.cluster.prefill
        self._prefill_idle = list(range(pf.instances))  # instances with nothing to do
        pc = scenario.cluster.prefix_cache
        self.caching = pc.enabled
        # prefix caching happens where prompts are prefilled: in the engines (colocated) or
        # on each instance of the prefill pool (disaggregated), in the KV space it leaves free
        self.pool_caches = (
            [PrefixCache(pc.block_tokens) for _ in range(pf.instances)]
            if pc.enabled and pf.mode == "disaggregated" else None)
        self._pool_capacity = (kv_capacity_tokens(scenario, self.prefill_profile) or 1 << 62
                               if self.pool_caches is not None else 0)
        self.prefill_batches = 0
        self.next_id = 0
        self.rr_next = 0
        self.arrived = 0
        self.arrived_in_window = 0
        self.finished = 0
        self.prefilling = 0  # in the disaggregated pool or its KV transfer
        # an open loop with a request limit (or a replay) ends when its last request finishes
        self._arrivals_over = False
        self._drained = self.env.event()
        self.ended_at: float | None = None  # when the last request finished, if before the horizon
        self._lengths_from_traces = scenario.workload.lengths.source == "traces"
        self._trace_prompt = traces.request_columns["prompt_tokens"]
        self._trace_output = traces.request_columns["output_tokens"]
        wl = scenario.workload
        # read before the simulation starts (the runner has already read and checked it)
        self._arrivals = (load_arrivals(resolve_path(wl.arrivals_csv, base_dir), self.sampler.domains)
                          if wl.kind == "replay" and wl.arrivals_csv else None)

    # ------------------------------------------------------------------ requests

    def new_request(self, at: float, user: int = -1, prompt: int | None = None,
                    output: int | None = None, domain: int | None = None,
                    prefix: tuple[int, int] | None = None) -> Request:
        """Draw a request arriving at `at` (lengths, domain and, when prefixes are cached, its
        prefix group (group, shared tokens) from the workload unless given)."""
        wl = self.scenario.workload
        rng = self.rng_users[user] if user >= 0 else self.rng_workload
        if domain is None:
            dom, trace_req = self.sampler.draw(rng)
        else:
            dom = domain
            pool = self.sampler.by_domain[dom]
            trace_req = int(pool[rng.integers(pool.size)])
        if prompt is None or output is None:
            if self._lengths_from_traces:
                prompt = int(self._trace_prompt[trace_req])
                output = int(self._trace_output[trace_req])
            else:
                prompt = lognormal_length(rng, wl.lengths.prompt)
                output = lognormal_length(rng, wl.lengths.output)
        spec = RequestSpec(self.next_id, at, max(int(prompt), 1), max(int(output), 1), dom,
                           trace_req, user)
        if self.caching:
            # no prefix declared: nothing to draw (and no per-user prefix streams to draw from)
            if prefix is None and wl.kind != "replay" and wl.prefix.tokens:
                prefix = prefix_of(self.rng_prefix_users[user] if user >= 0 else self.rng_prefix,
                                   wl.prefix, spec.prompt_tokens)
            if prefix is not None:
                spec.prefix_group, spec.prefix_tokens = prefix
        self.next_id += 1
        start = int(self.traces.offsets[trace_req])
        req = Request(
            spec=spec,
            row=start + 1,  # the prefill emits position 0; decoding starts at position 1
            row_end=int(self.traces.offsets[trace_req + 1]),
            trace_current=trace_req,
        )
        return req

    def submit(self, req: Request) -> None:
        """A request arrives now: prefill it on the pool or route it to a replica."""
        self.arrived += 1
        if self.stats.in_window(self.env.now):
            self.arrived_in_window += 1
        if self.scenario.cluster.prefill.mode == "disaggregated":
            self.prefilling += 1
            self._disaggregated_prefill(req)
        else:
            req.prefill_left = req.spec.prompt_tokens
            self.route(req).enqueue(req)

    def route(self, req: Request) -> Engine:
        if self.scenario.cluster.router == "round-robin":
            eng = self.engines[self.rr_next % len(self.engines)]
            self.rr_next += 1
            return eng
        return min(self.engines, key=lambda e: (e.outstanding, e.replica))

    def _disaggregated_prefill(self, req: Request) -> None:
        """Queue a prompt on the prefill pool and start a batch if an instance is idle."""
        self._prefill_queue.append(req)
        self._start_prefill_batches()

    def _start_prefill_batches(self) -> None:
        """Give each idle instance a batch: whole prompts, FCFS, while they fit its token budget.

        The first prompt always goes (a prompt over the budget runs alone); the batch stops at
        the first prompt that does not fit, as DistServe's and vLLM's prefill schedulers do.
        One timed callback per batch, no SimPy process per request.
        """
        if self.pool_caches is not None:
            self._start_cached_prefill_batches()
            return
        budget = self.scenario.cluster.prefill.max_batch_tokens
        queue = self._prefill_queue
        while self._prefill_idle and queue:
            batch = [queue.popleft()]
            left = budget - batch[0].spec.prompt_tokens
            while queue and queue[0].spec.prompt_tokens <= left:
                left -= queue[0].spec.prompt_tokens
                batch.append(queue.popleft())
            instance = self._prefill_idle.pop(0)
            self.prefill_batches += 1
            service_s = self.prefill_profile.prefill_s([r.spec.prompt_tokens for r in batch])
            ev = self.env.timeout(service_s)
            ev.callbacks.append(functools.partial(self._prefill_batch_done, instance, batch))

    def _start_cached_prefill_batches(self) -> None:
        """`_start_prefill_batches` with each instance's prefix cache: a prompt's cached blocks
        are skipped, so its tokens to compute (what the budget counts, as vLLM's token budget
        does) start after them, and its attention still reads them.

        The lowest idle instance takes the batch (the router knows nothing of the caches); the
        batch's hits are pinned until it ends, and the cache keeps to the KV space the
        batch's own prompts leave free.
        """
        assert self.pool_caches is not None
        budget = self.scenario.cluster.prefill.max_batch_tokens
        queue = self._prefill_queue
        while self._prefill_idle and queue:
            instance = self._prefill_idle.pop(0)
            cache = self.pool_caches[instance]
            block = cache.block_tokens
            batch: list[Request] = []
            left = budget
            while queue:
                s = queue[0].spec
                hit = cache.lookup(s.prefix_group, s.prefix_tokens, s.prompt_tokens)
                if batch and s.prompt_tokens - hit * block > left:
                    break
                req = queue.popleft()
                cache.count(s.prompt_tokens, hit, fresh=True)
                cache.acquire(s.prefix_group, hit)
                req.cache_blocks = hit
                left -= s.prompt_tokens - hit * block
                batch.append(req)
            own = sum(r.spec.prompt_tokens - r.cache_blocks * block for r in batch)
            cache.fit(self._pool_capacity - own - cache.pinned_blocks * block)
            self.prefill_batches += 1
            prof = self.prefill_profile
            service_s = prof.prefill_dense_s(float(own)) + prof.chunks_attention_s(
                [(r.spec.prompt_tokens - r.cache_blocks * block, r.cache_blocks * block) for r in batch])
            ev = self.env.timeout(service_s)
            ev.callbacks.append(functools.partial(self._prefill_batch_done, instance, batch))

    def _prefill_batch_done(self, instance: int, batch: list[Request], _ev: simpy.Event) -> None:
        bisect.insort(self._prefill_idle, instance)
        if self.pool_caches is not None:
            # the computed prefix blocks are cached; the prompts' KV leaves for the decode replicas
            cache = self.pool_caches[instance]
            for req in batch:
                s = req.spec
                full = min(s.prefix_tokens, s.prompt_tokens) // cache.block_tokens
                if cache.extend(s.prefix_group, req.cache_blocks, full):
                    req.cache_blocks = full
                cache.release(s.prefix_group, req.cache_blocks)
                req.cache_blocks = 0
        for req in batch:
            self._first_token(req)
        self._start_prefill_batches()

    def _first_token(self, req: Request) -> None:
        """The prefill emitted the first token; its KV cache now travels to a decode replica."""
        now = self.env.now
        req.emitted = 1
        req.first_token_at = req.last_emit_at = now
        if self.stats.in_window(now):
            self.stats.window_tokens += 1
        if req.spec.output_tokens <= 1:
            self.prefilling -= 1
            req.finish_at = now
            self._finished(req)
            return
        pf = self.scenario.cluster.prefill
        transfer = pf.kv_transfer_s
        if pf.kv_transfer_tokens_per_s:
            transfer += req.spec.prompt_tokens / pf.kv_transfer_tokens_per_s
        if transfer > 0:
            ev = self.env.timeout(transfer)
            ev.callbacks.append(lambda _ev: self._transferred(req))
        else:
            self._transferred(req)

    def _transferred(self, req: Request) -> None:
        self.prefilling -= 1
        self.route(req).enqueue(req)

    def _finished(self, req: Request) -> None:
        self.finished += 1
        if self._arrivals_over and self.finished == self.arrived and not self._drained.triggered:
            self._drained.succeed()
        s = req.spec
        self.request_records.append_row(RequestRecord(
            s.request_id, s.user, req.replica, s.domain, s.trace_request, s.arrival_at,
            req.first_token_at, req.finish_at, s.prompt_tokens, s.output_tokens, req.emitted,
            req.decode_steps, req.verified, req.accepted, req.preemptions, req.switches,
        ))
        if s.user >= 0:
            self._user_next(s.user)

    # ------------------------------------------------------------------ arrivals

    def _user_next(self, user: int) -> None:
        think = self.scenario.workload.think_time_s
        if think <= 0:
            self.submit(self.new_request(self.env.now, user))
        else:
            self.env.process(self._think(user, think))

    def _think(self, user: int, think: float) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(think)
        self.submit(self.new_request(self.env.now, user))

    def _open_loop(self) -> Generator[simpy.Event, Any, None]:
        wl = self.scenario.workload
        limit = self.scenario.run.max_requests or math.inf
        count = 0
        while count < limit:
            # the first request arrives at t = 0 (as DistServe's and vLLM's benchmarks send it)
            if count:
                yield self.env.timeout(interarrival_s(self.rng_workload, wl))
            self.submit(self.new_request(self.env.now))
            count += 1
        self._arrivals_over = True

    def _replay(self) -> Generator[simpy.Event, Any, None]:
        cols = self._arrivals
        assert cols is not None
        arrival = cols["arrival_s"]
        limit = self.scenario.run.max_requests or len(arrival)
        prompt = cols["prompt_tokens"].astype(np.int64)
        output = cols["output_tokens"].astype(np.int64)
        doms = [self.sampler.domains.index(str(d)) for d in cols["domain"]] if "domain" in cols else None
        groups = cols.get("prefix_group")
        shared = cols.get("prefix_tokens") if groups is not None else None
        for k in range(min(limit, len(arrival))):
            if arrival[k] > self.env.now:
                yield self.env.timeout(float(arrival[k]) - self.env.now)
            self.submit(self.new_request(
                self.env.now, prompt=int(prompt[k]), output=int(output[k]),
                domain=None if doms is None else doms[k],
                prefix=None if groups is None or shared is None else (int(groups[k]), int(shared[k])),
            ))
        self._arrivals_over = True

    def start_workload(self) -> None:
        wl = self.scenario.workload
        if wl.kind == "closed":
            for user in range(wl.concurrency):
                self.submit(self.new_request(0.0, user))
        elif wl.kind == "replay":
            self.env.process(self._replay())
        else:
            self.env.process(self._open_loop())

    def run(self, progress: Any = None) -> None:
        """Simulate to the horizon, or until a finite workload's last request finishes.

        `progress(sim_now)` is called about 100 times if given.
        """
        self.start_workload()
        horizon = self.scenario.run.duration_s
        steps = 1 if progress is None else 100
        for k in range(1, steps + 1):
            until = horizon * k / steps
            if not self._drained.triggered:
                self.env.run(until=self.env.any_of([self._drained, self.env.timeout(until - self.env.now)]))
            if self._drained.triggered:
                self.ended_at = self.env.now
                # the window ends with the busy period; one that ends before the warm-up does
                # leaves the window empty (the runner warns), never of negative length
                self.stats.window_end = max(min(self.stats.window_end, self.env.now), self.stats.window_start)
                break
            if progress is not None:
                progress(self.env.now)
        if progress is not None:
            progress(horizon)

    # ------------------------------------------------------------------ conservation

    def waiting_in_window(self) -> int:
        """Return the steady window's arrivals that have not started decoding at the horizon.

        Queued for a replica, for the prefill pool, or mid chunked prefill (a prompt in the
        pool's own prefill is not counted: at most a batch per instance). A queue that keeps
        up leaves a few; one that grows leaves a share of the window's arrivals
        (`frontier.overloaded`), where a request still decoding only says it is long.
        """
        waiting = [*self._prefill_queue]
        for e in self.engines:
            waiting += [*e.queue, *e.prefilling]
        # a preempted request back in the queue (or recomputing) has decoded: it is not counted
        return sum(self.stats.in_window(r.spec.arrival_at) and r.decode_steps == 0 for r in waiting)

    def census(self) -> dict[str, int]:
        """Where every arrival is at the horizon (INV-7)."""
        running = sum(e.n + len(e.prefilling) for e in self.engines)
        queued = sum(len(e.queue) for e in self.engines)
        return {
            "arrived": self.arrived,
            "finished": self.finished,
            "running": running,
            "queued": queued,
            "prefill_pool": self.prefilling,
        }
