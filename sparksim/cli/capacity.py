"""`sparksim capacity`: the highest request rate (or users) each policy carries within latency SLOs.

Runs are kept in OUT/points/ like a sweep's, so the same command run again (after Ctrl-C, or
with other bounds) simulates only what is missing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sparksim.cli.common import (
    check_out,
    console,
    err_console,
    friendly_errors,
    plural,
    print_warnings,
)

EXIT_INTERRUPTED = 130  # what a shell reports for a command stopped by SIGINT


def _value(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.4g}"


@friendly_errors
def capacity(
    scenario: Path | None = typer.Argument(None, help="scenario YAML (default: the embedded default)"),
    slo: list[str] = typer.Option(
        [], "--slo",
        help="a bound KEY=MS on a summary latency, e.g. p90_tpot_ms=50 (repeat; keys: mean/median/p90/p99 "
             "of ttft_ms, tpot_ms, e2el_ms)",
    ),
    policies: list[str] = typer.Option(
        [], "--policy",
        help="policy to compare, with parameters as NAME:param=value,param=value (repeat; default: "
             "MTP-1, static:gamma=1 on the profile's MTP module, and two-step)",
    ),
    set_: list[str] = typer.Option([], "--set", help="override applied to every run"),
    seeds: int = typer.Option(1, "--seeds", help="seeds per policy (the scenario's seed and the next ones)"),
    lo: float = typer.Option(1.0, "--lo", help="lowest load searched (requests/s, or users with --closed)"),
    hi: float | None = typer.Option(None, "--hi", help="highest load searched (default: 100 requests/s, 256 users)"),
    tol: float | None = typer.Option(None, "--tol", help="stop when the bracket is this narrow "
                                     "(default: 1 % of --hi, 1 user with --closed)"),
    closed: bool = typer.Option(False, "--closed", help="search closed-loop users instead of the Poisson rate"),
    workers: int | None = typer.Option(None, "--workers", min=1, help="worker processes (default: CPUs)"),
    out: Path = typer.Option(
        Path("results/capacity"), "--out",
        help="capacity folder; finished runs are kept in OUT/points/ and reused by a rerun",
    ),
) -> None:
    """Find each policy's capacity under latency SLOs by bisection; write capacity.csv/json.

    A run meets the SLOs when every bound holds and at most 5 % of its steady-window requests are unfinished at the horizon. Each seed is bisected on its own; the capacity is the mean over seeds ± standard error, and `lowest` the lowest seed's. Rerunning reuses every run already made (delete OUT/points/ to redo them); Ctrl-C stops it, keeping them.
    """
    check_out(out)
    # the simulator's modules load when the search starts, so `sparksim capacity --help` stays quick
    from sparksim.atomic import write_text
    from sparksim.sim.metrics import UNFINISHED_SHARE
    from sparksim.studies.capacity import BELOW, SLO_KEYS, capacity_rows, find_capacity, parse_slos
    from sparksim.studies.sweep import default_policies, study_inputs
    from sparksim.studies.sweep_store import PointStore

    bounds = parse_slos(slo)
    if not policies:
        policies, note = default_policies(str(scenario) if scenario else None, set_)
        console.print(note, highlight=False, soft_wrap=True)
    hi = hi if hi is not None else (256.0 if closed else 100.0)
    tol = tol if tol is not None else (1.0 if closed else hi / 100)
    what = "users" if closed else "requests/s"

    def load(x: float) -> str:
        return plural(x, "user") if closed else plural(x, "request") + "/s"
    store = PointStore(out / "points")
    scenario_path = str(scenario) if scenario else None
    try:
        with Progress(TextColumn("[bold]capacity[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err_console, transient=True) as bar:
            task = bar.add_task("round 1", total=None)
            results = find_capacity(
                scenario_path, set_, policies, bounds, lo=lo, hi=hi, tol=tol, seeds=seeds, closed=closed,
                workers=workers, store=store,
                progress=lambda rnd, done, total: bar.update(task, description=f"round {rnd}",
                                                             completed=done, total=total),
            )
    except KeyboardInterrupt:
        err_console.print(
            f"[yellow]interrupted:[/] {store.reused + store.saved} runs finished and kept in "
            f"{escape(str(store.folder))}/; run the same command again to resume",
            highlight=False, soft_wrap=True,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None

    rows = capacity_rows(results)
    refs, scenario_yaml = study_inputs(scenario_path, set_)
    slo_text = ", ".join(f"{k} ≤ {v:g}" for k, v in bounds.items())
    meta = {
        "scenario": scenario_path or "embedded default", "set": set_, "policies": policies,
        "slo": bounds, "load": "workload.concurrency" if closed else "workload.rate", "unit": what,
        "lo": lo, "hi": hi, "tol": tol, "seeds": results[0].seeds,
        "capacity": "mean over seeds of each seed's capacity (the highest load it met every SLO at, "
                    "within tol of one it missed at), with its standard error; lowest: the lowest seed's",
        "overloaded": f"a run with over {UNFINISHED_SHARE:.0%} of its steady-window requests unfinished "
                      "misses the SLOs",
        "slo_keys": list(SLO_KEYS),
        **refs,
    }
    detail = [{**row, "capacity": None if math.isnan(row["capacity"]) else row["capacity"],
               "capacity_se": None if math.isnan(row["capacity_se"]) else row["capacity_se"],
               "lowest": None if math.isnan(row["lowest"]) else row["lowest"],
               "per_seed": [{"seed": s, "capacity": b.capacity, "status": b.status}
                            for s, b in zip(res.seeds, res.brackets, strict=True)],
               "runs_made": [{"load": p.load, "seed": p.seed, "meets": p.meets, "why_not": p.why_not,
                              "warnings": list(p.warnings)} for p in res.probes]}
              for row, res in zip(rows, results, strict=True)]
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "capacity.csv", pd.DataFrame(rows).to_csv(index=False, float_format="%.6g"))
    write_text(out / "capacity.json", json.dumps({"meta": meta, "policies": detail}, indent=1) + "\n")
    write_text(out / "scenario.yaml", scenario_yaml)

    if store.reused:
        console.print(f"reused {store.reused} of {store.reused + store.saved} runs from {store.folder}/",
                      highlight=False, soft_wrap=True)
    shown = Table(title=f"capacity ({what}) under {slo_text}, {len(results[0].seeds)} seed(s)")
    shown.add_column("policy", overflow="fold")  # never cut, in a terminal of any width
    shown.add_column("capacity (mean ± SE)", justify="right", no_wrap=True)
    shown.add_column("lowest", justify="right", no_wrap=True)
    shown.add_column("per seed", justify="right")
    shown.add_column("runs", justify="right", no_wrap=True)
    for row, res in zip(rows, results, strict=True):
        if res.status == BELOW:
            cap = low = f"below {lo:g}"
        else:
            ge = "≥ " if res.status != "found" else ""
            se = "" if math.isnan(row["capacity_se"]) else f" ± {row['capacity_se']:.2g}"
            cap, low = f"{ge}{_value(row['capacity'])}{se}", f"{ge}{_value(row['lowest'])}"
        per_seed = ", ".join(f"below {lo:g}" if v is None else f"{v:.4g}" for v in res.per_seed())
        shown.add_row(escape(res.policy), cap, low, per_seed, str(row["runs"]))
    console.print(shown)
    for res in results:
        if res.status == BELOW:
            why = next(p.why_not for p in res.probes if p.load == lo and not p.meets)
            hint = ("; if that load is light, the window's last requests had no time to finish: "
                    "raise run.duration_s or run.cooldown_s") if why.startswith("overloaded") else ""
            console.print(f"{res.policy}: below the range: at {load(lo)} it already misses the SLOs "
                          f"({why}); lower --lo{hint}", highlight=False, soft_wrap=True)
        elif res.status != "found":
            console.print(f"{res.policy}: above the range: it meets the SLOs at --hi {load(hi)}; "
                          "raise --hi", highlight=False, soft_wrap=True)
    print_warnings([p.warnings for res in results for p in res.probes], "run")
    console.print(f"each seed bisected to within {load(tol)}; → {out}/ (capacity.csv, capacity.json; "
                  f"sparksim report {out} draws them)", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add `capacity` to `app`."""
    app.command("capacity")(capacity)
