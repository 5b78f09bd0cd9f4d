"""Analytic SPS(B) profiles: a roofline step-time model of the target and a DSpark-shaped drafter.

One verification step of B tokens from R = ceil(B / tokens_per_request) requests, each
attending to `context` tokens of KV cache, takes

    time = max(bytes / (HBM bandwidth × mem_eff), FLOPs / (peak × compute_eff)) + step overhead

with bytes = weights + KV cache read + KV written + activations and FLOPs = 2 × matmul
params × B + attention. Inside the CUDA-graph capture sizes a batch replays the graph of
the next captured size (a staircase); past the largest one the step runs eagerly and pays
the launch cost of every kernel (a cliff). docs/profiles.md derives every term.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray

from sparksim.errors import ConfigError
from sparksim.hardware import FIELD_SOURCES, GPUS, HardwareSpec, get_gpu
from sparksim.models import ModelSpec

__all__ = [
    "DTYPE_BYTES",
    "GPUS",
    "DrafterShape",
    "HardwareSpec",
    "analytic_profile",
    "default_capture_sizes",
    "draft_bytes",
    "draft_flops",
    "get_gpu",
    "graph_draft_ms",
    "graph_verify_ms",
    "ladder",
    "pad_to_capture",
    "roofline_draft_ms",
    "roofline_verify_ms",
    "verify_bytes",
    "verify_flops",
]

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 1}
LOGIT_BYTES = 4  # engines upcast logits to float32 before sampling
DEFAULT_CONTEXTS = (1024, 4096, 16384)


def default_capture_sizes(max_size: int = 512) -> tuple[int, ...]:
    """Return vLLM's default CUDA-graph capture sizes up to `max_size` tokens.

    1, 2, 4, then multiples of 8 up to 256, then multiples of 16 (vLLM's
    `cudagraph_capture_sizes` default with max_num_seqs ≥ 256).
    """
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, max_size + 1, 16)]
    return tuple(s for s in sizes if s <= max_size)


def ladder(after: int, stop: int) -> list[int]:
    """Return the sizes 1, 2, 3, 4, 6, 8, 12, 16, … (each ×1.5 or ×4/3) above `after`, up to `stop`.

    `stop` itself is always included (if above `after`), so a table reaches its limit.
    """
    out: set[int] = set()
    k = 0
    while 2**k <= stop:
        for v in (2**k, 3 * 2**k // 2):
            if after < v <= stop and v >= 1:
                out.add(v)
        k += 1
    if stop > after:
        out.add(stop)
    return sorted(out)


def pad_to_capture(
    tokens: ArrayLike, capture_sizes: Sequence[int]
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Return (padded size, runs eagerly) for each batch in `tokens`.

    A batch at or below the largest captured size replays the graph of the next captured
    size; a larger batch (or any batch when nothing is captured) runs eagerly, unpadded.
    """
    t = np.asarray(tokens, dtype=np.float64)
    if not capture_sizes:
        return t.copy(), np.ones(t.shape, dtype=bool)
    sizes = np.asarray(sorted(capture_sizes), dtype=np.float64)
    eager = t > sizes[-1]
    idx = np.minimum(np.searchsorted(sizes, t, side="left"), sizes.size - 1)
    return np.where(eager, t, sizes[idx]), eager


# --------------------------------------------------------------------------- target (verify)


def _layer_act_elems(model: ModelSpec) -> int:
    """Activation elements one layer reads and writes per token: each matmul's input and output."""
    q_kv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim
    qkv = model.hidden + q_kv
    o = model.num_heads * model.head_dim + model.hidden
    gate_up = model.hidden + 2 * model.intermediate
    down = model.intermediate + model.hidden
    return qkv + o + gate_up + down


def _attention_flops_per_token_ctx(model: ModelSpec, num_layers: int) -> int:
    """FLOPs per (query token × context token): QKᵀ and PV, 2 FLOPs per MAC each, every layer."""
    return 4 * num_layers * model.num_heads * model.head_dim


def verify_flops(model: ModelSpec, tokens: ArrayLike, context: ArrayLike) -> NDArray[np.float64]:
    """Return the FLOPs of a target step of `tokens` tokens, each attending to `context` tokens.

    2 × matmul params × tokens (LM head included, since every verified position needs
    logits) plus 4 × layers × heads × head_dim × tokens × context for attention.
    """
    t = np.asarray(tokens, dtype=np.float64)
    c = np.asarray(context, dtype=np.float64)
    attn = _attention_flops_per_token_ctx(model, model.num_layers)
    return 2.0 * model.matmul_params * t + attn * t * c


