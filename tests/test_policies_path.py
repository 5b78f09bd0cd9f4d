"""The shared path: every DSpark-family policy is only as right as its ranking and its Θ, so
the vectorised path must agree with Algorithm 1 written out one admission at a time."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparksim.cost.profile import Profile
from sparksim.policies import make_policy
from sparksim.policies.base import StepBatch
from sparksim.policies.path import (
    CostTable,
    batch_path,
    candidate_order,
    round_to_captured,
    top_k_lengths,
)
from tests.policy_helpers import (
    CONF_GRID,
    batches,
    confidences,
    profile,
    profiles,
    reference_cut,
    step_s,
)

# Drawn profiles are small; batches past their last size extrapolate on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::sparksim.cost.profile.ProfileWarning")


@settings(max_examples=80, deadline=None)
@given(batches())
def test_greedy_matches_algorithm_1_written_as_a_loop(batch: StepBatch) -> None:
    lengths = make_policy("greedy", batch.gamma).decide(batch)
    np.testing.assert_array_equal(lengths, reference_cut(batch))


@st.composite
def wide_batches(draw: st.DrawFn, prof: Profile) -> StepBatch:
    """Draw a batch of 280-512 candidates on `prof`: wide enough for greedy to walk the path's head alone."""
    r, g = draw(st.integers(40, 64)), draw(st.integers(7, 8))
    grid = draw(st.sampled_from([CONF_GRID, CONF_GRID[4:]]))  # with zeros, or none
    conf = np.array(draw(st.lists(st.sampled_from(grid), min_size=r * g, max_size=r * g))).reshape(r, g)
    cap = draw(st.one_of(st.none(), st.integers(r, r * (g + 1) + 4)))
    return StepBatch.from_conf(conf, prof, extra_fixed_tokens=draw(st.integers(0, 4)), max_tokens=cap,
                               draft_s=draw(st.sampled_from([0.0, 0.002])))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_greedy_walking_only_the_paths_head_matches_algorithm_1(data: st.DataObject) -> None:
    # Why: on a wide batch greedy sorts only the largest survivals (twice its last stop) once
    # its cost table covers the path; its answer must be the whole walk's wherever it stops:
    # at the token cap, inside the head, or past it (then it falls back to the whole sort).
    # Drawn profiles end by 48 tokens and slope on, so walks stop early; a graph flat up to
    # 256 tokens lets one run through the head. One profile for the run, as an engine has.
    flat = profile([8, 256, 1024], [5.0, 5.0, 9.0], captured=[8, 256, 1024])
    prof = data.draw(st.one_of(profiles(), st.just(flat)))
    policy = make_policy("greedy", 8)
    for batch in data.draw(st.lists(wide_batches(prof), min_size=2, max_size=6)):
        np.testing.assert_array_equal(policy.decide(batch), reference_cut(batch))


@settings(max_examples=80, deadline=None)
@given(batches())
def test_argmax_matches_the_whole_path_search_written_as_a_loop(batch: StepBatch) -> None:
    lengths = make_policy("argmax", batch.gamma).decide(batch)
    np.testing.assert_array_equal(lengths, reference_cut(batch, early_stop=False))


@settings(max_examples=100, deadline=None)
@given(confidences(), st.data())
def test_top_k_admits_exactly_the_first_k_candidates_of_the_ranking(conf, data) -> None:
    # Candidates are the positive survivals (the grid draws zeros): a k past them admits them all.
    survival = np.cumprod(conf, axis=1)
    r, g = survival.shape
    k = data.draw(st.integers(0, r * g))
    rr, jj = candidate_order(survival)
    positive = survival[rr, jj] > 0
    rr, jj = rr[positive], jj[positive]
    expected = np.zeros(r, dtype=np.int64)
    np.maximum.at(expected, rr[:k], jj[:k] + 1)
    np.testing.assert_array_equal(top_k_lengths(survival, k), expected)
    ranked = np.sort(survival, axis=None)[::-1]
    np.testing.assert_array_equal(top_k_lengths(survival, k, ranked), expected)


@settings(max_examples=100, deadline=None)
@given(confidences(max_requests=9, max_gamma=20), st.sampled_from(CONF_GRID[:-1]))
def test_the_fill_counts_rows_of_any_width_including_past_one_64_bit_word(conf, v) -> None:
    # The counts pack each row's comparisons into 64-bit words: γ = 8, 9, 16, 17 cross them.
    survival = -np.sort(-conf, axis=1)  # any rows non-increasing in j, drawn from the grid
    v += 0.025  # halfway between grid values: no candidate ties with the k-th
    k = int((survival >= v).sum())
    np.testing.assert_array_equal(top_k_lengths(survival, k), (survival >= v).sum(axis=1))


