"""The analytic profile's options: build one from `sparksim profile analytic`'s options, or
from the command a card records.

`profile analytic` and `profile calibrate` share this: a calibrated profile is its base
profile remade by the base card's own command with the fitted hardware parameters.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

import pandas as pd

from sparksim.cost.cuda_graphs import default_capture_sizes, eager_step_ms, pad_to_capture
from sparksim.cost.draft_step import drafter_presets
from sparksim.cost.models import load_model_spec
from sparksim.cost.parallelism import Parallelism, collective_ms, overlapped, routed_compute_ms
from sparksim.cost.roofline import analytic_profile
from sparksim.cost.target_step import dense_bytes, verify_flops
from sparksim.errors import ConfigError
from sparksim.hardware import DTYPE_BYTES, get_gpu

# every option of `sparksim profile analytic`, by parameter name, with its default and type
OPTION_DEFAULTS: dict[str, Any] = {
    "gpu": "h100", "model": "qwen3-8b", "dtype": "bf16", "out": None,
    "compute_eff": None, "mem_eff": None, "attn_compute_eff": None, "attn_mem_eff": None,
    "link_eff": None, "step_overhead_ms": None, "launch_us": None, "kernels_per_layer": None,
    "capture_sizes": "vllm", "max_capture_size": 512, "max_tokens": 8192, "drafters": "",
    "gpus": 1, "parallel": "tp", "nodes": 1, "micro_batches": 1,
    "redundant_experts": 0, "expert_imbalance": 1.0, "gamma": None, "draft_layers": 5, "draft_context": 0,
    "max_requests": 1024,
}
_INT_OPTIONS = {"kernels_per_layer", "max_capture_size", "max_tokens", "gpus", "nodes", "micro_batches",
                "redundant_experts", "gamma",
                "draft_layers", "draft_context", "max_requests"}
_FLOAT_OPTIONS = {"compute_eff", "mem_eff", "attn_compute_eff", "attn_mem_eff", "link_eff",
                  "step_overhead_ms", "launch_us", "expert_imbalance"}
# the HardwareSpec fields `profile analytic` takes as options (None: the preset's)
HW_OPTIONS = ("compute_eff", "mem_eff", "attn_compute_eff", "attn_mem_eff", "link_eff",
              "step_overhead_ms", "launch_us", "kernels_per_layer")


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{flag}={text!r}: expected integers like 1024,4096") from None


def _capture_sizes(text: str, max_size: int) -> list[int]:
    """Parse `--capture-sizes`: 'vllm' (vLLM's default up to `max_size`), 'none', or a comma list."""
    key = text.strip().lower()
    if key == "vllm":
        return list(default_capture_sizes(max_size))
    if key in ("none", ""):
        return []
    return _ints(text, "--capture-sizes")


def build_analytic(opts: dict[str, Any]) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, Any], Path]:
    """Make an analytic profile's tables and card from `sparksim profile analytic`'s options
    (every one, by parameter name), and the folder it goes to; `profile calibrate` remakes
    a base profile this way from its card's command, with fitted parameters."""
    gpu, model, dtype, out = opts["gpu"], opts["model"], opts["dtype"], opts["out"]
    capture_sizes, max_capture_size, max_tokens = opts["capture_sizes"], opts["max_capture_size"], opts["max_tokens"]
    drafters, gpus, parallel, gamma = opts["drafters"], opts["gpus"], opts["parallel"], opts["gamma"]
    nodes, micro_batches = opts["nodes"], opts["micro_batches"]
    redundant_experts, expert_imbalance = opts["redundant_experts"], opts["expert_imbalance"]
    draft_layers, draft_context, max_requests = opts["draft_layers"], opts["draft_context"], opts["max_requests"]
    preset = get_gpu(gpu)
    overrides = {key: opts[key] for key in HW_OPTIONS if opts.get(key) is not None}
    hw = dataclasses.replace(preset, **overrides)
    spec = load_model_spec(model)
    sizes = _capture_sizes(capture_sizes, max_capture_size)
    presets = drafter_presets(spec)
    names = ([] if drafters.strip().lower() == "none"
             else [n.strip() for n in drafters.split(",") if n.strip()] or list(presets))
    unknown = [n for n in names if n not in presets]
    if unknown:
        raise ConfigError(f"--drafters {drafters!r}: expected names from {sorted(presets)}")
    shapes = [dataclasses.replace(
        presets[n], gamma=gamma if gamma is not None else presets[n].gamma,
        num_layers=draft_layers if presets[n].kind == "block" and not presets[n].moe
        else presets[n].num_layers)
        for n in names]
    gpu_tag = gpu.lower() if gpus == 1 else f"{gpu.lower()}x{gpus}"
    target = out if out is not None else Path("profiles") / f"{gpu_tag}-{spec.name}-analytic"
    # Every knob spelled out, so the card's command remakes the profile even if defaults move.
    argv = [
        "sparksim", "profile", "analytic", "--gpu", gpu.lower(), "--model", model,
        "--dtype", dtype, "--out", str(target),
        "--compute-eff", f"{hw.compute_eff:g}", "--mem-eff", f"{hw.mem_eff:g}",
        "--attn-compute-eff", f"{hw.attn_compute_eff:g}", "--attn-mem-eff", f"{hw.attn_mem_eff:g}",
        "--link-eff", f"{hw.link_eff:g}",
        "--step-overhead-ms", f"{hw.step_overhead_ms:g}", "--launch-us", f"{hw.launch_us:g}",
        "--kernels-per-layer", str(hw.kernels_per_layer),
        "--capture-sizes", capture_sizes, "--max-capture-size", str(max_capture_size),
        "--max-tokens", str(max_tokens), "--drafters", ",".join(names) or "none",
        *(["--gamma", str(gamma)] if gamma is not None else []),
        "--gpus", str(gpus), "--parallel", parallel,
        *(["--nodes", str(nodes)] if nodes != 1 else []),
        *(["--micro-batches", str(micro_batches)] if micro_batches != 1 else []),
        *(["--redundant-experts", str(redundant_experts)] if redundant_experts else []),
        *(["--expert-imbalance", f"{expert_imbalance:g}"] if expert_imbalance != 1.0 else []),
        "--draft-layers", str(draft_layers), "--draft-context", str(draft_context),
        "--max-requests", str(max_requests),
    ]
    verify, extra, card = analytic_profile(
        hw, spec, dtype=dtype, capture_sizes=sizes, max_tokens=max_tokens, drafters=shapes,
        draft_context=draft_context, max_requests=max_requests, command=shlex.join(argv),
        parallel=Parallelism(gpus, parallel, nodes, micro_batches, redundant_experts, expert_imbalance),
    )
    card = {**{k: card.pop(k) for k in ("source", "hardware")}, "gpu": gpu.lower(), **card}
    return verify, extra, card, target




