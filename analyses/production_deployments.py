# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # Published DeepSeek-V3 deployments, predicted from their configurations (issue 24, item 4)
#
# Two deployments have published per-node throughput at a stated layout. Each is rebuilt
# here from what its authors published (GPU, EP degree, nodes, redundant experts, dual-batch
# overlap, input lengths, cache-hit rate, per-user speed or batch) with the analytic
# roofline's cited kernel figures, and its predicted per-node throughput is set beside the
# published one. Nothing is fitted: where the prediction misses the 25 % goal, the step at
# the operating point is taken apart term by term to say which term makes the difference.
#
# - **DeepSeek** (inference-system overview, 2025-03-01, open-infra-index
#   202502OpenSourceWeek day 6): H800; decode units EP144 on 18 nodes, prefill units EP32 on
#   4 nodes, 32 redundant experts each; dual-batch overlap; over 24 h 608B input tokens
#   (56.3 % prefix-cache hits) and 168B output at 20–22 tok/s per user with a mean KV length of
#   4,989 tokens per output token; ~14.8k output tok/s per decode node, ~73.7k input tok/s
#   (cache hits included) per prefill node. MTP-1 drafts one token (DeepSeek-V3 report, arXiv
#   2412.19437 §5.4.3: second-token acceptance 85–90 %, 0.875 taken).
# - **SGLang** (LMSYS blog 2025-05-05, "Deploying DeepSeek with PD Disaggregation and
#   Large-scale Expert Parallelism on 96 H100 GPUs"): decode on 9 nodes (EP72, 256 requests per
#   GPU, KV length 2,000, no MTP: the "SGLang (Default)" column), prefill on 4 nodes (EP32),
#   2,000-token inputs, DeepEP, EPLB (288 expert slots), two-batch overlap; 52.3k input and
#   22.3k output tok/s per node (the body's prefill figure for 2K inputs is 54,543).
#
# Both prefill units are priced at 16,384 tokens per GPU per batch, DeepSeek's profile-data
# prefill batch (deepseek-ai/profile-data; the batch SGLang compares at). Expert imbalance
# is the cited 1.115 (EPLB, 32 redundant experts) in every unit.

# %%
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from sparksim.hardware import GPUS, HardwareSpec
from sparksim.cost.models import ModelSpec, load_model_spec
from sparksim.cost.pricing import StepCost, StepPrice
from sparksim.cost.profile import Profile, ProfileWarning, load_profile, write_profile
from sparksim.cost.cuda_graphs import eager_step_ms, pad_to_capture
from sparksim.cost.draft_step import drafter_presets
from sparksim.cost.parallelism import Parallelism, collective_ms, routed_compute_ms
from sparksim.cost.roofline import analytic_profile
from sparksim.cost.target_step import dense_bytes, verify_flops
from sparksim.sim.runner import load_scenario, simulate

warnings.simplefilter("ignore", ProfileWarning)
DURATION = float(os.environ.get("SPARKSIM_ANALYSIS_DURATION", "300"))
MODEL = load_model_spec("deepseek-v3")
IMBALANCE = 1.115  # EPLB with 32 redundant experts (FIELD_SOURCES["expert_imbalance"])
MTP_ACCEPT = 0.875  # DeepSeek-V3 report §5.4.3: second-token acceptance 85-90 %
PREFILL_TOKENS_PER_GPU = 16_384  # deepseek-ai/profile-data's prefill batch
work = Path(tempfile.mkdtemp())


@dataclasses.dataclass(frozen=True)
class Unit:
    """One deployment unit: its GPU, its layout, and the per-node figure its authors published."""

    deployment: str
    phase: str  # decode | prefill
    gpu: str
    parallel: Parallelism
    published_per_node: float


def ep(gpus: int, nodes: int) -> Parallelism:
    """Data-parallel attention, expert parallel over `nodes`, EPLB's 32 copies, dual-batch overlap."""
    return Parallelism(gpus, "dp-ep", nodes=nodes, micro_batches=2, redundant_experts=32,
                       expert_imbalance=IMBALANCE)


UNITS = {
    "deepseek decode": Unit("DeepSeek (H800)", "decode", "h800", ep(144, 18), 14_800.0),
    "deepseek prefill": Unit("DeepSeek (H800)", "prefill", "h800", ep(32, 4), 73_700.0),
    "sglang decode": Unit("SGLang (H100)", "decode", "h100", ep(72, 9), 22_300.0),
    "sglang prefill": Unit("SGLang (H100)", "prefill", "h100", ep(32, 4), 52_300.0),
}


