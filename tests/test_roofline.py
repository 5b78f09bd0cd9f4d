"""The analytic roofline profile: its limits, its CUDA-graph staircase and cliff, and the shipped folders.

Analytic profiles stand in for measurements on hardware nobody here has, so the model
must at least get the physics' limits right: a memory-bound step costs the weight read
whatever the batch, a compute-bound step grows by FLOPs/peak per token, and graphs make
cost a staircase with a cliff past the last captured size.
"""

from __future__ import annotations

import dataclasses
import shlex
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sparksim.cli import app
from sparksim.cost.cuda_graphs import default_capture_sizes, eager_step_ms
from sparksim.cost.draft_step import (
    DSPARK_5,
    EAGLE3,
    MTP_1,
    DrafterShape,
    graph_draft_ms,
    roofline_draft_ms,
)
from sparksim.cost.models import PRESETS
from sparksim.cost.profile import (
    CARD_REQUIRED,
    ProfileWarning,
    check_card,
    load_profile,
    write_profile,
)
from sparksim.cost.roofline import analytic_profile
from sparksim.cost.target_step import (
    attention_ms,
    dense_verify_ms,
    graph_verify_ms,
    prefill_attention_coef_ms,
    roofline_verify_ms,
)
from sparksim.hardware import GPUS

REPO = Path(__file__).resolve().parents[1]
QWEN = PRESETS["qwen3-8b"]
H100, H200 = GPUS["h100"], GPUS["h200"]
# Qwen3-8B from its config.json: 36 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 12288.
L, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 36, 4096, 32, 8, 128, 12288, 151936
LAYER_PARAMS = HIDDEN * HEAD_DIM * (2 * HEADS + 2 * KV_HEADS) + 3 * HIDDEN * MLP
MATMUL_PARAMS = L * LAYER_PARAMS + VOCAB * HIDDEN  # the input embedding is a gather
KV_ELEMS_PER_TOKEN = 2 * L * KV_HEADS * HEAD_DIM


def test_the_model_preset_has_the_published_qwen3_8b_shape() -> None:
    """Every figure below leans on the preset; it must be Qwen3-8B's published shape."""
    assert QWEN.matmul_params == MATMUL_PARAMS
    assert QWEN.kv_bytes_per_token == KV_ELEMS_PER_TOKEN
    assert 8.1e9 < QWEN.params < 8.3e9  # "8.2B" on the model card


def test_a_memory_bound_step_costs_the_weight_read_whatever_the_batch() -> None:
    """Below the ridge extra tokens ride free: this is why speculative verification pays at all."""
    tokens = np.array([1, 2, 4, 8])
    got = roofline_verify_ms(H100, QWEN, tokens, 1)
    weight_read_ms = 2 * MATMUL_PARAMS / (H100.mem_bytes_per_s * H100.mem_eff) * 1e3
    np.testing.assert_allclose(got, weight_read_ms + H100.step_overhead_ms, rtol=5e-3)
    assert got.max() / got.min() < 1.005
    # memory-bound means compute does not matter at all ...
    fast = dataclasses.replace(H100, peak_flops=H100.peak_flops * 10)
    np.testing.assert_array_equal(roofline_verify_ms(fast, QWEN, tokens, 1), got)
    # ... and bandwidth is everything: H200's step is faster by exactly 4.8 / 3.35
    h200 = roofline_verify_ms(H200, QWEN, tokens, 1)
    ratio = (got - H100.step_overhead_ms) / (h200 - H200.step_overhead_ms)
    np.testing.assert_allclose(ratio, 4.8 / 3.35, rtol=1e-12)


def test_a_compute_bound_step_grows_by_flops_over_peak_per_token() -> None:
    """Past the ridge every token costs its GEMM FLOPs at the achieved peak."""
    for hw in (H100, H200, GPUS["a100"], GPUS["b200"]):
        t1, t2 = dense_verify_ms(hw, QWEN, [4096, 8192])
        slope_ms = (t2 - t1) / 4096
        flops_per_token = 2 * MATMUL_PARAMS
        assert slope_ms == pytest.approx(flops_per_token / (hw.peak_flops * hw.compute_eff) * 1e3,
                                         rel=1e-9), hw.name
    # compute-bound means bandwidth does not matter: H100 and H200 agree
    np.testing.assert_allclose(dense_verify_ms(H100, QWEN, [4096, 8192]),
                               dense_verify_ms(H200, QWEN, [4096, 8192]), rtol=1e-12)


