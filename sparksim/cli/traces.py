"""`sparksim traces ...` commands: generate synthetic trace sets and summarise any trace set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import typer
from rich.table import Table

from sparksim.cli.common import check_out, console, friendly_errors
from sparksim.traces.format import load_traceset
from sparksim.traces.stats import DomainStats, domain_stats, prefill_rows
from sparksim.traces.synth import synthesize
from sparksim.traces.synth_card import synth_command, write_synth
from sparksim.traces.synth_params import CALIBRATION_GAMMA, load_params, with_overrides
from sparksim.traces.synth_presets import PRESETS, preset

app = typer.Typer(help="Generate synthetic trace sets, import per-round logs and summarise trace sets.", no_args_is_help=True)


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
    check_out(out)  # before drawing: a file where the folder goes is refused, not replaced
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
    start = prefill_rows(ts)
    walk = "full-block walk" + (" from pos 1 (pos 0: the prefill's token)" if start else "")
    table = Table(title=f"{path} ({ts.card.get('source', '?')}, γ = {ts.gamma}): {walk}")
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


@app.command("import")
@friendly_errors
def import_traces(
    src: Path = typer.Argument(
        ..., help="deepspec: a confidence_records.jsonl, or the eval.py --confidence-dump-dir folder "
        "(<dir>/<dataset>/confidence_records.jsonl); rounds: a .csv or .jsonl round table"),
    fmt: str = typer.Option(..., "--format", help="deepspec | rounds (docs/traces.md, 'Importing')"),
    out: Path = typer.Option(..., "--out", help="output trace-set folder, e.g. traces/<name>"),
    gamma: int | None = typer.Option(
        None, help="keep the first G block positions (exact truncation); default: the data's γ"),
    name: str | None = typer.Option(None, help="name in the card (default: the --out folder's name)"),
    note: str | None = typer.Option(None, help="free text stored in the card"),
    domain: str | None = typer.Option(
        None, help="domain of every request (default: rounds, the domain column; deepspec, the "
        "dataset folder: gsm8k/math500/aime25 -> math, humaneval/mbpp/livecodebench -> code, "
        "mt-bench/alpaca/arena-hard-v2 -> chat, others keep their name)"),
    prompt_tokens: int | None = typer.Option(
        None, help="prompt length of requests whose source gives none (default 0: unknown)"),
    target: str | None = typer.Option(None, help="target model, for the card"),
    drafter: str | None = typer.Option(None, help="drafter, for the card"),
    temperature: float | None = typer.Option(
        None, help="sampling temperature of the recording, for the card (deepspec default: 1.0, "
        "eval.py's default, marked assumed)"),
    calibration: Path | None = typer.Option(
        None, help="deepspec: STS temperatures from DeepSpec's scripts/fit_confidence_calibration.py; "
        "conf = σ(logit/T_k) and conf_raw = σ(logit)"),
    max_new_tokens: int | None = typer.Option(
        None, help="deepspec: eval.py --max-new-tokens of the run, used to find where responses end "
        "(default 2048, eval.py's default, marked assumed; 0: unknown)"),
) -> None:
    """Import per-round logs (DeepSpec confidence dumps or a round table) as a trace set."""
    from sparksim.traces.importers import card_summary
    from sparksim.traces.importers import import_traces as run_import

    check_out(out)
    # the card's `command` is this command line, rebuilt from the options
    result = run_import(
        fmt, src, out, gamma=gamma, name=name, note=note, domain=domain, prompt_tokens=prompt_tokens,
        target=target, drafter=drafter, temperature=temperature, calibration=calibration,
        max_new_tokens=max_new_tokens)
    card = result.card
    table = Table(title=f"{out}: imported from {fmt} (γ = {card['gamma']}), accepted length per round")
    for col in ("domain", "requests", "rounds", "positions", "accepted length", "censored rounds"):
        table.add_column(col, justify="left" if col == "domain" else "right")
    positions = result.table.output_tokens
    doms = np.array(result.table.domains)
    for dom, st in card["acceptance"].items():
        table.add_row(dom, str(st["requests"]), str(st["rounds"]), str(int(positions[doms == dom].sum())),
                      f"{st['accept_length']:.3f}", str(st["censored_rounds"]))
    console.print(table)
    for line in card_summary(card):
        console.print(line, highlight=False)
