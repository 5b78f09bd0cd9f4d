"""Production-scale MoE/MLA costs from published kernel figures (issue 24, item 3).

DeepSeek serves V3 with redundant experts (256 + 32 slots), an expert load that is never
perfectly even, DeepGEMM's grouped GEMMs and FlashMLA's decode attention. Each is one rule of
the roofline (`sparksim.cost.parallelism`, `sparksim.cost.target_step`); these tests hold each to
its closed form and its published numbers, so a profile priced by them says what the sources say.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from sparksim.cost.analytic import build_analytic, options_from_command
from sparksim.cost.models import PRESETS
from sparksim.cost.parallelism import Parallelism, collective_ms, routed_compute_ms
from sparksim.cost.target_step import (
    attention_compute_coef_ms,
    attention_ms,
    dense_bytes,
    dense_verify_ms,
)
from sparksim.errors import ConfigError
from sparksim.hardware import GPUS, grouped_gemm_eff, grouped_gemm_points

H800 = GPUS["h800"]
DSV3 = PRESETS["deepseek-v3"]
QWEN = PRESETS["qwen3-8b"]
MIXTRAL = PRESETS["mixtral-8x7b"]


# --------------------------------------------------------------------------- redundant experts


@pytest.mark.parametrize(("gpus", "nodes", "per_gpu"), [(144, 18, 2), (32, 4, 9)])
def test_deepseeks_layouts_host_256_plus_32_slots_evenly(gpus: int, nodes: int, per_gpu: int) -> None:
    """DeepSeek's overview: EP144 decode units hold 2 routed experts per GPU, EP32 prefill 9."""
    ep = Parallelism(gpus, "dp-ep", nodes=nodes, redundant_experts=32)
    ep.check(DSV3, H800)
    assert ep.expert_slots(DSV3) == 288 and ep.expert_slots(DSV3) // gpus == per_gpu