def verify_bytes(
    model: ModelSpec,
    tokens: ArrayLike,
    context: ArrayLike,
    *,
    dtype_bytes: int = 2,
    tokens_per_request: int = 8,
) -> NDArray[np.float64]:
    """Return the HBM bytes a target step moves: weights, KV read and written, activations.

    The R = ceil(tokens / tokens_per_request) requests each read `context` tokens of KV
    cache; the input embedding is a gather of `tokens` rows, not a read of the table, so
    weights count `matmul_params`.
    """
    if tokens_per_request < 1:
        raise ConfigError(f"tokens_per_request={tokens_per_request} must be >= 1")
    t = np.asarray(tokens, dtype=np.float64)
    c = np.asarray(context, dtype=np.float64)
    requests = np.ceil(t / tokens_per_request)
    kv_elems = model.kv_bytes_per_token  # elements per token of context, all layers
    weights = dtype_bytes * model.matmul_params
    kv_read = requests * c * kv_elems * dtype_bytes
    kv_write = t * kv_elems * dtype_bytes
    acts = t * (
        dtype_bytes * (model.num_layers * _layer_act_elems(model) + model.hidden)
        + LOGIT_BYTES * model.vocab
    )
    return weights + kv_read + kv_write + acts


def _roofline_ms(
    hw: HardwareSpec, bytes_moved: NDArray[np.float64], flops: NDArray[np.float64], dtype_bytes: int
) -> NDArray[np.float64]:
    mem_s = bytes_moved / (hw.mem_bytes_per_s * hw.mem_eff)
    compute_s = flops / (hw.peak_for(dtype_bytes) * hw.compute_eff)
    return np.maximum(mem_s, compute_s) * 1e3


def roofline_verify_ms(
    hw: HardwareSpec,
    model: ModelSpec,
    tokens: ArrayLike,
    context: ArrayLike,
    *,
    dtype_bytes: int = 2,
    tokens_per_request: int = 8,
) -> NDArray[np.float64]:
    """Return the roofline time in ms of a target step at each (`tokens`, `context`), no graphs.

    max(bytes / (bandwidth × mem_eff), FLOPs / (peak × compute_eff)) + hw.step_overhead_ms;
    `tokens` and `context` broadcast. No CUDA-graph padding and no eager launch cost.
    """
    b = verify_bytes(model, tokens, context, dtype_bytes=dtype_bytes,
                     tokens_per_request=tokens_per_request)
    f = verify_flops(model, tokens, context)
    return _roofline_ms(hw, b, f, dtype_bytes) + hw.step_overhead_ms


def graph_verify_ms(
    hw: HardwareSpec,
    model: ModelSpec,
    tokens: ArrayLike,
    context: ArrayLike,
    *,
    capture_sizes: Sequence[int],
    dtype_bytes: int = 2,
    tokens_per_request: int = 8,
) -> NDArray[np.float64]:
    """Return the target step time in ms as a CUDA-graph engine runs it: staircase, then cliff.

    A batch inside the captured range replays the next captured size's graph, so every
    term is evaluated at the padded size; a batch past it runs eagerly and adds the
    launch cost of every layer's kernels.
    """
    padded, eager = pad_to_capture(tokens, capture_sizes)
    base = roofline_verify_ms(hw, model, padded, context, dtype_bytes=dtype_bytes,
                              tokens_per_request=tokens_per_request)
    return base + np.where(eager, hw.eager_overhead_ms(model.num_layers), 0.0)


# --------------------------------------------------------------------------- drafter


@dataclass(frozen=True)
class DrafterShape:
    """A DSpark-shaped drafter: a parallel backbone of target-width layers plus a Markov head.

    Each step it projects the target features of the newly verified positions into its
    KV cache, runs γ positions (anchor + γ−1 masks) per request through its layers,
    applies the target's LM head to all γ positions, then samples the γ tokens left to
    right through the rank-r Markov bias (reading W2 once per position).
    """

    num_layers: int = 5  # DSpark/DFlash backbone depth (DeepSpec configs)
    gamma: int = 7  # block size: drafted positions per request
    num_target_features: int = 5  # target layers whose hidden states are injected
    markov_rank: int = 256  # low-rank bigram W1[x]·W2
    injected_tokens_per_request: int = 8  # verified positions whose features enter the KV cache


