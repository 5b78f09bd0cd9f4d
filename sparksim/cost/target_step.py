"""Prices the target's step on the roofline: its HBM bytes and FLOPs, its KV reads, the whole step.

A step's dense work on B tokens (weights, linear layers, LM head, the new tokens' KV) takes

    dense = max(bytes / (HBM bandwidth × mem_eff), FLOPs / (peak × compute_eff)) + step overhead

and reading the batch's KV cache, K tokens in all, is a separate memory-bound kernel:
attention = K × KV bytes per token / (HBM bandwidth × mem_eff). Prompt chunks add causal
attention, compute-bound. `graph_verify_ms` runs the step as a CUDA-graph engine does
(`sparksim.cost.cuda_graphs`); a multi-GPU replica divides and adds terms as
`sparksim.cost.parallelism` says. docs/profiles.md derives every term.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sparksim.cost.cuda_graphs import eager_step_ms, pad_to_capture
from sparksim.cost.models import ModelSpec
from sparksim.cost.parallelism import (
    SINGLE,
    Parallelism,
    collective_ms,
    overlapped,
    routed_compute_ms,
    routed_flops,
    routed_priced_apart,
    slots_touched,
)
from sparksim.errors import ConfigError
from sparksim.hardware import DTYPE_BYTES as HW_DTYPE_BYTES
from sparksim.hardware import (
    MLA_ATTN_COMPUTE_EFF,
    MLA_ATTN_MEM_EFF,
    MLA_KV_DTYPE_BYTES,
    HardwareSpec,
)

# the dtypes a tensor-core roofline prices (no FP32 peak in the presets)
DTYPE_BYTES: dict[str, int] = {k: HW_DTYPE_BYTES[k] for k in ("bf16", "fp16", "fp8")}
LOGIT_BYTES = 4  # engines upcast logits to float32 before sampling


def kv_dtype_bytes(model: ModelSpec, dtype_bytes: int) -> int:
    """Bytes per KV-cache element: the profile's dtype, but BF16 for MLA (FlashMLA's dense
    decoding reads only a BF16 cache, and DeepSeek's service keeps core MLA in BF16)."""
    return MLA_KV_DTYPE_BYTES if model.is_mla else dtype_bytes


def layer_act_elems(model: ModelSpec) -> int:
    """Activation elements one layer reads and writes per token: each matmul's input and output."""
    if model.is_mla:
        qk = model.qk_nope_head_dim + model.qk_rope_head_dim
        attn = (model.hidden + (model.q_lora_rank or 0) * 2 + model.num_heads * qk
                + model.hidden + model.kv_lora_rank + model.qk_rope_head_dim
                + model.kv_lora_rank + model.num_heads * (model.qk_nope_head_dim + model.v_head_dim)
                + model.num_heads * model.v_head_dim + model.hidden)
    else:
        q_kv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim
        attn = model.hidden + q_kv + model.num_heads * model.head_dim + model.hidden
    if model.is_moe:  # the token's own experts (the average layer, dense leading ones included)
        width = (model.experts_per_token + model.num_shared_experts) * model.expert_intermediate
        experts = model.experts_per_token + model.num_shared_experts
        moe_mlp = experts * 2 * model.hidden + 3 * width
        dense_mlp = 2 * model.hidden + 3 * model.intermediate
        mlp = (model.moe_layers * moe_mlp + model.first_dense_layers * dense_mlp) // model.num_layers
    else:
        mlp = 2 * model.hidden + 3 * model.intermediate
    return attn + mlp


def verify_flops(model: ModelSpec, tokens: ArrayLike, context: ArrayLike = 0) -> NDArray[np.float64]:
    """Return the FLOPs of a target step of `tokens` tokens, each attending to `context` tokens.

    2 × active params × tokens (every weight a token goes through, its routed and shared
    experts and the LM head included) plus the attention FLOPs per (query, context) pair.
    """
    t = np.asarray(tokens, dtype=np.float64)
    c = np.asarray(context, dtype=np.float64)
    return 2.0 * model.active_params * t + model.attention_flops_per_pair * t * c


