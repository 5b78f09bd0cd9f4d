"""`sparksim traces ...` commands: generate synthetic trace sets and summarise any trace set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import typer
from rich.table import Table

from sparksim.cli.common import console, friendly_errors
from sparksim.traces.format import load_traceset
from sparksim.traces.stats import DomainStats, domain_stats
from sparksim.traces.synth import (
    CALIBRATION_GAMMA,
    PRESETS,
    load_params,
    preset,
    synth_command,
    synthesize,
    with_overrides,
    write_synth,
)

app = typer.Typer(help="Generate synthetic trace sets and summarise trace sets.", no_args_is_help=True)


def _cond_table(title: str, stats: dict[str, DomainStats], gamma: int) -> Table:
    table = Table(title=title)
    table.add_column("domain")
    for k in range(1, gamma + 1):
        table.add_column(f"k={k}", justify="right")
    for name, st in stats.items():
        table.add_row(name, *("-" if not np.isfinite(v) else f"{v:.3f}" for v in st.conditional))
        table.add_row("  (mean conf)", *("-" if not np.isfinite(v) else f"{v:.3f}" for v in st.predicted),
                      style="dim")
    return table


@app.command("synth")
@friendly_errors
def synth(
    preset_name: str = typer.Option(
        "dspark-qwen3-8b", "--preset", help=f"model preset: {', '.join(PRESETS)}"
    ),
    requests_per_domain: int = typer.Option(300, help="requests drawn per domain"),
    gamma: int = typer.Option(CALIBRATION_GAMMA, help="block size γ (drafts per round)"),
    seed: int = typer.Option(0, help="seed of the set (the level fit has its own, fit_seed)"),
    miscalibration: float | None = typer.Option(
        None, help="temperature T: conf = σ(logit(p)/T); T < 1 over-, T > 1 under-confident. "
        "accepted still follows p."
    ),
    params: Path | None = typer.Option(
        None, help="YAML of overrides: raw_temperature, fit_requests, fit_seed, drafter, "
        "domains: {name: {field: value}} (see docs/traces.md)"
    ),
    out: Path | None = typer.Option(None, help="output folder (default traces/synth-<preset>)"),
) -> None:
    """Draw a synthetic trace set from a calibrated parametric model and write it with its card."""
    model = preset(preset_name)
    if params is not None:
        model = with_overrides(model, load_params(params), where=str(params))
    out = out or Path("traces") / f"synth-{preset_name}"
    result = synthesize(model, requests_per_domain=requests_per_domain, gamma=gamma, seed=seed,
                        miscalibration=miscalibration)
    command = synth_command(preset_name, requests_per_domain=requests_per_domain, gamma=gamma,
                            seed=seed, miscalibration=miscalibration, params=params, out=out)
    write_synth(out, result, command)

    table = Table(title=f"{out}: accepted length (full-block walk, γ = {gamma})")
    for col in ("domain", "requests", "rounds", "target (γ=7)", "achieved", "error"):
        table.add_column(col, justify="left" if col == "domain" else "right")
    for name, st in result.stats.items():
        target = model.domains[name].target_accept_len
        err = "-" if target is None else f"{100 * (st.accepted_length / target - 1):+.2f} %"
        table.add_row(name, str(st.num_requests), str(st.num_rounds),
                      "-" if target is None else f"{target:.2f}", f"{st.accepted_length:.3f}", err)
    console.print(table)
    console.print(_cond_table("conditional acceptance P(acc ≥ k | acc ≥ k−1)", result.stats, gamma))
    levels = ", ".join(f"{k} {v:.4f}" for k, v in result.levels.items())
    console.print(f"fitted levels (logit): {levels}", highlight=False)


@app.command("stats")
@friendly_errors
def stats(path: Path = typer.Argument(..., help="trace-set folder")) -> None:
    """Print accepted length per domain and conditional acceptance by position for a trace set."""
    ts = load_traceset(path)
    per_domain = domain_stats(ts)
    table = Table(title=f"{path} ({ts.card.get('source', '?')}, γ = {ts.gamma}): full-block walk")
    for col in ("domain", "requests", "positions", "rounds", "accepted length", "ECE conf", "ECE conf_raw"):
        table.add_column(col, justify="left" if col == "domain" else "right")
    for name, st in per_domain.items():
        table.add_row(
            name, str(st.num_requests), str(st.num_positions), str(st.num_rounds),
            f"{st.accepted_length:.3f}", f"{np.nanmean(st.ece):.4f}",
            "-" if st.ece_raw is None else f"{np.nanmean(st.ece_raw):.4f}",
        )
    console.print(table)
    console.print(_cond_table("conditional acceptance P(acc ≥ k | acc ≥ k−1)", per_domain, ts.gamma))
