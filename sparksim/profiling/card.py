"""Turn sweep results into a profile folder: verify.csv, draft.csv and a card saying how.

verify.csv must hold every context at the same token counts (the profile format's grid),
so a token count that is unavailable at some context is left out of verify.csv; every
measured point, and every unavailable one with its reason, stays in the card.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from sparksim.profile import write_profile
from sparksim.profiling.peaks import MeasuredPeaks
from sparksim.profiling.sweep import DTYPE_BYTES, DraftResult, PointResult, SweepConfig


def device_info(device: str) -> dict[str, Any]:
    """Describe the device and software a profile was measured with."""
    info: dict[str, Any] = {"torch": str(torch.__version__), "python": platform.python_version()}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            name=torch.cuda.get_device_name(0),
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=str(torch.version.cuda),
            driver=_nvidia_driver(),
            devices_visible=torch.cuda.device_count(),
        )
    else:
        info.update(name=cpu_name(), logical_cpus=os.cpu_count(), torch_threads=torch.get_num_threads(),
                    machine=platform.machine())
    return info


def cpu_name() -> str:
    """Return the CPU model from /proc/cpuinfo (or platform's best guess elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "unknown (nvidia-smi not found)"
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True)
    except (subprocess.SubprocessError, OSError) as exc:
        return f"unknown ({exc})"
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown"


def verify_table(points: list[PointResult]) -> tuple[pd.DataFrame, list[int], list[int]]:
    """Return (verify.csv rows, token counts left out, contexts left out) from the sweep points.

    A context with no measured point is left out first; then a token count unavailable at
    any remaining context, because the format needs the same token counts at every context.
    """
    ok = [p for p in points if p.timing is not None]
    contexts = sorted({p.context for p in points})
    kept_ctx = sorted({p.context for p in ok})
    dropped_ctx = [c for c in contexts if c not in kept_ctx]
    tokens = sorted({p.tokens for p in points})
    have = {(p.tokens, p.context) for p in ok}
    kept_tok = [t for t in tokens if all((t, c) in have for c in kept_ctx)]
    dropped_tok = [t for t in tokens if t not in kept_tok]
    rows = [
        {"context": p.context, "tokens": p.tokens, "step_ms": p.timing.median_ms,
         "min_ms": p.timing.min_ms, "max_ms": p.timing.max_ms}
        for p in ok if p.tokens in kept_tok and p.timing is not None
    ]
    df = pd.DataFrame(rows, columns=["context", "tokens", "step_ms", "min_ms", "max_ms"])
    return df.sort_values(["context", "tokens"]).reset_index(drop=True), dropped_tok, dropped_ctx


def draft_table(drafts: list[DraftResult]) -> pd.DataFrame | None:
    rows = [{"requests": d.requests, "draft_ms": d.timing.median_ms}
            for d in drafts if d.timing is not None]
    return pd.DataFrame(rows) if rows else None


