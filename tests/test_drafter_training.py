"""Drafter and target training: the loss falls on a toy corpus, and an interrupted run resumes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from sparksim.drafter.config import TargetConfig, TrainConfig  # noqa: E402
from sparksim.drafter.data import Item, write_prompts  # noqa: E402
from sparksim.drafter.model import drafter_loss  # noqa: E402
from sparksim.drafter.train import Sequence, drafter_batch, target_features, train_target  # noqa: E402

from ._drafter_fixtures import tiny_drafter, tiny_target  # noqa: E402


def test_drafter_loss_is_finite_and_falls_over_a_few_steps_on_a_toy_corpus() -> None:
    """If the combined CE + L1 + BCE loss cannot fall on a fixed toy batch, training is broken."""
    torch.manual_seed(0)
    target = tiny_target()
    drafter = tiny_drafter(target)
    seqs = [Sequence(f"s{i}", "math", [256, 65, 66], [(67 + (j * (i + 1)) % 7) for j in range(24)])
            for i in range(4)]
    feats = target_features(target, drafter, seqs, pad_id=258)
    batch = drafter_batch(feats, anchors_per_seq=6, gamma=4, pad_id=258, rng=random.Random(0))
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    losses, bces = [], []
    for _ in range(25):
        out = drafter.backbone(drafter.context(batch["ctx"]), batch["ids"], batch["anchors"])
        logits, conf = drafter.heads(out, batch["prev"])
        parts = drafter_loss(drafter.cfg, logits, conf, batch["target_logits"], batch["labels"], batch["valid"])
        assert torch.isfinite(parts.loss)
        opt.zero_grad()
        parts.loss.backward()
        opt.step()
        losses.append(float(parts.loss.detach()))
        bces.append(parts.bce)
    assert losses[-1] < 0.8 * losses[0]
    assert all(0.0 <= a <= 1.0 for a in parts.accept)


def test_target_training_checkpoints_atomically_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    """A killed background run must continue from its last checkpoint, not from step 0."""
    corpus = tmp_path / "corpus.jsonl"
    write_prompts(corpus, [Item(f"k{i}", d, "User: hi\nAssistant: ", "some text " * 20)
                           for i in range(6) for d in ("math", "code", "chat")])
    cfg = TargetConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=128)
    run = tmp_path / "run"
    train_target(run, corpus, cfg, TrainConfig(steps=4, batch_size=2, seq_len=32, ckpt_every=2,
                                               warmup_steps=1, bf16=False), log=lambda _: None)
    assert json.loads((run / "checkpoint" / "state.json").read_text())["step"] == 4
    assert (run / "model" / "model.safetensors").is_file()
    messages: list[str] = []
    train_target(run, corpus, cfg, TrainConfig(steps=6, batch_size=2, seq_len=32, ckpt_every=2,
                                               warmup_steps=1, bf16=False), log=messages.append)
    assert any("resuming target training at step 4" in m for m in messages)
    steps = [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()]
    assert steps == [4, 6]
    assert not list(run.glob(".checkpoint.*"))  # no half-written temporary left behind
