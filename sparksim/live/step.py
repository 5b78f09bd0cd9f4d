"""The live engine's step functions: batched, KV-cached forwards of the target and the drafter.

Running requests sit in cache slots 0..m−1 (a finished request's slot is refilled by the
last one, so a step's caches are always a leading view, never a gather). Slot r holds
`length[r]` tokens of target KV (every token but the request's anchor, the last emitted
one) and the drafter's injected context for the same positions.

A step's new tokens are flattened, as a variable-length serving engine does: every linear
layer runs on one (T, d) matrix of the T = Σ_r q_r tokens, and only attention regroups
them per request, padded to the longest request's q and the longest context. The
functions compute exactly what `TinyLM.forward` and `Drafter.backbone` compute over the
whole sequence (tests/test_live.py checks both).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sparksim.drafter.model import BlockOutput, Drafter
from sparksim.drafter.target import TinyLM


@dataclass
class Ragged:
    """Where a step's T flattened tokens sit: request r owns q_r tokens at positions start_r.. ."""

    starts: Tensor  # (m,) first new position of each request (its cached length)
    counts: Tensor  # (m,) q_r ≥ 1 new tokens per request
    row: Tensor  # (T,) request of each flattened token
    col: Tensor  # (T,) its offset inside the request, 0..q_r−1
    pos: Tensor  # (T,) absolute position: starts[row] + col
    q_max: int  # longest request's new tokens
    kv_max: int  # longest request's context after the step: max(starts + counts)

    @classmethod
    def build(cls, starts: list[int], counts: list[int]) -> Ragged:
        st = torch.tensor(starts, dtype=torch.long)
        n = torch.tensor(counts, dtype=torch.long)
        row = torch.repeat_interleave(torch.arange(len(counts)), n)
        first = torch.cumsum(n, 0) - n
        col = torch.arange(int(n.sum())) - first[row]
        return cls(st, n, row, col, st[row] + col, int(n.max()), int((st + n).max()))

    @property
    def tokens(self) -> int:
        return int(self.row.shape[0])

    def padded(self, x: Tensor) -> Tensor:
        """Scatter flat (T, …) rows into a zero-padded (m, q_max, …) tensor."""
        out = x.new_zeros((self.counts.shape[0], self.q_max, *x.shape[1:]))
        out[self.row, self.col] = x
        return out

    def causal_mask(self) -> Tensor:
        """(m, 1, q_max, kv_max): query i of request r sees keys at positions ≤ start_r + i."""
        q_pos = self.starts[:, None] + torch.arange(self.q_max)  # (m, q_max)
        return (torch.arange(self.kv_max)[None, None, :] <= q_pos[:, :, None]).unsqueeze(1)


class TargetKV:
    """Preallocated per-slot KV cache of the built-in target: (layers, slots, heads, max_len, head_dim)."""

    def __init__(self, model: TinyLM, slots: int, max_len: int) -> None:
        cfg = model.cfg
        hd = cfg.d_model // cfg.n_heads
        self.k = torch.zeros(cfg.n_layers, slots, cfg.n_heads, max_len, hd)
        self.v = torch.zeros_like(self.k)
        self.max_len = max_len

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy slot `src`'s first `length` positions into slot `dst`."""
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]


@torch.inference_mode()
def target_step(model: TinyLM, kv: TargetKV, lo: int, ids: Tensor, rg: Ragged) -> tuple[Tensor, list[Tensor]]:
    """Run the target over slots lo..lo+m−1's new tokens `ids` (T,); write their KV.

    Returns logits (T, V) and the hidden states (HF convention: entry 0 the embeddings,
    entry i decoder layer i−1's output, the last after the final norm), each (T, d).
    """
    m = rg.counts.shape[0]
    heads, hd = model.cfg.n_heads, model.cfg.d_model // model.cfg.n_heads
    mask = rg.causal_mask()
    slot = rg.row + lo
    cos, sin = model.rope_cos[rg.pos], model.rope_sin[rg.pos]  # (T, Dh/2)
    x = model.embed(ids)  # (T, d)
    hidden = [x]
    for li, layer in enumerate(model.layers):
        att = layer.attn
        q, k, v = att.project(layer.attn_norm(x), cos, sin)  # (T, H, Dh) each
        kv.k[li, slot, :, rg.pos] = k
        kv.v[li, slot, :, rg.pos] = v
        keys = kv.k[li, lo: lo + m, :, : rg.kv_max]  # (m, H, K, Dh): a view, no copy
        vals = kv.v[li, lo: lo + m, :, : rg.kv_max]
        qp = rg.padded(q).transpose(1, 2)  # (m, H, q_max, Dh)
        y = F.scaled_dot_product_attention(qp, keys, vals, attn_mask=mask)  # (m, H, q_max, Dh)
        y = y.transpose(1, 2)[rg.row, rg.col].reshape(-1, heads * hd)  # back to (T, d)
        x = x + att.out(y)
        x = x + layer.mlp(layer.mlp_norm(x))
        hidden.append(x)
    x = model.norm(x)
    hidden[-1] = x
    return model.lm_head(x), hidden


