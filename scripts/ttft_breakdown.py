"""Where a run's time to first token goes: queueing, the prefill step, the gaps between steps.

    python scripts/ttft_breakdown.py RESULTS [RESULTS ...] [--profile DIR] [--after S]

RESULTS is a folder written by `sparksim run` or `sparksim live` (requests.parquet and
steps.parquet). For the requests that arrived after `--after` seconds it splits the mean
TTFT into the wait before their prefill step started and the prefill step itself; it
prices every prefill step's prompts with the profile (summed and padded attention) beside
its recorded time; and it gives the mean idle gap between consecutive steps by kind
(decode -> decode, decode -> prefill, prefill -> decode). A simulated run has no gaps and
records its priced times, so running it on a live folder and on the simulator's folder
for the same scenario shows which part the simulator leaves out (docs/fidelity.md §7).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from sparksim.cost.profile import load_profile
from sparksim.sim.metrics import step_gaps

DEFAULT_PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "cpu-tinylm-d128-live-measured"


def breakdown(folder: Path, profile_dir: Path, after_s: float) -> str:
    """Return the report for one results folder."""
    prof = load_profile(profile_dir)
    req = pd.read_parquet(folder / "requests.parquet").sort_values("first_token_at")
    steps = pd.read_parquet(folder / "steps.parquet")
    pre = steps[steps["prefill_tokens"] > 0]
    starts = pre["start_at"].to_numpy()
    # a request's prefill step: the last one that started before its first token
    # (a simulated first token lands at its step's end, which may be the next step's start)
    step = np.searchsorted(starts, req["first_token_at"].to_numpy() - 1e-9, side="right") - 1
    began = starts[step]
    ended = began + pre["step_s"].to_numpy()[step]
    late = (req["arrival_at"] > after_s).to_numpy()
    ttft = (req["first_token_at"] - req["arrival_at"]).to_numpy()[late] * 1e3
    wait = (began - req["arrival_at"].to_numpy())[late] * 1e3
    lines = [f"{folder}: {late.sum()} requests after t = {after_s:g} s",
             f"  TTFT {ttft.mean():.2f} ms = wait {wait.mean():.2f} + prefill step "
             f"{(ended - began)[late].mean() * 1e3:.2f} ms"]
    coef = prof.prefill_attention_coef_ms
    rows = []
    recorded_tokens = pre["prefill_tokens"].to_numpy()
    for i, group in req.groupby(pd.Series(step, index=req.index)):
        prompts = group["prompt_tokens"].to_numpy(np.float64)
        if prompts.sum() != recorded_tokens[int(str(i))]:  # a prompt of an unfinished request: not listed
            continue
        dense_ms = prof.prefill_dense_s(float(prompts.sum())) * 1e3
        # each prompt its own attention, or every one the longest's (what a padded profile charges)
        rows.append({"prompts": prompts.size, "tokens": prompts.sum(),
                     "recorded_ms": pre["step_s"].iloc[int(str(i))] * 1e3,
                     "priced_summed_ms": dense_ms + coef * float((prompts**2).sum()),
                     "priced_padded_ms": dense_ms + coef * prompts.size * prompts.max() ** 2})
    table = pd.DataFrame(rows).groupby("prompts").agg(
        steps=("tokens", "size"), tokens=("tokens", "mean"), recorded_ms=("recorded_ms", "mean"),
        priced_summed_ms=("priced_summed_ms", "mean"), priced_padded_ms=("priced_padded_ms", "mean"))
    lines += [f"  prefill steps whose prompts all belong to finished requests ({len(rows)} of {len(pre)}),"
              " by prompts per step:", table.round(2).to_string()]
    gaps = step_gaps(steps).rename(columns={"after": "from", "kind": "to"})
    lines += ["  idle gap between steps (ms):",
              gaps.groupby(["from", "to"])["gap_ms"].agg(["count", "mean", "max"]).round(3).to_string()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--after", type=float, default=2.0, help="leave out requests that arrived earlier (s)")
    args = parser.parse_args()
    for folder in args.results:
        print(breakdown(folder, args.profile, args.after))


if __name__ == "__main__":
    main()
