"""`sparksim run`: simulate one scenario and write its results folder."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sparksim.cli.common import check_out, console, err_console, friendly_errors, plural

if TYPE_CHECKING:
    from sparksim.runner import RunResult

SHOWN = (
    ("output_throughput", "output throughput", "tok/s"),
    ("tput_per_gpu", "throughput per GPU", "tok/s/GPU"),
    ("interactivity", "interactivity", "tok/s/user"),
    ("mean_acceptance_length", "mean acceptance length", "tok/step"),
    ("verify_budget_per_request", "verify budget per request", "tok/step"),
    ("mean_ttft_ms", "mean TTFT", "ms"),
    ("p99_ttft_ms", "p99 TTFT", "ms"),
    ("mean_tpot_ms", "mean TPOT", "ms"),
    ("p99_tpot_ms", "p99 TPOT", "ms"),
    ("median_itl_ms", "median ITL", "ms"),
    ("mean_e2el_ms", "mean E2EL", "ms"),
    ("request_throughput", "request throughput", "req/s"),
    ("completed", "completed (steady window)", "requests"),
)


def summary_table(result: RunResult) -> Table:
    s = result.summary
    title = escape(f"{s['scenario']} · {s['policy_label']} · seed {s['seed']}")  # labels hold [...]
    table = Table(title=title, show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("unit")
    for key, label, unit in SHOWN:
        val: Any = s.get(key)
        if isinstance(val, float):
            val = f"{val:,.2f}"
        table.add_row(label, str(val), unit)
    if "request_goodput" in s:
        table.add_row("goodput (SLOs met)", f"{s['request_goodput']:.2f}", "req/s")
    cost = s.get("cost", {})
    drafter = cost.get("drafter")
    table.add_row("drafter paid for", "none" if not drafter else
                  f"{drafter['name']} ({drafter['kind']}, {plural(drafter['positions_drafted'], 'position')})", "")
    cap = cost.get("kv_capacity_tokens")
    table.add_row("KV capacity", "unlimited" if cap is None else f"{cap:,}",
                  "tokens" + (f" ({cost.get('kv_capacity_source')})" if cap is not None else ""))
    table.add_row("preemptions", str(cost.get("preemptions", 0)), "")
    return table


@friendly_errors
def run(
    scenario: Path | None = typer.Argument(None, help="scenario YAML (default: the embedded default)"),
    set_: list[str] = typer.Option([], "--set", help="override a key: --set workload.concurrency=128"),
    policy: str | None = typer.Option(None, "--policy", help="policy name or package.module:Class"),
    out: Path | None = typer.Option(None, "--out", help="results folder (default results/<name>-<policy>-seed<seed>)"),
    check: bool = typer.Option(False, "--check", help="check invariants INV-1..7 (runs twice for INV-5)"),
    strict: bool = typer.Option(False, "--strict", help="extrapolating a profile is an error"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar"),
) -> None:
    """Simulate a scenario, print its summary and write results/<run>/."""
    # the simulator's modules load when a run starts, so `sparksim run --help` stays quick
    from sparksim.invariants import InvariantError
    from sparksim.metrics import UNFINISHED_SHARE
    from sparksim.runner import (
        check_determinism,
        default_out_dir,
        load_inputs,
        load_scenario,
        simulate,
        write_results,
    )

    sc, base = load_scenario(scenario, set_, policy)
    check_out(out or default_out_dir(sc))  # before simulating, not after the whole run
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        inputs = load_inputs(sc, base, strict=strict)
        horizon = sc.run.duration_s
        with Progress(
            TextColumn("[bold]simulating[/] {task.description}"), BarColumn(),
            TextColumn("{task.fields[sim]:>8.1f}/{task.total:.0f} sim-s"), TimeElapsedColumn(),
            console=err_console, disable=quiet, transient=True,
        ) as bar:
            task = bar.add_task(f"{sc.name} · {sc.policy.name}", total=horizon, sim=0.0)
            result = simulate(
                sc, base, strict=strict, check=check, inputs=inputs,
                progress=lambda now: bar.update(task, completed=now, sim=now),
            )
    for w in caught:
        err_console.print(f"[yellow]warning:[/] {w.message}", highlight=False)
    s = result.summary
    arrived = s["steady_requests"] + s["steady_unfinished"]
    if arrived and s["steady_unfinished"] > UNFINISHED_SHARE * arrived:
        err_console.print(
            f"[yellow]warning:[/] {s['steady_unfinished']} of {arrived} requests that arrived in the "
            "steady window were unfinished at the horizon (long requests, or an overloaded system); "
            "latency figures cover finished requests only and are optimistic: lengthen "
            "run.cooldown_s or run.duration_s, or lower the load",
            highlight=False,
        )
    violations = list(result.violations)
    if check:
        violations += check_determinism(sc, base, result, strict)
    target = out or default_out_dir(sc)
    write_results(result, target)
    console.print(summary_table(result))
    console.print(
        f"{result.num_steps:,} engine steps in {result.wall_s:.1f} s wall "
        f"({result.num_steps / max(result.wall_s, 1e-9):,.0f} steps/s) → {target}",
        highlight=False,
    )
    if check:
        if violations:
            for v in violations:
                err_console.print(f"[bold red]{v}[/]", highlight=False)
            raise InvariantError(f"{len(violations)} invariant violation(s)")
        console.print("[green]invariants INV-1..7 hold[/]")


def register(app: typer.Typer) -> None:
    """Add `run` to `app`."""
    app.command("run")(run)