def dense_bytes(model: ModelSpec, tokens: ArrayLike, *, dtype_bytes: int = 2,
                parallel: Parallelism = SINGLE) -> NDArray[np.float64]:
    """Return the HBM bytes one GPU moves for a step's dense work: weights, new KV, activations.

    Weights are those the step reads (an MoE step reads only the experts its tokens touch),
    divided as `parallel` divides them. The input embedding is a gather of `tokens` rows, not
    a read of the table. Reading the running requests' KV cache is `attention_ms`'s.
    """
    t = np.asarray(tokens, dtype=np.float64)
    g = parallel.gpus
    read = model.weights_read(t)
    if parallel.mode == "dp-ep":  # all but the routed experts are on every GPU; each GPU reads
        # the touched slots it hosts, 1/G of them
        routed = model.moe_layers * model.experts_touched(t) * model.expert_params
        slots = model.moe_layers * slots_touched(model, parallel, t) * model.expert_params
        weights = (read - routed) + slots / g
    else:
        weights = read / g
    kv_elems = model.kv_bytes_per_token * g / parallel.kv_split(model)  # copies kept, all GPUs
    acts = t * (
        dtype_bytes * (model.num_layers * layer_act_elems(model) + model.hidden)
        + LOGIT_BYTES * model.vocab
    )
    return dtype_bytes * weights + (t * kv_elems * kv_dtype_bytes(model, dtype_bytes) + acts) / g


def roofline_ms(
    hw: HardwareSpec, bytes_moved: NDArray[np.float64], flops: NDArray[np.float64], dtype_bytes: int,
    routed_ms: ArrayLike = 0.0,
) -> NDArray[np.float64]:
    """max(bytes / achieved bandwidth, FLOPs / achieved peak + the routed experts' GEMM time)."""
    mem_s = bytes_moved / (hw.mem_bytes_per_s * hw.mem_eff)
    compute_s = flops / (hw.peak_for(dtype_bytes) * hw.compute_eff)
    return np.maximum(mem_s * 1e3, compute_s * 1e3 + np.asarray(routed_ms, dtype=np.float64))


def dense_verify_ms(
    hw: HardwareSpec, model: ModelSpec, tokens: ArrayLike, *, dtype_bytes: int = 2,
    parallel: Parallelism = SINGLE,
) -> NDArray[np.float64]:
    """Return the roofline time in ms of a step's dense work at `tokens` tokens, no graphs.

    max(bytes / (bandwidth × mem_eff), FLOPs / (peak × compute_eff)) per GPU over the weights
    read, the new tokens' KV writes and the activations (the GEMMs, norms and LM head, which
    run whatever the batch's contexts are), plus the step's collectives (`overlapped`: added,
    or hidden under the compute with dual-batch overlap) and hw.step_overhead_ms.
    """
    b = dense_bytes(model, tokens, dtype_bytes=dtype_bytes, parallel=parallel)
    f = verify_flops(model, tokens) / parallel.gpus
    routed: ArrayLike = 0.0
    if routed_priced_apart(model, dtype_bytes, parallel):  # the routed experts at their own price
        f = f - routed_flops(model, model.moe_layers, tokens) / parallel.gpus
        routed = routed_compute_ms(hw, model, tokens, expert_layers=model.moe_layers,
                                   dtype_bytes=dtype_bytes, parallel=parallel)
    return hw.step_overhead_ms + overlapped(
        roofline_ms(hw, b, f, dtype_bytes, routed),
        collective_ms(hw, model, tokens, dtype_bytes=dtype_bytes, parallel=parallel), parallel)


def attention_ms(
    hw: HardwareSpec, model: ModelSpec, kv_tokens: ArrayLike, *, dtype_bytes: int = 2,
    parallel: Parallelism = SINGLE,
) -> NDArray[np.float64]:
    """Return the time in ms to read `kv_tokens` tokens of KV cache (all layers), at attn_mem_eff.

    The cache is divided over `parallel.kv_split` GPUs (the others hold copies). GQA decode
    and verify attention stay memory-bound: a request verifying 1 + ℓ tokens does (1 + ℓ) ×
    heads / kv_heads FLOPs per KV byte (≤ 32 for Qwen3-8B at ℓ = 7), far below the ridge;
    MLA's absorbed attention is not, and `attention_compute_coef_ms` prices its FLOPs. MLA reads
    its BF16 cache at FlashMLA's published bandwidth (`MLA_ATTN_MEM_EFF`), not attn_mem_eff.
    """
    kv = np.asarray(kv_tokens, dtype=np.float64)
    per_gpu = kv / parallel.kv_split(model)
    eff = MLA_ATTN_MEM_EFF if model.is_mla else hw.attn_mem_eff
    return (per_gpu * model.kv_bytes_per_token * kv_dtype_bytes(model, dtype_bytes)
            / (hw.mem_bytes_per_s * eff) * 1e3)


