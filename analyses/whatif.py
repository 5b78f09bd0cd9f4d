# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # What if: my model, my GPUs, my traffic — which verification policy, and what does it buy?
#
# One scenario file in (`SPARKSIM_WHATIF_SCENARIO`, default
# `docs/scenarios/whatif-example.yaml`: Qwen3-30B-A3B on one H100, chat/code/math traffic;
# its comments say what to change), one table and one figure out. Five policies: plain
# decoding (`static`, γ = 0), MTP-1 (`static`, γ = 1, paying the profile's `mtp-1` drafter
# when it has one), static γ = 3 (verifying 3 of the default drafter's block, which it drafts whole), DSpark's
# greedy (Algorithm 1) and the production two-step. We sweep closed-loop users for the
# Pareto frontier and the verification budget, compare tok/s per user at matched throughput
# per GPU, search each policy's capacity (Poisson requests/s) under latency SLOs, and end
# with a recommendation computed from those runs.
#
# Environment: `SPARKSIM_ANALYSIS_USERS` (default 1,4,16,64,128,256), `SPARKSIM_ANALYSIS_DURATION`
# (simulated seconds, at least 60; default: the scenario's `run.duration_s`), `SPARKSIM_ANALYSIS_SEEDS`
# (capacity seeds, default 3), `SPARKSIM_WHATIF_SLOS` (default `p90_ttft_ms=2000,p90_tpot_ms=50`),
# `SPARKSIM_ANALYSIS_OUT` (the figure, and the finished runs so a rerun resumes).

# %%
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from sparksim.studies.capacity import ABOVE, BELOW, find_capacity, parse_slos
from sparksim.config import REPO_ROOT
from sparksim.sim.engine import kv_capacity_tokens
from sparksim.studies.frontier import overloaded, pareto_frontier, speedup_at_matched_throughput
from sparksim.sim.metrics import UNFINISHED_SHARE
from sparksim.sim.runner import load_inputs, load_scenario
from sparksim.studies.sweep import grid, parse_vary, run_sweep
from sparksim.studies.sweep_store import PointStore

SCENARIO = Path(os.environ.get("SPARKSIM_WHATIF_SCENARIO", REPO_ROOT / "docs" / "scenarios" / "whatif-example.yaml"))
OUT = Path(os.environ.get("SPARKSIM_ANALYSIS_OUT", "results/analyses"))
users = os.environ.get("SPARKSIM_ANALYSIS_USERS", "1,4,16,64,128,256")
SEEDS = int(os.environ.get("SPARKSIM_ANALYSIS_SEEDS", "3"))
# The default SLOs are assumptions for a chat service, to be replaced by your own: p90 TTFT
# ≤ 2 s (the order of MLPerf Inference's Llama-2-70B server TTFT bound, as recalled, not
# checked here) and p90 TPOT ≤ 50 ms, 20 tok/s per user, faster than anyone reads a stream.
# Tighten TPOT (e.g. 20 ms) for an agent that consumes tokens as fast as they come.
SLOS = parse_slos(os.environ.get("SPARKSIM_WHATIF_SLOS", "p90_ttft_ms=2000,p90_tpot_ms=50").split(","))
# A shorter run leaves over 5 % of its steady window unfinished at the horizon whenever answers
# run to a couple of thousand tokens, and every point, closed loop or Poisson, then reads as
# a growing queue; so a requested horizon (the test's 8 s) is raised to this.
MIN_DURATION_S = 60.0
DURATION = os.environ.get("SPARKSIM_ANALYSIS_DURATION")
base_sets = [f"run.duration_s={max(float(DURATION), MIN_DURATION_S):g}"] if DURATION else []

scenario, scenario_dir = load_scenario(SCENARIO, base_sets)
profile = load_inputs(scenario, scenario_dir)[0]
PLAIN = "static:gamma=0"
MTP1 = "static:gamma=1,drafter=mtp-1" if "mtp-1" in profile.drafters else "static:gamma=1"
# one name per policy in every table and in the figure's legend
POLICIES = {PLAIN: "plain", MTP1: "MTP-1", "static:gamma=3": "static γ=3", "greedy": "greedy",
            "two-step": "two-step"}
