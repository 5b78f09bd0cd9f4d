"""Prices a drafting step on the roofline: the drafters' shapes, their bytes, FLOPs and time.

Drafters are priced by kind (a parallel block, chained MTP modules, an autoregressive Eagle
head) and drafted positions. Their layers are the target's kind (dense, or its MoE layer),
split over the replica's GPUs as the target's are (`sparksim.cost.parallelism`), and a
pass runs as a CUDA-graph engine runs it (`sparksim.cost.cuda_graphs`). docs/profiles.md
derives every term.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sparksim.cost.cuda_graphs import eager_step_ms, pad_to_capture
from sparksim.cost.models import ModelSpec
from sparksim.cost.parallelism import (
    SINGLE,
    Parallelism,
    collective_ms,
    routed_compute_ms,
    routed_flops,
    routed_priced_apart,
    slots_touched,
)
from sparksim.cost.target_step import LOGIT_BYTES, kv_dtype_bytes, layer_act_elems, roofline_ms
from sparksim.errors import ConfigError
from sparksim.hardware import MLA_ATTN_MEM_EFF, HardwareSpec


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


def fc_params(model: ModelSpec, d: DrafterShape) -> int:
    return d.num_target_features * model.hidden * model.hidden


def head_params(model: ModelSpec, d: DrafterShape) -> int:
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


def _attention_flops_per_token_ctx(model: ModelSpec, num_layers: int) -> int:
    """FLOPs per (query token × context token) over `num_layers` layers (see ModelSpec)."""
    return model.attention_flops_per_pair * num_layers // model.num_layers


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
        per_pass = (2.0 * (layers + fc_params(model, d) + head_params(model, d)) * r
                    + attn * r * c)
        return p * per_pass
    block = r * p  # tokens through the backbone
    injected = r * d.injected_tokens_per_request
    kv_proj = model.hidden * _drafter_kv_elems(model, d) / max(d.num_layers, 1)
    return (
        2.0 * layers * block
        + 2.0 * (fc_params(model, d) + d.num_layers * kv_proj) * injected
        + attn * block * (c + p)  # the block attends to the context and to itself
        + 2.0 * (vocab * model.hidden + d.markov_rank * vocab) * block
    )


def draft_weight_bytes(
    model: ModelSpec,
    drafter: DrafterShape,
    requests: ArrayLike,
    *,
    positions: ArrayLike | None = None,
    dtype_bytes: int = 2,
) -> NDArray[np.float64]:
    """Return the weight bytes one drafting step reads (its layers, projection, LM head and
    Markov head): every pass of a pass-based drafter reads them again, a block drafter once."""
    d = drafter
    r = np.asarray(requests, dtype=np.float64)
    p = np.asarray(d.gamma if positions is None else positions, dtype=np.float64)
    if d.kind != "block":
        return p * dtype_bytes * (_drafter_layer_read(model, d, r) + fc_params(model, d)
                                  + head_params(model, d))
    vocab = d.draft_vocab or model.vocab
    markov = p * dtype_bytes * d.markov_rank * vocab  # the sequential loop reads W2 per position
    return dtype_bytes * (_drafter_layer_read(model, d, r * p) + fc_params(model, d)
                          + head_params(model, d)) + markov


def draft_bytes(
    model: ModelSpec,
    drafter: DrafterShape,
    requests: ArrayLike,
    context: ArrayLike,
    *,
    positions: ArrayLike | None = None,
    dtype_bytes: int = 2,
) -> NDArray[np.float64]:
    """Return the HBM bytes one drafting step moves: weights (`draft_weight_bytes`), KV, activations."""
    d = drafter
    r = np.asarray(requests, dtype=np.float64)
    c = np.asarray(context, dtype=np.float64)
    p = np.asarray(d.gamma if positions is None else positions, dtype=np.float64)
    weights = draft_weight_bytes(model, d, r, positions=p, dtype_bytes=dtype_bytes)
    kv_elems = _drafter_kv_elems(model, d)
    kv_s = kv_dtype_bytes(model, dtype_bytes)
    vocab = d.draft_vocab or model.vocab
    act_per_token = (dtype_bytes * (d.num_layers * layer_act_elems(model) + model.hidden)
                     + LOGIT_BYTES * vocab)
    if d.kind != "block":  # every pass reads the context's KV again
        return weights + p * (r * c * kv_elems * kv_s + r * (act_per_token + kv_elems * kv_s))
    block = r * p
    injected = r * d.injected_tokens_per_request
    kv_read = r * (c + p) * kv_elems * kv_s
    kv_write = (injected + block) * kv_elems * kv_s
    acts = block * act_per_token + injected * dtype_bytes * (d.num_target_features + 1) * model.hidden
    return weights + kv_read + kv_write + acts


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

    def per_gpu(total: NDArray[np.float64], weights: NDArray[np.float64],
                tokens: NDArray[np.float64]) -> NDArray[np.float64]:
        if parallel.mode != "dp-ep":
            return total / g
        # data-parallel attention, as the target's (`dense_bytes`): each GPU reads all but the
        # routed experts' weights and the touched slots it hosts, and its 1/G of the requests'
        # KV and activations
        rest = (total - weights) / g
        if not d.moe:
            return weights + rest
        routed = dtype_bytes * d.num_layers * model.experts_touched(tokens) * model.expert_params
        slots = dtype_bytes * d.num_layers * slots_touched(model, parallel, tokens) * model.expert_params
        return (weights - routed) + slots / g + rest

    def roofline(b: NDArray[np.float64], f: NDArray[np.float64], tokens: NDArray[np.float64]) -> NDArray[np.float64]:
        if not (d.moe and routed_priced_apart(model, dtype_bytes, parallel)):
            return roofline_ms(hw, b, f / g, dtype_bytes)
        routed = routed_compute_ms(hw, model, tokens, expert_layers=d.num_layers,
                                   dtype_bytes=dtype_bytes, parallel=parallel)
        return roofline_ms(hw, b, (f - routed_flops(model, d.num_layers, tokens)) / g, dtype_bytes, routed)

    if d.kind != "block":
        one = roofline(per_gpu(draft_bytes(model, d, r, context, positions=1, dtype_bytes=dtype_bytes),
                               draft_weight_bytes(model, d, r, positions=1, dtype_bytes=dtype_bytes), r),
                       draft_flops(model, d, r, context, positions=1), r)
        return p * (one + _drafter_collective_ms(hw, model, d, r, dtype_bytes, parallel))
    b = per_gpu(draft_bytes(model, d, r, context, positions=p, dtype_bytes=dtype_bytes),
                draft_weight_bytes(model, d, r, positions=p, dtype_bytes=dtype_bytes), r * p)
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
