"""`sparksim validate PATH`: check a profile, a trace set or a scenario file; report every problem."""

from __future__ import annotations

from pathlib import Path

import typer

from sparksim.cli.common import console, err_console
from sparksim.validation import validate_path


def validate(path: Path = typer.Argument(..., help="profile folder, trace-set folder or scenario.yaml")) -> None:
    """Check PATH and report every problem found; exit 0 if valid, 1 otherwise."""
    kind, problems = validate_path(path)
    if problems:
        err_console.print(f"[bold red]{path}[/] ({kind}): {len(problems)} problem(s)", highlight=False)
        for p in problems:
            err_console.print(f"  - {p}", highlight=False, markup=False)
        raise typer.Exit(1)
    console.print(f"[green]ok[/] {path} ({kind})", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