def build(name: str, unit: Unit) -> Path:
    """Write the unit's analytic FP8 profile (decode units carry MTP-1 at γ = 1)."""
    g = unit.parallel.gpus
    decode = unit.phase == "decode"
    drafters = [dataclasses.replace(drafter_presets(MODEL)["mtp-1"], gamma=1)] if decode else []
    verify, extra, card = analytic_profile(
        GPUS[unit.gpu], MODEL, dtype="fp8", drafters=drafters, parallel=unit.parallel,
        max_tokens=g * (512 if decode else PREFILL_TOKENS_PER_GPU), max_requests=g * 256,
        command=f"analyses/production_deployments.py: {name}")
    return write_profile(work / name.replace(" ", "-"), verify, card, extra=extra)


profiles = {name: load_profile(build(name, unit)) for name, unit in UNITS.items()}

# %% [markdown]
# ## The operating points
#
# Decode is priced by the one rule the engine charges (`StepCost`): R requests each holding
# the published mean KV length, every request verifying its one MTP draft (DeepSeek) or
# decoding one token (SGLang). DeepSeek's R is found by bisection so that a user sees
# (1 + 0.875) / step = 21 tok/s, the middle of the published 20–22; SGLang's is its published
# 256 requests per GPU. Prefill prices one batch of 16,384 tokens per GPU: DeepSeek's
# prompts are 4,381 tokens (608B input / 168B output × the 1,217-token output whose mean
# context is 4,989) of which 56.3 % are a cached prefix, so each computes 1,914 new tokens
# after 2,467 cached ones and is counted in full, as DeepSeek counts; SGLang's are 2,000
# new tokens.

# %%
DS_PROMPT, DS_OUTPUT = 4_381, 1_217  # mean context over the output: 4,381 + 1,217 / 2 ≈ 4,989
DS_KV = 4_989
DS_CACHED = round(DS_PROMPT * 0.563)
SGL_PROMPT = SGL_KV = 2_000
TARGET_TOK_S = 21.0


def decode_price(prof: Profile, requests: int, kv: float, drafts: bool) -> StepPrice:
    """A decode step of `requests` requests at `kv` tokens each, verifying one MTP draft each or none."""
    cost = StepCost.for_decode(prof, requests, requests * kv, 1 if drafts else 0,
                               "mtp-1" if drafts else None)
    return cost.price(np.ones(requests if drafts else 0, dtype=np.int64))


def prefill_price(prof: Profile, gpus: int, prompt: int, cached: int) -> tuple[StepPrice, int]:
    """One prefill batch of whole prompts filling 16,384 new tokens per GPU: (price, prompts)."""
    new = prompt - cached
    n = gpus * PREFILL_TOKENS_PER_GPU // new
    return StepCost.for_step(prof, requests=0, kv_tokens=0.0, chunks=[(new, cached)] * n).price(
        np.zeros(0, dtype=np.int64)), n


def per_user(prof: Profile, requests: int) -> float:
    return (1 + MTP_ACCEPT) / decode_price(prof, requests, DS_KV, True).total_s


