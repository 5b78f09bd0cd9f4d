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

import numpy as np
from numpy.typing import ArrayLike, NDArray

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
    """A decoder-only transformer's shape: GQA or MLA attention, a dense SwiGLU MLP or MoE.

    Dense Llama/Qwen3 models set only the first fields. An MoE model (Mixtral, Qwen3-MoE,
    DeepSeek-V3) adds routed experts (`num_experts`, top-`experts_per_token`, each a SwiGLU
    of width `expert_intermediate`), optional shared experts and leading dense layers. MLA
    (DeepSeek-V3) caches one compressed latent of `kv_lora_rank` plus `qk_rope_head_dim`
    elements per token per layer instead of K and V per KV head.
    """

    name: str
    num_layers: int
    hidden: int
    num_heads: int  # query heads
    num_kv_heads: int
    head_dim: int
    intermediate: int  # SwiGLU MLP width (MoE models: the leading dense layers' width)
    vocab: int
    max_position: int  # longest context the model accepts
    tie_embeddings: bool = False
    source: str = ""  # where the figures come from
    num_experts: int = 0  # routed experts per MoE layer (0: a dense MLP in every layer)
    experts_per_token: int = 0  # top-k routing
    expert_intermediate: int = 0  # each expert's SwiGLU width
    num_shared_experts: int = 0  # always-active experts per MoE layer (same width)
    first_dense_layers: int = 0  # leading layers with a dense MLP of width `intermediate`
    routing_skew: float = 0.0  # Zipf exponent of expert popularity (0: uniform routing)
    kv_lora_rank: int = 0  # MLA's compressed KV width (0: GQA)
    q_lora_rank: int = 0  # MLA's compressed query width (0: a direct query projection)
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    num_mtp_layers: int = 0  # the model's own multi-token-prediction modules

    def __post_init__(self) -> None:
        problems = []
        if self.num_experts:
            if not 0 < self.experts_per_token <= self.num_experts:
                problems.append(f"experts_per_token={self.experts_per_token} must be in 1..num_experts="
                                f"{self.num_experts}")
            if self.expert_intermediate <= 0:
                problems.append(f"expert_intermediate={self.expert_intermediate} must be > 0")
            if not 0 <= self.first_dense_layers < self.num_layers:
                problems.append(f"first_dense_layers={self.first_dense_layers} must be in "
                                f"0..num_layers-1={self.num_layers - 1}")
        elif self.experts_per_token or self.num_shared_experts:
            problems.append("experts_per_token/num_shared_experts need num_experts > 0")
        if self.routing_skew < 0:
            problems.append(f"routing_skew={self.routing_skew} must be >= 0")
        if self.kv_lora_rank and (self.qk_rope_head_dim <= 0 or self.qk_nope_head_dim <= 0
                                  or self.v_head_dim <= 0):
            problems.append("MLA (kv_lora_rank > 0) needs qk_nope_head_dim, qk_rope_head_dim and "
                            "v_head_dim > 0")
        if problems:
            raise ConfigError(f"model {self.name!r}: " + "; ".join(problems))

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attn_params(self) -> int:
        """Matmul weights of one layer's attention: Q, K, V and O (MLA: its down/up projections)."""
        h, heads = self.hidden, self.num_heads
        if not self.is_mla:
            return h * self.head_dim * (heads * 2 + self.num_kv_heads * 2)
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        q = h * self.q_lora_rank + self.q_lora_rank * heads * qk if self.q_lora_rank else h * heads * qk
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * heads * (
            self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + heads * self.v_head_dim * h

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden * self.intermediate

    @property
    def expert_params(self) -> int:
        """Weights of one expert (a SwiGLU of width `expert_intermediate`)."""
        return 3 * self.hidden * self.expert_intermediate

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def layer_params(self) -> int:
        """Matmul weights of one dense decoder layer: attention and the SwiGLU MLP."""
        return self.attn_params + self.dense_mlp_params

    @property
    def moe_layer_params(self) -> int:
        """Matmul weights of one MoE layer: attention, router, every routed and shared expert."""
        return (self.attn_params + self.hidden * self.num_experts
                + (self.num_experts + self.num_shared_experts) * self.expert_params)

    @property
    def _dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    @property
    def params(self) -> int:
        """Parameter count, embeddings and LM head included (norms and MTP modules ignored)."""
        emb = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return self._dense_layers * self.layer_params + self.moe_layers * self.moe_layer_params + emb

    @property
    def matmul_params(self) -> int:
        """Weights a step can read (the input embedding is a gather, not a matmul): all of them."""
        return (self._dense_layers * self.layer_params + self.moe_layers * self.moe_layer_params
                + self.vocab * self.hidden)

    @property
    def active_params(self) -> int:
        """Matmul weights one token goes through: attention, its k + shared experts, the LM head."""
        if not self.is_moe:
            return self.matmul_params
        moe = self.attn_params + self.hidden * self.num_experts + (
            self.experts_per_token + self.num_shared_experts) * self.expert_params
        return self._dense_layers * self.layer_params + self.moe_layers * moe + self.vocab * self.hidden

    def experts_touched(self, tokens: ArrayLike) -> NDArray[np.float64]:
        """Expected distinct routed experts one MoE layer reads for a step of `tokens` tokens.

        Each token picks k of E experts; expert i is picked with probability q_i, k·p_i for
        popularity p_i ∝ i^(−routing_skew) water-filled at 1 so that Σ q_i = k (a token's k
        picks are distinct), and E[distinct] = Σ_i 1 − (1 − q_i)^T. Uniform routing gives
        E·(1 − (1 − k/E)^T): k at T = 1, E as T → ∞.
        """
        t = np.asarray(tokens, dtype=np.float64)
        if not self.is_moe:
            return np.zeros_like(t)
        pop = np.arange(1, self.num_experts + 1, dtype=np.float64) ** -self.routing_skew
        q = self.experts_per_token * pop / pop.sum()  # (E,)
        for _ in range(self.num_experts):  # water-fill: cap at 1, hand the excess to the rest
            over = q > 1.0
            if not over.any():
                break
            free = ~over & (q < 1.0)
            excess = float((q[over] - 1.0).sum())
            q[over] = 1.0
            q[free] += excess * q[free] / q[free].sum()
        with np.errstate(divide="ignore"):  # q = 1: that expert is always touched
            untouched = np.exp(np.multiply.outer(t, np.log1p(-q)))  # (..., E)
        untouched = np.where(q >= 1.0, np.where(np.expand_dims(t, -1) > 0, 0.0, 1.0), untouched)
        return (1.0 - untouched).sum(axis=-1)

    def weights_read(self, tokens: ArrayLike) -> NDArray[np.float64]:
        """Matmul weights (elements) a step of `tokens` tokens reads: all but untouched experts."""
        t = np.asarray(tokens, dtype=np.float64)
        if not self.is_moe:
            return np.full(t.shape, float(self.matmul_params))
        fixed = self.matmul_params - self.moe_layers * self.num_experts * self.expert_params
        return fixed + self.moe_layers * self.experts_touched(t) * self.expert_params

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache elements per token of context, all layers (multiply by the dtype's bytes).

        GQA: K and V of every KV head; MLA: one compressed latent plus the RoPE key.
        """
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs per (query token × context token), all layers: QKᵀ and PV at 2 FLOPs per MAC.

        GQA: 4 · heads · head_dim. MLA in its decode form (the up-projections absorbed): the
        query meets the latent and the RoPE key, and the output is read from the latent,
        2 · heads · (2 · kv_lora_rank + qk_rope_head_dim).
        """
        if self.is_mla:
            return self.num_layers * 2 * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return self.num_layers * 4 * self.num_heads * self.head_dim

    @property
    def prefill_attention_flops_per_pair(self) -> int:
        """FLOPs per (query token × context token) of prompt attention, all layers.

        GQA: as decode. MLA prefills in its materialised form (the "compute friendly approach"
        of vLLM's MLA backend, SGLang's and TensorRT-LLM's too): K and V up-projected from
        the latent, then plain attention of QK head dim qk_nope + qk_rope and V head dim
        v_head, 2 · heads · (qk_nope + qk_rope + v_head). Up-projecting a cached prefix's K and V
        (2 · kv_lora_rank · heads · (qk_nope + v_head) FLOPs a prefix token a layer, which the
        engines also run) is not priced: about 2 % of DeepSeek's published prefill step.
        """
        if self.is_mla:
            return self.num_layers * 2 * self.num_heads * (
                self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
        return self.attention_flops_per_pair

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
            **({"n_routed_experts": self.num_experts, "num_experts_per_tok": self.experts_per_token,
                "moe_intermediate_size": self.expert_intermediate,
                "n_shared_experts": self.num_shared_experts,
                "first_k_dense_replace": self.first_dense_layers} if self.is_moe else {}),
            **({"kv_lora_rank": self.kv_lora_rank, "q_lora_rank": self.q_lora_rank,
                "qk_nope_head_dim": self.qk_nope_head_dim, "qk_rope_head_dim": self.qk_rope_head_dim,
                "v_head_dim": self.v_head_dim} if self.is_mla else {}),
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
        experts = int(config.get("n_routed_experts") or config.get("num_local_experts")
                      or config.get("num_experts") or 0)
        moe: dict[str, Any] = {}
        if experts:
            moe = {
                "num_experts": experts,
                "experts_per_token": int(config.get("num_experts_per_tok", 0)),
                "expert_intermediate": int(config.get("moe_intermediate_size")
                                           or config["intermediate_size"]),
                "num_shared_experts": int(config.get("n_shared_experts") or 0),
                "first_dense_layers": int(config.get("first_k_dense_replace") or 0),
            }
        if config.get("kv_lora_rank"):
            moe.update(kv_lora_rank=int(config["kv_lora_rank"]),
                       q_lora_rank=int(config.get("q_lora_rank") or 0),
                       qk_nope_head_dim=int(config["qk_nope_head_dim"]),
                       qk_rope_head_dim=int(config["qk_rope_head_dim"]),
                       v_head_dim=int(config["v_head_dim"]))
        moe["num_mtp_layers"] = int(config.get("num_nextn_predict_layers") or 0)
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
            **moe,
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
        ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096, False,
                  "huggingface.co/meta-llama/Llama-2-7b-hf config.json (multi-head attention: "
                  "num_key_value_heads 32)"),
        # Small enough to profile on a laptop CPU in minutes; same family shape as Qwen3.
        ModelSpec("cpu-demo", 4, 512, 8, 2, 64, 1536, 32000, 8192, True,
                  "sparksim built-in (for CPU profiling)"),
        ModelSpec("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936, 40960, False,
                  "huggingface.co/Qwen/Qwen3-30B-A3B config.json (num_experts 128, "
                  "num_experts_per_tok 8, moe_intermediate_size 768)",
                  num_experts=128, experts_per_token=8, expert_intermediate=768),
        ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768, False,
                  "huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json (num_local_experts 8, "
                  "num_experts_per_tok 2)",
                  num_experts=8, experts_per_token=2, expert_intermediate=14336),
        ModelSpec("deepseek-v3", 61, 7168, 128, 128, 128, 18432, 129280, 163840, False,
                  "huggingface.co/deepseek-ai/DeepSeek-V3 config.json (n_routed_experts 256, "
                  "num_experts_per_tok 8, moe_intermediate_size 2048, n_shared_experts 1, "
                  "first_k_dense_replace 3, kv_lora_rank 512, q_lora_rank 1536, qk_nope_head_dim 128, "
                  "qk_rope_head_dim 64, v_head_dim 128, num_nextn_predict_layers 1)",
                  num_experts=256, experts_per_token=8, expert_intermediate=2048,
                  num_shared_experts=1, first_dense_layers=3, kv_lora_rank=512, q_lora_rank=1536,
                  qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_mtp_layers=1),
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
