"""Measured compute and memory ceilings of the profiling device, for the analytic roofline.

The roofline needs a peak FLOP/s and a memory bandwidth. For a CPU there is no datasheet
figure worth trusting (turbo, AMX availability, sharing), so the profiler measures both in
the same run as the profile: the best of several large square matmuls in the profile's
dtype, and the best of several large tensor copies (bytes read + bytes written).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparksim.profiling.timing import Clock, Timing, time_replays


@dataclass(frozen=True)
class MeasuredPeaks:
    """The best throughputs seen on this device, with how they were measured."""

    matmul_flops_per_s: float
    copy_bytes_per_s: float
    matmul_size: int  # n of the n×n×n matmul
    copy_bytes: int  # size of the copied buffer

    def describe(self) -> str:
        return (
            f"best of repeated {self.matmul_size}^3 matmuls and {self.copy_bytes / 2**20:.0f} MiB "
            "copies (read + write counted), measured in the same run as the profile"
        )


def measure_peaks(
    device: torch.device, dtype: torch.dtype, clock: Clock, *, replays: int = 7
) -> MeasuredPeaks:
    """Measure peak matmul FLOP/s in `dtype` and copy bandwidth on `device`."""
    cuda = device.type == "cuda"
    n = 8192 if cuda else 2048
    # Far larger than any cache level, so the copy streams from memory.
    copy_bytes = (2 << 30) if cuda else (512 << 20)
    mm = _time_matmul(n, device, dtype, clock, replays)
    cp = _time_copy(copy_bytes, device, clock, replays)
    return MeasuredPeaks(
        matmul_flops_per_s=2.0 * n**3 / (mm.min_ms / 1e3),
        copy_bytes_per_s=2.0 * copy_bytes / (cp.min_ms / 1e3),
        matmul_size=n,
        copy_bytes=copy_bytes,
    )


def _time_matmul(n: int, device: torch.device, dtype: torch.dtype, clock: Clock, replays: int
                 ) -> Timing:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    return time_replays(lambda: torch.matmul(a, b, out=out), clock, warmup=2, replays=replays)


def _time_copy(copy_bytes: int, device: torch.device, clock: Clock, replays: int) -> Timing:
    src = torch.ones(copy_bytes // 4, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    return time_replays(lambda: dst.copy_(src), clock, warmup=2, replays=replays)
