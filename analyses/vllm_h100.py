# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation: {extension: .py, format_name: percent}
# ---

# %% [markdown]
# # Does sparksim predict real vLLM runs on H100s, and does calibrating to a user's runs help?
#
# Six real vLLM v0.15.1 runs from inference-sim/training (`analyses/data/inference-sim-vllm/SOURCE.md`):
# Llama-2-7B on one H100 and Mixtral-8x7B on two (TP 2), each serving the general, codegen and
# roleplay workloads in load stages of 5-20 req/s. Each run is replayed request by request (its
# recorded arrivals, prompt and output lengths) with its engine's settings (`engines.yaml`: 128
# running requests, a 2,048-token step budget with chunked prefill, the KV blocks vLLM reported),
# plain decoding, on
#
# - (a) **analytic defaults**: `profiles/h100-llama-2-7b-analytic`, `profiles/h100x2-mixtral-8x7b-analytic`,
#   datasheet peaks and published kernel efficiencies (`sparksim/hardware.py`), nothing fitted to any run;
# - (b) **calibrated, held out**: for each run, the same base profile calibrated
#   (`sparksim.studies.calibration`, what `sparksim profile calibrate` runs) on the *other two* runs of
#   the same model, then used to predict this one. The fitted parameters: large-GEMM and
#   weight-streaming efficiencies and a per-request latency outside the engine (the
#   measurements are client-side).
#
# Both replay vLLM's automatic prefix caching (on in these runs) over the prompts' sharing as
# inferred from the data (`run_of` says how); `e2e_nocache` is (a) without it, to show what
# caching is worth. Beside them, the published errors of peer simulators on the same stages
# (`analyses/data/peer-errors/SOURCE.md`; signed mean-percentage errors; BLIS's evolved and
# trained models were fitted on these runs, so theirs are in-sample), and each stage's
# **stability margin**: how many times its load the prediction says the deployment carries
# before the queue grows (bisection on the stage replayed alone, arrivals compressed).
# Error = predicted / measured − 1 of the stage's mean E2E and TTFT.

# %%
from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings
from pathlib import Path

import pandas as pd
import yaml

from sparksim.studies.calibration import Calibrator
from sparksim.studies.measured_runs import MeasuredRun, engine_settings, load_run
from sparksim.studies.run_replay import predict, stability_margin, stage_table
from sparksim.config import REPO_ROOT
from sparksim.cost.profile import ProfileWarning

warnings.simplefilter("ignore", ProfileWarning)
DATA = REPO_ROOT / "analyses" / "data" / "inference-sim-vllm"
PEERS = REPO_ROOT / "analyses" / "data" / "peer-errors" / "peer_errors.csv"
MODELS = {
    "llama-2-7b": (REPO_ROOT / "profiles" / "h100-llama-2-7b-analytic",
                   ("20260217-231439-llama-2-7b-tp1-general", "20260217-155451-llama-2-7b-tp1-codegen",
                    "20260217-162547-llama-2-7b-tp1-roleplay")),
    "mixtral-8x7b": (REPO_ROOT / "profiles" / "h100x2-mixtral-8x7b-analytic",
                     ("20260218-130541-mixtral-8x7b-v0-1-tp2-general",
                      "20260218-120914-mixtral-8x7b-v0-1-tp2-codegen",
                      "20260218-141024-mixtral-8x7b-v0-1-tp2-roleplay")),
}
LIMIT = int(os.environ.get("SPARKSIM_ANALYSIS_REPLAY_REQUESTS", "0"))  # 0: every request (tests use fewer)
STEPS = int(os.environ.get("SPARKSIM_ANALYSIS_REPLAY_STEPS", "24"))  # optimiser steps per fit
FIT = ("compute_eff", "mem_eff", "request_overhead_ms")
ENGINES = yaml.safe_load((DATA / "engines.yaml").read_text())
work = Path(tempfile.mkdtemp())


def run_of(name: str) -> MeasuredRun:
    """A shipped run with its engine's settings and its prompts' sharing (inferred, see below)."""
    eng = ENGINES[name]
    settings, _ = engine_settings({k: eng[k] for k in (
        "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size", "block_size",
        "num_gpu_blocks", "max_model_len", "enable_prefix_caching")}, f"engines.yaml [{name}]")
    run = load_run(DATA / f"{name}.csv.gz", settings)
    if LIMIT:
        run.requests = run.requests.iloc[:LIMIT].copy()
    # The prompts repeat: inference-perf's shared_prefix data of num_groups x num_prompts_per_group
    # distinct prompts, cycled (SOURCE.md: a prompt's length equals the one 100 requests later in
    # 98-99 % of rows). Inferred, not recorded: request i's whole prompt is shared with every
    # request i + k·period, and vLLM's prefix cache serves it once cached.
    period = eng["shared_prefix_resolved"]["num_groups"] * eng["shared_prefix_resolved"]["num_prompts_per_group"]
    req = run.requests
    group = req["request_id"].to_numpy() % period
    req["prefix_group"] = group
    req["prefix_tokens"] = req.groupby(group)["prompt_tokens"].transform("min").to_numpy()
    return run


