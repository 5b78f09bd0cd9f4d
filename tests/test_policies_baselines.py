"""The baselines beyond the paper: each must follow its source's rule, or a comparison against
DSpark measures a strawman (or, for the oracle, a ceiling that is not one)."""

from __future__ import annotations

import numpy as np
import pytest

from sparksim.cost.pricing import StepCost
from sparksim.errors import ConfigError
from sparksim.policies import make_policy
from sparksim.policies.base import StepBatch
from sparksim.policies.dynamic_sd import DynamicSD
from sparksim.policies.smartspec import SmartSpec
from tests.policy_helpers import profile, step_s

pytestmark = pytest.mark.filterwarnings("ignore::sparksim.cost.profile.ProfileWarning")

FLAT = profile([1, 4096], [10.0, 10.0])
STEEP = profile([1, 4096], [10.0, 10.0 + 4095 * 10.0], mode="linear")  # +10 ms per token


# ------------------------------------------------------------------ oracle


def test_oracle_verifies_exactly_the_accepted_drafts_when_cost_is_flat() -> None:
    accepted = np.array([0, 3, 7, 5])
    b = StepBatch.from_conf(np.full((4, 7), 0.5), FLAT, accepted=accepted)
    policy = make_policy("oracle", 7)
    assert policy.upper_bound and policy.reads_outcome and "[upper bound]" in policy.label()
    np.testing.assert_array_equal(policy.decide(b), accepted)


def test_oracle_verifies_nothing_when_no_accepted_draft_pays_for_itself() -> None:
    b = StepBatch.from_conf(np.full((4, 7), 0.9), STEEP, accepted=[7, 7, 7, 7])
    assert make_policy("oracle", 7).decide(b).sum() == 0


def test_oracle_fills_up_to_a_graph_size_when_that_beats_all_or_nothing() -> None:
    # Cost flat to B = 8, then a cliff: 4 requests + 4 accepted drafts fill the graph.
    prof = profile([8, 64], [10.0, 40.0])
    accepted = np.array([3, 1, 2, 2])
    b = StepBatch.from_conf(np.full((4, 5), 0.5), prof, accepted=accepted)
    lengths = make_policy("oracle", 5).decide(b)
    assert lengths.sum() == 4 and (lengths <= accepted).all()
    np.testing.assert_array_equal(lengths, [1, 1, 1, 1])  # first level of accepted drafts first
    realised = lambda n: (4 + n) / step_s(b, 4 + n)  # noqa: E731
    assert realised(4) > max(realised(0), realised(8))


def test_oracle_without_outcomes_is_an_error() -> None:
    b = StepBatch.from_conf(np.full((2, 3), 0.5), FLAT)
    with pytest.raises(ConfigError, match="accepted"):
        make_policy("oracle", 3).decide(b)


# ------------------------------------------------------------------ threshold


def test_threshold_cuts_at_the_first_low_per_step_confidence() -> None:
    conf = np.array([[0.9, 0.4, 0.9, 0.9], [0.8, 0.8, 0.8, 0.8], [0.3, 0.9, 0.9, 0.9]])
    b = StepBatch.from_conf(conf, FLAT)
    assert make_policy("threshold", 4, {"t": 0.5}).decide(b).tolist() == [1, 4, 0]
    # Per-step, not cumulative: survival of row 1 falls to 0.41 but every c ≥ 0.5.
    assert make_policy("threshold", 4, {"t": 0.0}).decide(b).tolist() == [4, 4, 4]


def test_threshold_trims_the_lowest_survivals_to_fit_the_token_cap() -> None:
    conf = np.array([[0.9, 0.9, 0.9], [0.6, 0.6, 0.6]])
    b = StepBatch.from_conf(conf, FLAT, max_tokens=2 + 4)
    lengths = make_policy("threshold", 3, {"t": 0.5}).decide(b)
    assert lengths.tolist() == [3, 1]  # 0.9, 0.81, 0.73 beat 0.6; then 0.6 beats 0.36


# ------------------------------------------------------------------ smartspec


def smartspec_expected_k(alpha: float, b: StepBatch, k_max: int, bonus: float = 1.1) -> int:
    """SmartSpec's selection written out: enumerate k, stop at the first goodput that does not rise."""
    best_k, best = 0, -np.inf
    for k in range(k_max + 1):
        seconds = step_s(b, b.fixed_tokens + b.num_requests * k) - (b.cost.draft_s if k == 0 else 0.0)
        good = b.num_requests * (1 - alpha ** (k + 1)) / (1 - alpha) / seconds
        good *= bonus if k == 0 else 1.0
        if good <= best:
            break
        best_k, best = k, good
    return best_k


@pytest.mark.parametrize("alpha", [0.2, 0.5, 0.7, 0.9])
def test_smartspec_picks_one_k_by_goodput_with_the_no_speculation_bonus(alpha: float) -> None:
    prof = profile([1, 4096], [10.0, 10.0 + 4095 * 0.05], mode="linear")
    b = StepBatch.from_conf(np.full((16, 7), 0.5), prof)
    lengths = SmartSpec(7, alpha=alpha).decide(b)
    assert len(set(lengths.tolist())) == 1
    assert lengths[0] == smartspec_expected_k(alpha, b, 7)


