"""The DistServe cross-check: DistServe's benchmark through sparksim on DistServe's own cost fit.

DistServe's SimPy simulator was validated by its authors against their system. Given the
same fitted OPT-13B A100 cost model (`sparksim.cost.fitted`, shipped as
`profiles/a100-opt13b-{distserve,vllm}-published`) and the same arrivals, sparksim must
agree with it; the reference figures below come from running DistServe's own code
(LLMServe/DistServe@82831f1, `simdistserve.benchmarks.simulate_dist`, OPT-13B, TP = 1):

- `disaggregated` (`--backend distserve`): 1 prefill + 1 decode GPU, no KV transfer delay;
- `colocated` (`--backend vllm`): one GPU, prefill-first iterations, the decode batch
  capped at 50,000 context tokens (requests that do not fit wait their turn).

Workload: 1,000 requests, 512-token prompts, 256 decode iterations each (DistServe's
first token comes from the prefill and is not counted, so sparksim's output length is
257), Poisson 4 req/s: gaps `numpy.random.default_rng(0).exponential(0.25, 999)` with
the first request at t = 0. TPOT = (finish − first token) / 256 in both.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sparksim.config import REPO_ROOT, parse_scenario
from sparksim.sim.runner import RunResult, simulate

NUM_REQUESTS = 1000
PROMPT_TOKENS = 512
DECODE_ITERATIONS = 256
DECODE_CONTEXT_CAP = 50_000  # simdistserve/base/worker.py `_enter_decodes`
MAX_BATCH_TOKENS = 66_144  # simdistserve/estimators/profile_data/max_num_tokens.csv, OPT-13B TP1

# DistServe's own figures on this workload (its code at commit 82831f1; reproduced exactly)
REFERENCE: dict[str, dict[str, float]] = {
    "disaggregated": {
        "decode_iterations": 6197, "mean_decode_batch": 41.31, "last_finish_s": 265.03,
        "mean_tpot_ms": 44.53, "median_tpot_ms": 46.05,
        "mean_ttft_ms": 89.17, "median_ttft_ms": 75.20, "p90_ttft_ms": 134.0,
    },
    "colocated": {
        "decode_iterations": 3537, "prefill_iterations": 871, "mean_decode_batch": 72.4,
        "last_finish_s": 315.2, "mean_tpot_ms": 282.8, "median_tpot_ms": 306.4,
        "mean_ttft_ms": 160.3, "median_ttft_ms": 145.5, "p90_ttft_ms": 233.6,
    },
}
TOLERANCE = {"p90_ttft_ms": 0.10}  # every other figure: 5 %


def benchmark_arrivals(num_requests: int = NUM_REQUESTS) -> pd.DataFrame:
    """Return DistServe's benchmark arrivals: arrival_s, prompt_tokens, output_tokens."""
    gaps = np.random.default_rng(0).exponential(0.25, num_requests - 1)
    return pd.DataFrame({
        "arrival_s": np.concatenate([[0.0], np.cumsum(gaps)]),
        "prompt_tokens": PROMPT_TOKENS,
        "output_tokens": DECODE_ITERATIONS + 1,
    })


def scenario(mode: str, arrivals_csv: Path, num_requests: int = NUM_REQUESTS) -> dict[str, Any]:
    """Return the sparksim scenario (a mapping) that mirrors DistServe's `mode` setup."""
    engine = "distserve" if mode == "disaggregated" else "vllm"
    prefill: dict[str, Any] = (
        {"mode": "disaggregated", "instances": 1, "kv_transfer_s": 0.0,
         "max_batch_tokens": MAX_BATCH_TOKENS}
        if mode == "disaggregated" else {"mode": "colocated", "schedule": "prefill-first"}
    )
    return {
        "name": f"distserve-{mode}",
        "profile": str(REPO_ROOT / "profiles" / f"a100-opt13b-{engine}-published"),
        "cluster": {
            "replicas": 1, "max_concurrency": 2 * num_requests, "max_batch_tokens": MAX_BATCH_TOKENS,
            "kv_capacity_tokens": "unlimited",  # DistServe's simulator has no KV limit
            "max_context_tokens": DECODE_CONTEXT_CAP, "prefill": prefill,
        },
        "workload": {"kind": "replay", "arrivals_csv": str(arrivals_csv)},
        "policy": {"name": "static", "gamma": 0},  # plain decoding: DistServe has no drafter
        "run": {"duration_s": 36_000.0, "warmup_s": 0.0, "cooldown_s": 0.0},
    }


def simulate_benchmark(mode: str, workdir: Path) -> RunResult:
    """Simulate DistServe's benchmark in `mode` (the arrivals CSV is written under `workdir`)."""
    if mode not in REFERENCE:
        raise ValueError(f"mode={mode!r} is not one of {sorted(REFERENCE)}")
    csv = workdir / "distserve-arrivals.csv"
    benchmark_arrivals().to_csv(csv, index=False)
    return simulate(parse_scenario(scenario(mode, csv)))


def run_benchmark(mode: str, workdir: Path) -> dict[str, float]:
    """Run DistServe's benchmark in sparksim's `mode` and return the figures DistServe reports."""
    result = simulate_benchmark(mode, workdir)
    req, steps = result.requests, result.steps
    assert steps is not None
    decode = steps[steps["num_requests"] > 0]
    ttft = (req["first_token_at"] - req["arrival_at"]).to_numpy() * 1e3
    tpot = ((req["finish_at"] - req["first_token_at"]) / DECODE_ITERATIONS).to_numpy() * 1e3
    got = {
        "decode_iterations": float(len(decode)),
        "mean_decode_batch": float(decode["num_requests"].mean()),
        "last_finish_s": float(req["finish_at"].max()),
        "mean_tpot_ms": float(tpot.mean()), "median_tpot_ms": float(np.median(tpot)),
        "mean_ttft_ms": float(ttft.mean()), "median_ttft_ms": float(np.median(ttft)),
        "p90_ttft_ms": float(np.quantile(ttft, 0.9)),
        "finished": float(len(req)),
    }
    if mode == "colocated":
        got["prefill_iterations"] = float((steps["num_requests"] == 0).sum())
    return got


def compare(mode: str, got: dict[str, float]) -> pd.DataFrame:
    """Return one row per reference figure: DistServe, sparksim, relative error, within tolerance."""
    rows = []
    for key, ref in REFERENCE[mode].items():
        err = got[key] / ref - 1.0
        tol = TOLERANCE.get(key, 0.05)
        rows.append({"figure": key, "distserve": ref, "sparksim": got[key], "error": err,
                     "tolerance": tol, "ok": bool(math.isfinite(err) and abs(err) <= tol)})
    return pd.DataFrame(rows)