shown = SCENARIO.resolve().relative_to(REPO_ROOT) if SCENARIO.resolve().is_relative_to(REPO_ROOT) else SCENARIO
kv = kv_capacity_tokens(scenario, profile)
print(f"scenario {shown}: profile {scenario.profile}, traces {scenario.traces}, "
      f"{scenario.cluster.replicas} replica(s) x {scenario.cluster.gpus_per_replica} GPU, "
      f"KV capacity {'unlimited' if kv is None else f'{kv:,} tokens'} per replica, "
      f"{scenario.run.duration_s:g} s per run")
print("policies: " + "; ".join(f"{name} = {spec}" for spec, name in POLICIES.items()))

# %% [markdown]
# ## The sweep: throughput per GPU against tok/s per user, per policy and load
#
# Each point is one closed-loop run at the scenario's seed, so every policy serves the same
# users and requests. A point marked `*` was still queueing at the horizon (over 5 % of its
# steady-window requests unfinished): its latencies are optimistic, and the matched-throughput
# comparisons below leave it out, as the figure does.

# %%
points = grid(parse_vary([f"workload.concurrency={users}"]), list(POLICIES))
table = run_sweep(str(SCENARIO), base_sets, points, store=PointStore(OUT / "whatif" / "sweep-points"))
table["name"] = table["policy"].map(POLICIES)
hot = overloaded(table)
view = table.assign(users=table["workload.concurrency"].astype(str) + np.where(hot, "*", ""))
cols = {"name": "policy", "users": "users", "tput_per_gpu": "tok/s/GPU", "interactivity": "tok/s/user",
        "mean_ttft_ms": "mean TTFT ms", "p99_tpot_ms": "p99 TPOT ms", "mean_acceptance_length": "accepted/step",
        "verify_budget_per_request": "budget"}
print(view[list(cols)].rename(columns=cols).to_string(index=False, float_format=lambda v: f"{v:,.1f}"))
if hot.any():
    print(f"* still queueing at the horizon (over {UNFINISHED_SHARE:.0%} of the steady window's requests "
          "unfinished): latencies optimistic, left out of the comparisons below")

# %% [markdown]
# The verification budget (tokens verified per request per step, bonus included: 1 + mean ℓ)
# against load; static policies are flat by construction, the adaptive ones shrink it where
# a verified token stops paying for itself.

# %%
budget = table.pivot(index="name", columns="workload.concurrency", values="verify_budget_per_request")
budget = budget.loc[list(POLICIES.values())].rename_axis(index="budget", columns="users")
print(budget.to_string(float_format=lambda v: f"{v:.2f}"))

# %% [markdown]
# ## What speculation buys: tok/s per user at matched throughput per GPU
#
# Each policy's frontier against plain decoding's and MTP-1's, interpolated at the
# baseline's own throughputs inside the range both reach (`speedup_at_matched_throughput`).

# %%
kept = table[~hot]


def speedup_words(policy: str, baseline: str, runs: pd.DataFrame | None = None) -> str:
    """Describe `policy`'s tok/s/user over `baseline`'s at matched throughput in `runs` (default:
    the sweep's points not queueing) in a few words."""
    sp = speedup_at_matched_throughput(kept if runs is None else runs, policy, baseline)
    if len(sp) == 0:
        return "no throughput both reach"
    if len(sp) == 1:
        return f"x{sp['speedup'].iloc[0]:.2f} at {sp['tput_per_gpu'].iloc[0]:,.0f} tok/s/GPU (one level)"
    return (f"x{sp['speedup'].min():.2f}-{sp['speedup'].max():.2f} at {sp['tput_per_gpu'].min():,.0f}-"
            f"{sp['tput_per_gpu'].max():,.0f} tok/s/GPU ({len(sp)} levels)")


rows = [{"policy": name, "vs plain": speedup_words(spec, PLAIN) if spec != PLAIN else "-",
         "vs MTP-1": speedup_words(spec, MTP1) if spec != MTP1 else "-"} for spec, name in POLICIES.items()]
