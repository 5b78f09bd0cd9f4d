"""Properties every registered policy must keep on any batch: the engine trusts ℓ blindly,
so a policy that breaks a bound or anticipates its own tokens corrupts every figure after it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparksim.policies import REGISTRY, make_policy
from sparksim.policies.base import StepBatch
from sparksim.policies.path import candidate_order
from tests.policy_helpers import CONF_GRID, batches

pytestmark = pytest.mark.filterwarnings("ignore::sparksim.profile.ProfileWarning")

# The confidence-scheduled policies and their baselines (static lives with the engine work).
POLICIES = ["argmax", "dynamic-sd", "greedy", "oracle", "smartspec", "threshold", "two-step"]
PATH_POLICIES = ["greedy", "argmax", "two-step"]  # admit along the survival ranking


def run_steps(name: str, steps: list[StepBatch]) -> list[np.ndarray]:
    """Run a fresh policy over consecutive steps, feeding back the realised acceptances."""
    policy = make_policy(name, steps[0].gamma)
    out = []
    for b in steps:
        lengths = policy.decide(b)
        accepted = b.accepted if b.accepted is not None else np.zeros(b.num_requests, np.int64)
        policy.observe(b, lengths, np.minimum(lengths, accepted))
        out.append(lengths)
    return out


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=30, deadline=None)
@given(batch=batches(), repeats=st.integers(1, 4))
def test_lengths_stay_within_the_block_and_the_token_cap(name: str, batch: StepBatch, repeats: int) -> None:
    # INV-2: 0 ≤ ℓ_r ≤ γ and B = fixed + Σℓ ≤ max_tokens, on every step of a run.
    for lengths in run_steps(name, [batch] * repeats):
        assert lengths.shape == (batch.num_requests,)
        assert lengths.dtype == np.int64
        assert ((lengths >= 0) & (lengths <= batch.gamma)).all()
        assert lengths.sum() <= max(0, batch.max_tokens - batch.fixed_tokens)


@pytest.mark.parametrize("name", PATH_POLICIES)
@settings(max_examples=60, deadline=None)
@given(batch=batches())
def test_admissions_are_a_prefix_of_the_survival_ranking(name: str, batch: StepBatch) -> None:
    # Per-request prefixes, and across requests the first Σℓ candidates of the ranking.
    lengths = run_steps(name, [batch] * 3)[-1]
    rr, jj = candidate_order(batch.survival)
    k = int(lengths.sum())
    expected = np.zeros(batch.num_requests, dtype=np.int64)
    np.add.at(expected, rr[:k], 1)
    np.testing.assert_array_equal(lengths, expected)
    assert (jj[:k] < lengths[rr[:k]]).all()


LOSSLESS = [n for n in POLICIES if REGISTRY[n].lossless]


@pytest.mark.parametrize("name", LOSSLESS)
@settings(max_examples=40, deadline=None)
@given(batch=batches(), data=st.data())
def test_lossless_policies_decide_r_k_without_the_survivals_after_k(name: str, batch: StepBatch, data) -> None:
    # INV-8 for every policy that claims losslessness: change c_{r,k+1..γ} (which depend on
    # the sampled x_{r,k}) on the last step; whether (r, k) is verified must not move.
    r = data.draw(st.integers(0, batch.num_requests - 1))
    k = data.draw(st.integers(1, batch.gamma))
    tail = data.draw(st.lists(st.sampled_from(CONF_GRID), min_size=batch.gamma - k,
                              max_size=batch.gamma - k))
    conf = batch.conf.copy()
    conf[r, k:] = tail
    changed = StepBatch.from_conf(
        conf, batch.cost.profile, extra_fixed_tokens=batch.fixed_tokens - batch.num_requests,
        max_tokens=batch.max_tokens, draft_s=batch.cost.draft_s, accepted=batch.accepted,
    )
    before = run_steps(name, [batch, batch, batch])[-1][r] >= k
    after = run_steps(name, [batch, batch, changed])[-1][r] >= k
    assert before == after
