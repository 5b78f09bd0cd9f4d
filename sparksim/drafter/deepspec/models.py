"""The three DeepSpec architectures (DSpark, DFlash, Eagle3) built from `sparksim.decoder` blocks.

Reads bottom-up: layer config → Eagle3's layer → heads → models. DSpark and DFlash layers are
plain `Block`s (the injected context goes in as a key/value prefix); Eagle3's layer is its own:
its attention reads [norm(embedding) ; norm(hidden)], twice the width, and its residual stream
is the hidden input alone. Shapes: B sequences, S tokens, A anchors, γ block, d width, V vocabulary.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from sparksim.decoder import KV, MLP, Attention, Block, BlockConfig, RMSNorm, rope_angles
from sparksim.drafter.deepspec.config import DeepSpecConfig
from sparksim.drafter.model import block_mask, to_probs, top_prob_logits
from sparksim.drafter.target import sample_logits

# --------------------------------------------------------------------------- blocks


def block_config(cfg: DeepSpecConfig) -> BlockConfig:
    """Return a DeepSpec drafter layer: Qwen3's (GQA, separate q/k/v, q/k norm, RoPE halves)."""
    return BlockConfig(d_model=cfg.hidden_size, n_heads=cfg.num_heads, n_kv_heads=cfg.num_kv_heads,
                       head_dim=cfg.head_dim, d_ff=cfg.intermediate_size, rope_theta=cfg.rope_theta,
                       bias=cfg.attention_bias, norm_eps=cfg.rms_norm_eps)


