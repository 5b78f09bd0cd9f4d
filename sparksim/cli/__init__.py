"""The `sparksim` command line: one Typer app, one module per command group."""

from __future__ import annotations

import typer

from sparksim.cli import plot, policies, profile, record, run, sweep, traces, validate

app = typer.Typer(
    name="sparksim",
    help="Serving simulator and scheduler testbed for confidence-scheduled speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
run.register(app)
sweep.register(app)
policies.register(app)
validate.register(app)
app.add_typer(profile.app, name="profile")
app.add_typer(traces.app, name="traces")
app.add_typer(plot.app, name="plot")
record.register(app)


def main() -> None:
    """Entry point of the `sparksim` console script."""
    app()
