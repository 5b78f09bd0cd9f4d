"""`sparksim profile analytic`: write an analytic (roofline) SPS profile for a GPU preset and a model."""

from __future__ import annotations

from pathlib import Path

import typer

from sparksim.cli.common import check_out, console, friendly_errors
from sparksim.cost.analytic import build_analytic
from sparksim.cost.profile import load_profile, write_profile
from sparksim.cost.target_step import DTYPE_BYTES
from sparksim.hardware import GPUS


@friendly_errors
def analytic(
    gpu: str = typer.Option("h100", "--gpu", help=f"GPU preset: {', '.join(GPUS)}"),
    model: str = typer.Option("qwen3-8b", "--model", help="model preset name or path to an HF config.json"),
    dtype: str = typer.Option("bf16", "--dtype", help=f"weights, KV cache and activations: {', '.join(DTYPE_BYTES)}"),
    out: Path | None = typer.Option(None, "--out", help="profile folder to write (default profiles/<gpu>-<model>-analytic)"),
    compute_eff: float | None = typer.Option(None, "--compute-eff", help="fraction of peak FLOP/s large GEMMs reach (default: the preset's)"),
    mem_eff: float | None = typer.Option(None, "--mem-eff", help="fraction of HBM bandwidth weight-streaming GEMMs reach (default: the preset's)"),
    attn_compute_eff: float | None = typer.Option(None, "--attn-compute-eff", help="fraction of peak FLOP/s prefill attention reaches (default: the preset's)"),
    attn_mem_eff: float | None = typer.Option(None, "--attn-mem-eff", help="fraction of HBM bandwidth decode attention's KV read reaches (default: the preset's)"),
    link_eff: float | None = typer.Option(None, "--link-eff", help="fraction of NVLink bandwidth collectives reach (default: the preset's)"),
    step_overhead_ms: float | None = typer.Option(None, "--step-overhead-ms", help="fixed cost per engine step, ms (default: the preset's)"),
    launch_us: float | None = typer.Option(None, "--launch-us", help="eager launch cost per kernel, µs (default: the preset's)"),
    kernels_per_layer: int | None = typer.Option(None, "--kernels-per-layer", help="kernels per layer when run eagerly (default: the preset's)"),
    capture_sizes: str = typer.Option("vllm", "--capture-sizes", help="'vllm' (1,2,4,8..256/8,272..max/16), 'none', or a comma list of token counts"),
    max_capture_size: int = typer.Option(512, "--max-capture-size", help="largest captured size with --capture-sizes vllm"),
    max_tokens: int = typer.Option(8192, "--max-tokens", help="largest batch in verify.csv, tokens"),
    drafters: str = typer.Option("", "--drafters", help="drafter tables to write, the first the default: dspark-5 (block), mtp-1 (chained MTP), eagle3 (autoregressive; dense targets); default: every preset for the model"),
    gpus: int = typer.Option(1, "--gpus", help="GPUs per replica"),
    parallel: str = typer.Option("tp", "--parallel", help="tp (tensor parallel) or dp-ep (data-parallel attention, expert-parallel MoE)"),
    nodes: int = typer.Option(1, "--nodes", help="machines the replica spans (dp-ep): all-to-alls cross the inter-node network"),
    micro_batches: int = typer.Option(1, "--micro-batches", help="2: dual-batch overlap (communication hidden behind the other micro-batch's compute)"),
    redundant_experts: int = typer.Option(0, "--redundant-experts", help="dp-ep: extra expert slots for copies of hot experts (EPLB; DeepSeek-V3 serves 256 + 32); num_experts + this must divide by --gpus"),
    expert_imbalance: float = typer.Option(1.0, "--expert-imbalance", help="dp-ep: max/mean routed tokens per GPU; the MoE layer runs at its busiest GPU's pace (1.0: ideal; 1.115 published with EPLB, see docs/profiles.md)"),
    gamma: int | None = typer.Option(None, "--gamma", help="most positions each drafter drafts (DSpark's block size γ; default: each preset's, 7 for dense targets, 5 for DeepSeek's)"),
    draft_layers: int = typer.Option(5, "--draft-layers", help="DSpark backbone layers (target width)"),
    draft_context: int = typer.Option(0, "--draft-context", help="context the draft tables are tabulated at, tokens (0: the engine adds each drafter's KV reads at the batch's real context)"),
    max_requests: int = typer.Option(1024, "--max-requests", help="largest request count in draft.csv"),
) -> None:
    """Write an analytic roofline profile (verify.csv, attention.csv, draft tables, card.yaml)."""
    opts = dict(locals())
    verify, extra, card, target = build_analytic(opts)
    check_out(target)  # a file where the folder goes is refused, not replaced
    names = [str(n) for n in card.get("drafters", {})]
    sizes = [int(v) for v in card["graph_capture_sizes"]]
    hw_name, spec_name = card["hardware"], card["model"]
    write_profile(target, verify, card, extra=extra)

    prof = load_profile(target)
    top = sizes[-1] if sizes else 0
    probe = [t for t in (1, top, top + 1, max_tokens) if 1 <= t <= max_tokens]
    costs = ", ".join(
        f"B={t}: {prof.verify_s_scalar(t) * 1e3:.2f} ms" for t in dict.fromkeys(probe)
    )
    console.print(
        f"[green]wrote[/] {target} ({len(verify)} dense rows, drafters {', '.join(names)}; "
        f"{hw_name}, {spec_name}, {dtype}; KV capacity {prof.kv_capacity_tokens():,} tokens)",
        highlight=False,
    )
    console.print(f"  dense step: {costs}; KV read: {prof.attention_s(1, 1e5) * 1e3:.3f} ms per "
                  "100k tokens", highlight=False)
