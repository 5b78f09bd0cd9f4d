"""`sparksim report`: write a results folder's report.html, one page to explore in a browser."""

from __future__ import annotations

from pathlib import Path

import typer

from sparksim.cli.common import check_out, console, friendly_errors


@friendly_errors
def report(
    folder: Path = typer.Argument(..., help="a sweep, capacity or run folder (sparksim sweep / capacity / run --out)"),
    out: Path | None = typer.Option(None, "--out", help="the HTML file to write (default FOLDER/report.html)"),
) -> None:
    """Write one self-contained HTML page for a sweep, capacity or run folder (opens without a network).

    A sweep's page has the interactive Pareto frontier, the budget against load, the matched-throughput speedups and a sortable table of every point; a capacity search's, each policy's capacity and every run it made; a run's, its summary, latencies and budget over time. Each ends with the scenario, the cards of its profile and traces, and every warning the runs gave.
    """
    from sparksim.report import REPORT_FILE, write_report

    target = out or folder / REPORT_FILE
    check_out(target, kind="file")
    written = write_report(folder, target)
    console.print(f"report → {written} (open it in a browser)", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add `report` to `app`."""
    app.command("report")(report)
