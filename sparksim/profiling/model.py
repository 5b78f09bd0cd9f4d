"""A Llama/Qwen3-style decoder with random weights, shaped by a ModelSpec, for timing one step.

Reads bottom-up: layout of a verification step → KV cache → attention over the cache →
layer → model. The layers are `sparksim.decoder`'s; what is the profiler's own is the serving
layout they run in. The model computes what a serving engine computes in one verification
step (embeddings, every layer, final norm and the LM head on every verified token) so its
time is the step's time; the weights are random because timing does not depend on their
values. Qwen3's per-head q/k RMSNorm is left out: it is elementwise and costs nothing next
to the matmuls.

Tokens are flattened as DSpark's variable-length verification does: B tokens from R
requests sit in one (B, hidden) matrix for every linear layer, and only attention
regroups them per request. The KV cache is preallocated once and written in place, so no
step copies or concatenates it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sparksim.cost.models import ModelSpec
from sparksim.decoder import Attention, Block, BlockConfig, RMSNorm, rope_angles

ROPE_THETA = 1_000_000.0  # Qwen3's base; Llama 3.1 uses 500k; the cost is the same


def num_requests(tokens: int, tokens_per_request: int) -> int:
    """Return R = ceil(tokens / tokens_per_request), the requests a step of `tokens` holds."""
    return max(1, -(-tokens // tokens_per_request))


@dataclass
class StepLayout:
    """Where each of a step's B flattened tokens sits: its request, its position, its slot.

    Requests split the B tokens as evenly as possible (the first B mod R take one more),
    each appends its new tokens after `context` cached ones, and attends causally.
    """

    tokens: int  # B
    requests: int  # R
    context: int  # KV tokens cached per request before this step
    new_max: int  # n = ceil(B / R), new tokens of the longest request
    request_idx: torch.Tensor  # (B,) request of each token
    position: torch.Tensor  # (B,) absolute position of each token (context + offset)
    pad_idx: torch.Tensor | None  # (B,) slot in the padded (R·n) layout; None when B = R·n
    mask: torch.Tensor  # (group·n, context + n) True where a query may attend a key
    cos: torch.Tensor  # (B, head_dim / 2)
    sin: torch.Tensor  # (B, head_dim / 2)

    @classmethod
    def build(
        cls, tokens: int, requests: int, context: int, spec: ModelSpec, device: torch.device,
        dtype: torch.dtype, *, bidirectional: bool = False,
    ) -> StepLayout:
        """Lay out `tokens` new tokens over `requests` requests with `context` cached tokens each.

        The mask is tiled once per query head sharing a KV head (GQA folded into the query
        length, see Attention). `bidirectional` lets every new token of a request see all of that request's new tokens
        (a DSpark drafter block) instead of only the earlier ones (verification).
        """
        new_max = -(-tokens // requests)
        head_dim, group = spec.head_dim, spec.num_heads // spec.num_kv_heads
        base, extra = divmod(tokens, requests)
        counts = torch.full((requests,), base, dtype=torch.long)
        counts[:extra] += 1
        request_idx = torch.repeat_interleave(torch.arange(requests), counts)  # (B,)
        starts = torch.cumsum(counts, 0) - counts  # cu_seqlens without the trailing total
        offset = torch.arange(tokens) - starts[request_idx]  # (B,) index within the request
        pad_idx = None if tokens == requests * new_max else request_idx * new_max + offset
        keys = torch.arange(context + new_max)
        queries = torch.arange(new_max)
        limit = torch.full_like(queries, context + new_max - 1) if bidirectional else context + queries
        mask = (keys[None, :] <= limit[:, None]).repeat(group, 1)  # (group·n, L)
        position = context + offset
        cos, sin = rope_angles(position, head_dim, ROPE_THETA)  # (B, D/2)
        return cls(
            tokens=tokens, requests=requests, context=context, new_max=new_max,
            request_idx=request_idx.to(device), position=position.to(device),
            pad_idx=None if pad_idx is None else pad_idx.to(device), mask=mask.to(device),
            cos=cos.to(device, dtype), sin=sin.to(device, dtype),
        )


class KVCache:
    """Preallocated K and V for `requests` requests × `length` positions, all layers.

    Shape (layers, R, kv_heads, length, head_dim); a step with fewer requests uses the first
    R rows, so one cache serves every batch size of a sweep at one context.
    """

    def __init__(
        self, num_layers: int, requests: int, num_kv_heads: int, length: int, head_dim: int,
        device: torch.device, dtype: torch.dtype,
    ) -> None:
        shape = (num_layers, requests, num_kv_heads, length, head_dim)
        # Zeros rather than random values: the attention cost does not depend on them and
        # filling gigabytes with randn would dominate a CPU sweep.
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def requests(self) -> int:
        return int(self.k.shape[1])

    @property
    def length(self) -> int:
        return int(self.k.shape[3])


def block_config(spec: ModelSpec) -> BlockConfig:
    """Return the decoder layer of `spec`: GQA, separate q/k/v, RoPE halves (HF), no q/k norm."""
    return BlockConfig(d_model=spec.hidden, n_heads=spec.num_heads, n_kv_heads=spec.num_kv_heads,
                       head_dim=spec.head_dim, d_ff=spec.intermediate, rope_theta=ROPE_THETA, qk_norm=False)


def write_kv(k: torch.Tensor, v: torch.Tensor, layout: StepLayout, k_cache: torch.Tensor,
             v_cache: torch.Tensor) -> None:
    """Store keys and values (B, kv_heads, D) at the layout's slots of the caches (R, kv_heads, L, D)."""
    # In-place scatter into the preallocated cache: what a paged-KV write does.
    k_cache[layout.request_idx, :, layout.position] = k
    v_cache[layout.request_idx, :, layout.position] = v


