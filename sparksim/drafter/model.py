"""The DSpark drafter: a parallel backbone with target-KV injection, a Markov head and a confidence head.

Reads bottom-up (config → blocks → heads → model → loss → sampling). Shapes: B sequences,
S sequence tokens, A anchors per sequence, γ block size, d width, m injected target layers,
r Markov rank, V vocabulary.

A block starts at an anchor position a (the last token the target has emitted, whose hidden state
the target has not yet computed): its γ inputs are [x_a, MASK × (γ−1)] at positions a..a+γ−1, and
its γ outputs predict x_{a+1..a+γ}. Every drafter layer's keys/values are the projected target
hidden states of positions < a (KV injection) followed by the block's own; attention inside the
block is bidirectional. With `markov_rank = 0` and no confidence head this is the DFlash baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sparksim.decoder import Block, BlockConfig, RMSNorm, rope_angles
from sparksim.drafter.config import DrafterConfig
from sparksim.drafter.target import sample_logits

# --------------------------------------------------------------------------- blocks

ROPE_THETA = 10000.0  # the drafters were trained with this base, whatever the target's


def block_config(cfg: DrafterConfig) -> BlockConfig:
    """Return a drafter layer: multi-head, q and a fused kv matrix, RoPE pairs interleaved (as trained)."""
    return BlockConfig(d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.n_heads,
                       head_dim=cfg.d_model // cfg.n_heads, d_ff=cfg.d_ff, rope_theta=ROPE_THETA,
                       proj="q,kv", rope_interleaved=True)


# --------------------------------------------------------------------------- heads


class MarkovHead(nn.Module):
    """Low-rank bigram bias B(x_{k−1}, ·) = W1[x_{k−1}] · W2 added to the backbone's logits."""

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.w1 = nn.Embedding(vocab_size, rank)
        self.w2 = nn.Linear(rank, vocab_size, bias=False)
        nn.init.normal_(self.w1.weight, std=0.02)
        nn.init.zeros_(self.w2.weight)  # starts as no bias: the backbone alone

    def forward(self, prev: Tensor) -> tuple[Tensor, Tensor]:
        """Return (bias (…, V), embedding W1[prev] (…, r)) for previous tokens `prev` (…)."""
        e = self.w1(prev)
        return self.w2(e), e


class ConfidenceHead(nn.Module):
    """c_k = σ(wᵀ[h_k ; W1[x_{k−1}]] + b): the conditional acceptance of draft k; returns the logit."""

    def __init__(self, d_model: int, rank: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model + rank, 1)

    def forward(self, h: Tensor, markov_emb: Tensor | None) -> Tensor:
        z = h if markov_emb is None else torch.cat([h, markov_emb], dim=-1)  # (…, d + r)
        return self.proj(z).squeeze(-1)  # (…,)


# --------------------------------------------------------------------------- model


@dataclass
class BlockOutput:
    """The backbone's output for A blocks per sequence."""

    logits: Tensor  # (B, A, γ, V) backbone logits U_k, before the Markov bias
    hidden: Tensor  # (B, A, γ, d) final-normed backbone states h_k


def block_mask(anchors: Tensor, seq_len: int, gamma: int) -> Tensor:
    """Return the attention mask (B, 1, A·γ, S + A·γ): context keys < anchor, plus the own block."""
    B, A = anchors.shape
    ctx_ok = torch.arange(seq_len, device=anchors.device) < anchors[..., None]  # (B, A, S)
    ctx_ok = ctx_ok.repeat_interleave(gamma, dim=1)  # (B, A·γ, S)
    blk = torch.arange(A * gamma, device=anchors.device) // gamma
    own = (blk[:, None] == blk[None, :]).expand(B, -1, -1)  # (B, A·γ, A·γ)
    return torch.cat([ctx_ok, own], dim=-1).unsqueeze(1)


