"""Scenario validation: bad input must fail before anything is simulated or written, with a
message naming the key and the value, so a typo never silently runs the wrong experiment."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparksim.config import Scenario, apply_overrides, check_scenario_file, parse_scenario
from sparksim.errors import ConfigError, RangeError
from sparksim.sim.runner import load_inputs, load_scenario, simulate


def test_embedded_default_is_valid_and_uses_the_shipped_inputs() -> None:
    sc = Scenario()
    assert sc.workload.kind == "closed" and sc.workload.concurrency == 64
    assert sc.workload.mix == {"math": 0.39, "code": 0.39, "chat": 0.22}
    assert sc.profile.endswith("h100-qwen3-8b-analytic")


def test_unknown_key_suggests_the_nearest_valid_key() -> None:
    with pytest.raises(ConfigError, match=r"workload\.concurency.*did you mean 'workload\.concurrency'"):
        parse_scenario({"workload": {"concurency": 3}})


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("workload.rate=0", "workload.rate=0"),
        ("workload.rate=-1", "workload.rate=-1"),
        ("workload.concurrency=0", "workload.concurrency=0"),
        ("cluster.kv_capacity_tokens=-5", "cluster.kv_capacity_tokens=-5"),
        ("cluster.max_concurrency=0", "cluster.max_concurrency=0"),
        ("workload.mix.math=-1", "workload.mix.math=-1"),
        ("run.duration_s=0", "run.duration_s=0"),
        ("cluster.decision_s=0.001", "pipeline=zos"),
        ("workload.lengths.output.min=9000", "min=9000"),
    ],
)
def test_bad_values_name_the_key_and_value(override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_scenario(apply_overrides({}, [override]))
    assert needle in str(err.value)


def test_cv_and_burstiness_together_are_an_error() -> None:
    with pytest.raises(ConfigError, match="not both"):
        parse_scenario(apply_overrides({}, ["workload.kind=gamma", "workload.cv=2", "workload.burstiness=0.5"]))


def test_replayed_request_larger_than_the_kv_cache_is_an_error(
    flat_profile: Path, traces_07: Path, tmp_path: Path
) -> None:
    csv = tmp_path / "arrivals.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n0.1,100,50\n0.2,30000,50\n")
    sc, base = load_scenario(None, [f"profile={flat_profile}", f"traces={traces_07}", "workload.kind=replay",
                                    f"workload.arrivals_csv={csv}", "cluster.kv_capacity_tokens=20000"],
                             "static")
    with pytest.raises(ConfigError, match="kv_capacity_tokens=20000"):
        load_inputs(sc, base)


def test_gamma_beyond_the_trace_block_is_an_error(flat_profile: Path, traces_07: Path) -> None:
    sc, base = load_scenario(None, [f"profile={flat_profile}", f"traces={traces_07}",
                                    "policy.gamma=9"], "static")
    with pytest.raises(ConfigError, match="gamma=9"):
        load_inputs(sc, base)


def test_domain_without_requests_is_an_error(flat_profile: Path, traces_07: Path) -> None:
    sc, base = load_scenario(None, [f"profile={flat_profile}", f"traces={traces_07}",
                                    "workload.mix={math: 1, poetry: 1}"], "static")
    with pytest.raises(ConfigError, match="poetry"):
        simulate(sc, base)


def test_profile_too_short_warns_and_fails_under_strict(tmp_path: Path, traces_07: Path) -> None:
    from tests.conftest import make_profile

    short = make_profile(tmp_path / "short", tokens=(1, 8, 64))
    sc, base = load_scenario(None, [f"profile={short}", f"traces={traces_07}"], "static")
    with pytest.warns(UserWarning, match="reaches 64 tokens"):
        load_inputs(sc, base)
    with pytest.raises(RangeError, match="--strict"):
        load_inputs(sc, base, strict=True)


def test_unknown_policy_lists_the_valid_ones() -> None:
    from sparksim.policies import make_policy

    with pytest.raises(ConfigError, match=r"valid policies: .*static"):
        make_policy("gredy", 7)


def test_validate_reports_every_problem_in_a_scenario_file(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"workload": {"concurency": 3}, "clustr": {}}))
    problems = check_scenario_file(f)
    assert len(problems) == 2


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n"], ids=["empty", "blank", "comments"])
def test_an_empty_scenario_file_is_an_error_naming_the_file(tmp_path: Path, text: str) -> None:
    # Why: read as {}, an empty file ran the embedded default, and its results looked like the
    # scenario the user meant to write.
    f = tmp_path / "mine.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=rf"{f}: the scenario file is empty"):
        load_scenario(f)
    assert check_scenario_file(f) == [f"{f}: the scenario file is empty (to run the default scenario, give no file)"]


def test_kv_capacity_smaller_than_one_request_is_an_error(flat_profile: Path, traces_07: Path) -> None:
    sc, base = load_scenario(None, [f"profile={flat_profile}", f"traces={traces_07}",
                                    "cluster.kv_capacity_tokens=100"], "static")
    with pytest.raises(ConfigError, match="kv_capacity_tokens=100"):
        load_inputs(sc, base)


@pytest.mark.parametrize("example", sorted(Path("docs/scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_documented_example_scenarios_are_valid(example: Path) -> None:
    from sparksim.sim.validation import check_scenario

    assert check_scenario(example) == []


def test_validate_checks_the_inputs_a_scenario_names(tmp_path: Path) -> None:
    from sparksim.sim.validation import check_scenario

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"profile": "profiles/does-not-exist", "traces": "traces/synth-dspark-qwen3-8b",
                                 "policy": {"name": "static", "gamma": 9}}))
    problems = check_scenario(f)
    assert any(p.startswith("profile='profiles/does-not-exist'") for p in problems)
    assert any("gamma=9" in p for p in problems)


def test_an_arrivals_csv_problem_names_the_row_as_a_person_counts_it(tmp_path: Path) -> None:
    from sparksim.errors import FormatError
    from sparksim.sim.workload import load_arrivals

    csv = tmp_path / "a.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n0.1,100,50\n0.2,0,50\n0.1,10,5\n")
    with pytest.raises(FormatError) as err:
        load_arrivals(csv, ["math"])
    assert "column 'prompt_tokens' row 2 is 0 (must be a whole number >= 1)" in str(err.value)
    assert "np.float64" not in str(err.value)


def test_an_arrivals_csv_with_a_fractional_token_count_is_refused(tmp_path: Path) -> None:
    # A replay would cut 2.5 tokens to 2 without a word; the prefix columns are refused alike.
    from sparksim.errors import FormatError
    from sparksim.sim.workload import load_arrivals

    csv = tmp_path / "a.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n0.1,100,50\n0.2,100,2.5\n")
    with pytest.raises(FormatError, match=r"column 'output_tokens' row 2 is 2.5 \(must be a whole number"):
        load_arrivals(csv, ["math"])


@pytest.mark.parametrize("given", ["workload.mix.math=nan", "workload.mix.math=inf",
                                   "workload.lengths.prompt.mu=nan", "workload.lengths.output.sigma=inf"])
def test_a_length_or_mix_figure_that_is_no_finite_number_is_refused(given: str) -> None:
    # NaN passes `w < 0` and would drop its domain; inf would send every request to it.
    with pytest.raises(ConfigError, match=given.split("=")[0].rsplit(".", 1)[-1]):
        load_scenario(None, [given])


@pytest.mark.parametrize("kind", ["poisson", "gamma"])
def test_an_open_loop_that_cannot_fit_its_horizon_is_refused_with_the_count_and_the_fix(kind: str) -> None:
    # Why: rate=1e9 (a typo for a rate per minute, a horizon in ms) would otherwise run for
    # hours before anyone saw a figure; the refusal says how many and what to lower.
    with pytest.raises(ConfigError) as err:
        load_scenario(None, [f"workload.kind={kind}", "workload.rate=1e9"])
    msg = str(err.value)
    assert "60,000,000,000 requests" in msg and "10,000,000" in msg
    assert "workload.rate" in msg and "run.duration_s" in msg and "run.max_requests" in msg
    # capped arrivals, or a rate that fits, pass
    load_scenario(None, [f"workload.kind={kind}", "workload.rate=1e9", "run.max_requests=1000"])
    load_scenario(None, [f"workload.kind={kind}", "workload.rate=1e5"])


@pytest.mark.parametrize(("given", "said"), [
    # a union's member names (float, bool) had shown as keys, with the value '<missing>'
    ({"cluster": {"pipeline": "sync", "decision_s": "fast"}},
     "cluster.decision_s='fast': Input should be a valid number"),
    ({"run": {"records": {"stream": "sometimes"}}}, "run.records.stream='sometimes': "),
    # a key with a hyphen had dropped out, and its value with it
    ({"workload": {"mix": {"arena-hard": "lots", "math": 1}}}, "workload.mix.arena-hard='lots': "),
])
def test_a_bad_value_is_named_by_its_key_and_value(given: dict, said: str) -> None:
    from sparksim.config import scenario_problems

    problems = scenario_problems(given)
    assert len(problems) == 1 and problems[0].startswith(said), problems
