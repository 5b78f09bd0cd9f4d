"""Results must not move: hash the tables and summaries of a fixed set of runs, to compare two trees.

A speed change must leave every figure as it was (issue 23). Each run below is simulated
with `--check` on and its per-request table, per-step table and summary hashed; two trees
that print the same lines give the same results, byte for byte. The runs cover what the
engine's fast paths skip or reorder: DistServe's benchmark in both prefill modes (plain
decoding, the context cap's rotation), the default two-step, greedy, static, plain decoding
on the pool, under KV pressure (preemption), under a context cap and colocated, a colocated
two-step and a Poisson load, then two-step's delay and EMA variants, closed and Poisson.

Run:  python benchmarks/results_hash.py > new.txt
      git worktree add /tmp/sparksim-old <commit>
      PYTHONPATH=/tmp/sparksim-old python benchmarks/results_hash.py > old.txt && diff old.txt new.txt
(about a minute each on 2 cores)
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import warnings
from pathlib import Path

import pandas as pd

from sparksim.config import parse_scenario
from sparksim.sim.runner import RunResult, load_scenario, simulate
from sparksim.studies.crosscheck import benchmark_arrivals, scenario

SHORT = ["run.duration_s=60", "run.warmup_s=5", "run.cooldown_s=5"]
RUNS: dict[str, tuple[str | None, list[str]]] = {
    "default": (None, []),
    "greedy": ("greedy", []),
    "static": ("static:gamma=3", []),
    "plain": ("static:gamma=0", []),
    "plain-kv": ("static:gamma=0", ["cluster.kv_capacity_tokens=30000", "workload.concurrency=128"]),
    "plain-capped": ("static:gamma=0", ["cluster.max_context_tokens=20000", "workload.concurrency=96"]),
    "plain-colocated": ("static:gamma=0", ["cluster.prefill.mode=colocated"]),
    "two-step-coloc": (None, ["cluster.prefill.mode=colocated", "workload.concurrency=64"]),
    "poisson": (None, ["workload.kind=poisson", "workload.rate=6"]),
    **{f"{spec}{' poisson' if extra else ''}": (spec, extra)
       for spec in ("two-step:delay=0", "two-step:delay=1", "two-step:ema=0.8", "two-step:ema=0.8,delay=0")
       for extra in ([], ["workload.kind=poisson", "workload.rate=8"])},
}


def digest(res: RunResult) -> str:
    """The first 16 hex digits of a hash over the run's tables (values and order) and summary."""
    h = hashlib.sha256()
    for table in (res.requests, res.steps):
        if table is not None:
            h.update(pd.util.hash_pandas_object(table, index=False).to_numpy().tobytes())
    h.update(json.dumps(res.summary, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def main() -> None:
    warnings.simplefilter("ignore")
    out: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "arrivals.csv"
        benchmark_arrivals(1500).to_csv(csv, index=False)
        for mode in ("disaggregated", "colocated"):
            out.append((f"distserve-{mode}", digest(simulate(parse_scenario(scenario(mode, csv, 1500)), check=True))))
    for name, (policy, sets) in RUNS.items():
        sc, base = load_scenario(None, SHORT + sets, policy)
        out.append((name, digest(simulate(sc, base, check=True))))
    for name, value in out:
        print(f"{name:<32} {value}")


if __name__ == "__main__":
    main()
