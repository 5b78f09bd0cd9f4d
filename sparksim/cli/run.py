"""`sparksim run`: simulate one scenario and write its results folder."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sparksim.cli.common import check_out, console, err_console, friendly_errors, plural
from sparksim.metric_names import shown

if TYPE_CHECKING:
    from sparksim.sim.runner import RunResult

PROGRESS_EVERY_S = 5.0  # a piped run's progress lines: about one per this many wall seconds

SHOWN = (
    *shown("output_throughput", "tput_per_gpu", "interactivity", "mean_acceptance_length",
           "verify_budget_per_request", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
           "median_itl_ms", "mean_e2el_ms", "request_throughput"),
    # Two counts that part ways under overload (metrics.COUNTS_NOTE); the unit names the
    # summary.json key, so the table and the file cannot be read as saying different things.
    ("completed", "finished in window", "requests (completed)"),
    ("steady_requests", "arrived in window, finished", "requests (steady_requests)"),
    ("steady_unfinished", "arrived in window, unfinished", "requests (steady_unfinished)"),
)


def summary_table(result: RunResult) -> Table:
    """Return the table `run` and `live` print: the headline figures, then what the steps paid for.

    Fits an 80-column terminal: metric names are never wrapped or cut (the value and unit
    columns wrap instead), and a label too long for the title line wraps, not cut.
    """
    s = result.summary
    title = escape(f"{s['scenario']} · {s['policy_label']} · seed {s['seed']}")  # labels hold [...]
    table = Table(title=title, show_header=True)
    table.add_column("metric", no_wrap=True)
    table.add_column("value", justify="right", overflow="fold")
    table.add_column("unit", overflow="fold")
    for key, label, unit in SHOWN:
        val: Any = s.get(key)
        if isinstance(val, float):
            val = f"{val:,.2f}"
        elif isinstance(val, int):
            val = f"{val:,}"
        table.add_row(label, str(val), unit)
    if "request_goodput" in s:
        table.add_row("goodput (SLOs met)", f"{s['request_goodput']:.2f}", "req/s")
    if s.get("engine") == "live":
        # the live engine ran a real drafter and measured its time; it keeps no priced cost block
        live = s.get("live", {})
        drafter = live.get("drafter")
        table.add_row("drafter run", *(("none", "plain decoding") if not drafter else (
            str(drafter), f"{live.get('drafter_kind', '?')}, "
                          f"{plural(live.get('positions_drafted', 0), 'position')}; real, time measured")))
        return table
    cost = s.get("cost", {})
    drafter = cost.get("drafter")
    table.add_row("drafter paid for", *(("none", "") if not drafter else (
        drafter["name"], f"{drafter['kind']}, {plural(drafter['positions_drafted'], 'position')}")))
    cap = cost.get("kv_capacity_tokens")
    table.add_row("KV capacity", "unlimited" if cap is None else f"{cap:,}",
                  "tokens" + (f" ({cost.get('kv_capacity_source')})" if cap is not None else ""))
    table.add_row("preemptions", str(cost.get("preemptions", 0)), "")
    pc = s.get("prefix_cache")
    if pc is not None:
        rate = pc.get("hit_rate")
        table.add_row("prefix-cache hit rate", "n/a" if rate is None or rate != rate else f"{rate:.1%}",
                      f"cached / prompt tokens ({pc['where']})")
        table.add_row("prefill tokens saved", f"{pc['prefill_tokens_saved']:,}", "tokens")
    return table


def progress_lines(label: str, horizon_s: float, every_s: float | None = None) -> Callable[[float], None]:
    """Return a progress callback that prints a line to stderr at most every `every_s` wall
    seconds (default PROGRESS_EVERY_S).

    For a run whose stderr is not a terminal (a pipe, a CI log): a bar there would print
    nothing until the end, and a long run would look hung.
    """
    every_s = PROGRESS_EVERY_S if every_s is None else every_s
    start_s = last_s = time.monotonic()

    def show(now: float) -> None:
        nonlocal last_s
        wall_s = time.monotonic()
        if wall_s - last_s >= every_s and now < horizon_s:
            last_s = wall_s
            err_console.print(f"simulating {label}: {now:,.1f}/{horizon_s:g} sim-s, "
                              f"{wall_s - start_s:,.0f} s wall", highlight=False, soft_wrap=True)

    return show


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
    from sparksim.errors import OutputPathError
    from sparksim.sim.invariants import InvariantError
    from sparksim.sim.runner import (
        check_determinism,
        default_out_dir,
        load_inputs,
        load_scenario,
        records_folder,
        run_warnings,
        simulate,
        write_results,
    )

    sc, base = load_scenario(scenario, set_, policy)
    target = out or default_out_dir(sc)
    check_out(target)  # before simulating, not after the whole run
    if target.is_dir() and not (target / "summary.json").is_file():
        held = sorted(p.name for p in target.iterdir())
        if held:  # a run replaces its folder whole: never a folder of something else (a sweep's points/)
            raise OutputPathError(
                f"--out {target}: holds {', '.join(held[:4])}{', ...' if len(held) > 4 else ''}, not a run's "
                "results; a run replaces its folder whole, so give a new folder or an earlier run's")
    # the tables stream to files beside the results folder as the run goes (run.records.stream
    # auto or true), so a long run holds a row group of them, not the whole run's
    with records_folder(target) as records_dir:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            inputs = load_inputs(sc, base, strict=strict)
            horizon = sc.run.duration_s
            label = f"{sc.name} · {sc.policy.name}"
            piped = not quiet and not err_console.is_terminal  # a log file gets lines, not a bar
            with Progress(
                TextColumn("[bold]simulating[/] {task.description}"), BarColumn(),
                TextColumn("{task.fields[sim]:>8.1f}/{task.total:.0f} sim-s"), TimeElapsedColumn(),
                console=err_console, disable=quiet or piped, transient=True,
            ) as bar:
                task = bar.add_task(label, total=horizon, sim=0.0)
                result = simulate(
                    sc, base, strict=strict, check=check, inputs=inputs, records_dir=records_dir,
                    progress=progress_lines(label, horizon) if piped
                    else lambda now: bar.update(task, completed=now, sim=now),
                )
        given = run_warnings(caught, result.summary)
        for message in given:
            err_console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)
        violations = list(result.violations)
        if check:
            violations += check_determinism(sc, base, result, strict)
        write_results(result, target, given)
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
