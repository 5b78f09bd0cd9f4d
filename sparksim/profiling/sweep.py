"""The profiling sweep: time verification steps over (tokens, context), the drafter and prefill.

For each context the sweep allocates one KV cache sized for the largest batch, then walks
the token counts upward. On CUDA with graphs, a batch at or below the largest captured
size runs the graph of the next captured size (captured once per size and context, as
vLLM does); larger batches run eagerly. Out of memory at one size marks that size
unavailable and the sweep goes on. The drafter is timed by request count and drafted
positions at one context; prompt-only steps of one request by prompt length, eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sparksim.cost.models import ModelSpec
from sparksim.cost.roofline import DrafterShape
from sparksim.errors import ConfigError
from sparksim.hardware import DTYPE_BYTES as HW_DTYPE_BYTES
from sparksim.profiling import graphs as cuda_graphs
from sparksim.profiling.draft_model import build_drafter
from sparksim.profiling.memory import PeakAbove
from sparksim.profiling.model import KVCache, StepLayout, build_model, num_requests
from sparksim.profiling.timing import Clock, CudaEventClock, HostClock, Timing, time_replays

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_BYTES = {k: HW_DTYPE_BYTES[k] for k in DTYPES}  # one size table: sparksim.hardware


@dataclass
class SweepConfig:
    """Everything that decides what a sweep measures."""

    spec: ModelSpec
    device: str  # "cpu" or "cuda"
    dtype: str  # key of DTYPES
    tokens: list[int]  # B values, increasing
    contexts: list[int]  # KV tokens per request, increasing
    graphs: bool = False
    capture_sizes: list[int] = field(default_factory=cuda_graphs.default_capture_sizes)
    replays: int = 5
    warmup: int = 2
    tokens_per_request: int = 8  # 1 + γ: R = ceil(B / tokens_per_request)
    drafter: DrafterShape | None = field(default_factory=DrafterShape)
    draft_context: int | None = None  # None: the first of `contexts`
    seed: int = 0

    @property
    def draft_context_used(self) -> int:
        return self.contexts[0] if self.draft_context is None else self.draft_context

    @property
    def draft_requests(self) -> list[int]:
        return sorted({num_requests(t, self.tokens_per_request) for t in self.tokens})


@dataclass
class PointResult:
    """One measured (or unavailable) point of the verify sweep."""

    tokens: int  # B asked for
    context: int
    requests: int  # R of the batch that ran
    run_tokens: int  # B that ran: the captured size it padded to, or B when eager
    graph: bool  # ran as a CUDA-graph replay
    timing: Timing | None  # None when unavailable
    error: str = ""  # why it is unavailable
    activation_bytes: int = 0  # CUDA: peak memory the step allocated above weights, KV and inputs


@dataclass
class DraftResult:
    """One measured (or unavailable) drafter point: R requests drafting p positions each."""

    requests: int
    positions: int  # p: a block of anchor + p − 1 masks per request
    context: int
    graph: bool
    timing: Timing | None
    error: str = ""
    activation_bytes: int = 0  # as PointResult's


@dataclass
class PrefillResult:
    """One measured (or unavailable) prompt-only step of one request with `tokens` prompt tokens."""

    tokens: int
    timing: Timing | None
    error: str = ""


def check_config(cfg: SweepConfig) -> None:
    """Raise ConfigError for a sweep that cannot run, before anything is built or timed."""
    spec = cfg.spec
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"--dtype {cfg.dtype!r} is not one of {', '.join(DTYPES)}")
    if cfg.device not in ("cpu", "cuda"):
        raise ConfigError(f"--device {cfg.device!r} must be cpu or cuda")
    if not cfg.tokens or not cfg.contexts:
        raise ConfigError("--tokens and --context each need at least one value")
    if min(cfg.tokens) < 1 or min(cfg.contexts) < 0:
        raise ConfigError(f"token counts must be >= 1 and contexts >= 0 (got tokens "
                          f"{min(cfg.tokens)}, context {min(cfg.contexts)})")
    if cfg.tokens_per_request < 1:
        raise ConfigError(f"--tokens-per-request {cfg.tokens_per_request} must be >= 1")
    too_long = [t for t in cfg.tokens if t > spec.max_position]
    if too_long:
        raise ConfigError(
            f"--tokens {too_long[0]} is above {spec.name}'s maximum context "
            f"({spec.max_position} tokens, max_position_embeddings)"
        )
    for c in cfg.contexts:
        longest = c + max(-(-t // num_requests(t, cfg.tokens_per_request)) for t in cfg.tokens)
        if longest > spec.max_position:
            raise ConfigError(
                f"--context {c} plus a request's new tokens reaches position {longest}, above "
                f"{spec.name}'s maximum context ({spec.max_position} tokens)"
            )
    if cfg.drafter is not None and cfg.draft_context_used + cfg.drafter.gamma > spec.max_position:
        raise ConfigError(
            f"draft context {cfg.draft_context_used} + γ={cfg.drafter.gamma} is above "
            f"{spec.name}'s maximum context ({spec.max_position} tokens)"
        )
    if cfg.drafter is not None and cfg.draft_context_used < cfg.drafter.gamma + 1:
        raise ConfigError(f"draft context {cfg.draft_context_used} must be at least γ + 1 = "
                          f"{cfg.drafter.gamma + 1} (the injected target features sit in it)")
    if cfg.graphs and cfg.device != "cuda":
        raise ConfigError("--graphs needs --device cuda (CUDA graphs do not exist on CPU); "
                          "use --no-graphs")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible to torch "
                          f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})")


def is_oom(exc: BaseException) -> bool:
    """Return True if `exc` is an allocation failure (CUDA OOM or a failed CPU allocation)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "not enough memory" in text or "can't allocate" in text
    )


