"""The shipped trained models are the ones their card describes, and they load as a pair."""

from __future__ import annotations

import hashlib
from pathlib import Path

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
