"""A step costs what a real engine pays: its drafter's positions, its requests' KV, its prompt chunks.

Every scheduler comparison is a comparison of step costs, so each pricing term gets a
closed-form check against the profile it reads, on recorded steps of real runs.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sparksim.config import REPO_ROOT
from sparksim.cost.profile import ProfileWarning, check_profile, load_profile
from sparksim.errors import ConfigError, FormatError, RangeError
from sparksim.sim.runner import RunResult, load_inputs, load_scenario, simulate

H100 = REPO_ROOT / "profiles" / "h100-qwen3-8b-analytic"


def _run(policy: str, *sets: str, users: int = 8, duration: float = 3.0) -> RunResult:
    closed = not any(s.startswith("workload.kind=") and s != "workload.kind=closed" for s in sets)
    users_set = [f"workload.concurrency={users}"] if closed else []  # an open loop has no users
    sc, base = load_scenario(None, [*users_set, f"run.duration_s={duration}", *sets], policy)
    return simulate(sc, base)


def _steps(result: RunResult) -> pd.DataFrame:
    assert result.steps is not None
    return result.steps[result.steps["num_requests"] > 0]


@pytest.mark.parametrize("gamma", [1, 3, 7])
def test_static_gamma_drafts_gamma_positions_and_plain_decoding_drafts_nothing(gamma: int) -> None:
    # Why: MTP-γ must not pay for a block it never drafts; plain decoding runs no drafter.
    prof = load_profile(H100)
    steps = _steps(_run("static", f"policy.gamma={gamma}", "policy.drafter=mtp-1"))
    want = [prof.draft_step_s(int(r), gamma, "mtp-1", float(k))
            for r, k in zip(steps["num_requests"], steps["kv_tokens"], strict=True)]
    np.testing.assert_allclose(steps["draft_s"], want, rtol=1e-12)
    plain = _steps(_run("static", "policy.gamma=0"))
    assert (plain["draft_s"] == 0).all()


def test_an_mtp_drafter_costs_gamma_passes_a_block_drafter_one() -> None:
    prof = load_profile(H100)
    one, three = (prof.draft_s_scalar(64, p, "mtp-1") for p in (1, 3))
    assert three == pytest.approx(3 * one, rel=1e-6)
    b1, b7 = (prof.draft_s_scalar(64, p, "dspark-5") for p in (1, 7))
    assert b1 < b7 < 3 * b1


def test_block_policies_pay_the_whole_block() -> None:
    prof = load_profile(H100)
    steps = _steps(_run("two-step"))
    want = [prof.draft_step_s(int(r), 7, None, float(k))
            for r, k in zip(steps["num_requests"], steps["kv_tokens"], strict=True)]
    np.testing.assert_allclose(steps["draft_s"], want, rtol=1e-12)


def test_a_decode_step_pays_dense_work_plus_every_requests_kv() -> None:
    # Why: plain decoding of R requests reads R requests' KV cache, never ceil(B/8)'s.
    prof = load_profile(H100)
    steps = _steps(_run("static", "policy.gamma=0", users=32))
    assert (steps["kv_tokens"] > 2 * steps["num_requests"]).all()  # prompts are in the KV
    want = [prof.verify_s_scalar(int(b)) + prof.attention_s(int(r), float(k))
            for b, r, k in zip(steps["batch_tokens"], steps["num_requests"], steps["kv_tokens"],
                               strict=True)]
    np.testing.assert_allclose(steps["verify_s"], want, rtol=1e-12)
    np.testing.assert_allclose(steps["kv_s"], [prof.attention_s(int(r), float(k)) for r, k in
                                               zip(steps["num_requests"], steps["kv_tokens"], strict=True)],
                               rtol=1e-12)


def test_a_colocated_prompt_is_chunked_and_each_chunk_pays_attention_to_its_prefix(tmp_path: Path) -> None:
    # Why: prefill attention is quadratic in the prompt; chunk k of q tokens after p costs
    # coef·((p+q)² − p²), so the chunks add up to one whole prompt's coef·L².
    csv = tmp_path / "a.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,5000,4\n")
    res = _run("static", "policy.gamma=0", "workload.kind=replay", f"workload.arrivals_csv={csv}",
               "cluster.prefill.mode=colocated", "cluster.prefill.chunk_tokens=2048")
    prof = load_profile(H100)
    assert res.steps is not None
    pre = res.steps[res.steps["prefill_tokens"] > 0]
    assert pre["prefill_tokens"].tolist() == [2048, 2048, 904]
    coef = prof.prefill_attention_coef_ms / 1e3
    want = [coef * ((p + q) ** 2 - p**2) for p, q in ((0, 2048), (2048, 2048), (4096, 904))]
    np.testing.assert_allclose(pre["kv_s"], want, rtol=1e-12)
    assert pre["kv_s"].sum() == pytest.approx(coef * 5000**2, rel=1e-12)
    np.testing.assert_allclose(pre["verify_s"] - pre["kv_s"],
                               [prof.verify_s_scalar(q) for q in (2048, 2048, 904)], rtol=1e-12)


def test_prefill_first_runs_prompts_whole_while_the_batch_waits(tmp_path: Path) -> None:
    csv = tmp_path / "a.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,3000,40\n0.05,3000,40\n")
    res = _run("static", "policy.gamma=0", "workload.kind=replay", f"workload.arrivals_csv={csv}",
               "cluster.prefill.mode=colocated", "cluster.prefill.schedule=prefill-first")
    assert res.steps is not None
    pre = res.steps[res.steps["prefill_tokens"] > 0]
    assert pre["prefill_tokens"].tolist() == [3000, 3000]  # unchunked
    assert (pre["num_requests"] == 0).all()  # a prompt-only iteration: the running one waits
    assert (res.requests["emitted_tokens"] == 40).all()


def test_kv_capacity_defaults_to_what_the_card_memory_leaves() -> None:
    prof = load_profile(H100)
    mem = prof.card["memory"]
    want = int((0.9 * mem["hbm_bytes"] - mem["weights_bytes"] - mem["activation_reserve_bytes"])
               // mem["kv_bytes_per_token"])
    summary = _run("static", "policy.gamma=0").summary
    assert summary["cost"]["kv_capacity_tokens"] == want
    assert summary["cost"]["kv_capacity_source"] == "card memory figures"
    half = _run("static", "policy.gamma=0", "cluster.gpu_memory_utilization=0.5").summary
    assert half["cost"]["kv_capacity_tokens"] < want


def test_the_scenarios_memory_utilisation_is_the_one_a_card_is_held_to(tmp_path: Path) -> None:
    # Why: 0.9 was written in four places, so a card that fits only at 0.95 was refused even
    # when the scenario set 0.95. The card is refused only when no utilisation holds its
    # weights; a run checks it at the scenario's figure.
    tight = tmp_path / "p"
    tight.mkdir()
    for f in H100.iterdir():
        (tight / f.name).write_bytes(f.read_bytes())
    card = yaml.safe_load((tight / "card.yaml").read_text())
    card["memory"].update(hbm_bytes=100e9, weights_bytes=92e9, activation_reserve_bytes=0)
    (tight / "card.yaml").write_text(yaml.safe_dump(card))
    assert check_profile(tight) == []
    with pytest.raises(FormatError, match=r"utilisation 0\.9 cannot hold"):
        _run("static", f"profile={tight}", "policy.gamma=0")
    summary = _run("static", f"profile={tight}", "policy.gamma=0", "cluster.gpu_memory_utilization=0.95").summary
    assert summary["cost"]["kv_capacity_tokens"] == int(3e9 // card["memory"]["kv_bytes_per_token"])


def test_card_memory_that_cannot_hold_the_weights_is_an_error_naming_the_fields(tmp_path: Path) -> None:
    bad = tmp_path / "p"
    bad.mkdir()
    for f in H100.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    card = yaml.safe_load((bad / "card.yaml").read_text())
    card["memory"]["hbm_bytes"] = 1e9
    (bad / "card.yaml").write_text(yaml.safe_dump(card))
    problems = " ".join(check_profile(bad))
    assert "memory.hbm_bytes=1000000000.0" in problems and "memory.weights_bytes" in problems
    with pytest.raises(FormatError):
        load_profile(bad)


def test_a_drafter_the_profile_lacks_is_an_error_naming_both() -> None:
    sc, base = load_scenario(None, ["policy.gamma=1", "policy.drafter=medusa"], "static")
    with pytest.raises(ConfigError, match=r"policy.drafter='medusa'.*h100-qwen3-8b-analytic.*dspark-5"):
        load_inputs(sc, base)


def test_a_draft_table_short_of_positions_extrapolates_with_one_warning(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.mkdir()
    for f in H100.iterdir():
        (short / f.name).write_bytes(f.read_bytes())
    table = pd.read_csv(short / "draft-mtp-1.csv")
    table[table["positions"] <= 3].to_csv(short / "draft-mtp-1.csv", index=False)
    sets = [f"profile={short}", "policy.gamma=5", "policy.drafter=mtp-1"]
    sc, base = load_scenario(None, [*sets, "run.duration_s=2"], "static")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        simulate(sc, base)
    about = [w for w in caught if "profiled up to 3" in str(w.message)]
    assert len(about) == 1 and issubclass(about[0].category, ProfileWarning)
    with pytest.raises(RangeError, match="profiled up to 3"):
        load_inputs(sc, base, strict=True)
    prof = load_profile(short)
    assert prof.draft_s_scalar(8, 5, "mtp-1") == pytest.approx(5 / 3 * prof.draft_s_scalar(8, 3, "mtp-1"),
                                                               rel=1e-3)


def test_asking_for_more_users_than_the_engine_runs_warns_and_is_recorded() -> None:
    sc, base = load_scenario(None, ["workload.concurrency=300", "run.duration_s=1"], "static")
    with pytest.warns(ProfileWarning, match="concurrency=300"):
        summary = simulate(sc, base).summary
    assert summary["cost"]["concurrency_capped"] is True


def test_a_finite_open_loop_run_ends_when_its_last_request_finishes() -> None:
    res = _run("static", "policy.gamma=0", "workload.kind=poisson", "workload.rate=20",
               "run.max_requests=30", "run.warmup_s=0", "run.cooldown_s=0", duration=600.0)
    last = float(res.requests["finish_at"].max())
    assert len(res.requests) == 30
    assert res.summary["ended"]["at_s"] == pytest.approx(last) and last < 60
    assert res.summary["window"]["length_s"] == pytest.approx(last)
    tokens = int(res.requests["emitted_tokens"].sum())
    assert res.summary["output_throughput"] == pytest.approx(tokens / last, rel=1e-9)
    assert float(res.requests["arrival_at"].min()) == 0.0  # the first request arrives at t = 0


def test_a_run_that_ends_before_its_warm_up_does_has_an_empty_window_and_says_so() -> None:
    # The default warm-up is 10 % of the horizon; a short finite run can end inside it. Its
    # window must be empty, its rates NaN and a warning say how to measure the busy period,
    # never a negative window and throughputs of -0.0.
    with pytest.warns(UserWarning, match="before its warm-up did.*run.warmup_s=0"):
        res = _run("static", "policy.gamma=0", "workload.kind=poisson", "workload.rate=20",
                   "run.max_requests=5", duration=600.0)
    s = res.summary
    assert s["ended"]["at_s"] < 60.0 and s["window"]["length_s"] == 0.0
    for rate in ("output_throughput", "request_throughput", "tput_per_gpu"):
        assert math.isnan(s[rate]), rate
    assert s["steady_requests"] == 0 and math.isnan(s["mean_ttft_ms"])


def test_a_legacy_grid_profile_runs_converted_and_says_how(traces_07: Path, tmp_path: Path) -> None:
    # Why: a context grid is converted on load to dense + attention tables, so the engine
    # prices it by the one rule; a run on it must say so (a warning, the summary's kv_model).
    from sparksim.cost.profile import write_profile

    rows = [(t, c, 5 + t / 100 + c / 1000) for c in (1024, 4096) for t in (1, 64, 512, 8192)]
    card = {"source": "synthetic", "hardware": "t", "model": "t", "dtype": "bf16",
            "date": "2026-11-30", "command": "tests/test_step_pricing.py", "tokens_per_request": 8}
    grid = write_profile(tmp_path / "grid", pd.DataFrame(rows, columns=["tokens", "context", "step_ms"]),
                         card)
    sc, base = load_scenario(None, [f"profile={grid}", f"traces={traces_07}", "run.duration_s=2",
                                    "policy.gamma=0"], "static")
    with pytest.warns(ProfileWarning, match="converted on load from a legacy context grid"):
        res = simulate(sc, base)
    assert res.summary["cost"]["kv_model"] == "converted-grid"


def test_a_shorter_block_replays_the_first_positions_of_the_traces_exactly() -> None:
    # Why: DSpark-5 from γ = 7 traces: a block of 5 drafts the same first five tokens, and
    # its accepted count is the first rejection or the block's end.
    from sparksim.config import REPO_ROOT as root
    from sparksim.traces.format import load_traceset

    full = load_traceset(root / "traces" / "synth-dspark-qwen3-8b")
    five = full.truncated(5)
    assert five.gamma == 5 and five.card["truncated_from_gamma"] == full.gamma
    np.testing.assert_array_equal(five.conf, full.conf[:, :5])
    np.testing.assert_array_equal(five.accepted, np.minimum(full.accepted, 5))
    summary = _run("two-step", "trace_block=5").summary
    assert summary["gamma"] == 5 and summary["verify_budget_per_request"] <= 6
    with pytest.raises(ConfigError, match="trace_block=9"):
        full.truncated(9)