def test_smartspec_prices_k_0_as_plain_decoding_and_then_runs_no_drafter() -> None:
    # dsd.py: "for k=0 it is target only". Dense 10 ms + 3 ms a token, drafter 4 ms, α = 0.5,
    # one request: plain 1 token / 10 ms = 100 tok/s (×1.1 = 110) beats k = 1's 1.5 / 17 ms =
    # 88 tok/s, so k = 0 is kept, and while it is the steps do not draft, but every
    # interval-th, which re-decides k.
    prof = profile([1, 64], [10.0, 10.0 + 63 * 3.0], mode="linear")
    b = StepBatch.from_conf(np.full((1, 5), 0.5), prof, draft_s=0.004)
    policy = SmartSpec(5, alpha=0.5, interval=4)
    good = policy.goodput(b, 5)
    assert good[0] == pytest.approx(110.0) and good[1] == pytest.approx(1.5 / 0.017)
    assert policy.drafts_at(1) and policy.decide(b).tolist() == [0]  # step 0 decides k = 0
    assert [policy.drafts_at(1) for _ in range(3)] == [False] * 3  # steps 1-3: plain
    assert policy.drafts_at(1)  # step 4 re-decides


def test_smartspec_prices_k_0_without_a_sync_pipelines_decision_time() -> None:
    # The same step with 3 ms of known decision time (cluster.pipeline: sync): a drafting step
    # pays it, a plain one decides nothing, so k = 0 stays 1 token / 10 ms (×1.1) and k = 1
    # is 1.5 tokens / 20 ms.
    prof = profile([1, 64], [10.0, 10.0 + 63 * 3.0], mode="linear")
    plain = StepBatch.from_conf(np.full((1, 5), 0.5), prof, draft_s=0.004)
    b = StepBatch.from_conf(np.full((1, 5), 0.5), prof, cost=StepCost(
        prof, draft_s=0.004, context=0.0, base_tokens=1, requests=1, overhead_s=0.003, decision_s=0.003))
    good = SmartSpec(5, alpha=0.5).goodput(b, 5)
    assert good[0] == pytest.approx(110.0) and good[1] == pytest.approx(1.5 / 0.020)
    assert good[0] == pytest.approx(SmartSpec(5, alpha=0.5).goodput(plain, 5)[0])


def test_smartspec_learns_alpha_by_ema_and_recomputes_every_interval() -> None:
    prof = profile([1, 4096], [10.0, 10.0 + 4095 * 0.05], mode="linear")
    b = StepBatch.from_conf(np.full((16, 7), 0.5), prof)
    policy = SmartSpec(7, alpha=0.8, interval=3)
    k_first = policy.decide(b)[0]
    assert k_first == smartspec_expected_k(0.8, b, 7) > 0
    policy.observe(b, np.full(16, 7), np.zeros(16, np.int64))  # nothing accepted
    assert policy.alpha == pytest.approx(0.85 * 0.8)
    for _ in range(8):
        policy.observe(b, np.full(16, 7), np.zeros(16, np.int64))
    assert policy.alpha < 0.2
    assert policy.decide(b)[0] == k_first and policy.decide(b)[0] == k_first  # steps 2, 3: kept
    k_after = policy.decide(b)[0]  # step 4: recomputed with the low α
    assert k_after == smartspec_expected_k(policy.alpha, b, 7) < k_first


# ------------------------------------------------------------------ dynamic-sd


def test_dynamic_sd_scans_every_k_without_early_stop() -> None:
    # Cost jumps at B = 2R then stays flat: goodput dips at k = 1 and peaks at k = 7.
    r = 8
    prof = profile([r, 2 * r, 8 * r], [10.0, 20.0, 20.0])
    b = StepBatch.from_conf(np.full((r, 7), 0.5), prof)
    policy = DynamicSD(7, acceptance=0.9)
    assert policy.decide(b).tolist() == [7] * r
    s = 0.9 ** np.arange(1, 8)
    good = [(1 + s[:k].sum()) / step_s(b, r * (1 + k)) for k in range(8)]
    assert good[1] < good[0] and int(np.argmax(good)) == 7  # an early stop would say 0


def test_dynamic_sd_learns_unconditional_survival_after_warmup() -> None:
    b = StepBatch.from_conf(np.full((4, 3), 0.5), FLAT)
    policy = DynamicSD(3, acceptance=0.9, warmup=2)
    lengths = np.full(4, 3)
    accepted = np.array([0, 1, 3, 3])
    for _ in range(2):
        policy.observe(b, lengths, np.zeros(4, np.int64))  # warm-up steps are not counted
    np.testing.assert_allclose(policy.survival_per_pos(), 0.9 ** np.arange(1, 4))
    policy.observe(b, lengths, accepted)
    np.testing.assert_allclose(policy.survival_per_pos(), [3 / 4, 2 / 4, 2 / 4])