def _clock(device: torch.device) -> Clock:
    return CudaEventClock() if device.type == "cuda" else HostClock()


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


Progress = Callable[[str], None]  # called once per finished point with a short label
FaultHook = Callable[[str, int, int], None]  # (kind, size, context) before each timing


def run_verify_sweep(
    cfg: SweepConfig, *, progress: Progress | None = None, fault: FaultHook | None = None
) -> list[PointResult]:
    """Time the target's verification step at every (token count, context) of `cfg`.

    `fault`, if given, runs before each timing and may raise (tests inject an OOM there).
    """
    check_config(cfg)
    device = torch.device(cfg.device)
    dtype = DTYPES[cfg.dtype]
    clock = _clock(device)
    spec = cfg.spec
    results: list[PointResult] = []
    with torch.inference_mode():
        model = build_model(spec, device, dtype, cfg.seed)
        for context in cfg.contexts:
            plan = [_plan(t, cfg) for t in cfg.tokens]
            results.extend(_sweep_context(cfg, model, context, plan, clock, device, dtype,
                                          progress, fault))
        del model
    _free(device)
    return results


def _plan(tokens: int, cfg: SweepConfig) -> tuple[int, int, bool]:
    """Return (tokens that run, their R, graph?) for a batch of `tokens`."""
    padded = cuda_graphs.padded_size(tokens, cfg.capture_sizes) if cfg.graphs else None
    run = tokens if padded is None else padded
    return run, num_requests(run, cfg.tokens_per_request), padded is not None


