"""`sparksim plot ...` commands."""

from __future__ import annotations

from pathlib import Path

import typer

from sparksim.cli.common import check_out, console, friendly_errors

app = typer.Typer(help="Plot SPS profiles and sweep Pareto frontiers (needs matplotlib: the plot extra).", no_args_is_help=True)


@app.command("profile")
@friendly_errors
def profile(
    paths: list[Path] = typer.Argument(..., help="one or more profile folders, overlaid"),
    out: Path = typer.Option(Path("results/sps-profile.png"), "--out", help="PNG file to write"),
    context: float | None = typer.Option(None, "--context", help="plot only the profiled context nearest this (default: every context)"),
) -> None:
    """Plot SPS(B) and tokens/s against B (log x), marking graph sizes, the knee and cliffs."""
    from sparksim.plotting.profile_plot import plot_profiles

    check_out(out, kind="file")
    written = plot_profiles(paths, out, context=context)
    console.print(f"[green]wrote[/] {written}", highlight=False)


@app.command("pareto")
@friendly_errors
def pareto(
    sweep_dir: Path = typer.Argument(..., help="a folder written by `sparksim sweep` (sweep.parquet)"),
    out: Path | None = typer.Option(None, "--out", help="PNG file (default: SWEEP_DIR/pareto.png)"),
    baseline: str | None = typer.Option(None, "--baseline", help="policy the speedups are against (default: the sweep's)"),
) -> None:
    """Plot throughput per GPU against tok/s per user for every policy of a sweep, with frontiers."""
    import pandas as pd

    from sparksim.config import read_yaml_mapping
    from sparksim.errors import FormatError
    from sparksim.plotting.pareto import plot_pareto

    table_path = sweep_dir / "sweep.parquet"
    if not table_path.is_file():
        raise FormatError(sweep_dir, ["sweep.parquet: file is missing (run `sparksim sweep` first)"])
    target = out or sweep_dir / "pareto.png"
    check_out(target, kind="file")
    # sweep.yaml (how the sweep was run) names its baseline, profile, traces and workload
    meta = read_yaml_mapping(sweep_dir / "sweep.yaml", "sweep.yaml") if (sweep_dir / "sweep.yaml").is_file() else {}
    table = pd.read_parquet(table_path)
    if baseline is not None and baseline not in set(table["policy"]):
        from sparksim.errors import ConfigError

        raise ConfigError(f"--baseline {baseline!r} is none of the sweep's policies "
                          f"({', '.join(map(repr, dict.fromkeys(table['policy'])))})")
    written = plot_pareto(table, target, meta=meta, baseline=baseline or meta.get("baseline"))
    console.print(f"[green]wrote[/] {written}", highlight=False)
