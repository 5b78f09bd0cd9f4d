"""`sparksim profile ...` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="profile commands", no_args_is_help=True)
