"""The engines' DSpark rules on hand-made batches whose answer each engine's code determines.

Every expected ℓ below was derived step by step from the engine's code at the commit its
policy module cites (the intermediate figures are in the comments); a rule that drifts
from its engine fails here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparksim.config import REPO_ROOT
from sparksim.cost.engine_tables import (
    AtomSpsTable,
    SglangAdditiveTable,
    SglangSpsTable,
    TrtllmSpsTable,
    VllmCostTables,
)
from sparksim.cost.pricing import StepCost
from sparksim.cost.profile import load_profile
from sparksim.errors import ConfigError
from sparksim.policies import make_policy
from sparksim.policies.base import Policy, StepBatch
from sparksim.policies.path import top_k_lengths
from sparksim.sim.runner import load_scenario, simulate
from tests.policy_helpers import profile

PROFILE = profile([1, 4096], [10.0, 10.0])  # the engines' tables price these batches, not this


def batch(conf: list[list[float]], ids: list[int] | None = None, extra_fixed: int = 0) -> StepBatch:
    return StepBatch.from_conf(conf, PROFILE, request_ids=ids, extra_fixed_tokens=extra_fixed)


def after(policy: Policy, stale: list[list[float]], fresh: list[list[float]], lag: int) -> np.ndarray:
    """ℓ on `fresh` after `lag` earlier steps, the oldest of them `stale` (what the budget reads)."""
    policy.decide(batch(stale))
    for _ in range(lag - 1):
        policy.decide(batch(fresh))
    return policy.decide(batch(fresh))


# ------------------------------------------------------------------------------ SGLang


SG_1D = SglangSpsTable(batch_tokens=(1, 4, 6, 8), steps_per_sec=(100.0, 90.0, 70.0, 60.0), max_batch_tokens=8)


def test_sglang_budget_from_two_steps_ago_slots_to_the_fresh_top_k() -> None:
    p = make_policy("sglang-dspark", 3, {"table": SG_1D})
    ell = after(p, [[.9, .8, .5], [.6, .5, .5]], [[.6, .5, .5], [.99, .95, .9]], lag=2)
    assert p.last_capacity == 3  # θ(B=2..8) = 200, 290, 325.8, 379.8, 320.6, 341.6, 301.8
    np.testing.assert_array_equal(ell, [0, 3])  # the stale rows would have given [2, 1]


def test_sglang_additive_table() -> None:
    table = SglangAdditiveTable(bias_s=0.010, bs_probes=(1, 4), alpha_s=(0.0, 0.002),
                                m_probes=(1, 8, 16), theta_s=(0.0, 0.004, 0.012))
    p = make_policy("sglang-dspark", 4, {"table": table})
    ell = after(p, [[.9, .9, .8, .5], [.7, .6, .5, .5], [.95, .5, .4, .3]],
                [[.5, .5, .5, .5], [.95, .95, .9, .9], [.9, .6, .5, .5]], lag=2)
    assert p.last_capacity == 6
    np.testing.assert_array_equal(ell, [0, 4, 2])


def test_sglang_without_a_table_verifies_every_candidate() -> None:
    # the flat placeholder ([1] -> 1 step/s): θ = τ* rises with each candidate ≥ 1e-6
    p = make_policy("sglang-dspark", 3, {"table": "flat"})
    ell = after(p, [[.9, 0.0, .5], [.6, .5, .5]], [[.8, .8, .8], [.8, .5, .5]], lag=2)
    assert p.last_capacity == 4  # r0's zero cuts its row at one candidate
    np.testing.assert_array_equal(ell, [3, 1])


def test_sglang_ties_take_the_smaller_budget_and_the_lower_request() -> None:
    table = SglangSpsTable(batch_tokens=(1, 4), steps_per_sec=(10.0, 5.0), max_batch_tokens=4)
    p = make_policy("sglang-dspark", 2, {"table": table})
    ell = after(p, [[.5, .5], [.5, .5]], [[.8, .5], [.8, .9]], lag=2)
    assert p.last_capacity == 1
    np.testing.assert_array_equal(ell, [1, 0])


def test_sglang_modes_static_and_cap_accept() -> None:
    stale, fresh = [[.9, .8, .5], [.6, .5, .5]], [[.6, .5, .5], [.99, .95, .9]]
    static = make_policy("sglang-dspark", 3, {"mode": "static", "table": SG_1D})
    np.testing.assert_array_equal(after(static, stale, fresh, lag=2), [3, 3])
    cap = make_policy("sglang-dspark", 3, {"mode": "cap-accept", "table": SG_1D})
    np.testing.assert_array_equal(after(cap, stale, fresh, lag=2), [0, 3])  # compact's plan ...
    assert cap.pays_full_block and not static.pays_full_block  # ... at the whole block's price
    with pytest.raises(ConfigError, match="mode='ragged'"):
        make_policy("sglang-dspark", 3, {"mode": "ragged"})


def test_sglang_prompt_chunks_get_no_budget() -> None:
    p = make_policy("sglang-dspark", 3, {"table": SG_1D})
    for _ in range(3):
        ell = p.decide(batch([[.1, .1, .1], [.1, .1, .1]], extra_fixed=16))
    np.testing.assert_array_equal(ell, [3, 3])


# ------------------------------------------------------------------------------ vLLM


def test_vllm_budget_from_the_previous_block() -> None:
    table = VllmCostTables(verify_tokens=(2, 4, 8), verify_ms=(10.0, 12.0, 20.0),
                           draft_requests=(1, 8), draft_ms=(0.0, 0.0), cudagraph_limit=8)
    p = make_policy("vllm-adaptive", 3, {"table": table})
    ell = after(p, [[.9, .8, .5], [.6, .5, .5]], [[.5, .5, .5], [.95, .9, .9]], lag=1)
    assert p.last_capacity == 2  # τ/cost = .200, .2417, .3017, .211, ...
    np.testing.assert_array_equal(ell, [0, 2])


def test_vllm_interior_optimum_with_draft_cost() -> None:
    table = VllmCostTables(verify_tokens=tuple(range(1, 17)), verify_ms=tuple(10.0 + b for b in range(1, 17)),
                           draft_requests=(1, 2, 3, 8), draft_ms=(1.0, 1.5, 2.0, 4.0), cudagraph_limit=16)
    p = make_policy("vllm-adaptive", 4, {"table": table})
    ell = after(p, [[.9, .8, .6, .5], [.7, .6, .5, .5], [.5, .4, .5, .5]],
                [[.6, .5, .5, .5], [.95, .9, .8, .7], [.9, .5, .5, .5]], lag=1)
    assert p.last_capacity == 6
    np.testing.assert_array_equal(ell, [1, 4, 1])


def test_vllm_a_new_request_counts_as_certain_in_the_budget() -> None:
    table = VllmCostTables(verify_tokens=tuple(range(1, 17)), verify_ms=tuple(10.0 + b for b in range(1, 17)),
                           draft_requests=(1, 2, 3, 8), draft_ms=(1.0, 1.5, 2.0, 4.0), cudagraph_limit=16)
    p = make_policy("vllm-adaptive", 3, {"table": table})
    p.decide(batch([[.8, .7, .3]], ids=[0]))
    ell = p.decide(batch([[.8, .7, .3], [.5, .5, .5]], ids=[0, 1]))
    # stale: r0 .8 .56 .168, r1 1 1 1; τ/cost over m = 0..6 peaks at m = 5 (cost 1.5 + 10 + 2 + m)
    assert p.last_capacity == 5
    np.testing.assert_array_equal(ell, [3, 2])


# ------------------------------------------------------------------------------ TensorRT-LLM

R0, R1 = [.9, .8, .5], [.6, .5, .9]  # survivals [.9, .72, .36] and [.6, .3, .27]


@pytest.mark.parametrize(("table", "tiers", "budget", "expected"), [
    (TrtllmSpsTable(token_counts=(4, 6, 8), step_time_ms=(10.0, 10.0, 14.0)), "default", 2, [3, 1]),
    # a staircase: the first descent would stop at 0; the global argmax crosses it
    (TrtllmSpsTable(token_counts=(4, 5, 8), step_time_ms=(10.0, 13.0, 13.0)), "default", 4, [3, 3]),
    (TrtllmSpsTable(token_counts=(4, 6, 8), step_time_ms=(10.0, 10.0, 14.0)), "1/3", 4, [3, 3]),
])
def test_trtllm_planner_global_argmax_over_tiers(table: TrtllmSpsTable, tiers: str, budget: int,
                                                 expected: list[int]) -> None:
    p = make_policy("trtllm-planner", 3, {"table": table, "tiers": tiers})
    ell = after(p, [R0, R1], [R0, R1], lag=1)
    assert p.last_capacity == budget
    np.testing.assert_array_equal(ell, expected)


def test_trtllm_planner_refuses_to_trim_without_a_table() -> None:
    p = make_policy("trtllm-planner", 3, {"table": "flat"})
    np.testing.assert_array_equal(after(p, [R0, R1], [R0, R1], lag=1), [3, 3])


def test_trtllm_host_path_fills_from_the_snapshot_device_windows_from_the_fresh_block() -> None:
    table = TrtllmSpsTable(token_counts=(4, 6, 8), step_time_ms=(10.0, 10.0, 14.0))
    host = make_policy("trtllm-planner", 3, {"table": table})
    device = make_policy("trtllm-planner", 3, {"table": table, "device_windows": True})
    fresh = [R1, R0]  # the requests swapped their confidences since the snapshot
    np.testing.assert_array_equal(after(host, [R0, R1], fresh, lag=1), [3, 1])
    np.testing.assert_array_equal(after(device, [R0, R1], fresh, lag=1), [1, 3])


def test_trtllm_threshold_is_inert_as_served() -> None:
    conf = [[.9, .4, .95], [.3, .9, .9]]
    np.testing.assert_array_equal(make_policy("trtllm-threshold", 3).decide(batch(conf)), [3, 3])
    np.testing.assert_array_equal(make_policy("trtllm-threshold", 3, {"t": 0.5}).decide(batch(conf)), [1, 0])


# ------------------------------------------------------------------------------ ATOM


def _sps(values: list[float]) -> AtomSpsTable:
    return AtomSpsTable(token_points=tuple(range(len(values))), sps_points=tuple(values), max_b=len(values) - 1)


def test_atom_greedy_on_a_calibrated_table() -> None:
    p = make_policy("atom-schedule", 3, {"table": _sps([100, 100, 100, 95, 90, 80, 70, 65, 60]), "ragged": False})
    np.testing.assert_array_equal(p.decide(batch([[.9, .8, .5], [.6, .5, .9]])), [2, 1])


def test_atom_early_stop_halts_at_the_first_dip_the_argmax_crosses_it() -> None:
    table = _sps([100, 100, 100, 70, 70, 70, 70, 70, 70])
    conf = [[.5, .98, .98], [.45, .98, .98]]
    greedy = make_policy("atom-schedule", 3, {"table": table, "ragged": False})
    argmax = make_policy("atom-schedule", 3, {"table": table, "ragged": False, "early_stop": False})
    np.testing.assert_array_equal(greedy.decide(batch(conf)), [0, 0])
    np.testing.assert_array_equal(argmax.decide(batch(conf)), [3, 3])
    assert greedy.lossless and not argmax.lossless


@pytest.mark.parametrize(("conf", "expected"), [
    ([[.9, .8, .5], [.6, .5, .9]], [2, 0]),
    ([[.95, .9, .85, .8], [.7, .6, .5, .4], [.3, .9, .9, .9]], [3, 1, 0]),
])
def test_atom_recipe_runs_on_the_stub_table(conf: list[list[float]], expected: list[int]) -> None:
    p = make_policy("atom-schedule", len(conf[0]), {"ragged": False})
    np.testing.assert_array_equal(p.decide(batch(conf)), expected)


def test_atom_ragged_floor_and_a_changed_batch() -> None:
    p = make_policy("atom-schedule", 3)  # the recipe: stub table, ragged
    b = batch([[.9, .8, .5], [.6, .5, .9]])
    np.testing.assert_array_equal(p.decide(b), [3, 3])  # no previous batch: rectangular
    p.observe(b, np.array([3, 3]), np.array([1, 0]))
    np.testing.assert_array_equal(p.decide(b), [2, 1])  # max(ℓ = [2, 0], max_nb = 1)
    np.testing.assert_array_equal(p.decide(batch([[.9, .8, .5], [.6, .5, .9]], ids=[0, 7])), [3, 3])


def test_atom_head_reuses_the_previous_blocks_lengths() -> None:
    p = make_policy("atom-schedule", 3, {"ragged": False, "head": True})
    np.testing.assert_array_equal(p.decide(batch([[.9, .8, .5], [.6, .5, .9]])), [3, 3])  # none held yet
    np.testing.assert_array_equal(p.decide(batch([[.1, .1, .1], [.1, .1, .1]])), [2, 0])


# ------------------------------------------------------------------------------ SGLang adaptive steps


def test_sglang_adaptive_steps_hysteresis() -> None:
    p = make_policy("sglang-adaptive-steps", 7)
    b = batch([[.5] * 7])
    steps = []
    for _ in range(15):  # nothing accepted: the EMA decays from 4 (start s = 5) to 4·0.8^15
        ell = p.decide(b)
        steps.append(int(ell[0]))
        p.observe(b, ell, np.zeros(1, np.int64))
    assert steps == [5] * 15  # warm-up 10, first decision after the 15th step
    assert int(p.decide(b)[0]) == 1  # 0.141 ≤ 3 − 0.5 − 0.25 and ≤ 1 − 0.5 − 0.25: down twice
    for _ in range(5):
        p.observe(b, np.array([1]), np.ones(1, np.int64))
        p.decide(b)
    assert int(p.decide(b)[0]) == 3  # the EMA passed 1 − 0.5: up one (not two: 2.5 > it)


def test_sglang_adaptive_steps_route_by_batch_size() -> None:
    p = make_policy("sglang-adaptive-steps", 7)
    assert int(p.decide(batch([[.5] * 7] * 8))[0]) == 1  # key 8: [0, 1, 3], the middle
    assert int(p.decide(batch([[.5] * 7] * 64))[0]) == 0  # key 64: [0]


# ------------------------------------------------------------------------------ tie rules


def test_sglang_and_vllm_take_the_smaller_budget_when_theta_ties() -> None:
    # R = 1, stale survivals [.5, .5]: τ = 1, 1.5, 2 at B = 1, 2, 3; 6, 6, 4.5 steps/s gives θ = 6, 9, 9
    sg = make_policy("sglang-dspark", 2, {"table": SglangSpsTable((1, 2, 3), (6.0, 6.0, 4.5), 3)})
    np.testing.assert_array_equal(after(sg, [[.5, 1.0]], [[.9, .9]], lag=2), [1])
    vl = make_policy("vllm-adaptive", 2, {"table": VllmCostTables((1, 2, 3), (1000 / 6, 1000 / 6, 1000 / 4.5),
                                                                  (1,), (0.0,), cudagraph_limit=3)})
    after(vl, [[.5, 1.0]], [[.9, .9]], lag=1)
    assert vl.last_capacity == 1


def test_trtllm_takes_the_larger_budget_when_theta_ties() -> None:
    # base τ = 2 + .5 + .5 = 3; tiers 1, 2, 3 -> budgets 0, 2, 4 at 4, 6, 8 tokens: τ/T = 3/6, 3.5/7, 3.75/8
    table = TrtllmSpsTable(token_counts=(4, 6, 8), step_time_ms=(6.0, 7.0, 8.0))
    p = make_policy("trtllm-planner", 3, {"table": table})
    half = [[.5, .5, .5], [.5, .5, .5]]
    np.testing.assert_array_equal(after(p, half, half, lag=1), [2, 2])
    assert p.last_capacity == 2


def test_atom_stops_where_theta_stops_rising() -> None:
    # Θ(0) = 1·3 = Θ(1) = 1.5·2: the early stop breaks on a tie (Θ(m+1) <= Θ(m)), before Θ(2) ≈ 4
    table = AtomSpsTable(token_points=(0, 1, 2, 3), sps_points=(3.0, 3.0, 2.0, 2.0), max_b=3)
    p = make_policy("atom-schedule", 2, {"table": table, "ragged": False})
    np.testing.assert_array_equal(p.decide(batch([[.5, 1.0]])), [0])


def test_sglang_adaptive_steps_drop_to_plain_decoding_and_skip_the_drafter() -> None:
    p = make_policy("sglang-adaptive-steps", 7)
    b = batch([[.5] * 7] * 8)  # key 8: [0, 1, 3], start at 1 with EMA 0
    for _ in range(15):
        assert p.drafts_at(8)
        p.observe(b, p.decide(b), np.zeros(8, np.int64))
    assert not p.drafts_at(8)  # EMA 0 ≤ 0.5 (the threshold to 0 is 0.5 + down)


# ------------------------------------------------------------------------------ in the engine


def _steps(spec: str, users: int = 16, *extra: str) -> pd.DataFrame:
    sc, base = load_scenario(None, [f"workload.concurrency={users}", "run.duration_s=3", *extra], spec)
    res = simulate(sc, base)
    assert res.steps is not None
    return res.steps[(res.steps.prefill_tokens == 0) & (res.steps.num_requests > 0)]


def test_cap_accept_pays_the_whole_block_and_commits_the_plan() -> None:
    cap, compact = _steps("sglang-dspark:mode=cap-accept", 128), _steps("sglang-dspark", 128)
    gamma = 7  # the default trace set's block
    assert (cap.batch_tokens == cap.num_requests * (gamma + 1)).all()
    assert (cap.verified_drafts < cap.num_requests * gamma).mean() > 0.5
    assert (compact.batch_tokens == compact.num_requests + compact.verified_drafts).all()
    assert (compact.verified_drafts < compact.num_requests * gamma).mean() > 0.5


def test_plain_steps_of_the_adaptive_step_count_pay_no_drafter() -> None:
    steps = _steps("sglang-adaptive-steps", users=64)  # key 64: [0], plain decoding
    plain = steps[steps.num_requests >= 64]
    assert len(plain) > 10
    assert (plain.draft_s == 0).all() and (plain.verified_drafts == 0).all()


def test_a_pass_based_drafter_drafts_and_is_priced_for_the_adaptive_step_count_only() -> None:
    """SGLang drafts s passes of an EAGLE/MTP drafter: a step pays s positions, not the block."""
    steps = _steps("sglang-adaptive-steps", 1, "policy.drafter=mtp-1")  # key 1: s in 1, 3, 5, 7
    drafting = steps[steps.draft_s > 0]
    s = drafting.verified_drafts // drafting.num_requests
    assert set(s) >= {3, 5} and len(set(s)) >= 2  # s moves, and each step is priced for its own
    prof = load_profile(REPO_ROOT / "profiles" / "h100-qwen3-8b-analytic")
    want = [StepCost.for_step(prof, requests=int(r), kv_tokens=float(kv), positions=int(k),
                              drafter="mtp-1").draft_s
            for r, kv, k in zip(drafting.num_requests, drafting.kv_tokens, s, strict=True)]
    np.testing.assert_allclose(drafting.draft_s, want, rtol=1e-9)


def test_trtllm_with_the_verified_blocks_snapshot_anticipates_its_own_drafts() -> None:
    # The smallest case that shows it (the first-token bias lab cannot: the floor verifies x_1
    # always): whether x_2 is verified reads c_3, which the head computes from x_2 itself.
    table = TrtllmSpsTable(token_counts=(2, 4), step_time_ms=(10.0, 16.0))

    def verifies_x2(c3: float, lag: int) -> bool:
        p = make_policy("trtllm-planner", 3, {"table": table, "tiers": "1/3", "lag": lag})
        p.decide(batch([[.9, .9, .9]]))  # the previous block
        return bool(p.decide(batch([[.9, .9, c3]]))[0] >= 2)

    assert verifies_x2(.9, lag=0) and not verifies_x2(.01, lag=0)  # τ/T: .215 vs .19, then .170
    assert verifies_x2(.9, lag=1) == verifies_x2(.01, lag=1)
    assert not make_policy("trtllm-planner", 3, {"lag": 0}).lossless


# ------------------------------------------------------------------------------ one price


@pytest.mark.parametrize(("spec", "params"), [("vllm-adaptive", {}), ("sglang-dspark", {}),
                                              ("atom-schedule", {"table": "exact", "ragged": False}),
                                              ("trtllm-planner", {})])
def test_the_exact_table_is_the_price_the_engine_charges(spec: str, params: dict[str, object],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # On a profile whose price depends on the longest verified block (padded attention), every
    # cut a rule prices with `table=exact` must cost what the engine charges for that cut's ℓ.
    import warnings

    from sparksim.cost.pricing import StepCost
    from sparksim.cost.profile import load_profile

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prof = load_profile("profiles/cpu-tinylm-d128-live-measured")
    cost = StepCost.for_decode(prof, 3, 600.0, 4, prof.default_drafter, kv_longest=300.0)
    assert cost.shaped
    b = StepBatch.from_conf([[.9, .8, .7, .6], [.5, .9, .9, .9], [.95, .3, .9, .9]], prof, cost=cost)
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    real = StepCost.step_s

    def recording(self: StepCost, tokens: object, longest: object = None) -> np.ndarray:
        out = real(self, tokens, longest)
        seen.append((np.atleast_1d(np.asarray(tokens)), np.atleast_1d(out)))
        return out

    policy = make_policy(spec, 4, params)
    for _ in range(2):  # the snapshot is this same batch: stale survivals = fresh
        policy.decide(b)
    monkeypatch.setattr(StepCost, "step_s", recording)
    policy.decide(b)
    assert seen
    r = b.num_requests
    for tokens, priced in seen:
        for t, s in zip(tokens, priced, strict=True):
            k = int(t) - b.fixed_tokens
            if spec == "trtllm-planner":  # one draft each, then the top of the tails
                tail = np.sort(b.survival[:, 1:], axis=None)[::-1][k - r - 1] if k > r else np.inf
                lengths = 1 + (b.survival[:, 1:] >= tail).sum(axis=1) if k > r else np.ones(r, np.int64)
            else:
                lengths = top_k_lengths(b.survival, k)
            assert s == pytest.approx(cost.price(np.asarray(lengths, np.int64)).total_s, rel=1e-9), (t, lengths)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(1, 9), st.integers(0, 120), st.integers(0, 2**32 - 1), st.booleans())
def test_trtllm_tail_fill_is_the_planners_stable_sort(r: int, gamma: int, k: int, seed: int, coarse: bool) -> None:
    # Why: TensorRT-LLM fills its budget from a stable sort of every tail survival
    # (position-major, values under 1e-6 never taken); sparksim's path selection must pick
    # the same slots, ties and tiny survivals included, or the rule is not the engine's.
    from sparksim.policies.trtllm import _top_tail

    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.0, 1.0, (r, gamma))
    if coarse:  # ties across requests, and survivals that fall under 1e-6
        conf = np.floor(conf * 3.0) / 3.0 + np.where(rng.random((r, gamma)) < 0.2, 1e-7, 0.0)
    survival = np.cumprod(np.clip(conf, 0.0, 1.0), axis=1)
    flat = np.where(survival[:, 1:] >= 1e-6, survival[:, 1:], -1.0).T.ravel()
    order = np.argsort(-flat, kind="stable")[:k]
    order = order[flat[order] >= 0.0]
    want = np.bincount(order % r, minlength=r) if gamma > 1 else np.zeros(r, np.int64)
    np.testing.assert_array_equal(_top_tail(survival, k), want)