@pytest.mark.parametrize(("parallel", "needle"), [
    (Parallelism(144, "dp-ep", nodes=18), "num_experts=256 + redundant_experts=0 = 256 slots"),
    (Parallelism(32, "dp-ep", nodes=4, redundant_experts=16), "256 + redundant_experts=16 = 272 slots"),
    (Parallelism(8, "tp", redundant_experts=8), "redundant_experts=8 must be >= 0, and only dp-ep"),
    (Parallelism(8, "dp-ep", redundant_experts=-8), "redundant_experts=-8 must be >= 0"),
    (Parallelism(8, "dp-ep", expert_imbalance=0.9), "expert_imbalance=0.9 must be >= 1"),
    (Parallelism(8, "tp", expert_imbalance=1.2), "only dp-ep divides experts"),
])
def test_a_slot_layout_the_model_cannot_take_is_an_error_naming_the_numbers(
        parallel: Parallelism, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        parallel.check(DSV3, H800)


def test_the_cli_refuses_deepseeks_decode_unit_without_its_redundant_experts() -> None:
    opts = options_from_command("sparksim profile analytic --gpu h800 --model deepseek-v3 --dtype fp8 "
                                "--gpus 144 --nodes 18 --parallel dp-ep --drafters none")
    with pytest.raises(ConfigError, match=re.escape("256 slots")):
        build_analytic(opts)


def test_each_gpu_reads_the_touched_slots_it_hosts() -> None:
    """Once every slot is touched, a GPU of EP32 + 32 copies reads 9 experts per layer, not 8."""
    t = np.array([1e7])
    plain = Parallelism(32, "dp-ep", nodes=4)
    eplb = Parallelism(32, "dp-ep", nodes=4, redundant_experts=32)
    extra = dense_bytes(DSV3, t, dtype_bytes=1, parallel=eplb) - dense_bytes(DSV3, t, dtype_bytes=1,
                                                                               parallel=plain)
    np.testing.assert_allclose(extra, DSV3.moe_layers * 1 * DSV3.expert_params, rtol=1e-9)
    # one token: its k slots, whoever hosts them (k / G per GPU on average)
    one = np.array([1.0])
    slots = 288 * (1 - (1 - 8 / 288) ** 1)
    np.testing.assert_allclose(slots, 8.0, rtol=1e-12)
    routed_one = DSV3.moe_layers * DSV3.experts_touched(one) * DSV3.expert_params
    np.testing.assert_allclose(
        dense_bytes(DSV3, one, dtype_bytes=1, parallel=eplb) - dense_bytes(DSV3, one, dtype_bytes=1, parallel=plain),
        (DSV3.moe_layers * slots * DSV3.expert_params - routed_one) / 32, atol=1e-3)


# --------------------------------------------------------------------------- expert imbalance


def test_the_moe_term_scales_by_the_imbalance_factor() -> None:
    """The layer waits for its most-loaded GPU: its routed GEMMs' FLOPs and the bytes of its
    all-to-all grow by max/mean, nothing else does. Past 8192 tokens per slot DeepGEMM's curve is
    flat, so the step's extra time is exactly (a − 1) × those two terms."""
    a = 1.115
    t = np.array([400_000.0])  # 400k × 8 / 288 ≈ 11k tokens per slot: the flat end of the curve
    even = Parallelism(32, "dp-ep", nodes=4, redundant_experts=32)
    hot = Parallelism(32, "dp-ep", nodes=4, redundant_experts=32, expert_imbalance=a)
    routed = routed_compute_ms(H800, DSV3, t, expert_layers=DSV3.moe_layers, dtype_bytes=1, parallel=even)
    np.testing.assert_allclose(routed_compute_ms(H800, DSV3, t, expert_layers=DSV3.moe_layers,
                                                 dtype_bytes=1, parallel=hot), a * routed, rtol=1e-12)
    latency = 2 * DSV3.moe_layers * H800.collective_latency_us / 1e3
    comm = collective_ms(H800, DSV3, t, dtype_bytes=1, parallel=even)
    np.testing.assert_allclose(collective_ms(H800, DSV3, t, dtype_bytes=1, parallel=hot) - latency,
                               a * (comm - latency), rtol=1e-12)
    step = dense_verify_ms(H800, DSV3, t, dtype_bytes=1, parallel=even)
    np.testing.assert_allclose(dense_verify_ms(H800, DSV3, t, dtype_bytes=1, parallel=hot) - step,
                               (a - 1) * (routed + comm - latency), rtol=1e-9)


def test_a_bf16_moe_with_even_load_keeps_its_routed_experts_at_compute_eff() -> None:
    """No DeepGEMM figure for BF16: an even BF16 MoE is priced as before, to the last bit, and an
    uneven one pays (a − 1) × its routed FLOPs at compute_eff."""
    t = np.array([65_536.0])
    h100 = GPUS["h100"]
    even, hot = Parallelism(8, "dp-ep"), Parallelism(8, "dp-ep", expert_imbalance=1.5)
    flops = 2 * MIXTRAL.moe_layers * MIXTRAL.experts_per_token * MIXTRAL.expert_params * t / 8
    np.testing.assert_allclose(routed_compute_ms(h100, MIXTRAL, t, expert_layers=MIXTRAL.moe_layers,
                                                 parallel=hot),
                               1.5 * flops / (h100.peak_flops * h100.compute_eff) * 1e3, rtol=1e-12)
    assert np.all(dense_verify_ms(h100, MIXTRAL, t, parallel=hot) > dense_verify_ms(h100, MIXTRAL, t, parallel=even))


# --------------------------------------------------------------------------- DeepGEMM's curve


def _published_eff(m: int, gate_up_tflops: float, down_tflops: float) -> float:
    """An expert's SwiGLU at M tokens: gate-up (N 4096, K 7168) then down (N 7168, K 2048)."""
    f1, f2 = 2.0 * m * 4096 * 7168, 2.0 * m * 7168 * 2048
    return (f1 + f2) / (f1 / (gate_up_tflops * 1e12) + f2 / (down_tflops * 1e12)) / 1978.9e12


@pytest.mark.parametrize(("m", "gate_up", "down"), [
    (256, 932, 815), (512, 1040, 916), (1024, 1233, 925), (4096, 1346, 1214), (8192, 1346, 1214)])
def test_the_grouped_gemm_curve_passes_through_deepgemms_published_rows(
        m: int, gate_up: float, down: float) -> None:
    """DeepGEMM README (@ 55ab91f), grouped FP8 GEMMs on H800, masked and contiguous layouts."""
    np.testing.assert_allclose(grouped_gemm_eff(m), _published_eff(m, gate_up, down), rtol=1e-12)


def test_the_grouped_gemm_curve_never_falls_as_experts_get_more_tokens() -> None:
    tokens = np.geomspace(1, 1e6, 2001)
    eff = grouped_gemm_eff(tokens)
    assert np.all(np.diff(eff) >= 0)
    _ms, points = grouped_gemm_points()
    assert eff[0] == points[0] and eff[-1] == points[-1]  # flat outside the published range
    assert 0.4 < points[0] < points[-1] < 0.69  # below the large dense GEMMs' compute_eff


# --------------------------------------------------------------------------- FlashMLA


def test_mla_decode_reads_a_bf16_cache_at_flashmlas_3000_gb_per_s() -> None:
    """FlashMLA README: dense MLA decoding, up to 3000 GB/s memory-bound on H800, BF16 KV."""
    kv = 1e6
    want = kv * DSV3.kv_bytes_per_token * 2 / 3000e9 * 1e3
    np.testing.assert_allclose(attention_ms(H800, DSV3, kv, dtype_bytes=1), want, rtol=1e-12)


def test_mla_decode_computes_at_flashmlas_660_tflops_whatever_the_weights_dtype() -> None:
    want = DSV3.attention_flops_per_pair / 660e12 * 1e3
    for dtype_bytes in (1, 2):
        np.testing.assert_allclose(attention_compute_coef_ms(H800, DSV3, dtype_bytes=dtype_bytes), want,
                                   rtol=1e-12)


def test_gqa_attention_keeps_the_presets_efficiencies() -> None:
    np.testing.assert_allclose(attention_ms(H800, QWEN, 1e6),
                               1e6 * QWEN.kv_bytes_per_token * 2 / (H800.mem_bytes_per_s * H800.attn_mem_eff) * 1e3,
                               rtol=1e-12)
    np.testing.assert_allclose(attention_compute_coef_ms(H800, QWEN),
                               QWEN.attention_flops_per_pair / (H800.peak_flops * H800.attn_compute_eff) * 1e3,
                               rtol=1e-12)