print(pd.DataFrame(rows).to_string(index=False))

# %% [markdown]
# The figure (`whatif-pareto.png` in `SPARKSIM_ANALYSIS_OUT`; the script says where on stderr):
# the frontiers left, the budget against load right, each policy under the name the tables
# use. Its frontier panel is drawn on log axes, because from one user to saturation the
# throughput spans more than a decade and the low-load points would otherwise sit on top of
# each other along the bottom; past saturation a policy's points coincide, so their user
# counts are written once ("128, 256") instead of over each other.

# %%
import sys

try:
    from sparksim.plotting.pareto import pareto_figure
except ImportError:
    pass
else:
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        print("no figure: matplotlib is not installed (pip install -e \".[plot]\")", file=sys.stderr)
    else:
        OUT.mkdir(parents=True, exist_ok=True)
        meta = {"profile": scenario.profile, "traces": scenario.traces,
                "workload": scenario.workload.model_dump(mode="json")}
        fig = pareto_figure(table.assign(label=table["name"]), meta=meta, baseline=PLAIN, log=True,
                            title=f"What if: {scenario.name}, five verification policies")
        figure_path = OUT / "whatif-pareto.png"
        fig.savefig(figure_path, dpi=130)
        plt.close(fig)
        # stderr: the path differs from machine to machine, and stdout is this script's golden output
        print(f"figure: {figure_path}", file=sys.stderr)

# %% [markdown]
# ## Capacity under SLOs: the highest Poisson rate each policy carries
#
# A run meets the SLOs when every bound holds and its queue is not growing. The search range
# comes from the sweep: up to 1.5× the highest request rate any policy completed in a closed
# loop (a Poisson stream faster than a saturated closed loop's throughput cannot be carried),
# bisected to 1/64 of that. Each seed is searched on its own; the capacity is their mean.

# %%
hi = float(np.ceil(1.5 * table["request_throughput"].max()))
lo = tol = hi / 64
results = find_capacity(str(SCENARIO), base_sets, list(POLICIES), SLOS, lo=lo, hi=hi, tol=tol, seeds=SEEDS,
                        store=PointStore(OUT / "whatif" / "capacity-points"))
caps = {res.policy: res for res in results}
slo_text = ", ".join(f"{k} <= {v:g}" for k, v in SLOS.items())
print(f"capacity (req/s for {scenario.cluster.replicas} replica(s); mean ± s.e. over seeds) under {slo_text}; "
      f"searched {lo:.3g}-{hi:g} req/s to {tol:.3g}, seeds {results[0].seeds}")


def capacity_words(spec: str) -> str:
    """Return a policy's capacity as a reader should take it: a value, a lower bound, or below the range."""
    if caps[spec].status == BELOW:
        return f"< {lo:.3g}"
    mean, se = caps[spec].mean_se()
    value = f"{mean:.2f}" + ("" if math.isnan(se) else f" ± {se:.2f}")
    return (">= " if caps[spec].status == ABOVE else "") + value


for res in results:
    # what the lowest load that missed broke first: the bound that limits this policy
    missed = min((p for p in res.probes if not p.meets), key=lambda p: (p.load, p.seed), default=None)
    print(f"  {POLICIES[res.policy]:>10}: {capacity_words(res.policy)} req/s"
          + (f"  (limited by {missed.why_not.split(' ')[0]})" if missed else ""))

# %% [markdown]
# ## Recommendation
#
# Per policy: lossless or not (as the runs report it), capacity under the SLOs, and tok/s
# per user at one matched throughput: the highest throughput per GPU that every policy's
# frontier reaches. The recommended policy is the lossless one with the highest capacity;
# policies within one search step (`tol`) of it count as tied, and the tie goes to the
# higher tok/s per user.

# %%
reach = {spec: pareto_frontier(kept[kept["policy"] == spec]) for spec in POLICIES}
level = min((f["tput_per_gpu"].max() for f in reach.values() if len(f)), default=math.nan)


