"""Capacity under SLOs: bisection over runs for the highest load each policy carries within bounds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import sparksim.studies.capacity
from sparksim.cli import app
from sparksim.errors import ConfigError
from sparksim.studies.capacity import (
    ABOVE,
    BELOW,
    FOUND,
    Bracket,
    bisect,
    find_capacity,
    load_sets,
    miss_reason,
    parse_slos,
    run_points,
)
from sparksim.studies.sweep import SweepPoint, run_rows
from sparksim.studies.sweep_store import PointStore

runner = CliRunner()


def tiny_base(profile: Path, traces: Path) -> list[str]:
    # 6 s runs whose last 2 s are cool-down, so requests of the window finish unless the load
    # is too high: at these sizes p90 TPOT is ~3.9 ms up to ~60 req/s, ~5.3 at 80, ~8.3 at 120
    return [f"profile={profile}", f"traces={traces}", "run.duration_s=6", "run.cooldown_s=2"]


def cli_args(profile: Path, traces: Path, out: Path, *extra: str) -> list[str]:
    args = ["capacity", "--policy", "static:gamma=1", "--lo", "1", "--hi", "160", "--tol", "8",
            "--out", str(out), *extra]
    for s in tiny_base(profile, traces):
        args += ["--set", s]
    return args


def said(result: object) -> str:
    return " ".join(result.output.split())  # type: ignore[attr-defined]


def test_bisection_finds_a_known_threshold_within_its_tolerance() -> None:
    # The search is the whole feature: on a monotone predicate it must land within tol below
    # the threshold (never above: a capacity is a load seen meeting the SLOs), in log2 rounds.
    thresholds = [37.3, 1.5, 99.0, 0.5, 250.0]
    brackets = [Bracket(1.0, 100.0, 0.5) for _ in thresholds]
    tried: list[float] = []

    def evaluate(todo: list[tuple[int, float]]) -> list[bool]:
        tried.extend(load for _, load in todo)
        return [load <= thresholds[i] for i, load in todo]

    rounds = bisect(brackets, evaluate)
    assert rounds == 1 + math.ceil(math.log2(99.0 / 0.5))
    for b, thr in zip(brackets[:3], thresholds[:3], strict=True):
        assert b.status == FOUND and b.capacity is not None
        assert b.capacity <= thr < b.capacity + 0.5
    assert brackets[3].status == BELOW and brackets[3].capacity is None
    assert brackets[4].status == ABOVE and brackets[4].capacity == 100.0
    assert all(1.0 <= load <= 100.0 for load in tried)


def test_an_integer_bisection_tries_whole_users_and_finds_the_last_one_that_meets() -> None:
    users = Bracket(1, 256, 1, integer=True)
    seen: list[float] = []

    def evaluate(todo: list[tuple[int, float]]) -> list[bool]:
        seen.extend(load for _, load in todo)
        return [load <= 57 for _, load in todo]

    bisect([users], evaluate)
    assert users.status == FOUND and users.capacity == 57
    assert all(load == int(load) for load in seen)


def test_an_overloaded_run_misses_the_slos_however_good_its_latencies() -> None:
    # Latencies cover finished requests only: with a growing queue they look better than they are.
    row = {"p90_tpot_ms": 1.0, "steady_requests": 90, "steady_unfinished": 10}
    assert miss_reason(row, {"p90_tpot_ms": 50}).startswith("overloaded")
    assert miss_reason({**row, "steady_unfinished": 4}, {"p90_tpot_ms": 50}) == ""
    assert miss_reason({**row, "steady_unfinished": 0}, {"p90_tpot_ms": 0.5}) == "p90_tpot_ms 1 > 0.5"
    nan = {**row, "steady_unfinished": 0, "p90_tpot_ms": math.nan}
    assert "unmeasured" in miss_reason(nan, {"p90_tpot_ms": 50})


def test_only_requests_still_queued_count_as_overload_not_long_ones_still_decoding() -> None:
    # A run whose window ends with long responses mid-decode is not overloaded: its queue
    # kept up. Before steady_waiting was kept, every unfinished request counted.
    row = {"p90_tpot_ms": 1.0, "steady_requests": 90, "steady_unfinished": 10, "steady_waiting": 1}
    assert miss_reason(row, {"p90_tpot_ms": 50}) == ""
    assert "9 of 100" in miss_reason({**row, "steady_waiting": 9}, {"p90_tpot_ms": 50})


def test_a_looser_slo_never_gives_a_lower_capacity(
    sloped_profile: Path, varied_traces: Path, tmp_path: Path
) -> None:
    # Capacity must be monotone in the bound, or the numbers cannot be compared across SLOs.
    store = PointStore(tmp_path / "points")  # shared: the looser search reuses the runs it can
    found = {}
    for bound in (5.0, 7.0):
        (res,) = find_capacity(None, tiny_base(sloped_profile, varied_traces), ["static:gamma=1"],
                               {"p90_tpot_ms": bound}, lo=1, hi=160, tol=4, seeds=2, workers=1, store=store)
        assert res.status == FOUND, res.probes
        mean, se = res.mean_se()
        values = res.per_seed()
        assert mean == pytest.approx(sum(v for v in values if v is not None) / 2) and se >= 0
        assert res.lowest() == min(v for v in values if v is not None)
        found[bound] = values
    assert all(loose >= tight for loose, tight in zip(found[7.0], found[5.0], strict=True))  # type: ignore[operator]
    assert found[7.0] != found[5.0]  # the range is wide enough for the bound to matter


def test_a_rerun_of_the_command_simulates_nothing_and_writes_the_same_table(
    sloped_profile: Path, varied_traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A capacity search is many runs; stopping it (or tightening one bound) must not redo them.
    out = tmp_path / "cap"
    args = cli_args(sloped_profile, varied_traces, out, "--slo", "p90_tpot_ms=6", "--seeds", "2")
    first = runner.invoke(app, [*args, "--workers", "2"])
    assert first.exit_code == 0, first.output
    assert "reused" not in first.output
    table = (out / "capacity.csv").read_text()
    runs = pd.read_csv(out / "capacity.csv")["runs"].sum()
    assert len(list((out / "points").glob("*.json"))) == runs

    def must_not_run(*args: object) -> dict[str, object]:
        raise AssertionError("a finished run was simulated again")

    monkeypatch.setattr(sparksim.studies.capacity, "run_capacity_point", must_not_run)
    second = runner.invoke(app, [*args, "--workers", "1"])
    assert second.exit_code == 0, second.output
    assert f"reused {runs} of {runs} runs" in said(second)
    assert (out / "capacity.csv").read_text() == table
    saved = json.loads((out / "capacity.json").read_text())
    assert saved["meta"]["slo"] == {"p90_tpot_ms": 6.0} and len(saved["policies"][0]["per_seed"]) == 2


def test_a_range_whose_low_end_already_fails_is_reported_below_it(
    sloped_profile: Path, varied_traces: Path, tmp_path: Path
) -> None:
    # A bisection that cannot meet the SLOs anywhere must not return the low end as a capacity.
    out = tmp_path / "cap"
    result = runner.invoke(app, cli_args(sloped_profile, varied_traces, out, "--slo", "p90_tpot_ms=1",
                                         "--workers", "1"))
    assert result.exit_code == 0, result.output
    text = said(result)
    assert "below the range" in text and "p90_tpot_ms" in text and "lower --lo" in text
    (row,) = pd.read_csv(out / "capacity.csv").to_dict("records")
    assert row["status"] == BELOW and math.isnan(row["capacity"]) and row["per_seed"] == "below"
    assert row["runs"] == 2  # both ends, and no bisection after them


@pytest.mark.parametrize(("extra", "message"), [
    (["--slo", "p90_tpop_ms=50"], "unknown SLO key 'p90_tpop_ms' (did you mean 'p90_tpot_ms'?)"),
    (["--slo", "p90_tpot_ms=0"], "the bound must be a positive number"),
    (["--slo", "p90_tpot_ms=-3"], "the bound must be a positive number"),
    (["--slo", "p90_tpot_ms=fast"], "is not a number"),
    (["--slo", "p90_tpot_ms"], "expected KEY=BOUND"),
    ([], "give at least one --slo"),
    (["--slo", "p90_tpot_ms=5", "--lo", "50", "--hi", "50"], "the search range is empty"),
    (["--slo", "p90_tpot_ms=5", "--lo", "0"], "must be a positive number"),
    (["--slo", "p90_tpot_ms=5", "--hi", "inf"], "--hi inf: the highest load must be a finite number"),
    (["--slo", "p90_tpot_ms=5", "--closed", "--lo", "1.5", "--hi", "8"], "whole users"),
    (["--slo", "p90_tpot_ms=5", "--seeds", "0"], "--seeds 0"),
    (["--slo", "p90_tpot_ms=5", "--policy", "nosuch"], "nosuch"),
])
def test_bad_input_fails_in_one_line_before_anything_runs(
    extra: list[str], message: str, sloped_profile: Path, varied_traces: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def forbidden(*args: object) -> dict[str, object]:
        raise AssertionError("simulated before checking the input")

    monkeypatch.setattr(sparksim.studies.capacity, "run_capacity_point", forbidden)
    out = tmp_path / "cap"
    args = cli_args(sloped_profile, varied_traces, out, "--workers", "1")
    if "--policy" in extra:
        args[1:3] = []  # only the bad policy
    result = runner.invoke(app, [*args, *extra])
    assert result.exit_code == 1, result.output
    assert said(result).startswith("error:") and message in said(result), said(result)
    assert not out.exists()


def test_a_bound_given_twice_is_an_error() -> None:
    with pytest.raises(ConfigError, match="given twice"):
        parse_slos(["p90_tpot_ms=5", "p90_tpot_ms=6"])


def test_a_sweep_and_a_capacity_search_sharing_points_never_read_each_others_rows(
    sloped_profile: Path, varied_traces: Path, tmp_path: Path
) -> None:
    # Both commands keep their runs in OUT/points/ with the same loop; a capacity row holds
    # percentiles a sweep row lacks, so reading the other's row would break the SLO check.
    store = PointStore(tmp_path / "points")
    base = tiny_base(sloped_profile, varied_traces)
    point = SweepPoint("static:gamma=1", ("seed=0", *load_sets("poisson", 8.0)))
    swept = run_rows(None, base, [point], store=store, workers=1)
    searched = run_points(None, base, [point], store=store, pool=None)
    assert store.reused == 0
    assert "p90_tpot_ms" in searched[0] and "p90_tpot_ms" not in swept[0]
    assert run_points(None, base, [point], store=store, pool=None) == searched and store.reused == 1


@pytest.mark.parametrize(("rate", "overloaded_run"), [(5, False), (400, True)])
def test_a_run_ending_mid_decode_is_not_overload_but_a_growing_queue_is(
    sloped_profile: Path, varied_traces: Path, rate: float, overloaded_run: bool
) -> None:
    # No cool-down: at 5 req/s the window's last arrivals are still decoding at the horizon
    # (unfinished, not queued); at 400 req/s the queue grows and most arrivals never start.
    base = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=6",
            "run.cooldown_s=0", "run.warmup_s=1"]
    point = SweepPoint("static:gamma=1", ("seed=0", *load_sets("poisson", rate)))
    row = sparksim.studies.capacity.run_capacity_point(None, base, point)
    assert row["steady_unfinished"] > 0.05 * (row["steady_requests"] + row["steady_unfinished"])
    assert (row["steady_waiting"] > 0) is overloaded_run
    assert miss_reason(row, {"p90_tpot_ms": 1e6}).startswith("overloaded") is overloaded_run
