"""What each summary figure is called and its unit, for every table, figure and report that shows it.

Import-free, so a command's `--help` does not pay for pandas to name its columns.
"""

from __future__ import annotations

METRICS: dict[str, tuple[str, str]] = {  # summary.json key -> (name, unit)
    "output_throughput": ("output throughput", "tok/s"),
    "tput_per_gpu": ("throughput per GPU", "tok/s/GPU"),
    "interactivity": ("interactivity", "tok/s/user"),
    "mean_acceptance_length": ("mean acceptance length", "tok/step"),
    "verify_budget_per_request": ("verify budget per request", "tok/step"),
    "mean_ttft_ms": ("mean TTFT", "ms"),
    "p99_ttft_ms": ("p99 TTFT", "ms"),
    "mean_tpot_ms": ("mean TPOT", "ms"),
    "p99_tpot_ms": ("p99 TPOT", "ms"),
    "median_itl_ms": ("median ITL", "ms"),
    "mean_e2el_ms": ("mean E2EL", "ms"),
    "request_throughput": ("request throughput", "req/s"),
}


def shown(*keys: str) -> tuple[tuple[str, str, str], ...]:
    """Return (key, name, unit) for each of `keys`, in that order."""
    return tuple((key, *METRICS[key]) for key in keys)