def bisect_users(prof: Profile, lo: int, hi: int) -> int:
    """The most requests at which a user still sees TARGET_TOK_S (per-user speed falls with R)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if per_user(prof, mid) >= TARGET_TOK_S else (lo, mid)
    return lo


ds_dec = UNITS["deepseek decode"]
ds_users = bisect_users(profiles["deepseek decode"], 1, ds_dec.parallel.gpus * 256)
points: dict[str, dict[str, float]] = {}
price = decode_price(profiles["deepseek decode"], ds_users, DS_KV, True)
points["deepseek decode"] = {"requests": ds_users, "kv": DS_KV, "tokens": ds_users * 2,
                             "step_s": price.total_s,
                             "per_node": ds_users * (1 + MTP_ACCEPT) / price.total_s / 18}
sgl_users = 256 * UNITS["sglang decode"].parallel.gpus
price = decode_price(profiles["sglang decode"], sgl_users, SGL_KV, False)
points["sglang decode"] = {"requests": sgl_users, "kv": SGL_KV, "tokens": sgl_users,
                           "step_s": price.total_s, "per_node": sgl_users / price.total_s / 9}
for name, prompt, cached in (("deepseek prefill", DS_PROMPT, DS_CACHED),
                             ("sglang prefill", SGL_PROMPT, 0)):
    unit = UNITS[name]
    price, n = prefill_price(profiles[name], unit.parallel.gpus, prompt, cached)
    points[name] = {"requests": n, "kv": cached, "tokens": n * (prompt - cached),
                    "step_s": price.total_s, "per_node": n * prompt / price.total_s / unit.parallel.nodes}

# %% [markdown]
# ## Predicted beside published, per node

# %%
rows = []
for name, unit in UNITS.items():
    p = points[name]
    rows.append({"deployment": unit.deployment, "phase": unit.phase,
                 "operating point": (f"{p['requests'] / unit.parallel.gpus:,.0f} req/GPU, KV {p['kv']:,.0f}"
                                     if unit.phase == "decode" else
                                     f"{p['requests']:,.0f} prompts/batch, {p['kv']:,.0f} cached"),
                 "predicted": p["per_node"], "published": unit.published_per_node,
                 "ratio": p["per_node"] / unit.published_per_node,
                 "within 25 %": "yes" if abs(p["per_node"] / unit.published_per_node - 1) <= 0.25 else "no"})
table = pd.DataFrame(rows)
print(table.to_string(index=False, formatters={"predicted": "{:,.0f}".format, "published": "{:,.0f}".format,
                                                "ratio": "{:.2f}".format}))
print(f"DeepSeek decode at {TARGET_TOK_S:g} tok/s per user: {ds_users:,} requests on 144 GPUs; "
      f"the published figures imply {14_800 * 18 / TARGET_TOK_S:,.0f} "
      f"({14_800 * 18 / TARGET_TOK_S / 144:.0f} per GPU) at that speed")

# %% [markdown]
# ## The step at each operating point, term by term (ms)
#
# The dense part is the roofline's: weights and activations read from HBM, the dense GEMMs
# (attention projections, shared experts, dense layers, LM head) at compute_eff, the routed
# experts' grouped GEMMs on the busiest GPU at DeepGEMM's efficiency, and the all-to-alls;
# with dual-batch overlap the step pays max(kernels, all-to-all). MLA attention reads the
# KV cache (decode) and computes past that read; prefill attention is causal and
# compute-bound. "implied step" is what the published per-node figure allows at the same
# requests and tokens: the gap between it and the predicted step is time the model does not
# price.

# %%


def dense_terms(hw: HardwareSpec, model: ModelSpec, prof: Profile, parallel: Parallelism,
                tokens: float) -> dict[str, float]:
    """The roofline's dense terms at `tokens` replica tokens, padded as the engine pads them (ms)."""
    padded, eager = pad_to_capture([tokens], prof.captured_sizes)
    t = padded[0]
    g = parallel.gpus
    read = float(dense_bytes(model, t, dtype_bytes=1, parallel=parallel)) / (hw.mem_bytes_per_s * hw.mem_eff) * 1e3
    routed_flops = 2.0 * model.moe_layers * model.experts_per_token * model.expert_params * t
    gemm = float(verify_flops(model, t) - routed_flops) / g / (hw.peak_for(1) * hw.compute_eff) * 1e3
    grouped = float(routed_compute_ms(hw, model, t, expert_layers=model.moe_layers, dtype_bytes=1,
                                      parallel=parallel))
    a2a = float(collective_ms(hw, model, t, dtype_bytes=1, parallel=parallel))
    kernels = max(read, gemm + grouped)
    gpu = max(kernels, a2a) if parallel.micro_batches == 2 else kernels + a2a
    if eager[0]:
        gpu = float(eager_step_ms(gpu, hw.eager_overhead_ms(model.num_layers)))
    return {"padded tokens": t, "HBM read": read, "dense GEMMs": gemm, "grouped GEMMs": grouped,
            "all-to-all": a2a, "dense (max)": gpu, "step overhead": hw.step_overhead_ms}


terms = {}
for name, unit in UNITS.items():
    p, prof = points[name], profiles[name]
    if unit.phase == "decode":
        price = decode_price(prof, int(p["requests"]), p["kv"], name.startswith("deepseek"))
        tokens_out = (p["requests"] * (1 + MTP_ACCEPT) if name.startswith("deepseek") else p["requests"])
        implied = tokens_out / (unit.published_per_node * unit.parallel.nodes) * 1e3
    else:
        price, _ = prefill_price(prof, unit.parallel.gpus, DS_PROMPT if name.startswith("deepseek")
                                 else SGL_PROMPT, int(p["kv"]))
        implied = p["requests"] * (DS_PROMPT if name.startswith("deepseek") else SGL_PROMPT) / (
            unit.published_per_node * unit.parallel.nodes) * 1e3
    d = dense_terms(GPUS[unit.gpu], MODEL, prof, unit.parallel, p["tokens"])
    assert abs(d["dense (max)"] + d["step overhead"] - price.dense_s * 1e3) < 1e-6 * max(price.dense_s * 1e3, 1), name
    terms[name] = {**{k: v for k, v in d.items() if k != "padded tokens"},
                   "MLA KV read" if unit.phase == "decode" else "attention (causal)": price.kv_s * 1e3,
                   "MLA compute past read": price.attention_s * 1e3, "MTP drafter": price.draft_s * 1e3,
                   "step": price.total_s * 1e3, "implied step": implied}
breakdown = pd.DataFrame(terms).fillna(0.0)
print(breakdown.to_string(float_format=lambda v: f"{v:,.1f}"))

