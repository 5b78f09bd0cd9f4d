"""Holds how one replica spreads over its GPUs (`Parallelism`) and what the split costs a step.

Its terms on the roofline: the step's collectives (tensor parallelism's all-reduces,
expert parallelism's all-to-alls within and across nodes), dual-batch overlap of kernels
and collectives (`overlapped`), and the routed experts' GEMMs on the replica's busiest GPU
(`routed_compute_ms`: the expert imbalance, and DeepGEMM's grouped-GEMM efficiency in FP8).
docs/profiles.md derives every term.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sparksim.cost.models import ModelSpec
from sparksim.errors import ConfigError
from sparksim.hardware import HardwareSpec, grouped_gemm_eff

# an FP8 model's hidden states between GPUs travel in BF16 (`collective_ms`)
FP8_ACTIVATION_BYTES = 2
FP8_DISPATCH_BYTES = 1 + 4 / 128  # an FP8 value, and a float32 scale per 128 channels


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


def slots_touched(model: ModelSpec, parallel: Parallelism, tokens: ArrayLike) -> NDArray[np.float64]:
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

    s is the activations' size: the weights' dtype, except that an FP8 model's GEMMs read FP8
    weights while its hidden states, all-reduced or combined, are BF16 (2 bytes). The one
    FP8 transfer is an FP8 model's dispatch, which DeepEP sends in FP8 (1 byte a value, and a
    float32 scale per 128 channels): deepseek-ai/DeepEP's README benchmarks "FP8 dispatching and BF16
    combining", the DeepSeek-V3/R1 setting, for its normal and low-latency kernels alike.
    """
    t = np.asarray(tokens, dtype=np.float64)
    g = parallel.gpus
    if g == 1:
        return np.zeros_like(t)
    lat_ms = hw.collective_latency_us / 1e3
    per_byte_ms = 1e3 / (hw.link_bytes_per_s * hw.link_eff)
    act_bytes = FP8_ACTIVATION_BYTES if dtype_bytes == 1 else dtype_bytes
    if parallel.mode == "tp":
        one = lat_ms + 2 * (g - 1) / g * t * model.hidden * act_bytes * per_byte_ms
        return 2 * model.num_layers * one
    local = parallel.gpus_per_node

    def all_to_all_ms(value_bytes: float) -> NDArray[np.float64]:
        # bytes each GPU sends, and the most-loaded GPU receives; both links busy at once
        sent = (t / g) * model.experts_per_token * model.hidden * value_bytes * parallel.expert_imbalance
        nvlink_ms = sent * (local - 1) / g * per_byte_ms  # to the other GPUs of its node
        network_ms = sent * (g - local) / g * 1e3 / (hw.internode_bytes_per_s * hw.internode_eff)
        return lat_ms + np.maximum(nvlink_ms, network_ms)

    # an FP8 model dispatches FP8 values with one float32 scale per 128 (DeepEP's layout)
    dispatch_bytes = FP8_DISPATCH_BYTES if dtype_bytes == 1 else act_bytes
    return model.moe_layers * (all_to_all_ms(dispatch_bytes) + all_to_all_ms(act_bytes))


def overlapped(compute_ms: ArrayLike, comm_ms: ArrayLike, parallel: Parallelism) -> NDArray[np.float64]:
    """A step's kernels and its collectives: their sum, or with dual-batch overlap (two
    micro-batches, each one's communication running under the other's compute) the larger."""
    c, m = np.asarray(compute_ms, dtype=np.float64), np.asarray(comm_ms, dtype=np.float64)
    return np.maximum(c, m) if parallel.micro_batches == 2 else c + m


def routed_priced_apart(model: ModelSpec, dtype_bytes: int, parallel: Parallelism) -> bool:
    """Whether the routed experts' GEMMs get their own price: DeepGEMM's table covers FP8
    grouped GEMMs, and an uneven expert load slows them alone. Otherwise they are GEMMs like
    the rest, summed with them (so BF16 MoE profiles keep their numbers to the last bit)."""
    return model.is_moe and (dtype_bytes == 1 or parallel.expert_imbalance != 1.0)


def routed_flops(model: ModelSpec, expert_layers: int, tokens: ArrayLike) -> NDArray[np.float64]:
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
    flops = routed_flops(model, expert_layers, t) / parallel.gpus * imbalance
    if model.is_moe and dtype_bytes == 1:  # DeepGEMM's grouped FP8 kernels
        per_expert = imbalance * t * model.experts_per_token / parallel.expert_slots(model)
        eff = grouped_gemm_eff(per_expert)
    else:
        eff = np.full(t.shape, hw.compute_eff)
    return flops / (hw.peak_for(dtype_bytes) * eff) * 1e3
