"""GPU presets for the analytic roofline: peak dense throughput, HBM bandwidth and overhead knobs.

Peak figures are the vendors' public datasheet numbers. NVIDIA quotes tensor-core
throughput "with sparsity" (2:4 structured); the dense figure used here is half of it.
The efficiency fields are published kernel measurements, by regime (`MEASURED_EFFICIENCY`);
the overhead fields are published indicative figures or assumptions. `FIELD_SOURCES` says
where every value comes from, and profile cards copy it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sparksim.errors import ConfigError

# The share of HBM an engine may use, vLLM's default (`--gpu-memory-utilization`): the one
# figure behind `cluster.gpu_memory_utilization`'s default, profile cards' KV capacity and
# the analytic profiles' check that the weights fit.
GPU_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator as the roofline sees it: compute and memory ceilings plus fixed costs."""

    name: str
    peak_flops: float  # dense BF16/FP16 tensor-core FLOP/s
    mem_bytes_per_s: float  # HBM bandwidth, bytes/s
    hbm_bytes: float = 0.0  # HBM capacity, bytes (recorded in cards; the roofline ignores it)
    peak_flops_fp8: float | None = None  # dense FP8 FLOP/s; None where the chip has no FP8 tensor cores
    compute_eff: float = 0.6  # fraction of dense peak FLOP/s that large-M (prefill-sized) GEMMs reach
    mem_eff: float = 0.8  # fraction of HBM bandwidth that weight-streaming (decode-sized) GEMMs reach
    attn_compute_eff: float = 0.6  # fraction of dense peak that prefill (FlashAttention) attention reaches
    attn_mem_eff: float = 0.8  # fraction of HBM bandwidth that paged decode attention's KV read reaches
    link_eff: float = 1.0  # fraction of link bandwidth that NCCL collectives reach (bus bandwidth)
    step_overhead_ms: float = 0.5  # fixed cost per engine step outside the kernels (scheduling, sampling)
    launch_us: float = 10.0  # CPU cost of launching one kernel eagerly (outside a CUDA graph)
    kernels_per_layer: int = 12  # kernels one decoder layer launches when run eagerly
    link_bytes_per_s: float = 0.0  # GPU-to-GPU bandwidth per GPU, one direction (NVLink)
    collective_latency_us: float = 10.0  # fixed cost of one all-reduce or all-to-all
    gpus_per_node: int = 8  # GPUs in one NVLink domain (a node; an NVL72 rack is one)
    internode_bytes_per_s: float = 50e9  # inter-node network per GPU, one direction (a 400 Gb/s NIC each)
    internode_eff: float = 0.86  # fraction of it an expert-parallel all-to-all reaches
    source: str = ""  # where the peak figures come from

    def peak_for(self, dtype_bytes: int) -> float:
        """Return the dense peak FLOP/s for weights of `dtype_bytes` bytes (1 = FP8, 2 = BF16/FP16)."""
        if dtype_bytes >= 2:
            return self.peak_flops
        if self.peak_flops_fp8 is None:
            raise ConfigError(f"hardware {self.name!r} has no FP8 tensor cores (dtype_bytes={dtype_bytes})")
        return self.peak_flops_fp8

    def eager_overhead_ms(self, num_layers: int) -> float:
        """Return the launch cost of one eager forward pass through `num_layers` layers, in ms."""
        return self.kernels_per_layer * num_layers * self.launch_us / 1e3

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Published measurements of what real kernels reach, by regime (docs/profiles.md §"Where
# the efficiencies come from" quotes each figure). H200 shares the H100's compute and its
# kernels; where a chip has no published figure for a regime, the Hopper one is carried and
# FIELD_SOURCES says so.
MEASURED_EFFICIENCY: dict[str, dict[str, Any]] = {
    # compute_eff: torchao roofline_utils.py "pct_achievable_gemm_tops_bf16": 0.69 (H100, large
    #   inputs); mem_eff: DeepGEMM README M=64 GEMMs on H800 (H100's HBM), mean 68 % of 3.35 TB/s;
    # attn_mem_eff: FlashInfer blog (2024-02) Fig. 6, H100 paged decode at batch 16-64 and 1k-4k
    #   tokens, 85-89 % (vLLM's PagedAttention 85 %); attn_compute_eff: FlashAttention-3 paper
    #   (arXiv 2407.08608) Fig. 5, causal head dim 128, 521-579 TFLOPS at 2k-4k = 53-59 %;
    # link_eff: nccl-tests #212 (NCCL maintainer): ring bus bandwidth 370 GB/s of 450 on H100
    "hopper": {"compute_eff": 0.69, "mem_eff": 0.68, "attn_mem_eff": 0.85, "attn_compute_eff": 0.55,
               "link_eff": 0.82},
    # compute_eff: ml-engineering MAMF table A100 SXM 271.2/312 = 86.9 % at its best shape, times
    #   the H100's realistic/best ratio (0.69/0.803); mem_eff: gpt-fast README, Llama-2-7B decode
    #   1,397 GB/s = 68.5 % of 2,039 GB/s; attn_mem_eff: FlashInfer blog Fig. 6, A100 vLLM
    #   PagedAttention at batch 64 × 1k ≈ 81 %; attn_compute_eff: FlashAttention-2 paper
    #   (arXiv 2307.08691) "50-73 % of the theoretical maximum" on A100, causal: the low end;
    # link_eff: ml-engineering network README, 8 × A100 all_reduce_perf 234.9 GB/s of 300 at 16 GiB
    "a100": {"compute_eff": 0.75, "mem_eff": 0.68, "attn_mem_eff": 0.81, "attn_compute_eff": 0.50,
             "link_eff": 0.78},
    # compute_eff: MAMF B200 1,745/2,250 = 77.6 % times the H100's realistic/best ratio; mem_eff,
    #   attn_mem_eff, attn_compute_eff: no published B200 figure: Hopper's carried; link_eff:
    #   ml-engineering network README, 8 × B200 ring bus bandwidth 682 GB/s of 900
    "b200": {"compute_eff": 0.67, "mem_eff": 0.68, "attn_mem_eff": 0.85, "attn_compute_eff": 0.55,
             "link_eff": 0.76},
}

# DeepGEMM's grouped FP8 GEMMs for MoE on H800 SXM5 (deepseek-ai/DeepGEMM README.md at commit
# 55ab91f, 2025-03-25, "Grouped GEMMs for MoE models": the masked layout DeepEP's low-latency
# decode feeds, the contiguous one prefill uses), one row per published shape:
# (layout, groups, M per group, N, K, TFLOPS). N = 4096, K = 7168 is DeepSeek-V3's expert gate-up
# (2 x 2048 by hidden 7168); N = 7168, K = 2048 its down projection.
DEEPGEMM_GROUPED_FP8_H800: tuple[tuple[str, int, int, int, int, float], ...] = (
    ("masked", 4, 256, 4096, 7168, 932.0), ("masked", 4, 256, 7168, 2048, 815.0),
    ("masked", 2, 512, 4096, 7168, 1040.0), ("masked", 2, 512, 7168, 2048, 916.0),
    ("masked", 1, 1024, 4096, 7168, 1233.0), ("masked", 1, 1024, 7168, 2048, 925.0),
    ("contiguous", 8, 4096, 4096, 7168, 1346.0), ("contiguous", 8, 4096, 7168, 2048, 1214.0),
    ("contiguous", 4, 8192, 4096, 7168, 1346.0), ("contiguous", 4, 8192, 7168, 2048, 1214.0),
)
H800_FP8_PEAK_FLOPS = 1978.9e12  # the table's denominator: the H800's dense FP8 peak (H100 silicon)


def grouped_gemm_points() -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Return (tokens per expert, fraction of dense FP8 peak) at each M of DeepGEMM's table.

    At each M an expert's SwiGLU runs both published shapes, gate-up then down, so its
    efficiency is their FLOP-weighted harmonic mean: total FLOPs over the two kernels' time.
    """
    by_m: dict[int, list[tuple[float, float]]] = {}
    for _layout, _groups, m, n, k, tflops in DEEPGEMM_GROUPED_FP8_H800:
        by_m.setdefault(m, []).append((2.0 * m * n * k, tflops * 1e12))
    ms = sorted(by_m)
    eff = [sum(f for f, _ in by_m[m]) / sum(f / r for f, r in by_m[m]) / H800_FP8_PEAK_FLOPS for m in ms]
    return np.asarray(ms, dtype=np.float64), np.asarray(eff, dtype=np.float64)


def grouped_gemm_eff(tokens_per_expert: ArrayLike) -> NDArray[np.float64]:
    """Return the fraction of dense FP8 peak a routed expert's grouped GEMM reaches at
    `tokens_per_expert` tokens, from DeepGEMM's published table (`grouped_gemm_points`).

    Piecewise linear in log2(tokens) between the published Ms (256..8192), held flat outside
    them: below 256 tokens an expert's GEMM is weight-read-bound (its FLOPs hide under the
    bytes), above 8192 the table is flat already. Monotone non-decreasing, as the points are.
    """
    ms, eff = grouped_gemm_points()
    t = np.maximum(np.asarray(tokens_per_expert, dtype=np.float64), 1.0)
    return np.interp(np.log2(t), np.log2(ms), eff)


# FlashMLA's dense MLA decoding kernel on H800 SXM5 (deepseek-ai/FlashMLA README.md at commit
# 066b5ba, "Performance"): "up to 3000 GB/s in memory-bound configuration and 660 TFLOPS in
# computation-bound configuration" (580 TFLOPS before the 2025-04-22 kernel). It reads a BF16 KV
# cache and multiplies in BF16 (its support matrix: dense decoding, SM90, KV cache BF16), as
# DeepSeek's service does ("core MLA computations ... use the BF16 format": its inference-system
# overview, open-infra-index 202502OpenSourceWeek day 6). As fractions of the H800's HBM (3.35 TB/s)
# and dense BF16 peak (989.4 TFLOPS); carried to the other chips (no published MLA figure).
FLASHMLA_H800 = {"mem_bytes_per_s": 3000e9, "bf16_flops": 660e12}
MLA_ATTN_MEM_EFF = FLASHMLA_H800["mem_bytes_per_s"] / 3.35e12
MLA_ATTN_COMPUTE_EFF = FLASHMLA_H800["bf16_flops"] / 989.4e12
MLA_KV_DTYPE_BYTES = 2  # FlashMLA's dense decoding reads a BF16 cache
MLA_SOURCE = ("FlashMLA README (deepseek-ai/FlashMLA @ 066b5ba): dense MLA decoding on H800 SXM5 up to "
              "3000 GB/s memory-bound (3000/3350 = 0.896 of HBM) and 660 TFLOPS BF16 compute-bound "
              "(660/989.4 = 0.667 of dense BF16 peak), BF16 KV cache (its support matrix; DeepSeek's "
              "inference-system overview: core MLA computations in BF16); other chips: H800's carried")
GROUPED_GEMM_SOURCE = ("DeepGEMM README (deepseek-ai/DeepGEMM @ 55ab91f, 2025-03-25), grouped FP8 GEMMs on "
                       "H800: masked M=256/512/1024 (932/815, 1040/916, 1233/925 TFLOPS) and contiguous "
                       "M=4096/8192 (1346/1214) for N,K = 4096,7168 / 7168,2048; per M the FLOP-weighted "
                       "harmonic mean of the two shapes over 1978.9 TFLOPS, interpolated in log2(tokens "
                       "per expert), flat outside 256..8192; other chips: the fractions carried")

# Bytes per element of each dtype sparksim knows (weights, KV cache, activations).
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}

TERA = 1e12
GIB = 1 << 30

GPUS: dict[str, HardwareSpec] = {
    "h100": HardwareSpec(
        name="NVIDIA H100 SXM5 80GB",
        peak_flops=989.4 * TERA,
        mem_bytes_per_s=3.35 * TERA,
        hbm_bytes=79.11 * GIB,  # CUDA total, vLLM #27508
        peak_flops_fp8=1978.9 * TERA,
        link_bytes_per_s=450e9,
        **MEASURED_EFFICIENCY["hopper"],
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM column): BF16 1,979 TFLOPS and FP8 "
        "3,958 TFLOPS with sparsity (dense = half), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s "
        "(both directions; 450 GB/s each way)",
    ),
    "h200": HardwareSpec(
        name="NVIDIA H200 SXM 141GB",
        peak_flops=989.4 * TERA,
        mem_bytes_per_s=4.8 * TERA,
        hbm_bytes=139.80 * GIB,  # CUDA total
        peak_flops_fp8=1978.9 * TERA,
        link_bytes_per_s=450e9,
        **MEASURED_EFFICIENCY["hopper"],
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM column): BF16 1,979 TFLOPS and FP8 "
        "3,958 TFLOPS with sparsity (dense = half, same compute as H100), 141 GB HBM3e at 4.8 TB/s, "
        "NVLink 900 GB/s (both directions; 450 GB/s each way)",
    ),
    "a100": HardwareSpec(
        name="NVIDIA A100 SXM4 80GB",
        peak_flops=312 * TERA,
        mem_bytes_per_s=2.039 * TERA,
        hbm_bytes=79.14 * GIB,  # CUDA total
        peak_flops_fp8=None,
        link_bytes_per_s=300e9,
        **MEASURED_EFFICIENCY["a100"],
        source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column): BF16 312 TFLOPS dense "
        "(624 with sparsity), 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s (both directions); "
        "no FP8 tensor cores",
    ),
    "h800": HardwareSpec(
        name="NVIDIA H800 SXM5 80GB",
        peak_flops=989.4 * TERA,
        mem_bytes_per_s=3.35 * TERA,
        hbm_bytes=79.11 * GIB,  # the H100's
        peak_flops_fp8=1978.9 * TERA,
        link_bytes_per_s=200e9,
        **MEASURED_EFFICIENCY["hopper"],
        source="the H100 SXM's silicon with NVLink cut to 400 GB/s (both directions; 200 GB/s each "
        "way): NVIDIA H800 product brief; DeepSeek-V3 technical report (arXiv 2412.19437) §3.2.2: "
        "H800 nodes, NVLink 160 GB/s achievable, InfiniBand 50 GB/s per GPU",
    ),
    "b200": HardwareSpec(
        name="NVIDIA B200 (HGX B200)",
        peak_flops=2250 * TERA,
        mem_bytes_per_s=8.0 * TERA,
        hbm_bytes=178.35 * GIB,  # CUDA total
        peak_flops_fp8=4500 * TERA,
        link_bytes_per_s=900e9,
        **MEASURED_EFFICIENCY["b200"],
        source="NVIDIA HGX B200 specification, per GPU: FP16/BF16 4.5 PFLOPS and FP8 9 PFLOPS "
        "with sparsity (dense = half), HBM3e at 8 TB/s, NVLink 5 1.8 TB/s (both directions)",
    ),
    "gb200": HardwareSpec(
        name="NVIDIA GB200 (NVL72)",
        peak_flops=2500 * TERA,
        mem_bytes_per_s=8.0 * TERA,
        hbm_bytes=184.30 * GIB,  # estimated: see FIELD_SOURCES
        peak_flops_fp8=5000 * TERA,
        link_bytes_per_s=900e9,
        gpus_per_node=72,
        **MEASURED_EFFICIENCY["b200"],
        source="NVIDIA GB200 NVL72 specification, per rack of 72 GPUs: FP16/BF16 360 PFLOPS and FP8 "
        "720 PFLOPS with sparsity (per GPU dense: 2.5 and 5 PFLOPS), 13.4 TB HBM3e at 576 TB/s "
        "(186 GB, 8 TB/s per GPU), NVLink 130 TB/s (1.8 TB/s per GPU, both directions); the 72 "
        "GPUs are one NVLink domain",
    ),
}

# Where each HardwareSpec field's value comes from, for cards; `source` above covers the peaks.
FIELD_SOURCES: dict[str, str] = {
    "peak_flops": "datasheet (see hardware_source)",
    "mem_bytes_per_s": "datasheet (see hardware_source)",
    "hbm_bytes": "the memory CUDA reports (torch.cuda.mem_get_info's total, what vLLM's "
    "gpu_memory_utilization multiplies and `sparksim profile` records), from public PyTorch "
    "out-of-memory messages ('GPU 0 has a total capacity of ...'): H100 80GB 79.11 GiB (vLLM "
    "issue #27508; 79.11-79.25 across drivers), A100-SXM4-80GB 79.14, H200 139.80, B200 178.35; "
    "H800: the H100's; GB200: its nvidia-smi 189,471 MiB at the B200's CUDA/nvidia-smi ratio "
    "(178.35 GiB of 183,359 MiB), an estimate. CUDA sees a little less than nvidia-smi's "
    "memory.total, which is itself GiB-sized (the datasheets' '80 GB' is 80 GiB)",
    "peak_flops_fp8": "datasheet (see hardware_source)",
    "compute_eff": "measured, published: large BF16 GEMMs (MEASURED_EFFICIENCY: H100/H200 torchao "
    "roofline_utils 0.69; A100 and B200 the ml-engineering MAMF table scaled by the H100's "
    "realistic/best ratio)",
    "mem_eff": "measured, published: decode-sized (M <= 64) weight-streaming GEMMs, 68 % of HBM "
    "(DeepGEMM README on H800; gpt-fast README on A100); B200: Hopper's carried",
    "attn_compute_eff": "measured, published: causal prefill attention, head dim 128 (FlashAttention-3 "
    "paper Fig. 5 on H100, 53-59 % at 2k-4k tokens; FlashAttention-2 paper on A100); B200: "
    "Hopper's carried",
    "attn_mem_eff": "measured, published: paged decode attention's KV read (FlashInfer blog Fig. 6: "
    "H100 85-89 %, A100 vLLM 81 %); B200: Hopper's carried",
    "link_eff": "measured, published: NCCL ring all-reduce bus bandwidth over NVLink line rate "
    "(nccl-tests #212 H100 370/450; ml-engineering A100 234.9/300, B200 682/900)",
    "step_overhead_ms": "assumption: per-step scheduling, input preparation and sampling outside the graph",
    "launch_us": "published, indicative: PyTorch eager dispatch plus launch is 5-15 us of CPU per "
    "kernel (torchcomms PR #2455 ~15 us of Python/Triton dispatch; raw CUDA enqueue 2.6-2.8 us, "
    "ocannl #488); 10 us taken",
    "kernels_per_layer": "assumption: a Qwen3/Llama decoder layer run eagerly (norms, QKV, q/k norm, "
    "RoPE, attention, O, residual-norm, gate-up, SiLU-mul, down)",
    "link_bytes_per_s": "datasheet NVLink bandwidth per GPU, halved for one direction (see hardware_source)",
    "gpus_per_node": "datasheet: 8 GPUs per HGX/DGX node; 72 in one GB200 NVL72 NVLink domain",
    "internode_bytes_per_s": "published: one 400 Gb/s InfiniBand NIC (ConnectX-7) per GPU, 50 GB/s each "
    "way (DeepSeek-V3 technical report, arXiv 2412.19437, §3.2.2)",
    "internode_eff": "measured, published: DeepEP README, normal kernels on H800 + CX7 400 Gb/s, "
    "internode EP 16 dispatch/combine 43 GB/s (RDMA) of 50 (EP 32-64: 50-58 with adaptive routing)",
    "expert_imbalance": "measured, published (a Parallelism field, not the GPU's): max/mean routed tokens "
    "per GPU of an MoE layer. TensorRT-LLM examples/wide_ep/ep_load_balancer/README.md (@ 2a595f8): "
    "DeepSeek-R1 on EP36 with 288 slots (32 redundant) and offline EPLB, imbalance ratio (max-mean)/mean "
    "averaged over layers 0.115 -> 1.115; without EPLB on EP32 1.564 -> 2.564. Default 1.0 (ideal)",
    "collective_latency_us": "published: vLLM's custom all-reduce on H100 takes 10-13 us for small "
    "messages (sglang PR #2904: 10.1 us at 512 B, tp 8; vllm PR #24111: 13 us at 0.5 MB); plain "
    "NCCL 20-25 us; 10 us taken",
}


def get_gpu(name: str) -> HardwareSpec:
    """Return the preset named `name` (case-insensitive); raise ConfigError listing the presets."""
    key = name.strip().lower()
    if key not in GPUS:
        raise ConfigError(f"unknown gpu {name!r}; presets: {', '.join(GPUS)}")
    return GPUS[key]
