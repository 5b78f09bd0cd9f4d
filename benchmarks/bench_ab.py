"""Engine speed of two source trees, interleaved in one run: is a change slower per step?

Each (tree, policy, R) runs in its own process on the same synthetic inputs
(`_inputs.build_inputs`), per-step records off; a process simulates once to warm up, then
three times, and reports its best µs per engine step. Trees alternate, REPEATS times, so
a shared machine's slow spells fall on both; the ratio new / old is printed per cell.

Run:  git worktree add /tmp/sparksim-old <commit>
      python benchmarks/bench_ab.py /tmp/sparksim-old            (new: this tree)
      python benchmarks/bench_ab.py OLD NEW --kernels numpy --users 8,64
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, "benchmarks")
from _inputs import build_inputs
try:
    from sparksim.step import kernels
    from sparksim.sim.runner import load_scenario, simulate
except ImportError:  # a tree from before the subpackages (2026-12-01)
    from sparksim import kernels
    from sparksim.runner import load_scenario, simulate
kernels.use(sys.argv[2])
policy, users, duration = sys.argv[1], int(sys.argv[3]), float(sys.argv[4])
prof, traces = build_inputs(Path(tempfile.mkdtemp()))
sets = [f"profile={prof}", f"traces={traces}", f"workload.concurrency={users}",
        f"cluster.max_concurrency={users}", f"run.duration_s={duration}", "run.records.steps=false",
        "cluster.prefill.kv_transfer_s=0"] + (["policy.gamma=3"] if policy == "static" else [])
sc, base = load_scenario(None, sets, policy)
simulate(sc, base)
best = min(r.wall_s / r.num_steps for r in (simulate(sc, base) for _ in range(3)))
print(json.dumps({"us_per_step": best * 1e6}))
'''


def us_per_step(tree: Path, policy: str, kernels: str, users: int, duration: float) -> float:
    """Best µs per engine step of `tree`'s sparksim on one cell, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD, policy, kernels, str(users), str(duration)],
                         cwd=tree, capture_output=True, text=True, env=env, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["us_per_step"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path, help="the baseline tree (e.g. a git worktree of the old commit)")
    ap.add_argument("new", type=Path, nargs="?", default=Path(__file__).resolve().parents[1],
                    help="the tree to compare (default: this one)")
    ap.add_argument("--kernels", default="numba", choices=["numba", "numpy"])
    ap.add_argument("--policies", default="static,greedy,two-step")
    ap.add_argument("--users", default="8,256", help="R values, comma-separated")
    ap.add_argument("--duration", type=float, default=60.0, help="simulated seconds per run")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved repeats of each tree")
    args = ap.parse_args()
    print(f"µs per engine step, best of 3 runs per process, {args.repeats} interleaved processes per tree "
          f"({args.kernels} kernels); old {args.old}, new {args.new}")
    print(f"{'policy':<10} {'R':>4} {'old (each)':>22} {'new (each)':>22} {'new/old':>8}")
    for policy in args.policies.split(","):
        for users in (int(u) for u in args.users.split(",")):
            got: dict[str, list[float]] = {"old": [], "new": []}
            for _ in range(args.repeats):
                for side, tree in (("old", args.old), ("new", args.new)):
                    got[side].append(us_per_step(tree, policy, args.kernels, users, args.duration))
            old, new = min(got["old"]), min(got["new"])
            each = {k: ", ".join(f"{v:.1f}" for v in vals) for k, vals in got.items()}
            print(f"{policy:<10} {users:>4} {each['old']:>22} {each['new']:>22} {new / old:>8.2f}")


if __name__ == "__main__":
    main()
