# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # Where fixed verification collapses: static γ = 7 against plain decoding at production load
#
# The paper's motivation (DSpark §1; the engines' measurements of fixed-length DSpark
# verification): verifying a fixed long block pays at low load and falls below plain
# decoding at high load, where adaptive verification keeps its gain. This analysis asks the
# cost model where that happens on the shipped DeepSeek-V3 production profiles, 8×H200
# (`profiles/h200x8-deepseek-v3-analytic`) and 32×H800 on 4 nodes
# (`profiles/h800x32-deepseek-v3-analytic`), for four policies: plain decoding (static γ = 0),
# MTP-1 (static γ = 1 on the model's MTP module), fixed γ = 7 (static) and the paper's
# adaptive two-step, both on one DSpark drafter, across loads up to a few thousand
# concurrent requests per replica, then decomposes the step where fixed γ = 7 falls below
# plain decoding into the cost terms the profile prices.
#
# **The drafter bound.** The shipped profiles' DSpark drafter is the paper's production shape
# (three MoE layers, block 5): it cannot verify 7 (`trace_block` defaults to its block).
# So each profile is remade from its card's own command with `--gamma 7` (the same three
# MoE layers drafting a block of 7; the MTP module chained to 7) and a verify table reaching
# 8 × the highest load; the script checks that every row the shipped tables hold is
# unchanged. Acceptance: the synthetic DSpark Qwen3-8B traces (block 7), chat-heavy mix.
#
# **The token budget.** A data-parallel-attention replica runs one scheduler per GPU; each
# is given 8,192 tokens a step (vLLM's default `max_num_batched_tokens` for online serving,
# an assumption), so G × 8,192 per replica. No load here reaches it: what each policy
# gets is set by its step's cost, not by admission. (With the scenario default of 8,192 per
# replica, γ = 7 would admit only 1,024 requests.) The KV capacity is the shipped card's.
#
# Environment: `SPARKSIM_ANALYSIS_USERS` (loads per replica, both profiles; default below),
# `SPARKSIM_ANALYSIS_DURATION` (simulated seconds, default 60).

# %%
from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from sparksim.cost.analytic import build_analytic, dense_step_terms, options_from_command
from sparksim.config import REPO_ROOT
from sparksim.cost.pricing import StepCost
from sparksim.cost.profile import ProfileWarning, load_profile, write_profile
from sparksim.sim.runner import load_scenario, simulate
from sparksim.studies.sweep import grid, parse_vary, run_sweep

warnings.simplefilter("ignore", ProfileWarning)
PROFILES = {"8xH200": "h200x8-deepseek-v3-analytic", "32xH800": "h800x32-deepseek-v3-analytic"}
USERS = {name: os.environ.get("SPARKSIM_ANALYSIS_USERS", default) for name, default in
         (("8xH200", "64,256,512,1024,1536,2048,3072"), ("32xH800", "256,1024,1536,2048,3072,4096"))}
DURATION = float(os.environ.get("SPARKSIM_ANALYSIS_DURATION", "60"))
GAMMA = 7
PLAIN, MTP1, FIXED, ADAPTIVE = "static:gamma=0", "static:gamma=1,drafter=mtp-1", f"static:gamma={GAMMA}", "two-step"
POLICIES = {PLAIN: "plain", MTP1: "MTP-1", FIXED: f"fixed γ={GAMMA}", ADAPTIVE: "two-step"}
CHAT_HEAVY = "{chat: 0.6, code: 0.2, math: 0.2}"  # production.py's live-traffic assumption
RANK_TOKENS = 8192  # per data-parallel rank and step (an assumption: vLLM's online default)
work = Path(tempfile.mkdtemp())


def remake(name: str, max_users: int) -> tuple[Path, dict]:
    """The shipped profile remade from its card's command with --gamma 7 and tables reaching
    8 × `max_users` tokens and requests; its KV capacity (card memory) kept the shipped one's.
    Returns the folder and the command's options; fails if a row both tables hold changed
    (the request ladder past the graphs moves with --max-requests, so some are new)."""
    shipped = REPO_ROOT / "profiles" / name
    card = yaml.safe_load((shipped / "card.yaml").read_text())
    opts = {**options_from_command(card["command"]), "out": work / name, "gamma": GAMMA,
            "max_tokens": max(8192, (GAMMA + 1) * max_users), "max_requests": max(1024, max_users)}
    verify, extra, new_card, target = build_analytic(opts)
    new_card["memory"] = card["memory"]  # the activation reserve grows with max_tokens; KV stays the shipped one's
    write_profile(target, verify, new_card, extra=extra)
    for table, keys, col in (("verify.csv", ["tokens"], "step_ms"),
                             ("draft-dspark-5.csv", ["positions", "requests"], "draft_ms"),
                             ("draft-mtp-1.csv", ["positions", "requests"], "draft_ms")):
        old = pd.read_csv(shipped / table)
        both = old.merge(pd.read_csv(target / table), on=keys, suffixes=("", "_new"))
        whole = table == "verify.csv"  # every shipped dense row is kept
        assert (len(both) == len(old) if whole else len(both)) and np.allclose(
            both[col], both[f"{col}_new"], rtol=1e-12), table
    return target, opts


