"""The live engine's profile: its fits recover known costs, it loads, and the simulator prices what it says.

`sparksim profile live` times the live engine's own step functions; the simulator must then
charge exactly the terms the card declares: attention FLOPs that add (`attention_compute:
sum`) rather than overlap, and a per-policy decision time (`cluster.decision_s: profile`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sparksim.config import parse_scenario
from sparksim.cost.profile import load_profile, write_profile
from sparksim.errors import ConfigError
from sparksim.sim.runner import load_inputs, simulate


def _points(coef: tuple[float, ...], draft: tuple[float, ...]) -> pd.DataFrame:
    rows = []
    c0, c1, c2, c3, c4, c5, c6 = coef
    d0, d1, d2, d3, d4 = draft
    for r in (1, 2, 4, 8, 16, 32):
        for c in (64, 256, 640):
            for p in range(8):
                t, k = r * (1 + p), r * (c + 1)
                rows.append({"requests": r, "context": c, "positions": p, "tokens": t, "kv_tokens": k,
                             "verify_ms": c0 + c1 * t + c2 * r + c3 * k + c4 * t * k / r
                             + ((c5 + c6 * r) if p else 0.0),
                             "draft_ms": (d0 + d1 * r + d2 * r * p + d3 * p + d4 * k) if p else 0.0})
    return pd.DataFrame(rows)


def test_decode_fits_recover_the_costs_that_made_the_points() -> None:
    """A fit that cannot find known coefficients in noiseless points would misprice every step."""
    from sparksim.live.fits import fit_decode

    known = (3.0, 0.05, 0.1, 3e-4, 1.5e-4, 0.5, 0.02)  # the last two: verifying any draft (c5 + c6·R)
    c0, c1, c2, c3, c4, c5, c6 = known
    points = _points(known, (1.5, 0.04, 0.035, 0.1, 5e-4))
    verify, draft = fit_decode(points)
    coef = dict(zip(verify.names, verify.coef, strict=True))
    # the shared terms come out as made; each (R, C) cell's term holds what the line put there
    assert [coef[k] for k in ("c1_per_token", "c4_per_query_kv_token", "c5_with_drafts",
                              "c6_per_request_with_drafts")] == pytest.approx([c1, c4, c5, c6], rel=1e-6)
    for r, c in {(int(a), int(b)) for a, b in zip(points["requests"], points["context"], strict=True)}:
        assert coef[f"a_R{r}_C{c}"] == pytest.approx(c0 + c2 * r + c3 * r * (c + 1), rel=1e-6)
    assert draft is not None and np.allclose(draft.coef, (1.5, 0.04, 0.035, 0.1, 5e-4), rtol=1e-6)
    assert max(abs(x) for x in verify.rel_residuals) < 1e-9


def test_the_verify_fit_keeps_a_kv_read_that_is_not_one_line_in_r_and_k() -> None:
    """Measured KV reads bend (caches): 32 requests at 640 tokens cost more than a line through
    the rest says. Each (R, C) cell keeps its own term, so the fit and the table hold it."""
    from sparksim.live.fits import fit_decode, verify_tables

    points = _points((3.0, 0.05, 0.1, 3e-4, 1.5e-4, 0.5, 0.02), (1.5, 0.04, 0.035, 0.1, 5e-4))
    bent = (points["requests"] == 32) & (points["context"] == 640)
    points.loc[bent, "verify_ms"] += 4.0
    verify, _ = fit_decode(points)
    assert max(abs(x) for x in verify.rel_residuals) < 1e-9
    _, attention = verify_tables(verify, points)
    row = attention[attention["requests"] == 32].set_index("kv_tokens")["attn_ms"]
    assert row[32 * 641] == pytest.approx(3.0 + 0.1 * 32 + 3e-4 * 32 * 641 + 4.0, rel=1e-6)
    assert row[32 * 257] == pytest.approx(3.0 + 0.1 * 32 + 3e-4 * 32 * 257, rel=1e-6)


def test_refit_redoes_the_verify_fit_from_points_and_keeps_the_rest(tmp_path: Path) -> None:
    """A better verify model needs no new measurement: points.csv holds every measured point."""
    from sparksim.live.fits import refit_verify

    prof = _with_loop(_profile(tmp_path, adds=True), LOOP)
    known = (2.5, 0.04, 0.06, 4e-4, 1.3e-4, 0.5, 0.015)
    _points(known, (1.5, 0.04, 0.035, 0.1, 5e-4)).to_csv(prof / "points.csv", index=False)
    card = yaml.safe_load((prof / "card.yaml").read_text())
    card["grid"] = {"requests": [1, 2, 4, 8, 16, 32]}
    (prof / "card.yaml").write_text(yaml.safe_dump(card))
    refit_verify(prof, "cmd")
    loaded = load_profile(prof)
    assert loaded.verify_drafts_ms == pytest.approx((0.5, 0.015), rel=1e-6)
    # the fixed cost moved from the dense table into each cell's term: a step's sum is the same
    assert loaded.verify_s_scalar(1) * 1e3 == pytest.approx(0.04, rel=1e-6)
    assert loaded.attention_s(4, 1000) * 1e3 == pytest.approx(2.5 + 0.06 * 4 + 4e-4 * 1000, rel=1e-6)
    assert loaded.step_limit == 0.0  # the live engine runs eagerly: no batch pads up
    assert loaded.loop_table and loaded.card["refit"]["command"] == "cmd"
    assert (prof / "draft-d.csv").is_file()


def test_verifying_any_draft_pays_the_drafts_overhead_in_the_engine_and_the_policies(tmp_path: Path) -> None:
    """cost_model.verify_drafts_ms: a + b·R once a step verifies a draft; a policy prices it too."""
    from sparksim.policies import make_policy
    from sparksim.policies.base import StepBatch, StepCost

    prof_dir = _profile(tmp_path, adds=True)
    card = yaml.safe_load((prof_dir / "card.yaml").read_text())
    card["cost_model"]["verify_drafts_ms"] = {"a_ms": 0.5, "b_ms_per_request": 0.02}
    (prof_dir / "card.yaml").write_text(yaml.safe_dump(card))
    prof = load_profile(prof_dir, mode="linear")  # as the scenarios here look it up
    by_gamma = {}
    for gamma in (0, 3):
        sc = _scenario(prof_dir)
        sc["policy"] = {"name": "static", "gamma": gamma}
        res = simulate(parse_scenario(sc))
        assert res.steps is not None
        by_gamma[gamma] = res.steps[res.steps["num_requests"] > 0].iloc[2]
    for gamma, s in by_gamma.items():
        m, t, k = int(s["num_requests"]), int(s["batch_tokens"]), int(s["kv_tokens"])
        want = 2.0 + (t - 1) * 0.05 + 1e-4 * k + 2e-4 * t * k / m + ((0.5 + 0.02 * m) if gamma else 0.0)
        assert s["verify_s"] * 1e3 == pytest.approx(want, rel=1e-9)
    # the policies' step cost jumps by the same amount at the first verified draft
    cost = StepCost.for_decode(prof, 4, 400.0, 7, "d")
    steps = cost.step_s([4, 5, 6]) * 1e3
    assert steps[1] - steps[0] == pytest.approx(0.05 + 2e-4 * 100 + 0.5 + 0.02 * 4, rel=1e-9)
    assert steps[2] - steps[1] == pytest.approx(0.05 + 2e-4 * 100, rel=1e-9)
    # an overhead no single draft's gain repays: greedy verifies nothing; without it, it does
    batch = StepBatch.from_conf(np.full((4, 7), 0.3), prof)
    heavy = StepCost.for_decode(prof, 4, 400.0, 7, "d")
    heavy.drafts_s = 1.0  # a second per step: nothing is worth it
    batch.cost = heavy
    assert make_policy("greedy", 7, {}).decide(batch).sum() == 0
    free = StepCost.for_decode(prof, 4, 400.0, 7, "d")
    free.drafts_s = 0.0
    batch.cost = free
    assert make_policy("greedy", 7, {}).decide(batch).sum() > 0


def test_a_bad_drafts_overhead_is_named(tmp_path: Path) -> None:
    from sparksim.cost.profile import check_profile

    prof = _profile(tmp_path, adds=True)
    card = yaml.safe_load((prof / "card.yaml").read_text())
    card["cost_model"]["verify_drafts_ms"] = {"a_ms": 0.5}
    (prof / "card.yaml").write_text(yaml.safe_dump(card))
    assert "verify_drafts_ms" in " ".join(check_profile(prof))


def _profile(tmp: Path, *, adds: bool, decision: dict[str, dict[str, float]] | None = None) -> Path:
    verify = pd.DataFrame({"tokens": [1, 4096], "step_ms": [2.0, 2.0 + 4095 * 0.05]})
    attention = pd.DataFrame({"kv_tokens": [0, 1_000_000], "attn_ms": [0.0, 100.0]})  # 1e-4 ms per KV token
    cm: dict[str, object] = {"attention_ms_per_query_kv_token": 2e-4,
                             "attention_compute": "sum" if adds else "max"}
    if decision is not None:
        cm["decision_ms"] = decision
    card = {"source": "synthetic", "hardware": "test", "model": "test", "dtype": "fp32", "date": "2026-11-30",
            "command": "test", "cost_model": cm,
            "drafters": {"d": {"file": "draft-d.csv", "kind": "block", "num_layers": 1, "gamma": 7}},
            "default_drafter": "d"}
    draft = pd.DataFrame([{"positions": p, "requests": r, "draft_ms": 1.0} for p in (1, 7) for r in (1, 64)])
    return write_profile(tmp / ("sum" if adds else "max"), verify, card,
                         extra={"attention.csv": attention, "draft-d.csv": draft})


def _scenario(profile: Path, **cluster: object) -> dict[str, object]:
    return {"profile": str(profile), "traces": "traces/synth-dspark-qwen3-8b", "lookup": "linear",
            "cluster": {"max_concurrency": 4, "prefill": {"mode": "colocated", "schedule": "prefill-first"},
                        **cluster},
            "workload": {"kind": "closed", "concurrency": 4}, "policy": {"name": "static", "gamma": 3},
            "run": {"duration_s": 2.0}}


def test_attention_flops_add_to_the_kv_term_when_the_card_says_sum(tmp_path: Path) -> None:
    """A CPU pays the KV term and the attention FLOPs one after the other; a GPU overlaps them (max)."""
    steps = {}
    for adds in (True, False):
        res = simulate(parse_scenario(_scenario(_profile(tmp_path, adds=adds))))
        assert res.steps is not None
        steps[adds] = res.steps[res.steps["num_requests"] > 0].iloc[0]
    s = steps[True]
    m, t, k = int(s["num_requests"]), int(s["batch_tokens"]), int(s["kv_tokens"])
    kv_ms, flops_ms = 1e-4 * k, 2e-4 * t * k / m
    dense_ms = 2.0 + (t - 1) * 0.05
    assert s["verify_s"] * 1e3 == pytest.approx(dense_ms + kv_ms + flops_ms, rel=1e-9)
    assert steps[False]["verify_s"] * 1e3 == pytest.approx(dense_ms + max(kv_ms, flops_ms), rel=1e-9)


def test_a_padded_attention_engine_pays_for_the_longest_context(tmp_path: Path) -> None:
    """cost_model.attention_kv=padded: R × the longest context (and the longest block), not the sum."""
    prof = _profile(tmp_path, adds=True)
    card = yaml.safe_load((prof / "card.yaml").read_text())
    card["cost_model"]["attention_kv"] = "padded"
    (prof / "card.yaml").write_text(yaml.safe_dump(card))
    assert load_profile(prof).attention_kv_padded
    res = simulate(parse_scenario(_scenario(prof)))
    assert res.steps is not None
    s = res.steps[res.steps["num_requests"] > 0].iloc[3]
    m, t, k = int(s["num_requests"]), int(s["batch_tokens"]), int(s["kv_tokens"])
    assert s["verify_s"] * 1e3 > 2.0 + (t - 1) * 0.05 + 1e-4 * k + 2e-4 * t * k / m  # more than the sum
    # contexts differ across the batch's requests, so padding costs more per step than the sum
    summed = simulate(parse_scenario(_scenario(_profile(tmp_path / "s", adds=True))))
    assert summed.steps is not None
    per_step = [float(r[r["num_requests"] > 0]["verify_s"].mean()) for r in (res.steps, summed.steps)]
    assert per_step[0] > per_step[1]


def test_a_profiled_decision_time_is_charged_per_step(tmp_path: Path) -> None:
    """cluster.decision_s=profile charges a + b·R of the card's decision_ms for the run's policy."""
    prof = _profile(tmp_path, adds=True, decision={"static": {"a_ms": 0.25, "b_ms_per_request": 0.01}})
    assert load_profile(prof).decision_s("static", 4) == pytest.approx(0.29e-3)
    res = simulate(parse_scenario(_scenario(prof, pipeline="sync", decision_s="profile")))
    assert res.steps is not None
    decode = res.steps[res.steps["num_requests"] > 0]
    want = (0.25 + 0.01 * decode["num_requests"]) / 1e3
    assert np.allclose(decode["decision_s"], want)
    # a policy the card has no decision time for is refused before simulating
    sc = _scenario(prof, pipeline="sync", decision_s="profile")
    sc["policy"] = {"name": "greedy"}
    with pytest.raises(ConfigError, match="no decision time for policy 'greedy'"):
        load_inputs(parse_scenario(sc))


def test_a_bad_decision_table_or_attention_mode_is_named(tmp_path: Path) -> None:
    from sparksim.cost.profile import check_profile

    prof = _profile(tmp_path, adds=True)
    card = yaml.safe_load((prof / "card.yaml").read_text())
    card["cost_model"]["attention_compute"] = "both"
    card["cost_model"]["decision_ms"] = {"static": {"a_ms": -1}}
    (prof / "card.yaml").write_text(yaml.safe_dump(card))
    problems = " ".join(check_profile(prof))
    assert "attention_compute='both'" in problems
    assert "decision_ms.static" in problems


LOOP = {"plain": {"decode": {"a_ms": 0.05, "b_ms_per_request": 0.01},
                  "prefill": {"a_ms": 0.3, "b_ms_per_request": 0.02}},
        "drafting": {"decode": {"a_ms": 0.1, "b_ms_per_request": 0.005},
                     "prefill": {"a_ms": 0.4, "b_ms_per_request": 0.0}}}


def _with_loop(prof: Path, loop: object) -> Path:
    card = yaml.safe_load((prof / "card.yaml").read_text())
    card["cost_model"]["loop_ms"] = loop
    (prof / "card.yaml").write_text(yaml.safe_dump(card))
    return prof


@pytest.mark.parametrize(("policy", "mode"), [({"name": "static", "gamma": 3}, "drafting"),
                                              ({"name": "static", "gamma": 0}, "plain")])
def test_the_engine_loop_waits_before_each_step_as_the_card_says(
        tmp_path: Path, policy: dict[str, object], mode: str) -> None:
    """cost_model.loop_ms: the idle time before a decode step (a + b·R) and before a prompt-only step."""
    prof = _with_loop(_profile(tmp_path, adds=True), LOOP)
    assert load_profile(prof).loop_s(mode == "drafting", "prefill", 4) == pytest.approx(
        (LOOP[mode]["prefill"]["a_ms"] + 4 * LOOP[mode]["prefill"]["b_ms_per_request"]) / 1e3)
    sc = _scenario(prof)
    sc["policy"] = policy
    res = simulate(parse_scenario(sc))
    steps = res.steps
    assert steps is not None and res.violations == []
    gap = (steps["start_at"].shift(-1) - steps["start_at"] - steps["step_s"]).to_numpy()[:-1] * 1e3
    nxt = steps.iloc[1:]
    decode = (nxt["num_requests"] > 0).to_numpy()
    fit = LOOP[mode]
    want = np.where(decode, fit["decode"]["a_ms"] + fit["decode"]["b_ms_per_request"] * nxt["num_requests"],
                    fit["prefill"]["a_ms"])  # before a prompt-only step: b·R of the still-running ones
    if mode == "drafting":  # prefill b is 0, so every gap is known exactly
        np.testing.assert_allclose(gap, want, rtol=1e-9, atol=1e-9)
    else:
        np.testing.assert_allclose(gap[decode], want[decode], rtol=1e-9, atol=1e-9)
        assert (gap[~decode] >= fit["prefill"]["a_ms"] - 1e-9).all() and (~decode).any()
    # the same run without the loop has no gaps and more steps in the same horizon
    bare = simulate(parse_scenario(_scenario(_profile(tmp_path / "bare", adds=True)) | {"policy": policy}))
    assert bare.steps is not None and len(bare.steps) > len(steps)


def test_loop_gaps_reads_the_idle_time_before_each_step() -> None:
    from sparksim.sim.metrics import step_gaps

    steps = pd.DataFrame({"start_at": [0.0, 0.010, 0.0152, 0.030], "step_s": [0.009, 0.005, 0.004, 0.004],
                          "prefill_tokens": [80, 0, 0, 40], "num_requests": [0, 3, 3, 0]})
    gaps = step_gaps(steps)
    assert gaps["kind"].tolist() == ["decode", "decode", "prefill"]
    assert gaps["requests"].tolist() == [3, 3, 3]
    np.testing.assert_allclose(gaps["gap_ms"], [1.0, 0.2, 10.8], atol=1e-9)


def test_a_bad_loop_table_is_named(tmp_path: Path) -> None:
    from sparksim.cost.profile import check_profile

    prof = _with_loop(_profile(tmp_path, adds=True),
                      {"plain": {"decode": {"a_ms": -0.1, "b_ms_per_request": 0.0}}, "fast": {}})
    problems = " ".join(check_profile(prof))
    assert "loop_ms.plain.decode" in problems and "loop_ms.fast" in problems


def test_profile_live_runs_end_to_end_on_tiny_models(tmp_path: Path) -> None:
    """The command measures, fits, writes a profile that loads with a drafter and decision times."""
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from sparksim.cli import app

    from ._drafter_fixtures import save_pair

    target, drafter = save_pair(tmp_path)
    out = tmp_path / "prof"
    res = CliRunner().invoke(app, [
        "profile", "live", "--target", str(target), "--drafter", str(drafter), "--requests", "1,3",
        "--contexts", "8,24", "--prompt-lengths", "4,8,16", "--replays", "1", "--warmup", "0",
        "--rounds", "1", "--loop-traces", "", "--out", str(out)])
    assert res.exit_code == 0, res.output
    prof = load_profile(out)
    assert prof.source == "measured" and prof.attention_compute_adds
    assert set(prof.decision_table) >= {"static", "greedy", "argmax", "two-step"}
    assert prof.drafters and prof.card["default_drafter"] == "dspark-1"
    points = pd.read_csv(out / "points.csv")
    assert len(points) == 2 * 2 * 5  # R x C x positions 0..γ (γ = 4)
    assert (points["verify_ms"] > 0).all()
    assert "sparksim profile live" in prof.card["command"]


def test_the_live_attention_table_reaches_past_any_batch_a_run_holds() -> None:
    # The loader holds the last request row's cost past it, so rows that stopped at the largest
    # measured R froze the per-request cost there; the rows reach 16,384 requests on the last
    # two measured rows' slope in R.
    from sparksim.live.fits import fit_decode, verify_tables

    points = _points((1.0, 0.01, 0.05, 0.0005, 0.0, 0.0, 0.0), (1.5, 0.04, 0.035, 0.1, 5e-4))
    verify, _ = fit_decode(points)
    _, attention = verify_tables(verify, points)
    top = attention[attention["requests"] == attention["requests"].max()]
    assert int(top["requests"].iloc[0]) >= 16384
    at_zero = float(top.loc[top["kv_tokens"] == 0, "attn_ms"].iloc[0])
    # below every cell's K the row holds its shortest context's term, which moved 0.05 + 0.0005·65 a request
    assert at_zero == pytest.approx(1.0 + (0.05 + 0.0005 * 65) * int(top["requests"].iloc[0]), rel=1e-6)


def test_prompts_prefilled_together_pay_padded_attention_where_the_engine_pads() -> None:
    """The live engine attends over the batch padded to its longest prompt (one dense-mask call):
    two prompts of 100 and 500 tokens pay 2 × 500², not 100² + 500²; a paged engine pays the sum."""
    from sparksim.config import REPO_ROOT
    from sparksim.cost.pricing import StepCost

    live = load_profile(REPO_ROOT / "profiles" / "cpu-tinylm-d128-live-measured")
    paged = load_profile(REPO_ROOT / "profiles" / "a100-opt13b-distserve-published")
    assert live.attention_kv_padded and not paged.attention_kv_padded
    for prof, squares in ((live, 2 * 500**2), (paged, 100**2 + 500**2)):
        want = prof.prefill_attention_coef_ms * squares / 1e3
        step = StepCost.for_step(prof, requests=0, kv_tokens=0.0, chunks=[(100, 0), (500, 0)])
        assert step.kv_s == pytest.approx(want, rel=1e-12)
        assert prof.prefill_s([100, 500]) == pytest.approx(prof.prefill_dense_s(600) + want, rel=1e-12)
    # one prompt is its own longest
    one = StepCost.for_step(live, requests=0, kv_tokens=0.0, chunks=[(300, 0)])
    assert one.kv_s == pytest.approx(live.prefill_attention_s(300, 0), rel=1e-12)


def test_the_shipped_live_profile_charges_what_its_verify_fit_says_at_every_measured_point() -> None:
    """The tables (verify.csv, attention.csv, the card's terms) are the fit: the simulator's own
    step pricing at each measured decode point must give the fit's value there."""
    from sparksim.config import REPO_ROOT
    from sparksim.cost.pricing import StepCost
    from sparksim.live.fits import fit_decode

    prof_dir = REPO_ROOT / "profiles" / "cpu-tinylm-d128-live-measured"
    prof = load_profile(prof_dir)
    points = pd.read_csv(prof_dir / "points.csv")
    verify, _ = fit_decode(points)
    fitted = points["verify_ms"].to_numpy() * (1 + np.asarray(verify.rel_residuals))
    for (r, c, p), want in zip(points[["requests", "context", "positions"]].itertuples(index=False),
                               fitted, strict=True):
        cost = StepCost.for_decode(prof, int(r), float(r * (c + 1)), int(p), None, kv_longest=float(c + 1))
        got = cost.price(np.full(int(r), int(p), dtype=np.int64), int(r * p)).verify_s * 1e3
        assert got == pytest.approx(want, rel=1e-4), (r, c, p)  # the card keeps 5 significant figures
