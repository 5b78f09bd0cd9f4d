"""Model architecture presets (no torch): the shapes the roofline and the profiler build from.

Figures come from each model's public `config.json` on the Hugging Face Hub (read from the
model cards; nothing is downloaded at run time). Any HF-style config dict also works
through `ModelSpec.from_hf_config`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparksim.errors import ConfigError

HF_REQUIRED = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shape (Llama/Qwen3 family: GQA attention, SwiGLU MLP)."""

    name: str
    num_layers: int
    hidden: int
    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int
    intermediate: int  # SwiGLU MLP width
    vocab: int
    max_position: int  # longest context the model accepts
    tie_embeddings: bool = False
    source: str = ""  # where the figures come from

    @property
    def layer_params(self) -> int:
        """Matmul weights of one decoder layer: Q, K, V, O projections and the SwiGLU MLP."""
        attn = self.hidden * self.head_dim * (self.num_heads * 2 + self.num_kv_heads * 2)
        return attn + 3 * self.hidden * self.intermediate

    @property
    def params(self) -> int:
        """Parameter count, embeddings and LM head included (norms ignored)."""
        emb = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self.num_layers * self.layer_params + emb

    @property
    def matmul_params(self) -> int:
        """Parameters touched by a matmul per token (the input embedding is a gather, not a matmul)."""
        return self.num_layers * self.layer_params + self.vocab * self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache elements per token of context, all layers (multiply by the dtype's bytes)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def to_hf_config(self) -> dict[str, Any]:
        """Return an HF-style config dict (Qwen3/Llama field names)."""
        return {
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate,
            "vocab_size": self.vocab,
            "max_position_embeddings": self.max_position,
            "tie_word_embeddings": self.tie_embeddings,
        }

    def config_hash(self) -> str:
        """A short stable hash of the shape, for profile cards."""
        blob = json.dumps(self.to_hf_config(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str = "custom") -> ModelSpec:
        """Build a spec from an HF `config.json` dict; raise ConfigError naming missing fields."""
        missing = [k for k in HF_REQUIRED if k not in config]
        if missing:
            raise ConfigError(f"model config {name!r} is missing field(s): {', '.join(missing)}")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            name=name,
            num_layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads", heads)),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            max_position=int(config.get("max_position_embeddings", 32768)),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            source="config.json",
        )


PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("qwen3-4b", 36, 2560, 32, 8, 128, 9728, 151936, 40960, True,
                  "huggingface.co/Qwen/Qwen3-4B config.json"),
        ModelSpec("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, 40960, False,
                  "huggingface.co/Qwen/Qwen3-8B config.json"),
        ModelSpec("qwen3-14b", 40, 5120, 40, 8, 128, 17408, 151936, 40960, False,
                  "huggingface.co/Qwen/Qwen3-14B config.json"),
        ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072, False,
                  "huggingface.co/meta-llama/Llama-3.1-8B config.json"),
        # Small enough to profile on a laptop CPU in minutes; same family shape as Qwen3.
        ModelSpec("cpu-demo", 4, 512, 8, 2, 64, 1536, 32000, 8192, True,
                  "sparksim built-in (for CPU profiling)"),
    )
}


def load_model_spec(name_or_path: str) -> ModelSpec:
    """Return a preset by name, or parse an HF-style config.json at a path."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():
        from sparksim.config import read_json_object

        return ModelSpec.from_hf_config(read_json_object(path), name=path.parent.name or path.stem)
    raise ConfigError(
        f"unknown model {name_or_path!r}; presets: {', '.join(PRESETS)}, or a path to config.json"
    )
