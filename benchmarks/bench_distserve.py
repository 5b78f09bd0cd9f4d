"""sparksim against DistServe's simulator, as whole processes, on DistServe's benchmark workload.

Both simulate the same thing (`sparksim.studies.crosscheck`: OPT-13B on an A100, DistServe's fitted
cost model, 512-token prompts, 256 decode iterations, Poisson 4 req/s from
`numpy.random.default_rng(0)`), so the wall time of each whole process (start-up included)
is a fair comparison. sparksim's process is `sparksim run <scenario.yaml>` writing its results
folder (the per-request table and summary; no per-step table, as DistServe keeps none), the
scenario and its arrivals CSV written before the clock starts. docs/design.md §5's target:
sparksim faster at 1,000 requests and ≥ 10× at 10,000.

Run:  python benchmarks/bench_distserve.py                          (sparksim only)
      python benchmarks/bench_distserve.py --distserve /path/to/DistServe --distserve-python PY
`--distserve` is a checkout of LLMServe/DistServe (its `simdistserve` package is run as it
is, nothing of it is copied here); PY is an interpreter with simpy, numpy and pandas.
Each process runs `--repeat` times (default 3), the two alternating; the table gives each
side's median wall time with its range, and the ratio of the medians.

Both run with Python's bytecode cache on, as an installed package does: one untimed run of
each side per mode writes it first. A shell with `PYTHONDONTWRITEBYTECODE=1` (the
development VM's) would otherwise have every process compile the sources that have no
cache yet (an editable install's: sparksim's ~60 modules, ~0.07 s a process; DistServe's
`simdistserve`), which measures the compiler, not the simulators; the variable is dropped
for the children (`--no-bytecode-cache` keeps it, for comparison with older tables).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import yaml

from sparksim.studies.crosscheck import benchmark_arrivals, scenario

# the console script installed beside this interpreter (the README's `sparksim run`)
SPARKSIM = Path(sys.executable).with_name("sparksim")

# Calls DistServe's own entry point with the same arrivals (a custom workload file).
DISTSERVE = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[3])
    from simdistserve.benchmarks import simulate_dist as sd
    backend, n, workload = sys.argv[1], int(sys.argv[2]), sys.argv[4]
    arr = np.concatenate([[0.0], np.cumsum(np.random.default_rng(0).exponential(0.25, n - 1))])
    json.dump([{"start_time": float(t), "prompt_len": 512, "output_len": 256} for t in arr],
              open(workload, "w"))
    out = {}
    sd.main(sd.parse_args(args_=[
        "--backend", backend, "--model", "opt_13b", "--N", str(n), "--arrival", "custom",
        "--workload", workload, "--seed", "0", "--tp-prefill", "1", "--pp-prefill", "1",
        "--tp-decode", "1", "--pp-decode", "1"]), outputs=out)
    lat = out["per_request_latency_df"]
    print(len(lat))
""")


def sparksim_argv(mode: str, n: int, tmp: Path) -> list[str]:
    """Write the scenario and its arrivals into `tmp`; return the `sparksim run` command of it."""
    csv = tmp / "arrivals.csv"
    benchmark_arrivals(n).to_csv(csv, index=False)
    sc = scenario(mode, csv, n)
    sc["run"]["records"] = {"steps": False}
    (tmp / "scenario.yaml").write_text(yaml.safe_dump(sc, sort_keys=False))
    return [str(SPARKSIM), "run", str(tmp / "scenario.yaml"), "--out", str(tmp / "results"), "-q"]


def child_env(bytecode_cache: bool) -> dict[str, str]:
    """The children's environment: this one's, less `PYTHONDONTWRITEBYTECODE` when the cache is on."""
    env = dict(os.environ)
    if bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed:\n{done.stderr[-2000:]}")
    return wall, done.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", default="1000,10000", help="request counts, comma list")
    ap.add_argument("--modes", default="disaggregated,colocated")
    ap.add_argument("--distserve", type=Path, default=None, help="a DistServe checkout (optional)")
    ap.add_argument("--distserve-python", default=sys.executable)
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each process, alternating; the table gives medians and the spread")
    ap.add_argument("--no-bytecode-cache", action="store_true",
                    help="keep PYTHONDONTWRITEBYTECODE as it is set here, and run no warm-up")
    args = ap.parse_args()
    env = child_env(not args.no_bytecode_cache)
    if args.repeat < 1:
        raise SystemExit(f"--repeat={args.repeat}: must be at least 1")
    backend = {"disaggregated": "distserve", "colocated": "vllm"}
    print(f"{'mode':<14} {'requests':>8} {'sparksim s':>17} {'distserve s':>19} {'ratio':>7}")

    def run_ours(mode: str, n: int) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            return timed(sparksim_argv(mode, n, Path(tmp)), env)[0]

    def run_theirs(mode: str, n: int) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            return timed([args.distserve_python, "-c", DISTSERVE, backend[mode], str(n),
                          str(args.distserve), str(Path(tmp) / "w.json")], env)[0]

    requests = [int(v) for v in args.requests.split(",")]
    modes = args.modes.split(",")
    if not args.no_bytecode_cache:  # untimed: each side's first process writes its bytecode cache
        for mode in modes:
            run_ours(mode, min(requests))
            if args.distserve is not None:
                run_theirs(mode, min(requests))
    for n in requests:
        for mode in modes:
            ours: list[float] = []
            theirs: list[float] = []
            for _ in range(args.repeat):  # alternating, so a noisy minute hits both sides
                ours.append(run_ours(mode, n))
                if args.distserve is not None:
                    theirs.append(run_theirs(mode, n))
            ratio = f"x{statistics.median(theirs) / statistics.median(ours):.1f}" if theirs else "-"
            print(f"{mode:<14} {n:>8} {spread(ours):>17} {spread(theirs) if theirs else '-':>19} {ratio:>7}",
                  flush=True)


def spread(walls: list[float]) -> str:
    """The median wall time, with the range when there are several runs: '1.49 (1.45-1.57)'."""
    med = f"{statistics.median(walls):.2f}"
    return med if len(walls) == 1 else f"{med} ({min(walls):.2f}-{max(walls):.2f})"

if __name__ == "__main__":
    main()
