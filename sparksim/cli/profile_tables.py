"""`sparksim profile export` / `profile import`: engine cost tables (SGLang, TensorRT-LLM, vLLM-Ascend) out of and into profiles."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from sparksim.cli.common import check_out, console, friendly_errors


@friendly_errors
def export(
    profile: Path = typer.Argument(..., help="profile folder whose price fills the table"),
    fmt: str = typer.Option(..., "--format", help="the engine's table format: sglang, trtllm or vllm (vLLM-Ascend's cost-profile JSON)"),
    out: Path = typer.Option(..., "--out", help="table file to write; its card goes beside it as FILE.card.yaml"),
    gamma: int | None = typer.Option(None, "--gamma", help="block size γ the engine drafts (default: the drafter's block from the profile card, else 7)"),
    drafter: str | None = typer.Option(None, "--drafter", help="drafter whose cost each step pays (default: the profile's default drafter)"),
    context: int | None = typer.Option(None, "--context", help="KV tokens per request while profiling (default: sglang 16, its profiler's --input-len; trtllm 1024, sparksim's choice; vllm 8192, its start-up profiling context)"),
) -> None:
    """Write the step-cost table an engine's DSpark planner reads, each point priced by sparksim from PROFILE, on the engine's own grid."""
    from sparksim.cost.engine_table_convert import default_gamma, export_card, export_table
    from sparksim.cost.engine_table_files import check_format, write_table
    from sparksim.cost.profile import load_profile

    check_format(fmt)
    check_out(out, kind="file")
    prof = load_profile(profile)
    block = default_gamma(prof, drafter) if gamma is None else gamma
    command = shlex.join(["sparksim", "profile", "export", str(profile), "--format", fmt, "--out", str(out),
                          "--gamma", str(block), *(["--drafter", drafter] if drafter else []),
                          *(["--context", str(context)] if context is not None else [])])
    table = export_table(prof, fmt, gamma=block, drafter=drafter, context=context)
    card = export_card(prof, table, fmt, gamma=block, drafter=drafter, context=context, command=command)
    write_table(table, out, card)
    console.print(f"[green]wrote[/] {out} and its card ({fmt} table, γ={block}, {len(card['grid']['batch_tokens'])} "
                  f"token counts, context {card['context_tokens']}) from {profile} (source: {prof.source})",
                  highlight=False)


@friendly_errors
def import_(
    file: Path = typer.Argument(..., help="the engine's table file"),
    fmt: str = typer.Option(..., "--format", help="its format: sglang, trtllm or vllm (vLLM-Ascend's cost-profile JSON)"),
    out: Path = typer.Option(..., "--out", help="profile folder to write"),
    gamma: int = typer.Option(..., "--gamma", help="block size γ the engine drafted when it measured the table (the profile's drafter drafts it)"),
    model: str | None = typer.Option(None, "--model", help="model the table was measured on (default: its export card's)"),
    hardware: str | None = typer.Option(None, "--hardware", help="hardware it was measured on (default: its export card's)"),
) -> None:
    """Write a sparksim profile (source: imported) whose step price at the table's probes is the table's step time."""
    from sparksim.cost.engine_table_convert import import_table
    from sparksim.cost.engine_table_files import check_format

    check_format(fmt)
    check_out(out, kind="folder")
    path = import_table(file, fmt, out, gamma=gamma, model=model, hardware=hardware)
    console.print(f"[green]wrote[/] {path} (source: imported) from the {fmt} table {file}", highlight=False)
