"""`sparksim profile`: measure an SPS(B) profile on this machine's CPU or GPU; `profile analytic`.

With no subcommand, `sparksim profile --model ... --out ...` runs the measurement
(needs the torch extra); `sparksim profile analytic` writes a roofline profile instead.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from sparksim.cli.common import check_out, console, err_console, friendly_errors
from sparksim.cli.profile_analytic import analytic
from sparksim.cli.profile_calibrate import calibrate
from sparksim.cli.profile_tables import export, import_
from sparksim.errors import ConfigError

app = typer.Typer(
    help="Measure an SPS(B) profile (verify.csv, attention.csv, a draft table, card.yaml) on this machine, or write "
    "an analytic one (`profile analytic`).",
    no_args_is_help=True,
    invoke_without_command=True,
)
app.command("analytic")(analytic)
app.command("calibrate")(calibrate)
app.command("export")(export)
app.command("import")(import_)


@app.command("fitted")
@friendly_errors
def fitted(
    engine: str = typer.Option("distserve", "--engine", help="DistServe's OPT-13B A100 fit of: distserve or vllm"),
    out: Path = typer.Option(..., "--out", help="profile folder to write"),
) -> None:
    """Write a profile from DistServe's published OPT-13B A100 cost fit (source: published)."""
    import sys

    from sparksim.cost.fitted import distserve_profile
    from sparksim.cost.profile import write_profile

    check_out(out)
    command = "sparksim " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    verify, extra, card = distserve_profile(engine, command=command)
    write_profile(out, verify, card, extra=extra)
    console.print(f"[green]wrote[/] {out} (DistServe's {engine} fit, published figures)", highlight=False)

