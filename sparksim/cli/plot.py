"""`sparksim plot ...` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="plot commands", no_args_is_help=True)