def sets(profile: Path, users: list[int], gpus: int) -> list[str]:
    return [f"profile={profile}", f"run.duration_s={DURATION:g}", f"workload.mix={CHAT_HEAVY}",
            f"cluster.max_concurrency={max(users)}", f"cluster.max_batch_tokens={gpus * RANK_TOKENS}"]


made = {}
tables = {}
for label, name in PROFILES.items():
    users = [int(u) for u in USERS[label].split(",")]
    profile, opts = remake(name, max(users))
    made[label] = (profile, opts, users)
    points = grid(parse_vary([f"workload.concurrency={USERS[label]}"]), list(POLICIES))
    tables[label] = run_sweep(None, sets(profile, users, opts["gpus"]), points, workers=2)
print(f"profiles remade with --gamma {GAMMA}: every shipped verify row and every draft row both hold unchanged; "
      f"DSpark drafter: 3 MoE layers, block {GAMMA}")

# %% [markdown]
# ## Throughput per GPU at each load, and each policy's ratio to plain decoding
#
# Closed loop, the same users for every policy: tok/s per GPU, and × plain decoding's at that
# load. A ratio below 1.00 is the collapse.

# %%
for label, table in tables.items():
    tput = table.pivot(index="workload.concurrency", columns="policy", values="tput_per_gpu")[list(POLICIES)]
    ratio = tput.div(tput[PLAIN], axis=0)
    view = pd.concat({"tok/s/GPU": tput.rename(columns=POLICIES),
                      "x plain": ratio.drop(columns=PLAIN).rename(columns=POLICIES)}, axis=1)
    budget = table[table["policy"] == ADAPTIVE].set_index("workload.concurrency")["verify_budget_per_request"]
    view[("two-step", "budget")] = budget
    print(f"{label} ({PROFILES[label]}), tok/s/GPU and x plain decoding, by users per replica:")
    print(view.rename_axis("users").to_string(float_format=lambda v: f"{v:,.2f}" if v < 20 else f"{v:,.0f}"))

# %% [markdown]
# ## The load where fixed γ = 7 falls below plain decoding
#
# Between the last load it beats plain decoding and the first it does not, interpolated in
# log(users) on the ratio; the adaptive policy's ratio at the same loads beside it.


# %%
def crossing(users: np.ndarray, ratio: np.ndarray) -> float | None:
    """The load where `ratio` first falls below 1, interpolated in log(users); None if it never does."""
    below = np.flatnonzero(ratio < 1.0)
    if not below.size:
        return None
    i = below[0]
    if i == 0:
        return float(users[0])
    x0, x1, y0, y1 = np.log(users[i - 1]), np.log(users[i]), ratio[i - 1], ratio[i]
    return float(np.exp(x0 + (1.0 - y0) * (x1 - x0) / (y1 - y0)))


collapse = {}
for label, table in tables.items():
    tput = table.pivot(index="workload.concurrency", columns="policy", values="tput_per_gpu")
    users = tput.index.to_numpy()
    at = crossing(users, (tput[FIXED] / tput[PLAIN]).to_numpy())
    adaptive_at = crossing(users, (tput[ADAPTIVE] / tput[PLAIN]).to_numpy())
    collapse[label] = at
    if at is None:
        print(f"{label}: fixed γ={GAMMA} stays above plain decoding up to {users[-1]:,} users "
              f"(x{(tput[FIXED] / tput[PLAIN]).iloc[-1]:.2f} there)")
    else:
        print(f"{label}: fixed γ={GAMMA} falls below plain decoding at ~{at:,.0f} users per replica "
              f"({at / made[label][1]['gpus']:,.0f} per GPU); two-step "
              + (f"falls below it at ~{adaptive_at:,.0f}" if adaptive_at is not None
                 else f"stays above it to {users[-1]:,} (x{(tput[ADAPTIVE] / tput[PLAIN]).iloc[-1]:.2f} there)"))