def test_reading_the_kv_cache_adds_to_a_compute_bound_step() -> None:
    """Attention kernels run after the GEMMs, so their KV read adds to the step, never hides under it."""
    kv = 256 * 1024
    whole = roofline_verify_ms(H100, QWEN, 4096, 1024, tokens_per_request=16)  # 256 requests
    read_ms = kv * KV_ELEMS_PER_TOKEN * 2 / (H100.mem_bytes_per_s * H100.attn_mem_eff) * 1e3
    assert float(attention_ms(H100, QWEN, kv)) == pytest.approx(read_ms, rel=1e-12)
    assert float(whole) == pytest.approx(float(dense_verify_ms(H100, QWEN, 4096)) + read_ms, rel=1e-12)


def test_prefill_attention_is_quadratic_in_the_prompt_at_the_compute_peak() -> None:
    """A q-token prompt has q²/2 causal pairs, 4·L·H·d FLOPs each: long prompts pay quadratically."""
    coef = prefill_attention_coef_ms(H100, QWEN)
    pairs = 2048**2 / 2
    want = pairs * 4 * L * HEADS * HEAD_DIM / (H100.peak_flops * H100.attn_compute_eff) * 1e3
    assert coef * 2048**2 == pytest.approx(want, rel=1e-12)


def test_kv_cache_read_adds_cost_per_request_and_context_token() -> None:
    """Attention reads every request's KV cache, so long contexts and many requests cost bandwidth."""
    def extra_ms(tokens: int, tokens_per_request: int) -> float:
        lo, hi = roofline_verify_ms(H100, QWEN, tokens, [1024, 2048],
                                    tokens_per_request=tokens_per_request)
        return float(hi - lo)

    per_request_ms = 1024 * KV_ELEMS_PER_TOKEN * 2 / (H100.mem_bytes_per_s * H100.attn_mem_eff) * 1e3
    assert extra_ms(8, 8) == pytest.approx(per_request_ms, rel=1e-9)  # R = 1
    assert extra_ms(9, 8) == pytest.approx(2 * per_request_ms, rel=1e-9)  # R = ceil(9/8) = 2
    assert extra_ms(8, 1) == pytest.approx(8 * per_request_ms, rel=1e-9)  # R = 8


def test_graph_padding_makes_cost_a_staircase_between_captured_sizes() -> None:
    """A batch of 121 runs the 128-token graph; a scheduler that ignores this overpays for 121."""
    sizes = default_capture_sizes()
    got = graph_verify_ms(H100, QWEN, np.arange(113, 129), 4096, capture_sizes=sizes)
    np.testing.assert_array_equal(got[:8], roofline_verify_ms(H100, QWEN, 120, 4096))
    np.testing.assert_array_equal(got[8:], roofline_verify_ms(H100, QWEN, 128, 4096))
    assert got[8] > got[7]


def test_an_eager_pass_costs_the_larger_of_its_gpu_work_and_its_dispatch() -> None:
    """Launches run ahead of the GPU: short kernels are launch-bound, long ones GPU-bound."""
    assert eager_step_ms(3.0, 4.32) == 4.32  # GPU idles between launches: dispatch decides
    assert eager_step_ms(9.0, 4.32) == 9.0  # launches hide behind long kernels
    np.testing.assert_array_equal(eager_step_ms([1.0, 5.0], [2.0, 2.0]), [2.0, 5.0])


