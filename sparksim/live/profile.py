"""Profile the live engine's own step functions into a simulator profile.

The simulator prices a step as dense(T) + attention(R, K) + draft(R, positions) + prefill
terms (docs/profiles.md). Here those terms are measured on the live engine itself: the
same `LiveBatch.decode` and `LiveBatch.prefill` calls, the same models, the same threads,
so the simulator run on this profile prices a step as the live engine pays for it.

A decode point is R requests, each holding C tokens of context, each verifying ℓ = p
drafts after drafting p positions (p = 0: plain decoding, no drafter): T = R·(1 + p) tokens,
K = R·(C + 1) KV tokens. Each point is replayed (state restored between replays) and its
median kept; rounds interleave the whole grid to spread a shared machine's noise. The
medians are then fitted by least squares:

    verify_ms = a(R, C) + c1·T + c4·T·K/R               (a: one term per measured (R, C) cell;
                + [p ≥ 1]·(c5 + c6·R)                      c4: attention FLOPs per (query, KV token);
                                                           c5 + c6·R: rejection sampling, once drafts are verified)
    draft_ms  = d0 + d1·R + d2·R·p + d3·p + d4·K          (p ≥ 1)
    prefill   = a + b·q + c·q²                             (one prompt of q tokens)

and written as verify.csv (c1·T), attention.csv (the cells' a(R, C) at K = R·(C + 1), linear in
K between them, by request count), `graph_capture_sizes: []` (eager: no batch pads up), the
card's `cost_model.attention_ms_per_query_kv_token` = c4 with `attention_compute: sum`,
`cost_model.verify_drafts_ms` = (c5, c6),
draft-<kind>.csv (d0 + d1·R + d2·R·p + d3·p, with `kv_ms_per_token` = d4), prefill.csv
(a + b·q) and `prefill_attention_ms_per_token_sq` = c. The decision step (asking a policy
for ℓ, on the critical path of a synchronous engine) is timed per policy and request count
into `cost_model.decision_ms` (a + b·R). The card keeps every measured point, the fits'
coefficients and their residuals.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from sparksim.errors import ConfigError
from sparksim.live.engine import LiveBatch, LiveModels, LiveRequest
from sparksim.live.fits import (
    FILES,
    VERIFY_MODEL,
    LeastSquaresFit,
    add_loop,
    fit_decode,
    fit_linear,
    refit_verify,
    sig5,
    verify_tables,
)
from sparksim.sim.metrics import step_gaps

Progress = Callable[[str], None]


@dataclass
class LiveProfileConfig:
    """What the live profile measures."""

    requests: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 24, 32, 48])
    contexts: list[int] = field(default_factory=lambda: [64, 256, 640])
    prompt_lengths: list[int] = field(default_factory=lambda: [16, 64, 128, 256, 512])
    replays: int = 5
    warmup: int = 2
    rounds: int = 2
    seed: int = 0
    threads: int = 1

    def check(self, models: LiveModels) -> None:
        top = models.target.cfg.max_seq_len
        if not self.requests or min(self.requests) < 1:
            raise ConfigError(f"--requests {self.requests}: need request counts >= 1")
        if len(set(self.contexts)) < 2 or min(self.contexts) < 1:
            raise ConfigError(f"--contexts {self.contexts}: need two or more contexts >= 1 (the KV "
                              "slope is fitted over them)")
        if max(self.contexts) + models.gamma + 2 > top:
            raise ConfigError(f"--contexts {max(self.contexts)} + γ+2 is past the target's max_seq_len={top}")
        if len(set(self.prompt_lengths)) < 3 or max(self.prompt_lengths) > top:
            raise ConfigError(f"--prompt-lengths {self.prompt_lengths}: need 3 or more distinct lengths "
                              f"<= {top}")
        if self.replays < 1 or self.warmup < 0 or self.rounds < 1:
            raise ConfigError("--replays and --rounds must be >= 1, --warmup >= 0")


def _requests(n: int, context: int, gen: torch.Generator) -> list[LiveRequest]:
    ids = torch.randint(0, 256, (n, context), generator=gen).tolist()
    return [LiveRequest(i, -1, 0, 0, 0.0, ids[i]) for i in range(n)]


def _verify_all(conf: np.ndarray[Any, np.dtype[np.float64]]) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Verify every drafted position (conf holds zeros past the drafted ones)."""
    return (conf > 0).sum(axis=1).astype(np.int64)


