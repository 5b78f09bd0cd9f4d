"""Target LMs that expose per-layer hidden states: a small built-in decoder and a HuggingFace adapter.

Everything downstream (drafter training, the recorder) talks to a `TargetAdapter`:
- `forward_masked(ids, positions, mask)` runs the target over tokens with explicit positions and
  an explicit boolean attention mask and returns logits and the per-layer hidden states
  (HF convention: entry 0 is the embedding output, entry i the output of decoder layer i−1, the
  last entry is after the final norm). One call verifies many drafted blocks at once: each block
  attends to its own context prefix and causally to itself, which is exactly a forward over the
  block with the context's KV cache.
- `generate(prompts, …)` samples responses with a KV cache.
- `embed_tokens` / `lm_head` are shared (frozen) with the drafter.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from sparksim.decoder import Block, BlockConfig, RMSNorm, rope_angles
from sparksim.drafter.config import TargetConfig, config_from_dict, load_json
from sparksim.drafter.tokenizer import get_tokenizer
from sparksim.errors import ConfigError

KVCache = list[tuple[Tensor, Tensor]]


# --------------------------------------------------------------------------- built-in target


def block_config(cfg: TargetConfig) -> BlockConfig:
    """Return the decoder layer of a built-in target: multi-head, one fused qkv matrix, RoPE pairs interleaved."""
    return BlockConfig(d_model=cfg.d_model, n_heads=cfg.n_heads, n_kv_heads=cfg.n_heads,
                       head_dim=cfg.d_model // cfg.n_heads, d_ff=cfg.d_ff, rope_theta=cfg.rope_theta,
                       proj="qkv", rope_interleaved=True)


class TinyLM(nn.Module):
    """A small causal LM (tied embedding and LM head) that returns every layer's hidden state."""

    rope_cos: Tensor  # (max_seq_len, Dh/2) buffers, not saved
    rope_sin: Tensor

    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers: list[Block] = nn.ModuleList(  # type: ignore[assignment]
            Block(block_config(cfg)) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.embed.weight
        cos, sin = rope_angles(torch.arange(cfg.max_seq_len), cfg.d_model // cfg.n_heads, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)
        std = 0.02 / math.sqrt(2 * cfg.n_layers)
        for name, p in self.named_parameters():  # scale residual writes so deep stacks start near identity
            if name.endswith(("attn.out.weight", "mlp.down.weight")):
                nn.init.normal_(p, std=std)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: Tensor, positions: Tensor | None = None, mask: Tensor | None = None,
                past: KVCache | None = None) -> tuple[Tensor, list[Tensor], KVCache]:
        """Return logits (B, T, V), hidden states (L+1 × (B, T, d), HF convention) and the KV cache."""
        B, T = ids.shape
        if positions is None:
            start = past[0][0].shape[2] if past else 0
            positions = torch.arange(start, start + T, device=ids.device).expand(B, T)
        if int(positions.max()) >= self.cfg.max_seq_len:
            raise ConfigError(f"target: position {int(positions.max())} exceeds max_seq_len={self.cfg.max_seq_len}")
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]  # (B, T, Dh/2)
        x = self.embed(ids)  # (B, T, d)
        hidden, present = [x], []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, mask, past[i] if past else None)
            hidden.append(x)
            present.append(kv)
        x = self.norm(x)
        hidden[-1] = x  # HF convention: the last entry is after the final norm
        return self.lm_head(x), hidden, present


# --------------------------------------------------------------------------- adapters

