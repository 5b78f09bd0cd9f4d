"""Greedy (Alg. 1) against argmax: the early stop is what makes DSpark lossless, and what can
strand it before a cliff; these tests pin both sides with the paper's own numbers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sparksim.policies import make_policy
from sparksim.policies.base import StepBatch
from sparksim.policies.path import CostTable, batch_path
from tests.policy_helpers import CONF_GRID, batches, confidences, profile, theta_of

pytestmark = pytest.mark.filterwarnings("ignore::sparksim.cost.profile.ProfileWarning")

# Appendix A: SPS(1) = 1.0, SPS(2) = 0.5, SPS(3) = 0.45 (step seconds 1, 2, 1/0.45).
APPENDIX_A = profile([1, 2, 3], [1000.0, 2000.0, 1000.0 / 0.45])


@pytest.mark.parametrize(("c2", "argmax_len"), [(0.9, 2), (0.0, 0)])
def test_appendix_a_argmax_reads_c2_and_greedy_stops_before_it(c2: float, argmax_len: int) -> None:
    batch = StepBatch.from_conf([[0.8, c2]], APPENDIX_A)
    assert make_policy("argmax", 2).decide(batch).tolist() == [argmax_len]
    assert make_policy("greedy", 2).decide(batch).tolist() == [0]
    theta = batch_path(batch, CostTable()).theta()
    np.testing.assert_allclose(theta[:2], [1.0, 0.9])  # Θ0 = 1.0, Θ1 = 0.9: greedy's stop
    if c2 == 0.9:
        assert theta[2] == pytest.approx(1.134)


@settings(max_examples=60, deadline=None)
@given(confidences(), st.sampled_from([0.0, 0.003]))
def test_flat_sps_makes_greedy_verify_every_draft_with_any_chance(conf, draft_s) -> None:
    # Flat cost: every positive survival raises τ at no price, so the path runs to its end.
    batch = StepBatch.from_conf(conf, profile([1, 4096], [10.0, 10.0]), draft_s=draft_s)
    lengths = make_policy("greedy", batch.gamma).decide(batch)
    expected = (batch.survival > 0).sum(axis=1)  # zero survival raises nothing: not admitted
    np.testing.assert_array_equal(lengths, expected)
    if conf.min() > 0:
        assert (lengths == batch.gamma).all()


CLIFF = profile([16, 64], [10.0, 14.0])  # flat to B = 16, then 40 % dearer


@pytest.mark.parametrize("c", [0.3, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99])
def test_at_a_cliff_greedy_stops_and_argmax_and_two_step_cross_exactly_when_it_pays(c: float) -> None:
    # R = 4 requests, fixed B = 4: 12 drafts fit under the cliff at B = 16.
    conf = np.full((4, 7), c)
    batch = StepBatch.from_conf(conf, CLIFF)
    greedy = make_policy("greedy", 7).decide(batch)
    assert greedy.sum() == 12  # the first admission past the cliff lowers Θ, whatever c is

    # Θ computed here from scratch: best under the cliff vs best past it.
    gains = np.sort(batch.survival, axis=None)[::-1]
    tau = 4 + np.concatenate([[0.0], np.cumsum(gains)])
    cost = np.where(4 + np.arange(29) <= 16, 10.0, 14.0)
    theta = tau / cost
    pays = theta[13:].max() > theta[:13].max()

    argmax = make_policy("argmax", 7).decide(batch)
    two_step = make_policy("two-step", 7, {"delay": 2})
    for _ in range(2):  # two steps of history with the same confidences
        two_step.decide(batch)
    k_two_step = two_step.decide(batch).sum()
    assert (argmax.sum() > 12) == pays
    assert (k_two_step > 12) == pays
    assert argmax.sum() == k_two_step == int(np.argmax(theta))


@settings(max_examples=80, deadline=None)
@given(confidences(max_requests=8, max_gamma=7), st.floats(1.0, 20.0), st.floats(0.0, 1.0),
       st.integers(0, 6))
# a plateau CI's hypothesis found: survivals of 1 and cost = B ms make Θ = 1 at every k, so
# both cuts are the maximum; argmax may take a later one that rounding lifts by 1 ulp
@example(conf=np.array([[1.0, 0, 0, 0], [0, 0, 0, 0], [1.0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0],
                        [0, 0, 0, 0], [0, 0, 0, 0], [1.0, 0, 0, 0]]), base_ms=1.0, per_token_ms=1.0, extra=0)
def test_unimodal_theta_makes_greedy_and_argmax_agree(conf, base_ms, per_token_ms, extra) -> None:
    # Affine cost and diminishing gains: Θ(k) rises then falls once, so the first stop is the
    # peak. Where Θ is flat (a plateau, equal to rounding) both answers are its maximum.
    prof = profile([1, 10_000], [base_ms, base_ms + per_token_ms * 9_999], mode="linear")
    batch = StepBatch.from_conf(conf, prof, extra_fixed_tokens=extra)
    greedy = make_policy("greedy", batch.gamma).decide(batch)
    argmax = make_policy("argmax", batch.gamma).decide(batch)
    if not np.array_equal(greedy, argmax):
        assert theta_of(batch, greedy) == pytest.approx(theta_of(batch, argmax), rel=1e-9)


@settings(max_examples=80, deadline=None)
@given(batches(), st.data())
def test_greedy_admission_of_r_k_ignores_the_survivals_after_k(batch: StepBatch, data) -> None:
    # INV-8, non-anticipation: a_{r,k+1..γ} depend on the sampled x_{r,k}, so they must not
    # decide whether x_{r,k} itself is verified.
    r = data.draw(st.integers(0, batch.num_requests - 1))
    k = data.draw(st.integers(1, batch.gamma))
    tail = data.draw(st.lists(st.sampled_from(CONF_GRID), min_size=batch.gamma - k,
                              max_size=batch.gamma - k))
    conf = batch.conf.copy()
    conf[r, k:] = tail
    changed = StepBatch.from_conf(conf, batch.cost.profile, extra_fixed_tokens=batch.fixed_tokens
                                  - batch.num_requests, max_tokens=batch.max_tokens,
                                  draft_s=batch.cost.draft_s)
    before = make_policy("greedy", batch.gamma).decide(batch)[r] >= k
    after = make_policy("greedy", batch.gamma).decide(changed)[r] >= k
    assert before == after


def test_argmax_admission_of_r_k_does_read_the_survivals_after_k() -> None:
    # The same property fails for argmax: search random small batches on a cliff profile
    # for a change of a_{r,k+1..γ} that flips whether (r, k) is admitted.
    rng = np.random.default_rng(0)
    prof = profile([2, 4, 8, 64], [10.0, 19.0, 20.0, 40.0])
    for _ in range(2000):
        r_count, gamma = int(rng.integers(1, 4)), int(rng.integers(2, 5))
        conf = rng.choice(CONF_GRID, size=(r_count, gamma))
        r, k = int(rng.integers(r_count)), int(rng.integers(1, gamma))
        other = conf.copy()
        other[r, k:] = rng.choice(CONF_GRID, size=gamma - k)
        policy = make_policy("argmax", gamma)
        before = policy.decide(StepBatch.from_conf(conf, prof))[r] >= k
        after = policy.decide(StepBatch.from_conf(other, prof))[r] >= k
        if before != after:
            return
    pytest.fail("no counterexample found: argmax looked non-anticipating on 2000 batches")