# %% [markdown]
# ## Which cost term is responsible
#
# At the first load past the collapse (or the highest load, where there is none), one step
# of plain decoding and one of fixed γ = 7, both for every user running at the γ = 7 run's
# median KV tokens, priced by the engine's own rule (`StepCost`), and its dense part taken
# apart on the roofline the profile was built from, each term as charged: the kernels cost
# max(HBM reads, dense GEMMs + the routed experts' grouped GEMMs at DeepGEMM's efficiency),
# so only the side that binds is shown; the all-to-alls add (with dual-batch overlap only
# the larger of kernels and all-to-alls counts); an eager step's dispatch past its GPU time;
# the table's interpolation past the captured sizes (0 inside them); KV read and MLA's
# attention FLOPs past it; the drafter. The rows sum to the step.


# %%
CHARGED = ["drafter", "HBM read", "dense GEMMs", "grouped GEMMs", "all-to-all", "eager dispatch",
           "step overhead", "table interpolation", "KV read", "MLA FLOPs past read", "engine loop"]


def decompose(label: str, users: int) -> pd.DataFrame:
    """Plain and fixed-γ steps at `users`, term by term as charged (ms; they sum to the step),
    for the γ = 7 run's fullest batch at its median KV tokens."""
    profile_dir, opts, all_users = made[label]
    scenario, base = load_scenario(None, [*sets(profile_dir, all_users, opts["gpus"]),
                                          f"workload.concurrency={users}"], FIXED)
    steps = simulate(scenario, base).steps
    busy = steps[steps["num_requests"] == steps["num_requests"].max()]
    reqs, kv = int(busy["num_requests"].iloc[0]), float(busy["kv_tokens"].median())
    prof = load_profile(profile_dir)
    sizes = list(prof.captured_sizes)
    cols = {}
    for name, ell, positions in (("plain", 0, 0), (f"fixed γ={GAMMA}", GAMMA, GAMMA)):
        cost = StepCost.for_step(prof, requests=reqs, kv_tokens=kv, positions=positions)
        price = cost.price(np.full(reqs, ell, dtype=np.int64))
        terms = dense_step_terms(opts, reqs * (1 + ell), sizes)
        tokens = terms.pop("padded tokens")
        rest = price.dense_s * 1e3 - sum(terms.values())
        # the table holds every captured size exactly and interpolates between its rows past them
        assert abs(rest) < (0.02 * price.dense_s * 1e3 if tokens > sizes[-1] else 1e-6), (name, rest)
        cols[name] = {**terms, "drafter": price.draft_s * 1e3, "table interpolation": rest,
                      "KV read": price.kv_s * 1e3, "MLA FLOPs past read": price.attention_s * 1e3,
                      "engine loop": price.overhead_s * 1e3, "step": price.total_s * 1e3, "tokens": tokens}
    out = pd.DataFrame(cols).loc[[*CHARGED, "step", "tokens"]]
    out["delta"] = out.iloc[:, 1] - out.iloc[:, 0]
    out.attrs.update(requests=reqs, kv=kv)
    return out


for label, table in tables.items():
    tput = table.pivot(index="workload.concurrency", columns="policy", values="tput_per_gpu")
    at = collapse[label]
    load = int(tput.index[tput.index >= at][0]) if at is not None else int(tput.index[-1])
    d = decompose(label, load)
    acc = table[(table["policy"] == FIXED) & (table["workload.concurrency"] == load)]["mean_acceptance_length"].iloc[0]
    print(f"{label} at {load:,} users ({d.attrs['requests']:,} running, {d.attrs['kv'] / d.attrs['requests']:,.0f} "
          f"KV tokens per request): ms per step")
    print(d[(d.abs() > 0.005).any(axis=1)].to_string(float_format=lambda v: f"{v:,.2f}"))
    step = d.loc["step"]
    growth = d["delta"].loc[CHARGED]
    print(f"  fixed γ={GAMMA} emits {acc:.2f} tokens per request-step for x{step.iloc[1] / step.iloc[0]:.2f} "
          f"plain's step time: predicted x{acc * step.iloc[0] / step.iloc[1]:.2f} plain's throughput; "
          f"of the {d.loc['step', 'delta']:,.1f} ms it adds, "
          + ", ".join(f"{k} {v:+,.1f} ms" for k, v in growth.sort_values(key=abs, ascending=False).items()
                      if abs(v) >= 0.005 * d.loc['step', 'delta']))