@app.command("live")
@friendly_errors
def live(
    target: Path = typer.Option(Path("models/tinylm-d128-l6/target"), "--target", help="built-in target folder"),
    drafter: Path | None = typer.Option(Path("models/tinylm-d128-l6/dspark"), "--drafter", help="drafter folder (omit: plain decoding only)"),
    requests: str = typer.Option("1,2,4,8,16,24,32,48", "--requests", help="request counts R"),
    contexts: str = typer.Option("64,256,640", "--contexts", help="context tokens per request (two or more)"),
    prompt_lengths: str = typer.Option("16,64,128,256,512", "--prompt-lengths", help="prompt lengths of the prefill points"),
    replays: int = typer.Option(5, "--replays", help="timed replays per point (median kept)"),
    warmup: int = typer.Option(2, "--warmup", help="untimed replays per point and round"),
    rounds: int = typer.Option(2, "--rounds", help="interleaved rounds over the whole grid"),
    threads: int = typer.Option(1, "--threads", help="torch threads (as `sparksim live` runs)"),
    out: Path = typer.Option(Path("profiles/cpu-tinylm-d128-live-measured"), "--out", help="profile folder to write"),
    note: str = typer.Option("", "--note", help="a remark for the card"),
    loop_traces: str = typer.Option("traces/tinylm-d128-l6-dspark-recorded", "--loop-traces",
                                    help="trace set whose prompts the loop sessions serve ('' skips the loop)"),
    loop_seconds: float = typer.Option(5.0, "--loop-seconds", help="seconds per loop session"),
    loop_only: bool = typer.Option(False, "--loop-only",
                                   help="measure only the loop and add it to the profile at --out"),
    refit: bool = typer.Option(False, "--refit", help="redo the verify fit of the profile at --out from "
                               "its points.csv (nothing measured)"),
) -> None:
    """Measure the live engine's own step functions (sparksim live) into a profile the simulator reads.

    Then, unless --loop-traces is '', the engine loop's time between steps, from short live sessions (2, 8 and 24 users; plain decoding and static drafting), into cost_model.loop_ms.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    check_out(out)
    if refit:
        from sparksim.live.fits import refit_verify  # torch-free: nothing is measured

        if not (out / "points.csv").is_file():
            raise ConfigError(f"--refit: {out} holds no live profile (points.csv) to refit")
        refit_verify(out, shlex.join(["sparksim", "profile", "live", "--refit", "--out", str(out)]))
        console.print(f"[green]refitted[/] {out} from its points.csv", highlight=False)
        return
    from sparksim.cli.common import need_torch

    need_torch()
    from sparksim.live.engine import LiveModels
    from sparksim.live.profile import (
        LOOP_USERS,
        LiveProfileConfig,
        add_loop,
        measure,
        measure_loop,
        write_live_profile,
    )
    from sparksim.profiling.sweep import parse_int_list

    def loop(path: Path) -> None:
        command = shlex.join([
            "sparksim", "profile", "live", "--loop-only", "--target", str(target),
            *(["--drafter", str(drafter)] if drafter is not None else []), "--loop-traces", loop_traces,
            "--loop-seconds", str(loop_seconds), "--threads", str(threads), "--out", str(path)])
        modes = 2 if drafter is not None else 1
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err_console, transient=False) as bar:
            task = bar.add_task("timing the engine loop", total=modes * len(LOOP_USERS))
            gaps = measure_loop(path, target, drafter, loop_traces, seconds=loop_seconds, threads=threads,
                                progress=lambda label: bar.update(task, advance=1, description=label))
        add_loop(path, gaps, command)
        console.print(f"[green]added[/] cost_model.loop_ms to {path}", highlight=False)

    if loop_only:
        if not (out / "card.yaml").is_file():
            raise ConfigError(f"--loop-only: {out} holds no profile to add the loop to")
        if not loop_traces:
            raise ConfigError("--loop-only needs --loop-traces (the prompts the sessions serve)")
        loop(out)
        return

    cfg = LiveProfileConfig(parse_int_list(requests, "--requests"), parse_int_list(contexts, "--contexts"),
                            parse_int_list(prompt_lengths, "--prompt-lengths"), replays, warmup, rounds,
                            threads=threads)
    models = LiveModels.load(target, drafter)
    cfg.check(models)
    positions = models.gamma + 1 if models.drafter is not None else 1
    total = rounds * (len(cfg.requests) * len(cfg.contexts) * positions + len(cfg.prompt_lengths))
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=False) as bar:
        task = bar.add_task("profiling the live engine", total=total)
        points, prefill = measure(models, cfg, lambda label: bar.update(task, advance=1, description=label))
    command = shlex.join([
        "sparksim", "profile", "live", "--target", str(target),
        *(["--drafter", str(drafter)] if drafter is not None else []), "--requests", requests,
        "--contexts", contexts, "--prompt-lengths", prompt_lengths, "--replays", str(replays),
        "--warmup", str(warmup), "--rounds", str(rounds), "--threads", str(threads),
        "--loop-traces", loop_traces, "--loop-seconds", str(loop_seconds), "--out", str(out),
        *(["--note", note] if note else [])])
    path = write_live_profile(out, models, cfg, points, prefill, command, note)
    console.print(f"[green]wrote[/] {path} ({len(points)} decode points, {len(prefill)} prefill points)",
                  highlight=False)
    if loop_traces:
        loop(path)


DEFAULT_TOKENS = "1,2,4,8,16,32,64,128,256,512"


@app.callback()
@friendly_errors
def measure(
    ctx: typer.Context,
    model: str | None = typer.Option(None, "--model", help="model preset (qwen3-4b, qwen3-8b, qwen3-14b, llama-3.1-8b, cpu-demo) or path to an HF config.json"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda (single device)"),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16, fp16 or fp32 for weights, KV cache and activations"),
    tokens: str = typer.Option(DEFAULT_TOKENS, "--tokens", help="batch sizes B in tokens: a list 1,2,4, a range 1-64, a stepped range 1-1024:8, or a mix"),
    contexts: str = typer.Option("1024,4096", "--context", "--contexts", help="KV tokens per request, at least two, a list like 1024,4096,16384 (the dense/KV split is fitted over them)"),
    attention_fit: str = typer.Option("per-request", "--attention-fit", help="attention.csv's slope per KV token: per-request (one per request count R) or pooled (one for all)"),
    graphs: bool | None = typer.Option(None, "--graphs/--no-graphs", help="capture one CUDA graph per captured size (default: on for cuda, off for cpu)"),
    max_capture_size: int = typer.Option(512, "--max-capture-size", help="largest CUDA-graph size (vLLM's default sizes up to it); larger batches run eagerly"),
    replays: int = typer.Option(5, "--replays", help="timed replays per point; the median is kept (5 or more for a real profile)"),
    warmup: int = typer.Option(2, "--warmup", help="untimed runs before the replays of each point"),
    rounds: int = typer.Option(1, "--rounds", help="repeat the whole sweep this many times and pool the replays (spreads them over time on a shared machine)"),
    tokens_per_request: int | None = typer.Option(None, "--tokens-per-request", help="R = ceil(B / this); default 1 + γ"),
    gamma: int = typer.Option(7, "--gamma", help="drafter block size γ"),
    draft_layers: int = typer.Option(5, "--draft-layers", help="drafter layers (DSpark uses 5)"),
    draft: bool = typer.Option(True, "--draft/--no-draft", help="also time the drafter by request count and positions 1..γ (draft-dspark-<layers>.csv)"),
    draft_context: int | None = typer.Option(None, "--draft-context", help="context the drafter attends to (default: the first --context)"),
    peaks: bool = typer.Option(True, "--peaks/--no-peaks", help="measure matmul FLOP/s and copy bandwidth and put the roofline's error in the card"),
    threads: int | None = typer.Option(None, "--threads", help="CPU threads for torch (default: torch's choice)"),
    out: Path | None = typer.Option(None, "--out", help="profile folder to write (default profiles/<device>-<model>-<dtype>-measured)"),
    note: str = typer.Option("", "--note", help="a remark for the card (e.g. what else ran on the machine)"),
) -> None:
    """Measure SPS(B): time verification steps over (tokens, context), the drafter and prefill,
    then fit the dense / KV split."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None:
        raise ConfigError("--model is required (a preset name or a path to config.json)")
    _measure(model, device, dtype, tokens, contexts, attention_fit, graphs, max_capture_size, replays,
             warmup, rounds, tokens_per_request, gamma, draft_layers, draft, draft_context, peaks,
             threads, out, note)


