"""`sparksim run` end to end through the CLI: a user's first contact must work and leave a
complete results folder (and nothing half-written when it fails)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
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
    assert {p.name for p in out.iterdir()} == {"scenario.yaml", "requests.parquet", "steps.parquet", "summary.json",
                                          "warnings.json"}
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


def test_the_table_and_summary_json_agree_on_what_an_overloaded_run_finished(
    sloped_profile: Path, varied_traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Why: "completed (steady window) 325" beside `steady_requests: 0` read as a contradiction;
    # they are two counts (finished in the window vs arrived in it and finished), each named.
    import sparksim.cli.run

    console = Console(width=120, record=True, color_system=None)
    monkeypatch.setattr(sparksim.cli.run, "console", console)
    out = tmp_path / "hot"
    result = runner.invoke(app, [
        "run", "--policy", "static:gamma=1", "--set", f"profile={sloped_profile}", "--set",
        f"traces={varied_traces}", "--set", "run.duration_s=6", "--set", "workload.kind=poisson",
        "--set", "workload.rate=400", "--out", str(out), "-q",
    ])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] > summary["steady_requests"]  # overloaded: the two counts part ways
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in console.export_text().splitlines() if line.startswith("│")}
    assert rows["finished in window"] == f"{summary['completed']:,}"
    assert rows["arrived in window, finished"] == f"{summary['steady_requests']:,}"
    assert rows["arrived in window, unfinished"] == f"{summary['steady_unfinished']:,}"
    assert "steady_requests: requests that arrived inside the window" in summary["counts_note"]


def test_a_live_run_says_which_real_drafter_it_ran(sloped_profile: Path, varied_traces: Path) -> None:
    # Why: the live engine fills no priced `cost` block, so its table said "drafter paid for: none"
    # for a run that drafted with a real DSpark drafter.
    from sparksim.cli.run import summary_table
    from sparksim.sim.runner import load_scenario, simulate

    sc, base = load_scenario(None, [f"profile={sloped_profile}", f"traces={varied_traces}",
                                    "run.duration_s=2"], "greedy")
    result = simulate(sc, base)
    summary = {k: v for k, v in result.summary.items() if k != "cost"}
    summary |= {"engine": "live", "live": {"drafter": "models/tinylm-d128-l6/dspark", "drafter_kind": "dspark",
                                           "positions_drafted": 7}}
    console = Console(width=120, record=True, color_system=None)
    console.print(summary_table(replace(result, summary=summary)))
    text = " ".join(console.export_text().split())
    assert "│ drafter run │ models/tinylm-d128-l6/dspark │ dspark, 7 positions; real, time measured │" in text
    assert "drafter paid for" not in text and "KV capacity" not in text
    summary["live"] = {}  # plain decoding: no drafter loaded
    console.print(summary_table(replace(result, summary=summary)))
    assert "│ drafter run │ none │ plain decoding │" in " ".join(console.export_text().split())


def test_a_piped_run_prints_progress_lines_instead_of_a_bar(
    sloped_profile: Path, varied_traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Why: a bar on a pipe shows nothing until the end, so a long run in a CI log looks hung.
    import sparksim.cli.run as run_cli

    monkeypatch.setattr(run_cli, "PROGRESS_EVERY_S", 0.0)  # a line at every progress call
    args = ["run", "--policy", "static", "--set", f"profile={sloped_profile}", "--set",
            f"traces={varied_traces}", "--set", "run.duration_s=3", "--out"]
    result = runner.invoke(app, [*args, str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("simulating ")]
    assert len(lines) > 10 and lines[0].endswith("s wall") and "/3 sim-s" in lines[0]
    quiet = runner.invoke(app, [*args, str(tmp_path / "b"), "-q"])
    assert "simulating " not in quiet.output


def test_the_default_results_folder_of_a_plug_in_policy_is_one_folder() -> None:
    # `--policy examples/fixed_budget.py:FixedBudget` had made results/default-examples/fixed_budget.py:…
    from sparksim.sim.runner import default_out_dir, load_scenario

    sc, _ = load_scenario(None, [], "examples/fixed_budget.py:FixedBudget")
    assert default_out_dir(sc) == Path("results") / "default-fixed_budget-FixedBudget-seed0"
    sc, _ = load_scenario(None, [], "two-step")
    assert default_out_dir(sc) == Path("results") / "default-two-step-seed0"


def test_the_live_default_folder_names_the_load_a_run_was_served_at() -> None:
    # Open-loop runs at two rates had shared one folder (it named the unused user count).
    from sparksim.cli.live import live_out_dir
    from sparksim.sim.runner import load_scenario

    closed, _ = load_scenario(None, ["workload.concurrency=16"], "two-step")
    assert live_out_dir(closed).name == "default-two-step-u16-seed0"
    names = {live_out_dir(load_scenario(None, ["workload.kind=poisson", f"workload.rate={r}"], "two-step")[0]).name
             for r in (5, 20)}
    assert names == {"default-two-step-r5-seed0", "default-two-step-r20-seed0"}
