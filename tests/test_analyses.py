"""The what-if analyses run as scripts and print what their committed golden output says.

An analysis that silently stops running, or whose numbers drift when the simulator
changes, would mislead whoever reads it; this test catches both. After an intended change,
regenerate the golden files with `SPARKSIM_UPDATE_GOLDEN=1 pytest tests/test_analyses.py`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANALYSES = sorted((ROOT / "analyses").glob("*.py"))
SMALL = {
    "SPARKSIM_ANALYSIS_USERS": "4,64",
    "SPARKSIM_ANALYSIS_CONCURRENCY": "32",
    "SPARKSIM_ANALYSIS_DURATION": "8",
    "SPARKSIM_ANALYSIS_SEEDS": "1",
    "SPARKSIM_ANALYSIS_REPLAY_REQUESTS": "300",  # vllm_h100: a slice of each run, short fits
    "SPARKSIM_ANALYSIS_REPLAY_STEPS": "3",
}


@pytest.mark.slow
@pytest.mark.parametrize("script", ANALYSES, ids=lambda p: p.stem)
def test_analysis_runs_and_matches_its_golden_output(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, **SMALL, "SPARKSIM_ANALYSIS_OUT": str(tmp_path), "MPLBACKEND": "Agg"}
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    golden = ROOT / "analyses" / "expected" / f"{script.stem}.txt"
    if os.environ.get("SPARKSIM_UPDATE_GOLDEN"):
        golden.write_text(out.stdout)
    assert out.stdout == golden.read_text()
