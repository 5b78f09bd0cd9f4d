"""DeepSpec checkpoint folders: which tensor is which parameter, and loading and saving them.

A checkpoint holds HF/DeepSpec names (`layers.0.self_attn.q_proj.weight`); sparksim's modules
name the same tensors after `sparksim.decoder` (`layers.0.attn.q.weight`). `tensor_names` is the
one map between them, used both ways, and loading refuses a missing, unexpected or misshapen
tensor by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from sparksim.drafter.config import load_json
from sparksim.drafter.deepspec.config import DeepSpecConfig, check_target, config_dict, read_config
from sparksim.drafter.deepspec.models import DeepSpecDrafter, DSparkDrafter, build_drafter
from sparksim.errors import ConfigError


def _layer_names(n_layers: int, attn_bias: bool, layer_norms: dict[str, str]) -> dict[str, str]:
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


def tensor_names(model: DeepSpecDrafter) -> dict[str, str]:
    """Return {DeepSpec tensor name: `model`'s parameter name} for every tensor of its checkpoint."""
    cfg: DeepSpecConfig = model.cfg
    if not isinstance(model, DSparkDrafter):  # Eagle3: two input norms, no heads
        return _layer_names(cfg.num_layers, cfg.attention_bias,
                            {"input_layernorm": "embed_norm", "hidden_norm": "hidden_norm",
                             "post_attention_layernorm": "mlp_norm"})
    names = _layer_names(cfg.num_layers, cfg.attention_bias,
                         {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm"})
    names["hidden_norm.weight"] = "hidden_norm.weight"
    if model.markov is not None:
        names |= {"markov_head.markov_w1.weight": "markov.w1.weight",
                  "markov_head.markov_w2.weight": "markov.w2.weight"}
        if model.markov.gate is not None:
            names |= {"markov_head.gate_proj.weight": "markov.gate.weight",
                      "markov_head.gate_proj.bias": "markov.gate.bias"}
        if model.markov.joint is not None:
            names |= {"markov_head.joint_proj.weight": "markov.joint.weight",
                      "markov_head.joint_proj.bias": "markov.joint.bias"}
    if model.conf is not None:
        names |= {"confidence_head.proj.weight": "conf.weight", "confidence_head.proj.bias": "conf.bias"}
    return names


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
    names = tensor_names(model)
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


def save_drafter(model: DeepSpecDrafter, path: Path | str) -> None:
    """Write `model` as a DeepSpec checkpoint folder (config.json + model.safetensors)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    own = model.state_dict()
    state = {k: own[v].detach().float().contiguous() for k, v in tensor_names(model).items()}
    (path / "config.json").write_text(json.dumps(config_dict(model.cfg), indent=2, sort_keys=True) + "\n")
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})

