"""A policy's answer is checked every step, before any kernel sees it.

Why: a plug-in policy is code the user wrote; the compiled kernels index the trace and the
batch by its ℓ, so an answer of the wrong shape or range, unchecked, corrupts memory (numba
wrote out of bounds and glibc aborted after the results were printed). Every step, check
or not, under both kernel backends, a bad answer is a one-line error naming the policy,
the step and the value.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sparksim.cli import app
from sparksim.errors import PolicyError
from sparksim.sim.runner import load_scenario, simulate
from sparksim.step import kernels

BACKENDS = ["numpy"] + (["numba"] if kernels.HAVE_NUMBA else [])


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    before = kernels.BACKEND
    kernels.use(request.param)
    yield request.param
    kernels.use(before)


@pytest.mark.parametrize(("policy", "message"), [
    ("TooLong", "returned ℓ = 8 (must be in 0..7, the positions drafted): [8]"),
    ("Negative", "returned ℓ = -1 (must be in 0..7"),
    ("WrongShape", "returned int64 of shape (2,) (must be integers of shape (1,), one per request): [1,1]"),
    ("Floats", "returned float64 of shape (1,) (must be integers of shape (1,), one per request): [1.5]"),
])
@pytest.mark.parametrize("check", [False, True])
def test_a_bad_answer_stops_the_run_with_the_policy_step_and_value(
    policy: str, message: str, check: bool, backend: str, sloped_profile: Path, varied_traces: Path,
) -> None:
    sets = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=2",
            "workload.concurrency=1"]
    sc, base = load_scenario(None, sets, f"tests.broken_policy:{policy}")
    with pytest.raises(PolicyError) as err:
        simulate(sc, base, check=check)
    assert str(err.value).startswith("step 0: policy ") and message in str(err.value), str(err.value)


def test_a_sequence_of_valid_integers_is_an_answer(sloped_profile: Path, varied_traces: Path) -> None:
    sets = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=2"]
    sc, base = load_scenario(None, sets, "tests.broken_policy:ListOfInts")
    # the budget counts the bonus slot: 1 + ℓ tokens per request
    assert simulate(sc, base, check=True).summary["verify_budget_per_request"] == pytest.approx(2.0)


def test_the_cli_says_it_in_one_line_without_check(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", "--policy", "tests.broken_policy:TooLong", "--set",
                                      "run.duration_s=1", "--out", str(tmp_path / "x"), "-q"])
    assert result.exit_code == 1
    assert "policy 'too-long' returned ℓ = 8" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


def test_a_pass_based_step_of_no_positions_is_refused_naming_the_policy() -> None:
    sc, base = load_scenario(None, ["policy.drafter=mtp-1", "run.duration_s=1", "workload.concurrency=1"],
                             "tests.broken_policy:NoPositions")
    with pytest.raises(PolicyError, match=r"step 0: policy .*positions_at\(1\) = 0: must be an integer in 1\.\.7"):
        simulate(sc, base)
