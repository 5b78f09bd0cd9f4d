"""The roofline for production-scale models: MoE weight traffic, MLA, and multi-GPU replicas.

In an MoE model a step's weight reads grow with its tokens (more tokens touch more experts),
which is what makes verification budgets shrink with load; a replica spread over GPUs divides
its bytes and pays collectives. Each rule is checked at its limits.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from sparksim.cost.draft_step import DSPARK_5, DSPARK_5_MOE, MTP_1, DrafterShape, roofline_draft_ms
from sparksim.cost.models import PRESETS, ModelSpec
from sparksim.cost.parallelism import Parallelism, collective_ms
from sparksim.cost.profile import load_profile, write_profile
from sparksim.cost.roofline import analytic_profile
from sparksim.cost.target_step import (
    attention_compute_coef_ms,
    attention_ms,
    dense_bytes,
    dense_verify_ms,
    prefill_attention_coef_ms,
)
from sparksim.errors import ConfigError
from sparksim.hardware import GPUS

H100, H200 = GPUS["h100"], GPUS["h200"]
QWEN = PRESETS["qwen3-8b"]
MOE = PRESETS["qwen3-30b-a3b"]
DSV3 = PRESETS["deepseek-v3"]


def test_one_token_reads_its_k_experts_and_many_tokens_read_them_all() -> None:
    # Uniform routing: E·(1 − (1 − k/E)^T) distinct experts
    t = np.array([1, 2, 16, 100_000])
    got = MOE.experts_touched(t)
    want = 128 * (1 - (1 - 8 / 128) ** t)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[0] == pytest.approx(8) and got[-1] == pytest.approx(128)
    read = MOE.weights_read([1, 100_000])
    assert read[0] == pytest.approx(MOE.active_params - 0, rel=1e-12)  # one token: its path
    assert read[1] == pytest.approx(MOE.matmul_params, rel=1e-12)  # every expert


def test_skewed_routing_touches_fewer_experts_than_uniform() -> None:
    skewed = dataclasses.replace(MOE, routing_skew=1.0)
    t = np.array([4, 32, 256])
    assert np.all(skewed.experts_touched(t) < MOE.experts_touched(t))
    assert skewed.experts_touched(1)[()] == pytest.approx(8, rel=1e-9)  # one token: its k picks


def test_a_one_expert_moe_is_the_dense_model() -> None:
    # E = k = 1 with the dense MLP's width: the same weights, reads and FLOPs as the dense model
    moe = dataclasses.replace(QWEN, num_experts=1, experts_per_token=1, expert_intermediate=QWEN.intermediate)
    router = QWEN.num_layers * QWEN.hidden  # the one extra matrix an MoE layer has
    assert moe.matmul_params == QWEN.matmul_params + router
    t = np.array([1, 64, 4096])
    np.testing.assert_allclose(moe.weights_read(t), QWEN.weights_read(t) + router, rtol=1e-12)
    dense = dense_verify_ms(H100, QWEN, t)
    np.testing.assert_allclose(dense_verify_ms(H100, moe, t), dense, rtol=1e-4)


def test_moe_step_cost_grows_with_tokens_while_memory_bound() -> None:
    # A dense step is flat while memory-bound; an MoE step is not: more tokens, more experts read
    small, larger = dense_verify_ms(H100, MOE, [1, 32])
    d_small, d_larger = dense_verify_ms(H100, QWEN, [1, 32])
    assert d_larger / d_small < 1.02
    assert larger / small > 2.0


def test_mla_caches_one_latent_per_token_per_layer() -> None:
    assert DSV3.kv_bytes_per_token == 61 * (512 + 64)
    assert DSV3.attention_flops_per_pair == 61 * 2 * 128 * (2 * 512 + 64)
    # 671B total, ~37B active (embeddings included), as DeepSeek-V3's report states
    assert 665e9 < DSV3.params < 675e9
    assert 36e9 < DSV3.active_params + DSV3.vocab * DSV3.hidden < 38e9


def test_mla_prefills_in_its_materialised_form_at_the_bf16_peak() -> None:
    """Prompt attention runs MLA as plain attention of QK head dim 128 + 64 and V head dim 128
    (the engines' "compute friendly" prefill), in BF16 for an FP8 model as for a BF16 one."""
    assert DSV3.prefill_attention_flops_per_pair == 61 * 2 * 128 * (128 + 64 + 128)
    assert QWEN.prefill_attention_flops_per_pair == QWEN.attention_flops_per_pair
    dp8 = Parallelism(8, "dp-ep")
    fp8 = prefill_attention_coef_ms(H200, DSV3, dtype_bytes=1, parallel=dp8)
    assert fp8 == prefill_attention_coef_ms(H200, DSV3, dtype_bytes=2, parallel=dp8)
    assert fp8 == pytest.approx(DSV3.prefill_attention_flops_per_pair / 2 / 8
                                / (H200.peak_for(2) * H200.attn_compute_eff) * 1e3, rel=1e-12)
    # a GQA model's prompt attention still follows its weights' dtype
    assert prefill_attention_coef_ms(H200, QWEN, dtype_bytes=1) < prefill_attention_coef_ms(H200, QWEN)


def test_tensor_parallel_divides_bytes_and_pays_two_all_reduces_per_layer() -> None:
    tp2 = Parallelism(2, "tp")
    t = np.array([1, 256])
    one = dense_bytes(QWEN, t)
    two = dense_bytes(QWEN, t, parallel=tp2)
    np.testing.assert_allclose(two, one / 2, rtol=1e-12)  # 8 KV heads split over 2 GPUs
    per = 2 * QWEN.num_layers
    want = per * (H100.collective_latency_us / 1e3
                  + 2 * (2 - 1) / 2 * t * QWEN.hidden * 2 / (H100.link_bytes_per_s * H100.link_eff) * 1e3)
    np.testing.assert_allclose(collective_ms(H100, QWEN, t, parallel=tp2), want, rtol=1e-12)
    assert np.all(collective_ms(H100, QWEN, t) == 0)  # one GPU: no collectives
    np.testing.assert_allclose(attention_ms(H100, QWEN, 1e6, parallel=tp2),
                               attention_ms(H100, QWEN, 1e6) / 2, rtol=1e-12)


def test_mla_kv_is_copied_under_tp_and_divided_under_dp_attention() -> None:
    tp8, dp8 = Parallelism(8, "tp"), Parallelism(8, "dp-ep")
    single = attention_ms(H200, DSV3, 1e6, dtype_bytes=1)
    assert attention_ms(H200, DSV3, 1e6, dtype_bytes=1, parallel=tp8) == pytest.approx(single)
    assert attention_ms(H200, DSV3, 1e6, dtype_bytes=1, parallel=dp8) == pytest.approx(single / 8)
    # MLA attention is compute-heavy: per KV byte it does more FLOPs than the ridge
    flops_per_byte = DSV3.attention_flops_per_pair / (DSV3.kv_bytes_per_token * 1)
    ridge = H200.peak_for(1) * H200.compute_eff / (H200.mem_bytes_per_s * H200.mem_eff)
    assert flops_per_byte > ridge
    assert attention_compute_coef_ms(H200, DSV3, dtype_bytes=1, parallel=dp8) > 0


def test_expert_parallel_keeps_dense_parts_on_every_gpu_and_splits_experts() -> None:
    dp8 = Parallelism(8, "dp-ep")
    t = np.array([4096.0])
    routed = DSV3.moe_layers * DSV3.experts_touched(t) * DSV3.expert_params
    weights = DSV3.weights_read(t)
    got = dense_bytes(DSV3, t, dtype_bytes=1, parallel=dp8)
    acts_kv = dense_bytes(DSV3, t, dtype_bytes=1, parallel=dp8) - ((weights - routed) + routed / 8)
    assert got == pytest.approx((weights - routed) + routed / 8 + acts_kv)
    a2a = collective_ms(H200, DSV3, t, dtype_bytes=1, parallel=dp8)
    # dispatch: FP8 values and a float32 scale per 128; combine: BF16 (DeepEP's setting)
    want = DSV3.moe_layers * sum(H200.collective_latency_us / 1e3 + (t / 8) * 8 * DSV3.hidden * s
                                 * 7 / 8 / (H200.link_bytes_per_s * H200.link_eff) * 1e3
                                 for s in (1 + 4 / 128, 2))
    np.testing.assert_allclose(a2a, want, rtol=1e-12)


@pytest.mark.parametrize("drafter", [DSPARK_5, MTP_1], ids=lambda d: d.kind)
def test_a_dense_drafter_under_dp_attention_drafts_each_gpus_own_requests(drafter: DrafterShape) -> None:
    """dp-ep keeps a dense drafter whole on every GPU, as the target's attention, and gives each
    GPU 1/G of the requests: G GPUs drafting G·R requests take one GPU's time at R (the same
    weights read, 1/G of the KV and activations each, no collective)."""
    r = np.array([1.0, 64.0, 512.0])
    for gpus in (8, 32):
        ep = Parallelism(gpus, "dp-ep", nodes=gpus // 8)
        got = roofline_draft_ms(H200, DSV3, gpus * r, drafter=drafter, context=4096, dtype_bytes=1, parallel=ep)
        want = roofline_draft_ms(H200, DSV3, r, drafter=drafter, context=4096, dtype_bytes=1)
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize(("model", "parallel", "needle"), [
    (MOE, Parallelism(3, "tp"), "num_heads=32"),
    (QWEN, Parallelism(8, "dp-ep"), "num_experts=0"),
    (DSV3, Parallelism(6, "dp-ep"), "num_experts=256"),
    (DSV3, Parallelism(1, "tp"), "do not fit"),
])
def test_a_split_the_model_cannot_take_names_the_field(model: ModelSpec, parallel: Parallelism,
                                                       needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        analytic_profile(H200, model, dtype="fp8", parallel=parallel, max_tokens=64, max_requests=8)


def test_a_moe_preset_whose_top_k_exceeds_its_experts_is_an_error() -> None:
    with pytest.raises(ConfigError, match="experts_per_token=9"):
        dataclasses.replace(MOE, num_experts=8, experts_per_token=9)


def test_a_deepseek_profile_loads_with_its_gpus_and_compute_bound_attention(tmp_path: Path) -> None:
    verify, extra, card = analytic_profile(H200, DSV3, dtype="fp8", parallel=Parallelism(8, "dp-ep"),
                                           max_tokens=1024, max_requests=64)
    prof = load_profile(write_profile(tmp_path / "d", verify, card, extra=extra))
    assert prof.gpus_per_replica == 8 and set(prof.drafters) == {"dspark-5", "mtp-1"}
    assert prof.drafter("mtp-1").kind == "mtp" and prof.attention_compute_coef_ms > 0
    assert prof.kv_capacity_tokens() > 1_000_000


def test_dp_attention_holds_the_drafters_dense_part_on_every_gpu_as_the_targets() -> None:
    """Each of G GPUs holds the target's and the drafter's attention, dense layers and shared
    experts; the routed experts of both are divided among them (no redundant copies here)."""
    g = 8
    _, _, card = analytic_profile(H200, DSV3, dtype="fp8", parallel=Parallelism(g, "dp-ep"),
                                  drafters=[DSPARK_5_MOE], max_tokens=64, max_requests=8)
    d = DSPARK_5_MOE
    routed = DSV3.moe_layers * DSV3.num_experts * DSV3.expert_params
    drafter = d.num_layers * DSV3.moe_layer_params + d.num_target_features * DSV3.hidden**2
    drafter_routed = d.num_layers * DSV3.num_experts * DSV3.expert_params
    per_gpu = (DSV3.params - routed) + (drafter - drafter_routed) + (routed + drafter_routed) / g
    assert card["memory"]["weights_bytes"] == pytest.approx(g * per_gpu, rel=1e-12)  # FP8: a byte each


def test_a_multi_node_all_to_all_sends_the_off_node_share_over_the_network() -> None:
    """32 GPUs on 4 nodes: of each GPU's dispatch, 7/32 goes to its node's other GPUs over
    NVLink and 24/32 to other nodes over the network, both at once; the slower decides."""
    h800 = GPUS["h800"]
    t = np.array([1024.0, 8192.0])
    ep = Parallelism(32, "dp-ep", nodes=4)
    lat = h800.collective_latency_us / 1e3
    want = 0.0
    for s in (1 + 4 / 128, 2):  # dispatch FP8 (+ its scales), combine BF16
        sent = (t / 32) * DSV3.experts_per_token * DSV3.hidden * s  # bytes each GPU sends
        nvlink = sent * 7 / 32 * 1e3 / (h800.link_bytes_per_s * h800.link_eff)
        network = sent * 24 / 32 * 1e3 / (h800.internode_bytes_per_s * h800.internode_eff)
        assert np.all(network > nvlink)  # 50 GB/s of InfiniBand is the bottleneck
        want = want + DSV3.moe_layers * (lat + network)
    np.testing.assert_allclose(collective_ms(h800, DSV3, t, dtype_bytes=1, parallel=ep), want, rtol=1e-12)
    # one node of the same 8 GPUs: NVLink only, as before
    one = Parallelism(8, "dp-ep")
    nv8 = [(t / 8) * DSV3.experts_per_token * DSV3.hidden * s * 7 / 8 * 1e3 / (h800.link_bytes_per_s * h800.link_eff)
           for s in (1 + 4 / 128, 2)]
    np.testing.assert_allclose(collective_ms(h800, DSV3, t, dtype_bytes=1, parallel=one),
                               DSV3.moe_layers * (2 * lat + nv8[0] + nv8[1]), rtol=1e-12)


def test_an_fp8_model_dispatches_in_fp8_and_combines_in_bf16() -> None:
    """DeepEP's DeepSeek-V3/R1 setting ("FP8 dispatching and BF16 combining"): of an FP8
    model's two all-to-alls only the dispatch is FP8; a BF16 model pays BF16 both ways, and
    tensor parallelism's all-reduces carry BF16 activations whatever the weights."""
    t = np.array([64.0, 4096.0])
    dp8 = Parallelism(8, "dp-ep")
    fp8, bf16 = (collective_ms(H200, DSV3, t, dtype_bytes=b, parallel=dp8) for b in (1, 2))
    lat = 2 * DSV3.moe_layers * H200.collective_latency_us / 1e3
    # the bytes' part scales with the bytes a value: (1 + 1/32 + 2) against 2 + 2
    np.testing.assert_allclose((fp8 - lat) / (bf16 - lat), (1 + 4 / 128 + 2) / 4, rtol=1e-12)
    tp8 = Parallelism(8, "tp")
    np.testing.assert_allclose(collective_ms(H200, MOE, t, dtype_bytes=1, parallel=tp8),
                               collective_ms(H200, MOE, t, dtype_bytes=2, parallel=tp8), rtol=0)


def test_dual_batch_overlap_pays_the_larger_of_compute_and_communication_not_their_sum() -> None:
    h800 = GPUS["h800"]
    t = np.array([64.0, 4096.0])
    plain, dbo = Parallelism(32, "dp-ep", nodes=4), Parallelism(32, "dp-ep", nodes=4, micro_batches=2)
    comm = collective_ms(h800, DSV3, t, dtype_bytes=1, parallel=plain)
    summed = dense_verify_ms(h800, DSV3, t, dtype_bytes=1, parallel=plain) - h800.step_overhead_ms
    compute = summed - comm
    hidden = dense_verify_ms(h800, DSV3, t, dtype_bytes=1, parallel=dbo) - h800.step_overhead_ms
    np.testing.assert_allclose(hidden, np.maximum(compute, comm), rtol=1e-12)
    assert np.all(hidden < summed)


@pytest.mark.parametrize(("parallel", "needle"), [
    (Parallelism(32, "dp-ep", nodes=3), "nodes=3 must be >= 1 and divide gpus=32"),
    (Parallelism(16, "tp", nodes=2), "only dp-ep spans nodes"),
    (Parallelism(32, "dp-ep", nodes=2), "16 per node; a NVIDIA H800 SXM5 80GB node has 8"),
    (Parallelism(8, "dp-ep", micro_batches=3), "micro_batches=3 must be 1 or 2"),
])
def test_a_layout_the_hardware_cannot_take_is_an_error_naming_the_numbers(
        parallel: Parallelism, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        parallel.check(DSV3, GPUS["h800"])
