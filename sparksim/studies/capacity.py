"""Capacity under SLOs: the highest load a replica carries while meeting latency percentile bounds.

The load is the Poisson request rate (`workload.rate`, open loop) or the number of users
(`workload.concurrency`, closed loop). A run meets the SLOs when every bound holds on its
summary (`p90_tpot_ms ≤ 50`, ...) and it was not overloaded (`frontier.overloaded`: more than
`metrics.UNFINISHED_SHARE` of the steady window's requests unfinished at the horizon, when
the latencies of the finished ones are optimistic).

Each (policy, seed) is bisected on its own, all of them in the same rounds, so one round is
one batch of parallel runs. A seed's capacity is the highest load it was seen meeting the
SLOs, within `tol` of the lowest it was seen failing them. Over seeds the capacity is their
mean ± standard error, with the lowest seed's beside it: the load every seed carried, the
highest at which the share of seeds meeting the SLOs is still 1.

Runs are sweep points (`sweep.SweepPoint`, `sweep.point_key`) kept in a `PointStore`, so a
rerun, or a rerun with other bounds, reuses every run it already made.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sparksim.errors import ConfigError
from sparksim.sim.metrics import PERCENTILES, UNFINISHED_SHARE
from sparksim.studies.frontier import overloaded
from sparksim.studies.sweep import SweepPoint, resolve_point, run_rows, simulate_keeping_warnings
from sparksim.studies.sweep_pool import start_pool, stop_pool
from sparksim.studies.sweep_store import PointStore

SLO_KEYS = tuple(f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "e2el")
                 for stat in ("mean", *(label for label, _ in PERCENTILES)))
CAPACITY_FORMAT = 3  # part of every run's key: raise it when a run's row changes meaning
BELOW, FOUND, ABOVE = "below the range", "found", "above the range"


def parse_slos(items: Sequence[str]) -> dict[str, float]:
    """Parse `KEY=BOUND` items (`p90_tpot_ms=50`) into bounds; an unknown key or a bound ≤ 0 is an error."""
    if not items:
        raise ConfigError(f"give at least one --slo KEY=BOUND (e.g. p90_tpot_ms=50); keys: {', '.join(SLO_KEYS)}")
    slos: dict[str, float] = {}
    for item in items:
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or not key or not raw:
            raise ConfigError(f"--slo {item!r}: expected KEY=BOUND (e.g. p90_tpot_ms=50)")
        if key not in SLO_KEYS:
            near = difflib.get_close_matches(key, SLO_KEYS, n=1, cutoff=0.5)
            hint = f" (did you mean {near[0]!r}?)" if near else f"; keys: {', '.join(SLO_KEYS)}"
            raise ConfigError(f"--slo {item!r}: unknown SLO key {key!r}{hint}")
        try:
            bound = float(raw)
        except ValueError:
            raise ConfigError(f"--slo {item!r}: bound {raw!r} is not a number") from None
        if not bound > 0 or not math.isfinite(bound):
            raise ConfigError(f"--slo {item!r}: the bound must be a positive number of ms, not {raw}")
        if key in slos:
            raise ConfigError(f"--slo {key} is given twice ({slos[key]:g} and {bound:g})")
        slos[key] = bound
    return slos


def miss_reason(row: dict[str, Any], slos: dict[str, float]) -> str:
    """Return why a run's row misses the SLOs ('' when it meets them): the first bound broken, or overload."""
    if bool(overloaded(pd.DataFrame([row])).iloc[0]):
        arrived = row["steady_requests"] + row["steady_unfinished"]
        waiting = row.get("steady_waiting", row["steady_unfinished"])
        return (f"overloaded ({waiting} of {arrived} steady-window requests still queued "
                f"at the horizon, over {UNFINISHED_SHARE:.0%})")
    for key, bound in slos.items():
        value = row.get(key)
        if value is None or not value <= bound:  # NaN: no request finished in the window
            return f"{key} {value:.4g} > {bound:g}" if value is not None and math.isfinite(value) \
                else f"{key} unmeasured (no steady-window request finished)"
    return ""


@dataclass
class Bracket:
    """The bisection for one threshold over [lo, hi]: the loads seen meeting and missing the SLOs.

    Round 0 tries both ends: `lo` missing means the threshold is below the range, `hi`
    meeting means above it. Then each round tries the middle of (passed, failed) until they
    are within `tol`; with `integer` the loads are whole numbers (users).
    """

    lo: float
    hi: float
    tol: float
    integer: bool = False
    passed: float | None = None  # highest load seen meeting the SLOs
    failed: float | None = None  # lowest load seen missing them

    @property
    def status(self) -> str:
        """Return BELOW, ABOVE, FOUND, or 'searching' while loads remain to try."""
        if self.failed is not None and self.failed <= self.lo:
            return BELOW
        if self.passed is not None and self.passed >= self.hi:
            return ABOVE
        if self.passed is not None and self.failed is not None and self.failed - self.passed <= self.tol:
            return FOUND
        return "searching"

    @property
    def capacity(self) -> float | None:
        """Return the highest load seen meeting the SLOs once the search is over, else None (or below)."""
        return self.passed if self.status in (FOUND, ABOVE) else None

    def next_loads(self) -> list[float]:
        """Return the loads to try in the next round (none once the search is over)."""
        if self.passed is None and self.failed is None:
            return [self.lo, self.hi]
        if self.status != "searching" or self.passed is None or self.failed is None:
            return []
        mid = (self.passed + self.failed) / 2
        return [float(math.floor(mid)) if self.integer else mid]

    def record(self, load: float, meets: bool) -> None:
        """Note that a run at `load` met (or missed) the SLOs."""
        if meets:
            self.passed = load if self.passed is None else max(self.passed, load)
        else:
            self.failed = load if self.failed is None else min(self.failed, load)


