"""Analytic SPS(B) profiles: a roofline step-time model of the target and its drafters.

A step's dense work on B tokens (weights, linear layers, LM head, the new tokens' KV) takes

    dense = max(bytes / (HBM bandwidth × mem_eff), FLOPs / (peak × compute_eff)) + step overhead

and reading the batch's KV cache, K tokens in all, is a separate memory-bound kernel:
attention = K × KV bytes per token / (HBM bandwidth × mem_eff). Prompt chunks add causal
attention, compute-bound. Drafters are priced by kind (a parallel block, chained MTP
modules, an autoregressive Eagle head) and drafted positions. Inside the CUDA-graph capture sizes a batch replays the graph of
the next captured size (a staircase); past the largest one the step runs eagerly, and
launching its kernels from the CPU overlaps their GPU work: it costs the larger of the two
(a cliff only where the kernels are shorter than their launches). docs/profiles.md derives every term.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray

from sparksim.cost.models import ModelSpec
from sparksim.errors import ConfigError
from sparksim.hardware import DTYPE_BYTES as HW_DTYPE_BYTES
from sparksim.hardware import (
    FIELD_SOURCES,
    GPU_MEMORY_UTILIZATION,
    GPUS,
    GROUPED_GEMM_SOURCE,
    MLA_ATTN_COMPUTE_EFF,
    MLA_ATTN_MEM_EFF,
    MLA_KV_DTYPE_BYTES,
    MLA_SOURCE,
    HardwareSpec,
    get_gpu,
    grouped_gemm_eff,
)

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

# the dtypes a tensor-core roofline prices (no FP32 peak in the presets)
DTYPE_BYTES: dict[str, int] = {k: HW_DTYPE_BYTES[k] for k in ("bf16", "fp16", "fp8")}
LOGIT_BYTES = 4  # engines upcast logits to float32 before sampling
DEFAULT_CONTEXTS = (1024, 4096, 16384)


def default_capture_sizes(max_size: int = 512) -> tuple[int, ...]:
    """Return vLLM's default CUDA-graph capture sizes up to `max_size` tokens.

    1, 2, 4, then multiples of 8 up to 256, then multiples of 16 (vLLM's
    `cudagraph_capture_sizes` default with max_num_seqs ≥ 256).
    """
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, max_size + 1, 16)]
    return tuple(s for s in sizes if s <= max_size)


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


def pad_to_capture(
    tokens: ArrayLike, capture_sizes: Sequence[int]
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Return (padded size, runs eagerly) for each batch in `tokens`.

    A batch at or below the largest captured size replays the graph of the next captured
    size; a larger batch (or any batch when nothing is captured) runs eagerly, unpadded.
    """
    t = np.asarray(tokens, dtype=np.float64)
    if not capture_sizes:
        return t.copy(), np.ones(t.shape, dtype=bool)
    sizes = np.asarray(sorted(capture_sizes), dtype=np.float64)
    eager = t > sizes[-1]
    idx = np.minimum(np.searchsorted(sizes, t, side="left"), sizes.size - 1)
    return np.where(eager, t, sizes[idx]), eager


# --------------------------------------------------------------------------- target (verify)


