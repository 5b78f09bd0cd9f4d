"""Profiles from published fitted cost models: DistServe's linear fits of OPT on an A100.

DistServe (Zhong et al., OSDI 2024) validated its SimPy simulator against its own system
with per-iteration cost fits (simdistserve/estimators/time_estimator.py and
profile_data/profiler-a100-80g.{distserve,vllm}.json in LLMServe/DistServe, commit
82831f1), in milliseconds:

    prefill(L)   = a + b·ΣL + c·ΣL² + 1 (pipeline constant)             L: prompt lengths
    decode(B, x) = a + b·Σ(x + 1) + c·B, with (a, b, c) switching at B ≥ 95   x: contexts
    both         + 2 + 1e-4·Σ(tokens held) per iteration ("ray overhead", worker.py)

sparksim's context for a decoding request (prompt + emitted, the first token included)
is DistServe's x + 1, so the decode fit splits exactly into sparksim's terms:

    dense(T)        = a + 2 + (c − 1e-4)·T             (plain decoding: T = B)
    attention(B, K) = (b + 1e-4)·K,  K = Σ sparksim context = Σ(x + 1)
    prefill_dense   = a + 3 + (b + 1e-4)·ΣL;  prefill attention c·L² per prompt

The coefficients are DistServe's published fits, not sparksim measurements; the card
says so. Where the fit itself falls with batch size (B = 95..~107, the small- and
large-batch fits cross), the profile's clean-up raises it to the running maximum.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from sparksim.errors import ConfigError
from sparksim.hardware import GPUS

SOURCE = (
    "LLMServe/DistServe@82831f1 simdistserve/estimators/profile_data/"
    "profiler-a100-80g.{engine}.json ['facebook/opt-13b']['1'] (TP=1), used by "
    "simdistserve/estimators/time_estimator.py; per-iteration overhead 2 ms + 1e-4 ms per "
    "token held from simdistserve/base/worker.py"
)
RAY_OVERHEAD_MS = 2.0  # worker.py: every iteration
RAY_OVERHEAD_MS_PER_TOKEN = 1e-4  # worker.py: × Σ context tokens of the iteration
PIPELINE_CONST_MS = 1.0  # time_estimator.py: prefill delay + 1 × pp (pp = 1)


@dataclass(frozen=True)
class LinearFit:
    """DistServe's fitted per-iteration cost of one engine on one GPU, ms."""

    prefill: tuple[float, float, float]  # a, b (per prompt token), c (per prompt token²)
    decode_small: tuple[float, float, float]  # a, b (per context token), c (per request); B < threshold
    decode_large: tuple[float, float, float]  # the same for B ≥ threshold
    threshold: int = 95


# OPT-13B, TP = 1, A100-80G: the two engines DistServe models (its own, and vLLM's colocated one)
DISTSERVE_OPT13B_A100: dict[str, LinearFit] = {
    "distserve": LinearFit(
        prefill=(18.10254647486372, 0.1019122572698738, 7.122264314252114e-06),
        decode_small=(19.934702624895458, 0.0006269356524350583, 0.03850697740828398),
        decode_large=(7.1661889468253595, 0.0005798000403396046, 0.15831096191764046),
    ),
    "vllm": LinearFit(
        prefill=(22.052204789310185, 0.14050923870128956, 8.076584822611088e-06),
        decode_small=(23.475041008414784, 0.000592934466077393, 0.060726861260369455),
        decode_large=(20.206356173691958, 0.0004907727036234946, 0.1200031385587413),
    ),
}

# OPT-13B (facebook/opt-13b config: 40 layers, hidden 5120, fp16) on an A100-80G
OPT13B_PARAMS = 12_853_473_280  # total parameters, from the config's shapes (vocab 50272)
OPT13B_KV_BYTES_PER_TOKEN = 2 * 40 * 5120 * 2  # K and V, every layer, fp16
A100_80G_HBM_BYTES = int(GPUS["a100"].hbm_bytes)  # 79.14 GiB, the memory CUDA reports


def decode_ms(fit: LinearFit, contexts: np.ndarray[Any, np.dtype[np.float64]]) -> float:
    """Return DistServe's decode-iteration time for requests at sparksim `contexts` (= x + 1)."""
    b_req = contexts.size
    a, b, c = fit.decode_small if b_req < fit.threshold else fit.decode_large
    held = float(contexts.sum())
    return a + b * held + c * b_req + RAY_OVERHEAD_MS + RAY_OVERHEAD_MS_PER_TOKEN * (held - b_req)


