"""Copy the trained target and drafters from checkpoints/ into models/<name>/ with a card.

    python scripts/ship_models.py            # after `make recorded-traces` (run by `make models`)

The card says how each was trained (the train.json each run wrote, the Makefile command), the
prompt files they were trained, calibrated and recorded on (copied beside them), and every
file's SHA-256, so `sparksim live`, `sparksim record` and `sparksim profile live` run on the
shipped weights without retraining and anyone can check they have the same ones.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CK = ROOT / "checkpoints"
OUT = ROOT / "models" / "tinylm-d128-l6"
PARTS = {  # shipped folder -> (source folder, files)
    "target": (CK / "target" / "model", ["config.json", "model.safetensors", "train.json"]),
    "dspark": (CK / "dspark" / "drafter", ["config.json", "drafter.safetensors", "calibration.json", "train.json"]),
    "dflash": (CK / "dflash" / "drafter", ["config.json", "drafter.safetensors", "calibration.json", "train.json"]),
    "data": (CK / "data", ["train.jsonl", "val.jsonl", "test.jsonl"]),
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    missing = [str(src / f) for src, files in PARTS.values() for f in files if not (src / f).is_file()]
    if missing:
        print(f"missing (run `make recorded-traces` first): {missing}", file=sys.stderr)
        return 1
    if OUT.exists():
        shutil.rmtree(OUT)
    checksums: dict[str, str] = {}
    for name, (src, files) in PARTS.items():
        (OUT / name).mkdir(parents=True)
        for f in files:
            shutil.copy2(src / f, OUT / name / f)
            checksums[f"{name}/{f}"] = sha256(OUT / name / f)
    # the drafters' train.json name the checkpoint folders they were trained from; the shipped
    # copies live here, so point them at the shipped target
    for name in ("dspark", "dflash"):
        info = json.loads((OUT / name / "train.json").read_text())
        info["target_shipped_as"] = "models/tinylm-d128-l6/target"
        (OUT / name / "train.json").write_text(json.dumps(info, indent=2) + "\n")
        checksums[f"{name}/train.json"] = sha256(OUT / name / "train.json")
    target_train = json.loads((OUT / "target" / "train.json").read_text())
    card = {
        "source": "trained",
        "what": "the byte-level TinyLM target (d=128, 6 layers, 2 heads, SwiGLU 384, 1.3M parameters) and "
                "the DSpark and DFlash drafters (2 layers, gamma 7, target layers 1-3 injected; DSpark with "
                "a rank-64 Markov head and a confidence head) behind traces/tinylm-d128-l6-*-recorded",
        "how": "trained on this repository's 2-core CPU from text on the machine (no downloads): "
               "`make retrain` (build-prompts -> train-target -> train-drafter (dspark, dflash in "
               "parallel) -> calibrate -> this copy), seeds 0/0/0/1; `make recorded-traces` then records; training stops at its step count or "
               "wall-clock cap, so a rerun on another machine gives other weights (same recipe)",
        "command": "make retrain -j2 THREADS=1  (build-prompts, train-target, export-target, train-drafter x2, calibrate x2, then scripts/ship_models.py)",
        "target_training": {k: target_train.get(k) for k in ("train", "steps_done", "elapsed_s", "final_loss")},
        "drafter_training": {
            name: {k: json.loads((OUT / name / "train.json").read_text()).get(k)
                   for k in ("train", "steps_done", "elapsed_s", "sequences", "final_loss")}
            for name in ("dspark", "dflash")},
        "data": "data/*.jsonl: the prompt files (train: drafter training; val: STS calibration; test: "
                "recording, the live engine's requests); built by `sparksim build-prompts --seed 0`",
        "sha256": checksums,
    }
    (OUT / "card.yaml").write_text(yaml.safe_dump(card, sort_keys=False, width=100))
    size = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
