"""The live engine: real drafting, the simulator's policies, real verification, wall-clock time.

One process, one engine (replica), continuous batching, colocated prefill-first
scheduling (a step that has prompts to prefill runs only them, as vLLM V0 and DistServe
do, and `cluster.prefill.schedule: prefill-first` simulates). Each decode step:

1. drafts a block for every running request in one batched drafter call (the positions
   the policy drafts: the block, or γ for static γ), with the drafter's real confidences
   (STS-calibrated as the trace set's were);
2. hands them, with the step's cost read from the engine's own measured profile, to the
   same `Policy.decide` the simulator calls;
3. verifies every request's chosen prefix in one batched target forward over the flattened
   tokens (anchor + ℓ_r drafts each, KV cached per slot);
4. runs exact rejection sampling: draft k is kept with probability min(1, p_t/p_d) until
   the first rejection, which is replaced by a sample of norm(max(0, p_t − p_d)); if all ℓ
   pass, a bonus token is sampled from p_t;
5. emits, times the step with the wall clock, and records it in the simulator's tables.

Requests are drawn exactly as the simulator draws them (same seeds, same `DomainSampler`
over the trace set), so user u's k-th request asks the same prompt in both; the response
is whatever the target writes (up to EOS or the trace set's `max_new_tokens`).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sparksim.config import Scenario
from sparksim.cost.pricing import StepCost, known_decision_s
from sparksim.cost.profile import Profile
from sparksim.drafter.model import Drafter, draft, to_probs
from sparksim.drafter.target import TinyLM
from sparksim.errors import ConfigError, SparksimError
from sparksim.live.step import (
    DrafterKV,
    Ragged,
    TargetKV,
    drafter_step,
    inject_context,
    target_step,
)
from sparksim.policies.base import Policy, StepBatch, drafted_positions
from sparksim.sim.workload import DomainSampler, interarrival_s, seed_streams
from sparksim.step.records import (
    REQUEST_COLUMNS,
    STEP_COLUMNS,
    Columns,
    RequestRecord,
    StepRecord,
    StreamStats,
)
from sparksim.traces.format import TraceSet


class LiveError(SparksimError):
    """The live run stopped: a policy misbehaved or an input could not be served."""


@dataclass
class LiveModels:
    """The target, the drafter and its calibration, as the live engine runs them."""

    target: TinyLM
    drafter: Drafter | None
    temps: np.ndarray[Any, np.dtype[np.float64]]  # (γ,) STS temperatures (ones if uncalibrated)
    gamma: int
    eos_id: int
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, target_dir: Path, drafter_dir: Path | None) -> LiveModels:
        """Load a built-in target and (optionally) a drafter folder, recording their checksums."""
        from sparksim.drafter.config import load_json
        from sparksim.drafter.target import BuiltinTarget, load_target
        from sparksim.drafter.tokenizer import get_tokenizer
        from sparksim.drafter.train import load_drafter

        tgt = load_target(target_dir)
        if not isinstance(tgt, BuiltinTarget):
            raise ConfigError(f"{target_dir}: the live engine runs the built-in target (model_type "
                              "sparksim-tinylm); HF targets are not supported yet")
        info: dict[str, Any] = {"target": str(target_dir),
                                "target_sha256": file_sha256(target_dir / "model.safetensors")}
        drafter, gamma, temps = None, 0, np.ones(0)
        if drafter_dir is not None:
            drafter = load_drafter(drafter_dir, tgt)
            gamma = drafter.cfg.gamma
            cal = drafter_dir / "calibration.json"
            temps = (np.asarray(load_json(cal)["temperatures"], np.float64) if cal.is_file()
                     else np.ones(gamma))
            info |= {"drafter": str(drafter_dir), "drafter_kind": drafter.cfg.kind,
                     "drafter_sha256": file_sha256(drafter_dir / "drafter.safetensors"),
                     "calibration": "sts" if cal.is_file() else "none"}
        return cls(tgt.model, drafter, temps, gamma, get_tokenizer(tgt.tokenizer_name).eos_id, info)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class LiveRequest:
    request_id: int
    user: int
    domain: int
    trace_request: int
    arrival_at: float
    prompt: list[int]
    first_token_at: float = math.nan
    finish_at: float = math.nan
    last_emit_at: float = math.nan
    tokens: list[int] = field(default_factory=list)  # emitted output tokens
    length: int = 0  # target KV tokens cached (all but the anchor)
    decode_steps: int = 0
    verified: int = 0
    accepted: int = 0


def choose_lengths(policy: Policy, profile: Profile, conf: np.ndarray[Any, np.dtype[np.float64]],
                   request_ids: list[int], kv_tokens: int, kv_longest: int, step_index: int,
                   max_batch_tokens: int, positions: int, drafter: str | None, decision_s: float = 0.0
                   ) -> tuple[StepBatch, np.ndarray[Any, np.dtype[np.int64]]]:
    """Ask the policy for ℓ as the simulator's engine asks it (same StepBatch, same cost), and check it.

    `conf` (m, γ) holds the calibrated confidences of the drafted positions (zeros past them);
    `decision_s` the decision's time known before it (a sync pipeline's), which the price counts.
    Raises LiveError naming the step and the policy if the policy raises or answers out of range.
    """
    m = len(request_ids)
    batch = StepBatch(
        request_ids=np.array(request_ids, np.int64), conf=conf, survival=np.cumprod(conf, axis=1),
        fixed_tokens=m, max_tokens=max_batch_tokens,
        # the engine loop's time before the step and a sync pipeline's known decision time are
        # part of its price, as the simulator's engine counts them (`Engine._plan`)
        cost=StepCost.for_decode(profile, m, kv_tokens, positions, drafter, kv_longest,
                                 loop_s=profile.loop_s(True, "decode", m), decision_s=decision_s),
        step_index=step_index)
    try:
        lengths = np.asarray(policy.decide(batch), dtype=np.int64)
    except Exception as exc:
        raise LiveError(f"step {step_index}: policy {policy.label()!r} raised "
                        f"{type(exc).__name__}: {exc}") from exc
    if lengths.shape != (m,) or (lengths < 0).any() or (lengths > positions).any():
        raise LiveError(f"step {step_index}: policy {policy.label()!r} returned lengths "
                        f"{lengths.tolist()} for {m} requests (each must be in 0..{positions}, the "
                        "positions drafted)")
    if m + int(lengths.sum()) > max_batch_tokens:
        raise LiveError(f"step {step_index}: policy {policy.label()!r} sent "
                        f"{m + int(lengths.sum())} tokens, over max_batch_tokens={max_batch_tokens}")
    return batch, lengths


Progress = Callable[[float, int], None]  # (seconds into the run, engine steps)


Choose = Callable[[np.ndarray[Any, np.dtype[np.float64]]], np.ndarray[Any, np.dtype[np.int64]]]


@dataclass
class DecodeOutcome:
    """What one decode step did, per running request (slot order) and in time."""

    lengths: np.ndarray[Any, np.dtype[np.int64]]  # ℓ_r verified
    accepted: list[int]  # drafts accepted (before any EOS / length cut)
    emitted: list[int]  # tokens emitted (after the cut)
    finished: list[LiveRequest]
    kv_tokens: int  # Σ (prompt + emitted) before the step: the simulator's KV measure
    draft_s: float  # drafting, sampling the drafts, and writing the drafter's context for kept tokens
    decision_s: float  # the policy's decide
    verify_s: float  # the rest: target forward, rejection sampling, emission
    step_s: float


class LiveBatch:
    """The running batch on the real models: slots, KV caches, and one step at a time.

    `prefill` and `decode` are the engine's step functions; the workload loop (`LiveEngine`)
    and the profiler (`sparksim.live.profile`) both drive them.
    """

    def __init__(self, models: LiveModels, slots: int, positions: int, *, temperature: float,
                 max_new_tokens: int, seed: int) -> None:
        max_len = models.target.cfg.max_seq_len
        self.models, self.positions, self.temperature, self.max_new = models, positions, temperature, max_new_tokens
        self.gamma = models.gamma
        self.kv = TargetKV(models.target, slots, max_len)
        self.dkv = DrafterKV(models.drafter, slots, max_len) if positions and models.drafter else None
        self.gen = torch.Generator().manual_seed(seed)  # drafts and rejection sampling
        self.running: list[LiveRequest] = []  # slot i holds running[i]

    def prefill(self, batch: list[LiveRequest], now: Callable[[], float]) -> tuple[int, float]:
        """Prefill whole prompts into new slots; each emits its first token. Returns (tokens, seconds)."""
        t_start = time.perf_counter()
        lo = len(self.running)
        rg = Ragged.build([0] * len(batch), [len(r.prompt) for r in batch])
        ids = torch.tensor([t for r in batch for t in r.prompt], dtype=torch.long)
        logits, hidden = target_step(self.models.target, self.kv, lo, ids, rg)
        probs = to_probs(logits[torch.cumsum(rg.counts, 0) - 1], self.temperature)  # (k, V)
        first = (torch.multinomial(probs, 1, generator=self.gen)[:, 0] if self.temperature > 0
                 else probs.argmax(-1))
        if self.dkv is not None and self.models.drafter is not None:
            keep = torch.ones(rg.tokens, dtype=torch.bool)
            inject_context(self.models.drafter, self.dkv, hidden, keep, rg.row + lo, rg.pos)
        at = now()
        for r, tok in zip(batch, first.tolist(), strict=True):
            r.length = len(r.prompt)
            r.tokens.append(int(tok))
            r.first_token_at = r.last_emit_at = at
            self.running.append(r)
        return rg.tokens, time.perf_counter() - t_start

    def done(self, r: LiveRequest) -> bool:
        return r.tokens[-1] == self.models.eos_id or len(r.tokens) >= self.max_new

    def decode(self, choose: Choose, drafting: bool = True) -> DecodeOutcome:
        """One decode step of every running request; `choose(conf)` returns the lengths ℓ (m,).

        `drafting=False` runs no drafter and asks `choose` nothing: a plain step (every ℓ = 0),
        the drafter's KV still fed the kept tokens."""
        t_start = time.perf_counter()
        reqs = self.running
        m, p = len(reqs), self.positions if drafting else 0
        starts = [r.length for r in reqs]
        anchor_ids = torch.tensor([r.tokens[-1] for r in reqs], dtype=torch.long)
        lengths = np.zeros(m, dtype=np.int64)
        d = None
        draft_s = decision_s = 0.0
        if p:
            assert self.models.drafter is not None and self.dkv is not None
            block = drafter_step(self.models.drafter, self.dkv, torch.tensor(starts), anchor_ids, p)
            with torch.inference_mode():
                d = draft(self.models.drafter, block, anchor_ids[:, None], self.temperature, self.gen)
            conf = np.zeros((m, self.gamma))
            z = d.conf_logits[:, 0].numpy().astype(np.float64)  # (m, p) raw confidence logits
            conf[:, :p] = 0.5 * (1.0 + np.tanh(0.5 * z / self.models.temps[:p]))  # σ(z / T_k)
            t_dec = time.perf_counter()
            draft_s = t_dec - t_start
            lengths = choose(conf)
            decision_s = time.perf_counter() - t_dec
        ell = torch.from_numpy(lengths)
        rg = Ragged.build(starts, (ell + 1).tolist())
        ids = anchor_ids[rg.row].clone()
        if d is not None and int(ell.max()) > 0:
            has = rg.col > 0
            ids[has] = d.tokens[rg.row[has], 0, rg.col[has] - 1]
        logits, hidden = target_step(self.models.target, self.kv, 0, ids, rg)
        acc, new = self._accept(logits, rg, ell, d)
        if self.dkv is not None and self.models.drafter is not None:
            # the drafter's share of the step: its context for the tokens the target kept
            t_inj = time.perf_counter()
            inject_context(self.models.drafter, self.dkv, hidden, rg.col <= acc[rg.row], rg.row, rg.pos)
            draft_s += time.perf_counter() - t_inj
        acc_l, new_l = acc.tolist(), new.tolist()
        drafts = d.tokens[:, 0].tolist() if d is not None else None
        emitted, finished = [], []
        eos = self.models.eos_id
        for i, r in enumerate(reqs):
            a = acc_l[i]
            out = (drafts[i][:a] if drafts is not None else []) + [new_l[i]]
            if eos in out:
                out = out[: out.index(eos) + 1]
            out = out[: self.max_new - len(r.tokens)]
            r.tokens.extend(out)
            r.length += a + 1
            r.decode_steps += 1
            r.verified += int(lengths[i])
            r.accepted += len(out) - 1  # after the EOS / length cut, as the simulator counts (INV-1)
            emitted.append(len(out))
            if self.done(r):
                finished.append(r)
        t_end = time.perf_counter()
        return DecodeOutcome(lengths, acc_l, emitted, finished, sum(starts) + m, draft_s, decision_s,
                             t_end - t_start - draft_s - decision_s, t_end - t_start)

    def _accept(self, logits: torch.Tensor, rg: Ragged, ell: torch.Tensor, d: Any
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact rejection sampling: (accepted drafts (m,), the correction or bonus token (m,))."""
        m = ell.shape[0]
        p_t = rg.padded(to_probs(logits, self.temperature))  # (m, q_max, V)
        top = int(ell.max())
        ar = torch.arange(m)
        if d is None or top == 0:
            acc = torch.zeros(m, dtype=torch.long)
            resid = p_t[:, 0]
        else:
            p_d = d.probs[:, 0, :top]  # (m, top, V)
            tok = d.tokens[:, 0, :top]
            pt = p_t[:, :top].gather(-1, tok[..., None])[..., 0]
            pd_ = p_d.gather(-1, tok[..., None])[..., 0]
            ratio = torch.where(pd_ > 0, pt / pd_.clamp(min=1e-30), torch.zeros_like(pt)).clamp(max=1.0)
            u = torch.rand(ratio.shape, generator=self.gen)
            ok = (u < ratio) & (torch.arange(top)[None] < ell[:, None])
            acc = ok.long().cumprod(-1).sum(-1)
            rejected = acc < ell
            row_t = p_t[ar, acc]  # (m, V): the target's distribution after the kept drafts
            row_d = p_d[ar, acc.clamp(max=top - 1)] * rejected[:, None]  # bonus: no draft to remove
            resid = (row_t - row_d).clamp(min=0)
            total = resid.sum(-1, keepdim=True)
            resid = torch.where(total > 0, resid / total.clamp(min=1e-30), row_t)
        if self.temperature == 0:
            return acc, resid.argmax(-1)
        return acc, torch.multinomial(resid, 1, generator=self.gen)[:, 0]

    def release(self, r: LiveRequest) -> None:
        """Free a request's slot: the last slot's request moves into it (its caches copied)."""
        i = self.running.index(r)
        last = len(self.running) - 1
        if i != last:
            moved = self.running[last]
            self.kv.move(last, i, moved.length)
            if self.dkv is not None:
                self.dkv.move(last, i, moved.length)
            self.running[i] = moved
        self.running.pop()


class LiveEngine:
    """Serve a scenario's workload on the real models, in real time, for its duration."""

    def __init__(self, scenario: Scenario, models: LiveModels, policy: Policy, profile: Profile,
                 traces: TraceSet, prompts: list[list[int]], *, temperature: float, max_new_tokens: int,
                 progress: Progress | None = None) -> None:
        cl = scenario.cluster
        if cl.replicas != 1:
            raise ConfigError(f"cluster.replicas={cl.replicas}: the live engine runs one replica")
        if cl.prefill.mode != "colocated" or cl.prefill.schedule != "prefill-first":
            raise ConfigError("the live engine schedules colocated prefill-first steps; set "
                              "cluster.prefill.mode=colocated and cluster.prefill.schedule=prefill-first")
        if cl.prefix_cache.enabled:
            raise ConfigError("cluster.prefix_cache.enabled=true: the live engine does not cache "
                              "prefixes; simulate it with `sparksim run`")
        if policy.reads_outcome:
            raise ConfigError(f"policy {policy.name!r} reads the outcome before verifying; no real "
                              "engine can run it")
        if policy.drafts and models.drafter is None:
            raise ConfigError(f"policy {policy.name!r} drafts; give the live engine a --drafter")
        if policy.drafts and models.gamma != traces.gamma:
            raise ConfigError(f"the drafter's γ={models.gamma} differs from the trace set's "
                              f"γ={traces.gamma}")
        if len(prompts) != traces.num_requests:
            raise ConfigError(f"{len(prompts)} prompts for {traces.num_requests} trace requests: the "
                              "prompt file must be the one the trace set was recorded on")
        max_len = models.target.cfg.max_seq_len
        longest = max(len(p) for p in prompts) + max_new_tokens + traces.gamma + 1
        if longest > max_len:
            raise ConfigError(f"a prompt of {max(len(p) for p in prompts)} tokens + {max_new_tokens} new "
                              f"+ γ+1 reaches {longest} positions, more than the target's max_seq_len="
                              f"{max_len}")
        self.scenario, self.policy, self.profile = scenario, policy, profile
        self.prompts, self.progress = prompts, progress
        self.gamma = traces.gamma
        # the built-in drafters are block drafters: every drafting step drafts the whole block
        self.positions = drafted_positions(policy, profile, scenario.policy.drafter, traces.gamma)
        self.max_concurrency, self.max_batch_tokens = cl.max_concurrency, cl.max_batch_tokens
        self.batch = LiveBatch(models, cl.max_concurrency, self.positions, temperature=temperature,
                               max_new_tokens=max_new_tokens, seed=scenario.seed + 12345)
        streams = seed_streams(scenario.seed, scenario.workload)  # the simulator's streams
        self.rng_workload, self.rng_users = streams.workload, streams.users
        self.sampler = DomainSampler(traces, scenario.workload.mix)
        self.stats = StreamStats.for_run(scenario.run, self.gamma)
        self.request_records = Columns(REQUEST_COLUMNS)
        self.step_records = Columns(STEP_COLUMNS)
        self.waiting: deque[LiveRequest] = deque()
        # arrivals still to come, in time order: (at, user, (domain, trace request) drawn when the
        # arrival was planned, or None to draw at arrival); open-loop ones and thinking users'
        self.pending: deque[tuple[float, int, tuple[int, int] | None]] = deque()
        self.next_id = 0
        self.arrived = self.arrived_in_window = self.finished = 0
        self.step_index = 0
        self.t0 = 0.0
        self.ended_at: float | None = None
        self._step_batch: StepBatch | None = None  # the decode step's batch, for observe()
        self.asks_drafting = type(policy).drafts_at is not Policy.drafts_at

    # ------------------------------------------------------------------ workload

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _new_request(self, at: float, user: int, drawn: tuple[int, int] | None = None) -> None:
        rng = self.rng_users[user] if user >= 0 else self.rng_workload
        dom, trace_req = drawn if drawn is not None else self.sampler.draw(rng)
        self.waiting.append(LiveRequest(self.next_id, user, dom, trace_req, at, self.prompts[trace_req]))
        self.next_id += 1
        self.arrived += 1
        if self.stats.in_window(at):
            self.arrived_in_window += 1

    def _plan_open_loop(self) -> None:
        wl, run = self.scenario.workload, self.scenario.run
        if wl.kind == "replay":
            raise ConfigError("workload.kind=replay is not supported by the live engine")
        limit = run.max_requests or math.inf
        at, count = 0.0, 0
        while count < limit and at <= run.duration_s:
            # the simulator's draws in its order on the one stream: a request's domain and trace
            # request, then the gap to the next (`Cluster._open_loop`), so a seed pairs the two
            drawn = self.sampler.draw(self.rng_workload)
            self.pending.append((at, -1, drawn))  # the first request arrives at t = 0, as the simulator's
            count += 1
            at += interarrival_s(self.rng_workload, wl)

    # ------------------------------------------------------------------ the run

    def run(self) -> None:
        """Serve until the horizon (or until an open loop's last request finishes)."""
        wl, horizon = self.scenario.workload, self.scenario.run.duration_s
        self.t0 = time.perf_counter()
        if wl.kind == "closed":
            for user in range(wl.concurrency):
                self._new_request(0.0, user)
        else:
            self._plan_open_loop()
        last_report = 0.0
        while self.now() < horizon:
            now = self.now()
            while self.pending and self.pending[0][0] <= now:
                self._new_request(*self.pending.popleft())
            running = self.batch.running
            if not running and not self.waiting:
                if not self.pending:
                    self.ended_at = now
                    # never before the warm-up's end: an empty window, not a negative one
                    self.stats.window_end = max(min(self.stats.window_end, now), self.stats.window_start)
                    break
                time.sleep(max(self.pending[0][0] - now, 0.0))
                continue
            if self.waiting and len(running) < self.max_concurrency:
                self._prefill_step()
            else:
                self._decode_step()
            self.step_index += 1
            if self.progress is not None and self.now() - last_report >= 1.0:
                last_report = self.now()
                self.progress(last_report, self.step_index)
        # requests due before the horizon that came while the last step ran have arrived (the
        # simulator counts them, queued): count them too, waiting
        while self.pending and self.pending[0][0] < horizon:
            self._new_request(*self.pending.popleft())

    def _prefill_step(self) -> None:
        """Prefill whole waiting prompts, first come first served, within the token limit."""
        start_at = self.now()
        batch: list[LiveRequest] = []
        left, free = self.max_batch_tokens, self.max_concurrency - len(self.batch.running)
        while self.waiting and len(batch) < free:
            if batch and len(self.waiting[0].prompt) > left:
                break
            left -= len(self.waiting[0].prompt)
            batch.append(self.waiting.popleft())
        tokens, step_s = self.batch.prefill(batch, self.now)
        if self.stats.in_window(batch[0].first_token_at):
            self.stats.window_tokens += len(batch)
        self.step_records.append_row(StepRecord(0, self.step_index, start_at, step_s, 0.0, step_s, 0.0, 0.0, 0,
                                                tokens, tokens, 0, 0, 0, 0.0, 0))
        for r in batch:
            if self.batch.done(r):
                self._finish(r, r.first_token_at)

    def _choose(self, conf: np.ndarray[Any, np.dtype[np.float64]]) -> np.ndarray[Any, np.dtype[np.int64]]:
        running = self.batch.running
        # a request's context counts its anchor too (prompt + emitted), as the simulator's does
        kv, longest = sum(r.length for r in running) + len(running), max(r.length for r in running) + 1
        # the decision time the policy is shown, by the simulator's engine's rule
        known = known_decision_s(self.scenario.cluster, self.profile, self.policy.name, len(running))
        self._step_batch, lengths = choose_lengths(
            self.policy, self.profile, conf, [r.request_id for r in running], kv, longest, self.step_index,
            self.max_batch_tokens, self.positions, self.scenario.policy.drafter, known)
        return lengths

    def _decode_step(self) -> None:
        start_at = self.now()
        self._step_batch = None
        running = list(self.batch.running)
        # a policy that sometimes drafts nothing says so before the step, as the simulator asks it
        drafting = not self.asks_drafting or self.policy.drafts_at(len(running))
        out = self.batch.decode(self._choose, drafting)
        now = self.now()
        m, verified, emitted = len(running), int(out.lengths.sum()), sum(out.emitted)
        if self.stats.in_window(now):
            st = self.stats
            for r in running:
                st.add_itl(now - r.last_emit_at, 1)
            for ell, a in zip(out.lengths.tolist(), out.accepted, strict=True):
                st.joint[ell * (self.gamma + 1) + a] += 1
            st.window_tokens += emitted
            st.window_request_steps += m
            st.window_verified += verified
            st.window_emitted_decode += emitted
        for r in running:
            r.last_emit_at = now
        if self._step_batch is not None:
            self.policy.observe(self._step_batch, out.lengths, np.asarray(out.accepted, np.int64))
        self.step_records.append_row(StepRecord(
            0, self.step_index, start_at, out.step_s, out.draft_s, out.verify_s, 0.0, out.decision_s, m,
            m + verified, 0, verified, int(sum(out.accepted)), emitted, out.kv_tokens / m, out.kv_tokens))
        for r in out.finished:
            self._finish(r, now)

    def _finish(self, r: LiveRequest, now: float) -> None:
        self.batch.release(r)
        r.finish_at = now
        self.finished += 1
        out = len(r.tokens)
        self.request_records.append_row(RequestRecord(
            r.request_id, r.user, 0, r.domain, r.trace_request, r.arrival_at, r.first_token_at, r.finish_at,
            len(r.prompt), out, out, r.decode_steps, r.verified, r.accepted, 0, 0))
        if r.user >= 0:  # the user's next request, after its think time (as the simulator's)
            think = self.scenario.workload.think_time_s
            if think > 0:
                self.pending.append((now + think, r.user, None))
            else:
                self._new_request(now, r.user)

    def census(self) -> dict[str, int]:
        return {"arrived": self.arrived, "finished": self.finished, "running": len(self.batch.running),
                "queued": len(self.waiting), "prefill_pool": 0}