class Eagle3Layer(nn.Module):
    """Eagle3 layer: attention over [norm(embedding) ; norm(hidden)] (width 2d), residual on the hidden stream."""

    def __init__(self, cfg: DeepSpecConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.embed_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.mlp_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.attn = Attention(block_config(cfg), in_dim=2 * d)
        self.mlp = MLP(d, cfg.intermediate_size)

    def forward(self, h: Tensor, emb: Tensor, cos: Tensor, sin: Tensor, mask: Tensor,
                past: KV | None) -> tuple[Tensor, KV]:
        """Return the new hidden (B, T, d) and the keys/values past + new (B, Hkv, S+T, Dh).

        cos/sin (B, T, Dh/2) are the RoPE angles of the T new entries; mask (B, 1, T, S+T).
        """
        z = torch.cat([self.embed_norm(emb), self.hidden_norm(h)], dim=-1)  # (B, T, 2d)
        a, kv = self.attn(z, cos, sin, mask, past)
        h = h + a
        return h + self.mlp(self.mlp_norm(h)), kv


# --------------------------------------------------------------------------- heads


class MarkovHead(nn.Module):
    """Bias over the vocabulary from the previous token: vanilla W2·W1[x], gated W2·(g ⊙ W1[x]), rnn with a state."""

    def __init__(self, kind: str, vocab_size: int, rank: int, hidden_size: int) -> None:
        super().__init__()
        self.kind, self.rank = kind, rank
        self.w1 = nn.Embedding(vocab_size, rank)
        self.w2 = nn.Linear(rank, vocab_size, bias=False)
        self.gate = nn.Linear(hidden_size + rank, rank) if kind == "gated" else None
        self.joint = nn.Linear(2 * rank + hidden_size, 3 * rank) if kind == "rnn" else None

    def step(self, prev: Tensor, h: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Return the bias (…, V) for previous tokens `prev` (…) at backbone states h (…, d), and the next state."""
        e = self.w1(prev)  # (…, r)
        if self.gate is not None:
            g = torch.sigmoid(self.gate(torch.cat([h, e], dim=-1))).to(e.dtype)
            return self.w2(g * e), None
        if self.joint is not None:
            s = torch.zeros_like(e, dtype=h.dtype) if state is None else state
            gate_raw, cand_raw, out_raw = self.joint(torch.cat([s, e, h], dim=-1)).chunk(3, dim=-1)
            g = torch.sigmoid(gate_raw)
            return self.w2(torch.tanh(out_raw)), g * s + (1 - g) * torch.tanh(cand_raw)
        return self.w2(e), None


@dataclass
class Proposal:
    """A drafted block per anchor, with what the recorder keeps of it."""

    tokens: Tensor  # (B, A, γ) sampled draft tokens
    logits: Tensor  # (B, A, γ, V) float32 draft logits the tokens were sampled from (Markov bias included)
    probs: Tensor  # (B, A, γ, V) the sampling distributions (one-hot argmax at T = 0)
    conf_logits: Tensor  # (B, A, γ) float32 confidence logits (head, or the top-probability proxy)
    conf_from_head: bool  # False: logit of the top draft probability (DFlash, Eagle3)


# --------------------------------------------------------------------------- models


class DeepSpecDrafter(nn.Module, abc.ABC):
    """What the recorder calls on any DeepSpec drafter: features from target hidden states, and `propose`."""

    cfg: DeepSpecConfig

    def target_features(self, hidden: Sequence[Tensor]) -> Tensor:
        """Return [H^{l1};…;H^{lm}] (B, S, m·d) from HF hidden states (entry 0 embeddings, i+1 layer i)."""
        return torch.cat([hidden[i + 1] for i in self.cfg.target_layer_ids], dim=-1)

    def param_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Return the RoPE cos/sin (…, Dh/2) of `positions` (…) for this drafter's layers."""
        return rope_angles(positions, self.cfg.head_dim, self.cfg.rope_theta)

    @abc.abstractmethod
    def propose(self, feats: Tensor, ids: Tensor, anchors: Tensor, temperature: float,
                gen: torch.Generator | None) -> Proposal:
        """Draft γ tokens at every anchor (B, A) of `ids` (B, S) from target features (B, S, m·d).

        Anchor a is the last emitted token; the drafter sees the target's states of positions < a.
        """


class DSparkDrafter(DeepSpecDrafter):
    """DSpark (Markov + confidence heads) or DFlash (neither): the parallel block drafter."""

    def __init__(self, cfg: DeepSpecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, m = cfg.hidden_size, len(cfg.target_layer_ids)
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.fc = nn.Linear(m * d, d, bias=False)  # W_c: m·d → d
        self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.layers: list[Block] = nn.ModuleList(  # type: ignore[assignment]
            Block(block_config(cfg)) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        self.markov = (MarkovHead(cfg.markov_head_type, cfg.vocab_size, cfg.markov_rank, d)
                       if cfg.markov_rank > 0 else None)
        conf_in = d + (cfg.markov_rank if cfg.confidence_with_markov else 0)
        self.conf = nn.Linear(conf_in, 1) if cfg.confidence_head else None

    def target_features(self, hidden: Sequence[Tensor]) -> Tensor:
        return torch.cat([hidden[0 if i == -1 else i + 1] for i in self.cfg.target_layer_ids], dim=-1)

    def context(self, feats: Tensor) -> Tensor:
        """Return H_ctx = RMSNorm(W_c feats) (B, S, d)."""
        return self.hidden_norm(self.fc(feats.to(self.fc.weight.dtype)))

    def backbone(self, ctx: Tensor, ids: Tensor, anchors: Tensor) -> tuple[Tensor, Tensor]:
        """Return the backbone logits U (B, A, γ, V) and final-normed states h (B, A, γ, d) of each block."""
        B, S = ctx.shape[:2]
        A, g = anchors.shape[1], self.cfg.gamma
        block_ids = torch.full((B, A, g), self.cfg.mask_token_id, dtype=torch.long, device=ids.device)
        block_ids[:, :, 0] = ids.gather(1, anchors)  # anchor token first, γ−1 masks after
        x = self.embed(block_ids).reshape(B, A * g, -1)  # (B, A·γ, d)
        q_pos = (anchors[..., None] + torch.arange(g, device=ids.device)).reshape(B, A * g)  # (B, A·γ)
        ctx_pos = torch.arange(S, device=ids.device).expand(B, S)  # (B, S)
        mask = block_mask(anchors, S, g)  # (B, 1, A·γ, S + A·γ): context < anchor, own block both ways
        q_cos, q_sin = self._rope(q_pos)  # (B, A·γ, Dh/2)
        ctx_cos, ctx_sin = self._rope(ctx_pos)  # (B, S, Dh/2)
        for layer in self.layers:  # the context enters every layer as keys/values through its own projections
            injected = layer.attn.context_kv(ctx, ctx_cos, ctx_sin)  # 2 × (B, Hkv, S, Dh)
            x, _ = layer(x, q_cos, q_sin, mask, injected)
        h = self.norm(x).reshape(B, A, g, -1)  # (B, A, γ, d)
        return self.lm_head(h), h

    def confidence(self, h: Tensor, prev: Tensor) -> Tensor | None:
        """Return confidence logits (…,) float32 at states h (…, d) with previous tokens `prev` (…), or None."""
        if self.conf is None:
            return None
        if self.cfg.confidence_with_markov and self.markov is not None:
            h = torch.cat([h, self.markov.w1(prev).to(h.dtype)], dim=-1)  # (…, d + r)
        return self.conf(h).squeeze(-1).float()

    def sample(self, base: Tensor, h: Tensor, anchor_ids: Tensor, temperature: float,
               gen: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """Sample each block left to right through the Markov head; return tokens (B, A, γ), logits (B, A, γ, V) f32."""
        g = base.shape[2]
        if self.markov is None:  # DFlash: positions are independent
            logits = base.float()
            return sample_logits(logits, temperature, gen), logits
        tokens = torch.empty(base.shape[:3], dtype=torch.long, device=base.device)
        rows, prev, state = [], anchor_ids, None
        for k in range(g):
            bias, state = self.markov.step(prev, h[:, :, k], state)
            row = (base[:, :, k] + bias).float()  # the bias is added in the model's dtype, as trained
            tokens[:, :, k] = prev = sample_logits(row, temperature, gen)
            rows.append(row)
        return tokens, torch.stack(rows, dim=2)

    @torch.no_grad()
    def propose(self, feats: Tensor, ids: Tensor, anchors: Tensor, temperature: float,
                gen: torch.Generator | None) -> Proposal:
        S = int(anchors.max()) if anchors.numel() else 0  # only positions < the last anchor are read
        ctx = self.context(feats[:, : max(S, 1)])
        base, h = self.backbone(ctx, ids, anchors)
        anchor_ids = ids.gather(1, anchors)  # (B, A)
        tokens, logits = self.sample(base, h, anchor_ids, temperature, gen)
        prev = torch.cat([anchor_ids[..., None], tokens[:, :, :-1]], dim=-1)  # (B, A, γ)
        conf = self.confidence(h, prev)
        return Proposal(tokens, logits, to_probs(logits, temperature),
                        conf if conf is not None else top_prob_logits(logits, temperature), conf is not None)


class Eagle3Drafter(DeepSpecDrafter):
    """Eagle3 with training-time test (TTT): γ autoregressive steps from the target's context features."""

    def __init__(self, cfg: DeepSpecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, m = cfg.hidden_size, len(cfg.target_layer_ids)
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.fc = nn.Linear(m * d, d, bias=False)
        self.layers: list[Eagle3Layer] = nn.ModuleList(  # type: ignore[assignment]
            Eagle3Layer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)

    def _run(self, h: Tensor, emb: Tensor, cos: Tensor, sin: Tensor, mask: Tensor,
             past: list[KV] | None) -> tuple[Tensor, list[KV]]:
        """Run every layer on new entries (B, T, d); return their output and each layer's grown cache."""
        cache = []
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, emb, cos, sin, mask, None if past is None else past[i])
            cache.append(kv)
        return h, cache

    def logits(self, h: Tensor) -> Tensor:
        """Return lm_head(norm(h)) (…, V) for pre-norm draft states h (…, d)."""
        return self.lm_head(self.norm(h))

    @torch.no_grad()
    def propose(self, feats: Tensor, ids: Tensor, anchors: Tensor, temperature: float,
                gen: torch.Generator | None) -> Proposal:
        B, A, g = anchors.shape[0], anchors.shape[1], self.cfg.gamma
        dev = ids.device
        if int(anchors.min()) < 1:
            raise ValueError("Eagle3 drafts from the context before the anchor: anchors must be >= 1")
        L = int(anchors.max())  # cache entries i = 0..L−1 pair H_i with x_{i+1} at position i
        pos = torch.arange(L, device=dev).expand(B, L)
        causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()[None, None]  # (1, 1, L, L)
        h0 = self.fc(feats[:, :L].to(self.fc.weight.dtype))
        h_ctx, cache = self._run(h0, self.embed(ids[:, 1: L + 1]), *self._rope(pos), causal, None)  # (B, L, d)
        h = h_ctx.gather(1, (anchors - 1)[..., None].expand(-1, -1, h_ctx.shape[-1]))  # (B, A, d)
        ctx_ok = torch.arange(L, device=dev) < anchors[..., None]  # (B, A, L): entries i < a
        own = torch.eye(A, dtype=torch.bool, device=dev).expand(B, A, A)  # each anchor sees its own chain
        tokens = torch.empty(B, A, g, dtype=torch.long, device=dev)
        rows = []
        for k in range(g):
            row = self.logits(h).float()  # (B, A, V)
            tokens[:, :, k] = tok = sample_logits(row, temperature, gen)
            rows.append(row)
            if k == g - 1:
                break
            mask = torch.cat([ctx_ok, *([own] * (k + 1))], dim=-1)[:, None]  # (B, 1, A, L + (k+1)·A)
            # the token just sampled sits at position a + k
            h, cache = self._run(h, self.embed(tok), *self._rope(anchors + k), mask, cache)
        logits = torch.stack(rows, dim=2)  # (B, A, γ, V)
        return Proposal(tokens, logits, to_probs(logits, temperature), top_prob_logits(logits, temperature), False)


def build_drafter(cfg: DeepSpecConfig) -> DeepSpecDrafter:
    """Return an uninitialised module for `cfg` (DSpark/DFlash or Eagle3)."""
    return Eagle3Drafter(cfg) if cfg.kind == "eagle3" else DSparkDrafter(cfg)

