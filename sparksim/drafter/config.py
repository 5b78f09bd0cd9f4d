"""Configuration dataclasses for the target LM, the drafter and their training runs."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from sparksim.config import read_json_object
from sparksim.errors import ConfigError

C = TypeVar("C")


@dataclass
class TargetConfig:
    """Shape of the built-in target LM (a small pre-norm decoder, Qwen3-like)."""

    vocab_size: int = 260  # byte tokenizer: 256 bytes + BOS, EOS, PAD, MASK
    d_model: int = 256  # residual width
    n_layers: int = 6  # decoder layers
    n_heads: int = 4  # attention heads (head_dim = d_model / n_heads)
    d_ff: int = 768  # SwiGLU hidden width
    max_seq_len: int = 1024  # longest sequence RoPE tables are built for
    rope_theta: float = 10000.0  # RoPE base
    tokenizer: str = "bytes-v1"  # tokenizer id; drafter and recorder must agree


@dataclass
class DrafterConfig:
    """Shape and loss of a DSpark drafter (or, with markov_rank=0 and no confidence head, DFlash)."""

    gamma: int = 7  # block size γ: anchor + γ−1 masks in, γ draft logits out
    n_layers: int = 2  # parallel backbone layers L
    d_model: int = 256  # must equal the target's width (shared embedding / LM head)
    n_heads: int = 4  # attention heads
    d_ff: int = 768  # SwiGLU hidden width
    target_layer_ids: list[int] = field(default_factory=lambda: [1, 2, 3])  # target layers injected (0-based decoder layers)
    markov_rank: int = 64  # rank r of the bigram head W1[x]·W2; 0 disables it (DFlash)
    confidence_head: bool = True  # c_k = σ(wᵀ[h_k ; W1[x_{k−1}]]); False for DFlash
    ce_alpha: float = 0.1  # weight of the cross-entropy term against the target's tokens
    l1_alpha: float = 0.9  # weight of ‖p_d − p_t‖₁
    conf_alpha: float = 1.0  # weight of the confidence BCE against 1 − TV
    loss_decay: float = 4.0  # position weights exp(−(k−1)/loss_decay), as in the released code
    vocab_size: int = 260  # copied from the target
    mask_token_id: int = 259  # id fed at the γ−1 mask slots
    tokenizer: str = "bytes-v1"  # copied from the target; checked by the recorder
    kind: str = "dspark"  # "dspark" or "dflash" (label only; the fields above decide)

    def __post_init__(self) -> None:
        if self.gamma < 1:
            raise ConfigError(f"drafter gamma={self.gamma} must be >= 1")
        if self.markov_rank < 0:
            raise ConfigError(f"drafter markov_rank={self.markov_rank} must be >= 0")
        if self.d_model % self.n_heads:
            raise ConfigError(f"drafter d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if not self.target_layer_ids:
            raise ConfigError("drafter target_layer_ids is empty; at least one target layer is injected")


@dataclass
class TrainConfig:
    """One training run: optimiser, schedule, batch and checkpoint cadence."""

    steps: int = 2000  # optimiser steps
    batch_size: int = 16  # sequences per step
    seq_len: int = 512  # tokens per sequence (target) / longest sequence kept (drafter)
    lr: float = 1e-3  # peak AdamW learning rate
    warmup_steps: int = 100  # linear warm-up, then cosine decay to lr/10
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # global gradient-norm clip
    anchors_per_seq: int = 32  # drafter: anchors sampled per sequence and step
    ckpt_every: int = 100  # steps between atomic checkpoints
    max_minutes: float = 60.0  # wall-clock cap; the run checkpoints and stops when reached
    seed: int = 0  # seeds data order, anchors and init
    threads: int = 0  # torch threads (0 = torch default)
    bf16: bool = True  # CPU bf16 autocast for the forward pass


def config_from_dict(cls: type[C], data: dict[str, Any], where: str) -> C:
    """Build dataclass `cls` from `data`, naming `where` and the key on an unknown field."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} for {cls.__name__}")
    return cls(**data)


def load_json(path: Path) -> dict[str, Any]:
    """Read a JSON object from `path`, raising ConfigError naming the file if it is missing or bad."""
    return read_json_object(path)
