"""Closed-form checks: where queueing and acceptance have exact answers, the simulator must
reproduce them, or its figures for the hard cases cannot be trusted either."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sparksim.sim.runner import load_scenario, simulate


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


def test_one_request_at_a_time_queues_as_m_d_1(flat_profile: Path, traces_07: Path) -> None:
    # Why: a queue that admits too many, serves out of order or mis-times a request changes
    # waiting times; Pollaczek–Khinchine gives them exactly for this queue. One request at a
    # time on a colocated engine with a flat 10 ms step and fixed lengths (a 64-token prompt
    # in one prefill step that emits the first token, then 4 plain decode steps) is a
    # deterministic server, D = 5 steps = 50 ms, fed by Poisson arrivals: an M/D/1 queue.
    step_s, service_s, rate = 0.010, 0.050, 12.0
    rho = rate * service_s  # 0.6
    sets = [f"profile={flat_profile}", f"traces={traces_07}", "policy.gamma=0",
            "workload.kind=poisson", f"workload.rate={rate}", "cluster.prefill.mode=colocated",
            "cluster.max_concurrency=1", "workload.lengths.source=lognormal",
            "workload.lengths.output.min=5", "workload.lengths.output.max=5",
            "workload.lengths.prompt.min=64", "workload.lengths.prompt.max=64",
            "run.duration_s=1600", "run.warmup_s=50", "run.cooldown_s=50", "seed=0"]
    req = simulate(*load_scenario(None, sets, "static")).requests
    req = req[(req["arrival_at"] >= 50.0) & (req["arrival_at"] < 1550.0)].sort_values("arrival_at")
    wait_s = (req["first_token_at"] - step_s - req["arrival_at"]).to_numpy()  # queueing only
    response_s = (req["finish_at"] - req["arrival_at"]).to_numpy()
    # every request is served in exactly D, first come first served
    np.testing.assert_allclose(req["finish_at"] - req["first_token_at"] + step_s, service_s, rtol=1e-9)
    assert (np.diff(req["first_token_at"].to_numpy()) >= service_s - 1e-9).all()
    assert wait_s.min() > -1e-9
    # P-K for M/D/1: Wq = ρ·D / (2(1 − ρ)) = 37.5 ms; a Poisson arrival finds the server idle
    # with probability 1 − ρ (PASTA). Tolerances: 30 seeds of this 1500 s window gave sd
    # 1.15 ms on the mean wait and 0.0041 on the idle share (means 37.7 ms, 0.399); 4 sd.
    wq_s = rho * service_s / (2 * (1 - rho))
    assert wait_s.mean() == pytest.approx(wq_s, abs=4 * 1.15e-3)
    assert response_s.mean() == pytest.approx(wq_s + service_s, abs=4 * 1.15e-3)
    assert (wait_s < 1e-9).mean() == pytest.approx(1 - rho, abs=4 * 0.0041)
    assert len(req) == pytest.approx(rate * 1500.0, rel=0.03)


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


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("case", ["preemption", "preemption-and-context-cap", "engine-loop-time"])
def test_the_itl_gaps_add_up_to_every_requests_decoding_time(
        case: str, flat_profile: Path, traces_07: Path) -> None:
    # Each decode step a request runs ends one gap, so when every request finishes inside the
    # window its gaps sum to finish − first token, whatever happened in between: a preemption
    # (the gap runs from the last emission, not from the preemption), steps it sat out under
    # the context cap, or the engine loop's host time before each step (cost_model.loop_ms).
    sets = ["run.warmup_s=0", "run.cooldown_s=0", "workload.kind=poisson", "run.duration_s=10000"]
    if case == "engine-loop-time":  # the shipped CPU profile has a loop table
        sets += [f"profile={REPO / 'profiles/cpu-tinylm-d128-live-measured'}",
                 f"traces={REPO / 'traces/tinylm-d128-l6-dspark-recorded'}", "workload.rate=5",
                 "run.max_requests=20", "cluster.prefill.mode=colocated"]
    else:
        sets += [f"profile={flat_profile}", f"traces={traces_07}", "workload.rate=50",
                 "run.max_requests=60", "cluster.kv_capacity_tokens=6000"]
        if case == "preemption-and-context-cap":
            sets.append("cluster.max_context_tokens=3000")
    res = simulate(*load_scenario(None, sets, "static:gamma=3"))
    req = res.requests
    assert len(req) == int(load_scenario(None, sets)[0].run.max_requests or 0)  # all finished
    if case != "engine-loop-time":
        assert req["preemptions"].sum() > 0
    decoding_s = float((req["finish_at"] - req["first_token_at"]).sum())
    gaps = int(req["decode_steps"].sum())
    assert res.summary["mean_itl_ms"] / 1e3 * gaps == pytest.approx(decoding_s, rel=1e-9)


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