def test_cached_step_costs_cannot_be_corrupted_and_follow_the_fixed_cost() -> None:
    # Why: the dense costs are cached between steps; a caller writing into what it gets
    # would corrupt every later step's Θ, and a new draft or KV cost must move the prices.
    prof = profile([8, 64, 512], [10.0, 12.0, 30.0], mode="linear")
    table = CostTable()
    a = StepBatch.from_conf(np.full((4, 5), 0.8), prof, draft_s=0.001)
    b = StepBatch.from_conf(np.full((4, 5), 0.8), prof, draft_s=0.002)
    c = StepBatch.from_conf(np.full((4, 5), 0.8), prof, draft_s=0.001, kv_s=0.004)
    wa = table.step_s(a.cost, 4, 21)
    wa[:] = -1.0  # a careless caller
    wa = table.step_s(a.cost, 4, 21)
    np.testing.assert_allclose(wa, a.cost.step_s(np.arange(4, 25)), rtol=1e-12)
    np.testing.assert_allclose(table.step_s(b.cost, 4, 21) - wa, 0.001, rtol=1e-9)
    np.testing.assert_allclose(table.step_s(c.cost, 4, 21) - wa, 0.004, rtol=1e-9)


def test_ties_go_to_the_lower_position_then_the_lower_request() -> None:
    # Every survival equal: the path is position-major, request 0 before request 1.
    survival = np.full((2, 3), 0.5)
    rr, jj = candidate_order(survival)
    assert list(zip(rr.tolist(), jj.tolist(), strict=True)) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    np.testing.assert_array_equal(top_k_lengths(survival, 3), [2, 1])


@settings(max_examples=100, deadline=None)
@given(batches())
def test_theta_along_the_path_equals_tau_over_the_profiled_step_time(batch: StepBatch) -> None:
    path = batch_path(batch, CostTable())
    ks = np.arange(path.size + 1)
    tau = batch.num_requests + np.concatenate([[0.0], np.cumsum(path.gains)])
    direct = tau / np.array([step_s(batch, batch.fixed_tokens + int(k)) for k in ks])
    np.testing.assert_allclose(path.theta(), direct, rtol=1e-12)
    assert path.size <= max(0, batch.max_tokens - batch.fixed_tokens)


def test_rounding_picks_the_neighbouring_graph_size_with_the_higher_theta() -> None:
    # Graph sizes 8 and 16; cost flat inside each graph, so the Θ peak sits on a size.
    prof = profile([8, 16, 32], [10.0, 10.5, 30.0], captured=[8, 16, 32])
    batch = StepBatch.from_conf(np.full((4, 7), 0.9), prof)
    path = batch_path(batch, CostTable())
    # B = 4 + 6 = 10 lies between 8 and 16: both reachable, the larger Θ wins.
    k = round_to_captured(path, 6, (8, 16, 32))
    theta = path.theta()
    assert k in (4, 12)
    assert theta[k] == max(theta[4], theta[12])
    assert round_to_captured(path, 4, (8, 16, 32)) == 4  # already on a graph size
    assert round_to_captured(path, 6, ()) == 6  # no graph sizes listed: unchanged
    assert round_to_captured(path, 24, (8, 16)) == 24  # past the last graph: eager, unchanged


# conf rows with a zero: request 0's survivals are (0.9, 0, 0), request 1's all positive
ZERO_TAIL = np.array([[0.9, 0.0, 0.5], [0.8, 0.8, 0.8]])


@pytest.mark.parametrize("name", ["greedy", "argmax"])
def test_a_cost_falling_with_batch_size_does_not_buy_drafts_of_survival_zero(name: str) -> None:
    # Why: where step cost falls with B (a dip in a hand-built profile, or extrapolation),
    # every admission raises Θ = τ / step_s even when it adds nothing to τ; Alg. 1 ranks
    # positive survivals only, so a draft that cannot be accepted is never verified.
    prof = profile([1, 64], [20.0, 10.0], mode="linear")  # cost falls with B
    batch = StepBatch.from_conf(ZERO_TAIL, prof)
    lengths = make_policy(name, 3).decide(batch)
    np.testing.assert_array_equal(lengths, [1, 3])
    assert batch_path(batch, CostTable()).size == 4  # the path holds the positive ones only


def test_two_steps_budget_past_the_positive_survivals_leaves_the_zeros_unverified() -> None:
    # Why: two-step sizes K elsewhere (here the initial budget, γ per request) and fills the
    # K slots with the fresh top-K; a K past the positive survivals must not fill zeros.
    prof = profile([1, 64], [10.0, 11.0], mode="linear")
    batch = StepBatch.from_conf(ZERO_TAIL, prof)
    policy = make_policy("two-step", 3, {"initial_budget": 3})
    assert policy.decide(batch).tolist() == [1, 3]
    assert policy.last_capacity == 6  # the budget was larger: the fill stopped at the zeros
    np.testing.assert_array_equal(top_k_lengths(batch.survival, 6), [1, 3])
    np.testing.assert_array_equal(top_k_lengths(np.zeros((2, 3)), 6), [0, 0])
