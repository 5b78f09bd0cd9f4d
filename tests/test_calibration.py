"""Calibrating an analytic profile to measured runs (`sparksim profile calibrate`).

The fit must give back parameters it is shown runs of (simulated here with known values),
say when a parameter is pinned at a bound, read vLLM's own flags and bench files, and refuse
bad input with a message naming the file, the row or the parameter.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from sparksim.cli import app
from sparksim.errors import ConfigError, FormatError
from sparksim.studies.calibration import Calibrator
from sparksim.studies.measured_runs import (
    EngineSettings,
    MeasuredRun,
    engine_settings,
    load_run,
    parse_vllm_flags,
)
from sparksim.studies.run_replay import predict, replay_scenario, stability_margin, stage_table

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "profiles" / "h100-llama-2-7b-analytic"
SETTINGS = EngineSettings(max_num_seqs=64, max_num_batched_tokens=2048, kv_capacity_tokens=100_000,
                          max_model_len=4096, source="test")


def _requests(seed: int, rates: tuple[float, ...] = (4.0, 12.0), per_stage: int = 150) -> pd.DataFrame:
    """Poisson arrivals in load stages, lognormal prompts, outputs 20-200 tokens."""
    rng = np.random.default_rng(seed)
    parts, t = [], 0.0
    for stage, rate in enumerate(rates):
        gaps = rng.exponential(1.0 / rate, per_stage)
        arrivals = t + np.cumsum(gaps)
        t = float(arrivals[-1])
        parts.append(pd.DataFrame({
            "stage": stage, "arrival_s": arrivals,
            "prompt_tokens": np.clip(rng.lognormal(6.0, 0.6, per_stage), 16, 3000).astype(int),
            "output_tokens": rng.integers(20, 200, per_stage)}))
    df = pd.concat(parts, ignore_index=True)
    df["arrival_s"] -= df["arrival_s"].iloc[0]
    return df


def _measured(tmp: Path, name: str, truth: dict[str, float], seed: int) -> Path:
    """A 'measured' run: sparksim's own prediction with the `truth` parameters, written as a CSV."""
    req = _requests(seed)
    run = MeasuredRun(name, tmp / f"{name}.csv", req.assign(ttft_ms=0.0, e2e_ms=0.0, counted=True), SETTINGS)
    with Calibrator(BASE, [run], [k for k in truth]) as cal:
        prof = cal.profile_with(truth, tmp / f"truth-{name}")
    assert not cal.work.exists()  # its own working folder goes when it is done
    pred = predict(run, prof, tmp / "truth-work")
    extra = truth.get("request_overhead_ms", 0.0)
    out = req.assign(ttft_ms=pred["ttft_ms"] + extra, e2e_ms=pred["e2e_ms"] + extra)
    path = tmp / f"{name}.csv"
    out.to_csv(path, index=False)
    return path


def test_calibration_recovers_the_parameters_its_runs_were_simulated_with(tmp_path: Path) -> None:
    truth = {"compute_eff": 0.45, "mem_eff": 0.55, "request_overhead_ms": 30.0}
    runs = [load_run(_measured(tmp_path, f"run{i}", truth, seed=i), SETTINGS) for i in (1, 2)]
    cal = Calibrator(BASE, runs, list(truth), work=tmp_path / "fit")
    assert cal.defaults["compute_eff"] == 0.69 and cal.defaults["request_overhead_ms"] == 0.0
    result = cal.fit(max_steps=40)
    for k, v in truth.items():
        assert result.values[k] == pytest.approx(v, rel=0.02), (k, result.values)
    assert result.at_bound == {}
    assert result.stages["e2e_err"].abs().max() < 0.01


def test_a_parameter_the_runs_push_past_its_bound_is_reported_pinned(tmp_path: Path) -> None:
    # Runs of an engine with no per-step overhead and perfect bandwidth: with the default
    # 0.5 ms overhead kept, only mem_eff > 1 would match them, and 1 is its bound.
    truth = {"mem_eff": 1.0, "step_overhead_ms": 0.0}
    run = load_run(_measured(tmp_path, "fast", truth, seed=3), SETTINGS)
    result = Calibrator(BASE, [run], ["mem_eff"], work=tmp_path / "fit").fit(max_steps=20)
    assert result.at_bound == {"mem_eff": "upper"}
    assert result.card()["fitted"]["mem_eff"]["at_bound"] == "upper"


def test_overlapped_request_overhead_shifts_ttft_and_e2e_alike(tmp_path: Path) -> None:
    run = load_run(_measured(tmp_path, "plain", {"compute_eff": 0.69}, seed=4), SETTINGS)
    pred = predict(run, BASE, tmp_path / "w")
    plain, shifted = stage_table(run, pred), stage_table(run, pred, 25.0)
    np.testing.assert_allclose(shifted["ttft_sim"] - plain["ttft_sim"], 25.0)
    np.testing.assert_allclose(shifted["e2e_sim"] - plain["e2e_sim"], 25.0)


