"""DeepSpec drafter checkpoints (DSpark, DFlash, Eagle3) run by sparksim's own modules, and the recorder for them.

DeepSpec (github.com/deepseek-ai/DeepSpec) saves a drafter with HF `save_pretrained`: `config.json`
is the target's Qwen3 config with the drafter's fields added (`architectures`, `target_layer_ids`,
`num_target_layers`, `block_size` or `ttt_length`, …) and `model.safetensors` (or shards with
`model.safetensors.index.json`) holds every tensor, the drafter's own copies of the target's
embedding and LM head included. This module reads that layout into the modules below (nothing of
DeepSpec's code is used) and exposes one call the recorder needs, `propose`: given the target's
hidden states and the anchors, the γ draft logits, the sampled tokens and the confidence logits.

- **DSpark** (`Qwen3DSparkModel` with `markov_rank > 0`): the parallel block backbone of
  `model.py` with Qwen3's grouped-query attention; the context H_ctx = RMSNorm(W_c [H^{l1};…])
  (layer id −1 is the embedding output) is projected by every layer's own k/v projections and
  k-norm; the block [x_a, MASK × (γ−1)] at positions a..a+γ−1 attends to the context < a and to
  itself, both ways. Its output h_k (after the final norm) gives U_k = lm_head(h_k); the Markov
  head adds W2·W1[x_{k−1}] (vanilla), W2·(g ⊙ W1[x_{k−1}]) with g = σ(W_g[h_k; W1[x_{k−1}]])
  (gated) or a GRU-like state (rnn), sampled left to right from the anchor; the confidence head
  is wᵀ[h_k ; W1[x_{k−1}]] + b (or wᵀh_k + b), on the realised previous tokens.
- **DFlash** (the same architecture with `markov_rank = 0` and no confidence head): blocks are
  sampled position by position independently; the confidence is the logit of the top draft
  probability (vllm-ascend's proxy), of the sampling distribution at T > 0 and of softmax(U_k)
  at T = 0, where the sampling distribution is one-hot.
- **Eagle3** (`Qwen3Eagle3Model`, TTT): an autoregressive head. Its cache holds one entry per
  context position i < a built from (W_c[H_i], x_{i+1}) at RoPE position i, causal; step k feeds
  the previous step's pre-norm output with the embedding of the token just sampled at position
  a + k − 1, and its logits are lm_head(norm(·)). No confidence head: top-probability proxy as DFlash.

The recorder driver (`python -m sparksim.drafter.deepspec record …`) loads a HuggingFace target
and its tokenizer, regenerates its responses to DeepSpec's evaluation prompts (chat template,
thinking off), fits STS on a held-out split, and writes one trace set per drafter and temperature
through the trace format of `sparksim.traces.format`. Device and dtype are parameters; see
docs/drafter.md ("Record your own drafter").
"""

from __future__ import annotations

import abc
import argparse
import hashlib
import json
import random
import shlex
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import NDArray
from torch import Tensor, nn

from sparksim.drafter.config import load_json
from sparksim.drafter.data import json_lines
from sparksim.drafter.model import block_mask, to_probs
from sparksim.drafter.target import RMSNorm, SwiGLU, sample_logits
from sparksim.errors import ConfigError

DSPARK_ARCH = "Qwen3DSparkModel"
EAGLE3_ARCH = "Qwen3Eagle3Model"
EAGLE3_ALIASES = (EAGLE3_ARCH, "Eagle3DraftModel")  # DeepSpec's eval.py runs both as Qwen3Eagle3Model
_GEMMA4 = ("Gemma4 drafters (Gemma RMSNorm with v-norm and sandwich norms, scaled embeddings, logit "
           "soft-capping) are not implemented here")
UNSUPPORTED_ARCHS = {"Gemma4DSparkModel": _GEMMA4, "Gemma4Eagle3Model": _GEMMA4}
MARKOV_KINDS = ("vanilla", "gated", "rnn")

# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class DeepSpecConfig:
    """The fields of a DeepSpec `config.json` the forward pass needs (one per line, checked on load)."""

    architecture: str  # Qwen3DSparkModel or Qwen3Eagle3Model
    kind: str  # "dspark", "dflash" (DSpark architecture without heads) or "eagle3"
    gamma: int  # γ: block_size (DSpark/DFlash) or ttt_length (Eagle3)
    hidden_size: int  # d, equal to the target's
    num_layers: int  # drafter layers
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (grouped-query attention)
    head_dim: int  # per-head width
    intermediate_size: int  # SwiGLU hidden width
    vocab_size: int  # the target's vocabulary
    rms_norm_eps: float
    rope_theta: float  # RoPE base ("default" rope type only)
    attention_bias: bool
    target_layer_ids: tuple[int, ...]  # injected target layers (0-based; −1 = embedding output)
    num_target_layers: int  # decoder layers of the target it was trained on
    mask_token_id: int = -1  # DSpark/DFlash: id fed at the γ−1 mask slots
    markov_rank: int = 0  # r; 0 = no Markov head
    markov_head_type: str = "none"  # vanilla | gated | rnn
    confidence_head: bool = False
    confidence_with_markov: bool = False  # the head reads [h_k ; W1[x_{k−1}]] rather than h_k


def _field(raw: dict[str, Any], key: str, where: str, arch: str) -> Any:
    if key not in raw or raw[key] is None:
        raise ConfigError(f"{where}: missing key {key!r} (a {arch} checkpoint has it)")
    return raw[key]


def _rope_theta(raw: dict[str, Any], where: str) -> float:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: rope_parameters={params!r} is not a mapping")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"{where}: rope_type={rope_type!r} is not supported (only 'default' RoPE)")
    theta = params.get("rope_theta", raw.get("rope_theta"))
    if theta is None:
        raise ConfigError(f"{where}: missing key 'rope_theta' (in rope_parameters or at top level)")
    return float(theta)


