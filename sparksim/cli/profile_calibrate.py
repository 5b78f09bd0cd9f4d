"""`sparksim profile calibrate`: fit an analytic profile's physical parameters to your own measured runs."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
import yaml

from sparksim.cli.common import check_out, console, err_console, friendly_errors
from sparksim.errors import ConfigError

if TYPE_CHECKING:
    from sparksim.studies.measured_runs import EngineSettings


def _settings_for(runs: list[Path], engine: Path | None, vllm_flags: str) -> list[EngineSettings]:
    """One EngineSettings per run: from --vllm-flags, or --engine YAML (flat, or keyed by run name)."""
    from sparksim.studies.measured_runs import engine_settings, parse_vllm_flags

    if engine is None and not vllm_flags:
        raise ConfigError("say how the engine ran: --engine settings.yaml or --vllm-flags '...' "
                          "(max_num_seqs, max_num_batched_tokens, the KV cache size it logged)")
    if engine is not None and vllm_flags:
        raise ConfigError("give --engine or --vllm-flags, not both")
    def settings(values: dict[str, Any], source: str) -> EngineSettings:
        one, ignored = engine_settings(values, source)
        if ignored:
            err_console.print(f"[dim]{source}: not modelled, ignored: {', '.join(ignored)}[/]",
                              highlight=False)
        return one

    if vllm_flags:
        return [settings(parse_vllm_flags(vllm_flags), "--vllm-flags")] * len(runs)
    try:
        doc = yaml.safe_load(Path(engine).read_text()) if engine else None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--engine {engine}: cannot be read as YAML ({exc})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"--engine {engine}: expected a mapping of engine settings")
    keyed = all(isinstance(v, dict) for v in doc.values())  # {run name: settings}, else flat
    out = []
    for run in runs:
        name = run.name.removesuffix(".gz").removesuffix(".csv").removesuffix(".json")
        if not keyed:
            out.append(settings(dict(doc), str(engine)))
            continue
        if name not in doc:
            raise ConfigError(f"--engine {engine}: no settings for run {name!r} (it has {sorted(doc)})")
        entry = dict(doc[name])
        if "vllm_flags" in entry:
            entry = {**parse_vllm_flags(str(entry.pop("vllm_flags"))), **entry}
        out.append(settings(entry, f"{engine} [{name}]"))
    return out


@friendly_errors
def calibrate(
    runs: list[Path] = typer.Option(..., "--runs", help="a measured run: CSV (arrival_s, prompt_tokens, output_tokens, ttft_ms, e2e_ms[, stage]) or `vllm bench serve --save-result --save-detailed` JSON; repeat for more"),
    profile: Path = typer.Option(..., "--profile", help="the analytic base profile (its card's command is remade with the fitted values)"),
    out: Path = typer.Option(..., "--out", help="calibrated profile folder to write"),
    engine: Path | None = typer.Option(None, "--engine", help="engine settings YAML (max_num_seqs, max_num_batched_tokens, tensor_parallel_size, kv_capacity_tokens or num_gpu_blocks, block_size, max_model_len, prefix_caching, or vllm_flags), flat or keyed by run name"),
    vllm_flags: str = typer.Option("", "--vllm-flags", help="the `vllm serve` flags the runs used (and, pasted in, its 'GPU KV cache size: N tokens' log line)"),
    fit: str = typer.Option("compute_eff,mem_eff,request_overhead_ms", "--fit", help="parameters to fit: compute_eff, mem_eff, attn_compute_eff, attn_mem_eff, step_overhead_ms, request_overhead_ms"),
    held_out: bool = typer.Option(True, "--held-out/--no-held-out", help="also fit without each run and report its errors (one more fit per run)"),
    max_steps: int = typer.Option(20, "--max-steps", help="optimiser steps per fit (each replays every run once, plus once per fitted parameter for its derivatives)"),
) -> None:
    """Fit named physical parameters of an analytic profile to your measured runs; print stage errors, fitted and held out."""
    import pandas as pd

    from sparksim.cost.profile import load_profile, write_profile
    from sparksim.studies.calibration import Calibrator, calibrated_card, held_out_errors
    from sparksim.studies.measured_runs import MeasuredRun, load_run
    from sparksim.studies.run_replay import settings_on

    check_out(out)  # before fitting, not after it
    names = [n.strip() for n in fit.split(",") if n.strip()]
    def say(line: str) -> None:
        err_console.print(f"[dim]{line}[/]", highlight=False)

    given = _settings_for(runs, engine, vllm_flags)
    settings = [settings_on(s, profile) for s in given]  # an unset limit: vLLM's default on its GPU
    for note in dict.fromkeys(s.source for s, g in zip(settings, given, strict=True) if s is not g):
        say(note)
    measured: list[MeasuredRun] = [load_run(p, s) for p, s in zip(runs, settings, strict=True)]

    with Calibrator(profile, measured, names, progress=say) as cal:
        before = cal.stages(dict(cal.defaults))
        result = cal.fit(max_steps)
        verify, extra, base_card = cal.tables_with(result.values)
    loro = held_out_errors(profile, measured, names, max_steps=max_steps,
                           progress=say) if held_out and len(measured) > 1 else None
    command = shlex.join([
        "sparksim", "profile", "calibrate", "--profile", str(profile), "--out", str(out),
        *[a for r in runs for a in ("--runs", str(r))],
        *(["--engine", str(engine)] if engine is not None else ["--vllm-flags", vllm_flags]),
        "--fit", ",".join(names), "--max-steps", str(max_steps),
        "--held-out" if held_out else "--no-held-out"])
    write_profile(out, verify, calibrated_card(base_card, result, measured, loro, command), extra=extra)
    load_profile(out)  # it reads back

    fmt = {"ttft_err": "{:+.1%}".format, "e2e_err": "{:+.1%}".format}
    console.print(f"[green]wrote[/] {out} (source: calibrated; the fit replayed the runs {result.evaluations} times)",
                  highlight=False)
    for k, v in result.values.items():
        pinned = f"  [yellow]at its {result.at_bound[k]} bound[/]" if k in result.at_bound else ""
        console.print(f"  {k} = {v:.4g} (default {cal.defaults[k]:.4g}){pinned}", highlight=False)
    cols = ["run", "stage", "requests", "ttft_real", "e2e_real", "ttft_err", "e2e_err"]
    both = pd.concat([before.assign(profile="defaults"), result.stages.assign(profile="fitted")]
                     + ([loro.assign(profile="held out")] if loro is not None else []))
    console.print(both[["profile", *cols]].to_string(index=False, formatters=fmt,
                                                     float_format="{:,.1f}".format), highlight=False)
    if held_out and loro is None:  # one run: nothing to hold out, and the errors above are all fitted
        err_console.print("[yellow]note:[/] no held-out errors: leaving a run out needs two or more --runs; "
                          "every error above is on a run the fit saw", highlight=False)
    if result.at_bound:
        err_console.print(f"[yellow]warning:[/] {', '.join(sorted(result.at_bound))} ended at a bound: "
                          "the runs pull it past what is physical; check the engine settings and "
                          "the measurements before trusting this profile")
