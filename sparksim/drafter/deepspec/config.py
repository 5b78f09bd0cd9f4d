"""A DeepSpec drafter's `config.json`: read and checked into `DeepSpecConfig`, and written back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparksim.drafter.config import load_json
from sparksim.errors import ConfigError

DSPARK_ARCH = "Qwen3DSparkModel"
EAGLE3_ARCH = "Qwen3Eagle3Model"
EAGLE3_ALIASES = (EAGLE3_ARCH, "Eagle3DraftModel")  # DeepSpec's eval.py runs both as Qwen3Eagle3Model
_GEMMA4 = ("Gemma4 drafters (Gemma RMSNorm with v-norm and sandwich norms, scaled embeddings, logit "
           "soft-capping) are not implemented here")
UNSUPPORTED_ARCHS = {"Gemma4DSparkModel": _GEMMA4, "Gemma4Eagle3Model": _GEMMA4}
MARKOV_KINDS = ("vanilla", "gated", "rnn")


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