def test_the_stability_margin_brackets_where_the_queue_starts_to_grow(tmp_path: Path) -> None:
    run = load_run(_measured(tmp_path, "m", {"compute_eff": 0.69}, seed=5), SETTINGS)
    light = stability_margin(run, 0, BASE, tmp_path / "w", tol=0.05)
    heavy = stability_margin(run, 1, BASE, tmp_path / "w", tol=0.05)
    assert 1.0 < heavy < light  # the 12 req/s stage is closer to its edge than the 4 req/s one
    # at 1.1x the margin the stage's queue grows; at 0.9x it does not
    slow = EngineSettings(**{**SETTINGS.as_dict(), "max_num_seqs": 2})
    tight = MeasuredRun("tight", run.path, run.requests, slow)
    assert stability_margin(tight, 1, BASE, tmp_path / "w", tol=0.05) < 1.0


def test_the_vllm_flags_parser_reads_a_real_serve_command_and_its_kv_log_line() -> None:
    text = ("vllm serve meta-llama/Llama-2-7b-hf --tensor-parallel-size 2 --max-num-seqs 128 "
            "--max-num-batched-tokens=2048 --enable-prefix-caching --gpu-memory-utilization 0.9 "
            "--block-size 16 --max-model-len 4096 --disable-log-requests\n"
            "INFO 02-17 23:14:39 [kv_cache_utils.py:1087] GPU KV cache size: 119,408 tokens")
    got = parse_vllm_flags(text)
    assert got["tensor_parallel_size"] == 2 and got["max_num_seqs"] == 128
    assert got["max_num_batched_tokens"] == 2048 and got["block_size"] == 16
    assert got["max_model_len"] == 4096 and got["prefix_caching"] is True
    assert got["kv_capacity_tokens"] == 119_408
    assert got["ignored"] == ["--gpu-memory-utilization", "--disable-log-requests"]
    blocks = parse_vllm_flags("vllm serve m -tp 1 --num-gpu-blocks-override 100 --block-size 32 "
                              "--no-enable-prefix-caching")
    assert blocks["kv_capacity_tokens"] == 3200 and blocks["prefix_caching"] is False
    with pytest.raises(ConfigError, match="--max-num-seqs 'many'"):
        parse_vllm_flags("vllm serve m --max-num-seqs many")
    settings, ignored = engine_settings({**got, "model": "x"}, "flags")
    assert settings.kv_capacity_tokens == 119_408 and "model" in ignored


@pytest.mark.parametrize(("profile", "seqs", "tokens"), [
    ("h100-llama-2-7b-analytic", 1024, 8192),  # 81,559 MiB and no "A100" in the name
    ("a100-opt13b-vllm-published", 256, 2048),  # vLLM keeps an A100 to the small defaults
])
def test_unset_engine_limits_are_vllms_defaults_on_the_profiles_gpu(
        profile: str, seqs: int, tokens: int, tmp_path: Path) -> None:
    run = MeasuredRun("r", tmp_path / "r.csv", _requests(0), EngineSettings(source="flags"))
    cluster = replay_scenario(run, REPO / "profiles" / profile, tmp_path / "a.csv")["cluster"]
    assert (cluster["max_concurrency"], cluster["max_batch_tokens"]) == (seqs, tokens)
    assert EngineSettings().prefix_caching  # vLLM V1 caches prefixes unless told not to
    # a limit given is kept; a profile that records no GPU memory cannot pick a default
    given = MeasuredRun("r", run.path, run.requests, EngineSettings(max_num_seqs=64, max_num_batched_tokens=512))
    cluster = replay_scenario(given, REPO / "profiles" / profile, tmp_path / "a.csv")["cluster"]
    assert (cluster["max_concurrency"], cluster["max_batch_tokens"]) == (64, 512)
    # vLLM caps an unset max_num_seqs at the batched tokens given
    few = MeasuredRun("r", run.path, run.requests, EngineSettings(max_num_batched_tokens=128))
    cluster = replay_scenario(few, REPO / "profiles" / profile, tmp_path / "a.csv")["cluster"]
    assert (cluster["max_concurrency"], cluster["max_batch_tokens"]) == (min(seqs, 128), 128)
    with pytest.raises(ConfigError, match="--max-num-seqs N --max-num-batched-tokens M"):
        replay_scenario(run, REPO / "profiles" / "cpu-tinylm-d128-live-measured", tmp_path / "a.csv")


