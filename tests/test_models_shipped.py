"""The shipped trained models are the ones their card describes, and they load as a pair."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models" / "tinylm-d128-l6"


def test_every_shipped_file_matches_its_checksum() -> None:
    card = yaml.safe_load((MODELS / "card.yaml").read_text())
    assert card["source"] == "trained" and "make retrain" in card["command"]
    sums = card["sha256"]
    assert {"target/model.safetensors", "dspark/drafter.safetensors", "dflash/drafter.safetensors",
            "data/test.jsonl"} <= set(sums)
    for rel, want in sums.items():
        assert hashlib.sha256((MODELS / rel).read_bytes()).hexdigest() == want, rel


def test_the_shipped_target_and_drafters_load_together() -> None:
    pytest.importorskip("torch")
    from sparksim.live.engine import LiveModels

    for kind in ("dspark", "dflash"):
        models = LiveModels.load(MODELS / "target", MODELS / kind)
        assert models.gamma == 7 and models.drafter is not None
        assert models.temps.shape == (7,) and models.info["calibration"] == "sts"
        assert models.drafter.cfg.kind == kind


REFERENCE = ROOT / "tests" / "data" / "shipped-logits.safetensors"
WEIGHTS = ("target/model.safetensors", "dspark/drafter.safetensors", "dflash/drafter.safetensors")
PROMPT = b"User: What is 16 * 57?\nAssistant: Split 57 into 50 + 7."  # 55 bytes
ANCHORS = [[20, 37, 50]]


def shipped_outputs() -> dict[str, Any]:
    """The target's logits on PROMPT and each drafter's γ-block logits and confidences at ANCHORS."""
    import torch

    from sparksim.drafter.model import draft
    from sparksim.drafter.target import load_target
    from sparksim.drafter.train import load_drafter

    torch.set_num_threads(1)
    target = load_target(MODELS / "target")
    ids, anchors = torch.tensor([list(PROMPT)]), torch.tensor(ANCHORS)
    out = {}
    with torch.no_grad():
        logits, hidden, _ = target.model(ids)
        out["target"] = logits
        for kind in ("dspark", "dflash"):
            drafter = load_drafter(MODELS / kind, target)
            block = drafter.backbone(drafter.context(drafter.target_features(hidden)), ids, anchors)
            d = draft(drafter, block, ids.gather(1, anchors), 0.0, None)
            out[f"{kind}_logits"], out[f"{kind}_conf"] = block.logits, d.conf_logits
    return out


def test_the_shipped_models_give_the_logits_they_gave_when_shipped() -> None:
    # Refactoring the decoder must not move the trained models: the reference was written by
    # the code the models were shipped with (`python -m tests.test_models_shipped` rewrites it
    # after a retrain). It is bit-identical on the machine that wrote it; the tolerance leaves
    # room for another CPU's kernels (an Intel Xeon VM differs by up to 2.6e-5 on logits of
    # magnitude 24, float32 sums in another order), far below what a wrong rotation, norm or
    # split changes.
    pytest.importorskip("torch")
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(REFERENCE), "pt") as f:
        written_for = f.metadata()
    sums = yaml.safe_load((MODELS / "card.yaml").read_text())["sha256"]
    if any(written_for.get(w) != sums[w] for w in WEIGHTS):
        pytest.fail(f"models/ was retrained after {REFERENCE.name} was written: run python -m tests.test_models_shipped")
    ref = load_file(str(REFERENCE))
    got = shipped_outputs()
    assert set(got) == set(ref)
    for name, want in ref.items():
        assert got[name].shape == want.shape, name
        torch.testing.assert_close(got[name], want, rtol=0, atol=1e-4, msg=name)


if __name__ == "__main__":
    from safetensors.torch import save_file

    card_sums = yaml.safe_load((MODELS / "card.yaml").read_text())["sha256"]
    save_file({k: v.contiguous() for k, v in shipped_outputs().items()}, str(REFERENCE),
              metadata={w: card_sums[w] for w in WEIGHTS})
    print(f"wrote {REFERENCE}")