@dataclass(frozen=True)
class Parallelism:
    """How one replica spreads over its GPUs.

    - `tp` (tensor parallel, vLLM's default): every weight matrix, attention head and (for
      MoE) every expert is split over the G GPUs; two all-reduces of the tokens' hidden states
      per layer. A GQA model with fewer KV heads than GPUs keeps copies of its KV heads; an
      MLA model's single latent cannot be split, so its KV cache is on every GPU.
    - `dp-ep` (data-parallel attention, expert parallel: DeepSeek's and SGLang/vLLM's large-EP
      serving): each GPU runs attention and the dense layers for its share of the requests
      with their weights replicated, and holds E/G experts; two all-to-alls (dispatch and
      combine) per MoE layer, across `nodes` machines (the share of each GPU's tokens bound
      for another node goes over the inter-node network, the rest over NVLink).
    - `micro_batches=2` (dual-batch overlap, DeepSeek's inference system): the step runs as
      two micro-batches whose communication overlaps the other's compute, so it pays the
      larger of its kernels' time and its collectives', not their sum.
    - `redundant_experts=N` (dp-ep; DeepSeek's EPLB): N extra copies of hot experts, so the
      GPUs host E + N expert slots, (E + N) / G each (DeepSeek-V3: 256 + 32 = 288, 2 per GPU
      on its EP144 decode units, 9 on its EP32 prefill units: its inference-system overview).
    - `expert_imbalance` (dp-ep): max/mean routed tokens over the GPUs of an MoE layer; the
      layer waits for its most-loaded GPU, so its routed-expert FLOPs and its all-to-all
      bytes are that GPU's (1.0: ideal; FIELD_SOURCES["expert_imbalance"] has the published
      figures, 1.115 with EPLB and 32 redundant experts).
    """

    gpus: int = 1
    mode: str = "tp"  # tp | dp-ep
    nodes: int = 1  # machines the replica spans (dp-ep only): all-to-alls cross the inter-node network
    micro_batches: int = 1  # 2: dual-batch overlap, one micro-batch's communication hides behind the other's compute
    redundant_experts: int = 0  # dp-ep: extra expert slots holding copies of hot experts (EPLB)
    expert_imbalance: float = 1.0  # dp-ep: max/mean routed tokens per GPU (1.0: ideal)

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    def expert_slots(self, model: ModelSpec) -> int:
        """Routed-expert slots per MoE layer over the replica: the experts plus their copies."""
        return model.num_experts + self.redundant_experts

    def check(self, model: ModelSpec, hw: HardwareSpec | None = None) -> None:
        """Raise ConfigError for a split the model (or the GPU's node) cannot take, naming the numbers."""
        if self.gpus < 1:
            raise ConfigError(f"gpus={self.gpus} must be >= 1")
        if self.mode not in ("tp", "dp-ep"):
            raise ConfigError(f"parallelism mode={self.mode!r} is not one of tp, dp-ep")
        if self.nodes < 1 or self.gpus % self.nodes:
            raise ConfigError(f"nodes={self.nodes} must be >= 1 and divide gpus={self.gpus}")
        if self.nodes > 1 and self.mode != "dp-ep":
            raise ConfigError(f"nodes={self.nodes}: only dp-ep spans nodes (tensor parallelism "
                              "across the inter-node network is not modelled)")
        if hw is not None and self.gpus_per_node > hw.gpus_per_node:
            raise ConfigError(f"{self.gpus} GPUs on {self.nodes} node(s) is {self.gpus_per_node} per node; "
                              f"a {hw.name} node has {hw.gpus_per_node}")
        if self.micro_batches not in (1, 2):
            raise ConfigError(f"micro_batches={self.micro_batches} must be 1 or 2 (dual-batch overlap)")
        if self.mode == "tp" and model.num_heads % self.gpus:
            raise ConfigError(f"tp over gpus={self.gpus} does not divide {model.name}'s "
                              f"num_heads={model.num_heads}")
        if self.redundant_experts < 0 or (self.redundant_experts and self.mode != "dp-ep"):
            raise ConfigError(f"redundant_experts={self.redundant_experts} must be >= 0, and only "
                              "dp-ep hosts copies of experts")
        if not self.expert_imbalance >= 1.0 or (self.expert_imbalance != 1.0 and self.mode != "dp-ep"):
            raise ConfigError(f"expert_imbalance={self.expert_imbalance} must be >= 1 (max/mean tokens "
                              "per GPU), and only dp-ep divides experts between GPUs (tp splits each)")
        if self.mode == "dp-ep" and (not model.is_moe or self.expert_slots(model) % self.gpus):
            raise ConfigError(
                f"dp-ep over gpus={self.gpus} needs an MoE model whose num_experts + redundant_experts "
                f"divides by it ({model.name}: num_experts={model.num_experts} + redundant_experts="
                f"{self.redundant_experts} = {self.expert_slots(model)} slots)")

    def kv_split(self, model: ModelSpec) -> int:
        """GPUs the KV cache is divided over (the rest hold copies)."""
        if self.mode == "dp-ep":
            return self.gpus
        if model.is_mla:
            return 1
        return min(self.gpus, model.num_kv_heads)


SINGLE = Parallelism()


def kv_dtype_bytes(model: ModelSpec, dtype_bytes: int) -> int:
    """Bytes per KV-cache element: the profile's dtype, but BF16 for MLA (FlashMLA's dense
    decoding reads only a BF16 cache, and DeepSeek's service keeps core MLA in BF16)."""
    return MLA_KV_DTYPE_BYTES if model.is_mla else dtype_bytes