def at_level(spec: str) -> float:
    """Return `spec`'s tok/s/user on its frontier at throughput `level` (NaN outside its range)."""
    f = reach[spec].sort_values("tput_per_gpu")
    if len(f) == 0 or not f["tput_per_gpu"].min() <= level <= f["tput_per_gpu"].max():
        return math.nan
    return float(np.interp(np.log(level), np.log(f["tput_per_gpu"]), f["interactivity"]))


lossless = table.groupby("policy")["lossless"].first().astype(bool)
# capacity for ranking: a lower bound (above the range) counts as its value, below the range as none
rank = {spec: -math.inf if res.status == BELOW else res.mean_se()[0] for spec, res in caps.items()}
user_rate = {spec: at_level(spec) for spec in POLICIES}
rec = pd.DataFrame({
    "policy": list(POLICIES.values()),
    "lossless": ["yes" if lossless[s] else "NO" for s in POLICIES],
    "capacity req/s": [capacity_words(s) for s in POLICIES],
    "capacity x plain": [rank[s] / rank[PLAIN] for s in POLICIES],
    f"tok/s/user @ {level:,.0f} tok/s/GPU": list(user_rate.values()),
    "tok/s/user x plain": [user_rate[s] / user_rate[PLAIN] for s in POLICIES],
    "x MTP-1": [user_rate[s] / user_rate[MTP1] for s in POLICIES],
})
# a ratio to a capacity below the range (or of one) is not a number a reader can use
rec = rec.replace([np.inf, -np.inf], np.nan)
print(rec.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:,.2f}"))

candidates = [s for s in POLICIES if lossless[s]]
if candidates:
    top = max(rank[s] for s in candidates)
    tied = [s for s in candidates if rank[s] >= top - tol]
    best = max(tied, key=lambda s: (np.nan_to_num(user_rate[s], nan=-1.0), rank[s]))
    gain = rank[best] / rank[PLAIN] if 0 < rank[PLAIN] < math.inf else math.nan
    speed = user_rate[best] / user_rate[PLAIN]
    print(f"best lossless policy: {POLICIES[best]} ({best}): capacity {capacity_words(best)} req/s"
          + (f" (x{gain:.2f} plain decoding's)" if math.isfinite(gain) else "")
          + (f", x{speed:.2f} plain decoding's tok/s/user at {level:,.0f} tok/s/GPU" if math.isfinite(speed) else "")
          + (f"; tied on capacity with {', '.join(POLICIES[s] for s in tied if s != best)}" if len(tied) > 1 else ""))
else:
    print("no lossless policy among those run")

# %% [markdown]
# ## A multi-node example: DeepSeek-V3 on 32 and 144 GPUs
#
# The same question for a production deployment, the policies above on DeepSeek-V3 in FP8
# over H800 nodes with expert parallelism across them, dual-batch overlap and EPLB (256 + 32
# expert slots, imbalance 1.115): the shipped `profiles/h800x32-deepseek-v3-analytic` (4 nodes,
# DeepSeek's EP32 layout) and the same card's command at `--gpus 144 --nodes 18` (DeepSeek's
# EP144 decode units, 2 slots per GPU: its inference-system overview). Each is remade with
# tables reaching the highest load (the shipped rows checked unchanged). Chat-heavy traffic,
# DSpark-5 drafting its block of 5, and 8,192 tokens a step per data-parallel rank (vLLM's
# online default, an assumption). Loads per GPU: `SPARKSIM_WHATIF_USERS_PER_GPU` (default
# 4,16,32,64; one load, 8, in a shortened run, where `SPARKSIM_ANALYSIS_USERS` is set).
# DeepSeek's published decode runs ~20 tok/s per user at ~88 users per H800.

# %%
import shutil  # noqa: E402
import tempfile  # noqa: E402

import yaml  # noqa: E402

from sparksim.cost.analytic import build_analytic, options_from_command  # noqa: E402
from sparksim.cost.profile import write_profile  # noqa: E402