def step_attention(
    attn: Attention, x: torch.Tensor, layout: StepLayout, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> torch.Tensor:
    """Attend from the step's tokens x (B, hidden) to their request's cache plus themselves; write their KV."""
    R, n = layout.requests, layout.new_max
    kv, g, D = attn.n_kv_heads, attn.n_heads // attn.n_kv_heads, attn.head_dim
    q, k, v = attn.project(x, layout.cos, layout.sin)  # (B, H, D), (B, kv, D), (B, kv, D)
    write_kv(k, v, layout, k_cache, v_cache)
    if layout.pad_idx is not None:
        # Uneven requests: scatter into an (R·n) padded grid; padded rows are discarded.
        padded = q.new_zeros(R * n, attn.n_heads, D)
        q = padded.index_copy_(0, layout.pad_idx, q)
    # GQA by folding each KV head's g query heads into the query length, as decode
    # kernels do: every KV head is read once and never expanded g times.
    q = q.view(R, n, kv, g, D).permute(0, 2, 3, 1, 4).reshape(R, kv, g * n, D)
    L = layout.context + n
    out = F.scaled_dot_product_attention(
        q, k_cache[:R, :, :L], v_cache[:R, :, :L], attn_mask=layout.mask,
    )  # (R, kv, g·n, D)
    out = out.view(R, kv, g, n, D).permute(0, 3, 1, 2, 4).reshape(R * n, kv * g * D)
    if layout.pad_idx is not None:
        out = out.index_select(0, layout.pad_idx)  # (B, H·D)
    return attn.out(out)


def layer_step(
    layer: Block, x: torch.Tensor, layout: StepLayout, k_cache: torch.Tensor, v_cache: torch.Tensor
) -> torch.Tensor:
    """Run one pre-norm layer over the step's flattened tokens x (B, hidden) with its cache."""
    x = x + step_attention(layer.attn, layer.attn_norm(x), layout, k_cache, v_cache)
    return x + layer.mlp(layer.mlp_norm(x))


class DecoderModel(nn.Module):
    """The target model: embeddings, decoder layers, final norm and LM head on every token."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab, spec.hidden)
        self.layers: list[Block] = nn.ModuleList(  # type: ignore[assignment]
            Block(block_config(spec)) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, layout: StepLayout, cache: KVCache) -> torch.Tensor:
        """Return logits (B, vocab) for the flattened step `ids` (B,), writing its KV in place."""
        x = self.embed(ids)  # (B, hidden)
        for i, layer in enumerate(self.layers):
            x = layer_step(layer, x, layout, cache.k[i], cache.v[i])
        # Verification needs the target's distribution at every verified position.
        return self.lm_head(self.norm(x))  # (B, V)


def init_random_(module: nn.Module, seed: int = 0) -> None:
    """Fill weights with N(0, 1/fan_in) and norm scales with 1, in place on their device.

    Realistic magnitudes matter on CPUs, where denormal numbers are slow.
    """
    device = next(module.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, RMSNorm):
                sub.weight.fill_(1.0)
            elif isinstance(sub, (nn.Linear, nn.Embedding)):
                sub.weight.normal_(0.0, 1.0 / math.sqrt(sub.weight.shape[-1]), generator=gen)
                bias = getattr(sub, "bias", None)
                if isinstance(bias, torch.Tensor):
                    bias.zero_()


def materialise(module: nn.Module, device: torch.device, dtype: torch.dtype, seed: int = 0) -> None:
    """Allocate a meta-device module on `device` in `dtype` and fill it with random weights.

    Building on the meta device first skips PyTorch's default init, which for an 8B model
    would spend a minute on CPU filling 32 GB of float32 that is thrown away.
    """
    module.to(dtype=dtype)
    module.to_empty(device=device)
    init_random_(module, seed)


def build_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype, seed: int = 0) -> DecoderModel:
    """Build the target decoder for `spec` with random weights, on `device` in `dtype`."""
    with torch.device("meta"):
        model = DecoderModel(spec)
    materialise(model, device, dtype, seed)
    if spec.tie_embeddings:
        model.lm_head.weight = model.embed.weight
    return model.eval()
