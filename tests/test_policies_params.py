"""Bad policy parameters: `--set policy.X=V` arrives as text from a user, and a wrong value
must stop the run with the parameter and the value named, never run a different policy."""

from __future__ import annotations

import pytest

from sparksim.errors import ConfigError
from sparksim.policies import make_policy


@pytest.mark.parametrize(
    ("name", "params", "named"),
    [
        ("two-step", {"delay": -1}, "delay=-1"),
        ("two-step", {"delay": "-2"}, "delay=-2"),  # as it comes from --set
        ("two-step", {"delay": "two"}, "delay='two'"),
        ("two-step", {"ema": 1.5}, "ema=1.5"),
        ("two-step", {"ema": 1.0}, "ema=1.0"),
        ("two-step", {"initial_budget": 8}, "initial_budget=8"),
        ("threshold", {"t": 1.5}, "t=1.5"),
        ("threshold", {"t": -0.1}, "t=-0.1"),
        ("threshold", {"t": "high"}, "t='high'"),
        ("smartspec", {"max_k": 8}, "max_k=8"),
        ("smartspec", {"alpha": 2}, "alpha=2"),
        ("smartspec", {"interval": 0}, "interval=0"),
        ("smartspec", {"decay": -0.5}, "decay=-0.5"),
        ("dynamic-sd", {"max_k": 9}, "max_k=9"),
        ("dynamic-sd", {"warmup": -1}, "warmup=-1"),
        ("dynamic-sd", {"acceptance": 1.2}, "acceptance=1.2"),
        ("atom-schedule", {"ragged": "flase"}, "ragged='flase'"),  # a typo never switches it on
        ("atom-schedule", {"early_stop": 0}, "early_stop=0"),
        ("trtllm-planner", {"device_windows": "ture"}, "device_windows='ture'"),
    ],
)
def test_out_of_range_parameters_name_the_parameter_and_value(name: str, params: dict, named: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_policy(name, 7, params)
    assert named in str(err.value)


def test_parameters_given_as_text_are_parsed() -> None:
    policy = make_policy("two-step", 7, {"delay": "1", "ema": "0.8"})
    assert policy.params["delay"] == 1 and policy.params["ema"] == 0.8
    assert make_policy("threshold", 7, {"t": "0.3"}).params == {"t": 0.3}
    atom = make_policy("atom-schedule", 7, {"ragged": "false", "early_stop": "False", "head": True})
    assert (atom.params["ragged"], atom.params["early_stop"], atom.params["head"]) == (False, False, True)


def test_a_parameter_a_policy_does_not_have_is_an_error() -> None:
    with pytest.raises(ConfigError, match="delay"):
        make_policy("greedy", 7, {"delay": 2})


def test_an_unknown_policy_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as err:
        make_policy("two_step", 7)
    for valid in ("greedy", "argmax", "two-step", "oracle", "smartspec", "dynamic-sd", "threshold"):
        assert valid in str(err.value)