def _measure(
    model: str, device: str, dtype: str, tokens: str, contexts: str, attention_fit: str,
    graphs: bool | None, max_capture_size: int, replays: int, warmup: int, rounds: int,
    tokens_per_request: int | None, gamma: int, draft_layers: int, draft: bool,
    draft_context: int | None, peaks: bool, threads: int | None, out: Path | None, note: str,
) -> None:
    from sparksim.cost.models import load_model_spec

    spec = load_model_spec(model)  # unknown presets and bad config.json fail before torch loads
    try:
        import torch
    except ImportError:
        raise ConfigError("sparksim profile needs torch: pip install 'sparksim[torch]'") from None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if peaks:
        # Imported now so a long sweep cannot fail at its very end on a missing module.
        pass
    from sparksim.cost.roofline import DrafterShape
    from sparksim.profiling.card import write_measured_profile
    from sparksim.profiling.fit import ATTENTION_FITS, check_contexts, prefill_lengths
    from sparksim.profiling.graphs import default_capture_sizes
    from sparksim.profiling.peaks import measure_peaks
    from sparksim.profiling.sweep import (
        DTYPES,
        SweepConfig,
        check_config,
        merge_draft_rounds,
        merge_rounds,
        parse_int_list,
        run_draft_sweep,
        run_prefill_sweep,
        run_verify_sweep,
    )
    from sparksim.profiling.timing import MIN_REPLAYS_RECOMMENDED, CudaEventClock, HostClock

    use_graphs = (device == "cuda") if graphs is None else graphs
    tpr = tokens_per_request if tokens_per_request is not None else gamma + 1
    if replays < 1 or warmup < 0 or rounds < 1:
        raise ConfigError(f"--replays {replays} and --rounds {rounds} must be >= 1, "
                          f"--warmup {warmup} >= 0")
    cfg = SweepConfig(
        spec=spec, device=device, dtype=dtype,
        tokens=parse_int_list(tokens, "--tokens"), contexts=parse_int_list(contexts, "--context"),
        graphs=use_graphs, capture_sizes=default_capture_sizes(max_capture_size) if use_graphs else [],
        replays=replays, warmup=warmup, tokens_per_request=tpr,
        drafter=DrafterShape(num_layers=draft_layers, gamma=gamma) if draft else None,
        draft_context=draft_context,
    )
    check_config(cfg)
    check_contexts(cfg.contexts)
    if attention_fit not in ATTENTION_FITS:
        raise ConfigError(f"--attention-fit {attention_fit!r} is not one of {', '.join(ATTENTION_FITS)}")
    # Long enough prompts that the q² attention term shows above the timing noise, short
    # enough that they take seconds (a GPU runs 8k-token prompts as fast as a CPU runs 2k).
    prompts = prefill_lengths(spec.max_position, 8192 if device == "cuda" else 2048)
    if threads is not None:
        torch.set_num_threads(threads)
    target = out if out is not None else Path("profiles") / f"{device}-{spec.name}-{dtype}-measured"
    check_out(target)  # before measuring for minutes, not after
    argv = [
        "sparksim", "profile", "--model", model, "--device", device, "--dtype", dtype,
        "--tokens", tokens, "--context", contexts, "--attention-fit", attention_fit,
        "--graphs" if use_graphs else "--no-graphs",
        *(["--max-capture-size", str(max_capture_size)] if use_graphs else []),
        "--replays", str(replays), "--warmup", str(warmup), "--rounds", str(rounds), "--tokens-per-request", str(tpr),
        "--gamma", str(gamma), "--draft-layers", str(draft_layers),
        *(["--draft-context", str(cfg.draft_context_used)] if draft else ["--no-draft"]),
        "--peaks" if peaks else "--no-peaks",
        *(["--threads", str(threads)] if threads is not None else []),
        "--out", str(target), *(["--note", note] if note else []),
    ]
    if replays < MIN_REPLAYS_RECOMMENDED:
        err_console.print(f"[yellow]warning:[/] --replays {replays} is below "
                          f"{MIN_REPLAYS_RECOMMENDED}; fine for a smoke test, noisy for a profile")
    total = rounds * (len(cfg.tokens) * len(cfg.contexts)
                      + (len(cfg.draft_requests) * gamma if draft else 0)) + len(prompts)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=False) as bar:
        task = bar.add_task(f"profiling {spec.name} on {device} ({dtype})", total=total)

        def advance(label: str) -> None:
            bar.update(task, advance=1, description=label)

        point_rounds, draft_rounds = [], []
        for _ in range(rounds):
            point_rounds.append(run_verify_sweep(cfg, progress=advance))
            draft_rounds.append(run_draft_sweep(cfg, progress=advance))
        prefill = run_prefill_sweep(cfg, prompts, progress=advance)
    points, drafts = merge_rounds(point_rounds), merge_draft_rounds(draft_rounds)
    measured = None
    if peaks:
        dev = torch.device(device)
        clock = CudaEventClock() if device == "cuda" else HostClock()
        with torch.inference_mode():
            measured = measure_peaks(dev, DTYPES[dtype], clock)
    path = write_measured_profile(target, cfg, points, drafts, shlex.join(argv), prefill=prefill,
                                  attention_fit=attention_fit,
                                  peaks=measured, note=note, rounds=rounds)
    missing = sum(p.timing is None for p in points)
    console.print(f"[green]wrote[/] {path} ({len(points) - missing} points measured"
                  f"{f', {missing} unavailable' if missing else ''})", highlight=False)
