"""`sparksim run` end to end through the CLI: a user's first contact must work and leave a
complete results folder (and nothing half-written when it fails)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from sparksim.cli import app

runner = CliRunner()


def test_run_writes_a_complete_results_folder(sloped_profile: Path, varied_traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "res"
    result = runner.invoke(app, [
        "run", "--policy", "static", "--set", f"profile={sloped_profile}", "--set",
        f"traces={varied_traces}", "--set", "run.duration_s=3", "--out", str(out), "--check", "-q",
    ])
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {"scenario.yaml", "requests.parquet", "steps.parquet", "summary.json"}
    summary = json.loads((out / "summary.json").read_text())
    for key in ("mean_ttft_ms", "p99_tpot_ms", "median_itl_ms", "p90_e2el_ms", "output_throughput",
                "tput_per_gpu", "interactivity", "mean_acceptance_length", "verify_budget_per_request"):
        assert key in summary
    assert "invariants INV-1..7 hold" in result.output


def test_bad_scenario_fails_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "never"
    result = runner.invoke(app, ["run", "--set", "workload.concurency=3", "--out", str(out), "-q"])
    assert result.exit_code == 1
    assert "did you mean 'workload.concurrency'" in result.output
    assert not out.exists()


def test_unknown_policy_fails_with_the_list(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", "--policy", "nope", "--out", str(tmp_path / "x"), "-q"])
    assert result.exit_code == 1
    assert "valid policies" in result.output
