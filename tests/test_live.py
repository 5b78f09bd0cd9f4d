"""The live engine: its batched KV-cached forwards equal the full-sequence models, its rejection
sampling emits exactly the target's distribution, its tables add up, it agrees with the
simulator, it refuses bad input, and `sparksim live` writes a results folder."""

from __future__ import annotations

import json
import math
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
stats = pytest.importorskip("scipy.stats")

from torch import nn  # noqa: E402

from sparksim.drafter.data import Item, write_prompts  # noqa: E402
from sparksim.drafter.model import Drafter, draft  # noqa: E402
from sparksim.drafter.record import record  # noqa: E402
from sparksim.drafter.target import TinyLM  # noqa: E402
from sparksim.errors import ConfigError  # noqa: E402
from sparksim.live.engine import LiveBatch, LiveError, LiveModels, LiveRequest  # noqa: E402
from sparksim.live.run import LIVE_SCENARIO, live_simulate, read_prompt_ids, trace_prompts  # noqa: E402
from sparksim.live.step import (  # noqa: E402
    DrafterKV,
    Ragged,
    TargetKV,
    drafter_step,
    inject_context,
    target_step,
)
from sparksim.sim.runner import RunResult, load_scenario, simulate  # noqa: E402
from sparksim.traces.format import load_traceset  # noqa: E402

from ._drafter_fixtures import save_pair, tiny_drafter, tiny_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "h100-qwen3-8b-analytic"
GAMMA = 4  # the fixtures' drafter block
EOS = 257  # bytes-v1
TOY = torch.arange(97, 113)  # 'a'..'p': the only tokens the toy LM head scores


# --------------------------------------------------------------------------- models in memory


def _sharpen(module: nn.Module, factor: float) -> None:
    """Scale every weight matrix but the (shared) embedding: sharp attention, large residual writes."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.mul_(factor)


def _models(factor: float = 1.0, embed: float = 1.0, head_sigma: float | None = None) -> tuple[TinyLM, Drafter]:
    """A tiny target and γ=4 drafter sharing its embedding and head (eval, no grad).

    `factor` scales both models' weight matrices, `embed` the shared (tied) embedding.
    `head_sigma` unties the LM head and gives it a "toy vocabulary": only the TOY rows are
    non-zero (N(0, σ²)), so both models' distributions concentrate on a few tokens.
    """
    target = tiny_target(0)
    drafter = tiny_drafter(target).eval()
    model = target.model
    _sharpen(model, factor)
    _sharpen(drafter, factor)
    with torch.no_grad():
        model.embed.weight.mul_(embed)
    if head_sigma is not None:
        gen = torch.Generator().manual_seed(1)
        w = torch.zeros_like(model.embed.weight)
        w[TOY] = torch.randn(len(TOY), w.shape[1], generator=gen) * head_sigma
        model.lm_head.weight = nn.Parameter(w, requires_grad=False)  # the drafter holds the same module
    return model, drafter


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Any:
    """Tiny matmuls only lose to thread hand-offs (3-10x slower with 2 threads on a shared box)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# --------------------------------------------------------------------------- 1. target_step


def test_target_step_in_ragged_chunks_equals_the_full_forward() -> None:
    """Three requests of different lengths, fed in three ragged chunks into slots 2..4 of a
    6-slot cache: every token's logits and a middle layer's state equal TinyLM.forward's."""
    model, _ = _models(factor=5.0, embed=20.0)
    gen = torch.Generator().manual_seed(0)
    lens = [9, 14, 6]
    chunks = [[3, 8, 1], [5, 2, 4], [1, 4, 1]]  # prefix, ragged middle, then the rest
    assert [sum(c) for c in zip(*chunks, strict=True)] == lens
    seqs = [torch.randint(0, 256, (n,), generator=gen) for n in lens]
    kv = TargetKV(model, slots=6, max_len=32)
    lo, starts = 2, [0, 0, 0]
    got_logits: list[list[torch.Tensor]] = [[] for _ in lens]
    got_hidden: list[list[torch.Tensor]] = [[] for _ in lens]
    for counts in chunks:
        rg = Ragged.build(starts, counts)
        ids = torch.cat([s[a: a + q] for s, a, q in zip(seqs, starts, counts, strict=True)])
        logits, hidden = target_step(model, kv, lo, ids, rg)
        assert logits.shape == (sum(counts), model.cfg.vocab_size)
        assert len(hidden) == model.cfg.n_layers + 1
        for r in range(len(lens)):
            got_logits[r].append(logits[rg.row == r])
            got_hidden[r].append(hidden[3][rg.row == r])
        starts = [a + q for a, q in zip(starts, counts, strict=True)]
    for r, seq in enumerate(seqs):
        with torch.no_grad():
            ref_logits, ref_hidden, _ = model(seq[None])
        assert ref_logits.abs().max() > 1.0  # the comparison is not between two near-zero tensors
        torch.testing.assert_close(torch.cat(got_logits[r]), ref_logits[0], atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.cat(got_hidden[r]), ref_hidden[3][0], atol=1e-4, rtol=0)
    # slots outside lo..lo+2 were never written
    assert kv.k[:, :lo].abs().max() == 0 and kv.k[:, lo + 3:].abs().max() == 0
    assert kv.v[:, :lo].abs().max() == 0 and kv.v[:, lo + 3:].abs().max() == 0