def attention_compute_coef_ms(hw: HardwareSpec, model: ModelSpec, *, dtype_bytes: int = 2,
                              parallel: Parallelism = SINGLE) -> float:
    """Return ms per (query token × KV token) pair of decode/verify attention on the replica.

    The engine prices a step's attention as max(KV read, this × Σ queries × context). MLA runs
    in BF16 at FlashMLA's published compute-bound rate (`MLA_ATTN_COMPUTE_EFF` of the BF16 peak),
    whatever the weights' dtype.
    """
    if model.is_mla:
        return model.attention_flops_per_pair / parallel.gpus / (
            hw.peak_for(MLA_KV_DTYPE_BYTES) * MLA_ATTN_COMPUTE_EFF) * 1e3
    return model.attention_flops_per_pair / parallel.gpus / (
        hw.peak_for(dtype_bytes) * hw.attn_compute_eff) * 1e3


def prefill_attention_coef_ms(hw: HardwareSpec, model: ModelSpec, *, dtype_bytes: int = 2,
                              parallel: Parallelism = SINGLE) -> float:
    """Return ms per token² of causal prefill attention: a chunk of q after p costs coef·((p+q)²−p²).

    QKᵀ and PV over the causal pairs, q·p + q²/2 of them, at the model's prompt attention
    FLOPs per pair (`prefill_attention_flops_per_pair`: MLA's materialised form), compute-bound
    at attn_compute_eff (FlashAttention on long prompts), split over the GPUs. MLA's runs in
    BF16 whatever the weights' dtype, as its decode attention does.
    """
    peak = hw.peak_for(MLA_KV_DTYPE_BYTES if model.is_mla else dtype_bytes)
    return model.prefill_attention_flops_per_pair / 2.0 / parallel.gpus / (
        peak * hw.attn_compute_eff) * 1e3


def roofline_verify_ms(
    hw: HardwareSpec,
    model: ModelSpec,
    tokens: ArrayLike,
    context: ArrayLike,
    *,
    dtype_bytes: int = 2,
    tokens_per_request: int = 8,
    parallel: Parallelism = SINGLE,
) -> NDArray[np.float64]:
    """Return the roofline time in ms of a whole target step at each (`tokens`, `context`), no graphs.

    The dense work plus reading the KV cache of ceil(tokens / tokens_per_request) requests
    at `context` tokens each (the convention of the profiler's measured grid); `tokens`
    and `context` broadcast. No CUDA-graph padding and no eager launch cost.
    """
    if tokens_per_request < 1:
        raise ConfigError(f"tokens_per_request={tokens_per_request} must be >= 1")
    t = np.asarray(tokens, dtype=np.float64)
    kv = np.ceil(t / tokens_per_request) * np.asarray(context, np.float64)
    return dense_verify_ms(hw, model, t, dtype_bytes=dtype_bytes, parallel=parallel) + attention_ms(
        hw, model, kv, dtype_bytes=dtype_bytes, parallel=parallel)


def graph_verify_ms(
    hw: HardwareSpec,
    model: ModelSpec,
    tokens: ArrayLike,
    context: ArrayLike = 0,
    *,
    capture_sizes: Sequence[int],
    dtype_bytes: int = 2,
    tokens_per_request: int = 8,
    parallel: Parallelism = SINGLE,
) -> NDArray[np.float64]:
    """Return the target step time in ms as a CUDA-graph engine runs it: staircase, then cliff.

    A batch inside the captured range replays the next captured size's graph, so every
    term is evaluated at the padded size; a batch past it runs eagerly, its kernels'
    launches overlapping their GPU work (`eager_step_ms`): the step costs its fixed
    overhead plus the larger of the GPU time and the dispatch time of every layer's
    kernels. `context=0` gives the dense part alone.
    """
    padded, eager = pad_to_capture(tokens, capture_sizes)
    base = roofline_verify_ms(hw, model, padded, context, dtype_bytes=dtype_bytes,
                              tokens_per_request=tokens_per_request, parallel=parallel)
    gpu = base - hw.step_overhead_ms  # the kernels' time; the step's fixed CPU cost stays serial
    return hw.step_overhead_ms + np.where(
        eager, eager_step_ms(gpu, hw.eager_overhead_ms(model.num_layers)), gpu)