def bisect(brackets: Sequence[Bracket], evaluate: Callable[[list[tuple[int, float]]], list[bool]]) -> int:
    """Run every bracket's search to its end, one batch per round; return the number of rounds.

    `evaluate` gets a round's (bracket index, load) pairs and returns whether each met the
    SLOs, so a caller can run the whole round in parallel.
    """
    rounds = 0
    while todo := [(i, load) for i, b in enumerate(brackets) for load in b.next_loads()]:
        for (i, load), meets in zip(todo, evaluate(todo), strict=True):
            brackets[i].record(load, meets)
        rounds += 1
    return rounds


@dataclass
class Probe:
    """One run of a search: its load, seed and whether it met the SLOs (why not, if it did not)."""

    load: float
    seed: int
    why_not: str  # '' when it met them
    warnings: tuple[str, ...] = ()  # the messages of the warnings the run gave

    @property
    def meets(self) -> bool:
        """Return whether the run met every SLO."""
        return not self.why_not


@dataclass
class PolicyCapacity:
    """One policy's capacity: its seeds' searches and the runs they made."""

    policy: str
    seeds: list[int]
    brackets: list[Bracket]
    label: str = ""
    probes: list[Probe] = field(default_factory=list)

    @property
    def status(self) -> str:
        """Return BELOW if any seed is below the range, ABOVE if any is above (a lower bound), else FOUND."""
        statuses = {b.status for b in self.brackets}
        return BELOW if BELOW in statuses else ABOVE if ABOVE in statuses else FOUND

    def per_seed(self) -> list[float | None]:
        """Return each seed's capacity (None below the range; `hi` above it)."""
        return [b.capacity for b in self.brackets]

    def mean_se(self) -> tuple[float, float]:
        """Return the mean capacity over seeds and its standard error (NaN below the range or for one seed)."""
        values = self.per_seed()
        if any(v is None for v in values):
            return math.nan, math.nan
        arr = np.array(values, dtype=np.float64)
        se = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else math.nan
        return float(arr.mean()), se

    def lowest(self) -> float:
        """Return the lowest seed's capacity (NaN when a seed is below the range)."""
        values = self.per_seed()
        return math.nan if any(v is None for v in values) else float(min(v for v in values if v is not None))


def open_or_closed(scenario_path: str | None, base_sets: Sequence[str], closed: bool) -> str:
    """Return the `workload.kind` the searched runs use: closed, or the scenario's open-loop kind (Poisson by default)."""
    if closed:
        return "closed"
    sc, _ = resolve_point(scenario_path, base_sets, SweepPoint("static", ()))
    if sc.workload.kind == "replay":
        raise ConfigError("workload.kind=replay has no rate to search; use a poisson or gamma "
                          "scenario, or --closed for users")
    return sc.workload.kind if sc.workload.kind in ("poisson", "gamma") else "poisson"


def check_range(lo: float, hi: float, tol: float, closed: bool) -> None:
    """Raise ConfigError unless [lo, hi] is a non-empty range of loads and `tol` a positive step."""
    what = "users" if closed else "requests/s"
    if not math.isfinite(lo) or lo <= 0:
        raise ConfigError(f"--lo {lo:g}: the lowest load must be a positive number of {what}")
    if not math.isfinite(hi):
        raise ConfigError(f"--hi {hi:g}: the highest load must be a finite number of {what}")
    if hi <= lo:
        raise ConfigError(f"--lo {lo:g} --hi {hi:g}: the search range is empty (--hi must exceed --lo)")
    if not tol > 0 or not math.isfinite(tol):
        raise ConfigError(f"--tol {tol:g}: must be positive")
    if closed and (lo != int(lo) or hi != int(hi) or tol < 1):
        raise ConfigError(f"--closed searches whole users: --lo {lo:g}, --hi {hi:g} must be whole "
                          f"and --tol {tol:g} at least 1")


def load_sets(kind: str, load: float) -> tuple[str, ...]:
    """Return the overrides that set a run's load: users for a closed loop, else the request rate."""
    if kind == "closed":
        return ("workload.kind=closed", f"workload.concurrency={int(load)}")
    # positional: '0.00001', never '1e-05' (YAML 1.1 would read that as a string)
    return (f"workload.kind={kind}", f"workload.rate={np.format_float_positional(load, trim='-')}")


