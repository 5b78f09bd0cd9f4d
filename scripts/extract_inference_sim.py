"""Remake analyses/data/inference-sim-vllm/<exp>.csv.gz from a mirror of inference-sim/training.

    python scripts/extract_inference_sim.py --git-dir MIRROR --out DIR EXP [EXP ...]

MIRROR is a (bare) git directory of github.com/inference-sim/training. For each experiment
it reads, with `git show`, `replay_data/<exp>.json` (arrival time and token counts) and
`replay_data/<exp>_ground_truth.json` (measured TTFT and E2E) at `--commit`, and the
per-stage `load_summary.count` from `default_args/<exp>/results/stage_<n>_lifecycle_metrics.json`
at `--metrics-commit` (the first count requests are stage 0, the next stage 1, ...). It
checks each stage's mean E2E and TTFT against those files and writes one gzipped CSV per
experiment: request_id, stage, arrival_s, prompt_tokens, output_tokens, ttft_ms, e2e_ms,
has_error, plus prefix_group and prefix_tokens when the replay records a prefix group.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import subprocess
from pathlib import Path
from typing import Any

REPLAY_COMMIT = "c4f03409b4489891482bcd63797cfe3a92fc262d"
METRICS_COMMIT = "ed5c1d26900e6909758d5e1641a18edaf56a1caf"
COLUMNS = [
    "request_id", "stage", "arrival_s", "prompt_tokens", "output_tokens",
    "ttft_ms", "e2e_ms", "has_error",
]  # fmt: skip


def git_json(git_dir: Path, commit: str, path: str) -> Any:
    """Return the parsed JSON of `path` at `commit`, or None when it is absent."""
    proc = subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"],
        capture_output=True,
        check=False,
    )
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def stage_metrics(git_dir: Path, commit: str, exp: str) -> list[dict[str, Any]]:
    """Return the stage_<n>_lifecycle_metrics.json documents of one run, in stage order."""
    stages: list[dict[str, Any]] = []
    while True:
        path = f"default_args/{exp}/results/stage_{len(stages)}_lifecycle_metrics.json"
        doc = git_json(git_dir, commit, path)
        if doc is None:
            return stages
        stages.append(doc)


def extract(git_dir: Path, commit: str, metrics_commit: str, exp: str) -> tuple[bytes, str]:
    """Return the gzipped CSV of one experiment and a one-line check report."""
    replay = git_json(git_dir, commit, f"replay_data/{exp}.json")
    truth = git_json(git_dir, commit, f"replay_data/{exp}_ground_truth.json")
    stages = stage_metrics(git_dir, metrics_commit, exp)
    if replay is None or truth is None or not stages:
        raise SystemExit(f"{exp}: replay, ground truth or stage metrics missing")
    requests = sorted(replay["requests"], key=lambda r: r["index"])
    measured = {g["index"]: g for g in truth}
    counts = [s["load_summary"]["count"] for s in stages]
    if sum(counts) != len(requests):
        raise SystemExit(f"{exp}: stage counts {counts} != {len(requests)} requests")
    stage_of = [i for i, n in enumerate(counts) for _ in range(n)]
    groups = sorted(
        {r["prefix_group"] for r in requests if r.get("prefix_group") not in ("", None)}
    )
    group_id = {g: i for i, g in enumerate(groups)}
    prefix_len = int(replay["config"].get("system_prompt_len", 0))
    columns = COLUMNS + (["prefix_group", "prefix_tokens"] if groups else [])

    t0 = requests[0]["arrival_time_us"]
    text = io.StringIO()
    out = csv.writer(text, lineterminator="\n")
    out.writerow(columns)
    sums: dict[int, list[float]] = {}
    for row, req in enumerate(requests):
        gt = measured[req["index"]]
        err = bool(gt["has_error"] or req["has_error"])
        times = [f"{gt[k] * 1000:.6f}" if k in gt else "" for k in ("ttft_s", "e2e_s")]
        values: list[object] = [
            req["index"], stage_of[row], f"{(req['arrival_time_us'] - t0) / 1e6:.6f}",
            req["input_tokens"], req["output_tokens"], *times, int(err),
        ]  # fmt: skip
        if groups:
            group = req.get("prefix_group")
            values += [group_id[group], prefix_len] if group in group_id else ["", ""]
        out.writerow(values)
        if not err:
            acc = sums.setdefault(stage_of[row], [0.0, 0.0, 0.0])
            acc[0] += gt["e2e_s"] * 1000
            acc[1] += gt["ttft_s"] * 1000
            acc[2] += 1
    gaps = []
    for i, doc in enumerate(stages):
        lat = doc["successes"]["latency"]
        e2e_sum, ttft_sum, n = sums.get(i, [0.0, 0.0, 0.0])
        if n:
            gaps.append(abs(e2e_sum / n - lat["request_latency"]["mean"] * 1000))
            gaps.append(abs(ttft_sum / n - lat["time_to_first_token"]["mean"] * 1000))
    errors = sum(1 for g in truth if g["has_error"])
    report = (
        f"{exp}: {len(requests)} requests, stages {counts}, {errors} errored, "
        f"prefix groups {len(groups)}, max |stage mean - metrics file| {max(gaps, default=0):.2e} ms"
    )
    return gzip.compress(text.getvalue().encode(), compresslevel=9, mtime=0), report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--git-dir", type=Path, required=True, help="mirror of inference-sim/training"
    )
    parser.add_argument("--commit", default=REPLAY_COMMIT, help="commit holding replay_data/")
    parser.add_argument(
        "--metrics-commit", default=METRICS_COMMIT, help="commit holding default_args/"
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the .csv.gz files")
    parser.add_argument(
        "experiments",
        nargs="+",
        help="experiment names, e.g. 20260217-231439-llama-2-7b-tp1-general",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for exp in args.experiments:
        data, report = extract(args.git_dir, args.commit, args.metrics_commit, exp)
        (args.out / f"{exp}.csv.gz").write_bytes(data)
        print(report)


if __name__ == "__main__":
    main()