def draft_flops(
    model: ModelSpec, drafter: DrafterShape, requests: ArrayLike, context: ArrayLike
) -> NDArray[np.float64]:
    """Return the FLOPs of one drafting step for `requests` requests at draft `context` tokens."""
    r = np.asarray(requests, dtype=np.float64)
    c = np.asarray(context, dtype=np.float64)
    block = r * drafter.gamma  # tokens through the backbone
    injected = r * drafter.injected_tokens_per_request
    kv_proj = model.hidden * 2 * model.num_kv_heads * model.head_dim
    fc = drafter.num_target_features * model.hidden * model.hidden
    attn = _attention_flops_per_token_ctx(model, drafter.num_layers)
    return (
        2.0 * drafter.num_layers * model.layer_params * block
        + 2.0 * (fc + drafter.num_layers * kv_proj) * injected
        + attn * block * (c + drafter.gamma)  # the block attends to the context and to itself
        + 2.0 * (model.vocab * model.hidden + drafter.markov_rank * model.vocab) * block
    )


def draft_bytes(
    model: ModelSpec,
    drafter: DrafterShape,
    requests: ArrayLike,
    context: ArrayLike,
    *,
    dtype_bytes: int = 2,
) -> NDArray[np.float64]:
    """Return the HBM bytes one drafting step moves: its weights, the shared LM head, KV, activations."""
    r = np.asarray(requests, dtype=np.float64)
    c = np.asarray(context, dtype=np.float64)
    block = r * drafter.gamma
    injected = r * drafter.injected_tokens_per_request
    kv_elems = 2 * drafter.num_layers * model.num_kv_heads * model.head_dim
    fc = drafter.num_target_features * model.hidden * model.hidden
    markov_w2 = drafter.markov_rank * model.vocab
    weights = dtype_bytes * (
        drafter.num_layers * model.layer_params + fc + model.vocab * model.hidden
        + drafter.gamma * markov_w2  # the sequential Markov loop reads W2 once per position
    )
    kv_read = r * (c + drafter.gamma) * kv_elems * dtype_bytes
    kv_write = (injected + block) * kv_elems * dtype_bytes
    acts = block * (
        dtype_bytes * (drafter.num_layers * _layer_act_elems(model) + model.hidden)
        + LOGIT_BYTES * model.vocab
    ) + injected * dtype_bytes * (drafter.num_target_features + 1) * model.hidden
    return weights + kv_read + kv_write + acts


def roofline_draft_ms(
    hw: HardwareSpec,
    model: ModelSpec,
    requests: ArrayLike,
    *,
    drafter: DrafterShape | None = None,
    context: ArrayLike = 4096,
    dtype_bytes: int = 2,
) -> NDArray[np.float64]:
    """Return the roofline time in ms of one drafting step for each count in `requests`, no graphs.

    The drafter always drafts its full block, so cost depends on the request count only
    (at a fixed draft context). It runs inside the engine step, so no step overhead is added.
    """
    d = drafter or DrafterShape()
    b = draft_bytes(model, d, requests, context, dtype_bytes=dtype_bytes)
    f = draft_flops(model, d, requests, context)
    return _roofline_ms(hw, b, f, dtype_bytes)


def graph_draft_ms(
    hw: HardwareSpec,
    model: ModelSpec,
    requests: ArrayLike,
    *,
    capture_sizes: Sequence[int],
    drafter: DrafterShape | None = None,
    context: ArrayLike = 4096,
    dtype_bytes: int = 2,
) -> NDArray[np.float64]:
    """Return the drafting time in ms with CUDA graphs keyed, as the target's, by token count (R·γ)."""
    d = drafter or DrafterShape()
    r = np.asarray(requests, dtype=np.float64)
    padded, eager = pad_to_capture(r * d.gamma, capture_sizes)
    base = roofline_draft_ms(hw, model, padded / d.gamma, drafter=d, context=context,
                             dtype_bytes=dtype_bytes)
    return base + np.where(eager, hw.eager_overhead_ms(d.num_layers), 0.0)


# --------------------------------------------------------------------------- profile tables


