"""Engine cost tables out of and into sparksim profiles.

`export_table` prices an engine's own grid (`grid_cells`) with sparksim's one price
(`step_price`) and `export_card` says what priced it; `import_table` writes a sparksim
profile (`source: imported`) whose price equals the table's at the table's probes.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from sparksim.cost.engine_table_files import check_format, read_table, sidecar_path
from sparksim.cost.engine_tables import (
    EngineTable,
    SglangAdditiveTable,
    SglangSpsTable,
    TrtllmSpsTable,
    VllmCostTables,
)
from sparksim.cost.pricing import StepCost, StepPrice
from sparksim.cost.profile import Profile, write_profile
from sparksim.errors import ConfigError, FormatError

# SGLang's `build_request_count_sweep(256)`, the profilers' request grid
REQUEST_GRID = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
# KV context per request while profiling: SGLang's --input-len 16; vLLM's
# VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN; TRT's sweep uses whatever its prompts give,
# 1024 is sparksim's choice
DEFAULT_CONTEXT = {"sglang": 16, "trtllm": 1024, "vllm": 8192}
DEFAULT_GAMMA = 7
FORMAT_SOURCES = {
    "sglang": "sgl-project/sglang@45b76f55042711c33f1e2f0ba2a4281f7a51704a "
              "python/sglang/srt/speculative/dspark_components/dspark_sps.py (SpsCostTable, "
              "SpsAdditiveCostTable); grid: python/sglang/benchmark/dspark_sps_profiler.py"
              "@0cdfa2f8363e82641db14b68545ea9df27b2a7f4 (diagonal sweep)",
    "trtllm": "NVIDIA/TensorRT-LLM@52cd02d5b6344ae30ef638e5f94cfe474262cde2 "
              "tensorrt_llm/_torch/speculative/dspark_planner.py (SpsCostTable, PR #17056, "
              "decomposed encoding)",
    "vllm": "vllm-project/vllm-ascend@0fc719806a0b6c2c3b15a890cd72163eb0f3b5de "
            "vllm_ascend/spec_decode/dynamic/cost_model.py (HardwareCostModel); lookup: "
            "vllm-project/vllm v0.33.0 adaptive_verification.py build_cost_tables_from_curves",
}
KV_SPAN = 1 << 40  # imported attention.csv: one cost by request count for any KV up to this
DRAFT_SPAN = 1 << 20  # imported zero draft table: request counts it covers without extrapolating
IMPORTED_DRAFTER = "engine-step"
SIDECAR_KEPT = ("what", "source", "profile", "command", "date", "gamma", "drafter", "context_tokens", "max_rel_gap")


# --------------------------------------------------------------------------- export


def default_gamma(profile: Profile, drafter: str | None = None) -> int:
    """The drafter's block γ: its card's `gamma`, else the most positions its table holds, else 7.

    As `sparksim.sim.runner` bounds a run's traces by the drafter (`_bounded_by_drafter`).
    """
    if not profile.drafters:
        return DEFAULT_GAMMA
    table = profile.drafters.get(drafter or profile.default_drafter or "")
    if table is None:
        raise ConfigError(f"drafter {drafter!r} is not in profile {profile.name!r} "
                          f"(its drafters: {sorted(profile.drafters)})")
    block = ((profile.card.get("drafters") or {}).get(table.name) or {}).get("gamma")
    if block is not None:
        return int(block)
    return table.max_positions or DEFAULT_GAMMA


def _drafter_for(profile: Profile, fmt: str, gamma: int, drafter: str | None) -> str | None:
    """The drafter whose cost the exported steps pay (None: plain decoding, γ = 0)."""
    if gamma == 0:
        return None
    if not profile.drafters:
        raise ConfigError(
            f"profile {profile.name!r} has no draft table, but a {fmt} table prices the whole DSpark "
            f"step (drafting γ={gamma} positions, then verifying): use a profile with its drafter's "
            "table, or export plain decoding with --gamma 0")
    if drafter is not None and drafter not in profile.drafters:
        raise ConfigError(f"drafter {drafter!r} is not in profile {profile.name!r} "
                          f"(its drafters: {sorted(profile.drafters)})")
    return drafter or profile.default_drafter


def grid_cells(profile: Profile, fmt: str, gamma: int, batch_sizes: Sequence[int] | None = None
               ) -> list[tuple[int, int]]:
    """The (R, L) steps the engine's profiler times, those whose R·(L+1) tokens the profile reaches.

    sglang and vllm: the diagonal, every request count verifying its whole block (L = γ);
    trtllm: every request count at every L = 1..γ (one engine build per L).
    """
    sizes = tuple(REQUEST_GRID if batch_sizes is None else batch_sizes)
    if not sizes or any(r < 1 for r in sizes) or list(sizes) != sorted(set(sizes)):
        raise ConfigError(f"batch sizes {list(sizes)} must be request counts >= 1, strictly increasing")
    lengths = range(1, gamma + 1) if fmt == "trtllm" else range(gamma, gamma + 1)
    if not lengths:
        raise ConfigError("trtllm's sweep verifies L = 1..γ drafts per request: gamma=0 has no grid")
    cells = [(r, n) for r in sizes for n in lengths if r * (n + 1) <= profile.max_tokens]
    if not cells:
        least = sizes[0] * (lengths[0] + 1)
        raise ConfigError(f"profile {profile.name!r} reaches {profile.max_tokens} tokens, but {fmt}'s grid "
                          f"starts at R={sizes[0]} x (L+1)={lengths[0] + 1} = {least} tokens")
    return cells


def step_price(profile: Profile, requests: int, verified: int, *, gamma: int, drafter: str | None,
               context: int) -> StepPrice:
    """sparksim's price of one decode step, as the engine charges it (`StepCost.price`).

    `requests` requests of `context` KV tokens each, the drafter drafting γ positions (0:
    plain decoding), each request verifying `verified`, with the engine loop's time before
    the step where the profile measured one.
    """
    cost = StepCost.for_step(profile, requests=requests, kv_tokens=requests * context, kv_longest=context,
                             positions=gamma, drafter=drafter,
                             loop_s=profile.loop_s(gamma > 0, "decode", requests))
    return cost.price(np.full(requests, verified, np.int64))


def export_table(profile: Profile, fmt: str, *, gamma: int, drafter: str | None = None,
                 context: int | None = None, batch_sizes: Sequence[int] | None = None) -> EngineTable:
    """Return the table `fmt`'s engine profiler would make on `profile`, each point priced by sparksim.

    - sglang: the diagonal sweep, B = R·(γ+1), steps/s = 1 / step (context 16, the
      profiler's --input-len); a 1-D `SglangSpsTable`.
    - trtllm: θ(M) = the dense work (and attention compute) at M = bs·(L+1), α(bs) =
      drafting, KV reads at `context` (1024, sparksim's choice: TRT's sweep uses whatever
      its prompts give) and the per-request loop time, fixed = the loop's intercept. This
      splits sparksim's price exactly wherever it is additive in (bs, M); an MLA profile's
      attention compute past the KV read is not, and `export_card` records the gap.
    - vllm: whole steps at B = R·(γ+1) and context 8192 (the start-up profiling context),
      in the vLLM-Ascend file's form (see `VllmCostTables`).
    """
    check_format(fmt)
    if gamma < 0:
        raise ConfigError(f"gamma={gamma} must be >= 0")
    ctx = DEFAULT_CONTEXT[fmt] if context is None else context
    if ctx < 0:
        raise ConfigError(f"context={ctx} must be >= 0 tokens")
    name = _drafter_for(profile, fmt, gamma, drafter)
    prices = {(r, n): step_price(profile, r, n, gamma=gamma, drafter=name, context=ctx)
              for r, n in grid_cells(profile, fmt, gamma, batch_sizes)}
    tokens = tuple(r * (n + 1) for r, n in prices)
    if fmt == "sglang":
        return SglangSpsTable(tokens, tuple(1.0 / p.total_s for p in prices.values()), tokens[-1])
    if fmt == "vllm":
        return VllmCostTables(tokens, tuple(p.total_s * 1e3 for p in prices.values()), (1,), (0.0,), tokens[-1])
    return _decomposed(prices, profile, gamma)


def _decomposed(prices: dict[tuple[int, int], StepPrice], profile: Profile, gamma: int) -> TrtllmSpsTable:
    """Split the priced (bs, L) steps into θ(M) + fixed + α(bs), ms (TRT's decomposed encoding).

    fixed is the engine loop's intercept; α(bs) the terms sparksim prices by request count
    (drafting, KV reads, the drafts overhead, the loop's per-request part); θ(M) the mean of
    what the steps reaching M tokens cost beyond those: exactly the dense work (and linear
    attention compute) when the price is additive. Where it is not (an MLA profile's
    attention compute past its KV read, max(read(bs), flops(M))), θ is raised to its
    running maximum, as sparksim's profile loader cleans a table, and the card records the
    gap to sparksim's price.
    """
    loop_a_ms, _ = profile.loop_table.get(("drafting" if gamma else "plain", "decode"), (0.0, 0.0))
    alpha: dict[int, float] = {}
    rest: dict[int, list[float]] = {}
    for (r, n), p in prices.items():
        alpha.setdefault(r, max((p.draft_s + p.kv_s + p.drafts_s + p.overhead_s) * 1e3 - loop_a_ms, 0.0))
        rest.setdefault(r * (n + 1), []).append(p.total_s * 1e3 - loop_a_ms - alpha[r])
    m, bs = sorted(rest), sorted(alpha)
    theta = np.maximum.accumulate([float(np.mean(rest[t])) for t in m])
    return TrtllmSpsTable(tuple(m), tuple(theta.tolist()), loop_a_ms, tuple(bs), tuple(alpha[r] for r in bs))


def export_card(profile: Profile, table: EngineTable, fmt: str, *, gamma: int, drafter: str | None = None,
                context: int | None = None, batch_sizes: Sequence[int] | None = None,
                command: str = "") -> dict[str, Any]:
    """The sidecar card of an exported table: what priced it, on which grid, after which engine commit.

    `max_rel_gap` is the largest relative gap, over the grid, between the table's own
    lookup and sparksim's price of the same step (0 up to rounding unless a trtllm split
    is inexact).
    """
    ctx = DEFAULT_CONTEXT[fmt] if context is None else context
    name = _drafter_for(profile, fmt, gamma, drafter)
    cells = grid_cells(profile, fmt, gamma, batch_sizes)
    exact = np.array([step_price(profile, r, n, gamma=gamma, drafter=name, context=ctx).total_s for r, n in cells])
    looked = np.array([table.step_s(r, np.array([r * (n + 1)]))[0] for r, n in cells])
    card = profile.card
    return {
        "what": f"a {fmt} engine cost table priced by sparksim from the {profile.source} profile "
                f"{profile.name!r}; not a measurement of {fmt}",
        "source": profile.source,
        "hardware": card.get("hardware"), "model": card.get("model"), "dtype": card.get("dtype"),
        "profile": {"path": str(profile.path or profile.name), "source": profile.source,
                    "command": card.get("command"), "date": card.get("date")},
        "command": command,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "engine": fmt,
        "format": FORMAT_SOURCES[fmt],
        "gamma": gamma, "drafter": name, "context_tokens": ctx,
        "context_note": {"sglang": "the profiler's --input-len 16",
                         "trtllm": "sparksim's choice: TensorRT-LLM's sweep uses whatever its prompts give",
                         "vllm": "VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN's default"}[fmt],
        "grid": {"requests": sorted({r for r, _ in cells}), "verified": sorted({n for _, n in cells}),
                 "batch_tokens": sorted({r * (n + 1) for r, n in cells})},
        "max_rel_gap": float(np.max(np.abs(looked - exact) / exact)),
    }


# --------------------------------------------------------------------------- import


def _profile_tables(table: EngineTable) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], dict[str, str]]:
    """verify.csv, the extra files and what each holds, so the profile's price at a probe is the table's.

    The token term goes in verify.csv at the table's own probes (a probe below 1 token is no
    batch and is dropped); a term by request count (SGLang's α, TensorRT-LLM's batch
    overhead) goes in attention.csv, by request count and constant in KV tokens: the table
    was measured at one context, so it prices none. Between probes the profile pads up to
    the next one, as a CUDA-graph engine runs a batch (`sparksim.cost.profile`); an engine's
    planner may read the same table otherwise there (SGLang's 1-D floor, TensorRT-LLM's
    and SGLang-additive's linear interpolation).
    """
    # costs go as text, the table's own digits: write_profile's %.9g would move them by up to 5e-9
    def by_requests(requests: Sequence[int], ms: Sequence[float]) -> pd.DataFrame:
        return pd.DataFrame([(r, kv, repr(float(v))) for r, v in zip(requests, ms, strict=True) for kv in (0, KV_SPAN)],
                            columns=["requests", "kv_tokens", "attn_ms"])

    def verify(tokens: Sequence[int], ms: Sequence[float]) -> pd.DataFrame:
        keep = [(t, repr(float(v))) for t, v in zip(tokens, ms, strict=True) if t >= 1]
        return pd.DataFrame(keep, columns=["tokens", "step_ms"])

    if isinstance(table, SglangSpsTable):
        return (verify(table.batch_tokens, [1e3 / s for s in table.steps_per_sec]), {},
                {"verify.csv": "1000 / sample_steps_per_sec at sample_batch_tokens"})
    if isinstance(table, SglangAdditiveTable):
        lo = min(table.alpha_s)  # α may be negative; attention.csv may not
        return (verify(table.m_probes, [(table.bias_s + lo + t) * 1e3 for t in table.theta_s]),
                {"attention.csv": by_requests(table.bs_probes, [(a - lo) * 1e3 for a in table.alpha_s])},
                {"verify.csv": "(bias + min α + θ(m)) x 1000 at m_probes >= 1",
                 "attention.csv": "(α(bs) - min α) x 1000 by bs_probes, the same at every KV size"})
    if isinstance(table, TrtllmSpsTable):
        extra = {"attention.csv": by_requests(table.batch_sizes, table.batch_overhead_ms)} if table.batch_sizes else {}
        return (verify(table.token_counts, [t + table.fixed_overhead_ms for t in table.step_time_ms]), extra,
                {"verify.csv": "step_time_ms + fixed_overhead_ms at token_counts >= 1",
                 **({"attention.csv": "batch_overhead_ms by batch_sizes, the same at every KV size"} if extra else {})})
    if isinstance(table, VllmCostTables):
        ms = np.maximum(np.maximum.accumulate(np.asarray(table.verify_ms, np.float64)), 1e-6)
        return (verify(table.verify_tokens, ms.tolist()), {},
                {"verify.csv": "latency_ms at its token counts (whole steps)"})
    raise ConfigError(f"a {table.engine} table has no file to import")


def _read_sidecar(path: Path) -> dict[str, Any]:
    """The export card beside `path`, if any (an empty dict when there is none)."""
    card_path = sidecar_path(path)
    if not card_path.is_file():
        return {}
    try:
        card = yaml.safe_load(card_path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FormatError(card_path, [f"cannot be read as YAML ({exc})"]) from None
    if not isinstance(card, dict):
        raise FormatError(card_path, ["must be a mapping of fields"])
    return card


def import_table(path: Path | str, fmt: str, out: Path | str, *, gamma: int, model: str | None = None,
                 hardware: str | None = None) -> Path:
    """Write a sparksim profile (source: imported) whose price at the table's probes is the table's.

    The engine's step time includes drafting, so the profile's drafter (`engine-step`, a
    block drafter of block γ) costs nothing: a DSpark run on it drafts its γ positions and
    pays only the table. No KV cost beyond the table's own profiling context, no prefill
    table (prompt chunks are priced by verify.csv) and no engine loop: only what the table
    holds. Model and hardware come from the options, else from the export card beside the
    file (`<file>.card.yaml`). Returns the profile folder.
    """
    path, out = Path(path), Path(out)
    table = read_table(path, fmt)
    if gamma < 0:
        raise ConfigError(f"gamma={gamma} must be >= 0")
    if table.is_flat:
        raise ConfigError(f"{path}: the {fmt} table is flat (one cost whatever the tokens): the engine's "
                          "no-table placeholder holds no measurement to import")
    side = _read_sidecar(path)
    model = model or side.get("model")
    hardware = hardware or side.get("hardware")
    missing = [flag for flag, value in (("--model", model), ("--hardware", hardware)) if not value]
    if missing:
        raise ConfigError(f"{' and '.join(missing)} needed: {path} has no export card "
                          f"({sidecar_path(path).name}) that names them")
    verify, extra, terms = _profile_tables(table)
    drafters: dict[str, Any] = {}
    if gamma:
        extra[f"draft-{IMPORTED_DRAFTER}.csv"] = pd.DataFrame(
            {"positions": [gamma, gamma], "requests": [1, DRAFT_SPAN], "draft_ms": [0.0, 0.0]})
        drafters = {"drafters": {IMPORTED_DRAFTER: {
            "file": f"draft-{IMPORTED_DRAFTER}.csv", "kind": "block", "gamma": gamma,
            "source": f"zero: the {fmt} table's step times include drafting"}},
            "default_drafter": IMPORTED_DRAFTER}
    command = shlex.join(["sparksim", "profile", "import", str(path), "--format", fmt, "--out", str(out),
                          "--gamma", str(gamma), *(["--model", model] if model else []),
                          *(["--hardware", hardware] if hardware else [])])
    card = {
        "source": "imported",
        "hardware": str(hardware), "model": str(model), "dtype": str(side.get("dtype") or "unknown"),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "engine": f"{fmt}'s cost table, imported: its step times at its probes; between probes this "
                  "profile pads up to the next probe",
        "imported_from": {"engine": fmt, "file": str(path),
                          "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                          "format_commit": FORMAT_SOURCES[fmt],
                          "sidecar_card": {"path": str(sidecar_path(path)), **{
                              k: side[k] for k in SIDECAR_KEPT if k in side}} if side else None},
        "imported_terms": terms,
        **drafters,
        "caveats": "An engine table, not a sparksim profile: no KV cost past its profiling context, prompt "
                   "chunks priced as verify tokens, the drafter's cost inside every step.",
    }
    return write_profile(out, verify, card, extra=extra)
