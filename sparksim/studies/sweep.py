"""Sweeps: one scenario run over a grid of overrides × policies, in parallel, summarised in one table.

Each grid point is an independent simulation at the scenario's seed (so policies at one
point see the same users and requests: paired comparisons), so a sweep is embarrassingly
parallel: local worker processes by default, or Ray tasks when a Ray
cluster is available (`backend="ray"`, `RAY_ADDRESS` for an existing one), with the same
function on both; the inputs travel with Ray's tasks (`sparksim.studies.sweep_ray`).
Each finished point is saved at once (`sweep_store.PointStore`), so a rerun resumes; local
workers ignore Ctrl-C and die with the sweep (`sweep_pool`).
Pareto analysis lives here too: frontiers of throughput per GPU against tokens per second
per user, and matched-throughput speedups between policies.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import yaml

from sparksim.atomic import atomic_file, write_text
from sparksim.config import parse_value
from sparksim.errors import ConfigError, MissingExtraError
from sparksim.studies.frontier import swept_columns
from sparksim.studies.sweep_pool import start_pool, stop_pool
from sparksim.studies.sweep_store import PACKAGE, PointStore, code_fingerprint, fingerprint_files

if TYPE_CHECKING:
    from sparksim.config import Scenario

ROW_METRICS = (
    "output_throughput", "tput_per_gpu", "interactivity", "mean_tpot_ms", "p99_tpot_ms",
    "mean_ttft_ms", "p99_ttft_ms", "median_itl_ms", "mean_e2el_ms", "mean_acceptance_length",
    "verify_budget_per_request", "request_throughput", "completed", "engine_steps",
    # the steady window's census: a point with many unfinished had a queue still growing
    "steady_requests", "steady_unfinished", "steady_waiting",
)
POINT_FORMAT = 4  # part of every point's key: raise it when a row's contents change meaning
WARNINGS_FILE = "warnings.json"  # beside the table: each point's warnings (the table has none)


@dataclass(frozen=True)
class SweepPoint:
    """One simulation of a sweep: a policy spec and the overrides of its grid point."""

    policy: str  # "name" or "name:param=value,param=value"
    overrides: tuple[str, ...]


def default_policies(scenario_path: str | None, base_sets: Sequence[str]) -> tuple[list[str], str]:
    """Return the policies a study compares when none is given, and a line saying what the baseline is.

    The baseline is MTP-1: static γ = 1 paying the profile's MTP module (its first drafter of
    kind `mtp`). A profile without one falls back to static γ = 1 on its default drafter, and
    the line says so, since that baseline pays a drafter MTP-1 would not.
    """
    from sparksim.config import resolve_path
    from sparksim.cost.profile import load_profile
    from sparksim.sim.runner import load_scenario

    sc, base = load_scenario(scenario_path, base_sets)
    profile = load_profile(resolve_path(sc.profile, base), mode=sc.lookup)
    mtp = next((name for name, table in profile.drafters.items() if table.kind == "mtp"), None)
    if mtp is not None:
        baseline = f"static:gamma=1,drafter={mtp}"
        note = f"baseline: MTP-1 ({baseline}: static γ = 1 on the profile's MTP module {mtp!r})"
    else:
        baseline = "static:gamma=1"
        table = profile.drafter()
        paid = table.name if table is not None else "no drafter (drafting is free)"
        note = (f"baseline: static:gamma=1 paying {paid}; profile {profile.name!r} has no MTP module, "
                "so this is not MTP-1")
    return [baseline, "two-step"], note


def study_inputs(scenario_path: str | None, base_sets: Sequence[str]) -> tuple[dict[str, Any], str]:
    """Return what a study (sweep, capacity search) records of its inputs, and its scenario's YAML.

    The first: `profile` and `traces` as the scenario names them and `inputs`, the folders
    they resolved to, so `sparksim report` finds their cards from anywhere. The second:
    the scenario with `base_sets` applied, before any point's policy and swept values.
    """
    from sparksim.config import resolve_path
    from sparksim.sim.runner import load_scenario

    sc, base = load_scenario(scenario_path, base_sets)
    refs = {"profile": sc.profile, "traces": sc.traces,
            "inputs": {"profile": str(resolve_path(sc.profile, base).resolve()),
                       "traces": str(resolve_path(sc.traces, base).resolve())}}
    return refs, sc.to_yaml()


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


def resolve_point(
    scenario_path: str | None, base_sets: Sequence[str], point: SweepPoint
) -> tuple[Scenario, Path | None]:
    """Return the scenario one point simulates (its overrides and policy applied) and its folder."""
    from sparksim.sim.runner import load_scenario

    return load_scenario(scenario_path, [*base_sets, *point.overrides], point.policy)


def point_key(scenario: Scenario, base: Path | None, point: SweepPoint) -> str:
    """Return the hash that names a finished point: everything its row depends on.

    That is the resolved scenario, the policy spec and overrides (they label the row), where
    relative paths resolve (the scenario's folder, then the cwd), the input files as they
    are now (path, size, mtime) and sparksim's own code, so a changed profile or cost model
    is simulated again rather than read back.
    """
    from sparksim.config import resolve_path

    refs = [scenario.profile, scenario.traces, scenario.cluster.prefill.profile,
            scenario.workload.arrivals_csv]
    inputs = fingerprint_files([resolve_path(r, base) for r in refs if r] + policy_source(scenario.policy.name))
    ident = {"format": POINT_FORMAT, "scenario": scenario.to_yaml(), "policy": point.policy,
             "overrides": list(point.overrides), "base": str(base), "cwd": os.getcwd(),
             "inputs": inputs, "code": code_fingerprint()}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


def policy_source(name: str) -> list[Path]:
    """The file of a plug-in policy (`path/file.py:Class`, `package.module:Class`) outside
    sparksim, whose edits must not let a point be read back; none for a built-in policy
    (sparksim's own code is fingerprinted whole)."""
    if ":" not in name:
        return []
    from sparksim.policies import resolve

    source = inspect.getsourcefile(resolve(name))
    if source is None or Path(source).resolve().is_relative_to(PACKAGE):
        return []
    return [Path(source)]


def simulate_keeping_warnings(scenario: Scenario, base: Path | None) -> tuple[dict[str, Any], list[str]]:
    """Simulate `scenario`; return its summary and the messages of the warnings it gave, each once.

    A worker process keeps them for its row rather than printing them: its stderr would
    interleave them with the other points'.
    """
    from sparksim.sim.runner import simulate

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = simulate(scenario, base).summary
    return summary, list(dict.fromkeys(str(w.message) for w in caught))


def run_point(scenario_path: str | None, base_sets: Sequence[str], point: SweepPoint) -> dict[str, Any]:
    """Simulate one sweep point and return its flat summary row (runs in a worker process).

    The row's "warnings" holds the messages of the warnings the run gave, each once.
    """
    s, given = simulate_keeping_warnings(*resolve_point(scenario_path, base_sets, point))
    row: dict[str, Any] = {"policy": point.policy, "label": s["policy_label"],
                           "lossless": s["lossless"], "upper_bound": s["upper_bound"]}
    for ov in point.overrides:
        key, _, val = ov.partition("=")
        row[key] = parse_value(val)  # as the scenario read it: `1e1` is 10.0, not text
    drafter = s.get("cost", {}).get("drafter")
    row["drafter"] = drafter["name"] if drafter else "none"  # the draft table this row paid for
    for m in ROW_METRICS:
        row[m] = s.get(m)
    row["warnings"] = given
    return row  # no wall-clock figures: the table is reproducible byte for byte


RowFn = Callable[[str | None, Sequence[str], SweepPoint], dict[str, Any]]

# How long the sweep's main thread waits for a point before it looks up again. Python runs a
# signal's handler (Ctrl-C's KeyboardInterrupt) in the main thread only, and a signal the
# kernel hands to another thread (the pool's manager, its queue feeder, the progress bar's
# refresh) does not end the main thread's wait: an unbounded wait for the next point would
# leave Ctrl-C unanswered until a point finished, minutes later on a long sweep.
WAKE_S = 0.25


def run_sweep(
    scenario_path: str | None,
    base_sets: Sequence[str],
    points: Sequence[SweepPoint],
    *,
    workers: int | None = None,
    backend: str = "process",
    progress: Callable[[int, int], None] | None = None,
    store: PointStore | None = None,
) -> pd.DataFrame:
    """Run every point (`run_rows`); return the table, one row per point in `points` order."""
    return pd.DataFrame(run_rows(scenario_path, base_sets, points, workers=workers, backend=backend,
                                 progress=progress, store=store))


def run_rows(
    scenario_path: str | None,
    base_sets: Sequence[str],
    points: Sequence[SweepPoint],
    *,
    workers: int | None = None,
    backend: str = "process",
    progress: Callable[[int, int], None] | None = None,
    store: PointStore | None = None,
    row: RowFn = run_point,
    key_prefix: str = "",
    pool: ProcessPoolExecutor | None = None,
    check_inputs: bool = True,
) -> list[dict[str, Any]]:
    """Run every point; return one row per point in `points` order.

    With a `store`, points it already holds are read back instead of simulated (counted in
    `store.reused`) and each simulated point is saved the moment it finishes, so a sweep
    stopped by Ctrl-C (KeyboardInterrupt, raised once the workers are ended) or a crash
    resumes where it stopped.

    `row` makes a point's row (`run_point`; `sparksim capacity` keeps other columns, under
    keys starting with `key_prefix` so one store never hands a command another's row). A
    caller that runs many batches may hold its own `pool` (left running) and check the
    inputs once itself (`check_inputs=False`).
    """
    if not points:
        raise ConfigError("the sweep is empty: give at least one policy and one grid point")
    from sparksim.sim.runner import load_inputs

    rows: list[dict[str, Any] | None] = [None] * len(points)
    keys: list[str] = []
    if store is not None:
        for i, p in enumerate(points):
            keys.append(key_prefix + point_key(*resolve_point(scenario_path, base_sets, p), p))
            rows[i] = store.get(keys[i])
    todo = [i for i, r in enumerate(rows) if r is None]
    if check_inputs:  # fail fast on a bad scenario/policy before spawning anything
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # each point's row keeps the warnings it gives
            for point in {points[i].policy: points[i] for i in todo}.values():
                load_inputs(*resolve_point(scenario_path, base_sets, point))
    done = len(points) - len(todo)
    if progress:  # the first report: points read back (0 when none)
        progress(done, len(points))

    def finish(i: int, result: dict[str, Any]) -> None:
        nonlocal done
        rows[i] = result
        if store is not None:
            store.put(keys[i], result)
        done += 1
        if progress:
            progress(done, len(points))

    own_pool = pool is None and backend == "process" and (workers or os.cpu_count() or 1) > 1
    if backend == "ray" and todo:
        try:
            import ray  # optional extra
        except ImportError:
            raise MissingExtraError('ray is not installed; install the ray extra: pip install -e ".[ray]"') from None

        from sparksim.studies.sweep_ray import run_shipped, ship

        if not ray.is_initialized():  # RAY_ADDRESS: an existing cluster; else a local one
            ray.init(address=os.environ.get("RAY_ADDRESS") or None, ignore_reinit_error=True)
        # the workers may be on nodes without this disk: every input goes with the tasks
        bundle, how = ship(scenario_path, base_sets, [points[i] for i in todo])
        blobs = ray.put(bundle.blobs)
        remote = ray.remote(run_shipped).options(scheduling_strategy="SPREAD")
        refs = {remote.remote(row, blobs, scenario_path, list(base_sets), points[i], how[k]): i
                for k, i in enumerate(todo)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=WAKE_S)  # see WAKE_S
            for ref in ready:
                finish(refs[ref], ray.get(ref))
    elif len(todo) > 1 and (pool is not None or own_pool):
        running = pool or start_pool(min(workers or os.cpu_count() or 1, len(todo)))
        try:
            futs = {running.submit(row, scenario_path, list(base_sets), points[i]): i for i in todo}
            waiting = set(futs)
            while waiting:
                done_now, waiting = wait(waiting, timeout=WAKE_S, return_when=FIRST_COMPLETED)
                for fut in sorted(done_now, key=futs.__getitem__):
                    finish(futs[fut], fut.result())
        except BaseException:
            if running is not pool:
                stop_pool(running)  # Ctrl-C or a failed point: do not wait for the running points
            raise
        if running is not pool:
            running.shutdown()
    else:
        for i in todo:
            finish(i, row(scenario_path, base_sets, points[i]))
    return [r for r in rows if r is not None]


def point_warnings(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Return the points of `table` that gave warnings: policy, label, swept values and messages."""
    varied = swept_columns(table)
    return [{"policy": row["policy"], "label": row.get("label", row["policy"]),
             **{k: row[k] for k in varied}, "warnings": list(row["warnings"])}
            for row in table.to_dict("records") if isinstance(row["warnings"], list) and row["warnings"]]


def write_sweep(out: Path, table: pd.DataFrame, meta: dict[str, Any], *, scenario: str | None = None) -> Path:
    """Write `sweep.parquet`, `sweep.csv`, `sweep.yaml` (how it was run), then the Pareto plot and the report.

    The table comes first and each file is written atomically, so a plotting failure never
    costs the simulations. The points' warnings (a `warnings` column, as `run_point` makes
    it) go to WARNINGS_FILE, not into the table; `scenario` (the resolved scenario's YAML)
    to `scenario.yaml`. Without matplotlib (the `plot` extra) there is no `pareto.png`, and
    without plotly no `report.html`, not even ones left from an earlier sweep; `points/`
    (the finished points) is kept.
    """
    out.mkdir(parents=True, exist_ok=True)
    warned = point_warnings(table) if "warnings" in table.columns else None
    table = table.drop(columns="warnings", errors="ignore")
    with atomic_file(out / "sweep.parquet") as tmp:
        table.to_parquet(tmp, index=False)
    with atomic_file(out / "sweep.csv") as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    write_text(out / "sweep.yaml", yaml.safe_dump(meta, sort_keys=False))
    # files an earlier sweep left would not describe this table: replaced, or removed
    warned_json = None if warned is None else json.dumps(warned, indent=1, default=str) + "\n"
    for name, text in ((WARNINGS_FILE, warned_json), ("scenario.yaml", scenario)):
        if text is None:
            (out / name).unlink(missing_ok=True)
        else:
            write_text(out / name, text)
    from sparksim.plotting.pareto import plot_pareto
    from sparksim.report import REPORT_FILE, write_report

    try:
        plot_pareto(table, out / "pareto.png", meta=meta, baseline=meta.get("baseline"))
    except MissingExtraError:
        (out / "pareto.png").unlink(missing_ok=True)  # an old figure would not show this table
    try:
        write_report(out)
    except MissingExtraError:
        (out / REPORT_FILE).unlink(missing_ok=True)
    return out
