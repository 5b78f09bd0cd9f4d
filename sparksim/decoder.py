"""The one decoder block (RMSNorm, RoPE, attention, SwiGLU) every torch model in sparksim is built from.

Reads bottom-up: config → norm → RoPE → attention → MLP → block. The built-in target
(`drafter/target.py`), sparksim's DSpark drafter (`drafter/model.py`), DeepSpec checkpoints
(`drafter/deepspec/models.py`), the profiler's random-weight decoder (`profiling/model.py`) and
the live engine's batched steps (`live/step.py`) all build their layers here. They differ only
in `BlockConfig`'s fields, each there because a checkpoint or a model family needs it:

- `n_kv_heads < n_heads` (grouped-query attention): Qwen3/Llama targets and DeepSpec drafters.
- `proj`, how the q/k/v weights are stored: the built-in target's checkpoints hold one fused
  `qkv` matrix, sparksim's drafter `q` and a fused `kv`, HF and DeepSpec three. Splitting a fused
  matrix on load would change the matmul shapes and with them the last bits of the logits.
- `rope_interleaved`: sparksim's checkpoints were trained rotating pairs (2i, 2i+1), HF models
  rotate halves (i, i + Dh/2); the same rotation with the lanes in another order.
- `qk_norm`: Qwen3's per-head RMSNorm of q and k; the profiler leaves it out (Llama has none,
  and next to the matmuls it costs nothing).
- `bias`: DeepSpec's `attention_bias`.

Tokens are token-major everywhere: `Attention.project` maps (…, d) to per-head (…, heads, Dh)
for any leading shape, so a batched (B, T, d) forward and a serving engine's flattened (N, d)
step share it; only `Attention.forward` regroups heads for a (B, T, d) batch. RoPE angles come
from `rope_angles`; callers pass cos/sin with one row per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Proj = Literal["qkv", "q,kv", "q,k,v"]
KV = tuple[Tensor, Tensor]  # keys, values (B, Hkv, S, Dh)


@dataclass(frozen=True)
class BlockConfig:
    """The shape of one pre-norm decoder layer."""

    d_model: int  # residual width d
    n_heads: int  # query heads H
    n_kv_heads: int  # key/value heads; fewer than H is grouped-query attention
    head_dim: int  # per-head width Dh (H·Dh need not equal d)
    d_ff: int  # SwiGLU hidden width
    rope_theta: float  # RoPE base
    proj: Proj = "q,k,v"  # how q/k/v weights are stored: one fused matrix, q + fused kv, or three
    rope_interleaved: bool = False  # rotate pairs (2i, 2i+1) (sparksim's checkpoints) or halves (HF)
    qk_norm: bool = True  # per-head RMSNorm of q and k before RoPE (Qwen3)
    bias: bool = False  # biases on the q/k/v/out projections
    norm_eps: float = 1e-6  # RMSNorm epsilon


# --------------------------------------------------------------------------- norm and RoPE


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_angles(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """Return float32 cos and sin (…, Dh/2) of each position p (…) times the frequencies θ^(−2i/Dh).

    Models that run many steps keep `rope_angles(torch.arange(max_len), …)` as a table and
    index it by position: the same numbers, computed once.
    """
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)  # (Dh/2,)
    ang = positions.float()[..., None] * inv  # (…, Dh/2)
    return ang.cos(), ang.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """Rotate each pair (x1, x2) of x (…, Dh) to (x1·c − x2·s, x1·s + x2·c); cos/sin broadcast to (…, Dh/2).

    The pairs are (2i, 2i+1) when `interleaved`, else (i, i + Dh/2).
    """
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)


# --------------------------------------------------------------------------- attention


class Attention(nn.Module):
    """Self-attention with optional GQA, q/k RMSNorm and RoPE; past or injected keys go in front."""

    def __init__(self, cfg: BlockConfig, in_dim: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        d_in, d_q, d_kv = in_dim or cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        self.sizes = (d_q, d_kv, d_kv)
        # Built in the order the checkpoints' trainings built them, so seeded inits are unchanged.
        self.qkv = nn.Linear(d_in, d_q + 2 * d_kv, bias=cfg.bias) if cfg.proj == "qkv" else None
        self.q = nn.Linear(d_in, d_q, bias=cfg.bias) if cfg.proj != "qkv" else None
        self.kv = nn.Linear(d_in, 2 * d_kv, bias=cfg.bias) if cfg.proj == "q,kv" else None
        self.k = nn.Linear(d_in, d_kv, bias=cfg.bias) if cfg.proj == "q,k,v" else None
        self.v = nn.Linear(d_in, d_kv, bias=cfg.bias) if cfg.proj == "q,k,v" else None
        self.out = nn.Linear(d_q, cfg.d_model, bias=cfg.bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def _linear_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        if self.kv is not None:
            k, v = self.kv(x).split(self.sizes[1:], dim=-1)
            return k, v
        assert self.k is not None and self.v is not None
        return self.k(x), self.v(x)

    def _heads(self, x: Tensor, norm: RMSNorm | None, cos: Tensor | None, sin: Tensor | None) -> Tensor:
        x = x.unflatten(-1, (-1, self.head_dim))  # (…, heads, Dh)
        if norm is not None:
            x = norm(x)
        if cos is None or sin is None:
            return x
        return apply_rope(x, cos[..., None, :], sin[..., None, :], self.cfg.rope_interleaved)

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Return q (…, H, Dh), k and v (…, Hkv, Dh) of tokens x (…, in), q and k normed and rotated.

        cos/sin (…, Dh/2) hold each token's RoPE angles (`rope_angles` of its position).
        """
        if self.qkv is not None:
            q, k, v = self.qkv(x).split(self.sizes, dim=-1)
        else:
            assert self.q is not None
            q, (k, v) = self.q(x), self._linear_kv(x)
        return (self._heads(q, self.q_norm, cos, sin), self._heads(k, self.k_norm, cos, sin),
                self._heads(v, None, None, None))

    def project_kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Return k (normed, rotated) and v, each (…, Hkv, Dh), of tokens x (…, in): keys others attend to."""
        if self.qkv is not None:
            _, k, v = self.qkv(x).split(self.sizes, dim=-1)
        else:
            k, v = self._linear_kv(x)
        return self._heads(k, self.k_norm, cos, sin), self._heads(v, None, None, None)

    def context_kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> KV:
        """Return `project_kv` of x (B, S, in) head-major, (B, Hkv, S, Dh) each: an injected prefix for `forward`."""
        k, v = self.project_kv(x, cos, sin)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None = None,
                past: KV | None = None) -> tuple[Tensor, KV]:
        """Attend from tokens x (B, T, in) to `past` keys (B, Hkv, S, Dh) followed by their own.

        cos/sin (B, T, Dh/2) are the tokens' RoPE angles; mask (B, 1, T, S+T) bool, or None for
        causal attention among the new tokens. Returns the output (B, T, d) and all keys/values
        (B, Hkv, S+T, Dh), the cache for the next call.
        """
        B, T = x.shape[:2]
        q, k, v = (t.transpose(1, 2) for t in self.project(x, cos, sin))  # (B, heads, T, Dh)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, Hkv, S+T, Dh)
        if mask is None and past is not None and T > 1:
            # causal among the new tokens, each after every past key: SDPA's is_causal aligns
            # its triangle to the top left, which with a past would hide the new keys' order
            S = k.shape[2] - T
            mask = torch.ones(T, S + T, dtype=torch.bool, device=k.device).tril(diagonal=S)
        causal = mask is None and T > 1
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                           enable_gqa=self.n_kv_heads != self.n_heads)  # (B, H, T, Dh)
        return self.out(y.transpose(1, 2).reshape(B, T, -1)), (k, v)


# --------------------------------------------------------------------------- MLP and block


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) · up(x))."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """Pre-norm decoder layer: x + attn(attn_norm(x)), then x + mlp(mlp_norm(x))."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg.d_model, cfg.d_ff)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None = None,
                past: KV | None = None) -> tuple[Tensor, KV]:
        """Return the layer's output (B, T, d) for x (B, T, d) and its keys/values (see `Attention.forward`)."""
        a, kv = self.attn(self.attn_norm(x), cos, sin, mask, past)
        x = x + a
        return x + self.mlp(self.mlp_norm(x)), kv
