"""The worked example of a user's own policy runs as the docs say, and keeps its promises.

docs/writing-a-policy.md tells a newcomer to copy examples/fixed_budget.py; if the example
stopped loading, broke an invariant or biased the output, the docs would teach a mistake.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sparksim.bias.biaslab import run_bias_lab
from sparksim.cli import app
from sparksim.errors import ConfigError
from sparksim.policies import make_policy
from sparksim.policies.base import StepBatch
from tests.policy_helpers import profile

ROOT = Path(__file__).resolve().parents[1]
SPEC = str(ROOT / "examples" / "fixed_budget.py") + ":FixedBudget"


def test_the_example_runs_from_its_file_path_with_the_invariants_checked(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "run", "--policy", SPEC, "--set", "policy.per_request=3", "--set", "run.duration_s=4",
        "--check", "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert "invariants INV-1..7 hold" in result.output
    assert "fixed-budget(per_request=3)" in result.output


def test_the_example_verifies_the_top_survivals_up_to_its_budget() -> None:
    # A plain-loop reference: rank every (r, j) by survival (ties: lower j, then lower r)
    # and admit the first per_request·R of them.
    rng = np.random.default_rng(0)
    prof = profile([1, 4096], [10.0, 10.0])
    pol = make_policy(SPEC, 5, {"per_request": 2})
    for _ in range(200):
        r = int(rng.integers(1, 9))
        batch = StepBatch.from_conf(rng.choice([0.3, 0.6, 0.9, 1.0], size=(r, 5)), prof)
        order = sorted((-batch.survival[i, j], j, i) for i in range(r) for j in range(5))
        want = np.zeros(r, dtype=np.int64)
        for _, _j, i in order[: 2 * r]:
            want[i] += 1
        np.testing.assert_array_equal(pol.decide(batch), want)


def test_the_example_keeps_the_target_distribution_in_the_bias_lab() -> None:
    res = run_bias_lab(SPEC + ":per_request=1", trials=4000, seed=5)
    assert abs(res.z) < 4, res


def test_a_bad_example_parameter_names_itself() -> None:
    with pytest.raises(ConfigError, match="per_request"):
        make_policy(SPEC, 7, {"per_request": 9})
