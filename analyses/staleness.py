# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # How much does the two-step policy lose to staleness?
#
# The production rule sizes the verification budget K from survivals `delay` steps old
# (DSpark §5.2 uses 2, vLLM 1), which is what makes it lossless under zero-overhead
# scheduling. `delay = 0` is argmax on fresh survivals (not lossless: the bias lab shows
# why). Greedy (Algorithm 1) is lossless with fresh survivals but stops at the first
# non-improvement, which a jagged CUDA-graph staircase can trip. One closed-loop load,
# analytic H100 profile, synthetic DSpark traces.

# %%
from __future__ import annotations

import os

import pandas as pd

from sparksim.sim.runner import load_scenario, simulate

users = int(os.environ.get("SPARKSIM_ANALYSIS_CONCURRENCY", "64"))
DURATION = float(os.environ.get("SPARKSIM_ANALYSIS_DURATION", "20"))
runs = [("static", ["policy.gamma=1", "policy.drafter=mtp-1"]), ("greedy", []), ("argmax", [])]
runs += [("two-step", [f"policy.delay={d}"]) for d in (0, 1, 2, 4)]
rows = []
for name, sets in runs:
    sc, base = load_scenario(None, [*sets, f"workload.concurrency={users}", f"run.duration_s={DURATION}"], name)
    s = simulate(sc, base).summary
    rows.append({"policy": s["policy_label"], "tput_per_gpu": s["tput_per_gpu"],
                 "interactivity": s["interactivity"], "accept_len": s["mean_acceptance_length"],
                 "budget": s["verify_budget_per_request"]})
table = pd.DataFrame(rows)
print(table.to_string(index=False, float_format=lambda v: f"{v:,.2f}"))

# %% [markdown]
# Reading it: compare `two-step(delay=2)` with `argmax` (the same search on fresh
# survivals, the ceiling staleness can cost) and with `greedy`.
