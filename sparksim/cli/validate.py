"""`sparksim validate`: check a profile, a trace set or a scenario file; report every problem."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from sparksim.cli.common import console, err_console


def validate(
    path: Path = typer.Argument(..., help="profile folder, trace-set folder or scenario.yaml"),
    strict: bool = typer.Option(False, "--strict", help="as `run --strict`: extrapolating a profile is a problem"),
) -> None:
    """Check PATH and report every problem found; exit 0 if valid, 1 otherwise.

    A scenario is checked on `sparksim run`'s own loading path, so what `run` would refuse before simulating is a problem here, and what it would warn about is a warning.
    """
    from sparksim.sim.validation import validate_path

    report = validate_path(path, strict=strict)
    for w in report.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False, soft_wrap=True)
    if report.problems:
        err_console.print(f"[bold red]{path}[/] ({report.kind}): {len(report.problems)} problem(s)",
                          highlight=False)
        for p in report.problems:
            err_console.print(f"  - {p}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)
    console.print(f"[green]ok[/] {path} ({report.kind})", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
