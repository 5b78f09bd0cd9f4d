"""`sparksim policies`: list every registered verification policy."""

from __future__ import annotations

import typer
from rich.table import Table

from sparksim.cli.common import console


def list_policies() -> None:
    """List every registered policy with its rule and whether it is lossless."""
    from sparksim.policies import REGISTRY

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
    app.command("bias")(bias)


def bias(
    policy: list[str] = typer.Option([], "--policy", help="policies to test (default: all registered)"),
    trials: int = typer.Option(20_000, "--trials", min=100, help="Monte Carlo trials per policy"),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Run the bias lab (paper App. A): P(first token = A) must be 0.7 for a lossless policy."""
    from sparksim.biaslab import bias_table
    from sparksim.policies import REGISTRY

    names = policy or sorted(REGISTRY)
    df = bias_table(names, trials=trials, seed=seed)
    table = Table(title=f"bias lab: target P(A) = 0.7, {trials} trials each")
    for col in ("policy", "P(first token = A)", "± stderr", "z", "verdict"):
        table.add_column(col)
    for row in df.to_dict("records"):
        z = float(row["z"])
        verdict = "[red]biased[/]" if abs(z) > 4 else "[green]consistent with lossless[/]"
        table.add_row(str(row["label"]), f"{row['p_first_A']:.4f}", f"{row['stderr']:.4f}", f"{z:+.1f}", verdict)
    console.print(table)
