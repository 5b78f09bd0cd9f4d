# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # What moved the default sweep when steps were priced as an engine pays for them?
#
# Three cost models on the default scenario (H100 Qwen3-8B analytic profile, synthetic DSpark
# traces, closed loop): **new** (every term: dense, per-request KV, drafters by kind and
# positions, so MTP-1 pays its one-layer module for one position), **KV only** (the same, but
# MTP-1 pays the full DSpark-5 block, as before), and **capture 2048** (new, CUDA graphs
# captured up to 2,048 tokens). The figures before the change come from the old code
# (commit f6b9c42) and are recorded in docs/fidelity.md; this script remakes the rest. The
# full grid (users 1…256, 60 s) is what docs/fidelity.md reports; tests run it small.

# %%
from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import pandas as pd
import yaml

from sparksim.config import REPO_ROOT
from sparksim.studies.frontier import speedup_at_matched_throughput
from sparksim.hardware import GPUS
from sparksim.cost.models import load_model_spec
from sparksim.cost.profile import ProfileWarning, write_profile
from sparksim.cost.cuda_graphs import default_capture_sizes
from sparksim.cost.roofline import analytic_profile
from sparksim.studies.sweep import grid, parse_vary, run_sweep

warnings.simplefilter("ignore", ProfileWarning)
users = os.environ.get("SPARKSIM_ANALYSIS_USERS", "1,2,4,8,16,32,64,128,256")
DURATION = float(os.environ.get("SPARKSIM_ANALYSIS_DURATION", "60"))
H100 = REPO_ROOT / "profiles" / "h100-qwen3-8b-analytic"
MTP1 = "static:gamma=1,drafter=mtp-1"


def full_block_profile(out: Path) -> Path:
    """The H100 profile whose only drafter table is DSpark-5's full block (the old drafting rule)."""
    out.mkdir()
    for name in ("verify.csv", "attention.csv"):
        shutil.copy(H100 / name, out / name)
    card = yaml.safe_load((H100 / "card.yaml").read_text())
    table = pd.read_csv(H100 / "draft-dspark-5.csv")
    table[table["positions"] == 7][["requests", "draft_ms"]].to_csv(out / "draft.csv", index=False)
    info = card.pop("drafters")["dspark-5"]
    card.pop("default_drafter")
    card["drafter"] = {**{k: v for k, v in info.items() if k != "file"}, "name": "dspark-5-full-block"}
    (out / "card.yaml").write_text(yaml.safe_dump(card, sort_keys=False))
    return out


def capture_2048_profile(out: Path) -> Path:
    verify, extra, card = analytic_profile(GPUS["h100"], load_model_spec("qwen3-8b"),
                                           capture_sizes=default_capture_sizes(2048))
    return write_profile(out, verify, card, extra=extra)


tmp = Path(tempfile.mkdtemp())
models = {
    "new": (str(H100), MTP1),
    "KV only": (str(full_block_profile(tmp / "full-block")), "static:gamma=1"),
    "capture 2048": (str(capture_2048_profile(tmp / "cap2048")), MTP1),
}
tables = {}
for label, (profile, mtp1) in models.items():
    points = grid(parse_vary([f"workload.concurrency={users}"]), ["static:gamma=0", mtp1, "two-step"])
    tables[label] = (run_sweep(None, [f"profile={profile}", f"run.duration_s={DURATION}"], points,
                               workers=1), mtp1)
shutil.rmtree(tmp)

# %% [markdown]
# Two-step's tok/s/user over MTP-1 at matched throughput, and output throughput against
# plain decoding at the highest load:

# %%
top = max(int(u) for u in users.split(","))
for label, (table, mtp1) in tables.items():
    sp = speedup_at_matched_throughput(table, "two-step", mtp1)
    span = (f"x{sp['speedup'].min():.2f}-{sp['speedup'].max():.2f} ({len(sp)} points)" if len(sp) > 1
            else f"x{sp['speedup'].iloc[0]:.2f} (one matched point)" if len(sp)
            else "no matched throughput")
    at = table[table["workload.concurrency"] == top].set_index("policy")["output_throughput"]
    print(f"{label:>12}: two-step vs MTP-1 {span}; at {top} users, vs plain decoding: "
          f"MTP-1 {at[mtp1] / at['static:gamma=0']:.2f}, two-step {at['two-step'] / at['static:gamma=0']:.2f}")

# %% [markdown]
# Two-step's verification budget per request (1 + mean ℓ) against load:

# %%
budget = pd.DataFrame({label: t[t["policy"] == "two-step"].set_index("workload.concurrency")[
    "verify_budget_per_request"] for label, (t, _) in tables.items()})
print(budget.to_string(float_format=lambda v: f"{v:.2f}"))
