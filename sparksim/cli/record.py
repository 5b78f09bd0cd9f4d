"""`sparksim record` and `sparksim train`: the drafter side (needs the torch extra)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the drafter commands to `app`."""
