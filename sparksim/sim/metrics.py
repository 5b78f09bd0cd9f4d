"""Summary metrics, named as vLLM's `bench serve` names them, plus the speculative-decoding ones.

Latency figures (ttft, tpot, e2el) come from the requests that arrived inside the
steady-state window and finished; throughput counts the tokens emitted inside the window;
ITL comes from a log-binned histogram of inter-emission gaps (≤ 0.6 % bin width: with
speculative decoding a step emits a chunk of tokens, and ITL is the gap between chunks,
as vLLM measures it). `interactivity` is tokens per second per user = 1000 / mean TPOT (ms).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from sparksim.config import Scenario
from sparksim.step.records import StreamStats

if TYPE_CHECKING:
    import pandas as pd

PERCENTILES = (("median", 0.5), ("p90", 0.9), ("p99", 0.99))
# The request columns the summary reads (`summarize`, and the runner's cost block its
# preemptions): a run streamed to parquet reads back only these, 8 bytes a request each.
SUMMARY_COLUMNS = ["arrival_at", "first_token_at", "finish_at", "output_tokens", "domain", "decode_steps",
                   "trace_switches", "preemptions"]
# More of the requests that arrived in the steady window than this share unfinished at the
# horizon: the queue was still growing, latencies are optimistic (`run` warns; sweeps leave
# such points out of matched speedups).
UNFINISHED_SHARE = 0.05
# What the summary's request counts count, written into it: `completed` and `steady_requests`
# differ most in an overloaded run, where the first is large and the second near zero.
COUNTS_NOTE = (
    "completed: requests that finished inside the steady window, whenever they arrived "
    "(request_throughput = completed / window length); steady_requests: requests that arrived "
    "inside the window and finished by the horizon (the latency figures' sample); "
    "steady_unfinished: requests that arrived inside the window and had not finished at the horizon, "
    "steady_waiting of them not yet started"
)


def _dist(name: str, values_ms: np.ndarray[Any, np.dtype[np.float64]]) -> dict[str, float]:
    out: dict[str, float] = {}
    if values_ms.size == 0:
        out[f"mean_{name}_ms"] = math.nan
        for label, _ in PERCENTILES:
            out[f"{label}_{name}_ms"] = math.nan
        return out
    out[f"mean_{name}_ms"] = float(values_ms.mean())
    for label, q in PERCENTILES:
        out[f"{label}_{name}_ms"] = float(np.quantile(values_ms, q))
    return out


def acceptance_by_position(stats: StreamStats) -> dict[str, list[float]]:
    """Per-position survival P(acc ≥ k | verified ≥ k) and conditional P(acc ≥ k | acc ≥ k−1, verified ≥ k)."""
    g = stats.gamma
    joint = stats.joint.reshape(g + 1, g + 1)  # [ℓ, accepted]
    ell = np.arange(g + 1)
    survival, conditional = [], []
    for k in range(1, g + 1):
        ver = joint[ell >= k]  # rows with ℓ ≥ k
        denom = ver.sum()
        acc_k = ver[:, k:].sum()
        acc_km1 = ver[:, k - 1 :].sum()
        survival.append(float(acc_k / denom) if denom else math.nan)
        conditional.append(float(acc_k / acc_km1) if acc_km1 else math.nan)
    return {"survival": survival, "conditional": conditional}


def summarize(
    scenario: Scenario,
    requests: Mapping[str, ArrayLike] | pd.DataFrame,
    stats: StreamStats,
    census: dict[str, int],
    domains: list[str],
    extra: dict[str, Any] | None = None,
    gpus_per_replica: int | None = None,
) -> dict[str, Any]:
    """Return the run's summary dict (what summary.json holds).

    `requests` (a frame, or NumPy columns by name) needs only the SUMMARY_COLUMNS; every
    figure is computed from the whole column (exact percentiles and means, never a running
    estimate), so a table streamed to a file and read back in those columns gives the same
    summary, float for float.
    """
    col = {k: np.asarray(requests[k]) for k in SUMMARY_COLUMNS if k != "preemptions"}
    arrival, first, finish, out = col["arrival_at"], col["first_token_at"], col["finish_at"], col["output_tokens"]
    w0, w1 = stats.window_start, stats.window_end
    window_s = w1 - w0

    def per_s(count: float) -> float:  # a rate over the window (NaN over an empty one)
        return count / window_s if window_s > 0 else math.nan

    steady = (arrival >= w0) & (arrival <= w1)
    num_steady = int(steady.sum())
    ttft = (first[steady] - arrival[steady]) * 1e3
    e2el = (finish[steady] - arrival[steady]) * 1e3
    multi = steady & (out > 1)
    tpot = (finish[multi] - first[multi]) / (out[multi] - 1) * 1e3
    per_replica = gpus_per_replica or scenario.cluster.gpus_per_replica or 1
    gpus = scenario.cluster.replicas * per_replica
    pf = scenario.cluster.prefill
    gpus_total = gpus + (pf.instances * per_replica
                         if pf.mode == "disaggregated" else 0)
    out_tput = per_s(stats.window_tokens)
    completed = int(((finish >= w0) & (finish <= w1)).sum())
    summary: dict[str, Any] = {
        "scenario": scenario.name,
        "policy": scenario.policy.name,
        "seed": scenario.seed,
        "duration_s": scenario.run.duration_s,
        "window": {"warmup_s": w0, "cooldown_s": scenario.run.duration_s - w1, "length_s": window_s},
        "num_gpus": gpus,
        # finished inside the window, whenever they arrived: what request_throughput counts
        "completed": completed,
        # arrived inside the window and finished by the horizon: the latency figures' sample
        "steady_requests": num_steady,
        # arrived in the window but unfinished at the horizon: latency figures leave them out,
        # so a large share means the system is saturated and the latencies are optimistic
        "steady_unfinished": max(census.get("arrived_in_window", num_steady) - num_steady, 0),
        # of those, the ones that had not started decoding (still queued): a growing queue
        "steady_waiting": census.get("waiting_in_window",
                                     max(census.get("arrived_in_window", num_steady) - num_steady, 0)),
        "request_throughput": per_s(completed),
        "output_throughput": out_tput,
        "tput_per_gpu": out_tput / gpus,
        "num_gpus_with_prefill": gpus_total,
        "tput_per_gpu_with_prefill": out_tput / gpus_total,
    }
    summary.update(_dist("ttft", ttft))
    summary.update(_dist("tpot", tpot))
    itl_qs = stats.itl_quantiles([q for _, q in PERCENTILES])
    summary["mean_itl_ms"] = stats.itl_sum_s / stats.itl_count * 1e3 if stats.itl_count else math.nan
    for (label, _), v in zip(PERCENTILES, itl_qs, strict=True):
        summary[f"{label}_itl_ms"] = v * 1e3
    summary.update(_dist("e2el", e2el))
    mean_tpot = summary["mean_tpot_ms"]
    summary["interactivity"] = 1e3 / mean_tpot if mean_tpot and not math.isnan(mean_tpot) else math.nan
    rs = stats.window_request_steps
    summary["mean_acceptance_length"] = stats.window_emitted_decode / rs if rs else math.nan
    summary["verify_budget_per_request"] = (rs + stats.window_verified) / rs if rs else math.nan
    summary["acceptance_by_position"] = acceptance_by_position(stats)
    slo = scenario.slo
    if any(v is not None for v in (slo.ttft_ms, slo.tpot_ms, slo.e2el_ms)):
        good = np.ones(num_steady, dtype=bool)
        if slo.ttft_ms is not None:
            good &= ttft <= slo.ttft_ms
        if slo.e2el_ms is not None:
            good &= e2el <= slo.e2el_ms
        if slo.tpot_ms is not None:
            tp = (finish[steady] - first[steady]) / np.maximum(out[steady] - 1, 1) * 1e3
            good &= tp <= slo.tpot_ms
        summary["request_goodput"] = per_s(float(good.sum()))
        summary["slo_attainment"] = float(good.mean()) if len(good) else math.nan
        summary["slo"] = slo.model_dump()
    by_dom = {}
    for k, dom in enumerate(domains):
        sub = steady & (col["domain"] == k)
        if sub.any():
            steps = col["decode_steps"][sub].sum()
            by_dom[dom] = {
                "requests": int(sub.sum()),
                "mean_acceptance_length": float((out[sub] - 1).sum() / steps) if steps else math.nan,
            }
    summary["by_domain"] = by_dom
    summary["census"] = census
    summary["counts_note"] = COUNTS_NOTE
    summary["trace_switches"] = int(col["trace_switches"].sum())
    if extra:
        summary.update(extra)
    return summary


def step_gaps(steps: pd.DataFrame) -> pd.DataFrame:
    """Return the idle gap before each step of a run: (after, kind, requests, gap_ms), one row per step but the first.

    `kind` is the step's and `after` the step's before it (prefill: a prompt-only step;
    decode otherwise); `requests` the requests running while the host worked: the decode
    step's own, or the step's before a prefill (the finished ones included: off by the one
    or two that just ended). A simulated run without `cost_model.loop_ms` has none.
    """
    import pandas as pd

    start = steps["start_at"].to_numpy()
    end = start + steps["step_s"].to_numpy()
    prefill = steps["prefill_tokens"].to_numpy() > 0
    kind = np.where(prefill, "prefill", "decode")
    running = steps["num_requests"].to_numpy()
    before = np.r_[0, running[:-1]]
    return pd.DataFrame({"after": kind[:-1], "kind": kind[1:],
                         "requests": np.where(prefill, before, running)[1:],
                         "gap_ms": (start[1:] - end[:-1]) * 1e3})
