"""Turn sweep results into a profile folder, and write a card saying how each file was made.

The measured (tokens, context) grid goes to grid.csv as it was measured; verify.csv (dense
cost by token count) and attention.csv (KV reads) are fitted from it (`fit`), the draft
table holds the drafter's measured cost by request count and drafted positions, and the
card's cost model holds the prefill attention coefficient fitted to prompt-only steps.
Every measured point, and every unavailable one with its reason, stays in the card.
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

from sparksim.cost.profile import write_profile
from sparksim.errors import SparksimError
from sparksim.profiling.fit import (
    AttentionFit,
    KvSplit,
    PrefillFit,
    fit_prefill,
    split_dense_attention,
)
from sparksim.profiling.memory import CPU_MEMORY_NOTE, memory_section, weights_bytes
from sparksim.profiling.peaks import MeasuredPeaks
from sparksim.profiling.sweep import (
    DTYPE_BYTES,
    DraftResult,
    PointResult,
    PrefillResult,
    SweepConfig,
)

GRID_COLUMNS = ["tokens", "context", "requests", "step_ms", "min_ms", "max_ms"]


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


def grid_table(points: list[PointResult]) -> pd.DataFrame:
    """Return grid.csv: every measured point (tokens, context, requests, step_ms, min_ms, max_ms)."""
    rows = [{"tokens": p.tokens, "context": p.context, "requests": p.requests,
             "step_ms": p.timing.median_ms, "min_ms": p.timing.min_ms, "max_ms": p.timing.max_ms}
            for p in points if p.timing is not None]
    df = pd.DataFrame(rows, columns=GRID_COLUMNS)
    return df.sort_values(["context", "tokens"]).reset_index(drop=True)


def draft_table(drafts: list[DraftResult]) -> tuple[pd.DataFrame | None, list[int]]:
    """Return (the draft table by positions and requests, request counts left out).

    Every positions row needs the same request counts (the format's grid), so a request
    count unavailable at some positions is left out of the table (the card keeps it).
    """
    ok = [d for d in drafts if d.timing is not None]
    failed = sorted({d.requests for d in drafts if d.timing is None})
    rows = [{"positions": d.positions, "requests": d.requests, "draft_ms": d.timing.median_ms,
             "min_ms": d.timing.min_ms, "max_ms": d.timing.max_ms}
            for d in ok if d.requests not in failed and d.timing is not None]
    if not rows:
        return None, failed
    df = pd.DataFrame(rows).sort_values(["positions", "requests"]).reset_index(drop=True)
    return df, failed


def drafter_name(cfg: SweepConfig) -> str:
    """The drafter's name in the card and its table's file name: dspark-<layers>."""
    assert cfg.drafter is not None
    return f"dspark-{cfg.drafter.num_layers}"


def build_card(
    cfg: SweepConfig, points: list[PointResult], drafts: list[DraftResult], command: str, *,
    split: KvSplit, prefill: PrefillFit | None, prefill_points: list[PrefillResult],
    left_out_requests: list[int], memory: dict[str, Any] | None = None,
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
        "eager_dispatch": "measured: each step is timed as it runs, between two synchronisations, "
                          "so an eager step's CPU kernel launches overlap its GPU work as in an "
                          "engine's forward pass" + ("; graph replays pay no dispatch" if cfg.graphs else ""),
        "tokens_per_request": cfg.tokens_per_request,
        "convention": "grid.csv: a row (tokens T, context C) times one verification step of "
                      "R = ceil(T / tokens_per_request) requests, each with its share of the T new "
                      "tokens appended after C cached tokens (K = R*C KV tokens read); LM head on "
                      "all T tokens",
        "files": {
            "grid.csv": "the measured grid, for reference (the simulator does not read it)",
            "verify.csv": "dense(T): the intercept of each token count's line over contexts "
                          "(cost_model.kv_fit)",
            "attention.csv": "the fitted cost of reading K KV tokens" + (
                ", by request count" if split.how == "per-request" else ""),
            **({f"draft-{drafter_name(cfg)}.csv": "the drafter's measured cost by request count "
                                                  "and drafted positions"}
               if cfg.drafter is not None else {}),
        },
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
        "cost_model": _cost_model(split, prefill, prefill_points),
    }
    if memory is not None:
        card["memory"] = memory
    else:
        card["memory_note"] = CPU_MEMORY_NOTE
    if cfg.drafter is not None:
        name = drafter_name(cfg)
        card["drafters"] = {name: {
            "file": f"draft-{name}.csv",
            "kind": "block",
            "num_layers": cfg.drafter.num_layers,
            "gamma": cfg.drafter.gamma,
            "context": cfg.draft_context_used,
            "kv_ms_per_token": 0,
            "shape": "DSpark (DFlash backbone with KV injection, Markov head, confidence head)",
            "target_layers": cfg.drafter.num_target_features,
            "markov_rank": cfg.drafter.markov_rank,
            "source": f"measured: one drafting step per (requests R, positions p), a block of "
                      f"anchor + p - 1 masks per request over a {cfg.draft_context_used}-token "
                      "context; kv_ms_per_token 0 because reading that context is in the table "
                      "(the simulator does not scale it with its requests' contexts)",
            "unavailable": [{"requests": d.requests, "positions": d.positions, "reason": d.error}
                            for d in drafts if d.timing is None],
            **({"left_out_requests": left_out_requests} if left_out_requests else {}),
        }}
        card["default_drafter"] = name
    card["points"] = [
        {"tokens": p.tokens, "context": p.context, "requests": p.requests,
         **({"ran_as": p.run_tokens} if p.run_tokens != p.tokens else {}),
         "graph": p.graph,
         **({"min_ms": _r(p.timing.min_ms), "median_ms": _r(p.timing.median_ms),
             "max_ms": _r(p.timing.max_ms)} if p.timing is not None else {"unavailable": p.error})}
        for p in points
    ]
    card["draft_points"] = [
        {"requests": d.requests, "positions": d.positions, "graph": d.graph,
         **({"min_ms": _r(d.timing.min_ms), "median_ms": _r(d.timing.median_ms),
             "max_ms": _r(d.timing.max_ms)} if d.timing is not None else {"unavailable": d.error})}
        for d in drafts
    ]
    card["unavailable"] = [{"tokens": p.tokens, "context": p.context, "reason": p.error}
                           for p in points if p.timing is None]
    if split.left_out:
        card["left_out_of_verify_csv"] = {
            "tokens": split.left_out,
            "why": "measured at fewer than 2 contexts (see unavailable), so dense and KV cost "
                   "cannot be told apart there"}
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


def _cost_model(split: KvSplit, prefill: PrefillFit | None,
                prefill_points: list[PrefillResult]) -> dict[str, Any]:
    """The card's cost model: how verify.csv and attention.csv were fitted, and prefill's c."""
    cm: dict[str, Any] = {
        "kind": "tokens+kv (sparksim.cost.profile), fitted from the measured grid",
        "prefill_attention_ms_per_token_sq": prefill.coef_ms_per_token_sq if prefill else 0.0,
        "kv_fit": split.summary(),
    }
    if prefill is not None:
        cm["prefill_fit"] = prefill.summary()
    else:
        cm["prefill_fit"] = {"not_fitted": "fewer than 3 prompt lengths were measured; the "
                                           "coefficient is 0 (prefill attention unpriced)",
                             "unavailable": [{"tokens": p.tokens, "reason": p.error}
                                             for p in prefill_points if p.timing is None]}
    return cm


def write_measured_profile(
    out: Path, cfg: SweepConfig, points: list[PointResult], drafts: list[DraftResult],
    command: str, *, prefill: list[PrefillResult] | None = None,
    attention_fit: AttentionFit = "per-request", peaks: MeasuredPeaks | None = None,
    note: str = "", rounds: int = 1,
) -> Path:
    """Fit the cost tables and write the profile folder atomically (validated before it lands)."""
    grid = grid_table(points)
    if grid.empty:
        reasons = sorted({p.error for p in points})
        raise SparksimError(f"no point of the sweep could be measured ({'; '.join(reasons)})")
    split = split_dense_attention(grid, attention_fit)
    measured_prefill = [p for p in prefill or [] if p.timing is not None]
    pfit = fit_prefill([p.tokens for p in measured_prefill],
                       [p.timing.median_ms for p in measured_prefill if p.timing is not None]
                       ) if len(measured_prefill) >= 3 else None
    draft, left_out_requests = draft_table(drafts)
    analytic = _analytic_error(cfg, points, peaks) if peaks is not None else None
    card = build_card(cfg, points, drafts, command, split=split, prefill=pfit,
                      prefill_points=prefill or [], left_out_requests=left_out_requests,
                      memory=_memory(cfg, points, drafts), peaks=peaks, analytic_error=analytic,
                      note=note, rounds=rounds)
    extra = {"attention.csv": split.attention_table(), "grid.csv": grid}
    if draft is not None and cfg.drafter is not None:
        extra[f"draft-{drafter_name(cfg)}.csv"] = draft
    elif cfg.drafter is not None:  # every drafter point failed: no table, the card says why
        card["drafter_not_written"] = card.pop("drafters")[drafter_name(cfg)]
        card.pop("default_drafter")
        card["files"].pop(f"draft-{drafter_name(cfg)}.csv")
    return write_profile(out, split.verify_table(), card, extra=extra)


def _memory(cfg: SweepConfig, points: list[PointResult], drafts: list[DraftResult]
            ) -> dict[str, Any] | None:
    """The card's memory figures on CUDA (None on CPU, which has no budget worth modelling)."""
    if cfg.device != "cuda":
        return None
    dtype_bytes = DTYPE_BYTES[cfg.dtype]
    return memory_section(
        torch.cuda.get_device_properties(0).total_memory,
        weights_bytes(cfg.spec, cfg.drafter, dtype_bytes),
        cfg.spec.kv_bytes_per_token * dtype_bytes,
        max([p.activation_bytes for p in points] + [d.activation_bytes for d in drafts]),
        graphs=cfg.graphs,
    )


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
        compute_eff=1.0, mem_eff=1.0, attn_compute_eff=1.0, attn_mem_eff=1.0,
        step_overhead_ms=0.0, source=peaks.describe(),
    )
    measured = pd.DataFrame(
        [{"tokens": p.run_tokens, "context": p.context, "step_ms": p.timing.median_ms}
         for p in points if p.timing is not None]
    )
    return {
        "what": "median |analytic / measured - 1| of sparksim.cost.roofline.roofline_verify_ms against "
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