def _check_sizes(name: str, values: Sequence[int]) -> list[int]:
    out = [int(v) for v in values]
    bad = [v for v in out if v < 1]
    if bad:
        raise ConfigError(f"{name}: every value must be >= 1 (got {bad[0]})")
    if len(set(out)) != len(out):
        raise ConfigError(f"{name}: repeated value in {out}")
    return sorted(out)


def _hardware_parameters(hw: HardwareSpec) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key, value in asdict(hw).items():
        if key in ("name", "source"):
            continue
        params[key] = {"value": value, "source": FIELD_SOURCES.get(key, "")}
    return params


def _verify_table(
    hw: HardwareSpec, model: ModelSpec, sizes: list[int], ctxs: list[int], max_tokens: int,
    dtype_bytes: int, tokens_per_request: int,
) -> pd.DataFrame:
    """Rows: every captured size, the first eager size, then the ladder; at every context."""
    inside = [s for s in sizes if s <= max_tokens]
    top = sizes[-1] if sizes else 0
    beyond = ladder(top, max_tokens)
    if top < max_tokens:
        beyond = sorted({top + 1, *beyond})
    tokens = np.asarray(sorted({*inside, *beyond}), dtype=np.float64)
    t_grid, c_grid = np.meshgrid(tokens, np.asarray(ctxs, np.float64))  # (C, T)
    step_ms = graph_verify_ms(hw, model, t_grid, c_grid, capture_sizes=sizes,
                              dtype_bytes=dtype_bytes, tokens_per_request=tokens_per_request)
    return pd.DataFrame({
        "tokens": t_grid.ravel().astype(np.int64),
        "context": c_grid.ravel().astype(np.int64),
        "step_ms": step_ms.ravel(),
    })


def _draft_table(
    hw: HardwareSpec, model: ModelSpec, sizes: list[int], d: DrafterShape, draft_context: int,
    max_requests: int, dtype_bytes: int,
) -> pd.DataFrame:
    """Rows: every request count whose R·γ tokens fit a graph, the first eager count, the ladder."""
    top = sizes[-1] if sizes else 0
    graph_requests = top // d.gamma
    inside = list(range(1, min(graph_requests, max_requests) + 1))
    beyond = ladder(graph_requests, max_requests)
    if graph_requests < max_requests:
        beyond = sorted({graph_requests + 1, *beyond})
    requests = np.asarray(sorted({*inside, *beyond}), dtype=np.float64)
    return pd.DataFrame({
        "requests": requests.astype(np.int64),
        "draft_ms": graph_draft_ms(hw, model, requests, capture_sizes=sizes, drafter=d,
                                   context=draft_context, dtype_bytes=dtype_bytes),
    })