def prefill_ms(fit: LinearFit, prompts: np.ndarray[Any, np.dtype[np.float64]]) -> float:
    """Return DistServe's prefill-iteration time for whole prompts of lengths `prompts`."""
    a, b, c = fit.prefill
    total = float(prompts.sum())
    return (a + b * total + c * float((prompts**2).sum()) + PIPELINE_CONST_MS + RAY_OVERHEAD_MS
            + RAY_OVERHEAD_MS_PER_TOKEN * total)


def distserve_profile(
    engine: str = "distserve", max_tokens: int = 4096, max_requests: int = 65536,
    command: str = "",
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, Any]]:
    """Return (verify, {attention.csv, prefill.csv}, card) for DistServe's OPT-13B A100 fit."""
    if engine not in DISTSERVE_OPT13B_A100:
        raise ConfigError(f"engine={engine!r} is not one of {sorted(DISTSERVE_OPT13B_A100)}")
    fit = DISTSERVE_OPT13B_A100[engine]
    per_token = RAY_OVERHEAD_MS_PER_TOKEN
    tokens = np.arange(1, max_tokens + 1, dtype=np.float64)
    small = tokens < fit.threshold
    a = np.where(small, fit.decode_small[0], fit.decode_large[0])
    c = np.where(small, fit.decode_small[2], fit.decode_large[2])
    verify = pd.DataFrame({"tokens": tokens.astype(np.int64),
                           "step_ms": a + RAY_OVERHEAD_MS + (c - per_token) * tokens})
    kv_top = 10_000_000.0
    rows = []
    for req in (1, fit.threshold - 1, fit.threshold, max_requests):
        b = fit.decode_small[1] if req < fit.threshold else fit.decode_large[1]
        rows += [(req, 0, 0.0), (req, int(kv_top), (b + per_token) * kv_top)]
    attention = pd.DataFrame(rows, columns=["requests", "kv_tokens", "attn_ms"])
    pa, pb, pc = fit.prefill
    prefill = pd.DataFrame({
        "tokens": [1, 1_000_000],
        "prefill_ms": [pa + PIPELINE_CONST_MS + RAY_OVERHEAD_MS + (pb + per_token) * t
                       for t in (1, 1_000_000)],
    })
    card: dict[str, Any] = {
        "source": "published",
        "hardware": "A100-80G (DistServe's profiling GPU)",
        "model": "facebook/opt-13b",
        "dtype": "fp16",
        "date": datetime.now(UTC).date().isoformat(),
        "command": command or f"sparksim.cost.fitted.distserve_profile(engine={engine!r})",
        "engine": f"{engine} as DistServe's simulator models it (TP=1, PP=1)",
        "graph_capture_sizes": [],
        "gpus_per_replica": 1,
        "cost_model": {
            "kind": "tokens+kv (sparksim.cost.profile)",
            "prefill_attention_ms_per_token_sq": pc,
            "fit": {"prefill_abc": list(fit.prefill), "decode_small_abc": list(fit.decode_small),
                    "decode_large_abc": list(fit.decode_large),
                    "large_batch_from_requests": fit.threshold},
            "split": "dense(T) = a + 2 + (c - 1e-4) T; attention(R, K) = (b + 1e-4) K with K the "
                     "sum of sparksim contexts (prompt + emitted = DistServe's context + 1); "
                     "prefill = a + 3 + (b + 1e-4) sum(L) + c sum(L^2). Exact for plain decoding "
                     "and prefill-only iterations; drafted tokens are priced per token as "
                     "decode requests, which the fit cannot tell apart.",
            "source": SOURCE.format(engine=engine),
        },
        "memory": {
            "hbm_bytes": A100_80G_HBM_BYTES,
            "weights_bytes": 2 * OPT13B_PARAMS,
            "kv_bytes_per_token": OPT13B_KV_BYTES_PER_TOKEN,
            "activation_reserve_bytes": 0,
            "source": "A100 80GB datasheet; facebook/opt-13b config (40 layers, hidden 5120) in "
                      "fp16; no activation reserve (DistServe's simulator has no KV limit)",
        },
        "caveats": (
            "Not a sparksim measurement: DistServe's published least-squares fits. Between 95 "
            "and about 107 tokens the large-batch fit is below the small-batch one at 94; the "
            "loader raises it to the running maximum (a warning). No drafter tables: the fit "
            "knows no speculative decoding."
        ),
    }
    return verify, {"attention.csv": attention, "prefill.csv": prefill}, card
