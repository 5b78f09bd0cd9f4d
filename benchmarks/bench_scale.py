"""Scale: wall time, engine steps per second and peak memory of one long open-loop run.

Each size is one fresh process running the shipped default inputs (Qwen3-8B analytic H100
profile, the synthetic DSpark trace set's lengths) under a Poisson load that the cluster
keeps stable: 8 req/s per replica, replicas = rate / 8, arrivals stopped at `--requests`
(`run.max_requests`), the horizon long enough for all of them to arrive and drain. The
process does what `sparksim run` does: simulate with the tables streamed to parquet
(`run.records.stream`, a row group at a time) and write the results folder; `--in-memory`
holds the tables whole instead, as before streaming. The cost should grow linearly with
the engine steps; the memory, streamed, should stay bounded (in memory: with the records kept).

Run:  python benchmarks/bench_scale.py                                (10,000 and 100,000)
      python benchmarks/bench_scale.py --requests 10000,100000,1000000
      python benchmarks/bench_scale.py --no-steps                     (no per-step table)
      python benchmarks/bench_scale.py --in-memory                    (tables held, not streamed)
Target (issue 23): a million requests within 5 minutes and 2 GB peak RSS on the 2-core VM.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time

PER_REPLICA_RATE = 8.0  # req/s one replica serves stably with the default inputs
DRAIN_S = 120.0  # after the last arrival, for the last requests to finish

# One size in a fresh process, so its peak RSS is its own (ru_maxrss is in KiB on Linux).
CHILD = textwrap.dedent("""
    import json, resource, sys, tempfile, time, warnings
    from pathlib import Path
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    from sparksim.sim.runner import load_scenario, records_folder, simulate, write_results
    n, rate, replicas, duration, steps, stream = (int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]),
                                                  float(sys.argv[4]), sys.argv[5] == "1", sys.argv[6])
    sc, base = load_scenario(None, [
        "workload.kind=poisson", f"workload.rate={rate}", f"cluster.replicas={replicas}",
        f"run.max_requests={n}", f"run.duration_s={duration}", f"run.records.steps={str(steps).lower()}",
        f"run.records.stream={stream}",
    ])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results"
        with records_folder(out) as records_dir:  # as `sparksim run` streams
            res = simulate(sc, base, records_dir=records_dir)
            sim_done = time.perf_counter()
            write_results(res, out)
        written_s = time.perf_counter() - sim_done
    print(json.dumps({
        "process_s": time.perf_counter() - t0, "sim_s": res.wall_s, "write_s": written_s,
        "steps": res.num_steps, "finished": res.summary["census"]["finished"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))
""")


def run_size(n: int, rate: float, steps: bool, stream: bool, timeout_s: float) -> dict[str, float]:
    """Run `n` requests at `rate` req/s in a fresh process; return its figures."""
    replicas = max(1, round(rate / PER_REPLICA_RATE))
    duration_s = n / rate + DRAIN_S
    argv = [sys.executable, "-c", CHILD, str(n), str(rate), str(replicas), str(duration_s), "1" if steps else "0",
            "auto" if stream else "false"]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"{n} requests failed:\n{done.stderr[-2000:]}")
    out: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.perf_counter() - t0
    out["replicas"] = replicas
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", default="10000,100000", help="request counts, comma list")
    ap.add_argument("--rate", type=float, default=256.0, help="Poisson arrival rate, req/s (whole cluster)")
    ap.add_argument("--no-steps", action="store_true", help="keep no per-step table (run.records.steps=false)")
    ap.add_argument("--in-memory", action="store_true",
                    help="hold the tables whole and write them at the end (run.records.stream=false)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds one size may run")
    args = ap.parse_args()
    print(f"records {'held in memory' if args.in_memory else 'streamed to parquet'}"
          f"{', no per-step table' if args.no_steps else ''}")
    print(f"{'requests':>9} {'replicas':>8} {'finished':>9} {'steps':>10} {'wall s':>8} {'sim s':>8} "
          f"{'write s':>8} {'steps/s':>9} {'peak RSS MB':>12}")
    for n in (int(v) for v in args.requests.split(",")):
        r = run_size(n, args.rate, not args.no_steps, not args.in_memory, args.timeout)
        print(f"{n:>9,} {r['replicas']:>8} {r['finished']:>9,} {r['steps']:>10,} {r['wall_s']:>8.1f} "
              f"{r['sim_s']:>8.1f} {r['write_s']:>8.1f} {r['steps'] / r['sim_s']:>9,.0f} "
              f"{r['peak_rss_mb']:>12,.0f}", flush=True)


if __name__ == "__main__":
    main()
