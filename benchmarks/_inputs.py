"""Benchmark inputs: a profile and a trace set built from fixed parameters (no shipped files needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sparksim.cost.profile import write_profile
from sparksim.traces import write_traceset


def build_inputs(root: Path, gamma: int = 7, seed: int = 0) -> tuple[Path, Path]:
    """Write a sloped profile and a 3-domain trace set under `root`; return their paths."""
    tokens = np.unique(np.concatenate([[1, 2, 4], np.arange(8, 513, 8), [768, 1024, 2048, 4096, 8192, 16384]]))
    ms = 8.0 + np.maximum(0, tokens - 256) * 0.015
    card = {"source": "synthetic", "hardware": "benchmark", "model": "benchmark", "dtype": "bf16",
            "date": "2026-11-29", "command": "benchmarks/_inputs.py"}
    prof = write_profile(root / "profile", pd.DataFrame({"tokens": tokens, "step_ms": ms}), card,
                         pd.DataFrame({"requests": [1, 4096], "draft_ms": [0.3, 1.5]}))
    rng = np.random.default_rng(seed)
    n = 600
    out = rng.integers(200, 1200, n)
    req = pd.DataFrame({"request_id": np.arange(n), "domain": np.repeat(["math", "code", "chat"], n // 3),
                        "prompt_tokens": rng.integers(50, 800, n), "output_tokens": out})
    rows = int(out.sum())
    c = np.clip(rng.beta(6, 2, (rows, 1)) * np.linspace(1, 0.85, gamma)[None, :], 0.01, 0.99)
    acc = np.cumprod(rng.random((rows, gamma)) < c, axis=1).sum(axis=1)
    tcard = {"source": "synthetic", "target": "benchmark", "drafter": "benchmark", "gamma": gamma,
             "temperature": 1.0, "date": "2026-11-29", "command": "benchmarks/_inputs.py"}
    traces = write_traceset(root / "traces", req, c, acc, tcard)
    return prof, traces