class Drafter(nn.Module):
    """DSpark drafter; the target's embedding and LM head are shared and frozen (not saved)."""

    rope_cos: Tensor  # (max_seq_len + γ, Dh/2) buffers, not saved
    rope_sin: Tensor

    def __init__(self, cfg: DrafterConfig, embed: nn.Embedding, lm_head: nn.Linear,
                 max_seq_len: int = 2048) -> None:
        super().__init__()
        self.cfg = cfg
        m = len(cfg.target_layer_ids)
        self.fc = nn.Linear(m * cfg.d_model, cfg.d_model, bias=False)  # W_c: m·d → d
        self.hidden_norm = RMSNorm(cfg.d_model)
        # Every layer's keys/values are [W_K H_ctx ; W_K H_block]: the context is injected as a
        # prefix through the layer's own k/v projections and k-norm (`Attention.context_kv`).
        self.layers: list[Block] = nn.ModuleList(  # type: ignore[assignment]
            Block(block_config(cfg)) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.markov = MarkovHead(cfg.vocab_size, cfg.markov_rank) if cfg.markov_rank > 0 else None
        self.conf = ConfidenceHead(cfg.d_model, cfg.markov_rank) if cfg.confidence_head else None
        for mod in (self.fc, *self.layers):
            for p in mod.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)
        # Shared and frozen: kept out of parameters() so optimisers and checkpoints skip them.
        self._shared = (embed.requires_grad_(False), lm_head.requires_grad_(False))
        cos, sin = rope_angles(torch.arange(max_seq_len + cfg.gamma), cfg.d_model // cfg.n_heads, ROPE_THETA)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def target_features(self, target_hidden: list[Tensor]) -> Tensor:
        """Return [H^{l1};…;H^{lm}] (B, S, m·d): decoder-layer outputs of the injected layers."""
        return torch.cat([target_hidden[i + 1] for i in self.cfg.target_layer_ids], dim=-1)

    def context(self, feats: Tensor) -> Tensor:
        """Return H_ctx = RMSNorm(W_c feats) (B, S, d)."""
        return self.hidden_norm(self.fc(feats.to(self.fc.weight.dtype)))

    def backbone(self, ctx: Tensor, ids: Tensor, anchors: Tensor) -> BlockOutput:
        """Run the parallel backbone for the blocks anchored at `anchors` (B, A) of `ids` (B, S)."""
        embed, lm_head = self._shared
        B, S = ids.shape
        A, g = anchors.shape[1], self.cfg.gamma
        block_ids = torch.full((B, A, g), self.cfg.mask_token_id, dtype=torch.long, device=ids.device)
        block_ids[:, :, 0] = ids.gather(1, anchors)  # anchor token first, γ−1 masks after
        x = embed(block_ids).reshape(B, A * g, -1)  # (B, A·γ, d)
        q_pos = (anchors[..., None] + torch.arange(g, device=ids.device)).reshape(B, A * g)  # (B, A·γ)
        ctx_pos = torch.arange(S, device=ids.device).expand(B, S)  # (B, S)
        mask = block_mask(anchors, S, g)  # (B, 1, A·γ, S + A·γ)
        q_cos, q_sin = self.rope_cos[q_pos], self.rope_sin[q_pos]  # (B, A·γ, Dh/2)
        ctx_cos, ctx_sin = self.rope_cos[ctx_pos], self.rope_sin[ctx_pos]  # (B, S, Dh/2)
        for layer in self.layers:
            injected = layer.attn.context_kv(ctx, ctx_cos, ctx_sin)  # 2 × (B, H, S, Dh)
            x, _ = layer(x, q_cos, q_sin, mask, injected)
        h = self.norm(x).reshape(B, A, g, -1)  # (B, A, γ, d)
        return BlockOutput(lm_head(h), h)  # logits (B, A, γ, V)

    def heads(self, out: BlockOutput, prev: Tensor) -> tuple[Tensor, Tensor | None]:
        """Return draft logits (B, A, γ, V) with the Markov bias and confidence logits (B, A, γ) or None.

        `prev` (B, A, γ) holds each position's previous token: [anchor, x_1 … x_{γ−1}].
        """
        logits, emb = out.logits, None
        if self.markov is not None:
            bias, emb = self.markov(prev)  # (B, A, γ, V), (B, A, γ, r)
            logits = logits + bias
        conf = self.conf(out.hidden, emb) if self.conf is not None else None
        return logits, conf

    def trainable_state(self) -> dict[str, Tensor]:
        """Return the state dict without the shared target embedding and LM head."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("_shared")}


# --------------------------------------------------------------------------- loss


@dataclass
class LossParts:
    """The loss and its monitored parts (floats for logging)."""

    loss: Tensor
    ce: float
    l1: float
    bce: float
    accept: list[float]  # mean label 1 − TV per position


def position_weights(gamma: int, decay: float, device: torch.device | None = None) -> Tensor:
    """Return w_k = exp(−(k−1)/decay) for k = 1..γ."""
    return torch.exp(-torch.arange(gamma, dtype=torch.float32, device=device) / decay)


def drafter_loss(cfg: DrafterConfig, logits: Tensor, conf_logits: Tensor | None, target_logits: Tensor,
                 labels: Tensor, valid: Tensor) -> LossParts:
    """Return α_ce·CE + α_l1·‖p_d − p_t‖₁ + α_conf·BCE(c, 1 − TV), position-weighted.

    logits/target_logits (B, A, γ, V); labels (B, A, γ) the target's tokens; valid (B, A, γ) bool.
    """
    w = position_weights(cfg.gamma, cfg.loss_decay, logits.device) * valid  # (B, A, γ)
    wsum = w.sum().clamp(min=1e-6)
    logp_d = F.log_softmax(logits.float(), dim=-1)
    p_d, p_t = logp_d.exp(), F.softmax(target_logits.float(), dim=-1)  # (B, A, γ, V)
    ce = -logp_d.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)  # (B, A, γ)
    l1 = (p_d - p_t).abs().sum(-1)  # (B, A, γ)
    accept = (1 - 0.5 * l1).clamp(0, 1).detach()  # soft label c* = 1 − TV
    loss = cfg.ce_alpha * (ce * w).sum() / wsum + cfg.l1_alpha * (l1 * w).sum() / wsum
    bce_v = 0.0
    if conf_logits is not None:
        bce = F.binary_cross_entropy_with_logits(conf_logits.float(), accept, reduction="none")
        loss = loss + cfg.conf_alpha * (bce * w).sum() / wsum
        bce_v = float((bce.detach() * w).sum() / wsum)
    per_pos = (accept * valid).sum((0, 1)) / valid.sum((0, 1)).clamp(min=1)
    return LossParts(loss, float((ce.detach() * w).sum() / wsum), float((l1.detach() * w).sum() / wsum), bce_v,
                     per_pos.tolist())


# --------------------------------------------------------------------------- sampling


@dataclass
class Draft:
    """A sampled block per anchor."""

    tokens: Tensor  # (B, A, γ) sampled draft tokens
    probs: Tensor  # (B, A, γ, V) draft distributions the tokens were sampled from
    conf_logits: Tensor  # (B, A, γ) raw confidence logits (DFlash: logit of the top draft probability)


def draft(model: Drafter, out: BlockOutput, anchor_ids: Tensor, temperature: float,
          gen: torch.Generator | None) -> Draft:
    """Sample each block left to right through the Markov head (independently without one)."""
    B, A, g, _ = out.logits.shape
    tokens = torch.empty(B, A, g, dtype=torch.long, device=out.logits.device)
    prev = anchor_ids  # (B, A)
    logits_all = out.logits.float().clone()  # (B, A, γ, V)
    for k in range(g):
        if model.markov is not None:
            logits_all[:, :, k] += model.markov(prev)[0].float()
        tokens[:, :, k] = sample_logits(logits_all[:, :, k], temperature, gen)
        prev = tokens[:, :, k]
    probs = to_probs(logits_all, temperature)
    prev_all = torch.cat([anchor_ids[..., None], tokens[:, :, :-1]], dim=-1)  # (B, A, γ)
    _, conf = model.heads(out, prev_all)
    if conf is None:  # DFlash has no head: use the top draft probability, as vllm-ascend does
        conf = top_prob_logits(logits_all, temperature)  # at T = 0 of softmax(logits), not the one-hot
    return Draft(tokens, probs, conf.float())


def top_prob_logits(logits: Tensor, temperature: float) -> Tensor:
    """Return logit(max_v p(v)) (…,) of softmax(logits / T), or of softmax(logits) at T = 0: the
    one-hot sampling distribution of T = 0 would say 1 everywhere, whatever the drafter believes."""
    p = F.softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)
    top = p.max(-1).values.clamp(1e-6, 1 - 1e-6)
    return torch.log(top) - torch.log1p(-top)


def to_probs(logits: Tensor, temperature: float) -> Tensor:
    """Return softmax(logits / T) (…, V); T = 0 gives the one-hot argmax."""
    if temperature == 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return F.softmax(logits.float() / temperature, dim=-1)
