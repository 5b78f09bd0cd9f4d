"""A HuggingFace target as the DeepSpec recorder runs it: loading, generation, and one verification pass."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sparksim.drafter.config import load_json
from sparksim.errors import ConfigError


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

