# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # Does sparksim predict a real vLLM run? Mixtral-8x7B, TP 2, on H100s
#
# Three real vLLM runs (inference-sim/training, `analyses/data/inference-sim-vllm/SOURCE.md`)
# are replayed request by request (their recorded arrivals, prompt and output lengths) through
# sparksim on the analytic MoE/TP profile `profiles/h100x2-mixtral-8x7b-analytic` (roofline
# from datasheet figures, nothing fitted to these runs) with the run's engine settings:
# chunked prefill under a 2,048-token step budget, at most 128 running requests, the KV
# capacity vLLM reported (440,160 tokens), plain decoding. Per load stage, the measured and
# predicted mean TTFT and end-to-end latency. Targets (issue 13): E2E within 10 %, TTFT
# within 25 %. One input is uncertain by construction: what a step past the largest
# CUDA-graph size (256 tokens: every step carrying a prompt chunk) pays in kernel launches.
# The shipped profile adds every launch in full (`cliff: full`, an upper bound: no CPU/GPU
# overlap); vLLM V1 overlaps launches with the GPU and fuses kernels, so the run is also
# shown with no launch cost at all (`cliff: none`, a lower bound). Nothing else changes.

# %%
from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings
from pathlib import Path

import pandas as pd

from sparksim.config import REPO_ROOT, parse_scenario
from sparksim.hardware import GPUS
from sparksim.models import load_model_spec
from sparksim.profile import ProfileWarning, write_profile
from sparksim.roofline import Parallelism, analytic_profile, default_capture_sizes
from sparksim.runner import simulate

warnings.simplefilter("ignore", ProfileWarning)
DATA = REPO_ROOT / "analyses" / "data" / "inference-sim-vllm"
RUNS = ("20260218-130541-mixtral-8x7b-v0-1-tp2-general", "20260218-120914-mixtral-8x7b-v0-1-tp2-codegen",
        "20260218-141024-mixtral-8x7b-v0-1-tp2-roleplay")
LIMIT = int(os.environ.get("SPARKSIM_ANALYSIS_REQUESTS", "0"))  # 0: every request (tests use fewer)


SHIPPED = REPO_ROOT / "profiles" / "h100x2-mixtral-8x7b-analytic"
work = Path(tempfile.mkdtemp())
no_launch = dataclasses.replace(GPUS["h100"], launch_us=0.0)
verify, extra, card = analytic_profile(no_launch, load_model_spec("mixtral-8x7b"), drafters=[],
                                       capture_sizes=default_capture_sizes(256),
                                       parallel=Parallelism(2, "tp"))
PROFILES = {"full": SHIPPED, "none": write_profile(work / "no-launch", verify, card, extra=extra)}


def scenario(arrivals: Path, last_arrival_s: float, profile: Path) -> dict[str, object]:
    return {
        "name": "vllm-mixtral",
        "profile": str(profile),
        "cluster": {"replicas": 1, "max_concurrency": 128, "max_batch_tokens": 2048,
                    "kv_capacity_tokens": 440_160,
                    "prefill": {"mode": "colocated", "schedule": "chunked", "chunk_tokens": 2048}},
        "workload": {"kind": "replay", "arrivals_csv": str(arrivals)},
        "policy": {"name": "static", "gamma": 0},
        "run": {"duration_s": last_arrival_s + 600.0, "warmup_s": 0.0, "cooldown_s": 0.0},
    }


rows = []
for run in RUNS:
    measured = pd.read_csv(DATA / f"{run}.csv.gz")
    if LIMIT:
        measured = measured.iloc[:LIMIT]
    csv = work / "arrivals.csv"
    measured[["arrival_s", "prompt_tokens", "output_tokens"]].to_csv(csv, index=False)
    for cliff, profile in PROFILES.items():
        sc = scenario(csv, float(measured["arrival_s"].max()), profile)
        req = simulate(parse_scenario(sc)).requests
        req = req.sort_values("request_id").reset_index(drop=True)  # ids follow arrival order
        pred = pd.DataFrame({"stage": measured["stage"].to_numpy(),
                             "ttft_ms": (req["first_token_at"] - req["arrival_at"]).to_numpy() * 1e3,
                             "e2e_ms": (req["finish_at"] - req["arrival_at"]).to_numpy() * 1e3})
        for stage, got in pred.groupby("stage"):
            real = measured[measured["stage"] == stage]
            rows.append({"run": run.split("-tp2-")[1], "stage": int(stage), "cliff": cliff,
                         "requests": len(real), "ttft_real": real["ttft_ms"].mean(),
                         "ttft_sim": got["ttft_ms"].mean(), "e2e_real": real["e2e_ms"].mean(),
                         "e2e_sim": got["e2e_ms"].mean()})
table = pd.DataFrame(rows)
table["ttft_err"] = table["ttft_sim"] / table["ttft_real"] - 1
table["e2e_err"] = table["e2e_sim"] / table["e2e_real"] - 1
print(table.to_string(index=False, formatters={
    **{c: "{:,.1f}".format for c in ("ttft_real", "ttft_sim", "e2e_real", "e2e_sim")},
    "ttft_err": "{:+.1%}".format, "e2e_err": "{:+.1%}".format}))

# %% [markdown]
# Reading it (the full runs, docs/fidelity.md §4): end-to-end latency lands within +0.6 % to
# +7.1 % in every stage but the 20 req/s one, which the full launch cost pushes to +16.9 %
# (+6.0 % without it): the cliff is the input that explains it. TTFT comes out 15–32 ms below
# the measurement in every stage (but 109 ms above it at 20 req/s with the full cliff, where
# prompts queue behind the slower steps): the measured TTFT is client-side (an
# HTTP request, tokenisation, the first streamed event), which sparksim does not model, and
# each run's first ~50 requests (warm-up, 0.3–1.8 s each) lift the measured means.
