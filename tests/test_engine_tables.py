"""Engine cost tables (`sparksim.cost.engine_tables`, `engine_table_files`, `engine_table_convert`): each engine's lookup rule, its file, export and import.

Why: an engine's planner prices a step with its own table and its own rule (SGLang's floor,
TensorRT-LLM's interpolation, vLLM's padded staircase, ATOM's dense stub), and a policy
that models the engine must read the table the engine reads, as the engine reads it. The
hand-made cases are the engine reports' worked examples (/tmp/engines: sglang.md §4 A/B,
trtllm_atom.md TRT-1 and ATOM-3), so a rule that drifts from the engine fails here.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from sparksim.cli import app
from sparksim.cost import engine_table_convert as convert
from sparksim.cost import engine_table_files as files
from sparksim.cost import engine_tables as et
from sparksim.cost.pricing import StepCost
from sparksim.cost.profile import ProfileWarning, load_profile
from sparksim.errors import ConfigError, FormatError

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "profiles" / "h200-qwen3-8b-analytic"
TINY = ROOT / "profiles" / "cpu-tinylm-d128-live-measured"
runner = CliRunner()


def b(*tokens: int) -> np.ndarray:
    return np.array(tokens, dtype=np.int64)


def tau_star(requests: int, conf: list[list[float]]) -> np.ndarray:
    """R + the top-k survivals, k = 0..Rγ (the planners' expected accepted tokens)."""
    ranked = np.sort(np.cumprod(np.asarray(conf), axis=1), axis=None)[::-1]
    return requests + np.concatenate(([0.0], np.cumsum(ranked)))


# ----------------------------------------------------------------------------- lookup rules


def test_sglang_1d_reads_the_largest_probe_at_or_below_b_clamped_at_both_ends() -> None:
    t = et.SglangSpsTable((1, 4, 6, 8), (100.0, 90.0, 70.0, 60.0), 8)
    assert np.array_equal(t.step_s(2, b(0, 1, 3, 4, 5, 6, 7, 8, 100)),
                          1.0 / np.array([100, 100, 100, 90, 90, 70, 70, 60, 60]))
    # sglang.md §4 case A: θ = τ*·sps for B = 2..8 peaks at K = 3
    theta = tau_star(2, [[.9, .8, .5], [.6, .5, .5]]) / t.step_s(2, np.arange(2, 9))
    assert np.allclose(theta, [200, 290, 325.8, 379.8, 320.6, 341.6, 301.8], atol=0.05)
    assert int(np.argmax(theta)) == 3


def test_sglang_flat_table_is_the_placeholder_and_prices_every_batch_alike() -> None:
    flat = et.SglangSpsTable.flat(64)
    assert flat == et.SglangSpsTable((1,), (1.0,), 64) and flat.is_flat
    assert np.array_equal(flat.step_s(8, b(1, 64, 5000)), [1.0, 1.0, 1.0])
    assert not et.SglangSpsTable((1, 4), (10.0, 5.0), 4).is_flat


def test_sglang_additive_is_bias_plus_linear_terms_clamped_at_both_ends() -> None:
    t = et.SglangAdditiveTable(0.010, (1, 4), (0.0, 0.002), (1, 8, 16), (0.0, 0.004, 0.012))
    # sglang.md §4 case B: α(3) = 0.0013333, T(k) = bias + α + θ(3 + k), K = 6
    step = t.step_s(3, np.arange(3, 16))
    assert step[0] == pytest.approx(0.010 + 0.002 * 2 / 3 + 0.004 * 2 / 7, rel=1e-12)
    theta = tau_star(3, [[.9, .9, .8, .5], [.7, .6, .5, .5], [.95, .5, .4, .3]]) / step
    assert np.allclose(theta, [240.46, 302.74, 356.12, 398.86, 430.84, 457.04, 458.14, 455.94,
                               448.75, 436.40, 424.28, 409.31, 393.54], atol=0.01)
    assert t.step_s(0, b(0))[0] == pytest.approx(0.010)  # both axes clamped below
    assert t.step_s(99, b(999))[0] == pytest.approx(0.010 + 0.002 + 0.012)  # and above


def test_trtllm_interpolates_theta_and_adds_fixed_and_batch_overheads() -> None:
    plain = et.TrtllmSpsTable((4, 6, 8), (10.0, 10.0, 14.0), batch_sizes=(1, 16), batch_overhead_ms=(0.0, 0.0))
    # trtllm_atom.md TRT-1: R = 2, base τ = 3.5, candidates .72 .36 .3 .27 -> budget 2
    tau = 3.5 + np.concatenate(([0.0], np.cumsum([.72, .36, .3, .27])))
    theta = tau / (plain.step_s(2, b(4, 5, 6, 7, 8)) * 1e3)
    assert np.allclose(theta, [.350, .422, .458, .4067, .3679], atol=5e-4)
    assert int(np.argmax(theta)) == 2
    t = et.TrtllmSpsTable((4, 6, 8), (10.0, 10.0, 14.0), 1.0, (1, 16), (0.0, 3.0))
    assert t.step_s(2, b(7))[0] == pytest.approx((12.0 + 1.0 + 0.2) / 1e3)
    assert t.step_s(40, b(1, 99)).tolist() == pytest.approx([(10.0 + 1 + 3) / 1e3, (14.0 + 1 + 3) / 1e3])
    assert et.TrtllmSpsTable((0,), (1.0,)).is_flat and et.TrtllmSpsTable((4, 8), (3.0, 3.0)).is_flat
    assert not plain.is_flat


def vllm_dense_reference(curve: list[tuple[int, float]], size: int, limit: int) -> np.ndarray:
    """vLLM's dense table for 0..size restated loop by loop from vllm.md §3 (no arrays tricks)."""
    xs = [x for x, _ in curve]
    ys = list(np.maximum.accumulate([y for _, y in curve]))
    above = [(x, y) for x, y in zip(xs, ys, strict=True) if x > limit]
    out = []
    for v in range(size + 1):
        if v > xs[-1] and len(xs) > 1:
            out.append(ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (v - xs[-1]))
        elif limit and v > limit and above:
            out.append(float(np.interp(v, [x for x, _ in above], [y for _, y in above])))
        else:
            out.append(next((y for x, y in zip(xs, ys, strict=True) if x >= v), ys[-1]))
    return np.array(out)


def test_vllm_is_a_staircase_to_the_limit_linear_above_it_and_extrapolated_past_the_last() -> None:
    verify = [(2, 10.0), (4, 9.0), (8, 20.0), (16, 30.0), (32, 40.0)]  # (4, 9.0): a dip
    t = et.VllmCostTables(*zip(*verify, strict=True), (1, 4), (1.0, 2.0), 8)  # type: ignore[call-arg]
    ms = t.step_s(0, b(1, 3, 4, 5, 8, 9, 16, 24, 32, 40)) * 1e3 - 1.0
    # step below the limit (the dip raised to the running max 10); held at the first point
    # above the limit, then linear between points above it; past 32 the last slope
    assert ms.tolist() == pytest.approx([10, 10, 10, 20, 20, 30, 30, 35, 40, 45])
    assert t.draft_at(2) == 2.0 and t.draft_at(8) == pytest.approx(2.0 + 4 / 3)
    assert np.allclose(t.step_s(1, np.arange(0, 60)) * 1e3 - 1.0, vllm_dense_reference(verify, 59, 8))
    unlimited = et.VllmCostTables(*zip(*verify, strict=True), (1,), (0.0,), 0)  # type: ignore[call-arg]
    assert np.allclose(unlimited.step_s(1, np.arange(0, 60)) * 1e3, vllm_dense_reference(verify, 59, 0))
    floored = et.VllmCostTables((4,), (0.0,), (1,), (-5.0,), 0)
    assert floored.step_s(3, b(2))[0] == pytest.approx(1e-6 / 1e3)


def test_atom_stub_is_numpy_linspace_at_every_integer_b() -> None:
    for requests, gamma in ((2, 3), (3, 4), (64, 7)):
        n = requests * (gamma + 1) + 1
        stub = et.AtomSpsTable.stub(requests, gamma)
        assert np.array_equal(stub.step_s(requests, np.arange(n)), 1.0 / np.linspace(1.0, 0.1, n))
        assert stub.step_s(requests, b(n + 50))[0] == 1.0 / 0.1  # clamped at max_b
    assert np.allclose(1.0 / et.AtomSpsTable.stub(2, 3).step_s(2, np.arange(9)), 1 - 0.1125 * np.arange(9))


def test_atom_table_is_linear_between_points_and_flat_outside() -> None:
    t = et.AtomSpsTable((8, 16, 32, 64), (310.0, 300.0, 270.0, 190.0), max_b=100)
    assert (1.0 / t.step_s(4, b(-3, 0, 8, 12, 24, 80, 100, 500))).tolist() == pytest.approx(
        [310, 310, 310, 305, 285, 190, 190, 190])
    short = et.AtomSpsTable((8, 16, 32, 64), (310.0, 300.0, 270.0, 190.0), max_b=40)  # the dense table ends at 40
    assert (1.0 / short.step_s(4, b(40, 50, 64))).tolist() == pytest.approx([250, 250, 250])


# ----------------------------------------------------------------------------- round trips


@pytest.fixture(scope="module")
def h200() -> Any:
    return load_profile(H200)


@pytest.mark.parametrize("fmt", files.FORMATS)
def test_export_write_read_is_the_same_table_and_its_steps_are_sparksims_price(
        fmt: str, h200: Any, tmp_path: Path) -> None:
    table = convert.export_table(h200, fmt, gamma=7)
    path = files.write_table(table, tmp_path / f"{fmt}.json")
    assert files.read_table(path, fmt) == table
    context = convert.DEFAULT_CONTEXT[fmt]
    for r, n in convert.grid_cells(h200, fmt, 7):  # the one price, written out (h200 has no engine loop)
        cost = StepCost.for_step(h200, requests=r, kv_tokens=r * context, positions=7, drafter="dspark-5")
        assert table.step_s(r, b(r * (n + 1)))[0] == pytest.approx(
            cost.price(np.full(r, n, np.int64)).total_s, rel=1e-12)


@pytest.mark.parametrize("fmt", files.FORMATS)
def test_an_imported_table_prices_its_grid_as_the_table_does(fmt: str, h200: Any, tmp_path: Path) -> None:
    table = convert.export_table(h200, fmt, gamma=7)
    path = files.write_table(table, tmp_path / f"{fmt}.json",
                          convert.export_card(h200, table, fmt, gamma=7, command="test"))
    imported = load_profile(convert.import_table(path, fmt, tmp_path / "imported", gamma=7))
    for r, n in convert.grid_cells(h200, fmt, 7):
        price = convert.step_price(imported, r, n, gamma=7, drafter=None, context=12345)
        assert price.total_s == pytest.approx(table.step_s(r, b(r * (n + 1)))[0], rel=1e-9)
        assert price.draft_s == 0.0
    card = imported.card
    assert card["source"] == "imported" and card["model"] == "qwen3-8b"
    assert card["imported_from"]["sha256"] == __import__("hashlib").sha256(path.read_bytes()).hexdigest()
    assert card["imported_from"]["sidecar_card"]["source"] == "analytic"
    assert card["drafters"]["engine-step"]["gamma"] == 7


def test_sglang_additive_file_round_trips_and_imports_at_its_probes(tmp_path: Path) -> None:
    t = et.SglangAdditiveTable(0.010, (1, 4, 16), (-0.001, 0.002, 0.003), (0, 8, 64), (0.0, 0.004, 0.012))
    path = files.write_table(t, tmp_path / "additive.json")
    assert files.read_table(path, "sglang") == t
    prof = load_profile(convert.import_table(path, "sglang", tmp_path / "p", gamma=3, model="m", hardware="h"))
    for r in t.bs_probes:  # every (bs, m) probe pair: R requests sending m tokens in all
        step = StepCost.for_step(prof, requests=r, kv_tokens=1e6, positions=3)
        for m in (8, 64):
            assert step.price(np.zeros(r, np.int64), verified=m - r).total_s == pytest.approx(
                t.step_s(r, b(m))[0], rel=1e-9), (r, m)


def test_export_of_the_live_measured_profile_is_cut_at_its_largest_batch(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)  # vLLM's 8192-token context extrapolates its KV
        prof = load_profile(TINY)
        assert convert.default_gamma(prof) == 7
        for fmt in files.FORMATS:
            table = convert.export_table(prof, fmt, gamma=7)
            card = convert.export_card(prof, table, fmt, gamma=7)
            assert files.read_table(files.write_table(table, tmp_path / f"{fmt}.json", card), fmt) == table
            assert max(card["grid"]["batch_tokens"]) <= prof.max_tokens == 512
            assert card["source"] == "measured" and card["max_rel_gap"] < 1e-12
    assert convert.export_table(prof, "sglang", gamma=7).batch_tokens[-1] == 64 * 8  # type: ignore[attr-defined]


def test_an_analytic_export_never_says_measured(h200: Any) -> None:
    card = convert.export_card(h200, convert.export_table(h200, "vllm", gamma=7), "vllm", gamma=7)
    assert card["source"] == card["profile"]["source"] == "analytic"
    assert "measured" not in yaml.safe_dump(card)


def test_trtllm_split_is_exact_where_the_price_is_additive_and_recorded_where_not(h200: Any) -> None:
    table = convert.export_table(h200, "trtllm", gamma=7)
    assert isinstance(table, et.TrtllmSpsTable)
    assert table.token_counts == tuple(sorted({r * (n + 1) for r in convert.REQUEST_GRID for n in range(1, 8)}))
    assert table.batch_sizes == convert.REQUEST_GRID
    mla = load_profile(ROOT / "profiles" / "h200x8-deepseek-v3-analytic")
    card = convert.export_card(mla, convert.export_table(mla, "trtllm", gamma=5), "trtllm", gamma=5)
    assert 1e-6 < card["max_rel_gap"] < 0.01  # max(KV read, attention FLOPs) is not additive


# ----------------------------------------------------------------------------- bad input


def write_json(tmp_path: Path, doc: Any, name: str = "t.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return path


def problems_of(path: Path, fmt: str) -> list[str]:
    with pytest.raises(FormatError) as err:
        files.read_table(path, fmt)
    assert str(path) in str(err.value)
    return err.value.problems


GOOD_SGLANG = {"sample_batch_tokens": [8, 16, 32], "sample_steps_per_sec": [95.0, 90.0, 80.0], "max_batch_tokens": 32}


@pytest.mark.parametrize(("change", "expected"), [
    ({"sample_batch_tokens": None}, "missing key 'sample_batch_tokens'"),
    ({"sample_steps_per_sec": [95.0, 90.0]}, "sample_batch_tokens has 3 entries but sample_steps_per_sec has 2"),
    ({"sample_batch_tokens": [8, 16.0, 32]}, "sample_batch_tokens[1]=16.0 is not a JSON integer"),
    ({"sample_batch_tokens": [8, 32, 16]}, "sample_batch_tokens[2]=16 is not above sample_batch_tokens[1]=32"),
    ({"sample_steps_per_sec": [95.0, 0.0, 80.0]}, "sample_steps_per_sec[1]=0.0 must be > 0"),
    ({"sample_steps_per_sec": [95.0, 96.0, 80.0]},
     "sample_steps_per_sec[1]=96.0 rises above sample_steps_per_sec[0]=95.0 as sample_batch_tokens grows 8 -> 16"),
    ({"sample_steps_per_sec": [5e6, 90.0, 80.0]}, "sample_steps_per_sec[0]=5000000.0 steps/s is implausible"),
    ({"max_batch_tokens": 16}, "max_batch_tokens=16 is below the last probe sample_batch_tokens[2]=32"),
])
def test_a_bad_sglang_table_names_its_key_row_and_value(change: dict[str, Any], expected: str, tmp_path: Path) -> None:
    doc = {k: v for k, v in {**GOOD_SGLANG, **change}.items() if v is not None}
    found = problems_of(write_json(tmp_path, doc), "sglang")
    assert any(expected in p for p in found), found


def test_a_rising_steps_per_second_says_it_is_not_a_cost_curve(tmp_path: Path) -> None:
    found = problems_of(write_json(tmp_path, {**GOOD_SGLANG, "sample_steps_per_sec": [95.0, 95.5, 80.0]}), "sglang")
    assert "not a cost curve" in found[0] and "10 %" in found[0]


def test_the_additive_table_is_told_apart_by_bias_seconds(tmp_path: Path) -> None:
    doc = {"bias_seconds": 0.0, "bs_probes": [1, 4], "alpha_seconds": [0.0, 0.002],
           "m_probes": [0, 64], "theta_seconds": [0.005, 0.003]}
    found = problems_of(write_json(tmp_path, doc), "sglang")
    assert any("bias_seconds=0.0 must be > 0" in p for p in found), found
    assert any("theta_seconds[1]=0.003 falls below theta_seconds[0]=0.005 as m_probes grows 0 -> 64" in p
               for p in found), found
    ms = {**doc, "bias_seconds": 10.0, "theta_seconds": [0.0, 300.0]}
    assert any("theta_seconds[1]=300.0 s is implausible: a step term over 100 s looks like milliseconds" in p
               for p in problems_of(write_json(tmp_path, ms), "sglang"))


GOOD_TRT = {"token_counts": [4, 6, 8], "step_time_ms": [10.0, 10.0, 14.0], "fixed_overhead_ms": 0.0,
            "batch_sizes": [1, 16], "batch_overhead_ms": [0.0, 0.0],
            "_meta": {"encoding": "decomposed", "lookup": "interp"}}


@pytest.mark.parametrize(("change", "expected"), [
    ({"step_time_ms": [10.0, 9.0, 14.0]}, "step_time_ms[1]=9.0 falls below step_time_ms[0]=10.0 as token_counts "
                                          "grows 4 -> 6: a step that gets cheaper with more work is not a cost curve"),
    ({"step_time_ms": [10.0, 2e5, 3e5]}, "step_time_ms[1]=200000.0 ms is implausible: looks like µs"),
    ({"step_time_ms": [1e-5, 2e-5, 3e-5]}, "step_time_ms[0]=1e-05 ms is implausible: looks like seconds"),
    ({"batch_overhead_ms": [0.0, -1.0]}, "batch_overhead_ms[1]=-1.0 must be >= 0 ms"),
    ({"batch_sizes": [1]}, "batch_sizes has 1 entries but batch_overhead_ms has 2"),
    ({"token_counts": [4, "6", 8]}, "token_counts[1]='6' is not a JSON integer"),
    ({"_meta": {"encoding": "decomposed", "lookup": "floor"}}, "_meta.lookup='floor'"),
    ({"_meta": {"encoding": "legacy"}}, "_meta.encoding='legacy': only the decomposed encoding"),
    ({"schema_version": 2}, "keys ['schema_version'] mark TensorRT-LLM's schema-v2 exact (G, V) table"),
])
def test_a_bad_trtllm_table_names_its_key_row_and_value(change: dict[str, Any], expected: str, tmp_path: Path) -> None:
    found = problems_of(write_json(tmp_path, {**GOOD_TRT, **change}), "trtllm")
    assert any(expected in p for p in found), found


@pytest.mark.parametrize(("latency", "expected"), [
    ({"4": 10.0, "abc": 12.0}, 'latency_ms["abc"]: the key is not a token count'),
    ({"4": 10.0, "8": 0.0}, 'latency_ms["8"]=0.0 must be > 0 ms'),
    ({"4": 10.0, "8": 9.0}, 'latency_ms["8"]=9.0 falls below latency_ms["4"]=10.0'),
    ({"4": 10.0, "8": "12"}, 'latency_ms["8"]=\'12\' is not a JSON number'),
    ({}, "latency_ms is empty"),
])
def test_a_bad_vllm_ascend_file_names_its_key_and_value(latency: dict[str, Any], expected: str, tmp_path: Path) -> None:
    doc = {"schema_version": 1, "profile_kind": "startup_dummy_step", "fingerprint": {}, "latency_ms": latency}
    found = problems_of(write_json(tmp_path, doc), "vllm")
    assert any(expected in p for p in found), found


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    doc = {"sample_batch_tokens": [8, 8, 4.5], "sample_steps_per_sec": [-1.0, 2e7]}
    found = problems_of(write_json(tmp_path, doc), "sglang")
    assert len(found) == 4, found  # the missing key, the float probe, both bad rates
    assert problems_of(write_json(tmp_path, "[1, 2]"), "sglang") == ["must be a JSON object of the sglang table's keys"]
    assert "not JSON" in problems_of(write_json(tmp_path, "{"), "vllm")[0]


def test_the_vllm_ascend_lookup_agrees_with_vllms_step_up_to_its_largest_key(tmp_path: Path) -> None:
    latency = {"4": 10.0, "8": 12.0, "16": 20.0}
    table = files.read_table(write_json(tmp_path, {"schema_version": 1, "latency_ms": latency}), "vllm")
    keys = sorted(int(k) for k in latency)

    def ascend(tokens: int) -> float:  # HardwareCostModel.latency: the nearest key >= B, else the largest
        return latency[str(next((k for k in keys if k >= tokens), keys[-1]))]

    assert [table.step_s(3, b(t))[0] * 1e3 for t in range(1, 17)] == [ascend(t) for t in range(1, 17)]
    assert table.step_s(3, b(24))[0] * 1e3 == pytest.approx(28.0)  # past it vLLM extrapolates; Ascend holds 20


def test_an_unknown_format_lists_the_valid_ones(h200: Any, tmp_path: Path) -> None:
    for call in (lambda: files.read_table(tmp_path / "x.json", "atom"),
                 lambda: convert.export_table(h200, "tensorrt", gamma=7)):
        with pytest.raises(ConfigError, match="is not one of sglang, trtllm, vllm"):
            call()
    with pytest.raises(ConfigError, match="ATOM keeps its table in memory"):
        files.write_table(et.AtomSpsTable.stub(2, 3), tmp_path / "atom.json")


def test_an_export_that_needs_a_drafter_or_a_reachable_grid_says_what_is_missing(tmp_path: Path) -> None:
    plain = load_profile(ROOT / "profiles" / "h100-llama-2-7b-analytic")
    with pytest.raises(ConfigError, match="has no draft table, but a sglang table prices the whole DSpark step"):
        convert.export_table(plain, "sglang", gamma=7)
    assert convert.export_table(plain, "sglang", gamma=0).batch_tokens[0] == 1  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="gamma=0 has no grid"):
        convert.export_table(plain, "trtllm", gamma=0)
    tiny = load_profile(TINY)
    with pytest.raises(ConfigError, match=r"drafter 'nope' is not in profile .* \['dspark-2'\]"):
        convert.export_table(tiny, "vllm", gamma=7, drafter="nope")
    with pytest.raises(ConfigError, match=r"reaches 512 tokens, but sglang's grid starts at R=1 x \(L\+1\)=601"):
        convert.export_table(tiny, "sglang", gamma=600)


def test_an_import_needs_a_measured_table_and_its_model(tmp_path: Path) -> None:
    flat = files.write_table(et.SglangSpsTable.flat(), tmp_path / "flat.json")
    with pytest.raises(ConfigError, match=r"flat .* placeholder holds no measurement"):
        convert.import_table(flat, "sglang", tmp_path / "p", gamma=7, model="m", hardware="h")
    bare = files.write_table(et.SglangSpsTable((8, 16), (90.0, 80.0), 16), tmp_path / "bare.json")
    with pytest.raises(ConfigError, match=r"--model and --hardware needed: .* has no export card"):
        convert.import_table(bare, "sglang", tmp_path / "p", gamma=7)


# ----------------------------------------------------------------------------- CLI


def test_cli_exports_and_imports_and_a_dspark_run_works_on_the_result(tmp_path: Path, varied_traces: Path) -> None:
    table = tmp_path / "sps.json"
    result = runner.invoke(app, ["profile", "export", str(H200), "--format", "sglang", "--out", str(table)])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "source: analytic" in result.output
    card = yaml.safe_load(files.sidecar_path(table).read_text())
    assert card["gamma"] == 7 and card["context_tokens"] == 16 and card["command"].startswith("sparksim profile export")
    prof = tmp_path / "imported"
    result = runner.invoke(app, ["profile", "import", str(table), "--format", "sglang", "--out", str(prof),
                                 "--gamma", "7"])
    assert result.exit_code == 0, result.output
    assert "source: imported" in result.output and load_profile(prof).source == "imported"
    run = runner.invoke(app, ["run", "--set", f"profile={prof}", "--set", f"traces={varied_traces}",
                              "--set", "run.duration_s=3", "--out", str(tmp_path / "run"), "-q"])
    assert run.exit_code == 0, run.output
    assert "engine-step" in run.output


def test_cli_refuses_an_unknown_format_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    result = runner.invoke(app, ["profile", "export", str(H200), "--format", "atom", "--out", str(out)])
    assert result.exit_code == 1 and "is not one of sglang, trtllm, vllm" in result.output
    assert not out.exists()
