"""Closed-form checks: where queueing and acceptance have exact answers, the simulator must
reproduce them, or its figures for the hard cases cannot be trusted either."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sparksim.runner import load_scenario, simulate


@pytest.mark.parametrize("gamma", [1, 3, 7])
def test_constant_confidence_gives_the_geometric_accepted_length(
    flat_profile: Path, traces_07: Path, gamma: int
) -> None:
    c = 0.7
    sets = [f"profile={flat_profile}", f"traces={traces_07}", f"policy.gamma={gamma}",
            "run.duration_s=40", "workload.concurrency=32"]
    res = simulate(*load_scenario(None, sets, "static"))
    expected = (1 - c ** (gamma + 1)) / (1 - c)
    steps = res.summary["census"]["finished"]
    got = res.summary["mean_acceptance_length"]
    # per-step emission has sd ≤ ~1.5 tokens; thousands of request-steps give a tight bound,
    # and the one cut step per request biases it slightly low
    n = res.steps["num_requests"].sum() if res.steps is not None else steps
    assert abs(got - expected) < 4 * 1.5 / np.sqrt(n) + 0.02 * expected, (got, expected)
    surv = res.summary["acceptance_by_position"]["survival"]
    for k in range(1, gamma + 1):
        assert surv[k - 1] == pytest.approx(c**k, abs=0.03)


def test_one_user_tpot_is_step_time_over_accepted_length(flat_profile: Path, traces_07: Path) -> None:
    sets = [f"profile={flat_profile}", f"traces={traces_07}", "policy.gamma=3",
            "workload.concurrency=1", "cluster.prefill.kv_transfer_s=0", "run.duration_s=30"]
    res = simulate(*load_scenario(None, sets, "static"))
    req = res.requests
    step_s = 0.010  # flat profile, no draft table
    # exactly: every decode step of a lone request takes one step time
    np.testing.assert_allclose(req["finish_at"] - req["first_token_at"], req["decode_steps"] * step_s,
                               rtol=1e-9)
    tpot_s = res.summary["mean_tpot_ms"] / 1e3
    acc_len = (req["output_tokens"] - 1).sum() / req["decode_steps"].sum()
    assert tpot_s == pytest.approx(step_s / acc_len, rel=0.05)


def test_littles_law_holds_on_the_records_of_an_open_loop_run(
    sloped_profile: Path, varied_traces: Path
) -> None:
    sets = [f"profile={sloped_profile}", f"traces={varied_traces}", "workload.kind=poisson",
            "workload.rate=20", "run.duration_s=120", "run.warmup_s=10", "run.cooldown_s=30",
            "policy.gamma=3"]
    res = simulate(*load_scenario(None, sets, "static"))
    req = res.requests
    t0, t1 = 10.0, 90.0
    # L: time-average number in system over [t0, t1], from arrival/finish intervals
    grid = np.linspace(t0, t1, 4001)
    arr = req["arrival_at"].to_numpy()
    fin = req["finish_at"].to_numpy()
    in_sys = ((arr[None, :] <= grid[:, None]) & (fin[None, :] > grid[:, None])).sum(axis=1)
    big_l = in_sys.mean()
    inside = (arr >= t0) & (arr < t1)
    lam = inside.sum() / (t1 - t0)
    w = (fin - arr)[inside].mean()
    assert big_l == pytest.approx(lam * w, rel=0.05)
    assert lam == pytest.approx(20.0, rel=0.15)


def test_itl_includes_the_gap_before_a_request_first_decodes(flat_profile: Path, traces_07: Path) -> None:
    # vLLM's ITL counts every gap between chunks, including the KV transfer and queueing
    # between the prefill's first token and the first decode step.
    sets = [f"profile={flat_profile}", f"traces={traces_07}", "policy.gamma=3", "workload.concurrency=1",
            "cluster.prefill.kv_transfer_s=0.2", "run.duration_s=60", "run.warmup_s=0", "run.cooldown_s=0"]
    res = simulate(*load_scenario(None, sets, "static"))
    req = res.requests
    per_gap_s = (req["finish_at"] - req["first_token_at"]).sum() / req["decode_steps"].sum()
    assert per_gap_s > 0.0101  # the transfer shows up
    assert res.summary["mean_itl_ms"] / 1e3 == pytest.approx(per_gap_s, rel=0.02)


def test_closed_loop_users_send_the_same_requests_under_every_policy(
    sloped_profile: Path, varied_traces: Path
) -> None:
    # Paired comparisons: at one seed, user u's k-th request is the same whatever the policy.
    base = [f"profile={sloped_profile}", f"traces={varied_traces}", "workload.concurrency=8",
            "run.duration_s=6"]
    runs = []
    for gamma in (0, 5):
        req = simulate(*load_scenario(None, [*base, f"policy.gamma={gamma}"], "static")).requests
        req = req.sort_values(["user", "arrival_at"])
        req["k"] = req.groupby("user").cumcount()  # the user's k-th finished request
        runs.append(req[["user", "k", "trace_request", "prompt_tokens"]])
    both = runs[0].merge(runs[1], on=["user", "k"], suffixes=("_a", "_b"))
    assert len(both) >= 16  # the faster policy finishes more, the slower at least these
    assert (both["trace_request_a"] == both["trace_request_b"]).all()
    assert (both["prompt_tokens_a"] == both["prompt_tokens_b"]).all()