def run_capacity_point(scenario_path: str | None, base_sets: Sequence[str], point: SweepPoint) -> dict[str, Any]:
    """Simulate one run and return what its SLO check needs (runs in a worker process).

    Not `sweep.run_point`: a sweep's row keeps only some percentiles (no p90, no median).
    """
    s, given = simulate_keeping_warnings(*resolve_point(scenario_path, base_sets, point))
    row: dict[str, Any] = {"policy": point.policy, "label": s["policy_label"], "seed": s["seed"], "warnings": given}
    for key in (*SLO_KEYS, "steady_requests", "steady_unfinished", "steady_waiting"):
        row[key] = s.get(key)
    return row


def run_points(
    scenario_path: str | None,
    base_sets: Sequence[str],
    points: Sequence[SweepPoint],
    *,
    store: PointStore,
    pool: ProcessPoolExecutor | None,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Return each point's row: read back from `store`, or simulated (in `pool`) and saved at once.

    The sweep's own loop (`sweep.run_rows`) with capacity's row; the keys carry a prefix, as
    a capacity row holds other columns than a sweep row and `OUT/points/` may be shared.
    """
    return run_rows(scenario_path, base_sets, points, store=store, pool=pool, workers=1,
                    row=run_capacity_point, key_prefix=f"capacity{CAPACITY_FORMAT}-",
                    progress=progress, check_inputs=False)


def find_capacity(
    scenario_path: str | None,
    base_sets: Sequence[str],
    policies: Sequence[str],
    slos: dict[str, float],
    *,
    lo: float,
    hi: float,
    tol: float,
    seeds: int = 1,
    closed: bool = False,
    workers: int | None = None,
    store: PointStore,
    progress: Callable[[int, int, int], None] | None = None,
) -> list[PolicyCapacity]:
    """Bisect each policy × seed for the highest load meeting `slos`; return one result per policy.

    Seeds are the scenario's seed and the next `seeds - 1`. Every input is checked before
    anything runs; `progress(round, done, total)` follows each round's runs.
    """
    from sparksim.sim.runner import load_inputs

    if not policies:
        raise ConfigError("give at least one --policy")
    if len(set(policies)) < len(policies):
        raise ConfigError(f"a --policy is given twice: {', '.join(policies)}")
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: at least 1")
    check_range(lo, hi, tol, closed)
    kind = open_or_closed(scenario_path, base_sets, closed)
    first_seed = resolve_point(scenario_path, base_sets, SweepPoint(policies[0], ()))[0].seed
    seed_list = [first_seed + k for k in range(seeds)]
    results = [PolicyCapacity(p, seed_list, [Bracket(lo, hi, tol, closed) for _ in seed_list]) for p in policies]
    for res in results:  # a bad policy, parameter or input fails before anything runs
        load_inputs(*resolve_point(scenario_path, base_sets, SweepPoint(res.policy, load_sets(kind, lo))))
    flat = [(res, seed, b) for res in results for seed, b in zip(res.seeds, res.brackets, strict=True)]
    rounds = 0
    num_workers = min(workers or os.cpu_count() or 1, 2 * len(flat))  # round 0 runs both ends
    pool = start_pool(num_workers) if num_workers > 1 else None

    def evaluate(todo: list[tuple[int, float]]) -> list[bool]:
        nonlocal rounds
        rounds += 1
        points = [SweepPoint(flat[i][0].policy, (f"seed={flat[i][1]}", *load_sets(kind, load))) for i, load in todo]
        rows = run_points(scenario_path, base_sets, points, store=store, pool=pool,
                          progress=(lambda done, total: progress(rounds, done, total)) if progress else None)
        met = []
        for (i, load), row in zip(todo, rows, strict=True):
            res, seed, _ = flat[i]
            res.label = row.get("label", res.policy)
            res.probes.append(Probe(load, seed, miss_reason(row, slos), tuple(row.get("warnings", ()))))
            met.append(res.probes[-1].meets)
        return met

    try:
        bisect([b for _, _, b in flat], evaluate)
    except BaseException:
        if pool is not None:
            stop_pool(pool)  # Ctrl-C or a failed run: do not wait for the running ones
        raise
    if pool is not None:
        pool.shutdown()
    return results


def capacity_rows(results: Sequence[PolicyCapacity]) -> list[dict[str, Any]]:
    """Return one flat row per policy (capacity.csv): mean ± SE, lowest, per-seed values, runs used."""
    rows = []
    for res in results:
        mean, se = res.mean_se()
        rows.append({
            "policy": res.policy, "label": res.label, "status": res.status,
            "capacity": mean, "capacity_se": se, "lowest": res.lowest(),
            "per_seed": ";".join("below" if v is None else f"{v:.6g}" for v in res.per_seed()),
            "seeds": ";".join(str(s) for s in res.seeds), "runs": len(res.probes),
        })
    return rows
