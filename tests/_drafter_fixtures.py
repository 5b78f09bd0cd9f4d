"""Tiny targets and drafters shared by the drafter tests (not a test module itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sparksim.drafter.config import DrafterConfig, TargetConfig  # noqa: E402
from sparksim.drafter.model import Drafter  # noqa: E402
from sparksim.drafter.target import BuiltinTarget, TinyLM  # noqa: E402

TINY_TARGET = TargetConfig(d_model=32, n_layers=5, n_heads=2, d_ff=64, max_seq_len=256)


def tiny_target(seed: int = 0) -> BuiltinTarget:
    """Return a randomly initialised 5-layer, width-32 built-in target."""
    torch.manual_seed(seed)
    return BuiltinTarget(TinyLM(TINY_TARGET).eval().requires_grad_(False), "bytes-v1")


def tiny_drafter_config(**over: object) -> DrafterConfig:
    """Return a width-32 DSpark config with γ=4 injecting target layers 1 and 2."""
    base: dict[str, object] = {"gamma": 4, "n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 64,
                               "target_layer_ids": [1, 2], "markov_rank": 8}
    base.update(over)
    return DrafterConfig(**base)  # type: ignore[arg-type]


def tiny_drafter(target: BuiltinTarget, **over: object) -> Drafter:
    """Return an untrained tiny drafter sharing `target`'s embedding and LM head."""
    return Drafter(tiny_drafter_config(**over), target.embed_tokens, target.lm_head, max_seq_len=256)


def save_pair(tmp: Path, **over: object) -> tuple[Path, Path]:
    """Save a tiny target and drafter under `tmp`; return (target_dir, drafter_dir)."""
    import json
    from dataclasses import asdict

    from safetensors.torch import save_file

    from sparksim.drafter.target import save_builtin

    target = tiny_target()
    save_builtin(target.model, tmp / "target")
    drafter = tiny_drafter(target, **over)
    (tmp / "drafter").mkdir()
    save_file(drafter.trainable_state(), str(tmp / "drafter" / "drafter.safetensors"))
    (tmp / "drafter" / "config.json").write_text(json.dumps(asdict(drafter.cfg)))
    return tmp / "target", tmp / "drafter"