rows, fitted = [], []
for model, (base, names) in MODELS.items():
    runs = [run_of(n) for n in names]
    for i, held in enumerate(runs):
        analytic = stage_table(held, predict(held, base, work / "analytic"))
        uncached = MeasuredRun(held.name + "-uncached", held.path, held.requests,
                               dataclasses.replace(held.settings, prefix_caching=False))
        no_cache = stage_table(uncached, predict(uncached, base, work / "analytic"))
        cal = Calibrator(base, [r for j, r in enumerate(runs) if j != i], FIT, work=work / f"fit-{held.name}")
        result = cal.fit(STEPS)
        label = held.name.rsplit("-", 1)[1]
        fitted.append({"held out": label, "model": model,
                       **{k: f"{v:.3g}" for k, v in result.values.items()},
                       "at bound": ",".join(sorted(result.at_bound)) or "-"})
        profile = cal.profile_with(result.values, work / f"calibrated-{held.name}")
        held_table = stage_table(held, predict(held, profile, work / "held"),
                                 result.values["request_overhead_ms"])
        for a, n, h in zip(analytic.itertuples(), no_cache.itertuples(), held_table.itertuples(), strict=True):
            rows.append({
                "model": model, "run": label, "stage": a.stage,
                "rate": round(a.rate), "e2e_real": a.e2e_real, "ttft_real": a.ttft_real,
                "e2e_nocache": n.e2e_err, "e2e_analytic": a.e2e_err, "ttft_analytic": a.ttft_err,
                "e2e_heldout": h.e2e_err, "ttft_heldout": h.ttft_err,
                "margin_analytic": stability_margin(held, a.stage, base, work / "margin"),
                "margin_heldout": stability_margin(held, a.stage, profile, work / "margin"),
            })
table = pd.DataFrame(rows)
pct = "{:+.1%}".format
print(table.to_string(index=False, formatters={
    "e2e_real": "{:,.0f}".format, "ttft_real": "{:,.1f}".format,
    **{c: pct for c in ("e2e_nocache", "e2e_analytic", "ttft_analytic", "e2e_heldout", "ttft_heldout")},
    "margin_analytic": "x{:.2f}".format, "margin_heldout": "x{:.2f}".format}))
print()
print("fitted on the other two runs of the model:")
print(pd.DataFrame(fitted).to_string(index=False))

# %% [markdown]
# Summary: median |error| over the stages, and the peers' published errors on the same stages.

# %%
summary = pd.DataFrame({
    "sparksim analytic defaults": [table["e2e_analytic"].abs().median(), table["ttft_analytic"].abs().median()],
    "sparksim calibrated, held out": [table["e2e_heldout"].abs().median(), table["ttft_heldout"].abs().median()],
}, index=["median |E2E err|", "median |TTFT err|"])
print(summary.map("{:.1%}".format).to_string())
print(f"stages the measured engine served that the analytic defaults call overloaded (margin < 1): "
      f"{int((table['margin_analytic'] < 1).sum())} of {len(table)}; held out: "
      f"{int((table['margin_heldout'] < 1).sum())}")
print()
peers = pd.read_csv(PEERS)
ours = {f"{m}/{r}/{s}" for m, r, s in zip(table["model"], table["run"], table["stage"], strict=True)}
peers = peers[peers["metric"].isin(["e2e_mean", "ttft_mean"]) & (peers["stage"] >= 0)]
peers = peers.assign(key=peers["experiment"].str.extract(r"(llama-2-7b|mixtral-8x7b)", expand=False) + "/"
                     + peers["experiment"].str.extract(r"(general|codegen|roleplay)$", expand=False) + "/"
                     + peers["stage"].astype(str))
peers = peers[peers["key"].isin(ours) & ~peers["note"].fillna("").str.contains("first 300")]
by_peer = peers.assign(abs_err=peers["error_pct"].abs() / 100).pivot_table(
    index="simulator", columns="metric", values="abs_err", aggfunc="median")
counts = peers.groupby("simulator")["key"].nunique().rename("stages")
print("peers, published (median |error| over the stages they report, same definition):")
print(pd.concat([by_peer, counts], axis=1).to_string(float_format="{:.1%}".format))

# %% [markdown]
# Reading it: docs/fidelity.md §8.