def _sweep_context(
    cfg: SweepConfig, model: torch.nn.Module, context: int, plan: list[tuple[int, int, bool]],
    clock: Clock, device: torch.device, dtype: torch.dtype, progress: Progress | None,
    fault: FaultHook | None,
) -> list[PointResult]:
    spec = cfg.spec
    length = context + max(-(-run // r) for run, r, _ in plan)
    cache: KVCache | None = None
    try:
        # One cache for the whole context, sized for its largest batch; if that does not
        # fit, each point allocates its own so the smaller batches are still measured.
        cache = KVCache(spec.num_layers, max(r for _, r, _ in plan), spec.num_kv_heads, length,
                        spec.head_dim, device, dtype)
    except (RuntimeError, torch.OutOfMemoryError) as exc:
        if not is_oom(exc):
            raise
        _free(device)
    pool = torch.cuda.graph_pool_handle() if cfg.graphs else None
    done: dict[tuple[int, bool], tuple[Timing, int] | str] = {}  # (tokens run, graph) → result
    out = []
    for tokens, (run, requests, graph) in zip(cfg.tokens, plan, strict=True):
        key = (run, graph)
        if key not in done:
            step_cache: KVCache | None = cache
            try:
                if step_cache is None:
                    step_cache = KVCache(spec.num_layers, requests, spec.num_kv_heads, length,
                                         spec.head_dim, device, dtype)
                if fault is not None:
                    fault("verify", run, context)
                done[key] = _time_verify(model, step_cache, run, requests, context, graph,
                                         pool, cfg, clock, device, dtype)
            except (RuntimeError, torch.OutOfMemoryError) as exc:
                if not is_oom(exc):
                    raise
                done[key] = ("out of memory: " + str(exc).splitlines()[0])[:200]
            finally:
                step_cache = None  # free a per-point cache before the next one allocates
            if isinstance(done[key], str):
                _free(device)
        got = done[key]
        if isinstance(got, str):
            out.append(PointResult(tokens, context, requests, run, graph, None, got))
        else:
            out.append(PointResult(tokens, context, requests, run, graph, got[0], "", got[1]))
        if progress is not None:
            progress(f"verify B={tokens} ctx={context}")
    return out


def _time_verify(
    model: torch.nn.Module, cache: KVCache, tokens: int, requests: int, context: int, graph: bool,
    pool: object, cfg: SweepConfig, clock: Clock, device: torch.device, dtype: torch.dtype,
) -> tuple[Timing, int]:
    """Return the step's replay times and the memory it allocated above what was resident."""
    layout = StepLayout.build(tokens, requests, context, cfg.spec, device, dtype)
    gen = torch.Generator().manual_seed(cfg.seed + tokens)
    ids = torch.randint(0, cfg.spec.vocab, (tokens,), generator=gen).to(device)

    def step() -> object:
        return model(ids, layout, cache)

    with PeakAbove(device) as peak:
        run: Callable[[], object] = cuda_graphs.capture(step, pool) if graph else step
        timing = time_replays(run, clock, warmup=cfg.warmup, replays=cfg.replays)
    return timing, peak.bytes


def run_draft_sweep(
    cfg: SweepConfig, *, progress: Progress | None = None, fault: FaultHook | None = None
) -> list[DraftResult]:
    """Time one DSpark drafting step at every request count of `cfg` and positions 1..γ.

    A step of R requests drafting p positions runs a block of R·p tokens; on CUDA it
    replays a graph captured at exactly that shape while R·p is within the captured sizes
    (an engine would pad R·p up to the next captured size; the table is not padded) and
    runs eagerly past them.
    """
    check_config(cfg)
    if cfg.drafter is None:
        return []
    shape = cfg.drafter
    device = torch.device(cfg.device)
    dtype = DTYPES[cfg.dtype]
    clock = _clock(device)
    spec = cfg.spec
    context = cfg.draft_context_used
    out: list[DraftResult] = []
    with torch.inference_mode():
        drafter = build_drafter(spec, shape, device, dtype, cfg.seed + 1)
        pool = torch.cuda.graph_pool_handle() if cfg.graphs else None
        for requests in cfg.draft_requests:
            for positions in range(1, shape.gamma + 1):
                graph = cfg.graphs and cuda_graphs.padded_size(
                    requests * positions, cfg.capture_sizes) is not None
                try:
                    if fault is not None:
                        fault("draft", requests, context)
                    timing, act = _time_draft(drafter, requests, positions, context, graph, pool,
                                              cfg, clock, device, dtype)
                    out.append(DraftResult(requests, positions, context, graph, timing, "", act))
                except (RuntimeError, torch.OutOfMemoryError) as exc:
                    if not is_oom(exc):
                        raise
                    out.append(DraftResult(requests, positions, context, graph, None,
                                           ("out of memory: " + str(exc).splitlines()[0])[:200]))
                    _free(device)
                if progress is not None:
                    progress(f"draft R={requests} p={positions}")
        del drafter
    _free(device)
    return out


def _time_draft(
    drafter: torch.nn.Module, requests: int, positions: int, context: int, graph: bool,
    pool: object, cfg: SweepConfig, clock: Clock, device: torch.device, dtype: torch.dtype,
) -> tuple[Timing, int]:
    """Time one drafting step of `requests` requests × `positions` whose cache holds `context` tokens.

    The verified step's 1 + γ target features per request are injected at the cache's last
    1 + γ context positions; the block of `positions` tokens follows them.
    """
    spec = cfg.spec
    assert cfg.drafter is not None
    shape = cfg.drafter
    chunk = shape.gamma + 1
    cache = KVCache(shape.num_layers, requests, spec.num_kv_heads, context + shape.gamma,
                    spec.head_dim, device, dtype)
    ctx_layout = StepLayout.build(requests * chunk, requests, context - chunk, spec,
                                  device, dtype)
    block_layout = StepLayout.build(requests * positions, requests, context, spec,
                                    device, dtype, bidirectional=True)
    hidden = torch.randn(requests * chunk, shape.num_target_features * spec.hidden, device=device).to(dtype)
    block_ids = torch.randint(0, spec.vocab, (requests * positions,)).to(device)

    def step() -> object:
        return drafter(hidden, block_ids, ctx_layout, block_layout, cache)

    with PeakAbove(device) as peak:
        run: Callable[[], object] = cuda_graphs.capture(step, pool) if graph else step
        timing = time_replays(run, clock, warmup=cfg.warmup, replays=cfg.replays)
    return timing, peak.bytes


def run_prefill_sweep(
    cfg: SweepConfig, lengths: list[int], *, progress: Progress | None = None
) -> list[PrefillResult]:
    """Time a prompt-only step of one request at each prompt length, eagerly.

    No cached context and a causal mask over the prompt: the step's attention grows as q²,
    which the cost model's prefill coefficient is fitted to. Engines run prefill eagerly
    (its shapes vary too much to capture), so no graphs.
    """
    check_config(cfg)
    device = torch.device(cfg.device)
    dtype = DTYPES[cfg.dtype]
    clock = _clock(device)
    spec = cfg.spec
    out: list[PrefillResult] = []
    with torch.inference_mode():
        model = build_model(spec, device, dtype, cfg.seed)
        for q in lengths:
            try:
                out.append(PrefillResult(q, _time_prefill(model, q, cfg, clock, device, dtype)))
            except (RuntimeError, torch.OutOfMemoryError) as exc:
                if not is_oom(exc):
                    raise
                out.append(PrefillResult(q, None, ("out of memory: " + str(exc).splitlines()[0])[:200]))
                _free(device)
            if progress is not None:
                progress(f"prefill q={q}")
        del model
    _free(device)
    return out


def _time_prefill(
    model: torch.nn.Module, prompt: int, cfg: SweepConfig, clock: Clock, device: torch.device,
    dtype: torch.dtype,
) -> Timing:
    spec = cfg.spec
    cache = KVCache(spec.num_layers, 1, spec.num_kv_heads, prompt, spec.head_dim, device, dtype)
    layout = StepLayout.build(prompt, 1, 0, spec, device, dtype)
    gen = torch.Generator().manual_seed(cfg.seed + prompt)
    ids = torch.randint(0, spec.vocab, (prompt,), generator=gen).to(device)
    return time_replays(lambda: model(ids, layout, cache), clock, warmup=cfg.warmup,
                        replays=cfg.replays)


def _pool(same: tuple[PointResult, ...] | tuple[DraftResult, ...]) -> tuple[Timing | None, str]:
    """Pool one point's replays over rounds: (timing, "") or (None, the first round's error)."""
    failed = [p for p in same if p.timing is None]
    if failed:
        return None, failed[0].error
    return Timing(tuple(s for p in same if p.timing is not None for s in p.timing.samples_ms)), ""


def merge_rounds(rounds: list[list[PointResult]]) -> list[PointResult]:
    """Pool the replays of repeated sweeps point by point; a point failing in any round fails.

    Repeating a whole sweep spreads each point's replays over the run, so a burst of load
    from another job on a shared machine cannot bias one stretch of the sweep.
    """
    merged = []
    for same in zip(*rounds, strict=True):
        first = same[0]
        timing, error = _pool(same)
        merged.append(PointResult(first.tokens, first.context, first.requests, first.run_tokens,
                                  first.graph, timing, error, max(p.activation_bytes for p in same)))
    return merged


def merge_draft_rounds(rounds: list[list[DraftResult]]) -> list[DraftResult]:
    """Pool the drafter's replays of repeated sweeps, as `merge_rounds` does for verification."""
    merged = []
    for same in zip(*rounds, strict=True):
        first = same[0]
        timing, error = _pool(same)
        merged.append(DraftResult(first.requests, first.positions, first.context, first.graph,
                                  timing, error, max(d.activation_bytes for d in same)))
    return merged


def parse_int_list(text: str, option: str) -> list[int]:
    """Parse `1,2,4`, `1-64` (every integer), `1-1024:8` (step 8) or a mix; sorted, unique."""
    values: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            if "-" in part[1:]:
                lo_s, rest = part.split("-", 1)
                hi_s, _, step_s = rest.partition(":")
                lo, hi, step = int(lo_s), int(hi_s), int(step_s or 1)
                if step < 1 or hi < lo:
                    raise ValueError
                values.update(range(lo, hi + 1, step))
                values.add(hi)
            else:
                values.add(int(part))
        except ValueError:
            raise ConfigError(
                f"{option} {text!r}: {part!r} is not a number or a range like 1-64 or 1-1024:8"
            ) from None
    if not values:
        raise ConfigError(f"{option} {text!r} lists no values")
    return sorted(values)