def _card(
    hw: HardwareSpec, model: ModelSpec, dtype: str, sizes: list[int], ctxs: list[int],
    max_tokens: int, tokens_per_request: int, d: DrafterShape, draft_context: int, command: str,
) -> dict[str, Any]:
    """The card: what was modelled, every parameter with its source, and derived figures."""
    dtype_bytes = DTYPE_BYTES[dtype]
    # Arithmetic intensity where the achieved roofs meet; a context-free BF16 step turns
    # compute-bound at this many tokens (weights: 2 bytes read, 2 FLOPs per token each).
    ridge = hw.peak_for(dtype_bytes) * hw.compute_eff / (hw.mem_bytes_per_s * hw.mem_eff)
    return {
        "source": "analytic",
        "hardware": hw.name,
        "model": model.name,
        "dtype": dtype,
        "date": datetime.now(UTC).date().isoformat(),
        "command": command or "sparksim.roofline.analytic_profile (Python API)",
        "engine": "none: roofline model (sparksim.roofline) with vLLM-style CUDA-graph semantics",
        "graph_capture_sizes": sizes,
        "tokens_per_request": int(tokens_per_request),
        "contexts": ctxs,
        "max_tokens": int(max_tokens),
        "hardware_source": hw.source,
        "parameters": _hardware_parameters(hw),
        "model_spec": {
            **{k: v for k, v in model.as_dict().items() if k != "source"},
            "params": model.params,
            "matmul_params": model.matmul_params,
            "kv_elems_per_token": model.kv_bytes_per_token,
            "config_hash": model.config_hash(),
            "source": model.source or "sparksim.models",
        },
        "drafter": {
            **asdict(d),
            "context": int(draft_context),
            "shares_target_lm_head": True,
            "graph_padding": "R*gamma tokens padded to graph_capture_sizes; eager past the largest",
            "source": "shape of DSpark in DeepSpec (defaults: 5 target-width Qwen3 layers, block 7, "
            "5 injected target layers, Markov rank 256, frozen copy of the target's LM head)",
        },
        "derived": {
            "ridge_flops_per_byte": round(ridge, 1),
            "ridge_tokens_without_kv": round(ridge * dtype_bytes / 2, 1),
            "weights_ms": round(dtype_bytes * model.matmul_params
                                / (hw.mem_bytes_per_s * hw.mem_eff) * 1e3, 4),
            "eager_overhead_ms": hw.eager_overhead_ms(model.num_layers),
            "kv_bytes_per_request_at_max_context": model.kv_bytes_per_token * dtype_bytes * ctxs[-1],
        },
        "model_formula": (
            "step_ms = max(bytes/(mem_bytes_per_s*mem_eff), flops/(peak*compute_eff))*1e3 "
            "+ step_overhead_ms [+ kernels_per_layer*layers*launch_us/1e3 past the largest capture]; "
            "bytes = dtype*matmul_params + ceil(tokens/tokens_per_request)*context*kv_elems*dtype "
            "+ tokens*(kv_elems*dtype + act_bytes); flops = 2*matmul_params*tokens "
            "+ 4*layers*heads*head_dim*tokens*context. See docs/profiles.md."
        ),
        "caveats": (
            "Not a measurement. Rows whose R x context KV cache exceeds HBM capacity are "
            "unreachable in practice but kept so the grid is complete. Eager launch cost is "
            "added in full (no CPU/GPU overlap), an upper bound on the cliff."
        ),
    }


def analytic_profile(
    hw: HardwareSpec,
    model: ModelSpec,
    *,
    dtype: str = "bf16",
    capture_sizes: Sequence[int] | None = None,
    max_tokens: int = 8192,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    tokens_per_request: int = 8,
    drafter: DrafterShape | None = None,
    draft_context: int = 4096,
    max_requests: int = 1024,
    command: str = "",
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """Return (verify, draft, card) tables of an analytic profile, ready for `write_profile`.

    verify.csv rows: every captured size up to `max_tokens`, the first eager size (so the
    cliff sits where it belongs in both lookup modes), then the ×1.5/×4/3 ladder up to
    `max_tokens`, at each context in `contexts`. draft.csv rows: every request count
    while R·γ fits the captured range, the first eager count, then the ladder up to
    `max_requests`. `capture_sizes=None` means vLLM's default; an empty list means no graphs.
    """
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"dtype={dtype!r} is not one of {list(DTYPE_BYTES)}")
    dtype_bytes = DTYPE_BYTES[dtype]
    hw.peak_for(dtype_bytes)  # fails early for FP8 on a chip without it
    d = drafter or DrafterShape()
    for key, val in (("max_tokens", max_tokens), ("tokens_per_request", tokens_per_request),
                     ("max_requests", max_requests), ("draft_context", draft_context),
                     ("gamma", d.gamma), ("draft layers", d.num_layers)):
        if val < 1:
            raise ConfigError(f"{key}={val} must be >= 1")
    for key, fval in (("compute_eff", hw.compute_eff), ("mem_eff", hw.mem_eff)):
        if not 0 < fval <= 1:
            raise ConfigError(f"{key}={fval} must be in (0, 1]")
    for key, fval in (("step_overhead_ms", hw.step_overhead_ms), ("launch_us", hw.launch_us),
                      ("kernels_per_layer", hw.kernels_per_layer)):
        if not fval >= 0:
            raise ConfigError(f"{key}={fval} must be >= 0")
    sizes = _check_sizes("capture sizes", default_capture_sizes() if capture_sizes is None
                         else capture_sizes)
    ctxs = _check_sizes("contexts", contexts)
    if not ctxs:
        raise ConfigError("contexts: at least one context length is needed")

    verify = _verify_table(hw, model, sizes, ctxs, max_tokens, dtype_bytes, tokens_per_request)
    draft = _draft_table(hw, model, sizes, d, draft_context, max_requests, dtype_bytes)
    card = _card(hw, model, dtype, sizes, ctxs, max_tokens, tokens_per_request, d, draft_context,
                 command)
    return verify, draft, card