def _slots_touched(model: ModelSpec, parallel: Parallelism, tokens: ArrayLike) -> NDArray[np.float64]:
    """Expected routed-expert slots one MoE layer reads over the replica for `tokens` tokens.

    Without copies, the distinct experts touched (`ModelSpec.experts_touched`). With N
    redundant copies EPLB spreads the load over the E + N slots, each picked with probability
    k / (E + N) per token: (E + N)·(1 − (1 − k/(E + N))^T), k at T = 1 and E + N as T grows.
    """
    t = np.asarray(tokens, dtype=np.float64)
    if not parallel.redundant_experts:
        return model.experts_touched(t)
    slots = float(parallel.expert_slots(model))
    return slots * (1.0 - (1.0 - model.experts_per_token / slots) ** t)


def _layer_act_elems(model: ModelSpec) -> int:
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


def _attention_flops_per_token_ctx(model: ModelSpec, num_layers: int) -> int:
    """FLOPs per (query token × context token) over `num_layers` layers (see ModelSpec)."""
    return model.attention_flops_per_pair * num_layers // model.num_layers


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
        slots = model.moe_layers * _slots_touched(model, parallel, t) * model.expert_params
        weights = (read - routed) + slots / g
    else:
        weights = read / g
    kv_elems = model.kv_bytes_per_token * g / parallel.kv_split(model)  # copies kept, all GPUs
    acts = t * (
        dtype_bytes * (model.num_layers * _layer_act_elems(model) + model.hidden)
        + LOGIT_BYTES * model.vocab
    )
    return dtype_bytes * weights + (t * kv_elems * kv_dtype_bytes(model, dtype_bytes) + acts) / g


def collective_ms(hw: HardwareSpec, model: ModelSpec, tokens: ArrayLike, *, dtype_bytes: int = 2,
                  parallel: Parallelism = SINGLE) -> NDArray[np.float64]:
    """Return the time of a step's collectives over the replica's GPUs (0 on one GPU).

    tp: two ring all-reduces per layer of the tokens' hidden states, each
    latency + 2(G−1)/G · T · hidden · s / (link bandwidth · link_eff). dp-ep: two all-to-alls
    per MoE layer (dispatch, combine), each GPU sending its T/G tokens' hidden states to their
    k experts, spread evenly over the G GPUs: (n−1)/G of them to the other GPUs of its node
    over NVLink and (G−n)/G to other nodes over the network (n GPUs per node), both links
    busy at once: latency + max(NVLink bytes / (link · link_eff), network bytes /
    (internode · internode_eff)). With one node this is (T/G) · k · hidden · s · (G−1)/G over NVLink.
    An all-to-all ends when its most-loaded receiver does: the bytes are × `expert_imbalance`.
    """
    t = np.asarray(tokens, dtype=np.float64)
    g = parallel.gpus
    if g == 1:
        return np.zeros_like(t)
    lat_ms = hw.collective_latency_us / 1e3
    per_byte_ms = 1e3 / (hw.link_bytes_per_s * hw.link_eff)
    if parallel.mode == "tp":
        one = lat_ms + 2 * (g - 1) / g * t * model.hidden * dtype_bytes * per_byte_ms
        return 2 * model.num_layers * one
    # bytes each GPU sends, and the most-loaded GPU receives
    sent = (t / g) * model.experts_per_token * model.hidden * dtype_bytes * parallel.expert_imbalance
    local = parallel.gpus_per_node
    nvlink_ms = sent * (local - 1) / g * per_byte_ms  # to the other GPUs of its node
    network_ms = sent * (g - local) / g * 1e3 / (hw.internode_bytes_per_s * hw.internode_eff)
    return 2 * model.moe_layers * (lat_ms + np.maximum(nvlink_ms, network_ms))  # both links at once


def _roofline_ms(
    hw: HardwareSpec, bytes_moved: NDArray[np.float64], flops: NDArray[np.float64], dtype_bytes: int,
    routed_ms: ArrayLike = 0.0,
) -> NDArray[np.float64]:
    """max(bytes / achieved bandwidth, FLOPs / achieved peak + the routed experts' GEMM time)."""
    mem_s = bytes_moved / (hw.mem_bytes_per_s * hw.mem_eff)
    compute_s = flops / (hw.peak_for(dtype_bytes) * hw.compute_eff)
    return np.maximum(mem_s * 1e3, compute_s * 1e3 + np.asarray(routed_ms, dtype=np.float64))