def test_past_the_captured_range_a_short_step_pays_its_dispatch_and_a_long_one_does_not() -> None:
    """Past the last graph the step runs eagerly: a cliff where its kernels are shorter than
    their launches (no graphs, one token), none where the GPU work outlasts them."""
    sizes = default_capture_sizes()
    dispatch = H100.kernels_per_layer * L * H100.launch_us / 1e3
    over = H100.step_overhead_ms
    # one token, no graphs: Qwen3-8B's 16 GB weight read (~6 ms) outlasts 4.32 ms of launches
    gpu_1 = roofline_verify_ms(H100, QWEN, [1, 513], 1024) - over
    assert gpu_1[0] > dispatch
    no_graphs = graph_verify_ms(H100, QWEN, [1, 513], 1024, capture_sizes=[])
    np.testing.assert_allclose(no_graphs, over + gpu_1)
    # a slow CPU (100 µs a launch): dispatch outlasts the GPU, and the step costs the dispatch
    slow = dataclasses.replace(H100, launch_us=100.0)
    slow_dispatch = slow.kernels_per_layer * L * 100.0 / 1e3
    assert slow_dispatch > gpu_1.max()
    before, after = graph_verify_ms(slow, QWEN, [512, 513], 1024, capture_sizes=sizes)
    assert before == pytest.approx(over + roofline_verify_ms(H100, QWEN, 512, 1024) - over)
    assert after == pytest.approx(over + slow_dispatch, rel=1e-12)  # the cliff: launch-bound


def test_default_capture_sizes_follow_vllm() -> None:
    """The staircase's steps are vLLM's: 1, 2, 4, then every 8 to 256, then every 16 to 512."""
    sizes = default_capture_sizes()
    assert sizes[:4] == (1, 2, 4, 8) and sizes[-1] == 512
    steps = np.diff(sizes[3:])
    assert set(steps[: sizes.index(256) - 3]) == {8} and set(steps[sizes.index(256) - 3:]) == {16}
    assert default_capture_sizes(256)[-1] == 256


def test_the_drafter_pays_its_layers_and_the_shared_lm_head_by_request_count() -> None:
    """DSpark drafts the full block for every request, so its cost follows R, never the verified tokens."""
    drafter = DrafterShape()
    weights = 2 * (drafter.num_layers * LAYER_PARAMS + VOCAB * HIDDEN)  # bytes, LM head included
    one = float(roofline_draft_ms(H100, QWEN, 1, drafter=drafter))
    weights_ms = weights / (H100.mem_bytes_per_s * H100.mem_eff) * 1e3
    assert weights_ms <= one <= 1.3 * weights_ms
    # compute-bound: each request runs γ positions through the layers and the LM head
    t1, t2 = roofline_draft_ms(H100, QWEN, [4096, 8192], drafter=drafter, context=0)  # no KV to read
    per_request = 2 * drafter.gamma * (drafter.num_layers * LAYER_PARAMS + VOCAB * HIDDEN)
    floor_ms = per_request / (H100.peak_flops * H100.compute_eff) * 1e3
    assert floor_ms <= (t2 - t1) / 4096 <= 1.25 * floor_ms
    # graphs are keyed by R·γ tokens: 73 requests (511 tokens) fit, 74 (518) run eagerly
    sizes = default_capture_sizes()
    costs = graph_draft_ms(H100, QWEN, np.arange(1, 200), capture_sizes=sizes, drafter=drafter)
    assert np.all(np.diff(costs) >= 0)
    # eager at 74: its 4 ms of GPU work outlasts 5 layers' 3 ms of launches, which hide
    assert costs[73] > H100.kernels_per_layer * drafter.num_layers * H100.launch_us / 1e3
    assert costs[73] == pytest.approx(float(roofline_draft_ms(H100, QWEN, 74, drafter=drafter)))
    slow = dataclasses.replace(H100, launch_us=100.0)  # a slow CPU: the eager pass is launch-bound
    slow_costs = graph_draft_ms(slow, QWEN, [73, 74], capture_sizes=sizes, drafter=drafter)
    assert slow_costs[1] == pytest.approx(slow.kernels_per_layer * drafter.num_layers * 100.0 / 1e3)