def build_card(
    cfg: SweepConfig, points: list[PointResult], drafts: list[DraftResult], command: str, *,
    dropped_tokens: list[int], dropped_contexts: list[int],
    peaks: MeasuredPeaks | None = None, analytic_error: Any = None, note: str = "", rounds: int = 1,
) -> dict[str, Any]:
    """Assemble card.yaml: how, where and on what the profile was measured, point by point."""
    spec = cfg.spec
    dev = device_info(cfg.device)
    card: dict[str, Any] = {
        "source": "measured",
        "hardware": dev["name"],
        "device": dev,
        "devices": 1,
        "parallelism": "single device, no tensor/pipeline parallelism (docs/profiling.md says "
                       "how a tensor-parallel profile is measured and fed in)",
        "model": spec.name,
        "model_config": spec.to_hf_config(),
        "model_config_hash": spec.config_hash(),
        "dtype": cfg.dtype,
        "weights": "random (timing does not depend on weight values; nothing downloaded)",
        "engine": f"sparksim.profiling (PyTorch {torch.__version__} eager"
                  f"{' + CUDA graphs' if cfg.graphs else ''}; scaled_dot_product_attention with GQA "
                  "folded into the query length and a causal mask; flattened variable-length "
                  "batch over a preallocated KV cache written in place)",
        "tokens_per_request": cfg.tokens_per_request,
        "convention": "a row (tokens B, context C) times one verification step of "
                      "R = ceil(B / tokens_per_request) requests, each with its share of the B new "
                      "tokens appended after C cached tokens; LM head on all B tokens",
        "graph_capture_sizes": list(cfg.capture_sizes) if cfg.graphs else [],
        "replays": cfg.replays,
        "warmup": cfg.warmup,
        "rounds": rounds,
        "statistic": "step_ms is the median of the timed replays (pooled over rounds); "
                     "min_ms/max_ms their range",
        "timer": "CUDA events after torch.cuda.synchronize()" if cfg.device == "cuda"
                 else "time.perf_counter",
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
    }
    if cfg.drafter is not None:
        card["drafter"] = {
            "shape": "DSpark (DFlash backbone with KV injection, Markov head, confidence head)",
            "layers": cfg.drafter.num_layers, "gamma": cfg.drafter.gamma,
            "target_layers": cfg.drafter.target_layers, "markov_rank": cfg.drafter.markov_rank,
            "context": cfg.draft_context_used,
            "unavailable": [{"requests": d.requests, "reason": d.error}
                            for d in drafts if d.timing is None],
        }
    card["points"] = [
        {"tokens": p.tokens, "context": p.context, "requests": p.requests,
         **({"ran_as": p.run_tokens} if p.run_tokens != p.tokens else {}),
         "graph": p.graph,
         **({"min_ms": _r(p.timing.min_ms), "median_ms": _r(p.timing.median_ms),
             "max_ms": _r(p.timing.max_ms)} if p.timing is not None else {"unavailable": p.error})}
        for p in points
    ]
    card["draft_points"] = [
        {"requests": d.requests, "graph": d.graph,
         **({"min_ms": _r(d.timing.min_ms), "median_ms": _r(d.timing.median_ms),
             "max_ms": _r(d.timing.max_ms)} if d.timing is not None else {"unavailable": d.error})}
        for d in drafts
    ]
    unavailable = [{"tokens": p.tokens, "context": p.context, "reason": p.error}
                   for p in points if p.timing is None]
    card["unavailable"] = unavailable
    if dropped_tokens or dropped_contexts:
        card["left_out_of_verify_csv"] = {"tokens": dropped_tokens, "contexts": dropped_contexts,
                                          "why": "unavailable at some context (see unavailable)"}
    if peaks is not None:
        card["measured_peaks"] = {
            "matmul_tflops": _r(peaks.matmul_flops_per_s / 1e12),
            "copy_gb_per_s": _r(peaks.copy_bytes_per_s / 1e9),
            "dtype": cfg.dtype, "how": peaks.describe(),
        }
    if analytic_error is not None:
        card["analytic_error"] = analytic_error
    if note:
        card["note"] = note
    return card


def write_measured_profile(
    out: Path, cfg: SweepConfig, points: list[PointResult], drafts: list[DraftResult],
    command: str, *, peaks: MeasuredPeaks | None = None, note: str = "", rounds: int = 1,
) -> Path:
    """Write the profile folder atomically (validated before it replaces `out`)."""
    verify, dropped_tok, dropped_ctx = verify_table(points)
    if verify.empty:
        from sparksim.errors import SparksimError

        reasons = sorted({p.error for p in points})
        raise SparksimError(f"no point of the sweep could be measured ({'; '.join(reasons)})")
    analytic = _analytic_error(cfg, points, peaks) if peaks is not None else None
    card = build_card(cfg, points, drafts, command, dropped_tokens=dropped_tok,
                      dropped_contexts=dropped_ctx, peaks=peaks, analytic_error=analytic, note=note,
                      rounds=rounds)
    return write_profile(out, verify, card, draft_table(drafts))


def _analytic_error(
    cfg: SweepConfig, points: list[PointResult], peaks: MeasuredPeaks
) -> dict[str, Any]:
    """Compare the roofline, fed this device's measured peaks, with every measured point."""
    from sparksim.hardware import HardwareSpec
    from sparksim.profiling.accuracy import analytic_error_by_decade

    # The peaks were measured with real kernels, so no efficiency factor is applied on top;
    # and the profile times the forward pass alone, so there is no engine step overhead.
    hw = HardwareSpec(
        name=f"{device_info(cfg.device)['name']} (measured peaks)",
        peak_flops=peaks.matmul_flops_per_s, mem_bytes_per_s=peaks.copy_bytes_per_s,
        compute_eff=1.0, mem_eff=1.0, step_overhead_ms=0.0, source=peaks.describe(),
    )
    measured = pd.DataFrame(
        [{"tokens": p.run_tokens, "context": p.context, "step_ms": p.timing.median_ms}
         for p in points if p.timing is not None]
    )
    return {
        "what": "median |analytic / measured - 1| of sparksim.roofline.roofline_verify_ms against "
                "every measured point, per decade of B (ratio < 1: the roofline is optimistic)",
        "hardware_spec": {"peak_flops": float(f"{hw.peak_flops:.4g}"),
                          "mem_bytes_per_s": float(f"{hw.mem_bytes_per_s:.4g}"),
                          "compute_eff": hw.compute_eff, "mem_eff": hw.mem_eff,
                          "step_overhead_ms": hw.step_overhead_ms, "source": hw.source},
        "by_decade": analytic_error_by_decade(
            measured, hw, cfg.spec, dtype_bytes=DTYPE_BYTES[cfg.dtype],
            tokens_per_request=cfg.tokens_per_request),
    }


def _r(x: float) -> float:
    return float(f"{x:.5g}")