def _routed_priced_apart(model: ModelSpec, dtype_bytes: int, parallel: Parallelism) -> bool:
    """Whether the routed experts' GEMMs get their own price: DeepGEMM's table covers FP8
    grouped GEMMs, and an uneven expert load slows them alone. Otherwise they are GEMMs like
    the rest, summed with them (so BF16 MoE profiles keep their numbers to the last bit)."""
    return model.is_moe and (dtype_bytes == 1 or parallel.expert_imbalance != 1.0)


def _routed_flops(model: ModelSpec, expert_layers: int, tokens: ArrayLike) -> NDArray[np.float64]:
    """FLOPs of the routed experts' GEMMs: each token through its k experts in `expert_layers` layers."""
    return (2.0 * expert_layers * model.experts_per_token * model.expert_params
            * np.asarray(tokens, dtype=np.float64))


def routed_compute_ms(hw: HardwareSpec, model: ModelSpec, tokens: ArrayLike, *, expert_layers: int,
                      dtype_bytes: int = 2, parallel: Parallelism = SINGLE) -> NDArray[np.float64]:
    """Return the compute time in ms of the routed experts' GEMMs on the replica's busiest GPU.

    Its FLOPs are 1/G of the step's routed FLOPs × `expert_imbalance` (the layer waits for its
    most-loaded GPU), at DeepGEMM's grouped-GEMM efficiency for that GPU's tokens per expert
    slot (imbalance × T·k / (E + N)) when the MoE runs in FP8 (`grouped_gemm_eff`), else at
    compute_eff like every other GEMM. 0 for a dense model.
    """
    t = np.asarray(tokens, dtype=np.float64)
    if not model.is_moe:
        return np.zeros_like(t)
    imbalance = parallel.expert_imbalance
    flops = _routed_flops(model, expert_layers, t) / parallel.gpus * imbalance
    if model.is_moe and dtype_bytes == 1:  # DeepGEMM's grouped FP8 kernels
        per_expert = imbalance * t * model.experts_per_token / parallel.expert_slots(model)
        eff = grouped_gemm_eff(per_expert)
    else:
        eff = np.full(t.shape, hw.compute_eff)
    return flops / (hw.peak_for(dtype_bytes) * eff) * 1e3


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
    if _routed_priced_apart(model, dtype_bytes, parallel):  # the routed experts at their own price
        f = f - _routed_flops(model, model.moe_layers, tokens) / parallel.gpus
        routed = routed_compute_ms(hw, model, tokens, expert_layers=model.moe_layers,
                                   dtype_bytes=dtype_bytes, parallel=parallel)
    return hw.step_overhead_ms + overlapped(
        _roofline_ms(hw, b, f, dtype_bytes, routed),
        collective_ms(hw, model, tokens, dtype_bytes=dtype_bytes, parallel=parallel), parallel)


