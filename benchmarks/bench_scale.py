"""Scale: wall time, engine steps per second and peak memory of one long open-loop run.

Each size is one fresh process running the shipped default inputs (Qwen3-8B analytic H100
profile, the synthetic DSpark trace set's lengths) under a Poisson load that the cluster
keeps stable with room to spare: each replica takes 22 req/s, half the ~44 req/s at which
one replica saturates (`--capacity` measures it: past it the output rate stops following
the load and TPOT climbs), so replicas = rate / 22; arrivals stop at `--requests`
(`run.max_requests`) and the horizon is long enough for all of them to arrive and drain.
The process does what `sparksim run` does: simulate with the tables streamed to parquet
(`run.records.stream`, a row group at a time) and write the results folder; `--in-memory`
holds the tables whole instead, as before streaming. The cost should grow linearly with
the engine steps; the memory, streamed, should stay bounded (in memory: with the records kept).

The load per replica sets how many engine steps a request costs: at 8 req/s (the rate this
benchmark used until 2026-12-02, 18 % of saturation) a replica runs ~6.5 requests a step
and a million requests take ~13.5 million steps; at 22 req/s about a third of that.

Run:  python benchmarks/bench_scale.py                                (10,000 and 100,000)
      python benchmarks/bench_scale.py --requests 10000,100000,1000000
      python benchmarks/bench_scale.py --per-replica-rate 8           (the former load)
      python benchmarks/bench_scale.py --capacity 8,16,32,40,48,56    (one replica's saturation)
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

PER_REPLICA_RATE = 22.0  # req/s a replica takes: half its measured saturation (`--capacity`)
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


# One replica at one Poisson rate for 120 s of arrivals: is the output rate still the offered one?
CAPACITY = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("ignore")
    from sparksim.sim.runner import load_scenario, simulate
    rate = float(sys.argv[1])
    n = int(rate * 120)
    sc, base = load_scenario(None, [
        "workload.kind=poisson", f"workload.rate={rate}", "cluster.replicas=1", f"run.max_requests={n}",
        f"run.duration_s={n / rate + 120}"])
    res = simulate(sc, base)
    s = res.summary
    offered = rate * float(res.requests["output_tokens"].mean())
    print(json.dumps({"mean_requests": float(res.steps["num_requests"].mean()), "tpot_ms": s["mean_tpot_ms"],
                      "output_tok_s": s["output_throughput"], "offered_tok_s": offered}))
""")


def capacity(rates: list[float]) -> None:
    """Print, per Poisson rate on one replica, its mean batch, TPOT and output rate against the offered rate."""
    print(f"{'req/s':>6} {'mean R':>7} {'TPOT ms':>8} {'output tok/s':>13} {'offered tok/s':>14} {'served':>7}")
    for rate in rates:
        done = subprocess.run([sys.executable, "-c", CAPACITY, str(rate)], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise SystemExit(f"{rate} req/s failed:\n{done.stderr[-2000:]}")
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{rate:>6g} {r['mean_requests']:>7.1f} {r['tpot_ms']:>8.2f} {r['output_tok_s']:>13,.0f} "
              f"{r['offered_tok_s']:>14,.0f} {r['output_tok_s'] / r['offered_tok_s']:>7.0%}", flush=True)


def run_size(n: int, rate: float, per_replica: float, steps: bool, stream: bool, timeout_s: float
             ) -> dict[str, float]:
    """Run `n` requests at `rate` req/s, `per_replica` req/s a replica, in a fresh process; return its figures."""
    replicas = max(1, round(rate / per_replica))
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
    ap.add_argument("--per-replica-rate", type=float, default=PER_REPLICA_RATE,
                    help="req/s each replica serves: replicas = rate / this")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds one size may run")
    ap.add_argument("--capacity", default=None, metavar="RATES",
                    help="instead: one replica at each of these req/s (comma list), to find where it saturates")
    args = ap.parse_args()
    if args.capacity:
        capacity([float(v) for v in args.capacity.split(",")])
        return
    print(f"records {'held in memory' if args.in_memory else 'streamed to parquet'}"
          f"{', no per-step table' if args.no_steps else ''}")
    print(f"{'requests':>9} {'replicas':>8} {'finished':>9} {'steps':>10} {'wall s':>8} {'sim s':>8} "
          f"{'write s':>8} {'steps/s':>9} {'peak RSS MB':>12}")
    for n in (int(v) for v in args.requests.split(",")):
        r = run_size(n, args.rate, args.per_replica_rate, not args.no_steps, not args.in_memory, args.timeout)
        print(f"{n:>9,} {r['replicas']:>8} {r['finished']:>9,} {r['steps']:>10,} {r['wall_s']:>8.1f} "
              f"{r['sim_s']:>8.1f} {r['write_s']:>8.1f} {r['steps'] / r['sim_s']:>9,.0f} "
              f"{r['peak_rss_mb']:>12,.0f}", flush=True)


if __name__ == "__main__":
    main()
