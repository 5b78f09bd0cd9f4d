"""Sweeps: one scenario run over a grid of overrides × policies, in parallel, summarised in one table.

Each grid point is an independent simulation at the scenario's seed (so policies at one
point see the same users and requests: paired comparisons), so a sweep is embarrassingly
parallel: local worker processes by default, or Ray tasks when a Ray
cluster is available (`backend="ray"`), with the same function on both.
Pareto analysis lives here too: frontiers of throughput per GPU against tokens per second
per user, and matched-throughput speedups between policies.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from sparksim.atomic import atomic_dir
from sparksim.errors import ConfigError

ROW_METRICS = (
    "output_throughput", "tput_per_gpu", "interactivity", "mean_tpot_ms", "p99_tpot_ms",
    "mean_ttft_ms", "p99_ttft_ms", "median_itl_ms", "mean_e2el_ms", "mean_acceptance_length",
    "verify_budget_per_request", "request_throughput", "completed", "engine_steps",
)


@dataclass(frozen=True)
class SweepPoint:
    """One simulation of a sweep: a policy spec and the overrides of its grid point."""

    policy: str  # "name" or "name:param=value,param=value"
    overrides: tuple[str, ...]

    def policy_name_and_sets(self) -> tuple[str, list[str]]:
        name, _, args = self.policy.partition(":")
        if ":" in args or (args and "=" not in args):  # a plug-in path module:Class
            return self.policy, []
        sets = [f"policy.{kv.strip()}" for kv in args.split(",") if kv.strip()] if args else []
        return name, sets


def parse_vary(items: Iterable[str]) -> list[tuple[str, list[str]]]:
    """Parse `key=v1,v2,...` axes; a grid is their Cartesian product."""
    axes = []
    for item in items:
        key, sep, vals = item.partition("=")
        if not sep or not key.strip() or not vals.strip():
            raise ConfigError(f"--vary {item!r}: expected KEY=V1,V2,... (e.g. workload.concurrency=1,8,64)")
        axes.append((key.strip(), [v.strip() for v in vals.split(",") if v.strip()]))
    return axes


def grid(axes: Sequence[tuple[str, list[str]]], policies: Sequence[str]) -> list[SweepPoint]:
    """Return every (policy, grid point) combination, policies outermost."""
    combos = list(itertools.product(*[[f"{k}={v}" for v in vals] for k, vals in axes])) or [()]
    return [SweepPoint(p, tuple(c)) for p in policies for c in combos]


def run_point(scenario_path: str | None, base_sets: Sequence[str], point: SweepPoint) -> dict[str, Any]:
    """Simulate one sweep point and return its flat summary row (runs in a worker process)."""
    import warnings

    from sparksim.runner import load_scenario, simulate

    name, policy_sets = point.policy_name_and_sets()
    sc, base = load_scenario(scenario_path, [*base_sets, *point.overrides, *policy_sets], name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = simulate(sc, base)
    s = res.summary
    row: dict[str, Any] = {"policy": point.policy, "label": s["policy_label"],
                           "lossless": s["lossless"], "upper_bound": s["upper_bound"]}
    for ov in point.overrides:
        key, _, val = ov.partition("=")
        row[key] = yaml.safe_load(val)
    for m in ROW_METRICS:
        row[m] = s.get(m)
    return row  # no wall-clock figures: the table is reproducible byte for byte


def run_sweep(
    scenario_path: str | None,
    base_sets: Sequence[str],
    points: Sequence[SweepPoint],
    *,
    workers: int | None = None,
    backend: str = "process",
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Run every point; return one row per point in `points` order."""
    if not points:
        raise ConfigError("the sweep is empty: give at least one policy and one grid point")
    # fail fast on a bad scenario/policy before spawning anything
    from sparksim.runner import load_inputs, load_scenario

    for point in {p.policy: p for p in points}.values():
        name, policy_sets = point.policy_name_and_sets()
        sc, base = load_scenario(scenario_path, [*base_sets, *point.overrides, *policy_sets], name)
        load_inputs(sc, base)
    rows: list[dict[str, Any] | None] = [None] * len(points)
    done = 0
    if backend == "ray":
        import ray  # optional extra

        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True)
        remote = ray.remote(run_point)
        refs = {remote.remote(scenario_path, list(base_sets), p): i for i, p in enumerate(points)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            rows[refs[ready[0]]] = ray.get(ready[0])
            done += 1
            if progress:
                progress(done, len(points))
    elif backend == "process" and (workers or os.cpu_count() or 1) > 1 and len(points) > 1:
        n = min(workers or os.cpu_count() or 1, len(points))
        with ProcessPoolExecutor(max_workers=n) as pool:
            futs = {pool.submit(run_point, scenario_path, list(base_sets), p): i for i, p in enumerate(points)}
            for fut in as_completed(futs):
                rows[futs[fut]] = fut.result()
                done += 1
                if progress:
                    progress(done, len(points))
    else:
        for i, p in enumerate(points):
            rows[i] = run_point(scenario_path, base_sets, p)
            if progress:
                progress(i + 1, len(points))
    return pd.DataFrame([r for r in rows if r is not None])


def pareto_frontier(df: pd.DataFrame, x: str = "interactivity", y: str = "tput_per_gpu") -> pd.DataFrame:
    """Return the points no other point beats on both x and y, sorted by x."""
    pts = df[[x, y]].to_numpy(np.float64)
    keep = []
    for i, (xi, yi) in enumerate(pts):
        if not np.isfinite([xi, yi]).all():
            continue
        dominated = ((pts[:, 0] >= xi) & (pts[:, 1] >= yi) & ((pts[:, 0] > xi) | (pts[:, 1] > yi))).any()
        if not dominated:
            keep.append(i)
    return df.iloc[keep].sort_values(x)


def speedup_at_matched_throughput(
    df: pd.DataFrame, policy: str, baseline: str, levels: Sequence[float] | None = None
) -> pd.DataFrame:
    """Tokens/s per user of `policy` over `baseline` at equal throughput per GPU.

    Both frontiers are interpolated (log-linear in throughput) at each level, which defaults
    to the baseline frontier's own throughputs inside the range both policies reach.
    """
    a = pareto_frontier(df[df["policy"] == policy]).sort_values("tput_per_gpu")
    b = pareto_frontier(df[df["policy"] == baseline]).sort_values("tput_per_gpu")
    if len(a) < 2 or len(b) < 2:
        return pd.DataFrame(columns=["tput_per_gpu", "interactivity_policy", "interactivity_baseline", "speedup"])
    lo = max(a["tput_per_gpu"].min(), b["tput_per_gpu"].min())
    hi = min(a["tput_per_gpu"].max(), b["tput_per_gpu"].max())
    lv = np.asarray(levels if levels is not None else b["tput_per_gpu"], np.float64)
    lv = lv[(lv >= lo) & (lv <= hi)]
    ia = np.interp(np.log(lv), np.log(a["tput_per_gpu"]), a["interactivity"])
    ib = np.interp(np.log(lv), np.log(b["tput_per_gpu"]), b["interactivity"])
    return pd.DataFrame({"tput_per_gpu": lv, "interactivity_policy": ia,
                         "interactivity_baseline": ib, "speedup": ia / ib})


def write_sweep(out: Path, table: pd.DataFrame, meta: dict[str, Any]) -> Path:
    """Write `sweep.parquet`, `sweep.csv`, `sweep.yaml` (how it was run) and the Pareto plot."""
    with atomic_dir(out) as tmp:
        table.to_parquet(tmp / "sweep.parquet", index=False)
        table.to_csv(tmp / "sweep.csv", index=False, float_format="%.6g")
        (tmp / "sweep.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
        try:
            from sparksim.plotting.pareto import plot_pareto
        except ImportError:  # matplotlib is the optional `plot` extra
            pass
        else:
            plot_pareto(table, tmp / "pareto.png", title=str(meta.get("title", "")))
    return out