def overlapped(compute_ms: ArrayLike, comm_ms: ArrayLike, parallel: Parallelism) -> NDArray[np.float64]:
    """A step's kernels and its collectives: their sum, or with dual-batch overlap (two
    micro-batches, each one's communication running under the other's compute) the larger."""
    c, m = np.asarray(compute_ms, dtype=np.float64), np.asarray(comm_ms, dtype=np.float64)
    return np.maximum(c, m) if parallel.micro_batches == 2 else c + m


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

    QKᵀ and PV over the causal pairs, q·p + q²/2 of them, at the model's attention FLOPs per
    pair, compute-bound at attn_compute_eff (FlashAttention on long prompts), split over the GPUs.
    """
    return model.attention_flops_per_pair / 2.0 / parallel.gpus / (
        hw.peak_for(dtype_bytes) * hw.attn_compute_eff) * 1e3


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


def eager_step_ms(gpu_ms: ArrayLike, dispatch_ms: ArrayLike) -> NDArray[np.float64]:
    """Return the time of an eager forward pass whose kernels take `gpu_ms` on the GPU and
    `dispatch_ms` to launch from the CPU: the larger of the two.

    Launches are asynchronous: the CPU queues kernel i+1 while the GPU runs kernel i, so a
    pass is bound by whichever side is slower in total, the GPU's work (long kernels: the
    launch queue runs ahead and its cost hides) or the CPU's dispatch (short kernels: the
    GPU idles between launches). The exact time of kernels g_1..g_n launched every `l` is
    max over k of (k·l + g_k + … + g_n), between max(Σg, n·l) and max(Σg, n·l) + max g;
    this takes the lower end, exact when no single kernel dominates. CUDA graphs replace
    the launches by one replay, so graph steps pay no dispatch.
    """
    return np.maximum(np.asarray(gpu_ms, dtype=np.float64), np.asarray(dispatch_ms, dtype=np.float64))


# --------------------------------------------------------------------------- drafter


@dataclass(frozen=True)
class DrafterShape:
    """A drafter's shape, by kind, for the roofline.

    - `block` (DSpark, DFlash): a parallel backbone of target-width layers over the block
      (anchor + positions−1 masks per request) in one pass, the target's LM head on every
      position, then DSpark's Markov head sampled left to right (W2 read once per position).
      Target features of the newly verified positions are projected into its KV cache.
    - `mtp` (DeepSeek's multi-token prediction): k chained modules of `num_layers` layers,
      one position each: one pass per drafted position, each fusing the previous token's
      embedding with a hidden state (2h → h) and sharing the target's LM head.
    - `autoregressive` (Eagle3): one pass per drafted position of a `num_layers`-layer
      decoder fed fused target features (3h → h), with its own (smaller) LM head.
    """

    name: str = "dspark-5"
    kind: str = "block"  # block | mtp | autoregressive
    num_layers: int = 5  # DSpark/DFlash backbone depth (DeepSpec configs)
    gamma: int = 7  # most positions it drafts per request (the block size)
    num_target_features: int = 5  # hidden states fused into its input or KV
    markov_rank: int = 256  # block only: low-rank bigram W1[x]·W2 (0: no Markov head)
    injected_tokens_per_request: int = 8  # block: verified positions whose features enter the KV cache
    draft_vocab: int | None = None  # its LM head's rows (None: the target's vocabulary, shared)
    moe: bool = False  # its layers are copies of the target's MoE layer (else dense layers)
    window: int = 0  # sliding-window attention over this many tokens (0: the whole context)

    def __post_init__(self) -> None:
        if self.kind not in ("block", "mtp", "autoregressive"):
            raise ConfigError(f"drafter kind={self.kind!r} is not one of block, mtp, autoregressive")


# The three drafters the shipped analytic profiles price, for a Qwen3-class target
DSPARK_5 = DrafterShape()
MTP_1 = DrafterShape(name="mtp-1", kind="mtp", num_layers=1, gamma=7, num_target_features=2,
                     markov_rank=0, injected_tokens_per_request=0)
EAGLE3 = DrafterShape(name="eagle3", kind="autoregressive", num_layers=1, gamma=7,
                      num_target_features=3, markov_rank=0, injected_tokens_per_request=0,
                      draft_vocab=32000)
# For MoE targets (DeepSeek-V3): the model's own MTP module is one of its MoE layers, and
# the paper's production DSpark-5 is three MoE layers with a 128-token sliding window, block 5
MTP_1_MOE = DrafterShape(name="mtp-1", kind="mtp", num_layers=1, gamma=5, num_target_features=2,
                         markov_rank=0, injected_tokens_per_request=0, moe=True)
DSPARK_5_MOE = DrafterShape(name="dspark-5", kind="block", num_layers=3, gamma=5,
                            num_target_features=3, markov_rank=256, injected_tokens_per_request=6,
                            moe=True, window=128)


def drafter_presets(model: ModelSpec) -> dict[str, DrafterShape]:
    """The named drafters for `model`: MoE-layer shapes for an MoE target with MTP modules."""
    if model.is_moe and model.num_mtp_layers:
        return {"dspark-5": DSPARK_5_MOE, "mtp-1": MTP_1_MOE}
    return {"dspark-5": DSPARK_5, "mtp-1": MTP_1, "eagle3": EAGLE3}


DRAFTER_SOURCES = {
    "dspark-5": "DSpark in DeepSpec (deepseek-ai/DeepSpec): 5 target-width Qwen3 layers, block 7, "
                "5 injected target layers, Markov rank 256, a frozen copy of the target's LM head",
    "mtp-1": "DeepSeek-V3's MTP module (arXiv 2412.19437 §2.2): one target-width layer, a 2h→h "
             "projection of [embedding; hidden], the target's LM head shared; chained once per "
             "position past the first (the module is reused)",
    "eagle3": "EAGLE-3 (arXiv 2503.01840): one decoder layer over fused low/mid/high target "
              "features (3h→h), a 32k-token draft vocabulary (its released Llama/Qwen heads)",
    "dspark-5-moe": "DSpark's production drafter (DSpark paper §5.1: three MoE layers with mHC and "
                    "a 128-token sliding window, block at most 5), here three of the target's MoE "
                    "layers; 3 fused target features and 6 injected positions are assumptions",
    "mtp-1-moe": "the target's own MTP module (DeepSeek-V3 config num_nextn_predict_layers 1; "
                 "arXiv 2412.19437 §2.2): one MoE layer, a 2h→h projection, the shared LM head",
}


def _fc_params(model: ModelSpec, d: DrafterShape) -> int:
    return d.num_target_features * model.hidden * model.hidden


def _head_params(model: ModelSpec, d: DrafterShape) -> int:
    return (d.draft_vocab or model.vocab) * model.hidden


def _drafter_layer_read(model: ModelSpec, d: DrafterShape, tokens: ArrayLike) -> NDArray[np.float64]:
    """Weights (elements) the drafter's layers read for `tokens` tokens through them."""
    t = np.asarray(tokens, dtype=np.float64)
    if not d.moe:
        return np.full(t.shape, float(d.num_layers * model.layer_params))
    fixed = model.attn_params + model.hidden * model.num_experts + model.num_shared_experts * model.expert_params
    return d.num_layers * (fixed + model.experts_touched(t) * model.expert_params)


def _drafter_layer_active(model: ModelSpec, d: DrafterShape) -> int:
    """Weights (elements) one token goes through in the drafter's layers."""
    if not d.moe:
        return d.num_layers * model.layer_params
    return d.num_layers * (model.attn_params + model.hidden * model.num_experts + (
        model.experts_per_token + model.num_shared_experts) * model.expert_params)


def _drafter_kv_elems(model: ModelSpec, d: DrafterShape) -> float:
    """KV elements per context token the drafter keeps (its layers are the target's kind)."""
    return model.kv_bytes_per_token * d.num_layers / model.num_layers


def draft_flops(
    model: ModelSpec, drafter: DrafterShape, requests: ArrayLike, context: ArrayLike,
    positions: ArrayLike | None = None,
) -> NDArray[np.float64]:
    """Return the FLOPs of one drafting step for `requests` requests drafting `positions` each."""
    d = drafter
    r = np.asarray(requests, dtype=np.float64)
    c = np.asarray(context, dtype=np.float64)
    p = np.asarray(d.gamma if positions is None else positions, dtype=np.float64)
    attn = _attention_flops_per_token_ctx(model, d.num_layers)
    vocab = d.draft_vocab or model.vocab
    layers = _drafter_layer_active(model, d)
    if d.kind != "block":  # one pass of r tokens per position, each attending to the context
        per_pass = (2.0 * (layers + _fc_params(model, d) + _head_params(model, d)) * r
                    + attn * r * c)
        return p * per_pass
    block = r * p  # tokens through the backbone
    injected = r * d.injected_tokens_per_request
    kv_proj = model.hidden * _drafter_kv_elems(model, d) / max(d.num_layers, 1)
    return (
        2.0 * layers * block
        + 2.0 * (_fc_params(model, d) + d.num_layers * kv_proj) * injected
        + attn * block * (c + p)  # the block attends to the context and to itself
        + 2.0 * (vocab * model.hidden + d.markov_rank * vocab) * block
    )


def draft_bytes(
    model: ModelSpec,
    drafter: DrafterShape,
    requests: ArrayLike,
    context: ArrayLike,
    *,
    positions: ArrayLike | None = None,
    dtype_bytes: int = 2,
) -> NDArray[np.float64]:
    """Return the HBM bytes one drafting step moves: weights (per pass), LM head, KV, activations."""
    d = drafter
    r = np.asarray(requests, dtype=np.float64)
    c = np.asarray(context, dtype=np.float64)
    p = np.asarray(d.gamma if positions is None else positions, dtype=np.float64)
    kv_elems = _drafter_kv_elems(model, d)
    kv_s = kv_dtype_bytes(model, dtype_bytes)
    vocab = d.draft_vocab or model.vocab
    act_per_token = (dtype_bytes * (d.num_layers * _layer_act_elems(model) + model.hidden)
                     + LOGIT_BYTES * vocab)
    if d.kind != "block":  # every pass reads the weights and the context's KV again
        weights = dtype_bytes * (_drafter_layer_read(model, d, r) + _fc_params(model, d)
                                 + _head_params(model, d))
        per_pass = weights + r * c * kv_elems * kv_s + r * (
            act_per_token + kv_elems * kv_s)
        return p * per_pass
    block = r * p
    weights = dtype_bytes * (_drafter_layer_read(model, d, block) + _fc_params(model, d)
                             + _head_params(model, d))
    injected = r * d.injected_tokens_per_request
    markov = p * dtype_bytes * d.markov_rank * vocab  # the sequential loop reads W2 per position
    kv_read = r * (c + p) * kv_elems * kv_s
    kv_write = (injected + block) * kv_elems * kv_s
    acts = block * act_per_token + injected * dtype_bytes * (d.num_target_features + 1) * model.hidden
    return weights + markov + kv_read + kv_write + acts


def _drafter_collective_ms(hw: HardwareSpec, model: ModelSpec, d: DrafterShape, tokens: ArrayLike,
                           dtype_bytes: int, parallel: Parallelism) -> NDArray[np.float64]:
    """The collectives of one drafter pass over `tokens` tokens: the target's, per drafter layer."""
    full = collective_ms(hw, model, tokens, dtype_bytes=dtype_bytes, parallel=parallel)
    per = model.num_layers if parallel.mode == "tp" else max(model.moe_layers, 1)
    if parallel.mode == "dp-ep" and not d.moe:
        return np.zeros_like(full)
    return full * d.num_layers / per


def roofline_draft_ms(
    hw: HardwareSpec,
    model: ModelSpec,
    requests: ArrayLike,
    *,
    drafter: DrafterShape | None = None,
    positions: ArrayLike | None = None,
    context: ArrayLike = 4096,
    dtype_bytes: int = 2,
    parallel: Parallelism = SINGLE,
) -> NDArray[np.float64]:
    """Return the roofline time in ms of one drafting step for each count in `requests`, no graphs.

    `positions` (default: the drafter's full block) broadcasts against `requests`. Pass-based
    drafters (mtp, autoregressive) pay one roofline per pass; a block drafter one for the block.
    Its bytes and FLOPs are split over the replica's GPUs like the target's, with the same
    collectives per layer. It runs inside the engine step, so no step overhead is added.
    """
    d = drafter or DrafterShape()
    g = parallel.gpus
    p = np.asarray(d.gamma if positions is None else positions, dtype=np.float64)
    r = np.asarray(requests, dtype=np.float64)

    def per_gpu(total: NDArray[np.float64], tokens: NDArray[np.float64]) -> NDArray[np.float64]:
        if parallel.mode != "dp-ep":
            return total / g
        # data-parallel attention: all but the routed experts is on every GPU; each GPU reads
        # the touched slots it hosts
        if not d.moe:
            return total
        routed = dtype_bytes * d.num_layers * model.experts_touched(tokens) * model.expert_params
        slots = dtype_bytes * d.num_layers * _slots_touched(model, parallel, tokens) * model.expert_params
        return (total - routed) + slots / g

    def roofline(b: NDArray[np.float64], f: NDArray[np.float64], tokens: NDArray[np.float64]) -> NDArray[np.float64]:
        if not (d.moe and _routed_priced_apart(model, dtype_bytes, parallel)):
            return _roofline_ms(hw, b, f / g, dtype_bytes)
        routed = routed_compute_ms(hw, model, tokens, expert_layers=d.num_layers,
                                   dtype_bytes=dtype_bytes, parallel=parallel)
        return _roofline_ms(hw, b, (f - _routed_flops(model, d.num_layers, tokens)) / g, dtype_bytes, routed)

    if d.kind != "block":
        one = roofline(per_gpu(draft_bytes(model, d, r, context, positions=1, dtype_bytes=dtype_bytes), r),
                       draft_flops(model, d, r, context, positions=1), r)
        return p * (one + _drafter_collective_ms(hw, model, d, r, dtype_bytes, parallel))
    b = per_gpu(draft_bytes(model, d, r, context, positions=p, dtype_bytes=dtype_bytes), r * p)
    return roofline(b, draft_flops(model, d, r, context, positions=p), r * p) + _drafter_collective_ms(
        hw, model, d, r * p, dtype_bytes, parallel)


def draft_kv_ms_per_token(hw: HardwareSpec, model: ModelSpec, drafter: DrafterShape, *,
                          dtype_bytes: int = 2, parallel: Parallelism = SINGLE) -> float:
    """Return ms per context token for one read of the drafter's own KV cache (all its layers).

    The engine adds this × the batch's KV tokens (per pass for pass-based drafters) to the
    draft table, which is tabulated at `draft_context` = 0 by default. A drafter with a
    sliding window (`window`) reads a bounded cache, priced in its table instead: 0 here.
    """
    if drafter.window:
        return 0.0
    kv = _drafter_kv_elems(model, drafter) / parallel.kv_split(model)
    eff = MLA_ATTN_MEM_EFF if model.is_mla else hw.attn_mem_eff
    return kv * kv_dtype_bytes(model, dtype_bytes) / (hw.mem_bytes_per_s * eff) * 1e3


def graph_draft_ms(
    hw: HardwareSpec,
    model: ModelSpec,
    requests: ArrayLike,
    *,
    capture_sizes: Sequence[int],
    drafter: DrafterShape | None = None,
    positions: ArrayLike | None = None,
    context: ArrayLike = 4096,
    dtype_bytes: int = 2,
    parallel: Parallelism = SINGLE,
) -> NDArray[np.float64]:
    """Return the drafting time in ms with CUDA graphs, keyed, as the target's, by token count.

    A block pass carries R·positions tokens; each pass of a pass-based drafter carries R.
    """
    d = drafter or DrafterShape()
    r = np.asarray(requests, dtype=np.float64)
    p = np.asarray(d.gamma if positions is None else positions, dtype=np.float64)
    if d.window:  # a sliding-window drafter attends to at most `window` tokens
        context = np.minimum(np.asarray(context, np.float64), d.window)
    if d.kind != "block":
        padded, eager = pad_to_capture(r, capture_sizes)
        per_pass = roofline_draft_ms(hw, model, padded, drafter=d, positions=1, context=context,
                                     dtype_bytes=dtype_bytes, parallel=parallel)
        dispatch = hw.eager_overhead_ms(d.num_layers)
        return p * np.where(eager, eager_step_ms(per_pass, dispatch), per_pass)
    padded, eager = pad_to_capture(r * p, capture_sizes)
    base = roofline_draft_ms(hw, model, padded / p, drafter=d, positions=p, context=context,
                             dtype_bytes=dtype_bytes, parallel=parallel)
    return np.where(eager, eager_step_ms(base, hw.eager_overhead_ms(d.num_layers)), base)


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
    return int(max_tokens * (dtype_bytes * _layer_act_elems(model) + LOGIT_BYTES * model.vocab))


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
    if drafters:  # a deployment holds one drafter: the default one
        main = drafters[0]
        main_layers = (main.num_layers * model.moe_layer_params if main.moe
                       else main.num_layers * model.layer_params)
        weights += dtype_bytes * (main_layers + _fc_params(model, main)
                                  + (_head_params(model, main) if main.draft_vocab else 0))
    g = parallel.gpus
    replicated = 0  # dp-ep keeps attention, dense layers and embeddings on every GPU
    if parallel.mode == "dp-ep":  # and the redundant experts' copies
        routed = model.moe_layers * model.num_experts * model.expert_params
        replicated = dtype_bytes * ((model.params - routed) * (g - 1)
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
                                    "kv_dtype": "bf16", "compute_peak": "bf16", "source": MLA_SOURCE}
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
            "prefill_attention": "coef*((prefix+chunk)^2 - prefix^2), coef = 2*layers*heads*"
                                 "head_dim/(peak*attn_compute_eff)*1e3 (causal pairs, compute-bound)",
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
            "source": "hbm_bytes: datasheet; weights: the model's parameters and the default "
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
