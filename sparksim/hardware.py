"""GPU presets for the analytic roofline: peak dense throughput, HBM bandwidth and overhead knobs.

Peak figures are the vendors' public datasheet numbers. NVIDIA quotes tensor-core
throughput "with sparsity" (2:4 structured); the dense figure used here is half of it.
The efficiency and overhead fields are modelling assumptions, not datasheet figures:
`FIELD_SOURCES` says where every value comes from, and profile cards copy it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

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
    compute_eff: float = 0.6  # fraction of peak FLOP/s that GEMMs and attention reach
    mem_eff: float = 0.8  # fraction of HBM bandwidth that streaming kernels reach
    step_overhead_ms: float = 0.5  # fixed cost per engine step outside the kernels (scheduling, sampling)
    launch_us: float = 10.0  # CPU cost of launching one kernel eagerly (outside a CUDA graph)
    kernels_per_layer: int = 12  # kernels one decoder layer launches when run eagerly
    link_bytes_per_s: float = 0.0  # GPU-to-GPU bandwidth per GPU, one direction (NVLink)
    collective_latency_us: float = 10.0  # fixed cost of one all-reduce or all-to-all
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


# Bytes per element of each dtype sparksim knows (weights, KV cache, activations).
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}

TERA = 1e12

GPUS: dict[str, HardwareSpec] = {
    "h100": HardwareSpec(
        name="NVIDIA H100 SXM5 80GB",
        peak_flops=989.4 * TERA,
        mem_bytes_per_s=3.35 * TERA,
        hbm_bytes=80e9,
        peak_flops_fp8=1978.9 * TERA,
        link_bytes_per_s=450e9,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM column): BF16 1,979 TFLOPS and FP8 "
        "3,958 TFLOPS with sparsity (dense = half), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s "
        "(both directions; 450 GB/s each way)",
    ),
    "h200": HardwareSpec(
        name="NVIDIA H200 SXM 141GB",
        peak_flops=989.4 * TERA,
        mem_bytes_per_s=4.8 * TERA,
        hbm_bytes=141e9,
        peak_flops_fp8=1978.9 * TERA,
        link_bytes_per_s=450e9,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM column): BF16 1,979 TFLOPS and FP8 "
        "3,958 TFLOPS with sparsity (dense = half, same compute as H100), 141 GB HBM3e at 4.8 TB/s, "
        "NVLink 900 GB/s (both directions; 450 GB/s each way)",
    ),
    "a100": HardwareSpec(
        name="NVIDIA A100 SXM4 80GB",
        peak_flops=312 * TERA,
        mem_bytes_per_s=2.039 * TERA,
        hbm_bytes=80e9,
        peak_flops_fp8=None,
        link_bytes_per_s=300e9,
        source="NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column): BF16 312 TFLOPS dense "
        "(624 with sparsity), 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s (both directions); "
        "no FP8 tensor cores",
    ),
    "b200": HardwareSpec(
        name="NVIDIA B200 (HGX B200)",
        peak_flops=2250 * TERA,
        mem_bytes_per_s=8.0 * TERA,
        hbm_bytes=180e9,
        peak_flops_fp8=4500 * TERA,
        link_bytes_per_s=900e9,
        source="NVIDIA HGX B200 specification, per GPU: FP16/BF16 4.5 PFLOPS and FP8 9 PFLOPS "
        "with sparsity (dense = half), HBM3e at 8 TB/s, NVLink 5 1.8 TB/s (both directions)",
    ),
}

# Where each HardwareSpec field's value comes from, for cards; `source` above covers the peaks.
FIELD_SOURCES: dict[str, str] = {
    "peak_flops": "datasheet (see hardware_source)",
    "mem_bytes_per_s": "datasheet (see hardware_source)",
    "hbm_bytes": "datasheet (see hardware_source)",
    "peak_flops_fp8": "datasheet (see hardware_source)",
    "compute_eff": "assumption: well-tuned BF16 GEMMs on Hopper reach ~60-70 % of dense peak",
    "mem_eff": "assumption: streaming kernels reach ~80 % of HBM bandwidth",
    "step_overhead_ms": "assumption: per-step scheduling, input preparation and sampling outside the graph",
    "launch_us": "assumption: PyTorch eager dispatch plus kernel launch, per kernel",
    "kernels_per_layer": "assumption: a Qwen3/Llama decoder layer run eagerly (norms, QKV, q/k norm, "
    "RoPE, attention, O, residual-norm, gate-up, SiLU-mul, down)",
    "link_bytes_per_s": "datasheet NVLink bandwidth per GPU, halved for one direction (see hardware_source)",
    "collective_latency_us": "assumption: NCCL small-message all-reduce / all-to-all latency on one "
    "NVLink node is about 5-20 us; 10 us taken",
}


def get_gpu(name: str) -> HardwareSpec:
    """Return the preset named `name` (case-insensitive); raise ConfigError listing the presets."""
    key = name.strip().lower()
    if key not in GPUS:
        raise ConfigError(f"unknown gpu {name!r}; presets: {', '.join(GPUS)}")
    return GPUS[key]
