"""Sweeps and Pareto analysis: the frontier and the matched-throughput speedup are the figures
people quote, so they are checked against hand-made points."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sparksim.errors import ConfigError
from sparksim.studies.frontier import pareto_frontier, speedup_at_matched_throughput
from sparksim.studies.sweep import (
    SweepPoint,
    grid,
    parse_vary,
    resolve_point,
    run_sweep,
    write_sweep,
)

from .sweep_tables import two_drafter_sweep


def test_grid_is_the_product_of_axes_for_each_policy() -> None:
    axes = parse_vary(["workload.concurrency=1,8", "seed=0,1,2"])
    points = grid(axes, ["static:gamma=1", "greedy"])
    assert len(points) == 2 * 2 * 3
    assert points[0] == SweepPoint("static:gamma=1", ("workload.concurrency=1", "seed=0"))
    sc, _ = resolve_point(None, [], points[0])
    assert (sc.policy.name, sc.policy.params, sc.workload.concurrency) == ("static", {"gamma": 1}, 1)


def test_bad_axis_is_an_error() -> None:
    with pytest.raises(ConfigError, match="KEY=V1,V2"):
        parse_vary(["workload.concurrency"])


def test_frontier_drops_dominated_points() -> None:
    df = pd.DataFrame({"interactivity": [10, 20, 15, 30], "tput_per_gpu": [100, 80, 70, 10]})
    front = pareto_frontier(df)
    assert front["interactivity"].tolist() == [10, 20, 30]


def test_speedup_at_matched_throughput_interpolates_both_frontiers() -> None:
    # policy b has exactly twice a's interactivity at every throughput
    tput = [100.0, 200.0, 400.0, 800.0]
    df = pd.DataFrame({
        "policy": ["a"] * 4 + ["b"] * 4,
        "tput_per_gpu": tput + tput,
        "interactivity": [80.0, 60.0, 40.0, 20.0, 160.0, 120.0, 80.0, 40.0],
    })
    sp = speedup_at_matched_throughput(df, "b", "a")
    assert len(sp) == 4
    assert sp["speedup"].tolist() == pytest.approx([2.0] * 4)


def test_sweep_runs_every_point_and_writes_its_table(
    sloped_profile: Path, varied_traces: Path, tmp_path: Path
) -> None:
    base = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=3"]
    points = grid(parse_vary(["workload.concurrency=1,16"]), ["static:gamma=0", "static:gamma=3"])
    table = run_sweep(None, base, points, workers=1)
    assert len(table) == 4
    # more users → more throughput per GPU, for each policy
    for _, grp in table.groupby("policy"):
        assert grp.sort_values("workload.concurrency")["tput_per_gpu"].is_monotonic_increasing
    out = write_sweep(tmp_path / "sw", table, {"title": "t"})
    assert (out / "sweep.parquet").exists() and (out / "pareto.png").stat().st_size > 1000


def test_a_swept_number_with_an_exponent_is_that_number_in_the_scenario_and_the_table(
    sloped_profile: Path, varied_traces: Path, tmp_path: Path
) -> None:
    # YAML 1.1 reads `1e1` as text: the row held "1e1" beside 20, and writing the table failed
    # after every point had run.
    base = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=2",
            "workload.kind=poisson"]
    table = run_sweep(None, base, grid(parse_vary(["workload.rate=1e1,2E+1"]), ["static:gamma=1"]),
                      workers=1)
    assert table["workload.rate"].tolist() == [10.0, 20.0]
    write_sweep(tmp_path / "sw", table, {"title": "t"})
    assert pd.read_parquet(tmp_path / "sw" / "sweep.parquet")["workload.rate"].tolist() == [10.0, 20.0]


def test_a_plugin_policy_keeps_its_parameters_in_a_sweep() -> None:
    # Why: `file.py:Class:param=value` in a sweep must reach the policy, as in `bias`.
    sc, _ = resolve_point(None, [], SweepPoint("examples/fixed_budget.py:FixedBudget:per_request=3", ()))
    assert (sc.policy.name, sc.policy.params) == ("examples/fixed_budget.py:FixedBudget", {"per_request": 3})
    sc, _ = resolve_point(None, [], SweepPoint("static:gamma=1,drafter=mtp-1", ()))
    assert (sc.policy.name, sc.policy.params, sc.policy.drafter) == ("static", {"gamma": 1}, "mtp-1")




def test_a_baseline_that_is_not_a_swept_policy_is_refused_before_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A typo had emptied every speedup ("no overlap") after the whole sweep, exiting 0.
    from typer.testing import CliRunner

    import sparksim.studies.sweep
    from sparksim.cli import app

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("swept before checking --baseline")

    monkeypatch.setattr(sparksim.studies.sweep, "run_sweep", forbidden)
    result = CliRunner().invoke(app, ["sweep", "--policy", "static:gamma=1", "--policy", "two-step",
                                      "--baseline", "two_step", "--out", str(tmp_path / "sw")])
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert "--baseline 'two_step' is none of the swept policies" in said and "'two-step'" in said


@pytest.mark.parametrize("command", ["sweep", "capacity"])
def test_a_worker_count_below_one_is_refused(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # --workers -1 had run the points one after another without a word.
    from typer.testing import CliRunner

    import sparksim.studies.capacity
    import sparksim.studies.sweep
    from sparksim.cli import app

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("ran before refusing --workers")  # a broken check fails at once

    monkeypatch.setattr(sparksim.studies.sweep, "run_sweep", forbidden)
    monkeypatch.setattr(sparksim.studies.capacity, "find_capacity", forbidden)
    result = CliRunner().invoke(app, [command, "--workers", "-1"])
    assert result.exit_code == 2 and "--workers" in result.output


def test_a_policy_swept_over_drafters_is_one_series_per_drafter_in_table_and_figure() -> None:
    # The terminal had put both drafters' points on one frontier per policy while the figure
    # drew one per drafter, so the two quoted different speedups.
    from sparksim.plotting.pareto import speedup_notes
    from sparksim.studies.frontier import series_of, series_speedups

    table = two_drafter_sweep()
    assert list(dict.fromkeys(series_of(table))) == [
        "static:gamma=1 · mtp-1", "static:gamma=1 · dspark-5", "two-step · mtp-1", "two-step · dspark-5"]
    base, speedups = series_speedups(table, "static:gamma=1")
    assert base == "static:gamma=1 · mtp-1"
    ratio = {name: round(float(sp["speedup"].mean()), 6) for name, sp in speedups}
    assert ratio == {"static:gamma=1 · dspark-5": 1.5, "two-step · mtp-1": 2.0, "two-step · dspark-5": 3.0}
    notes = speedup_notes(table, "static:gamma=1")
    assert [n.split(":")[0] for n in notes] == [
        "static(gamma=1)·dspark-5 vs static(gamma=1)·mtp-1", "two-step·mtp-1 vs static(gamma=1)·mtp-1",
        "two-step·dspark-5 vs static(gamma=1)·mtp-1"]
    assert "×3.00" in notes[2]


def test_a_swept_top_level_key_is_a_swept_column() -> None:
    # `--vary seed=0,1,2` had left its points unlabelled in the figure and in warnings.json:
    # only dotted names counted as swept.
    from sparksim.plotting.pareto import varied_columns
    from sparksim.studies.sweep import point_warnings

    table = pd.DataFrame({"policy": ["greedy", "greedy"], "label": ["greedy", "greedy"], "seed": [0, 1],
                          "workload.rate": [2.0, 2.0], "tput_per_gpu": [1.0, 2.0],
                          "warnings": [[], ["slow"]]})
    assert varied_columns(table) == ["seed", "workload.rate"]
    assert point_warnings(table) == [{"policy": "greedy", "label": "greedy", "seed": 1, "workload.rate": 2.0,
                                      "warnings": ["slow"]}]
