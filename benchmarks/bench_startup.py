"""Start-up of the `sparksim` command, as whole processes, against its targets.

Measures the wall time of `sparksim --help`, `sparksim run --help` and the default
`sparksim run --out <tmp>` (best of N runs, each a fresh process, so the figure is what a
person waits for), and `python -c pass` for this machine's floor. Targets: `--help` within
0.3 s, the default run within 1.5 s on the 2-core development VM. The processes run with
Python's bytecode cache on, as an installed package's do (`PYTHONDONTWRITEBYTECODE` is
dropped for them; the first of the runs writes the cache), so the figure is not the
compiler's (bench_distserve.py does the same).

Run:  python benchmarks/bench_startup.py [--runs 5]
Find what an import costs with:  python -X importtime -c "import sparksim.cli" 2> imports.txt
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The console script's entry point, run by this interpreter (no dependence on PATH).
SPARKSIM = [sys.executable, "-c", "from sparksim.cli import main; main()"]
# the children's environment: this one's, with the bytecode cache on
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def best_wall_s(argv: list[str], runs: int) -> float:
    """Return the shortest wall time, in seconds, of `runs` fresh runs of `argv` (which must succeed)."""
    best_s = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        best_s = min(best_s, time.perf_counter() - start)
    return best_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command; the fastest is kept")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cases: list[tuple[str, list[str], float | None]] = [
            ("python -c pass", [sys.executable, "-c", "pass"], None),
            ("sparksim --help", [*SPARKSIM, "--help"], 0.3),
            ("sparksim run --help", [*SPARKSIM, "run", "--help"], 0.3),
            ("sparksim run --out <tmp>", [*SPARKSIM, "run", "--out", str(out)], 1.5),
        ]
        print(f"best of {args.runs} runs, wall time of a fresh process")
        print(f"{'command':<26} {'best':>8} {'target':>8}")
        failed = 0
        for label, argv, target_s in cases:
            best = best_wall_s(argv, args.runs)
            shutil.rmtree(out, ignore_errors=True)
            if target_s is None:
                verdict, target = "(this machine's floor)", "-"
            else:
                verdict, target = ("ok" if best <= target_s else "OVER"), f"{target_s:.1f} s"
                failed += best > target_s
            print(f"{label:<26} {best:>6.2f} s {target:>8}  {verdict}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
