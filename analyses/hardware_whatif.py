# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # What if we served on H200 instead of H100?
#
# Same model (Qwen3-8B), same synthetic DSpark traces, same closed-loop traffic; only the
# SPS(B) profile changes. Both profiles are **analytic** (roofline from datasheet figures,
# see their cards), so this is a what-if on the model, not a measurement. We sweep the
# number of users for MTP-1 (`static`, γ = 1, paying the 1-layer `mtp-1` drafter table) and
# the production `two-step` policy (paying the DSpark-5 block drafter) and
# compare their Pareto frontiers.

# %%
from __future__ import annotations

import os
from pathlib import Path

from sparksim.studies.frontier import speedup_at_matched_throughput
from sparksim.studies.sweep import grid, parse_vary, run_sweep

OUT = Path(os.environ.get("SPARKSIM_ANALYSIS_OUT", "results/analyses"))
users = os.environ.get("SPARKSIM_ANALYSIS_USERS", "4,16,64,128")
DURATION = float(os.environ.get("SPARKSIM_ANALYSIS_DURATION", "20"))
points = grid(parse_vary([f"workload.concurrency={users}"]), ["static:gamma=1,drafter=mtp-1", "two-step"])

tables = {}
for gpu in ("h100", "h200"):
    base = [f"profile=profiles/{gpu}-qwen3-8b-analytic", f"run.duration_s={DURATION}", "seed=0"]
    tables[gpu] = run_sweep(None, base, points, workers=1)

# %% [markdown]
# Throughput per GPU and tokens/s per user, per GPU, policy and load:

# %%
for gpu, table in tables.items():
    print(f"== {gpu}")
    cols = ["policy", "workload.concurrency", "tput_per_gpu", "interactivity", "verify_budget_per_request"]
    print(table[cols].to_string(index=False, float_format=lambda v: f"{v:,.1f}"))

# %% [markdown]
# Matched-throughput speedup of two-step over MTP-1 (tok/s/user at equal throughput per GPU):

# %%
for gpu, table in tables.items():
    sp = speedup_at_matched_throughput(table, "two-step", "static:gamma=1,drafter=mtp-1")
    if len(sp):
        print(f"{gpu}: x{sp['speedup'].min():.2f} to x{sp['speedup'].max():.2f} over "
              f"{sp['tput_per_gpu'].min():,.0f}-{sp['tput_per_gpu'].max():,.0f} tok/s/GPU")
    else:
        print(f"{gpu}: frontiers do not overlap in throughput")

# %%
try:
    from sparksim.plotting.pareto import plot_pareto
except ImportError:
    pass
else:
    OUT.mkdir(parents=True, exist_ok=True)
    for gpu, table in tables.items():
        plot_pareto(table, OUT / f"pareto-{gpu}.png", title=f"{gpu.upper()} Qwen3-8B (analytic profile)")