def measure(models: LiveModels, cfg: LiveProfileConfig, progress: Progress | None = None
            ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Time decode points (R, C, p) and prompt-only steps; return (decode points, prefill points)."""
    cfg.check(models)
    torch.set_num_threads(cfg.threads)
    gen = torch.Generator().manual_seed(cfg.seed)
    gamma = models.gamma
    positions = list(range(gamma + 1)) if models.drafter is not None else [0]
    top_r = max(cfg.requests)
    samples: dict[tuple[int, int, int], list[tuple[float, float, float]]] = {}
    pre: dict[int, list[float]] = {}
    for _round in range(cfg.rounds):
        for context in cfg.contexts:
            batch = LiveBatch(models, top_r, gamma if models.drafter is not None else 0, temperature=1.0,
                              max_new_tokens=1 << 30, seed=cfg.seed)
            reqs = _requests(top_r, context, gen)
            for lo in range(0, top_r, 8):  # prefill in groups: the padded attention stays small
                batch.prefill(reqs[lo: lo + 8], time.perf_counter)
            first = [r.tokens[0] for r in reqs]
            dkv = batch.dkv
            for r_count in cfg.requests:
                for p in positions:
                    batch.running = reqs[:r_count]
                    batch.positions = p
                    batch.dkv = dkv if p else None  # plain decoding keeps no drafter context
                    got = samples.setdefault((r_count, context, p), [])
                    for k in range(cfg.warmup + cfg.replays):
                        out = batch.decode(_verify_all)
                        for r, tok in zip(reqs[:r_count], first, strict=False):  # restore
                            r.length, r.tokens = context, [tok]
                        if k >= cfg.warmup:
                            got.append((out.verify_s * 1e3, out.draft_s * 1e3, out.step_s * 1e3))
                    if progress is not None:
                        progress(f"decode R={r_count} C={context} p={p}")
        batch = LiveBatch(models, 1, gamma if models.drafter is not None else 0, temperature=1.0,
                          max_new_tokens=1 << 30, seed=cfg.seed)
        for q in cfg.prompt_lengths:
            for k in range(cfg.warmup + cfg.replays):
                batch.running = []
                _, secs = batch.prefill(_requests(1, q, gen), time.perf_counter)
                if k >= cfg.warmup:
                    pre.setdefault(q, []).append(secs * 1e3)
            if progress is not None:
                progress(f"prefill q={q}")
    rows = []
    for (r_count, context, p), vals in sorted(samples.items()):
        arr = np.asarray(vals)
        rows.append({"requests": r_count, "context": context, "positions": p,
                     "tokens": r_count * (1 + p), "kv_tokens": r_count * (context + 1),
                     "verify_ms": float(np.median(arr[:, 0])), "draft_ms": float(np.median(arr[:, 1])),
                     "step_ms": float(np.median(arr[:, 2])),
                     "verify_min_ms": float(arr[:, 0].min()), "verify_max_ms": float(arr[:, 0].max()),
                     "replays": len(vals)})
    prefill = pd.DataFrame([{"tokens": q, "prefill_ms": float(np.median(v)), "min_ms": float(min(v)),
                             "max_ms": float(max(v)), "replays": len(v)} for q, v in sorted(pre.items())])
    return pd.DataFrame(rows), prefill


DECISION_POLICIES = ("static", "greedy", "argmax", "two-step", "threshold")


def measure_decisions(profile_dir: Path, models: LiveModels, cfg: LiveProfileConfig
                      ) -> dict[str, dict[str, Any]]:
    """Time the live engine's decision step in place, per policy and request count.

    Each point runs real `LiveBatch.decode` steps (drafting included, at the middle context) whose
    choice goes through `choose_lengths` with the policy, as `LiveEngine` asks it, reading the cost
    model just written; the step then verifies the whole block whatever the policy chose, so every
    replay starts from the same state. Returns, per policy, a + b·R fitted by NNLS and the medians.
    """
    from sparksim.cost.profile import load_profile
    from sparksim.live.engine import choose_lengths
    from sparksim.policies import make_policy

    profile = load_profile(profile_dir)
    drafter = str(profile.card.get("default_drafter")) if profile.drafters else None
    context = sorted(cfg.contexts)[len(cfg.contexts) // 2]
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    top_r = max(cfg.requests)
    batch = LiveBatch(models, top_r, models.gamma, temperature=1.0, max_new_tokens=1 << 30, seed=cfg.seed)
    reqs = _requests(top_r, context, gen)
    for lo in range(0, top_r, 8):
        batch.prefill(reqs[lo: lo + 8], time.perf_counter)
    first = [r.tokens[0] for r in reqs]
    out: dict[str, dict[str, Any]] = {}
    for name in DECISION_POLICIES:
        rows = []
        for r_count in cfg.requests:
            policy = make_policy(name, models.gamma, {})
            batch.running = reqs[:r_count]
            ids = list(range(r_count))
            secs = []
            for k in range(cfg.warmup + cfg.replays * cfg.rounds):
                def choose(conf: np.ndarray[Any, np.dtype[np.float64]], k: int = k, pol: Any = policy,
                           ids: list[int] = ids) -> np.ndarray[Any, np.dtype[np.int64]]:
                    choose_lengths(pol, profile, conf, ids, len(ids) * (context + 1), context + 1, k,
                                   1 << 20, models.gamma, drafter)
                    return _verify_all(conf)
                res = batch.decode(choose)
                for req, tok in zip(reqs[:r_count], first, strict=False):
                    req.length, req.tokens = context, [tok]
                if k >= cfg.warmup:
                    secs.append(res.decision_s * 1e3)
            rows.append((r_count, float(np.median(secs))))
        counts = np.array([x for x, _ in rows], np.float64)
        ms = np.array([y for _, y in rows], np.float64)
        fit = fit_linear({"a_ms": np.ones_like(counts), "b_ms_per_request": counts}, ms)
        out[name] = {"a_ms": fit.coef[0], "b_ms_per_request": fit.coef[1],
                     "max_abs_rel_residual": sig5(float(np.abs(fit.rel_residuals).max())),
                     "points": [{"requests": int(x), "median_ms": sig5(y)} for x, y in rows]}
    return out


LOOP_USERS = (2, 8, 24)


def measure_loop(profile_dir: Path, target: Path, drafter: Path | None, traces: str, *,
                 users: tuple[int, ...] = LOOP_USERS, seconds: float = 5.0, threads: int = 1, seed: int = 7,
                 progress: Progress | None = None) -> dict[str, Any]:
    """Time the live engine's loop outside its step functions, from short live sessions.

    A closed loop of each `users` count serves `traces`' prompts for `seconds` with plain
    decoding and, with a drafter, with static γ (drafting the whole block); the idle gaps
    between consecutive steps (`metrics.step_gaps`) are fitted per mode and kind as a + b·R (NNLS on
    the medians per R). The sessions run on `profile_dir` (static policies read no cost) and
    a seed of their own, not the fidelity check's.
    """
    from sparksim.live.run import LIVE_SCENARIO, live_simulate
    from sparksim.sim.runner import load_scenario

    modes = [("plain", "static:gamma=0")] + ([("drafting", "static")] if drafter is not None else [])
    out: dict[str, Any] = {}
    for mode, spec in modes:
        gaps = []
        for u in users:
            sets = [f"{k}={v}" for k, v in LIVE_SCENARIO.items()] + [
                f"profile={profile_dir}", f"traces={traces}", "workload.kind=closed",
                f"workload.concurrency={u}", f"cluster.max_concurrency={u}", f"run.duration_s={seconds}",
                f"seed={seed}"]
            sc, base = load_scenario(None, sets, spec)
            res = live_simulate(sc, base, target=target, drafter=drafter, threads=threads)
            assert res.steps is not None
            gaps.append(step_gaps(res.steps))
            if progress is not None:
                progress(f"loop {mode} users={u}")
        table = pd.concat(gaps, ignore_index=True)
        out[mode] = {}
        for kind, g in table.groupby("kind"):
            med = g.groupby("requests")["gap_ms"].median()
            counts = med.index.to_numpy(np.float64)
            ms = np.maximum(med.to_numpy(np.float64), 1e-6)
            fit = fit_linear({"a_ms": np.ones_like(counts), "b_ms_per_request": counts}, ms)
            out[mode][str(kind)] = {"a_ms": sig5(fit.coef[0]), "b_ms_per_request": sig5(fit.coef[1]),
                                    "gaps": len(g), "median_ms": sig5(float(g["gap_ms"].median())),
                                    "max_abs_rel_residual": sig5(float(np.abs(fit.rel_residuals).max()))}
    return out


# --------------------------------------------------------------------------- the profile folder


def write_live_profile(out: Path, models: LiveModels, cfg: LiveProfileConfig, points: pd.DataFrame,
                       prefill: pd.DataFrame, command: str, note: str = "") -> Path:
    """Fit the measured points and write a profile folder (validated before it lands)."""
    from sparksim.cost.profile import write_profile
    from sparksim.profiling.card import cpu_name
    from sparksim.profiling.fit import fit_prefill

    verify, draft = fit_decode(points)
    coef = dict(zip(verify.names, verify.coef, strict=True))
    verify_csv, attention = verify_tables(verify, points)
    pfit = fit_prefill(prefill["tokens"].tolist(), prefill["prefill_ms"].tolist())
    p_tokens = sorted({1, *prefill["tokens"].tolist(), 4096})
    prefill_csv = pd.DataFrame({"tokens": p_tokens,
                                "prefill_ms": [max(pfit.a_ms + pfit.b_ms_per_token * q, 1e-6) for q in p_tokens]})
    extra: dict[str, pd.DataFrame] = {"attention.csv": attention, "prefill.csv": prefill_csv,
                                      "points.csv": points, "prefill_points.csv": prefill}
    cfg_t = models.target.cfg
    card: dict[str, Any] = {
        "source": "measured",
        "hardware": f"{cpu_name()} ({cfg.threads} torch thread{'s' if cfg.threads != 1 else ''})",
        "model": f"sparksim-tinylm d={cfg_t.d_model} L={cfg_t.n_layers} heads={cfg_t.n_heads} ff={cfg_t.d_ff}",
        "dtype": "fp32",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "engine": "sparksim live (LiveBatch.decode / LiveBatch.prefill: the live engine's own step "
                  f"functions), PyTorch {torch.__version__} eager, Python {platform.python_version()}",
        "models": models.info,
        # eager PyTorch on a CPU: no CUDA graph, so no batch pads up to the next profiled size
        "graph_capture_sizes": [],
        "what_a_point_is": "R requests of C context tokens each (random byte contexts), each drafting p "
                           "positions and verifying all p (p = 0: plain decoding, no drafter); median of "
                           f"{cfg.replays} replays x {cfg.rounds} interleaved rounds after {cfg.warmup} "
                           "warm-ups per round; state restored between replays",
        "files": {
            "points.csv": "every measured decode point (the simulator does not read it)",
            "prefill_points.csv": "every measured prompt-only step (not read by the simulator)",
            **FILES,
            "prefill.csv": "a + b*q of the prefill fit",
        },
        "cost_model": {
            "kind": "tokens+kv (sparksim.cost.profile), least squares over the live engine's measured steps",
            "attention_ms_per_query_kv_token": coef["c4_per_query_kv_token"],
            "verify_drafts_ms": {"a_ms": coef["c5_with_drafts"],
                                 "b_ms_per_request": coef["c6_per_request_with_drafts"]},
            "verify_drafts_note": "what a step adds once it verifies any draft (exact rejection sampling with "
                                  "the residual, the drafts scattered into the target's input): c5 + c6*R "
                                  "of the verify fit, the jump between plain-decoding and drafting points",
            "attention_compute": "sum",
            "attention_kv": "padded",
            "attention_kv_note": "the live engine's attention runs over the batch padded to its longest context "
                                 "(a dense-mask scaled_dot_product_attention): a step pays R x the longest context; "
                                 "the points were measured at one context per point, where padded and summed agree",
            "prefill_attention_ms_per_token_sq": pfit.coef_ms_per_token_sq,
            "verify_fit": {"model": VERIFY_MODEL, **verify.summary()},
            "prefill_fit": pfit.summary(),
        },
        "memory_note": "the live engine preallocates its KV caches; capacity is max_concurrency slots",
        "grid": {"requests": cfg.requests, "contexts": cfg.contexts, "prompt_lengths": cfg.prompt_lengths},
    }
    if draft is not None and models.drafter is not None:
        d0, d1, d2, d3, d4 = draft.coef
        name = f"{models.drafter.cfg.kind}-{models.drafter.cfg.n_layers}"
        req = sorted({1, *cfg.requests, 2 * max(cfg.requests), 256})
        table = pd.DataFrame([{"positions": p, "requests": rr, "draft_ms": d0 + d1 * rr + d2 * rr * p + d3 * p}
                              for p in range(1, models.gamma + 1) for rr in req])
        extra[f"draft-{name}.csv"] = table
        card["files"][f"draft-{name}.csv"] = "d0 + d1*R + d2*R*p + d3*p of the draft fit (KV from kv_ms_per_token)"
        card["drafters"] = {name: {
            "file": f"draft-{name}.csv", "kind": "block", "num_layers": models.drafter.cfg.n_layers,
            "gamma": models.gamma, "kv_ms_per_token": d4,
            "source": "measured: the live engine's drafting (backbone, Markov-head sampling, confidences) "
                      "plus writing the drafter's context for the tokens the target kept; fit "
                      "draft_ms = d0 + d1*R + d2*R*p + d3*p + d4*K",
            "fit": draft.summary(),
        }}
        card["default_drafter"] = name
    if note:
        card["note"] = note
    write_profile(out, verify_csv, card, extra=extra)
    # the decision step reads the cost model just written: measure it on that profile, then add it
    card["cost_model"]["decision_ms"] = measure_decisions(out, models, cfg)
    card["cost_model"]["decision_note"] = (
        "what the live engine spends per step asking the policy for its lengths (StepBatch, the cost "
        "model's lookups, decide, checks): simulate with cluster.pipeline=sync, cluster.decision_s=profile")
    return write_profile(out, verify_csv, card, extra=extra)


__all__ = ["LeastSquaresFit", "add_loop", "fit_decode", "refit_verify"]  # the fits, from sparksim.live.fits