def options_from_command(command: str) -> dict[str, Any]:
    """Parse a card's `sparksim profile analytic ...` command back into its options."""
    argv = shlex.split(command)
    if argv[:3] != ["sparksim", "profile", "analytic"]:
        raise ConfigError(f"the card's command {command!r} is not `sparksim profile analytic ...`: "
                          "only an analytic profile can be remade with other parameters")
    opts = dict(OPTION_DEFAULTS)
    rest = argv[3:]
    if len(rest) % 2:
        raise ConfigError(f"the card's command {command!r}: every option needs a value")
    for flag, text in zip(rest[::2], rest[1::2], strict=True):
        name = flag.removeprefix("--").replace("-", "_")
        if not flag.startswith("--") or name not in OPTION_DEFAULTS:
            raise ConfigError(f"the card's command {command!r}: unknown option {flag!r}")
        value: Any = text
        if name in _INT_OPTIONS:
            value = int(text)
        elif name in _FLOAT_OPTIONS:
            value = float(text)
        elif name == "out":
            value = Path(text)
        opts[name] = value
    return opts


def dense_step_terms(opts: dict[str, Any], tokens: float, sizes: list[int]) -> dict[str, float]:
    """The dense step's roofline terms (ms) at `tokens` replica tokens, each as charged.

    For a profile made with `opts` (`options_from_command` of its card): the side of
    max(HBM read, dense GEMMs + grouped GEMMs) that binds, the all-to-alls added (with
    dual-batch overlap, whichever of kernels and all-to-alls is larger), an eager step's
    dispatch past its GPU time, the step's fixed overhead, and the tokens after padding to
    the captured `sizes`. The analyses that explain a step (`analyses/production.py`,
    `analyses/fixed_collapse.py`) read it term by term.
    """
    hw = dataclasses.replace(get_gpu(opts["gpu"]), **{k: opts[k] for k in HW_OPTIONS if opts.get(k) is not None})
    model = load_model_spec(opts["model"])
    par = Parallelism(opts["gpus"], opts["parallel"], opts["nodes"], opts["micro_batches"],
                      opts["redundant_experts"], opts["expert_imbalance"])
    dtype = DTYPE_BYTES[opts["dtype"]]
    padded, eager = pad_to_capture(tokens, sizes)
    t = float(padded)
    hbm = float(dense_bytes(model, t, dtype_bytes=dtype, parallel=par)) / (hw.mem_bytes_per_s * hw.mem_eff) * 1e3
    routed_flops = 2.0 * model.moe_layers * model.experts_per_token * model.expert_params * t
    gemm = (float(verify_flops(model, t)) - routed_flops) / par.gpus / (hw.peak_for(dtype) * hw.compute_eff) * 1e3
    grouped = float(routed_compute_ms(hw, model, t, expert_layers=model.moe_layers, dtype_bytes=dtype, parallel=par))
    comm = float(collective_ms(hw, model, t, dtype_bytes=dtype, parallel=par))
    kernels = max(hbm, gemm + grouped)
    hidden = par.micro_batches == 2  # the smaller of kernels and all-to-alls hides under the larger
    keep_kernels, keep_comm = (kernels >= comm, comm > kernels) if hidden else (True, True)
    gpu = float(overlapped(kernels, comm, par))
    dispatch = float(eager_step_ms(gpu, hw.eager_overhead_ms(model.num_layers))) - gpu if bool(eager) else 0.0
    memory_bound = hbm >= gemm + grouped
    return {"HBM read": hbm * (keep_kernels and memory_bound),
            "dense GEMMs": gemm * (keep_kernels and not memory_bound),
            "grouped GEMMs": grouped * (keep_kernels and not memory_bound),
            "all-to-all": comm * keep_comm, "eager dispatch": dispatch,
            "step overhead": hw.step_overhead_ms, "padded tokens": t}