def test_a_vllm_bench_detailed_result_is_read_per_request(tmp_path: Path) -> None:
    doc = {"input_lens": [100, 200], "output_lens": [3, 2], "ttfts": [0.05, 0.07],
           "itls": [[0.01, 0.02], [0.03]], "start_times": [1000.5, 1000.0], "errors": ["", ""]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    run = load_run(path)
    assert run.requests["arrival_s"].tolist() == [0.0, 0.5]  # sorted by send time
    assert run.requests["prompt_tokens"].tolist() == [200, 100]
    np.testing.assert_allclose(run.requests["e2e_ms"], [100.0, 80.0])
    del doc["start_times"]
    path.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="start_times"):
        load_run(path)


def test_bad_runs_and_settings_get_messages_naming_the_file_row_or_parameter(tmp_path: Path) -> None:
    good = _requests(6).assign(ttft_ms=10.0, e2e_ms=100.0)
    bad = tmp_path / "missing.csv"
    good.drop(columns=["e2e_ms"]).to_csv(bad, index=False)
    with pytest.raises(FormatError, match=r"(?s)missing.csv.*e2e_ms"):
        load_run(bad)
    long = good.copy()
    long.loc[7, "prompt_tokens"] = 5000
    path = tmp_path / "long.csv"
    long.to_csv(path, index=False)
    with pytest.raises(FormatError, match=r"row 8: prompt 5000 .* max_model_len=4096"):
        load_run(path, SETTINGS)
    late = good.copy()
    late.loc[3, "ttft_ms"] = 500.0
    late.to_csv(path, index=False)
    with pytest.raises(FormatError, match="row 4: ttft_ms=500 > e2e_ms=100"):
        load_run(path)
    named = good.assign(stage=["low"] * 3 + ["high"] * (len(good) - 3))  # stages are numbers
    named.to_csv(path, index=False)
    with pytest.raises(FormatError, match="row 1: stage='low' \\(must be a whole number\\)"):
        load_run(path)
    good.to_csv(path, index=False)
    run = load_run(path)
    with pytest.raises(ConfigError, match="drafter's terms cannot be fitted"):
        Calibrator(BASE, [run], ["draft_ms"])
    with pytest.raises(ConfigError, match="not a calibration parameter"):
        Calibrator(BASE, [run], ["speed"])
    with pytest.raises(ConfigError, match="remakes an analytic profile"):
        Calibrator(REPO / "profiles" / "a100-opt13b-distserve-published", [run])
    with pytest.raises(ConfigError, match="max_num_seqs=0"):
        engine_settings({"max_num_seqs": 0}, "engine.yaml")


def test_the_cli_writes_a_calibrated_profile_whose_card_says_what_it_was_fitted_to(tmp_path: Path) -> None:
    truth = {"compute_eff": 0.5, "mem_eff": 0.6}
    paths = [_measured(tmp_path, f"r{i}", truth, seed=10 + i) for i in (1, 2)]
    engine = tmp_path / "engine.yaml"
    engine.write_text(yaml.safe_dump({"max_num_seqs": 64, "max_num_batched_tokens": 2048,
                                      "kv_capacity_tokens": 100_000, "max_model_len": 4096}))
    out = tmp_path / "calibrated"
    args = ["profile", "calibrate", "--profile", str(BASE), "--out", str(out), "--engine", str(engine),
            "--fit", "compute_eff,mem_eff", "--max-steps", "12"]
    for p in paths:
        args += ["--runs", str(p)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    card = yaml.safe_load((out / "card.yaml").read_text())
    assert card["source"] == "calibrated"
    assert card["command"].startswith(f"sparksim profile calibrate --profile {BASE} --out {out} --runs")
    cal = card["calibration"]
    assert [r["name"] for r in cal["runs"]] == ["r1", "r2"] and len(cal["runs"][0]["sha256"]) == 64
    assert cal["fitted"]["compute_eff"]["value"] == pytest.approx(0.5, rel=0.05)
    assert {(h["run"], h["stage"]) for h in cal["held_out"]} == {("r1", 0), ("r1", 1), ("r2", 0), ("r2", 1)}
    assert "drafter" in cal["kept"]
    assert card["parameters"]["compute_eff"]["value"] == cal["fitted"]["compute_eff"]["value"]
    assert card["parameters"]["compute_eff"]["source"].startswith("calibrated: fitted")
    assert "held out" in result.output and "no held-out errors" not in result.output
    one = CliRunner().invoke(app, [*args[:args.index("--runs")], "--max-steps", "2", "--runs", str(paths[0])])
    assert one.exit_code == 0, one.output  # one run: nothing to hold out, and it says so
    assert "no held-out errors: leaving a run out needs two or more --runs" in " ".join(one.output.split())
    bad = CliRunner().invoke(app, ["profile", "calibrate", "--profile", str(BASE), "--out", str(out),
                                   "--runs", str(paths[0])])
    assert bad.exit_code != 0 and "--engine" in bad.output
