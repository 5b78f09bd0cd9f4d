"""`sparksim traces ...` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="traces commands", no_args_is_help=True)