class DrafterKV:
    """Per-slot keys/values of the drafter's injected context, one pair per drafter layer."""

    def __init__(self, drafter: Drafter, slots: int, max_len: int) -> None:
        cfg = drafter.cfg
        hd = cfg.d_model // cfg.n_heads
        self.k = torch.zeros(cfg.n_layers, slots, cfg.n_heads, max_len, hd)
        self.v = torch.zeros_like(self.k)

    def move(self, src: int, dst: int, length: int) -> None:
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]


@torch.inference_mode()
def inject_context(drafter: Drafter, dkv: DrafterKV, hidden: list[Tensor], keep: Tensor, slot: Tensor,
                   pos: Tensor) -> None:
    """Write the drafter's context keys/values for the target positions the step kept.

    `hidden` are a target step's hidden states (T, d) each; `keep` (T,) bool picks the
    tokens whose target state is final (prompt tokens, the anchor and the accepted drafts),
    `slot`/`pos` (T,) where each token lives.
    """
    cfg = drafter.cfg
    feats = torch.cat([hidden[i + 1][keep] for i in cfg.target_layer_ids], dim=-1)  # (N, m·d)
    ctx = drafter.context(feats)  # (N, d)
    s, p = slot[keep], pos[keep]
    cos, sin = drafter.rope_cos[p], drafter.rope_sin[p]  # (N, Dh/2)
    for li, layer in enumerate(drafter.layers):
        k, v = layer.attn.project_kv(ctx, cos, sin)  # (N, H, Dh) each
        dkv.k[li, s, :, p] = k
        dkv.v[li, s, :, p] = v


@torch.inference_mode()
def drafter_step(drafter: Drafter, dkv: DrafterKV, anchors: Tensor, anchor_ids: Tensor,
                 positions: int) -> BlockOutput:
    """Run the drafter's backbone for slots 0..m−1: one block of `positions` tokens per request.

    Request r's block is [x_a, MASK × (positions − 1)] at positions a_r.. (a_r = `anchors[r]`,
    its cached length); it attends to its injected context (positions < a_r) and to its own
    block bidirectionally. Returns logits (m, 1, positions, V) and states (m, 1, positions, d).
    """
    cfg = drafter.cfg
    embed, lm_head = drafter._shared
    m, p = anchors.shape[0], positions
    block = torch.full((m, p), cfg.mask_token_id, dtype=torch.long)
    block[:, 0] = anchor_ids
    q_pos = anchors[:, None] + torch.arange(p)  # (m, p)
    kv_max = int(anchors.max())
    ctx_ok = (torch.arange(kv_max)[None, :] < anchors[:, None])[:, None, :].expand(m, p, kv_max)
    mask = torch.cat([ctx_ok, torch.ones(m, p, p, dtype=torch.bool)], dim=-1).unsqueeze(1)
    cos, sin = drafter.rope_cos[q_pos], drafter.rope_sin[q_pos]  # (m, p, Dh/2)
    x = embed(block)  # (m, p, d)
    for li, layer in enumerate(drafter.layers):
        injected = (dkv.k[li, :m, :, :kv_max], dkv.v[li, :m, :, :kv_max])  # (m, H, K, Dh): views
        x, _ = layer(x, cos, sin, mask, injected)
    h = drafter.norm(x)[:, None]  # (m, 1, p, d)
    return BlockOutput(lm_head(h), h)
