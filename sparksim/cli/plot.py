"""`sparksim plot ...` commands."""

from __future__ import annotations

from pathlib import Path

import typer

from sparksim.cli.common import console, friendly_errors

app = typer.Typer(help="plot commands", no_args_is_help=True)


@app.command("profile")
@friendly_errors
def profile(
    paths: list[Path] = typer.Argument(..., help="one or more profile folders, overlaid"),
    out: Path = typer.Option(Path("sps-profile.png"), "--out", help="PNG file to write"),
    context: float | None = typer.Option(None, "--context", help="plot only the profiled context nearest this (default: every context)"),
) -> None:
    """Plot SPS(B) and tokens/s against B (log x), marking graph sizes, the knee and cliffs."""
    from sparksim.plotting.profile_plot import plot_profiles

    written = plot_profiles(paths, out, context=context)
    console.print(f"[green]wrote[/] {written}", highlight=False)