def sample_logits(logits: Tensor, temperature: float, gen: torch.Generator | None) -> Tensor:
    """Sample one id per row of logits (…, V) at `temperature`; 0 means argmax."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).reshape(probs.shape[:-1])


class TargetAdapter(ABC):
    """What the drafter and the recorder need from a target LM."""

    n_layers: int  # decoder layers
    d_model: int  # hidden width
    vocab_size: int
    tokenizer_name: str
    embed_tokens: nn.Embedding  # shared with the drafter, frozen
    lm_head: nn.Linear  # shared with the drafter, frozen (applied after the drafter's own norm)

    @abstractmethod
    def forward_masked(self, ids: Tensor, positions: Tensor, mask: Tensor | None) -> tuple[Tensor, list[Tensor]]:
        """Return logits (B, T, V) and hidden states (L+1 × (B, T, d)); mask (B, 1, T, T) bool or None (causal)."""

    @abstractmethod
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                 gen: torch.Generator | None, eos_id: int, pad_id: int) -> list[list[int]]:
        """Sample one response per prompt (ending at EOS, included, or at max_new_tokens)."""

    def check_hidden_states(self) -> None:
        """Raise ConfigError unless one forward returns L+1 hidden states of width d."""
        ids = torch.zeros(1, 2, dtype=torch.long)
        pos = torch.arange(2).unsqueeze(0)
        with torch.no_grad():
            _, hidden = self.forward_masked(ids, pos, None)
        if hidden is None or len(hidden) != self.n_layers + 1 or hidden[1].shape[-1] != self.d_model:
            got = None if hidden is None else len(hidden)
            raise ConfigError(f"target: hidden states are not accessible (got {got} entries, "
                              f"need {self.n_layers + 1} of width {self.d_model})")


class BuiltinTarget(TargetAdapter):
    """Adapter over the built-in TinyLM."""

    def __init__(self, model: TinyLM, tokenizer_name: str) -> None:
        self.model = model
        self.n_layers, self.d_model = model.cfg.n_layers, model.cfg.d_model
        self.vocab_size, self.tokenizer_name = model.cfg.vocab_size, tokenizer_name
        self.embed_tokens, self.lm_head = model.embed, model.lm_head

    def forward_masked(self, ids: Tensor, positions: Tensor, mask: Tensor | None) -> tuple[Tensor, list[Tensor]]:
        logits, hidden, _ = self.model(ids, positions, mask)
        return logits, hidden

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                 gen: torch.Generator | None, eos_id: int, pad_id: int) -> list[list[int]]:
        if max_new_tokens <= 0:  # nothing to sample (the loop below would leave its index unset)
            return [[] for _ in prompts]
        # Left-pad so every row's next token sits in the last column; pads are masked out as keys.
        B, P = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, P), pad_id, dtype=torch.long)
        keep = torch.zeros(B, P + max_new_tokens, dtype=torch.bool)
        keep[:, P:] = True  # generated tokens are always real
        for b, p in enumerate(prompts):
            ids[b, P - len(p):] = torch.tensor(p)
            keep[b, P - len(p):P] = True
        pos = (keep[:, :P].long().cumsum(1) - 1).clamp(min=0)  # (B, P)
        causal = torch.ones(P, P, dtype=torch.bool).tril()
        mask = causal.unsqueeze(0) & keep[:, None, :P]  # (B, P, P)
        mask |= torch.eye(P, dtype=torch.bool)  # pad rows attend to themselves, avoiding NaN
        logits, _, cache = self.model(ids, pos, mask.unsqueeze(1))
        out = torch.zeros(B, max_new_tokens, dtype=torch.long)
        done = torch.zeros(B, dtype=torch.bool)
        next_pos = pos[:, -1] + 1  # (B,)
        for t in range(max_new_tokens):
            tok = sample_logits(logits[:, -1], temperature, gen)  # (B,)
            out[:, t] = tok
            done |= tok == eos_id
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            step_mask = keep[:, None, None, : P + t + 1]  # (B, 1, 1, S)
            logits, _, cache = self.model(tok[:, None], next_pos[:, None], step_mask, cache)
            next_pos = next_pos + 1
        responses = []
        for b in range(B):
            row = out[b].tolist()
            if eos_id in row:
                row = row[: row.index(eos_id) + 1]
            responses.append(row[: t + 1])
        return responses


class HFTarget(TargetAdapter):
    """Adapter over a HuggingFace causal LM (Qwen3/Llama families), transformers 5.x.

    The tokenizer is the one named by the config's `sparksim_tokenizer` key (default bytes-v1):
    the model's vocabulary must be that tokenizer's.
    """

    def __init__(self, model: Any, tokenizer_name: str) -> None:
        self.model = model
        cfg = model.config
        self.n_layers, self.d_model = int(cfg.num_hidden_layers), int(cfg.hidden_size)
        self.vocab_size, self.tokenizer_name = int(cfg.vocab_size), tokenizer_name
        self.embed_tokens = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        if self.lm_head is None:
            raise ConfigError("target: the HF model has no output embeddings (LM head)")

    def forward_masked(self, ids: Tensor, positions: Tensor, mask: Tensor | None) -> tuple[Tensor, list[Tensor]]:
        # A 4D mask is passed through as-is by transformers' masking utils (True = attend).
        out = self.model(input_ids=ids, position_ids=positions,
                         attention_mask=mask, output_hidden_states=True, use_cache=False)
        hidden = getattr(out, "hidden_states", None)
        return out.logits, list(hidden) if hidden is not None else None  # type: ignore[return-value]

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                 gen: torch.Generator | None, eos_id: int, pad_id: int) -> list[list[int]]:
        B, P = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, P), pad_id, dtype=torch.long)
        attn = torch.zeros(B, P, dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, P - len(p):] = torch.tensor(p)
            attn[b, P - len(p):] = 1
        if gen is not None:  # HF sampling draws from the global generator
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        kwargs: dict[str, Any] = {"do_sample": temperature > 0, "max_new_tokens": max_new_tokens,
                                  "eos_token_id": eos_id, "pad_token_id": pad_id}
        if temperature > 0:
            kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
        seqs = self.model.generate(input_ids=ids, attention_mask=attn, **kwargs)[:, P:]
        responses = []
        for row in seqs.tolist():  # HF pads a row only after its EOS: up to it, every id was generated
            responses.append(row[: row.index(eos_id) + 1] if eos_id in row else row)
        return responses


# --------------------------------------------------------------------------- save / load

BUILTIN_MODEL_TYPE = "sparksim-tinylm"


def save_builtin(model: TinyLM, out_dir: Path) -> None:
    """Write config.json and model.safetensors for `model` into `out_dir` (call inside atomic_dir)."""
    from dataclasses import asdict

    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": BUILTIN_MODEL_TYPE, **asdict(model.cfg)}
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(out_dir / "model.safetensors"))


def load_target(path: Path | str) -> TargetAdapter:
    """Load a target from a local directory: the built-in TinyLM or a HuggingFace model.

    The target is put in eval mode with gradients off, and its hidden states are checked.
    """
    path = Path(path)
    raw = load_json(path / "config.json")
    if raw.get("model_type") == BUILTIN_MODEL_TYPE:
        from safetensors.torch import load_file

        fields_ = {k: v for k, v in raw.items() if k != "model_type"}
        cfg = config_from_dict(TargetConfig, fields_, str(path / "config.json"))
        model = TinyLM(cfg)
        state = load_file(str(path / "model.safetensors"))
        missing, unexpected = model.load_state_dict(state, strict=False)
        if [m for m in missing if m != "lm_head.weight"] or unexpected:
            raise ConfigError(f"{path}/model.safetensors: missing {missing}, unexpected {unexpected}")
        model.eval().requires_grad_(False)
        target: TargetAdapter = BuiltinTarget(model, cfg.tokenizer)
    else:
        try:
            from transformers import AutoModelForCausalLM
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ConfigError(f"{path}: a HuggingFace target needs transformers ({exc})") from None
        hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        hf.eval().requires_grad_(False)
        target = HFTarget(hf, str(raw.get("sparksim_tokenizer", "bytes-v1")))
    get_tokenizer(target.tokenizer_name)
    target.check_hidden_states()
    return target


def export_hf(model: TinyLM, out_dir: Path) -> None:
    """Write `model` as a HuggingFace Qwen3ForCausalLM checkpoint (same function, HF layout).

    TinyLM is Qwen3-shaped (q/k RMSNorm, SwiGLU, tied head, no biases). Only RoPE differs: TinyLM
    rotates interleaved pairs (2i, 2i+1), HF rotates halves (i, i + Dh/2), so the rows of every
    head's q/k projection (and the q/k norm gains) are permuted into half order.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = model.cfg
    hd = cfg.d_model // cfg.n_heads
    perm = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])  # interleaved → halves
    hf_cfg = Qwen3Config(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_heads, head_dim=hd, max_position_embeddings=cfg.max_seq_len,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
                         rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
                         bos_token_id=256, eos_token_id=257, pad_token_id=258)
    hf_cfg.sparksim_tokenizer = cfg.tokenizer
    sd = model.state_dict()
    out: dict[str, Tensor] = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm.weight"]}
    for i in range(cfg.n_layers):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        wq, wk, wv = sd[p + "attn.qkv.weight"].chunk(3, dim=0)  # 3 × (d, d)
        heads = lambda w: w.view(cfg.n_heads, hd, -1)[:, perm].reshape(cfg.d_model, -1)  # noqa: E731
        out |= {
            q + "self_attn.q_proj.weight": heads(wq), q + "self_attn.k_proj.weight": heads(wk),
            q + "self_attn.v_proj.weight": wv, q + "self_attn.o_proj.weight": sd[p + "attn.out.weight"],
            q + "self_attn.q_norm.weight": sd[p + "attn.q_norm.weight"][perm],
            q + "self_attn.k_norm.weight": sd[p + "attn.k_norm.weight"][perm],
            q + "input_layernorm.weight": sd[p + "attn_norm.weight"],
            q + "post_attention_layernorm.weight": sd[p + "mlp_norm.weight"],
            q + "mlp.gate_proj.weight": sd[p + "mlp.gate.weight"], q + "mlp.up_proj.weight": sd[p + "mlp.up.weight"],
            q + "mlp.down_proj.weight": sd[p + "mlp.down.weight"],
        }
    hf = Qwen3ForCausalLM(hf_cfg)
    missing, unexpected = hf.load_state_dict({k: v.contiguous().clone() for k, v in out.items()}, strict=False)
    if [m for m in missing if m != "lm_head.weight"] or unexpected:
        raise ConfigError(f"export_hf: missing {missing}, unexpected {unexpected}")
    hf.save_pretrained(str(out_dir))