# %% [markdown]
# ## What would close the decode gap
#
# At DeepSeek's published operating point (the requests its figures imply at 21 tok/s) the
# model's step, and the step those figures imply. (Prefill prices MLA attention as the
# engines run it there: materialised, 2·heads·(192 + 128) FLOPs per (query, key) pair per
# layer, at the BF16 peak; `ModelSpec.prefill_attention_flops_per_pair`.)

# %%
implied_users = round(14_800 * 18 / TARGET_TOK_S)
price = decode_price(profiles["deepseek decode"], implied_users, DS_KV, True)
print(f"DeepSeek decode at {implied_users:,} requests ({implied_users / 144:.0f}/GPU): predicted step "
      f"{price.total_s * 1e3:.1f} ms ({(1 + MTP_ACCEPT) / price.total_s:.1f} tok/s per user), "
      f"published figures imply {(1 + MTP_ACCEPT) / TARGET_TOK_S * 1e3:.1f} ms")

# %% [markdown]
# ## The all-to-all at DeepEP's measured speed
#
# Both decode steps are bound by their all-to-alls, which the model prices at 0.86 × 50 GB/s
# per GPU, the dispatch in FP8 (with its scales) and the combine in BF16 as DeepEP runs them
# (`sparksim.cost.parallelism.collective_ms`). A check on that price: DeepEP's README
# (low-latency kernels, H800 + CX7 400 Gb/s, 128 tokens per batch, hidden 7168, top-8, FP8
# dispatch and BF16 combine, as DeepSeek's service runs them) measures, at EP128, dispatch 192 µs and
# combine 369 µs (39 GB/s each); at EP64 173–186 µs and 314–353 µs (the README's revisions).
# The decode step with its all-to-all at those figures instead (EP128's for DeepSeek, EP64's
# upper pair for SGLang; per micro-batch, scaled by its tokens per GPU over 128; two
# micro-batches, 58 MoE layers), everything else as priced:

# %%
DEEPEP_US = {"deepseek decode": (192.0, 369.0), "sglang decode": (186.0, 353.0)}  # at 128 tokens
for name, (dispatch_us, combine_us) in DEEPEP_US.items():
    unit, p, t = UNITS[name], points[name], terms[name]
    per_mb = p["tokens"] / unit.parallel.gpus / 2
    comm = 2 * MODEL.moe_layers * (dispatch_us + combine_us) / 1e3 * per_mb / 128
    kernels = max(t["HBM read"], t["dense GEMMs"] + t["grouped GEMMs"])
    step = t["step"] - t["dense (max)"] + max(kernels, comm)
    out = p["requests"] * ((1 + MTP_ACCEPT) if name.startswith("deepseek") else 1)
    per_node = out / (step / 1e3) / unit.parallel.nodes
    print(f"{name}: all-to-all {comm:.1f} ms (model {t['all-to-all']:.1f}), step {step:.1f} ms "
          f"(implied {t['implied step']:.1f}), {per_node:,.0f} tok/s per node, ratio "
          f"{per_node / unit.published_per_node:.2f}")

# %% [markdown]
# ## The simulator at DeepSeek's decode operating point
#
# The closed form above assumes every request at the mean context. The simulator runs the
# same unit as a closed loop of that many users (fixed 4,381-token prompts and 1,217-token
# outputs, a prefill pool that never binds, MTP-1 acceptance from the shipped traces) for
# SPARKSIM_ANALYSIS_DURATION simulated seconds: its per-node throughput and per-user speed.

# %%
sets = [f"profile={profiles['deepseek decode'].path}", "policy.name=static", "policy.gamma=1",
        "policy.drafter=mtp-1", "trace_block=1", "cluster.gpus_per_replica=144",
        f"cluster.max_concurrency={ds_users}", f"workload.concurrency={ds_users}",
        "cluster.max_batch_tokens=1000000", "cluster.prefill.instances=256",
        "workload.lengths.source=lognormal",
        f"workload.lengths.prompt={{mu: {np.log(DS_PROMPT):.4f}, sigma: 0, min: 16, max: 100000}}",
        f"workload.lengths.output={{mu: {np.log(DS_OUTPUT):.4f}, sigma: 0, min: 1, max: 100000}}",
        f"run.duration_s={DURATION:g}", "run.records.steps=false", "seed=0"]
scenario, base = load_scenario(None, sets)
summary = simulate(scenario, base).summary
sim_user = summary["mean_acceptance_length"] * 1e3 / summary["mean_itl_ms"]
print(f"simulated {DURATION:g} s, {ds_users:,} users: {summary['output_throughput'] / 18:,.0f} output tok/s "
      f"per node, {sim_user:.1f} tok/s per user, acceptance length {summary['mean_acceptance_length']:.2f}")
shutil.rmtree(work)
