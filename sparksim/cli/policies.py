"""`sparksim policies`: list every registered verification policy."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from sparksim.cli.common import console, err_console, friendly_errors


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


@friendly_errors
def bias(
    policy: list[str] = typer.Option(
        [], "--policy",
        help="policy to test, with parameters as NAME:param=value,... or FILE.py:Class:param=value "
             "(repeat; default: every registered policy)"),
    trials: int = typer.Option(20_000, "--trials", min=100, help="Monte Carlo trials per policy"),
    seed: int = typer.Option(0, "--seed", help="master seed; each policy draws its own stream from it"),
) -> None:
    """Run the bias lab (paper App. A): P(first token = A) must be 0.7 for a lossless policy."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sparksim.biaslab import bias_table
    from sparksim.policies import REGISTRY, make_policy, parse_policy_spec

    names = policy or sorted(REGISTRY)
    for spec in names:  # a bad name or parameter fails in one line before any trial
        name, params = parse_policy_spec(spec)
        params.pop("drafter", None)
        make_policy(name, 2, params)
    with Progress(TextColumn("[bold]bias lab[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task("", total=trials * len(names))
        offset = {spec: i * trials for i, spec in enumerate(names)}
        df = bias_table(names, trials=trials, seed=seed, progress=lambda spec, done: bar.update(
            task, completed=offset[spec] + done, description=spec))
    table = Table(title=f"bias lab: target P(A) = 0.7, {trials} trials each")
    table.add_column("policy", overflow="fold", min_width=24)  # the full label, never cut
    for col in ("P(first token = A)", "± stderr", "z", "verdict"):
        table.add_column(col)
    for row in df.to_dict("records"):
        z = float(row["z"])
        verdict = "[red]biased[/]" if abs(z) > 4 else "[green]consistent with lossless[/]"
        # escape: "[not lossless]" in a label is text, not rich markup
        table.add_row(escape(str(row["label"])), f"{row['p_first_A']:.4f}", f"{row['stderr']:.4f}",
                      f"{z:+.1f}", verdict)
    console.print(table)
