"""`sparksim sweep`: run a scenario over a grid of overrides × policies and draw the Pareto frontier.

Finished points are kept in OUT/points/, so the same command run again (after Ctrl-C, a crash
or a kill) simulates only what is missing.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sparksim.cli.common import check_out, console, err_console, friendly_errors, print_warnings

EXIT_INTERRUPTED = 130  # what a shell reports for a command stopped by SIGINT
DEFAULT_VARY = "workload.concurrency=1,2,4,8,16,32,64,128,256"


@friendly_errors
def sweep(
    scenario: Path | None = typer.Argument(None, help="scenario YAML (default: the embedded default)"),
    vary: list[str] = typer.Option(
        [], "--vary",
        help="an axis KEY=V1,V2,...; several --vary make a grid (default, for a closed loop: "
             f"{DEFAULT_VARY})",
    ),
    policies: list[str] = typer.Option(
        [], "--policy",
        help="policy to compare, with parameters as NAME:param=value,param=value (repeat; default: "
             "MTP-1, static:gamma=1 on the profile's MTP module, and two-step)",
    ),
    set_: list[str] = typer.Option([], "--set", help="override applied to every run"),
    workers: int | None = typer.Option(None, "--workers", min=1, help="worker processes (default: CPUs)"),
    ray: bool = typer.Option(False, "--ray", help="run the points as Ray tasks (needs the ray extra)"),
    baseline: str | None = typer.Option(None, "--baseline", help="policy the speedups are against (default: the first)"),
    out: Path = typer.Option(
        Path("results/sweep"), "--out",
        help="sweep folder; finished points are kept in OUT/points/ and reused by a rerun",
    ),
) -> None:
    """Sweep load (or any keys) for several policies; write sweep.parquet/csv, pareto.png and report.html.

    Rerunning the same command reuses the points already finished (delete OUT/points/ to simulate them all again); Ctrl-C stops it, keeping them.
    """
    check_out(out)
    # the simulator's modules load when a sweep starts, so `sparksim sweep --help` stays quick
    from sparksim.errors import ConfigError
    from sparksim.plotting import PLOT_INSTALL
    from sparksim.report import REPORT_FILE
    from sparksim.sim.metrics import UNFINISHED_SHARE
    from sparksim.sim.runner import load_scenario
    from sparksim.studies.frontier import overloaded, series_speedups
    from sparksim.studies.sweep import (
        default_policies,
        grid,
        parse_vary,
        resolve_point,
        run_sweep,
        study_inputs,
        write_sweep,
    )
    from sparksim.studies.sweep_store import PointStore

    scenario_path = str(scenario) if scenario else None
    if not vary:
        kind = load_scenario(scenario_path, set_)[0].workload.kind
        if kind != "closed":
            raise ConfigError(f"workload.kind={kind}: give the axis to sweep, e.g. --vary workload.rate=1,2,4,8")
        vary = [DEFAULT_VARY]
    if not policies:
        policies, note = default_policies(scenario_path, set_)
        console.print(note, highlight=False, soft_wrap=True)
    if baseline is not None and baseline not in policies:  # checked before the sweep, not after it
        raise ConfigError(f"--baseline {baseline!r} is none of the swept policies "
                          f"({', '.join(map(repr, policies))}); give one of them as written")
    axes = parse_vary(vary)
    points = grid(axes, policies)
    store = PointStore(out / "points")
    try:
        with Progress(TextColumn("[bold]sweep[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err_console, transient=True) as bar:
            task = bar.add_task("points", total=len(points))
            table = run_sweep(
                scenario_path, set_, points, workers=workers,
                backend="ray" if ray else "process",
                progress=lambda done, total: bar.update(task, completed=done),
                store=store,
            )
    except KeyboardInterrupt:
        finished = store.reused + store.saved
        err_console.print(
            f"[yellow]interrupted:[/] {finished} of {len(points)} points finished and kept in "
            f"{escape(str(store.folder))}/; run the same command again to resume",
            highlight=False, soft_wrap=True,
        )
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if store.reused:
        console.print(f"reused {store.reused} of {len(points)} finished points from {store.folder}/",
                      highlight=False, soft_wrap=True)
    base = baseline or policies[0]
    resolved, _ = resolve_point(scenario_path, set_, points[0])  # for the figure's title
    refs, scenario_yaml = study_inputs(scenario_path, set_)
    meta = {"scenario": str(scenario) if scenario else "embedded default", "vary": vary,
            "policies": policies, "set": set_, "title": f"{scenario.stem if scenario else 'default'} sweep",
            "baseline": base, **refs, "workload": resolved.workload.model_dump(mode="json")}
    print_warnings(table["warnings"])
    write_sweep(out, table, meta, scenario=scenario_yaml)
    shown = Table(title=f"matched-throughput speedup of tok/s/user over {base}")
    shown.add_column("policy", overflow="fold")  # never cut, in a terminal of any width
    shown.add_column("tput/GPU range")
    shown.add_column("speedup range", justify="right", no_wrap=True)
    hot = overloaded(table)
    # the same series and points as the figure's speedups (`series_speedups`)
    for policy, sp in series_speedups(table, base)[1]:
        if len(sp) > 1:
            shown.add_row(policy, f"{sp['tput_per_gpu'].min():,.0f}–{sp['tput_per_gpu'].max():,.0f}",
                          f"×{sp['speedup'].min():.2f}–{sp['speedup'].max():.2f}")
        elif len(sp) == 1:
            shown.add_row(policy, f"{sp['tput_per_gpu'].iloc[0]:,.0f} (one point)",
                          f"×{sp['speedup'].iloc[0]:.2f}")
        else:
            shown.add_row(policy, "no overlap", "–")
    console.print(shown)
    if hot.any():
        console.print(f"{int(hot.sum())} point(s) left out of the speedups: over "
                      f"{UNFINISHED_SHARE:.0%} of their steady-window requests were unfinished at "
                      "the horizon", highlight=False)
    plotted, reported = (out / "pareto.png").exists(), (out / REPORT_FILE).exists()
    made = ["sweep.parquet", "sweep.csv", *(["pareto.png"] if plotted else []), *([REPORT_FILE] if reported else [])]
    console.print(f"{len(points)} points → {out}/ ({', '.join(made)})", highlight=False, soft_wrap=True)
    if not plotted:
        err_console.print(
            f"[yellow]no pareto.png:[/] matplotlib is not installed; to draw it: {escape(PLOT_INSTALL)}, "
            f"then sparksim plot pareto {escape(str(out))}",
            highlight=False, soft_wrap=True,
        )
    if not reported:
        err_console.print(
            f"[yellow]no {REPORT_FILE}:[/] plotly is not installed; to write it: {escape(PLOT_INSTALL)}, "
            f"then sparksim report {escape(str(out))}",
            highlight=False, soft_wrap=True,
        )


def register(app: typer.Typer) -> None:
    """Add `sweep` to `app`."""
    app.command("sweep")(sweep)