PER_GPU = [int(u) for u in os.environ.get(
    "SPARKSIM_WHATIF_USERS_PER_GPU", "8" if "SPARKSIM_ANALYSIS_USERS" in os.environ else "4,16,32,64").split(",")]
LAYOUTS = {32: 4, 144: 18}  # GPUs per replica: nodes of 8 H800s
shipped = REPO_ROOT / "profiles" / "h800x32-deepseek-v3-analytic"
shipped_card = yaml.safe_load((shipped / "card.yaml").read_text())
scratch = Path(tempfile.mkdtemp())
multi_rows = []
for gpus, nodes in LAYOUTS.items():
    loads = [u * gpus for u in PER_GPU]
    opts = {**options_from_command(shipped_card["command"]), "out": scratch / f"h800x{gpus}", "gpus": gpus,
            "nodes": nodes, "max_tokens": max(8192, 6 * max(loads)), "max_requests": max(1024, max(loads))}
    verify, extra, card, target = build_analytic(opts)
    write_profile(target, verify, card, extra=extra)
    if gpus == 32:  # the shipped profile, its tables only extended
        old = pd.read_csv(shipped / "verify.csv").merge(pd.read_csv(target / "verify.csv"), on="tokens",
                                                        suffixes=("", "_new"))
        assert len(old) == len(pd.read_csv(shipped / "verify.csv")) and np.allclose(old["step_ms"], old["step_ms_new"], rtol=1e-12)
    sets = [f"profile={target}", f"run.duration_s={scenario.run.duration_s:g}",
            "workload.mix={chat: 0.6, code: 0.2, math: 0.2}", f"cluster.max_concurrency={max(loads)}",
            f"cluster.max_batch_tokens={gpus * 8192}", "cluster.replicas=1", f"cluster.gpus_per_replica={gpus}"]
    runs = run_sweep(None, sets, grid(parse_vary([f"workload.concurrency={','.join(map(str, loads))}"]),
                                      list(POLICIES)))
    runs = runs.assign(gpus=gpus, name=runs["policy"].map(POLICIES))
    multi_rows.append(runs)
shutil.rmtree(scratch)
multi = pd.concat(multi_rows, ignore_index=True)
multi_view = multi.assign(users=multi["workload.concurrency"]).pivot(
    index=["gpus", "users"], columns="name", values="tput_per_gpu")[list(POLICIES.values())]
print("DeepSeek-V3 on H800 nodes, tok/s/GPU by GPUs per replica and users per replica:")
print(multi_view.to_string(float_format=lambda v: f"{v:,.0f}"))

# %%
best_rows = []
for (gpus, load), group in multi.groupby(["gpus", "workload.concurrency"]):
    assert len(group) == len(POLICIES), group[["gpus", "workload.concurrency", "policy"]].to_string()
    runs = group.set_index("policy")
    usable = group[group["lossless"].astype(bool).to_numpy() & ~overloaded(group).to_numpy()]
    pick = (usable if len(usable) else group).set_index("policy")["tput_per_gpu"].idxmax()
    best_rows.append({
        "GPUs": gpus, "users": load, "best policy": POLICIES[pick],
        "tok/s/GPU": runs.loc[pick, "tput_per_gpu"], "x MTP-1": runs.loc[pick, "tput_per_gpu"] / runs.loc[MTP1, "tput_per_gpu"],
        "tok/s/user": runs.loc[pick, "interactivity"],
        "x MTP-1 per user": runs.loc[pick, "interactivity"] / runs.loc[MTP1, "interactivity"],
        "budget": runs.loc[pick, "verify_budget_per_request"],
    })
print("the policy with the highest tok/s/GPU at each load (the same users for every policy), against MTP-1:")
print(pd.DataFrame(best_rows).to_string(index=False, float_format=lambda v: f"{v:,.2f}" if v < 100 else f"{v:,.0f}"))
for gpus in LAYOUTS:
    layout = multi[multi["gpus"] == gpus]
    one = layout[~overloaded(layout)]
    print(f"{gpus} GPUs, two-step vs MTP-1 at matched tok/s/GPU: {speedup_words('two-step', MTP1, one)}")
