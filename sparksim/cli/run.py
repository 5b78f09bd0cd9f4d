"""`sparksim run`: simulate one scenario and write its results folder."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add `run` to `app`."""
