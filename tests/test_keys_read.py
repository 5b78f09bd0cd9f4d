"""Scenario keys that the chosen workload kind, prefill mode or length source does not read.

Why: a key that is silently ignored makes a run that looks valid and is not what the user
asked (a sweep over workload.rate on a closed loop draws identical points). Each such key
is an error before anything is simulated, naming the key, the value that ignores it and
the values that read it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sparksim.cli import app
from sparksim.config import READ_WHEN, Scenario, parse_scenario, scenario_problems
from sparksim.errors import ConfigError
from sparksim.sim.runner import load_scenario

runner = CliRunner()
EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "docs" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize(("given", "reason"), [
    ({"workload": {"rate": 10}}, "workload.rate=10: workload.kind=closed does not read it "
                                 "(read when workload.kind is gamma or poisson)"),
    ({"workload": {"kind": "poisson", "concurrency": 8}}, "workload.concurrency=8: workload.kind=poisson"),
    ({"workload": {"kind": "poisson", "cv": 2.0}}, "workload.cv=2.0: workload.kind=poisson"),
    ({"workload": {"kind": "closed", "arrivals_csv": "a.csv"}}, "workload.arrivals_csv='a.csv'"),
    ({"run": {"max_requests": 100}}, "run.max_requests=100: workload.kind=closed"),
    ({"workload": {"lengths": {"prompt": {"mu": 7.0}}}},
     "workload.lengths.prompt: workload.lengths.source=traces does not read it"),
    ({"cluster": {"prefill": {"chunk_tokens": 512}}}, "cluster.prefill.chunk_tokens=512: "
                                                      "cluster.prefill.mode=disaggregated"),
    ({"cluster": {"prefill": {"mode": "colocated", "schedule": "prefill-first", "chunk_tokens": 512}}},
     "cluster.prefill.schedule=prefill-first does not read it"),
    ({"cluster": {"prefill": {"mode": "colocated", "instances": 2}}}, "cluster.prefill.instances=2"),
])
def test_a_key_the_scenario_does_not_read_is_an_error(given: dict, reason: str) -> None:
    problems = scenario_problems(given)
    assert len(problems) == 1, problems
    assert reason in problems[0]


def test_keys_the_scenario_reads_pass() -> None:
    for data in ({"workload": {"kind": "gamma", "rate": 3, "cv": 2.0}, "run": {"max_requests": 10}},
                 {"workload": {"lengths": {"source": "lognormal", "prompt": {"mu": 7.0}}}},
                 {"cluster": {"prefill": {"mode": "colocated", "chunk_tokens": 512}}}):
        assert scenario_problems(data) == [], data


def test_a_parent_left_unread_is_reported_once() -> None:
    problems = scenario_problems({"workload": {"kind": "replay", "arrivals_csv": "a.csv",
                                              "lengths": {"source": "lognormal", "prompt": {"mu": 7.0}}}})
    assert len(problems) == 1 and problems[0].startswith("workload.lengths: workload.kind=replay")


def test_every_conditional_key_is_a_scenario_key_and_its_selector_too() -> None:
    sc = Scenario()
    for key, conditions in READ_WHEN.items():
        for node in (key, *(sel for sel, _ in conditions)):
            obj: object = sc
            for part in node.split("."):
                obj = getattr(obj, part)  # AttributeError: a typo in the table


def test_the_resolved_scenario_leaves_out_what_it_does_not_read_and_reads_back_the_same() -> None:
    sc = parse_scenario({"workload": {"kind": "poisson", "rate": 5}})
    data = yaml.safe_load(sc.to_yaml())
    assert "concurrency" not in data["workload"] and "max_requests" in data["run"]
    assert "chunk_tokens" not in data["cluster"]["prefill"]
    assert parse_scenario(data) == sc


def test_run_refuses_an_unread_override_before_simulating(tmp_path: Path) -> None:
    out = tmp_path / "never"
    result = runner.invoke(app, ["run", "--set", "workload.rate=10", "--out", str(out), "-q"])
    assert result.exit_code == 1
    assert "workload.rate=10: workload.kind=closed does not read it" in result.output
    assert not out.exists()


def test_a_sweep_over_an_unread_key_fails_before_any_point(tmp_path: Path) -> None:
    out = tmp_path / "sw"
    result = runner.invoke(app, ["sweep", "--policy", "greedy", "--vary", "workload.rate=1,10,100",
                                 "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "workload.rate=1: workload.kind=closed does not read it" in result.output
    assert not (out / "points").exists() or not any((out / "points").iterdir())


def test_an_open_loop_sweep_asks_for_its_axis(tmp_path: Path) -> None:
    result = runner.invoke(app, ["sweep", str(EXAMPLES[0].parent / "gamma-bursty.yaml"),
                                 "--out", str(tmp_path / "sw")])
    assert result.exit_code == 1 and "--vary workload.rate=" in result.output


@pytest.mark.parametrize(("spec", "name", "params", "drafter"), [
    ("static:gamma=1", "static", {"gamma": 1}, None),
    ("static:gamma=1,drafter=mtp-1", "static", {"gamma": 1}, "mtp-1"),
    ("examples/fixed_budget.py:FixedBudget:per_request=3", "examples/fixed_budget.py:FixedBudget",
     {"per_request": 3}, None),
    ("sparksim.policies.greedy:Greedy", "sparksim.policies.greedy:Greedy", {}, None),
])
def test_run_takes_the_policy_grammar_every_command_takes(spec: str, name: str, params: dict,
                                                          drafter: str | None) -> None:
    sc, _ = load_scenario(None, [], spec)
    assert (sc.policy.name, sc.policy.params, sc.policy.drafter) == (name, params, drafter)


def test_run_policy_spec_overrides_a_scenario_files_parameters(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("policy: {name: static, gamma: 3, drafter: mtp-1}\n")
    sc, _ = load_scenario(path, [], "static:gamma=1")
    assert (sc.policy.params, sc.policy.drafter) == ({"gamma": 1}, "mtp-1")
    sc, _ = load_scenario(path, [], "greedy")
    assert (sc.policy.name, sc.policy.params, sc.policy.drafter) == ("greedy", {}, None)


def test_run_cli_accepts_a_policy_with_parameters(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = runner.invoke(app, ["run", "--policy", "static:gamma=1,drafter=mtp-1", "--set", "run.duration_s=1",
                                 "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy_label"] == "static(gamma=1) · mtp-1"
    assert summary["cost"]["drafter"]["positions_drafted"] == 1
    assert "1 position" in result.output and "1 positions" not in result.output


def test_a_bad_policy_parameter_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no parameter 'gama'"):
        from sparksim.sim.runner import load_inputs, simulate
        sc, base = load_scenario(None, ["run.duration_s=1"], "static:gama=1")
        simulate(sc, base, inputs=load_inputs(sc, base))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_each_example_scenario_runs_below_saturation(path: Path) -> None:
    # Why: an example is what a newcomer copies; one whose queue grows at its own rate
    # teaches overloaded numbers as if they were a serving point.
    from sparksim.sim.runner import simulate

    sc, base = load_scenario(path)
    summary = simulate(sc, base).summary
    assert summary["steady_waiting"] == 0
    assert summary["steady_unfinished"] <= 0.05 * summary["steady_requests"]


def test_a_static_policys_label_names_the_drafter_it_paid_for() -> None:
    from sparksim.sim.runner import simulate

    labels = {}
    for spec in ("static:gamma=1", "static:gamma=1,drafter=mtp-1", "static:gamma=0"):
        sc, base = load_scenario(None, ["run.duration_s=1", "workload.concurrency=2"], spec)
        labels[spec] = simulate(sc, base).summary["policy_label"]
    assert labels == {"static:gamma=1": "static(gamma=1) · dspark-5",
                      "static:gamma=1,drafter=mtp-1": "static(gamma=1) · mtp-1",
                      "static:gamma=0": "static(gamma=0)"}


def test_the_default_baseline_is_mtp1_on_the_profiles_own_module(flat_profile: Path) -> None:
    from sparksim.studies.sweep import default_policies

    policies, note = default_policies(None, [])
    assert policies == ["static:gamma=1,drafter=mtp-1", "two-step"] and "MTP-1" in note
    policies, note = default_policies(None, [f"profile={flat_profile}"])
    assert policies[0] == "static:gamma=1" and "not MTP-1" in note