# --------------------------------------------------------------------------- 2. drafter_step


@pytest.mark.parametrize("anchors", [[5, 11, 17], [20, 1, 9], [12, 12, 3]])
def test_drafter_step_with_injected_context_equals_the_full_sequence_backbone(anchors: list[int]) -> None:
    """Context built the live way (a target step over the first a tokens, injected, plus stale
    tokens past the anchor that the mask must hide) gives the recorder's backbone output."""
    model, drafter = _models(factor=5.0, embed=20.0)
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 256, (24,), generator=gen) for _ in anchors]
    m = len(anchors)
    kv, dkv = TargetKV(model, m, 40), DrafterKV(drafter, m, 40)
    # context in two ragged target steps; the second also feeds 3 tokens past the anchor (as a
    # rejected block would), injected too: positions ≥ a must not reach the block
    first = [max(a // 2, 1) for a in anchors]
    rg = Ragged.build([0] * m, first)
    ids = torch.cat([s[:f] for s, f in zip(seqs, first, strict=True)])
    _, hidden = target_step(model, kv, 0, ids, rg)
    inject_context(drafter, dkv, hidden, torch.ones(rg.tokens, dtype=torch.bool), rg.row, rg.pos)
    rest = [a - f + 3 for a, f in zip(anchors, first, strict=True)]
    rg = Ragged.build(first, rest)
    junk = torch.randint(0, 256, (3,), generator=gen)
    ids = torch.cat([torch.cat([s[f:a], junk]) for s, f, a in zip(seqs, first, anchors, strict=True)])
    _, hidden = target_step(model, kv, 0, ids, rg)
    inject_context(drafter, dkv, hidden, torch.ones(rg.tokens, dtype=torch.bool), rg.row, rg.pos)

    anchor_ids = torch.stack([s[a] for s, a in zip(seqs, anchors, strict=True)])
    got = drafter_step(drafter, dkv, torch.tensor(anchors), anchor_ids, GAMMA)
    assert got.logits.shape == (m, 1, GAMMA, model.cfg.vocab_size)
    for r, (seq, a) in enumerate(zip(seqs, anchors, strict=True)):
        with torch.no_grad():
            _, full_hidden, _ = model(seq[None])
            ref = drafter.backbone(drafter.context(drafter.target_features(full_hidden)), seq[None],
                                   torch.tensor([[a]]))
        assert ref.logits.abs().max() > 1.0
        torch.testing.assert_close(got.logits[r], ref.logits[0], atol=1e-4, rtol=0)
        torch.testing.assert_close(got.hidden[r], ref.hidden[0], atol=1e-4, rtol=0)


# --------------------------------------------------------------------------- 3. exactness

N_SLOTS = 800
PROMPT = list(b"User: hi\nAssistant: ")
X0 = 100  # the anchor every slot is given ('d')


def _target_probs(model: TinyLM, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits, _, _ = model(torch.tensor([ids]))
    p = torch.softmax(logits[0, -1].double(), -1).numpy()
    return p / p.sum()


def _chi2_p(samples: np.ndarray, p: np.ndarray) -> float:
    """Chi-square goodness of fit of `samples` (token ids) to `p`; cells expecting < 5 merged."""
    n = len(samples)
    counts = np.bincount(samples, minlength=len(p)).astype(np.float64)
    exp = n * p
    big = exp >= 5
    obs, want = list(counts[big]), list(exp[big])
    rest_o, rest_e = counts[~big].sum(), exp[~big].sum()
    if rest_e >= 5:
        obs.append(rest_o)
        want.append(rest_e)
    else:  # too small to stand alone: fold into the smallest cell
        k = int(np.argmin(want))
        obs[k] += rest_o
        want[k] += rest_e
    assert len(obs) >= 3, "the distribution is too peaky for the test to have power"
    return float(stats.chisquare(obs, want).pvalue)


def _run_same_anchor(choose_kind: str, seed: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray, TinyLM]:
    """N slots, one prompt, anchor X0 in all; decode until each has emitted 2 tokens after X0.

    Returns the prefill's own first tokens, then the first and second tokens after X0."""
    model, drafter = _models(head_sigma=0.6)
    models = LiveModels(model, drafter, np.ones(GAMMA), GAMMA, EOS)
    batch = LiveBatch(models, N_SLOTS, GAMMA, temperature=1.0, max_new_tokens=64, seed=seed)
    reqs = [LiveRequest(i, 0, 0, 0, 0.0, list(PROMPT)) for i in range(N_SLOTS)]
    batch.prefill(reqs, time.perf_counter)
    prefilled = np.array([r.tokens[0] for r in reqs])
    for r in reqs:
        r.tokens = [X0]

    def choose(conf: np.ndarray) -> np.ndarray:
        m = conf.shape[0]
        assert conf.shape == (m, GAMMA) and ((conf >= 0) & (conf <= 1)).all()
        if choose_kind == "plain":
            return np.zeros(m, np.int64)
        if choose_kind == "full":
            return np.full(m, GAMMA, np.int64)
        return np.arange(m, dtype=np.int64) % (GAMMA + 1)  # mixed: a ragged verify

    steps = 0
    while min(len(r.tokens) for r in reqs) < 3:
        out = batch.decode(choose)
        steps += 1
        assert steps <= 2
        assert all(1 <= e <= a + 1 for e, a in zip(out.emitted, out.accepted, strict=True))
    first = np.array([r.tokens[1] for r in reqs])
    second = np.array([r.tokens[2] for r in reqs])
    return prefilled, first, second, model


@pytest.mark.parametrize("choose_kind", ["plain", "full", "mixed"])
def test_emitted_tokens_follow_the_target_distribution(choose_kind: str) -> None:
    """Exact rejection sampling is lossless: the first token after the anchor is distributed as
    p_t(· | prompt + x0), and the second, given the first is the mode y, as p_t(· | … + y)."""
    prefilled, first, second, model = _run_same_anchor(choose_kind)
    if choose_kind == "plain":  # the prefill's first token: p_t(· | prompt)
        assert _chi2_p(prefilled, _target_probs(model, PROMPT)) > 1e-3
    p1 = _target_probs(model, [*PROMPT, X0])
    assert _chi2_p(first, p1) > 1e-3
    y = int(np.argmax(p1))
    sel = first == y
    assert sel.sum() > 200
    p2 = _target_probs(model, [*PROMPT, X0, y])
    assert _chi2_p(second[sel], p2) > 1e-3


def test_the_exactness_test_has_power() -> None:
    """In the same setup the drafter's own distribution is far from the target's: a sampler
    that kept the draft token (or the draft distribution) would fail the test above."""
    model, drafter = _models(head_sigma=0.6)
    ids = torch.tensor([[*PROMPT, X0]])
    with torch.no_grad():
        _, hidden, _ = model(ids)
        out = drafter.backbone(drafter.context(drafter.target_features(hidden)), ids,
                               torch.tensor([[len(PROMPT)]]))
        d = draft(drafter, out, torch.tensor([[X0]]), 1.0, None)
    p_d = d.probs[0, 0, 0].double().numpy()
    p_t = _target_probs(model, [*PROMPT, X0])
    tv = 0.5 * np.abs(p_d - p_t).sum()
    assert 0.2 < tv < 0.8  # both paths (accept, and the residual resample) are exercised often
    gen = torch.Generator().manual_seed(3)
    draws = torch.multinomial(torch.from_numpy(p_d / p_d.sum()), N_SLOTS, replacement=True,
                              generator=gen).numpy()
    assert _chi2_p(draws, p_t) < 1e-6


def test_a_biased_acceptance_rule_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Accepting every verified draft (no ratio test) must fail the exactness check."""

    def accept_all(self: LiveBatch, logits: Any, rg: Ragged, ell: Any, d: Any) -> Any:
        probs = rg.padded(torch.softmax(logits.float(), -1))
        bonus = torch.multinomial(probs[torch.arange(ell.shape[0]), ell], 1, generator=self.gen)[:, 0]
        return ell.clone(), bonus

    monkeypatch.setattr(LiveBatch, "_accept", accept_all)
    _, first, _, model = _run_same_anchor("full")
    assert _chi2_p(first, _target_probs(model, [*PROMPT, X0])) < 1e-6


def _fresh_caches(model: TinyLM, drafter: Drafter, ids: list[int], max_len: int) -> tuple[TargetKV, DrafterKV]:
    """One slot's caches computed from scratch over `ids` in one step."""
    kv, dkv = TargetKV(model, 1, max_len), DrafterKV(drafter, 1, max_len)
    rg = Ragged.build([0], [len(ids)])
    _, hidden = target_step(model, kv, 0, torch.tensor(ids), rg)
    inject_context(drafter, dkv, hidden, torch.ones(rg.tokens, dtype=torch.bool), rg.row, rg.pos)
    return kv, dkv


def _rotating(shift: int) -> Any:
    """A choice of ℓ_r = (r + shift) mod (γ + 1): every length, ragged, moving step to step."""
    return lambda conf: (np.arange(conf.shape[0], dtype=np.int64) + shift) % (GAMMA + 1)


def test_decode_and_release_keep_caches_and_outputs_consistent() -> None:
    """Ragged decode steps, EOS and length cuts, slot moves on release and prefills into the
    freed slots: every running request's target and drafter caches equal a fresh prefill of
    its prompt + emitted tokens, and its tokens obey EOS and the length cap."""
    model, drafter = _models(head_sigma=0.6)
    p1 = _target_probs(model, [*PROMPT, X0])
    eos = int(np.argsort(p1)[-2])  # a token the target writes often: EOS cuts happen
    models = LiveModels(model, drafter, np.ones(GAMMA), GAMMA, eos)
    max_new, slots = 10, 6
    batch = LiveBatch(models, slots, GAMMA, temperature=1.0, max_new_tokens=max_new, seed=11)
    gen = torch.Generator().manual_seed(5)
    waiting = [LiveRequest(i, 0, 0, 0, 0.0, torch.randint(0, 256, (int(n),), generator=gen).tolist())
               for i, n in enumerate(torch.randint(3, 15, (14,), generator=gen))]
    by_eos = by_cap = cut = 0
    step = 0
    while waiting or batch.running:
        free = slots - len(batch.running)
        if waiting and free:
            take = min(free, len(waiting), 1 + step % 3)  # prefill a few into slots lo.. (lo > 0 after releases)
            batch.prefill(waiting[:take], time.perf_counter)
            waiting = waiting[take:]
        reqs = list(batch.running)
        out = batch.decode(_rotating(step))
        step += 1
        assert out.lengths.tolist() == [(i + step - 1) % (GAMMA + 1) for i in range(len(reqs))]
        for i, r in enumerate(reqs):
            assert eos not in r.tokens[:-1] and len(r.tokens) <= max_new
            # INV-1, as the simulator counts: accepted drafts are counted after the EOS / length cut
            assert len(r.tokens) == 1 + r.decode_steps + r.accepted
            if batch.done(r):
                by_eos += r.tokens[-1] == eos
                by_cap += len(r.tokens) == max_new
                cut += out.emitted[i] < out.accepted[i] + 1  # the step's block was cut
                batch.release(r)
            else:
                assert r.length == len(r.prompt) + len(r.tokens) - 1
        assert all(not batch.done(r) for r in batch.running)
        for i, r in enumerate(batch.running):  # slot i holds running[i]
            kv, dkv = _fresh_caches(model, drafter, r.prompt + r.tokens[:-1], batch.kv.max_len)
            n = r.length
            torch.testing.assert_close(batch.kv.k[:, i, :, :n], kv.k[:, 0, :, :n], atol=1e-4, rtol=0)
            torch.testing.assert_close(batch.kv.v[:, i, :, :n], kv.v[:, 0, :, :n], atol=1e-4, rtol=0)
            assert batch.dkv is not None
            torch.testing.assert_close(batch.dkv.k[:, i, :, :n], dkv.k[:, 0, :, :n], atol=1e-4, rtol=0)
            torch.testing.assert_close(batch.dkv.v[:, i, :, :n], dkv.v[:, 0, :, :n], atol=1e-4, rtol=0)
        assert step < 200
    assert by_eos >= 2 and by_cap >= 2 and cut >= 2  # the test saw every way a request ends


# --------------------------------------------------------------------------- recorded pair + live runs


@dataclass
class Pair:
    target: Path
    drafter: Path
    prompts: Path
    traces: Path


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Pair:
    """A tiny target + drafter on disk and a trace set recorded from them at T=1."""
    tmp = tmp_path_factory.mktemp("live")
    torch.set_num_threads(1)
    target, drafter = save_pair(tmp)
    prompts = tmp / "p.jsonl"
    write_prompts(prompts, [Item(f"{d}{i}", d, f"User: {d} question {i}\nAssistant: ", "")
                            for d in ("math", "code", "chat") for i in range(10)])
    traces = record(target, drafter, prompts, tmp / "traces", gamma=GAMMA, max_new_tokens=48,
                    temperature=1.0, command="test", log=lambda _: None)
    return Pair(target, drafter, prompts, traces)


def _scenario(pair: Pair, policy: str, *sets: str, users: int = 2, duration: float = 1.5) -> Any:
    name, _, params = policy.partition(":")
    if "=" not in params.split(",")[0]:  # a plug-in path: file.py:Class
        name, params = policy, ""
    overrides = [
        f"profile={PROFILE}", f"traces={pair.traces}", "workload.kind=closed",
        f"workload.concurrency={users}", f"cluster.max_concurrency={users}", f"run.duration_s={duration}",
        *[f"policy.{p}" for p in params.split(",") if p], *sets]
    return load_scenario(None, overrides, name, presets=[f"{k}={v}" for k, v in LIVE_SCENARIO.items()])


def _live(pair: Pair, policy: str, *sets: str, **kw: Any) -> RunResult:
    sc, base = _scenario(pair, policy, *sets, **kw)
    return live_simulate(sc, base, target=pair.target, drafter=pair.drafter, threads=1)


def test_live_open_loop_and_think_times_pair_with_the_simulators(pair: Pair) -> None:
    # A seed must give both engines the same requests: the live open loop had drawn every gap
    # before any domain (the simulator alternates), ignored workload.think_time_s, and let a
    # run that ended inside its warm-up report a negative window.
    sc, base = load_scenario(None, [
        f"profile={PROFILE}", f"traces={pair.traces}", "workload.kind=poisson", "workload.rate=5",
        "run.max_requests=4", "run.duration_s=60", "cluster.max_concurrency=4", "policy.gamma=1"],
        "static", presets=[f"{k}={v}" for k, v in LIVE_SCENARIO.items()])
    sim = simulate(sc, base).requests.sort_values("request_id")
    live = live_simulate(sc, base, target=pair.target, drafter=pair.drafter, threads=1)
    got = live.requests.sort_values("request_id")
    np.testing.assert_allclose(got["arrival_at"], sim["arrival_at"], rtol=0, atol=1e-12)
    assert got["trace_request"].tolist() == sim["trace_request"].tolist()
    assert live.summary["window"]["length_s"] == 0.0  # ended inside the 6 s warm-up: empty, not negative
    res = _live(pair, "static:gamma=1", "workload.think_time_s=0.3", users=1, duration=2.0)
    req = res.requests.sort_values("arrival_at")
    gaps = req["arrival_at"].to_numpy()[1:] - req["finish_at"].to_numpy()[:-1]
    assert len(gaps) >= 1 and (gaps >= 0.3 - 1e-9).all(), gaps


def test_requests_due_during_the_last_step_are_counted_as_the_simulator_counts_them(pair: Pair) -> None:
    # The live loop stops at the horizon between steps; arrivals due while the last step ran
    # were left unread, so the census (arrived, queued) missed them where the simulator has them.
    sc, base = load_scenario(None, [
        f"profile={PROFILE}", f"traces={pair.traces}", "workload.kind=poisson", "workload.rate=20000",
        "run.duration_s=0.3", "run.warmup_s=0", "run.cooldown_s=0", "cluster.max_concurrency=4",
        "policy.gamma=1"], "static", presets=[f"{k}={v}" for k, v in LIVE_SCENARIO.items()])
    sim = simulate(sc, base).summary["census"]
    live = live_simulate(sc, base, target=pair.target, drafter=pair.drafter, threads=1).summary["census"]
    assert live["arrived"] == sim["arrived"] > 3000
    assert live["arrived"] == live["finished"] + live["running"] + live["queued"]


def test_the_live_policy_is_shown_the_sync_pipelines_decision_time_as_the_simulators(
        pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    # Greedy's and argmax's Θ read the step's whole price; the live engine had shown only the
    # loop's time, so under cluster.pipeline=sync they optimised another Θ than in the simulator.
    import sparksim.live.engine as live_engine

    shown: list[float] = []
    real = live_engine.choose_lengths

    def spy(*args: Any, **kwargs: Any) -> Any:
        batch, lengths = real(*args, **kwargs)
        shown.append(batch.cost.overhead_s - batch.cost.profile.loop_s(True, "decode", batch.num_requests))
        return batch, lengths

    monkeypatch.setattr(live_engine, "choose_lengths", spy)
    _live(pair, "greedy", "cluster.pipeline=sync", "cluster.decision_s=0.002", duration=0.5)
    assert shown and all(abs(d - 0.002) < 1e-12 for d in shown), shown[:5]


def test_a_live_step_the_policy_says_not_to_draft_runs_no_drafter(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    # SmartSpec at k = 0 drafts only on the steps that recompute k (every `interval`-th), as
    # in the simulator; the live engine had drafted and asked the policy every step.
    import sparksim.live.engine as live_engine

    asked: list[int] = []
    real = live_engine.choose_lengths
    monkeypatch.setattr(live_engine, "choose_lengths", lambda *a, **k: (asked.append(1), real(*a, **k))[1])
    res = _live(pair, "smartspec:alpha=0.01,interval=5", "run.warmup_s=0", "run.cooldown_s=0", duration=1.0)
    assert res.steps is not None
    steps = int(((res.steps["num_requests"] > 0) & (res.steps["prefill_tokens"] == 0)).sum())
    assert steps >= 10 and len(asked) <= steps // 5 + 1, (len(asked), steps)
    assert int(res.requests["verified_drafts"].sum()) == 0


# --------------------------------------------------------------------------- 4. accounting


@pytest.mark.parametrize(("policy", "positions"), [("two-step", GAMMA), ("static:gamma=2", 2)])
def test_live_tables_add_up(pair: Pair, policy: str, positions: int) -> None:
    res = _live(pair, policy, "run.warmup_s=0", "run.cooldown_s=0", users=3)
    req, steps, s = res.requests, res.steps, res.summary
    assert steps is not None and len(req) >= 3
    max_new = 48
    assert (req["emitted_tokens"] == req["output_tokens"]).all()
    assert (req["accepted_drafts"] <= req["verified_drafts"]).all()
    assert (req["verified_drafts"] <= positions * req["decode_steps"]).all()
    if policy.startswith("static"):  # static γ verifies exactly γ per request-step
        assert (req["verified_drafts"] == positions * req["decode_steps"]).all()
        assert (steps.loc[steps["num_requests"] > 0, "verified_drafts"]
                == positions * steps.loc[steps["num_requests"] > 0, "num_requests"]).all()
    # INV-1 as the simulator states it: accepted drafts are counted after the EOS / length cut
    assert (req["emitted_tokens"] == 1 + req["decode_steps"] + req["accepted_drafts"]).all()
    assert (req["emitted_tokens"] <= max_new).all()
    decode = steps[steps["num_requests"] > 0]
    prefill = steps[steps["num_requests"] == 0]
    assert len(decode) > 50 and len(prefill) >= 1
    assert (decode["batch_tokens"] == decode["num_requests"] + decode["verified_drafts"]).all()
    assert (decode["accepted_drafts"] <= decode["verified_drafts"]).all()
    assert (decode["verified_drafts"] <= positions * decode["num_requests"]).all()
    assert (decode["emitted_tokens"] >= decode["num_requests"]).all()
    # a step's accepted drafts are the verifier's, before the EOS / length cut (as the simulator records them)
    assert (decode["emitted_tokens"] <= decode["num_requests"] + decode["accepted_drafts"]).all()
    assert (prefill["batch_tokens"] == prefill["prefill_tokens"]).all()
    assert (prefill["verified_drafts"] == 0).all()
    assert s["engine"] == "live"
    mal = s["mean_acceptance_length"]
    assert 1.0 <= mal <= positions + 1
    # the summary's figure is the steps table's, up to the one step that may end past the horizon
    table = decode["emitted_tokens"].sum() / decode["num_requests"].sum()
    assert mal == pytest.approx(table, abs=2 * (positions + 1) / len(decode))
    assert s["verify_budget_per_request"] == pytest.approx(
        1 + decode["verified_drafts"].sum() / decode["num_requests"].sum(), abs=2 * positions / len(decode))


# --------------------------------------------------------------------------- 5. live vs simulated


def _per_step_se(steps: Any) -> float:
    """SE of the mean emitted per request-step, the decode steps taken as independent."""
    dec = steps[steps["num_requests"] > 0]
    per = (dec["emitted_tokens"] / dec["num_requests"]).to_numpy()
    return float(per.std(ddof=1) / math.sqrt(len(per)))


def _ratio_se(emitted: np.ndarray, rounds: np.ndarray) -> float:
    """SE of Σ emitted / Σ rounds with responses as the independent units (delta method)."""
    e, n = np.asarray(emitted, np.float64), np.asarray(rounds, np.float64)
    r, k = e.sum() / n.sum(), len(e)
    return float(math.sqrt(((e - r * n) ** 2).sum() / (k * (k - 1))) / n.mean())


def _trace_walk(accepted: np.ndarray, offsets: np.ndarray, gamma: int) -> tuple[np.ndarray, np.ndarray]:
    """Per recorded response: decode-emitted tokens and the static-γ rounds that emit them."""
    emitted, rounds = [], []
    for k in range(len(offsets) - 1):
        acc = accepted[offsets[k]: offsets[k + 1]]
        t, n = 1, 0  # the prefill emits token 0; decoding starts at the block anchored on it
        while t < len(acc):
            t, n = t + min(int(acc[t]), gamma) + 1, n + 1
        emitted.append(len(acc) - 1)
        rounds.append(n)
    return np.array(emitted), np.array(rounds)


def test_live_and_simulated_acceptance_agree(pair: Pair) -> None:
    """Static γ=4 (the drafter's whole block, as recorded), 2 users, T=1: the live engine's
    real rejection sampling and the simulator replaying the recorded acceptances estimate the
    same mean acceptance length (decode tokens per request-step, the last step of a response
    cut by EOS or the length cap in both).

    Tolerance: 3 standard errors of the difference, each side's SE from its own data, with
    responses as the independent units (a response's length sets how much its last step is
    cut, so steps of one response are not independent):
    - live: the larger of the ratio SE over its finished requests and the per-step SE;
    - simulated: the simulator replays the recording's responses, so its value estimates the
      models' truth only as well as the recording does: the ratio SE over the recorded
      responses (walked at γ=4), plus, in quadrature, the per-step SE of the replay's own draws.
    """
    sets = ("run.warmup_s=0", "run.cooldown_s=0")
    live = _live(pair, "static:gamma=4", *sets, duration=2.0)
    sc, base = _scenario(pair, "static:gamma=4", *sets, duration=2.0)
    sim = simulate(sc, base)
    assert live.steps is not None and sim.steps is not None
    done = live.requests[live.requests["decode_steps"] > 0]
    assert len(done) >= 10
    se_live = max(_ratio_se(done["output_tokens"] - 1, done["decode_steps"]), _per_step_se(live.steps))
    ts = load_traceset(pair.traces)
    e, n = _trace_walk(ts.accepted.astype(np.int64), ts.offsets, GAMMA)
    se_sim = math.hypot(_ratio_se(e, n), _per_step_se(sim.steps))
    se = math.hypot(se_live, se_sim)
    a_live, a_sim = live.summary["mean_acceptance_length"], sim.summary["mean_acceptance_length"]
    assert 0 < se < 0.25  # tight enough to see a real gap (a lost bonus token moves it by ~1)
    assert abs(a_live - a_sim) < 3 * se, (a_live, a_sim, se_live, se_sim)


# --------------------------------------------------------------------------- 6. bad input

BAD_POLICIES = """
import numpy as np
from sparksim.policies.base import Policy


class _Base(Policy):
    rule = "misbehaves on purpose"
    lossless = True


class TooLong(_Base):
    name = "too-long"
    def decide(self, batch):
        return np.full(batch.num_requests, self.block + 1, dtype=np.int64)


class Negative(_Base):
    name = "negative"
    def decide(self, batch):
        return np.full(batch.num_requests, -1, dtype=np.int64)


class WrongShape(_Base):
    name = "wrong-shape"
    def decide(self, batch):
        return np.zeros(batch.num_requests + 1, dtype=np.int64)


class Raises(_Base):
    name = "raises"
    def decide(self, batch):
        raise RuntimeError("boom")
"""


@pytest.mark.parametrize(("cls", "label", "detail"), [
    ("TooLong", "too-long", "must be in 0..4"),
    ("Negative", "negative", "must be in 0..4"),
    ("WrongShape", "wrong-shape", "for 2 requests"),
    ("Raises", "raises", "RuntimeError: boom"),
])
def test_a_misbehaving_policy_stops_the_run(pair: Pair, tmp_path: Path, cls: str, label: str,
                                            detail: str) -> None:
    plugin = tmp_path / "bad_policies.py"
    plugin.write_text(textwrap.dedent(BAD_POLICIES))
    with pytest.raises(LiveError) as info:
        _live(pair, f"{plugin}:{cls}", duration=5.0)
    msg = str(info.value)
    assert msg.startswith("step 1: ")  # step 0 prefills both users; step 1 is the first decode
    assert f"policy {label!r}" in msg and detail in msg


@pytest.mark.parametrize("line", [
    b'{"prompt": "\\udc80"}',  # a lone surrogate, JSON-escaped
    b'{"prompt": "caf\xff"}',  # a byte that is not UTF-8
])
def test_a_prompt_the_tokenizer_cannot_encode_names_its_line(tmp_path: Path, line: bytes) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n\n' + line + b"\n")
    with pytest.raises(ConfigError, match=rf"{path}:3: the prompt holds characters"):
        read_prompt_ids(path)


def test_prompt_file_errors(tmp_path: Path, pair: Pair) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "x"}\n')
    with pytest.raises(ConfigError, match=rf"{bad}:2: key 'prompt'"):
        read_prompt_ids(bad)
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(ConfigError, match=rf"{bad}:2: not valid JSON"):
        read_prompt_ids(bad)
    # the right prompts are accepted; others (different lengths) are refused
    ts = load_traceset(pair.traces)
    ids, path = trace_prompts(ts, None)
    assert path == pair.prompts and [len(p) for p in ids] == ts.requests["prompt_tokens"].tolist()
    other = tmp_path / "other.jsonl"
    write_prompts(other, [Item("x", "math", "User: something else entirely\nAssistant: ", "")])
    with pytest.raises(ConfigError, match="not the ones trace set"):
        trace_prompts(ts, other)


def test_the_live_engine_refuses_what_it_cannot_run(pair: Pair) -> None:
    with pytest.raises(ConfigError, match="live engine schedules colocated prefill-first"):
        _live(pair, "static:gamma=1", "cluster.prefill.mode=disaggregated")
    with pytest.raises(ConfigError, match="reads the outcome before verifying"):
        _live(pair, "oracle")
    with pytest.raises(ConfigError, match="live engine does not cache prefixes"):
        _live(pair, "static:gamma=1", "cluster.prefix_cache.enabled=true")


# --------------------------------------------------------------------------- 7. CLI


def test_cli_live_writes_a_results_folder(pair: Pair, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from sparksim.cli import app

    out = tmp_path / "res"
    result = CliRunner().invoke(app, [
        "live", "--policy", "static:gamma=1", "--users", "2", "--duration", "1.5",
        "--target", str(pair.target), "--drafter", str(pair.drafter), "--profile", str(PROFILE),
        "--traces", str(pair.traces), "--out", str(out), "-q",
    ])
    assert result.exit_code == 0, result.output
    assert {"summary.json", "requests.parquet", "steps.parquet", "scenario.yaml",
            "warnings.json"} <= {p.name for p in out.iterdir()}  # warnings.json: what `sparksim report` shows
    assert isinstance(json.loads((out / "warnings.json").read_text()), list)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == "live"
    assert summary["policy_params"] == {"gamma": 1}
    assert summary["live"]["positions_drafted"] == 4  # a block drafter drafts its whole block (γ = 4)
    assert summary["completed"] >= 1
    assert 1.0 <= summary["mean_acceptance_length"] <= 2.0


def test_the_engine_loop_is_measured_from_live_sessions_into_the_card(pair: Pair, tmp_path: Path) -> None:
    """sparksim profile live's loop phase: gaps between a live session's steps, fitted per mode and kind."""
    import shutil

    from sparksim.cost.profile import load_profile
    from sparksim.live.profile import add_loop, measure_loop

    prof = tmp_path / "prof"
    shutil.copytree(PROFILE, prof)
    loop = measure_loop(prof, pair.target, pair.drafter, str(pair.traces), users=(2,), seconds=1.0)
    assert set(loop) == {"plain", "drafting"}
    for mode in loop.values():
        assert mode["decode"]["gaps"] > 10 and mode["decode"]["median_ms"] > 0
        assert mode["decode"]["a_ms"] >= 0 and mode["decode"]["b_ms_per_request"] >= 0
    add_loop(prof, loop, "test")
    loaded = load_profile(prof)
    assert loaded.loop_s(True, "decode", 2) > 0 and "test" in loaded.card["cost_model"]["loop_note"]
