"""`sparksim profile analytic`: write an analytic (roofline) SPS profile for a GPU preset and a model."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import typer

from sparksim.cli.common import console, friendly_errors
from sparksim.errors import ConfigError
from sparksim.hardware import GPUS, get_gpu
from sparksim.models import load_model_spec
from sparksim.profile import load_profile, write_profile
from sparksim.roofline import (
    DTYPE_BYTES,
    Parallelism,
    analytic_profile,
    default_capture_sizes,
    drafter_presets,
)


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag}={text!r}: expected integers like 1024,4096") from None


def _capture_sizes(text: str, max_size: int) -> list[int]:
    """Parse `--capture-sizes`: 'vllm' (vLLM's default up to `max_size`), 'none', or a comma list."""
    key = text.strip().lower()
    if key == "vllm":
        return list(default_capture_sizes(max_size))
    if key in ("none", ""):
        return []
    return _ints(text, "--capture-sizes")


@friendly_errors
def analytic(
    gpu: str = typer.Option("h100", "--gpu", help=f"GPU preset: {', '.join(GPUS)}"),
    model: str = typer.Option("qwen3-8b", "--model", help="model preset name or path to an HF config.json"),
    dtype: str = typer.Option("bf16", "--dtype", help=f"weights, KV cache and activations: {', '.join(DTYPE_BYTES)}"),
    out: Path | None = typer.Option(None, "--out", help="profile folder to write (default profiles/<gpu>-<model>-analytic)"),
    compute_eff: float | None = typer.Option(None, "--compute-eff", help="fraction of peak FLOP/s reached (default: the preset's)"),
    mem_eff: float | None = typer.Option(None, "--mem-eff", help="fraction of HBM bandwidth reached (default: the preset's)"),
    step_overhead_ms: float | None = typer.Option(None, "--step-overhead-ms", help="fixed cost per engine step, ms (default: the preset's)"),
    launch_us: float | None = typer.Option(None, "--launch-us", help="eager launch cost per kernel, µs (default: the preset's)"),
    kernels_per_layer: int | None = typer.Option(None, "--kernels-per-layer", help="kernels per layer when run eagerly (default: the preset's)"),
    capture_sizes: str = typer.Option("vllm", "--capture-sizes", help="'vllm' (1,2,4,8..256/8,272..max/16), 'none', or a comma list of token counts"),
    max_capture_size: int = typer.Option(512, "--max-capture-size", help="largest captured size with --capture-sizes vllm"),
    max_tokens: int = typer.Option(8192, "--max-tokens", help="largest batch in verify.csv, tokens"),
    drafters: str = typer.Option("", "--drafters", help="drafter tables to write, the first the default: dspark-5 (block), mtp-1 (chained MTP), eagle3 (autoregressive; dense targets); default: every preset for the model"),
    gpus: int = typer.Option(1, "--gpus", help="GPUs per replica"),
    parallel: str = typer.Option("tp", "--parallel", help="tp (tensor parallel) or dp-ep (data-parallel attention, expert-parallel MoE)"),
    gamma: int | None = typer.Option(None, "--gamma", help="most positions each drafter drafts (DSpark's block size γ; default: each preset's, 7 for dense targets, 5 for DeepSeek's)"),
    draft_layers: int = typer.Option(5, "--draft-layers", help="DSpark backbone layers (target width)"),
    draft_context: int = typer.Option(0, "--draft-context", help="context the draft tables are tabulated at, tokens (0: the engine adds each drafter's KV reads at the batch's real context)"),
    max_requests: int = typer.Option(1024, "--max-requests", help="largest request count in draft.csv"),
) -> None:
    """Write an analytic roofline profile (verify.csv, attention.csv, draft tables, card.yaml)."""
    preset = get_gpu(gpu)
    overrides = {
        key: val for key, val in (
            ("compute_eff", compute_eff), ("mem_eff", mem_eff),
            ("step_overhead_ms", step_overhead_ms), ("launch_us", launch_us),
            ("kernels_per_layer", kernels_per_layer),
        ) if val is not None
    }
    hw = dataclasses.replace(preset, **overrides)  # type: ignore[arg-type]
    spec = load_model_spec(model)
    sizes = _capture_sizes(capture_sizes, max_capture_size)
    presets = drafter_presets(spec)
    names = ([] if drafters.strip().lower() == "none"
             else [n.strip() for n in drafters.split(",") if n.strip()] or list(presets))
    unknown = [n for n in names if n not in presets]
    if unknown:
        raise ConfigError(f"--drafters {drafters!r}: expected names from {sorted(presets)}")
    shapes = [dataclasses.replace(
        presets[n], gamma=gamma if gamma is not None else presets[n].gamma,
        num_layers=draft_layers if presets[n].kind == "block" and not presets[n].moe
        else presets[n].num_layers)
        for n in names]
    gpu_tag = gpu.lower() if gpus == 1 else f"{gpu.lower()}x{gpus}"
    target = out if out is not None else Path("profiles") / f"{gpu_tag}-{spec.name}-analytic"
    # Every knob spelled out, so the card's command remakes the profile even if defaults move.
    argv = [
        "sparksim", "profile", "analytic", "--gpu", gpu.lower(), "--model", model,
        "--dtype", dtype, "--out", str(target),
        "--compute-eff", f"{hw.compute_eff:g}", "--mem-eff", f"{hw.mem_eff:g}",
        "--step-overhead-ms", f"{hw.step_overhead_ms:g}", "--launch-us", f"{hw.launch_us:g}",
        "--kernels-per-layer", str(hw.kernels_per_layer),
        "--capture-sizes", capture_sizes, "--max-capture-size", str(max_capture_size),
        "--max-tokens", str(max_tokens), "--drafters", ",".join(names) or "none",
        *(["--gamma", str(gamma)] if gamma is not None else []),
        "--gpus", str(gpus), "--parallel", parallel,
        "--draft-layers", str(draft_layers), "--draft-context", str(draft_context),
        "--max-requests", str(max_requests),
    ]
    verify, extra, card = analytic_profile(
        hw, spec, dtype=dtype, capture_sizes=sizes, max_tokens=max_tokens, drafters=shapes,
        draft_context=draft_context, max_requests=max_requests, command=shlex.join(argv),
        parallel=Parallelism(gpus, parallel),
    )
    card = {**{k: card.pop(k) for k in ("source", "hardware")}, "gpu": gpu.lower(), **card}
    write_profile(target, verify, card, extra=extra)

    prof = load_profile(target)
    top = sizes[-1] if sizes else 0
    probe = [t for t in (1, top, top + 1, max_tokens) if 1 <= t <= max_tokens]
    costs = ", ".join(
        f"B={t}: {prof.verify_s_scalar(t) * 1e3:.2f} ms" for t in dict.fromkeys(probe)
    )
    console.print(
        f"[green]wrote[/] {target} ({len(verify)} dense rows, drafters {', '.join(names)}; "
        f"{hw.name}, {spec.name}, {dtype}; KV capacity {prof.kv_capacity_tokens():,} tokens)",
        highlight=False,
    )
    console.print(f"  dense step: {costs}; KV read: {prof.attention_s(1, 1e5) * 1e3:.3f} ms per "
                  "100k tokens", highlight=False)
