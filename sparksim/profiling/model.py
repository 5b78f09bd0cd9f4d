"""A Llama/Qwen3-style decoder with random weights, shaped by a ModelSpec, for timing one step.

Reads bottom-up: layout of a verification step → KV cache → norm, RoPE → attention → MLP →
decoder layer → model. The model computes what a serving engine computes in one
verification step (embeddings, every layer, final norm and the LM head on every verified
token) so its time is the step's time; the weights are random because timing does not
depend on their values. Qwen3's per-head q/k RMSNorm is left out: it is elementwise and
costs nothing next to the matmuls.

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
        inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = position.float()[:, None] * inv_freq[None, :]  # (B, D/2)
        return cls(
            tokens=tokens, requests=requests, context=context, new_max=new_max,
            request_idx=request_idx.to(device), position=position.to(device),
            pad_idx=None if pad_idx is None else pad_idx.to(device), mask=mask.to(device),
            cos=angles.cos().to(device, dtype), sin=angles.sin().to(device, dtype),
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


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, heads, D) by per-token angles (B, D/2), half-split as in Llama/Qwen."""
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class Attention(nn.Module):
    """GQA self-attention with RoPE over the request's cached keys plus its new tokens."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_proj = nn.Linear(spec.hidden, spec.num_heads * spec.head_dim, bias=False)
        self.k_proj = nn.Linear(spec.hidden, spec.num_kv_heads * spec.head_dim, bias=False)
        self.v_proj = nn.Linear(spec.hidden, spec.num_kv_heads * spec.head_dim, bias=False)
        self.o_proj = nn.Linear(spec.num_heads * spec.head_dim, spec.hidden, bias=False)

    def write_kv(
        self, x: torch.Tensor, layout: StepLayout, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> None:
        """Project `x` (B, hidden) to keys and values and store them at the layout's slots."""
        B = x.shape[0]
        k = self.k_proj(x).view(B, self.num_kv_heads, self.head_dim)
        k = apply_rope(k, layout.cos, layout.sin)
        v = self.v_proj(x).view(B, self.num_kv_heads, self.head_dim)
        # In-place scatter into the preallocated cache: what a paged-KV write does.
        k_cache[layout.request_idx, :, layout.position] = k
        v_cache[layout.request_idx, :, layout.position] = v

    def forward(
        self, x: torch.Tensor, layout: StepLayout, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        B, R, n = x.shape[0], layout.requests, layout.new_max
        kv, g, D = self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim
        self.write_kv(x, layout, k_cache, v_cache)
        q = apply_rope(self.q_proj(x).view(B, self.num_heads, D), layout.cos, layout.sin)
        if layout.pad_idx is not None:
            # Uneven requests: scatter into an (R·n) padded grid; padded rows are discarded.
            padded = q.new_zeros(R * n, self.num_heads, D)
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
        return self.o_proj(out)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) · up(x))."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.input_norm = RMSNorm(spec.hidden)
        self.attn = Attention(spec)
        self.post_attn_norm = RMSNorm(spec.hidden)
        self.mlp = MLP(spec.hidden, spec.intermediate)

    def forward(
        self, x: torch.Tensor, layout: StepLayout, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.attn(self.input_norm(x), layout, k_cache, v_cache)
        return x + self.mlp(self.post_attn_norm(x))


class DecoderModel(nn.Module):
    """The target model: embeddings, decoder layers, final norm and LM head on every token."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, layout: StepLayout, cache: KVCache) -> torch.Tensor:
        """Return logits (B, vocab) for the flattened step `ids` (B,), writing its KV in place."""
        x = self.embed(ids)  # (B, hidden)
        for i, layer in enumerate(self.layers):
            x = layer(x, layout, cache.k[i], cache.v[i])
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