def test_analytic_profile_lists_every_captured_size_then_the_cliff_then_a_ladder(
    tmp_path: Path,
) -> None:
    """The table must hold every step of the staircase and the cliff, or lookups will smear them."""
    verify, extra, card = analytic_profile(H100, QWEN)
    sizes = default_capture_sizes()
    tokens = verify["tokens"].tolist()
    assert "context" not in verify.columns  # the KV read is attention.csv's
    assert set(sizes) <= set(tokens) and 513 in tokens and max(tokens) == 8192
    assert [t for t in tokens if t > 513] == [768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
    block = extra["draft-dspark-5.csv"]
    full = block[block["positions"] == 7]
    assert full["requests"].tolist()[:74] == list(range(1, 75))
    assert full["requests"].max() == 1024 and sorted(set(block["positions"])) == list(range(1, 8))
    mtp = extra["draft-mtp-1.csv"]  # one pass carries R tokens: graphs reach R = 512
    assert mtp[mtp["positions"] == 1]["requests"].tolist()[:513] == list(range(1, 514))
    problems: list[str] = []
    check_card(card, problems)
    assert problems == [] and card["source"] == "analytic"
    assert all(card[k] for k in CARD_REQUIRED)
    assert card["graph_capture_sizes"] == list(sizes)
    assert list(card["drafters"]) == ["dspark-5", "mtp-1", "eagle3"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileWarning)  # the model is monotone: no clean-up needed
        prof = load_profile(write_profile(tmp_path / "a", verify, card, extra=extra))
    assert prof.captured_sizes == sizes and prof.kv_model == "per-request"
    ms = prof.verify_s([121, 128, 512, 513]) * 1e3
    assert ms[0] == ms[1] and 0 < ms[3] - ms[2] < 0.1  # eager at 513: the launches hide behind the GEMMs
    assert prof.default_drafter == "dspark-5" and prof.drafter("mtp-1").kind == "mtp"


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "profiles").glob("*-analytic")))
def test_shipped_profiles_are_remade_exactly_by_the_command_in_their_card(
    tmp_path: Path, name: str
) -> None:
    """A shipped profile is only trustworthy if its card's command makes the same numbers."""
    shipped = REPO / "profiles" / name
    prof = load_profile(shipped)
    gpu = prof.card["gpu"]
    assert prof.source == "analytic" and name.startswith(gpu)
    assert prof.card["hardware"] == GPUS[gpu].name and prof.card["model"] in name
    argv = shlex.split(prof.card["command"])
    assert argv[:3] == ["sparksim", "profile", "analytic"]
    argv[argv.index("--out") + 1] = str(tmp_path / "remade")
    result = CliRunner().invoke(app, argv[1:])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in shipped.glob("*.csv"))
    assert names == sorted(p.name for p in (tmp_path / "remade").glob("*.csv"))
    for name in names:
        assert (tmp_path / "remade" / name).read_bytes() == (shipped / name).read_bytes(), name
    remade = load_profile(tmp_path / "remade").card
    assert {k: v for k, v in remade.items() if k not in ("date", "command")} == {
        k: v for k, v in prof.card.items() if k not in ("date", "command")}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "tpu"], "unknown gpu 'tpu'"),
        (["--gpu", "a100", "--dtype", "fp8"], "no FP8 tensor cores"),
        (["--dtype", "int3"], "dtype='int3'"),
        (["--drafters", "dspark-5,nope"], "--drafters 'dspark-5,nope'"),
        (["--compute-eff", "1.5"], "compute_eff=1.5"),
        (["--capture-sizes", "8,0"], "got 0"),
        (["--capture-sizes", "8,x"], "--capture-sizes='8,x'"),
        (["--launch-us", "-1"], "launch_us=-1"),
        (["--model", "no-such-model"], "unknown model 'no-such-model'"),
    ],
)
def test_bad_analytic_options_fail_with_one_message_naming_the_value(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """A typo must produce one clear error and leave nothing half-written behind."""
    out = tmp_path / "p"
    result = CliRunner().invoke(app, ["profile", "analytic", "--out", str(out), *args])
    assert result.exit_code == 1, result.output
    assert message in " ".join(result.output.split())
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_custom_capture_sizes_and_drafters_reach_the_card(tmp_path: Path) -> None:
    """Knobs must change the profile and be recorded, so the card tells how it was made."""
    out = tmp_path / "custom"
    result = CliRunner().invoke(app, [
        "profile", "analytic", "--gpu", "h200", "--capture-sizes", "1,8,64", "--drafters", "dspark-5",
        "--max-tokens", "256", "--max-requests", "16", "--mem-eff", "0.5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    prof = load_profile(out)
    verify = pd.read_csv(out / "verify.csv")
    assert verify["tokens"].tolist() == [1, 8, 64, 65, 96, 128, 192, 256]
    assert prof.card["graph_capture_sizes"] == [1, 8, 64]
    assert prof.card["parameters"]["mem_eff"]["value"] == 0.5
    assert "--mem-eff 0.5" in prof.card["command"]
    # R·γ fits the largest graph up to R = 64 // 7 = 9; 10 is the first eager count
    assert prof.drafters[prof.default_drafter].requests.tolist() == [*range(1, 11), 12, 16]


@pytest.mark.parametrize("drafter", [MTP_1, EAGLE3], ids=lambda d: d.name)
def test_a_pass_based_drafter_costs_one_pass_per_drafted_position(drafter: DrafterShape) -> None:
    """MTP modules and Eagle heads draft one position per forward pass: cost is linear in positions."""
    sizes = default_capture_sizes()
    requests = np.array([1, 7, 64, 300, 700])
    one = graph_draft_ms(H100, QWEN, requests, capture_sizes=sizes, drafter=drafter, positions=1)
    for p in range(2, 8):
        got = graph_draft_ms(H100, QWEN, requests, capture_sizes=sizes, drafter=drafter, positions=p)
        np.testing.assert_allclose(got, p * one, rtol=1e-12)


def test_a_block_drafter_drafts_its_positions_in_one_pass() -> None:
    """DSpark's backbone runs the block in parallel: 7 positions cost far less than 7 one-position passes."""
    sizes = default_capture_sizes()
    one, seven = graph_draft_ms(H100, QWEN, 8, capture_sizes=sizes, drafter=DSPARK_5, positions=[1, 7])
    assert one < seven < 2 * one


def test_kv_capacity_is_free_hbm_over_kv_bytes_per_token(tmp_path: Path) -> None:
    """vLLM sizes its KV cache from what the weights and activations leave of HBM × 0.9, the
    HBM CUDA reports (an H100 80GB: 79.11 GiB, not 80e9 bytes)."""
    verify, extra, card = analytic_profile(H100, QWEN, drafters=[DSPARK_5])
    prof = load_profile(write_profile(tmp_path / "a", verify, card, extra=extra))
    mem = card["memory"]
    assert mem["kv_bytes_per_token"] == KV_ELEMS_PER_TOKEN * 2
    assert mem["weights_bytes"] == 2 * (QWEN.params + 5 * LAYER_PARAMS + 5 * HIDDEN * HIDDEN)
    want = (0.9 * 79.11 * 2**30 - mem["weights_bytes"] - mem["activation_reserve_bytes"]) // (KV_ELEMS_PER_TOKEN * 2)
    assert prof.kv_capacity_tokens() == want
    assert prof.kv_capacity_tokens(0.5) < want


def test_the_card_command_parser_knows_every_analytic_option_and_its_default() -> None:
    """`profile calibrate` remakes a base profile from its card's command: the parser must read
    every option `profile analytic` has, with the same defaults."""
    import inspect

    from sparksim.cli.profile_analytic import analytic
    from sparksim.cost.analytic import OPTION_DEFAULTS, options_from_command

    params = inspect.signature(analytic).parameters
    assert list(params) == list(OPTION_DEFAULTS)
    for name, p in params.items():
        assert p.default.default == OPTION_DEFAULTS[name], name
    card = load_profile(REPO / "profiles" / "h100x2-mixtral-8x7b-analytic").card
    opts = options_from_command(card["command"])
    assert opts["gpus"] == 2 and opts["max_capture_size"] == 256 and opts["compute_eff"] == 0.69
