"""INV-8 by experiment: the paper's Appendix A counterexample, run with real rejection sampling
through each registered policy. A lossless policy must leave the output distribution at the
target's; argmax must show the published bias (0.85 instead of 0.7), or the lab detects nothing."""

from __future__ import annotations

import pytest

from sparksim.biaslab import appendix_a_profile, run_bias_lab
from sparksim.policies import REGISTRY

TRIALS = 2000


def test_appendix_a_profile_matches_the_paper() -> None:
    prof = appendix_a_profile()
    assert prof.sps([1, 2, 3]).tolist() == pytest.approx([1.0, 0.5, 0.45])


def test_argmax_biases_the_first_token_as_the_paper_shows() -> None:
    r = run_bias_lab("argmax", trials=TRIALS, seed=1)
    assert r.p_first_a == pytest.approx(0.85, abs=4 * r.stderr)
    assert r.z > 6


@pytest.mark.parametrize(
    "policy",
    sorted(n for n, c in REGISTRY.items() if c.lossless and not c.upper_bound),
)
def test_lossless_policies_keep_the_target_distribution(policy: str) -> None:
    r = run_bias_lab(policy, trials=TRIALS, seed=2)
    assert abs(r.z) < 4, (policy, r)