def read_config(path: Path | str) -> DeepSpecConfig:
    """Read and check `path/config.json` of a DeepSpec checkpoint; raise ConfigError naming the problem."""
    path = Path(path)
    where = str(path / "config.json")
    if not path.is_dir():
        raise ConfigError(f"{path}: drafter folder is missing")
    raw = load_json(path / "config.json")
    archs = raw.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch in UNSUPPORTED_ARCHS:
        raise ConfigError(f"{where}: architecture {arch!r} is not supported: {UNSUPPORTED_ARCHS[arch]}")
    if arch not in (DSPARK_ARCH, *EAGLE3_ALIASES):
        raise ConfigError(f"{where}: architectures={archs!r} is not a DeepSpec drafter "
                          f"(known: {[DSPARK_ARCH, *EAGLE3_ALIASES]})")
    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{where}: hidden_act={raw['hidden_act']!r} is not supported (only 'silu')")
    if raw.get("use_sliding_window") or any(t != "full_attention" for t in raw.get("layer_types") or []):
        raise ConfigError(f"{where}: sliding-window layers are not supported")
    hidden, heads = int(_field(raw, "hidden_size", where, arch)), int(_field(raw, "num_attention_heads", where, arch))
    common: dict[str, Any] = {
        "architecture": arch, "hidden_size": hidden, "num_heads": heads,
        "num_layers": int(_field(raw, "num_hidden_layers", where, arch)),
        "num_kv_heads": int(raw.get("num_key_value_heads") or heads),
        "head_dim": int(raw.get("head_dim") or hidden // heads),
        "intermediate_size": int(_field(raw, "intermediate_size", where, arch)),
        "vocab_size": int(_field(raw, "vocab_size", where, arch)),
        "rms_norm_eps": float(raw.get("rms_norm_eps", 1e-6)),
        "rope_theta": _rope_theta(raw, where),
        "attention_bias": bool(raw.get("attention_bias", False)),
        "target_layer_ids": tuple(int(i) for i in _field(raw, "target_layer_ids", where, arch)),
        "num_target_layers": int(_field(raw, "num_target_layers", where, arch)),
    }
    if common["num_heads"] % common["num_kv_heads"]:
        raise ConfigError(f"{where}: num_attention_heads={heads} is not a multiple of "
                          f"num_key_value_heads={common['num_kv_heads']}")
    if arch in EAGLE3_ALIASES:
        return DeepSpecConfig(kind="eagle3", gamma=int(_field(raw, "ttt_length", where, arch)), **common)
    rank = int(_field(raw, "markov_rank", where, arch))
    markov_type = str(_field(raw, "markov_head_type", where, arch)).lower() if rank > 0 else "none"
    if rank > 0 and markov_type not in MARKOV_KINDS:
        raise ConfigError(f"{where}: markov_head_type={markov_type!r} is not one of {list(MARKOV_KINDS)}")
    conf_head = bool(_field(raw, "enable_confidence_head", where, arch))
    with_markov = bool(_field(raw, "confidence_head_with_markov", where, arch)) if conf_head else False
    if with_markov and rank == 0:
        raise ConfigError(f"{where}: confidence_head_with_markov=true needs markov_rank > 0")
    return DeepSpecConfig(kind="dspark" if rank > 0 or conf_head else "dflash",
                          gamma=int(_field(raw, "block_size", where, arch)),
                          mask_token_id=int(_field(raw, "mask_token_id", where, arch)),
                          markov_rank=rank, markov_head_type=markov_type, confidence_head=conf_head,
                          confidence_with_markov=with_markov, **common)


def check_target(cfg: DeepSpecConfig, *, n_layers: int, hidden_size: int, vocab_size: int, where: str) -> None:
    """Raise ConfigError unless a target of this shape is the one the drafter was trained on."""
    if hidden_size != cfg.hidden_size:
        raise ConfigError(f"{where}: drafter hidden_size={cfg.hidden_size} but the target's is {hidden_size}")
    if n_layers != cfg.num_target_layers:
        raise ConfigError(f"{where}: drafter was trained on a {cfg.num_target_layers}-layer target "
                          f"(num_target_layers) but this target has {n_layers} layers")
    if vocab_size != cfg.vocab_size:
        raise ConfigError(f"{where}: drafter vocab_size={cfg.vocab_size} but the target's is {vocab_size}")
    lowest = 0 if cfg.kind == "eagle3" else -1
    bad = [i for i in cfg.target_layer_ids if not lowest <= i <= n_layers - 2]
    if bad or not cfg.target_layer_ids:
        raise ConfigError(f"{where}: target_layer_ids {list(cfg.target_layer_ids)} must lie in "
                          f"{lowest}..{n_layers - 2} (the last layer's hidden state is post-norm in HF)")


# --------------------------------------------------------------------------- blocks


def rope(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Return cos, sin (B, 1, T, Dh) for `positions` (B, T): HF's default RoPE, halves rotated."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    ang = positions.float()[..., None] * inv  # (B, T, Dh/2)
    ang = torch.cat([ang, ang], dim=-1)  # (B, T, Dh)
    return ang.cos().to(dtype)[:, None], ang.sin().to(dtype)[:, None]


def rotate(x: Tensor, cos_sin: tuple[Tensor, Tensor]) -> Tensor:
    """Rotate x (B, H, T, Dh) by pairs (i, i + Dh/2) (HF's rotate_half layout, not TinyLM's interleave)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos_sin[0] + torch.cat([-x2, x1], dim=-1) * cos_sin[1]


class GQAttention(nn.Module):
    """Grouped-query attention with per-head q/k RMSNorm and RoPE (Qwen3's layout); keys/values come separately."""

    def __init__(self, cfg: DeepSpecConfig, in_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q = nn.Linear(in_dim, self.n_heads * self.head_dim, bias=bias)
        self.k = nn.Linear(in_dim, self.n_kv * self.head_dim, bias=bias)
        self.v = nn.Linear(in_dim, self.n_kv * self.head_dim, bias=bias)
        self.out = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def _rope(self, pos: Tensor, like: Tensor) -> tuple[Tensor, Tensor]:
        return rope(pos, self.head_dim, self.cfg.rope_theta, like.dtype)

    def keys_values(self, x: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
        """Return k (normed, rotated) and v, each (B, Hkv, T, Dh), for inputs x (B, T, in) at `pos` (B, T)."""
        B, T, _ = x.shape
        k = self.k_norm(self.k(x).view(B, T, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        return rotate(k, self._rope(pos, k)), v

    def forward(self, x: Tensor, pos: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Attend queries from x (B, Q, in) at `pos` to k/v (B, Hkv, K, Dh); mask (B, 1, Q, K) bool or None."""
        B, Q, _ = x.shape
        q = self.q_norm(self.q(x).view(B, Q, self.n_heads, self.head_dim)).transpose(1, 2)  # (B, H, Q, Dh)
        q = rotate(q, self._rope(pos, q))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)
        return self.out(y.transpose(1, 2).reshape(B, Q, -1))  # (B, Q, d)


class BlockLayer(nn.Module):
    """DSpark/DFlash layer: keys/values are [ctx ; block] through this layer's projections, block pre-normed."""

    def __init__(self, cfg: DeepSpecConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = GQAttention(cfg, cfg.hidden_size)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: Tensor, ctx: Tensor, q_pos: Tensor, ctx_pos: Tensor, mask: Tensor) -> Tensor:
        h = self.attn_norm(x)
        k_c, v_c = self.attn.keys_values(ctx, ctx_pos)  # the context is not normed per layer
        k_b, v_b = self.attn.keys_values(h, q_pos)
        x = x + self.attn(h, q_pos, torch.cat([k_c, k_b], dim=2), torch.cat([v_c, v_b], dim=2), mask)
        return x + self.mlp(self.mlp_norm(x))


class Eagle3Layer(nn.Module):
    """Eagle3 layer: attention over [norm(embedding) ; norm(hidden)] (width 2d), residual on the hidden stream."""

    def __init__(self, cfg: DeepSpecConfig) -> None:
        super().__init__()
        self.embed_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = GQAttention(cfg, 2 * cfg.hidden_size)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h: Tensor, emb: Tensor, pos: Tensor, past: tuple[Tensor, Tensor] | None,
                mask: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Return the new hidden (B, T, d) and this step's k/v (B, Hkv, T, Dh); keys are past + new."""
        z = torch.cat([self.embed_norm(emb), self.hidden_norm(h)], dim=-1)  # (B, T, 2d)
        k, v = self.attn.keys_values(z, pos)
        k_all = k if past is None else torch.cat([past[0], k], dim=2)
        v_all = v if past is None else torch.cat([past[1], v], dim=2)
        h = h + self.attn(z, pos, k_all, v_all, mask)
        return h + self.mlp(self.mlp_norm(h)), (k, v)


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


def top_prob_logits(logits: Tensor, temperature: float) -> Tensor:
    """Return logit(max_v p(v)) (…,) of softmax(logits / T), or of softmax(logits) at T = 0."""
    p = F.softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)
    top = p.max(-1).values.clamp(1e-6, 1 - 1e-6)
    return torch.log(top) - torch.log1p(-top)


# --------------------------------------------------------------------------- models


class DeepSpecDrafter(nn.Module, abc.ABC):
    """What the recorder calls on any DeepSpec drafter: features from target hidden states, and `propose`."""

    cfg: DeepSpecConfig

    def target_features(self, hidden: Sequence[Tensor]) -> Tensor:
        """Return [H^{l1};…;H^{lm}] (B, S, m·d) from HF hidden states (entry 0 embeddings, i+1 layer i)."""
        return torch.cat([hidden[i + 1] for i in self.cfg.target_layer_ids], dim=-1)

    def param_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @abc.abstractmethod
    def deepspec_names(self) -> dict[str, str]:
        """Return {DeepSpec tensor name: this module's parameter name} for every tensor of the checkpoint."""

    @abc.abstractmethod
    def propose(self, feats: Tensor, ids: Tensor, anchors: Tensor, temperature: float,
                gen: torch.Generator | None) -> Proposal:
        """Draft γ tokens at every anchor (B, A) of `ids` (B, S) from target features (B, S, m·d).

        Anchor a is the last emitted token; the drafter sees the target's states of positions < a.
        """


def _common_names(n_layers: int, attn_bias: bool, layer_norms: dict[str, str]) -> dict[str, str]:
    names = {"embed_tokens.weight": "embed.weight", "fc.weight": "fc.weight", "norm.weight": "norm.weight",
             "lm_head.weight": "lm_head.weight"}
    for i in range(n_layers):
        p = f"layers.{i}."  # the same prefix on both sides; the names below it differ
        for src, dst in layer_norms.items():
            names[p + src + ".weight"] = p + dst + ".weight"
        for src, dst in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("o_proj", "out")):
            names[p + f"self_attn.{src}.weight"] = p + f"attn.{dst}.weight"
            if attn_bias:
                names[p + f"self_attn.{src}.bias"] = p + f"attn.{dst}.bias"
        names[p + "self_attn.q_norm.weight"] = p + "attn.q_norm.weight"
        names[p + "self_attn.k_norm.weight"] = p + "attn.k_norm.weight"
        for src, dst in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            names[p + f"mlp.{src}.weight"] = p + f"mlp.{dst}.weight"
    return names


class DSparkDrafter(DeepSpecDrafter):
    """DSpark (Markov + confidence heads) or DFlash (neither): the parallel block drafter."""

    def __init__(self, cfg: DeepSpecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, m = cfg.hidden_size, len(cfg.target_layer_ids)
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.fc = nn.Linear(m * d, d, bias=False)  # W_c: m·d → d
        self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(BlockLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        self.markov = (MarkovHead(cfg.markov_head_type, cfg.vocab_size, cfg.markov_rank, d)
                       if cfg.markov_rank > 0 else None)
        conf_in = d + (cfg.markov_rank if cfg.confidence_with_markov else 0)
        self.conf = nn.Linear(conf_in, 1) if cfg.confidence_head else None

    def target_features(self, hidden: Sequence[Tensor]) -> Tensor:
        return torch.cat([hidden[0 if i == -1 else i + 1] for i in self.cfg.target_layer_ids], dim=-1)

    def deepspec_names(self) -> dict[str, str]:
        names = _common_names(self.cfg.num_layers, self.cfg.attention_bias,
                              {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm"})
        names["hidden_norm.weight"] = "hidden_norm.weight"
        if self.markov is not None:
            names |= {"markov_head.markov_w1.weight": "markov.w1.weight",
                      "markov_head.markov_w2.weight": "markov.w2.weight"}
            if self.markov.gate is not None:
                names |= {"markov_head.gate_proj.weight": "markov.gate.weight",
                          "markov_head.gate_proj.bias": "markov.gate.bias"}
            if self.markov.joint is not None:
                names |= {"markov_head.joint_proj.weight": "markov.joint.weight",
                          "markov_head.joint_proj.bias": "markov.joint.bias"}
        if self.conf is not None:
            names |= {"confidence_head.proj.weight": "conf.weight", "confidence_head.proj.bias": "conf.bias"}
        return names

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
        for layer in self.layers:
            x = layer(x, ctx, q_pos, ctx_pos, mask)
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
        self.layers = nn.ModuleList(Eagle3Layer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)

    def deepspec_names(self) -> dict[str, str]:
        return _common_names(self.cfg.num_layers, self.cfg.attention_bias,
                             {"input_layernorm": "embed_norm", "hidden_norm": "hidden_norm",
                              "post_attention_layernorm": "mlp_norm"})

    def _run(self, h: Tensor, emb: Tensor, pos: Tensor, past: list[tuple[Tensor, Tensor]] | None,
             mask: Tensor) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        new = []
        for i, layer in enumerate(self.layers):
            h, kv = layer(h, emb, pos, None if past is None else past[i], mask)
            new.append(kv)
        return h, new

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
        h_ctx, cache = self._run(h0, self.embed(ids[:, 1: L + 1]), pos, None, causal)  # (B, L, d)
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
            h, step_kv = self._run(h, self.embed(tok), anchors + k, cache, mask)
            cache = [(torch.cat([c[0], s[0]], dim=2), torch.cat([c[1], s[1]], dim=2))
                     for c, s in zip(cache, step_kv, strict=True)]
        logits = torch.stack(rows, dim=2)  # (B, A, γ, V)
        return Proposal(tokens, logits, to_probs(logits, temperature), top_prob_logits(logits, temperature), False)


# --------------------------------------------------------------------------- load / save


def _read_tensors(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return dict(load_file(str(single)))
    if index.is_file():
        weight_map = load_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ConfigError(f"{index}: missing 'weight_map'")
        state: dict[str, Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            if not (path / shard).is_file():
                raise ConfigError(f"{path / shard}: shard named by {index.name} is missing")
            state.update(load_file(str(path / shard)))
        return state
    raise ConfigError(f"{path}: no model.safetensors or model.safetensors.index.json")


def _short(keys: list[str]) -> str:
    return ", ".join(keys[:6]) + (f" … ({len(keys)} in all)" if len(keys) > 6 else "")


def build_drafter(cfg: DeepSpecConfig) -> DeepSpecDrafter:
    """Return an uninitialised module for `cfg` (DSpark/DFlash or Eagle3)."""
    return Eagle3Drafter(cfg) if cfg.kind == "eagle3" else DSparkDrafter(cfg)


def load_drafter(path: Path | str, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 target: tuple[int, int, int] | None = None) -> DeepSpecDrafter:
    """Load a DeepSpec checkpoint folder into sparksim's module, in eval mode on `device` in `dtype`.

    `target` = (decoder layers, hidden size, vocabulary) of the target it will run on, checked first.
    Raises ConfigError for an unknown architecture, a missing or unexpected tensor, or a shape mismatch.
    """
    path = Path(path)
    cfg = read_config(path)
    if target is not None:
        check_target(cfg, n_layers=target[0], hidden_size=target[1], vocab_size=target[2], where=str(path))
    model = build_drafter(cfg)
    state = _read_tensors(path)
    names = model.deepspec_names()
    missing = sorted(set(names) - set(state))
    if missing:
        raise ConfigError(f"{path}: missing tensors {_short(missing)} for a {cfg.kind} drafter "
                          f"({cfg.num_layers} layers, markov={cfg.markov_head_type}, conf={cfg.confidence_head})")
    unexpected = sorted(set(state) - set(names))
    if unexpected:
        raise ConfigError(f"{path}: unexpected tensors {_short(unexpected)} (not a {cfg.kind} drafter as its "
                          "config describes)")
    own = model.state_dict()
    bad = [f"{k} {tuple(state[k].shape)} (expected {tuple(own[v].shape)})" for k, v in names.items()
           if tuple(state[k].shape) != tuple(own[v].shape)]
    if bad:
        raise ConfigError(f"{path}: tensor shapes do not match config.json: {_short(bad)}")
    model.load_state_dict({v: state[k] for k, v in names.items()}, strict=True)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def config_dict(cfg: DeepSpecConfig) -> dict[str, Any]:
    """Return `cfg` as a DeepSpec `config.json` (the keys DeepSpec's own save writes, for a Qwen3 target)."""
    raw: dict[str, Any] = {
        "architectures": [cfg.architecture], "model_type": "qwen3", "attention_bias": cfg.attention_bias,
        "attention_dropout": 0.0, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "layer_types": ["full_attention"] * cfg.num_layers, "max_position_embeddings": 40960,
        "num_attention_heads": cfg.num_heads, "num_hidden_layers": cfg.num_layers,
        "num_key_value_heads": cfg.num_kv_heads, "num_target_layers": cfg.num_target_layers,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "sliding_window": None, "target_layer_ids": list(cfg.target_layer_ids), "tie_word_embeddings": False,
        "use_sliding_window": False, "vocab_size": cfg.vocab_size, "dtype": "float32",
    }
    if cfg.kind == "eagle3":
        raw |= {"ttt_length": cfg.gamma, "step_loss_decay": 0.8, "draft_num_hidden_layers": cfg.num_layers}
    else:
        raw |= {"block_size": cfg.gamma, "mask_token_id": cfg.mask_token_id, "num_anchors": 512,
                "markov_rank": cfg.markov_rank, "enable_confidence_head": cfg.confidence_head}
        if cfg.markov_rank > 0:
            raw["markov_head_type"] = cfg.markov_head_type
        if cfg.confidence_head:
            raw["confidence_head_with_markov"] = cfg.confidence_with_markov
    return raw


def save_drafter(model: DeepSpecDrafter, path: Path | str) -> None:
    """Write `model` as a DeepSpec checkpoint folder (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    own = model.state_dict()
    state = {k: own[v].detach().float().contiguous() for k, v in model.deepspec_names().items()}
    (path / "config.json").write_text(json.dumps(config_dict(model.cfg), indent=2, sort_keys=True) + "\n")
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


# --------------------------------------------------------------------------- HF target


@dataclass
class HFModel:
    """A HuggingFace causal LM and its tokenizer, on one device, as the recorder uses them."""

    path: Path
    model: Any
    tokenizer: Any
    n_layers: int
    hidden_size: int
    vocab_size: int
    stop_ids: list[int]
    pad_id: int
    device: torch.device

    def shape(self) -> tuple[int, int, int]:
        return self.n_layers, self.hidden_size, self.vocab_size

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]:
        """Return the ids of a one-turn chat prompt (thinking off, as DeepSpec's evaluation), or of raw text.

        A tokenizer without a chat template encodes the text as it is.
        """
        tok = self.tokenizer
        if chat and getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True, enable_thinking=False)
        return list(tok(text, add_special_tokens=False)["input_ids"])


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_dtype(name: str) -> torch.dtype:
    """Return the torch dtype for bf16 | fp16 | fp32."""
    if name not in DTYPES:
        raise ConfigError(f"--dtype {name!r} is not one of {list(DTYPES)}")
    return DTYPES[name]


def read_target_shape(path: Path) -> tuple[int, int, int]:
    """Return (decoder layers, hidden size, vocabulary) from a HF `config.json` without loading weights."""
    raw = load_json(path / "config.json")
    cfg = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw
    try:
        return int(cfg["num_hidden_layers"]), int(cfg["hidden_size"]), int(cfg["vocab_size"])
    except KeyError as exc:
        raise ConfigError(f"{path / 'config.json'}: missing key {exc.args[0]!r}") from None


def load_hf_target(path: Path | str, *, device: str | torch.device, dtype: torch.dtype) -> HFModel:
    """Load a HF causal LM and its tokenizer from a local folder onto `device` in `dtype`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path}: target folder (config.json) is missing")
    n_layers, hidden, vocab = read_target_shape(path)
    tok = AutoTokenizer.from_pretrained(str(path))
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation="sdpa")
    model = model.to(device).eval().requires_grad_(False)
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = tok.eos_token_id if eos is None else eos
    if eos is None:
        raise ConfigError(f"{path}: neither generation_config.json nor the tokenizer names an EOS token")
    stop_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    pad = tok.pad_token_id if tok.pad_token_id is not None else stop_ids[0]
    # A clean generation config: the checkpoint's sampling defaults (Qwen3: T 0.6, top-k 20, top-p 0.95)
    # would change the distribution the traces are supposed to sample from.
    model.generation_config = GenerationConfig(eos_token_id=stop_ids, pad_token_id=pad)
    return HFModel(path, model, tok, n_layers, hidden, vocab, stop_ids, int(pad), torch.device(device))


@torch.no_grad()
def generate_responses(target: HFModel, prompts: list[list[int]], *, temperature: float, max_new_tokens: int,
                       seed: int, batch_size: int, log: Any = print) -> list[list[int]]:
    """Sample one response per prompt with HF `generate` (left padding; T = 0 greedy), cut after the first stop token."""
    torch.manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: dict[int, list[int]] = {}
    t0 = time.monotonic()
    for lo in range(0, len(order), batch_size):
        idx = order[lo: lo + batch_size]
        P = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), P), target.pad_id, dtype=torch.long)
        attn = torch.zeros(len(idx), P, dtype=torch.long)
        for b, i in enumerate(idx):
            ids[b, P - len(prompts[i]):] = torch.tensor(prompts[i])
            attn[b, P - len(prompts[i]):] = 1
        kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": temperature > 0}
        if temperature > 0:
            kwargs |= {"temperature": temperature, "top_k": 0, "top_p": 1.0}
        seqs = target.model.generate(input_ids=ids.to(target.device), attention_mask=attn.to(target.device),
                                     **kwargs)[:, P:].tolist()
        for i, row in zip(idx, seqs, strict=True):
            cut = next((j for j, t in enumerate(row) if t in target.stop_ids), None)
            out[i] = row[: cut + 1] if cut is not None else row
        log(f"generated {min(lo + batch_size, len(order))}/{len(order)} responses ({time.monotonic() - t0:.0f}s)")
    return [out[i] for i in range(len(prompts))]


def verify_logits(model: Any, ids: Tensor, seq_logits: Tensor, anchors: Tensor, tokens: Tensor) -> Tensor:
    """Return the target's logits (1, A, γ, V) at each draft of the blocks `tokens` (1, A, γ) drafted at `anchors` (1, A).

    Row 0 is the anchor's own logits (from the sequence pass); rows 1..γ−1 come from one forward over
    the context up to the last anchor followed by every block's first γ−1 drafts, each block attending
    to its context (keys ≤ its anchor) and causally to itself: the blocks' forwards with the context's KV
    cache, without a cache (the rule of `sparksim.drafter.record.block_logits`, on any device).
    """
    dev = ids.device
    A, g = tokens.shape[1], tokens.shape[2]
    first = seq_logits[0, anchors[0]][None]  # (1, A, V)
    if g == 1:
        return first[:, :, None]
    S = int(anchors.max()) + 1
    Q = A * (g - 1)
    drafts = tokens[:, :, : g - 1].reshape(1, Q)  # x_1..x_{γ−1} (x_γ's successor is unused)
    d_pos = (anchors[..., None] + torch.arange(1, g, device=dev)).reshape(1, Q)
    blk, within = torch.arange(Q, device=dev) // (g - 1), torch.arange(Q, device=dev) % (g - 1)
    ctx_ok = torch.arange(S, device=dev)[None, :] <= anchors[0].repeat_interleave(g - 1)[:, None]  # (Q, S)
    own = (blk[:, None] == blk[None, :]) & (within[None, :] <= within[:, None])  # (Q, Q)
    top = torch.cat([torch.ones(S, S, dtype=torch.bool, device=dev).tril(),
                     torch.zeros(S, Q, dtype=torch.bool, device=dev)], dim=1)
    mask = torch.cat([top, torch.cat([ctx_ok, own], dim=1)], dim=0)[None, None]  # (1, 1, S+Q, S+Q)
    out = model(input_ids=torch.cat([ids[:, :S], drafts], dim=1),
                position_ids=torch.cat([torch.arange(S, device=dev)[None], d_pos], dim=1),
                attention_mask=mask, use_cache=False, logits_to_keep=Q)
    rest = out.logits[:, -Q:].reshape(1, A, g - 1, -1)  # (1, A, γ−1, V)
    return torch.cat([first[:, :, None].to(rest.dtype), rest], dim=2)


# --------------------------------------------------------------------------- prompts


PAPER_TASKS = (("gsm8k", 500, "math"), ("math500", 500, "math"), ("aime25", 30, "math"),
               ("humaneval", 164, "code"), ("mbpp", 256, "code"), ("livecodebench", 500, "code"),
               ("mt-bench", 80, "chat"), ("alpaca", 500, "chat"), ("arena-hard-v2", 500, "chat"))
DOMAIN_OF = {"gsm8k": "math", "math500": "math", "aime24": "math", "aime25": "math", "humaneval": "code",
             "mbpp": "code", "livecodebench": "code", "lbpp": "code", "swe-bench": "code",
             "mt-bench": "chat", "alpaca": "chat", "arena-hard-v2": "chat"}
PAPER_SELECTION_SEED = 980406  # DeepSpec eval.py's seed: which prompts a capped set keeps


@dataclass(frozen=True)
class EvalItem:
    """One prompt: its dataset, domain, line number and text."""

    dataset: str
    domain: str
    line: int
    text: str
    chat: bool = True  # a user turn for the chat template (DeepSpec `turns`); False: already formatted text

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.line}"


def _first_turn(row: dict[str, Any], where: str) -> str:
    turns = row.get("turns")
    if not (isinstance(turns, list) and turns and isinstance(turns[0], str)):
        raise ConfigError(f"{where}: needs a non-empty string list 'turns'")
    return turns[0]


def parse_task(spec: str) -> tuple[str, int | None, str]:
    """Parse NAME[:CAP[:DOMAIN]] (CAP 0 or empty = all rows); the domain defaults to DeepSpec's grouping."""
    parts = spec.split(":")
    name = parts[0]
    try:
        cap = int(parts[1]) if len(parts) > 1 and parts[1] else None
    except ValueError:
        raise ConfigError(f"--tasks {spec!r}: CAP {parts[1]!r} is not an integer") from None
    domain = parts[2] if len(parts) > 2 else DOMAIN_OF.get(name)
    if not name or domain is None or len(parts) > 3:
        raise ConfigError(f"--tasks {spec!r}: use NAME[:CAP[:DOMAIN]] (domain needed for unknown set {name!r})")
    return name, cap or None, domain


def load_eval_items(eval_dir: Path, tasks: Sequence[tuple[str, int | None, str]],
                    selection_seed: int = PAPER_SELECTION_SEED) -> list[EvalItem]:
    """Read DeepSpec's `eval_datasets/<name>.jsonl` rows ({"turns": [...]}, first turn only), capped as its eval.py.

    A set longer than its cap keeps the first CAP rows after a shuffle by random.Random(selection_seed):
    the prompts DeepSpec's evaluation uses.
    """
    items: list[EvalItem] = []
    for name, cap, domain in tasks:
        file = eval_dir / f"{name}.jsonl"
        rows = [EvalItem(name, domain, n, _first_turn(row, f"{file}:{n}")) for n, row in json_lines(file)]
        if cap is not None and len(rows) > cap:
            random.Random(selection_seed).shuffle(rows)
            rows = rows[:cap]
        items.extend(rows)
    return items


def load_prompt_file(path: Path) -> list[EvalItem]:
    """Read a prompt file: rows with `turns` (chat, as DeepSpec's sets) or `prompt` (formatted text, as sparksim's).

    The domain is the row's `domain`, else DeepSpec's grouping of the row's `dataset` (default: the file name).
    """
    items = []
    for n, row in json_lines(path):
        dataset = str(row.get("dataset") or path.stem)
        domain = row.get("domain") or DOMAIN_OF.get(dataset)
        if not domain:
            raise ConfigError(f"{path}:{n}: no 'domain' (and {dataset!r} is not one of DeepSpec's sets)")
        if "turns" in row:
            items.append(EvalItem(dataset, str(domain), n, _first_turn(row, f"{path}:{n}")))
        elif isinstance(row.get("prompt"), str):
            items.append(EvalItem(dataset, str(domain), n, row["prompt"], chat=False))
        else:
            raise ConfigError(f"{path}:{n}: needs 'turns' (a chat turn list) or 'prompt' (a string)")
    if not items:
        raise ConfigError(f"{path}: no prompts")
    return items


def in_calibration_split(item: EvalItem, fraction: float) -> bool:
    """Return True for the held-out share `fraction` of items STS is fitted on (stable hash of the key)."""
    return zlib.crc32(item.key.encode()) % 10_000 < round(fraction * 10_000)


# --------------------------------------------------------------------------- recording


@dataclass
class Responses:
    """Target responses to a list of items (token ids), and how long generating them took."""

    items: list[EvalItem]
    prompts: list[list[int]]
    responses: list[list[int]]
    generate_s: float = 0.0


def target_responses(target: HFModel, items: list[EvalItem], *, temperature: float, max_new_tokens: int,
                     seed: int, batch_size: int, cache_dir: Path | None, log: Any = print) -> Responses:
    """Return the target's responses to `items`, cached under `cache_dir` by a hash of target, prompts and settings."""
    from sparksim.atomic import write_text

    prompts = [target.encode_prompt(it.text, it.chat) for it in items]
    key = hashlib.sha256(json.dumps([str(target.path.resolve()), [it.key for it in items], prompts]).encode()
                         + f"{max_new_tokens}-{temperature}-{seed}".encode()).hexdigest()[:16]
    cache = cache_dir / f"responses-{key}.json" if cache_dir else None
    if cache is not None and cache.is_file():
        blob = json.loads(cache.read_text())
        log(f"reusing {len(items)} cached responses ({cache})")
        return Responses(items, prompts, blob["responses"], float(blob.get("generate_s", 0.0)))
    t0 = time.monotonic()
    resp = generate_responses(target, prompts, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                              batch_size=batch_size, log=log)
    out = Responses(items, prompts, resp, time.monotonic() - t0)
    if cache is not None:
        write_text(cache, json.dumps({"keys": [it.key for it in items], "responses": resp,
                                      "generate_s": out.generate_s}))
    return out


@dataclass
class Recorded:
    """Per-position arrays of one drafter on a list of responses (rows request by request, pos 0 first)."""

    conf_logits: NDArray[np.float32]  # (N, γ)
    p_accept: NDArray[np.float32]  # (N, γ) exact 1 − TV
    accepted: NDArray[np.int8]  # (N,)
    offsets: NDArray[np.int64] = field(default_factory=lambda: np.zeros(1, np.int64))
    record_s: float = 0.0


@torch.no_grad()
def record_responses(target: HFModel, drafter: DeepSpecDrafter, data: Responses, *, temperature: float,
                     seed: int, anchor_chunk: int = 256, log: Any = print) -> Recorded:
    """Draft and verify a γ-block at every output position of every response, one response at a time.

    Anchors a = P−1 .. S−2 (the last emitted token at each output position); a response's anchors go
    through the drafter and the target `anchor_chunk` at a time, so memory stays bounded on long outputs.
    Rejection sampling is `sparksim.drafter.record.verify` on the gathered probabilities (CPU generator).
    """
    from sparksim.drafter.record import verify

    dev = target.device
    gen_draft = torch.Generator(device=dev).manual_seed(seed)
    gen_verify = torch.Generator().manual_seed(seed + 1)
    conf_l, p_acc, acc = [], [], []
    t0 = time.monotonic()
    for n, (prompt, resp) in enumerate(zip(data.prompts, data.responses, strict=True)):
        ids = torch.tensor([prompt + resp], dtype=torch.long, device=dev)  # (1, S)
        out = target.model(input_ids=ids, output_hidden_states=True, use_cache=False)
        seq_logits, feats = out.logits, drafter.target_features(out.hidden_states)
        del out
        anchors_all = torch.arange(len(prompt) - 1, ids.shape[1] - 1, device=dev)
        for lo in range(0, anchors_all.numel(), anchor_chunk):
            anchors = anchors_all[lo: lo + anchor_chunk][None]  # (1, A)
            prop = drafter.propose(feats, ids, anchors, temperature, gen_draft)
            t_logits = verify_logits(target.model, ids, seq_logits, anchors, prop.tokens)
            p_t = to_probs(t_logits, temperature)  # (1, A, γ, V)
            pa = (1 - 0.5 * (prop.probs - p_t).abs().sum(-1)).clamp(0, 1)  # (1, A, γ)
            sel = prop.tokens[..., None]
            pt_sel, pd_sel = p_t.gather(-1, sel).cpu(), prop.probs.gather(-1, sel).cpu()  # (1, A, γ, 1)
            n_acc = verify(pt_sel, pd_sel, torch.zeros_like(prop.tokens, device="cpu"), gen_verify)
            conf_l.append(prop.conf_logits[0].float().cpu().numpy())
            p_acc.append(pa[0].float().cpu().numpy())
            acc.append(n_acc[0].numpy())
        if (n + 1) % 20 == 0 or n + 1 == len(data.responses):
            log(f"recorded {n + 1}/{len(data.responses)} responses ({time.monotonic() - t0:.0f}s)")
    g = drafter.cfg.gamma
    lens = np.array([len(r) for r in data.responses], dtype=np.int64)
    return Recorded(np.concatenate(conf_l).astype(np.float32).reshape(-1, g),
                    np.concatenate(p_acc).astype(np.float32).reshape(-1, g),
                    np.concatenate(acc).astype(np.int8), np.concatenate([[0], np.cumsum(lens)]),
                    time.monotonic() - t0)


def describe(cfg: DeepSpecConfig, path: Path) -> str:
    """Return the card's one-line drafter description."""
    heads = (f"markov={cfg.markov_head_type}(r={cfg.markov_rank}), confidence_head={cfg.confidence_head}"
             if cfg.kind != "eagle3" else "ttt, no confidence head")
    return (f"{cfg.kind} (DeepSpec {cfg.architecture}, {path.name}; L={cfg.num_layers}, γ={cfg.gamma}, {heads}, "
            f"target_layer_ids={list(cfg.target_layer_ids)})")


def write_recording(out: Path, data: Responses, rec: Recorded, cal: dict[str, Any] | None, *,
                    target: HFModel, drafter: DeepSpecDrafter, drafter_dir: Path, temperature: float,
                    extra_card: dict[str, Any]) -> Path:
    """Write one trace set: STS-calibrated `conf`, raw `conf_raw`, `p_accept`, `accepted`, and its card."""
    import pandas as pd

    from sparksim.drafter.calibrate import apply_sts, reliability, sigmoid
    from sparksim.drafter.record import Recording, acceptance_summary
    from sparksim.traces.format import write_traceset

    cfg = drafter.cfg
    temps = np.asarray(cal["temperatures"], np.float64) if cal else np.ones(cfg.gamma)
    if temps.shape != (cfg.gamma,):
        raise ConfigError(f"calibration: {temps.size} temperatures for γ={cfg.gamma}")
    domains = np.array([it.domain for it in data.items])
    datasets = np.array([it.dataset for it in data.items])
    requests = pd.DataFrame({
        "request_id": np.arange(len(data.items), dtype=np.int64), "domain": domains,
        "prompt_tokens": [len(p) for p in data.prompts], "output_tokens": [len(r) for r in data.responses],
    })
    summary_rec = Recording([], rec.conf_logits, rec.p_accept, rec.accepted, rec.offsets)
    card: dict[str, Any] = {
        "source": "recorded",
        "name": out.name,
        "target": str(target.path),
        "drafter": describe(cfg, drafter_dir),
        "drafter_dir": str(drafter_dir),
        "gamma": cfg.gamma,
        "temperature": temperature,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "",
        "conf_meaning": ("calibrated conditional confidence σ(logit_k / T_k) of the confidence head"
                         if cfg.confidence_head else
                         "no confidence head: top draft probability max_v p_d,k(v) (softmax at T=1 when T=0), "
                         "STS-calibrated"),
        "calibration": ({"method": "sts", "temperatures": cal["temperatures"], "fitted_on": cal.get("prompts"),
                         "validation": cal.get("validation")} if cal else {"method": "none"}),
        "calibration_on_this_set": reliability(rec.conf_logits, rec.accepted, temps),
        "acceptance": acceptance_summary(summary_rec, domains, cfg.gamma),
        "acceptance_by_dataset": acceptance_summary(summary_rec, datasets, cfg.gamma),
        "request_ids_by_dataset": {str(d): [int(ix[0]), int(ix[-1])] for d in dict.fromkeys(datasets.tolist())
                                   for ix in [np.flatnonzero(datasets == d)]},  # first, last: contiguous
        "timing_s": {"generate": round(data.generate_s, 1), "record": round(rec.record_s, 1)},
        **extra_card,
    }
    return write_traceset(out, requests, apply_sts(rec.conf_logits, temps).astype(np.float32), rec.accepted, card,
                          conf_raw=sigmoid(rec.conf_logits).astype(np.float32), p_accept=rec.p_accept)


@dataclass
class RecordSettings:
    """How responses are generated and recorded (shared by calibration and recording)."""

    temperature: float = 1.0  # sampling temperature of the target and the drafter (0 = greedy)
    max_new_tokens: int = 256  # longest response
    seed: int = 2  # responses, drafts and rejection sampling
    generate_batch: int = 32  # prompts per HF generate call
    anchor_chunk: int = 256  # anchors per drafter/verify pass
    cache_dir: Path | None = None  # where responses are cached (None: not cached)


def calibrate_drafter(target: HFModel, drafter: DeepSpecDrafter, items: list[EvalItem], out_file: Path,
                      how: RecordSettings, *, fitted_on: str, log: Any = print) -> dict[str, Any]:
    """Record `items`, fit STS temperatures on the recording, write them to `out_file` and return them."""
    from sparksim.atomic import write_text
    from sparksim.drafter.calibrate import fit_sts, reliability

    data = target_responses(target, items, temperature=how.temperature, max_new_tokens=how.max_new_tokens,
                            seed=how.seed, batch_size=how.generate_batch, cache_dir=how.cache_dir, log=log)
    rec = record_responses(target, drafter, data, temperature=how.temperature, seed=how.seed,
                           anchor_chunk=how.anchor_chunk, log=log)
    temps = fit_sts(rec.conf_logits, rec.accepted)
    cal = {"method": "sts", "temperatures": [float(t) for t in temps], "prompts": fitted_on,
           "positions": int(rec.accepted.shape[0]), "seed": how.seed, "temperature": how.temperature,
           "validation": reliability(rec.conf_logits, rec.accepted, temps)}
    write_text(out_file, json.dumps(cal, indent=2) + "\n")
    return cal


def record_drafter(target: HFModel, drafter: DeepSpecDrafter, drafter_dir: Path, items: list[EvalItem], out: Path,
                   how: RecordSettings, *, cal: dict[str, Any] | None, extra_card: dict[str, Any],
                   log: Any = print) -> Path:
    """Generate (or reuse) the target's responses to `items`, record them and write the trace set `out`."""
    data = target_responses(target, items, temperature=how.temperature, max_new_tokens=how.max_new_tokens,
                            seed=how.seed, batch_size=how.generate_batch, cache_dir=how.cache_dir, log=log)
    rec = record_responses(target, drafter, data, temperature=how.temperature, seed=how.seed,
                           anchor_chunk=how.anchor_chunk, log=log)
    extra = {"data": {"responses": len(items), "max_new_tokens": how.max_new_tokens, "seed": how.seed,
                      "domains": {d: sum(it.domain == d for it in items) for d in sorted({it.domain for it in items})},
                      "prompt_format": "chat template, one user turn, thinking off ('turns'); raw text ('prompt')"},
             "deepspec_config": config_dict(drafter.cfg), **extra_card}
    path = write_recording(out, data, rec, cal, target=target, drafter=drafter, drafter_dir=drafter_dir,
                           temperature=how.temperature, extra_card=extra)
    log(f"wrote {out} ({len(items)} responses, {rec.accepted.shape[0]} positions)")
    return path


def load_pair(target_dir: Path, drafter_dir: Path, *, gamma: int | None, device: str,
              dtype: str) -> tuple[HFModel, DeepSpecDrafter]:
    """Check the drafter against the target's config and γ, then load both onto `device` in `dtype`."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: CUDA is not available on this machine")
    if not (Path(target_dir) / "config.json").is_file():
        raise ConfigError(f"{target_dir}: target folder (config.json) is missing")
    shape = read_target_shape(Path(target_dir))
    cfg = read_config(drafter_dir)
    check_target(cfg, n_layers=shape[0], hidden_size=shape[1], vocab_size=shape[2], where=str(drafter_dir))
    if gamma is not None and cfg.gamma != gamma:
        raise ConfigError(f"{drafter_dir}/config.json: drafter γ={cfg.gamma} but --gamma {gamma} was asked for")
    torch_dtype = parse_dtype(dtype)
    return (load_hf_target(target_dir, device=device, dtype=torch_dtype),
            load_drafter(drafter_dir, device=device, dtype=torch_dtype))


def record(target_dir: Path, drafter_dir: Path, prompts: Path, out: Path, *, gamma: int,
           temperature: float = 1.0, max_new_tokens: int = 256, seed: int = 2, device: str = "cpu",
           dtype: str = "fp32", batch_size: int = 32, anchor_chunk: int = 256, calibration: Path | None = None,
           command: str = "", extra_card: dict[str, Any] | None = None, log: Any = print) -> Path:
    """Record one trace set at `out` for a DeepSpec drafter on a HF target (what `sparksim record` calls).

    The prompt file holds `turns` or `prompt` rows (`load_prompt_file`). STS temperatures come from
    `calibration`, else `<drafter>/calibration.json` when present (as the built-in recorder), else none.
    """
    if temperature < 0:
        raise ConfigError(f"--temperature {temperature} must be >= 0")
    items = load_prompt_file(prompts)
    cal_path = calibration or drafter_dir / "calibration.json"
    if calibration is not None and not calibration.is_file():
        raise ConfigError(f"{calibration}: calibration file is missing")
    cal = load_json(cal_path) if cal_path.is_file() else None
    target, drafter = load_pair(target_dir, drafter_dir, gamma=gamma, device=device, dtype=dtype)
    how = RecordSettings(temperature, max_new_tokens, seed, batch_size, anchor_chunk)
    extra = {"command": command, "device": device, "dtype": dtype, "prompts": str(prompts), **(extra_card or {})}
    return record_drafter(target, drafter, drafter_dir, items, out, how, cal=cal, extra_card=extra, log=log)


def calibrate(target_dir: Path, drafter_dir: Path, prompts: Path, *, temperature: float = 1.0,
              max_new_tokens: int = 256, seed: int = 1, device: str = "cpu", dtype: str = "fp32",
              batch_size: int = 32, anchor_chunk: int = 256, out: Path | None = None,
              log: Any = print) -> dict[str, Any]:
    """Fit STS on held-out prompts and write `out` (default `<drafter>/calibration.json`); return it."""
    target, drafter = load_pair(target_dir, drafter_dir, gamma=None, device=device, dtype=dtype)
    how = RecordSettings(temperature, max_new_tokens, seed, batch_size, anchor_chunk)
    return calibrate_drafter(target, drafter, load_prompt_file(prompts), out or drafter_dir / "calibration.json",
                             how, fitted_on=str(prompts), log=log)


def load_drafters(specs: Sequence[str], target_dir: Path) -> list[tuple[str, Path, DeepSpecConfig]]:
    """Parse NAME=DIR specs and check every drafter against the target's config (no weights loaded)."""
    shape = read_target_shape(target_dir)
    parsed = []
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            raise ConfigError(f"--drafter {spec!r}: use NAME=DIR (e.g. dspark=/models/dspark_qwen3_8b_block7)")
        cfg = read_config(folder)
        check_target(cfg, n_layers=shape[0], hidden_size=shape[1], vocab_size=shape[2],
                     where=f"{folder} vs target {target_dir}")
        parsed.append((name, Path(folder), cfg))
    if len({p[0] for p in parsed}) != len(parsed):
        raise ConfigError(f"--drafter names must differ: {[p[0] for p in parsed]}")
    return parsed


def run_record(args: argparse.Namespace, command: str, log: Any = print) -> list[Path]:
    """Record every drafter × temperature on the evaluation prompts; return the trace-set folders written.

    Per temperature the target answers each prompt once (cached in OUT/responses/, shared by the
    drafters and reused on a rerun); STS is fitted per drafter and temperature on the held-out split.
    """
    target_dir, out_dir = Path(args.target), Path(args.out_dir)
    if not (target_dir / "config.json").is_file():
        raise ConfigError(f"{target_dir}: target folder (config.json) is missing")
    drafters = load_drafters(args.drafter, target_dir)
    for name, path, cfg in drafters:
        if cfg.gamma != args.gamma:
            raise ConfigError(f"{path}: drafter {name!r} has γ={cfg.gamma} but --gamma {args.gamma} was asked for")
    tasks = [parse_task(t) for t in args.tasks] if args.tasks else list(PAPER_TASKS)
    items = load_eval_items(Path(args.eval_dir), tasks)
    cal_items = [it for it in items if in_calibration_split(it, args.calibration_fraction)]
    rec_items = [it for it in items if not in_calibration_split(it, args.calibration_fraction)]
    if not rec_items:
        raise ConfigError("no prompts left to record after the calibration split")
    target = loaded = None
    written = []
    for temperature in args.temperature:
        how = RecordSettings(temperature, args.max_new_tokens, args.seed, args.generate_batch, args.anchor_chunk,
                             out_dir / "responses")
        for name, path, _ in drafters:
            if target is None:  # load after every check has passed
                target, first = load_pair(target_dir, path, gamma=args.gamma, device=args.device, dtype=args.dtype)
                loaded = {drafters[0][0]: first} | {
                    n: load_drafter(p, device=args.device, dtype=parse_dtype(args.dtype)) for n, p, _ in drafters[1:]}
            assert loaded is not None
            tag = f"{args.name or target_dir.name.lower()}-{name}-t{temperature:g}"
            cal = None
            if cal_items:
                log(f"[{tag}] fitting STS on {len(cal_items)} held-out prompts")
                cal = calibrate_drafter(target, loaded[name], cal_items, out_dir / "calibration" / f"{tag}.json",
                                        replace(how, seed=args.seed + 10),
                                        fitted_on=f"{args.eval_dir}: {args.calibration_fraction:g} of each set held out",
                                        log=log)
            log(f"[{tag}] recording {len(rec_items)} prompts")
            extra = {"command": command, "device": args.device, "dtype": args.dtype,
                     "eval_sets": {"eval_dir": str(args.eval_dir), "tasks": [list(t) for t in tasks],
                                   "selection_seed": PAPER_SELECTION_SEED,
                                   "calibration_fraction": args.calibration_fraction,
                                   "calibration_responses": len(cal_items)}}
            written.append(record_drafter(target, loaded[name], path, rec_items, out_dir / tag, how, cal=cal,
                                          extra_card=extra, log=log))
    return written


# --------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sparksim.drafter.deepspec",
                                description="Run DeepSpec drafter checkpoints (DSpark, DFlash, Eagle3) with sparksim.")
    sub = p.add_subparsers(dest="cmd", required=True)
    chk = sub.add_parser("check", help="Check drafters against a target's config (no weights loaded).")
    chk.add_argument("--target", required=True, help="HF target folder (config.json, weights, tokenizer).")
    chk.add_argument("--drafter", action="append", required=True, help="NAME=DIR of a DeepSpec checkpoint; repeat.")
    rec = sub.add_parser("record", help="Record trace sets for drafters × temperatures on DeepSpec's eval sets.")
    rec.add_argument("--target", required=True, help="HF target folder (config.json, weights, tokenizer).")
    rec.add_argument("--drafter", action="append", required=True, help="NAME=DIR of a DeepSpec checkpoint; repeat.")
    rec.add_argument("--eval-dir", required=True, help="DeepSpec's eval_datasets/ folder (<name>.jsonl with 'turns').")
    rec.add_argument("--tasks", nargs="*", default=None,
                     help="NAME[:CAP[:DOMAIN]] sets to record (default: the paper's nine with eval.py's caps).")
    rec.add_argument("--out-dir", required=True, help="Folder for <name>-<drafter>-t<T>/ trace sets and calibration/.")
    rec.add_argument("--name", default=None, help="Trace-set name prefix (default: the target folder's name).")
    rec.add_argument("--gamma", type=int, default=7, help="Block size γ; must equal each drafter's.")
    rec.add_argument("--temperature", type=float, action="append", default=None,
                     help="Sampling temperature (0 = greedy, exact replay); repeat for several. Default 1.")
    rec.add_argument("--max-new-tokens", type=int, default=2048, help="Longest response (DeepSpec eval: 2048).")
    rec.add_argument("--calibration-fraction", type=float, default=0.2,
                     help="Share of each set held out to fit STS (0 = no calibration, conf = raw σ(logit)).")
    rec.add_argument("--seed", type=int, default=2, help="Seed for responses, drafts and rejection sampling.")
    rec.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda, cuda:1 or cpu.")
    rec.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="Weights and activations dtype.")
    rec.add_argument("--generate-batch", type=int, default=32, help="Prompts per HF generate call.")
    rec.add_argument("--anchor-chunk", type=int, default=256, help="Anchors per drafter/verify pass (memory bound).")
    return p


def main(argv: Sequence[str] | None = None, log: Any = print) -> int:
    """Entry point of `python -m sparksim.drafter.deepspec`; return the exit status (2 on a ConfigError)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "check":
            target = Path(args.target)
            if not (target / "config.json").is_file():
                raise ConfigError(f"{target}: target folder (config.json) is missing")
            shape = read_target_shape(target)
            for name, path, cfg in load_drafters(args.drafter, target):
                log(f"{name}: {describe(cfg, path)} matches target {target} "
                    f"({shape[0]} layers, d={shape[1]}, V={shape[2]})")
            return 0
        if args.temperature is None:
            args.temperature = [1.0]
        if not 0 <= args.calibration_fraction < 1:
            raise ConfigError(f"--calibration-fraction {args.calibration_fraction} must be in [0, 1)")
        if any(t < 0 for t in args.temperature):
            raise ConfigError(f"--temperature {args.temperature} must be >= 0")
        run_record(args, "python -m sparksim.drafter.deepspec " + shlex.join(argv), log=log)
        return 0
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


__all__ = ["DeepSpecConfig", "DeepSpecDrafter", "Proposal", "calibrate", "check_target", "load_drafter",
           "load_hf_target", "main", "read_config", "record", "record_responses", "save_drafter", "verify_logits"]

if __name__ == "__main__":
    raise SystemExit(main())
