"""`sparksim policies`: list every registered verification policy."""

from __future__ import annotations

import typer
from rich.table import Table

from sparksim.cli.common import console
from sparksim.policies import REGISTRY


def list_policies() -> None:
    """List every registered policy with its rule and whether it is lossless."""
    table = Table(title="verification policies")
    table.add_column("name", style="bold")
    table.add_column("lossless")
    table.add_column("rule")
    table.add_column("source")
    for name in sorted(REGISTRY):
        cls = REGISTRY[name]
        lossless = "upper bound" if cls.upper_bound else ("yes" if cls.lossless else "NO")
        table.add_row(name, lossless, cls.rule, cls.paper)
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("policies")(list_policies)
