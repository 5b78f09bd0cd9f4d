"""Builds analytic SPS(B) profiles from a roofline step-time model of the target and its drafters.

`analytic_profile` tabulates the model (verify.csv: the dense step at every captured size,
the first eager size, then a ladder; attention.csv: the KV read; one draft table per
drafter) and writes the card: every parameter with its source, and derived figures. The
model's terms sit beside this module: `target_step` (the target's dense work and KV reads,
the whole step), `draft_step` (the drafters, by kind), `parallelism` (a replica over its
GPUs: collectives, routed experts) and `cuda_graphs` (the staircase and the eager cliff).
Their public names stay importable from here (`__all__`): `sparksim.cost.roofline` is the
roofline's Python API, the path docs/profiles.md and the profile cards cite.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from sparksim.cost.cuda_graphs import default_capture_sizes, eager_step_ms, pad_to_capture
from sparksim.cost.draft_step import (
    DRAFTER_SOURCES,
    DSPARK_5,
    EAGLE3,
    MTP_1,
    DrafterShape,
    draft_bytes,
    draft_flops,
    draft_kv_ms_per_token,
    drafter_presets,
    fc_params,
    graph_draft_ms,
    head_params,
    roofline_draft_ms,
)
from sparksim.cost.models import ModelSpec
from sparksim.cost.parallelism import (
    SINGLE,
    Parallelism,
    collective_ms,
    overlapped,
    routed_compute_ms,
)
from sparksim.cost.target_step import (
    DTYPE_BYTES,
    LOGIT_BYTES,
    attention_compute_coef_ms,
    attention_ms,
    dense_bytes,
    dense_verify_ms,
    graph_verify_ms,
    kv_dtype_bytes,
    layer_act_elems,
    prefill_attention_coef_ms,
    roofline_verify_ms,
    verify_flops,
)
from sparksim.errors import ConfigError
from sparksim.hardware import (
    FIELD_SOURCES,
    GPU_MEMORY_UTILIZATION,
    GPUS,
    GROUPED_GEMM_SOURCE,
    MLA_ATTN_COMPUTE_EFF,
    MLA_ATTN_MEM_EFF,
    MLA_SOURCE,
    HardwareSpec,
    get_gpu,
    grouped_gemm_eff,
)

# the roofline's Python API: every public term, wherever it is defined, importable from here
__all__ = [
    "DSPARK_5",
    "DTYPE_BYTES",
    "EAGLE3",
    "GPUS",
    "MTP_1",
    "DrafterShape",
    "HardwareSpec",
    "Parallelism",
    "activation_reserve_bytes",
    "analytic_profile",
    "attention_compute_coef_ms",
    "attention_ms",
    "collective_ms",
    "default_capture_sizes",
    "dense_bytes",
    "dense_verify_ms",
    "draft_bytes",
    "draft_flops",
    "eager_step_ms",
    "get_gpu",
    "graph_draft_ms",
    "graph_verify_ms",
    "grouped_gemm_eff",
    "kv_dtype_bytes",
    "ladder",
    "overlapped",
    "pad_to_capture",
    "prefill_attention_coef_ms",
    "roofline_draft_ms",
    "roofline_verify_ms",
    "routed_compute_ms",
    "verify_flops",
]

DEFAULT_CONTEXTS = (1024, 4096, 16384)


def ladder(after: int, stop: int) -> list[int]:
    """Return the sizes 1, 2, 3, 4, 6, 8, 12, 16, … (each ×1.5 or ×4/3) above `after`, up to `stop`.

    `stop` itself is always included (if above `after`), so a table reaches its limit.
    """
    out: set[int] = set()
    k = 0
    while 2**k <= stop:
        for v in (2**k, 3 * 2**k // 2):
            if after < v <= stop and v >= 1:
                out.add(v)
        k += 1
    if stop > after:
        out.add(stop)
    return sorted(out)


# --------------------------------------------------------------------------- profile tables


def _check_sizes(name: str, values: Sequence[int]) -> list[int]:
    out = [int(v) for v in values]
    bad = [v for v in out if v < 1]
    if bad:
        raise ConfigError(f"{name}: every value must be >= 1 (got {bad[0]})")
    if len(set(out)) != len(out):
        raise ConfigError(f"{name}: repeated value in {out}")
    return sorted(out)


def _hardware_parameters(hw: HardwareSpec) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key, value in asdict(hw).items():
        if key in ("name", "source"):
            continue
        params[key] = {"value": value, "source": FIELD_SOURCES.get(key, "")}
    return params


def _token_rows(sizes: list[int], max_tokens: int) -> NDArray[np.float64]:
    """Every captured size up to `max_tokens`, the first eager size, then the ladder."""
    inside = [s for s in sizes if s <= max_tokens]
    top = sizes[-1] if sizes else 0
    beyond = ladder(top, max_tokens)
    if top < max_tokens:
        beyond = sorted({top + 1, *beyond})
    return np.asarray(sorted({*inside, *beyond}), dtype=np.float64)


def _verify_table(hw: HardwareSpec, model: ModelSpec, sizes: list[int], max_tokens: int,
                  dtype_bytes: int, parallel: Parallelism) -> pd.DataFrame:
    """verify.csv: the dense step (no KV read) at every captured size, the cliff, the ladder."""
    tokens = _token_rows(sizes, max_tokens)
    step_ms = graph_verify_ms(hw, model, tokens, 0, capture_sizes=sizes, dtype_bytes=dtype_bytes,
                              parallel=parallel)
    return pd.DataFrame({"tokens": tokens.astype(np.int64), "step_ms": step_ms})


def _attention_table(hw: HardwareSpec, model: ModelSpec, max_kv_tokens: int, dtype_bytes: int,
                     parallel: Parallelism) -> pd.DataFrame:
    """attention.csv: reading K tokens of KV cache, linear in K (two rows suffice; a few more read well)."""
    kv = np.asarray([0, 1 << 16, 1 << 20, max(max_kv_tokens, 1 << 21)], dtype=np.float64)
    return pd.DataFrame({"kv_tokens": kv.astype(np.int64),
                         "attn_ms": attention_ms(hw, model, kv, dtype_bytes=dtype_bytes,
                                                 parallel=parallel)})


def _draft_table(
    hw: HardwareSpec, model: ModelSpec, sizes: list[int], d: DrafterShape, draft_context: int,
    max_requests: int, dtype_bytes: int, parallel: Parallelism,
) -> pd.DataFrame:
    """A draft table: every request count while a full pass fits a graph, the first eager
    count, the ladder; at every drafted positions count 1..γ."""
    top = sizes[-1] if sizes else 0
    graph_requests = top // (d.gamma if d.kind == "block" else 1)
    inside = list(range(1, min(graph_requests, max_requests) + 1))
    beyond = ladder(graph_requests, max_requests)
    if graph_requests < max_requests:
        beyond = sorted({graph_requests + 1, *beyond})
    requests = np.asarray(sorted({*inside, *beyond}), dtype=np.float64)
    r_grid, p_grid = np.meshgrid(requests, np.arange(1, d.gamma + 1, dtype=np.float64))
    return pd.DataFrame({
        "positions": p_grid.ravel().astype(np.int64),
        "requests": r_grid.ravel().astype(np.int64),
        "draft_ms": graph_draft_ms(hw, model, r_grid.ravel(), capture_sizes=sizes, drafter=d,
                                   positions=p_grid.ravel(),
                                   context=d.window or draft_context,  # a window is its whole KV
                                   dtype_bytes=dtype_bytes, parallel=parallel),
    })


def activation_reserve_bytes(model: ModelSpec, max_tokens: int, dtype_bytes: int) -> int:
    """Estimate the activation memory an engine keeps free: one layer's activations and the
    float32 logits of a `max_tokens` step (what vLLM's start-up profiling run peaks at)."""
    return int(max_tokens * (dtype_bytes * layer_act_elems(model) + LOGIT_BYTES * model.vocab))


def _card(
    hw: HardwareSpec, model: ModelSpec, dtype: str, sizes: list[int], max_tokens: int,
    drafters: Sequence[DrafterShape], draft_context: int, command: str, parallel: Parallelism,
) -> dict[str, Any]:
    """The card: what was modelled, every parameter with its source, and derived figures."""
    dtype_bytes = DTYPE_BYTES[dtype]
    # Arithmetic intensity where the achieved roofs meet; a context-free BF16 step turns
    # compute-bound at this many tokens (weights: 2 bytes read, 2 FLOPs per token each).
    ridge = hw.peak_for(dtype_bytes) * hw.compute_eff / (hw.mem_bytes_per_s * hw.mem_eff)
    weights = dtype_bytes * model.params
    drafter_params = drafter_routed = 0
    if drafters:  # a deployment holds one drafter: the default one
        main = drafters[0]
        main_layers = (main.num_layers * model.moe_layer_params if main.moe
                       else main.num_layers * model.layer_params)
        drafter_params = (main_layers + fc_params(model, main)
                          + (head_params(model, main) if main.draft_vocab else 0))
        drafter_routed = main.num_layers * model.num_experts * model.expert_params if main.moe else 0
        weights += dtype_bytes * drafter_params
    g = parallel.gpus
    replicated = 0  # dp-ep keeps attention, dense layers and embeddings on every GPU, the
    if parallel.mode == "dp-ep":  # drafter's too, and the redundant experts' copies
        routed = model.moe_layers * model.num_experts * model.expert_params
        replicated = dtype_bytes * ((model.params - routed + drafter_params - drafter_routed) * (g - 1)
                                    + model.moe_layers * parallel.redundant_experts * model.expert_params)
    kernels: dict[str, Any] = {}  # published kernel figures that replace the presets' efficiencies
    if model.is_moe and (dtype_bytes == 1 or parallel.expert_imbalance != 1.0):
        kernels["routed_experts"] = (
            "routed experts' GEMMs priced apart on the busiest GPU (sparksim.cost.roofline.routed_compute_ms): "
            "FLOPs/G x expert_imbalance at " + ("grouped_gemm_eff(imbalance x T x k / slots) of the FP8 "
                                                "peak: " + GROUPED_GEMM_SOURCE if dtype_bytes == 1
                                                else "compute_eff"))
    if model.is_mla:
        kernels["mla_attention"] = {"attn_mem_eff": round(MLA_ATTN_MEM_EFF, 4),
                                    "attn_compute_eff": round(MLA_ATTN_COMPUTE_EFF, 4),
                                    "kv_dtype": "bf16", "compute_peak": "bf16", "source": MLA_SOURCE,
                                    "prefill": "materialised form (QK head dim qk_nope + qk_rope, V v_head), "
                                               "BF16 peak at attn_compute_eff"}
    return {
        "source": "analytic",
        "hardware": hw.name,
        "model": model.name,
        "dtype": dtype,
        "date": datetime.now(UTC).date().isoformat(),
        "command": command or "sparksim.cost.roofline.analytic_profile (Python API)",
        "engine": "none: roofline model (sparksim.cost.roofline) with vLLM-style CUDA-graph semantics",
        "graph_capture_sizes": sizes,
        "gpus_per_replica": g,
        "parallelism": {"gpus": g, "mode": parallel.mode, "kv_split": parallel.kv_split(model),
                        "nodes": parallel.nodes, "micro_batches": parallel.micro_batches,
                        **({"redundant_experts": parallel.redundant_experts,
                            "expert_slots_per_gpu": parallel.expert_slots(model) // g,
                            "expert_imbalance": parallel.expert_imbalance,
                            "expert_imbalance_source": FIELD_SOURCES["expert_imbalance"]}
                           if parallel.mode == "dp-ep" else {}),
                        "graph_sizes": ("per replica: G x each GPU's captured sizes (data-parallel "
                                        "attention splits the tokens evenly)" if parallel.mode == "dp-ep"
                                        else "per replica: every GPU runs all the step's tokens"),
                        "source": "sparksim.cost.roofline.Parallelism (its docstring says what each "
                                  "mode divides and which collectives it pays)"},
        "max_tokens": int(max_tokens),
        "hardware_source": hw.source,
        "parameters": _hardware_parameters(hw),
        "model_spec": {
            **{k: v for k, v in model.as_dict().items() if k != "source"},
            "params": model.params,
            "matmul_params": model.matmul_params,
            "kv_elems_per_token": model.kv_bytes_per_token,
            "config_hash": model.config_hash(),
            "source": model.source or "sparksim.cost.models",
        },
        "cost_model": {
            "kind": "tokens+kv (sparksim.cost.profile)",
            "prefill_attention_ms_per_token_sq": prefill_attention_coef_ms(
                hw, model, dtype_bytes=dtype_bytes, parallel=parallel),
            "attention_ms_per_query_kv_token": attention_compute_coef_ms(
                hw, model, dtype_bytes=dtype_bytes, parallel=parallel),
            "dense": "verify.csv: step_overhead_ms + gpu, gpu = max(bytes/(mem_bytes_per_s*mem_eff), "
                     "flops/(peak*compute_eff))*1e3 + collectives; past the largest capture "
                     "step_overhead_ms + max(gpu, kernels_per_layer*layers*launch_us/1e3); "
                     "bytes = dtype*matmul_params + tokens*(kv_elems*dtype + act_bytes); "
                     "flops = 2*matmul_params*tokens",
            "eager_dispatch": "overlapped: an eager step's CPU kernel launches run ahead of its GPU "
                              "work, so it costs the larger of the two (sparksim.cost.roofline."
                              "eager_step_ms); CUDA-graph steps pay no dispatch",
            "attention": "attention.csv: kv_tokens*kv_elems*dtype/(mem_bytes_per_s*attn_mem_eff)*1e3 "
                         "(memory-bound: see sparksim.cost.roofline.attention_ms)",
            "prefill_attention": "coef*((prefix+chunk)^2 - prefix^2), coef = flops_per_pair/2/"
                                 "(gpus*peak*attn_compute_eff)*1e3 (causal pairs, compute-bound; "
                                 "flops_per_pair 4*layers*heads*head_dim, MLA's materialised form "
                                 "2*layers*heads*(qk_nope+qk_rope+v_head) at the BF16 peak)",
        },
        "memory": {  # per replica: all its GPUs
            "hbm_bytes": hw.hbm_bytes * g,
            "weights_bytes": weights + replicated,
            # copies of an unsplittable cache (MLA under tp, GQA heads < GPUs) count in full
            "kv_bytes_per_token": (model.kv_bytes_per_token * kv_dtype_bytes(model, dtype_bytes) * g
                                   // parallel.kv_split(model)),
            # dp-ep: each GPU runs its 1/G share of the replica's tokens, so reserves for that
            "activation_reserve_bytes": activation_reserve_bytes(
                model, -(-max_tokens // g) if parallel.mode == "dp-ep" else max_tokens, dtype_bytes) * g,
            "source": "hbm_bytes: the memory CUDA reports (sparksim.hardware); weights: the model's parameters and the default "
                      "drafter's own (a shared LM head once) in the dtype; kv per token: 2 x layers x "
                      "kv_heads x head_dim x dtype; activation reserve: estimated as one layer's "
                      "activations plus float32 logits for a max_tokens step",
        },
        **({"drafters": {
            d.name: {
                "file": f"draft-{d.name}.csv", **{k: v for k, v in asdict(d).items() if k != "name"},
                "context": int(d.window or draft_context),  # the table's; the engine adds kv_ms_per_token x KV
                "kv_ms_per_token": draft_kv_ms_per_token(hw, model, d, dtype_bytes=dtype_bytes,
                                                         parallel=parallel),
                "graph_padding": ("R*positions tokens padded to graph_capture_sizes; eager past the "
                                  "largest" if d.kind == "block" else
                                  "each pass's R tokens padded to graph_capture_sizes"),
                "source": DRAFTER_SOURCES.get(d.name + ("-moe" if d.moe else ""), "user-described shape"),
            }
            for d in drafters
        }} if drafters else {}),
        **({"default_drafter": drafters[0].name} if drafters else {}),
        **({"kernel_figures": kernels} if kernels else {}),
        "derived": {
            "ridge_flops_per_byte": round(ridge, 1),
            "ridge_tokens_without_kv": round(ridge * dtype_bytes / 2, 1),
            "weights_ms": round(dtype_bytes * model.matmul_params
                                / (hw.mem_bytes_per_s * hw.mem_eff) * 1e3, 4),
            "eager_overhead_ms": hw.eager_overhead_ms(model.num_layers),
        },
        "caveats": (
            "Not a measurement. Dense work and KV reads are priced as separate kernels (their "
            "times add); drafters attend to a fixed context (drafters.*.context). An eager "
            "step's dispatch overlaps only its dense work in verify.csv (its KV read, added by "
            "the engine, would hide more: an upper bound where dispatch exceeds the dense work)."
        ),
    }


def analytic_profile(
    hw: HardwareSpec,
    model: ModelSpec,
    *,
    dtype: str = "bf16",
    capture_sizes: Sequence[int] | None = None,
    max_tokens: int = 8192,
    drafters: Sequence[DrafterShape] | None = None,
    draft_context: int = 0,
    max_requests: int = 1024,
    command: str = "",
    parallel: Parallelism = SINGLE,
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, Any]]:
    """Return (verify, {other files}, card) of an analytic profile, ready for `write_profile`.

    verify.csv: the dense step at every captured size up to `max_tokens`, the first eager
    size (so the cliff sits where it belongs in both lookup modes), then the ×1.5/×4/3
    ladder. attention.csv: the KV read, linear in KV tokens. One draft table per drafter
    (default: DSpark-5, MTP-1, Eagle3), at 1..γ positions and every request count while a
    pass fits the captured range, the first eager count, then the ladder up to
    `max_requests`. `capture_sizes=None` means vLLM's default; an empty list means no graphs.
    `parallel` spreads the replica over its GPUs; a replica whose weights do not fit them is
    an error naming the figures.
    """
    parallel.check(model, hw)
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"dtype={dtype!r} is not one of {list(DTYPE_BYTES)}")
    dtype_bytes = DTYPE_BYTES[dtype]
    hw.peak_for(dtype_bytes)  # fails early for FP8 on a chip without it
    ds = list(drafters) if drafters is not None else list(drafter_presets(model).values())
    if len({d.name for d in ds}) != len(ds):
        raise ConfigError(f"drafter names repeat: {[d.name for d in ds]}")
    if draft_context < 0:
        raise ConfigError(f"draft_context={draft_context} must be >= 0")
    for key, val in (("max_tokens", max_tokens), ("max_requests", max_requests),
                     *((f"{d.name} gamma", d.gamma) for d in ds),
                     *((f"{d.name} layers", d.num_layers) for d in ds)):
        if val < 1:
            raise ConfigError(f"{key}={val} must be >= 1")
    for key, fval in (("compute_eff", hw.compute_eff), ("mem_eff", hw.mem_eff),
                      ("attn_compute_eff", hw.attn_compute_eff), ("attn_mem_eff", hw.attn_mem_eff),
                      ("link_eff", hw.link_eff)):
        if not 0 < fval <= 1:
            raise ConfigError(f"{key}={fval} must be in (0, 1]")
    for key, fval in (("step_overhead_ms", hw.step_overhead_ms), ("launch_us", hw.launch_us),
                      ("kernels_per_layer", hw.kernels_per_layer)):
        if not fval >= 0:
            raise ConfigError(f"{key}={fval} must be >= 0")
    sizes = _check_sizes("capture sizes", default_capture_sizes() if capture_sizes is None
                         else capture_sizes)
    if parallel.mode == "dp-ep":
        # each GPU captures its graphs for its own 1/G share of the tokens: in replica tokens
        # (the profile's axis) a captured size is G times the per-GPU one
        sizes = [s * parallel.gpus for s in sizes]
    card = _card(hw, model, dtype, sizes, max_tokens, ds, draft_context, command, parallel)
    mem = card["memory"]
    if mem["hbm_bytes"] and GPU_MEMORY_UTILIZATION * mem["hbm_bytes"] <= (
            mem["weights_bytes"] + mem["activation_reserve_bytes"]):
        raise ConfigError(
            f"{model.name} in {dtype} on {parallel.gpus} x {hw.name}: weights "
            f"{mem['weights_bytes'] / 1e9:.1f} GB + activation reserve "
            f"{mem['activation_reserve_bytes'] / 1e9:.1f} GB do not fit {GPU_MEMORY_UTILIZATION} x HBM "
            f"{mem['hbm_bytes'] / 1e9:.1f} GB (more GPUs, or --dtype fp8)")
    max_kv = int((mem["hbm_bytes"] - mem["weights_bytes"]) // mem["kv_bytes_per_token"]) if mem["hbm_bytes"] else 0
    verify = _verify_table(hw, model, sizes, max_tokens, dtype_bytes, parallel)
    extra = {"attention.csv": _attention_table(hw, model, max_kv, dtype_bytes, parallel)}
    for d in ds:
        extra[f"draft-{d.name}.csv"] = _draft_table(hw, model, sizes, d, draft_context,
                                                    max_requests, dtype_bytes, parallel)
    return verify, extra, card
