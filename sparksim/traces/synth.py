"""Synthetic trace sets: a parametric model of drafter confidences, calibrated to published means.

The model, per domain d, request r, output position t and block position k = 1..γ:

    z[r, t, k] = level_d + slope_d · (k − 1) + b_r + e_r[t + k − 1] + w_r[t + k − 1]
    c_true[r, t, k] = σ(z[r, t, k])          # P(draft k accepted | drafts 1..k−1 accepted)

- `level_d` sets the domain's acceptance; it is fitted so that full-block verification at
  γ = 7, each response's last round cut at its end, reproduces a target accepted length
  (the DSpark paper's Table 1, Qwen3-8B).
- `slope_d` is the per-position shape in logit units (DFlash decays, Eagle3 rises).
- `b_r ~ N(0, difficulty_sd²)` is the request's difficulty (a random effect), drawn
  stratified like the clipped-lognormal prompt/output lengths so a domain's mean carries
  little sampling noise from a few hundred requests. The presets' lengths are fitted to
  the cited statistics in `sparksim/data/lengths.yaml` (each figure with its source).
- `e_r` is an AR(1) drift over output tokens (stationary sd `drift_sd`, coefficient
  `drift_rho` per token): easy and hard stretches within a request.
- `w_r ~ N(0, token_sd²)` is per-token noise. Drafts of the same output token in
  overlapping blocks (block t position k, block t+1 position k−1) share e and w.

`accepted[r, t]` is the number of leading drafts accepted when all γ are verified: draft k
is accepted with probability c_true[k] given 1..k−1 were, stopping at the first rejection.
`conf` is c_true (calibrated) unless a miscalibration temperature T is set, in which case
conf = σ(z / T) (T < 1 over-confident, T > 1 under-confident) and `accepted` still follows
c_true. `conf_raw` = σ(z / raw_temperature) stands for the head before calibration and
`p_accept` = c_true. Stored probabilities sit on a 1/4096 grid and `accepted` is drawn from
those stored values. Randomness comes from one seed through `np.random.SeedSequence`, so
the same seed and parameters give the same bytes; the level fit uses its own sample
(`fit_seed`), so a set's seed never moves the model, only the draw from it.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Self

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from scipy.optimize import brentq
from scipy.signal import lfilter
from scipy.special import ndtr, ndtri

from sparksim.config import read_yaml_mapping, validation_problems
from sparksim.errors import ConfigError
from sparksim.traces.format import MAX_GAMMA, REQUEST_COLUMNS, TraceSet, write_traceset
from sparksim.traces.stats import DomainStats, domain_stats, walk_totals

CALIBRATION_GAMMA = 7  # the block size of the paper's Table 1
LENGTHS_FILE = Path(__file__).resolve().parents[1] / "data" / "lengths.yaml"
TABLE1_SOURCE = (
    "DSpark paper (Cheng et al. 2026) Table 1, Qwen3-8B, temperature 1, block 7; domain means "
    "of math = GSM8K/MATH/AIME25, code = MBPP/HumanEval/LCB, chat = MT-Bench/Alpaca/Arena-Hard"
)
SYNTHETIC_NOTE = (
    "These traces are synthetic: drawn from a parametric model whose per-domain level is "
    "calibrated to published mean accepted lengths; no drafter or target model was run and "
    "nothing here was recorded."
)
_LEVEL_BOUNDS = (-8.0, 12.0)  # logit search interval for the fitted level
# Bound on requests × (output_max + γ) per domain: the padded latent is that many float64s.
_MAX_CELLS = 30_000_000
# Stored probabilities sit on a 1/4096 grid (finer than bf16's 8-bit mantissa, which real
# heads emit): the low mantissa bits are then zero and the parquet files compress ~2x.
CONF_GRID = 4096


# Parameters are validated by pydantic where they are built (a preset, a params YAML, a
# test): a number must be a finite int or float (not a bool, not a string), and each field's
# range is stated once, beside it.
_STRICT = ConfigDict(frozen=True, extra="forbid", strict=True)
Finite = Annotated[float, Field(allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
AtLeastOne = Annotated[float, Field(ge=1.0, allow_inf_nan=False)]


class DomainParams(BaseModel):
    """Model parameters of one domain; logits are natural-log odds."""

    model_config = _STRICT

    # accepted length (bonus incl.) at γ = 7 the level is fitted to; in (1, γ + 1)
    target_accept_len: Annotated[float, Field(gt=1.0, lt=CALIBRATION_GAMMA + 1)] | None
    level: Finite | None = None  # logit of the position-1 conditional for an average token; None = fit
    slope: Finite = 0.0  # logit change per block position k → k + 1 (the Fig. 2 shape)
    difficulty_sd: NonNegative = 0.4  # sd of the per-request random effect b_r
    drift_sd: NonNegative = 0.5  # stationary sd of the AR(1) drift e_r over output tokens
    drift_rho: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9  # AR(1) coefficient per output token
    token_sd: NonNegative = 0.7  # sd of the per-token noise w_r
    prompt_median: AtLeastOne = 150.0  # prompt tokens: lognormal median
    prompt_sigma: NonNegative = 0.6  # prompt tokens: lognormal sigma
    prompt_min: Annotated[int, Field(ge=1)] = 1  # prompt tokens are clipped to [prompt_min, prompt_max]
    prompt_max: Annotated[int, Field(ge=1, le=1_000_000)] = 1_000_000
    output_median: AtLeastOne = 200.0  # output tokens: lognormal median
    output_sigma: NonNegative = 0.5  # output tokens: lognormal sigma
    output_min: Annotated[int, Field(ge=1)] = 16  # output tokens are clipped to [output_min, output_max]
    output_max: Annotated[int, Field(ge=1, le=100_000)] = 512

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.target_accept_len is None and self.level is None:
            raise ValueError("give target_accept_len or level (both are null)")
        for part in ("prompt", "output"):
            lo, hi = getattr(self, f"{part}_min"), getattr(self, f"{part}_max")
            if lo > hi:
                raise ValueError(f"{part}_min={lo} must not exceed {part}_max={hi}")
        return self


class SynthModel(BaseModel):
    """A drafter's synthetic model: one DomainParams per domain plus set-wide knobs."""

    model_config = _STRICT

    name: str
    drafter: str
    target: str
    domains: Annotated[dict[Annotated[str, Field(min_length=1)], DomainParams], Field(min_length=1)]
    # conf_raw = σ(z / raw_temperature): over-confident before STS
    raw_temperature: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 0.7
    fit_requests: Annotated[int, Field(ge=1)] = 4000  # requests per domain the level is fitted on
    fit_seed: Annotated[int, Field(ge=0)] = 0  # seed of that sample, independent of the set's seed
    temperature: Annotated[float, Field(ge=0.0)] = 1.0  # sampling temperature the set stands for
    sources: tuple[str, ...] = ()  # where targets and shapes come from

    @model_validator(mode="after")
    def _fits_in_memory(self) -> Self:
        longest = max(d.output_max for d in self.domains.values())
        if self.fit_requests * (longest + CALIBRATION_GAMMA) > _MAX_CELLS:
            raise ValueError(
                f"fit_requests={self.fit_requests} must be at most {_MAX_CELLS} / "
                f"(output_max + {CALIBRATION_GAMMA}) with output_max={longest}"
            )
        return self


# --------------------------------------------------------------------------- lengths


def clipped_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """Return E[min(max(X, lo), hi)] for X ~ lognormal(mu, sigma) (closed form)."""
    if sigma == 0.0:
        return float(min(max(np.exp(mu), lo), hi))
    a, b = (np.log(lo) - mu) / sigma, (np.log(hi) - mu) / sigma
    inside = np.exp(mu + sigma**2 / 2) * (ndtr(b - sigma) - ndtr(a - sigma))  # E[X; lo < X < hi]
    return float(lo * ndtr(a) + inside + hi * (1.0 - ndtr(b)))


def fit_clipped_lognormal(mean: float, median: float, lo: float, hi: float) -> tuple[float, float]:
    """Return (median, sigma) of the lognormal whose clip to [lo, hi] has this mean and median.

    Clipping outside the median leaves it in place, so mu = ln(median); sigma is the root of
    clipped mean = `mean` (the clipped mean rises with sigma when mean > median). Raises
    ConfigError when no sigma reaches `mean` (mean <= median, or beyond what the clip allows).
    """
    where = f"lengths: mean={mean!r}, median={median!r}, clip [{lo!r}, {hi!r}]"
    if not lo < median < hi:
        raise ConfigError(f"{where}: the median must lie strictly inside the clip")
    if not mean > median:
        raise ConfigError(f"{where}: a lognormal's mean exceeds its median")
    mu = float(np.log(median))

    def gap(sigma: float) -> float:
        return clipped_lognormal_mean(mu, sigma, lo, hi) - mean

    top = 6.0
    if gap(top) < 0.0:
        raise ConfigError(f"{where}: the mean is out of reach of a lognormal clipped there")
    return float(median), float(brentq(gap, 1e-9, top, xtol=1e-10))


class LengthStat(BaseModel):
    """One cited length statistic (tokens): what a domain's prompts or outputs look like."""

    model_config = _STRICT

    mean: Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
    median: Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
    min: Annotated[int, Field(ge=1)]
    max: Annotated[int, Field(ge=1)]
    source: str  # where the figures come from

    @field_validator("source")
    @classmethod
    def _named(cls, source: str) -> str:
        if not source.strip():
            raise ValueError("must name where the figures come from")
        return " ".join(source.split())

    def fit(self) -> tuple[float, float]:
        """Return the (median, sigma) of the clipped lognormal with this mean and median."""
        return fit_clipped_lognormal(self.mean, self.median, self.min, self.max)


def load_length_stats(path: Path | str = LENGTHS_FILE) -> dict[str, dict[str, LengthStat]]:
    """Read the cited length statistics, `{domain: {"prompt" | "output": LengthStat}}`.

    Raises ConfigError naming the file and the key for a missing or malformed entry.
    """
    data = read_yaml_mapping(path, "lengths")
    domains = data.get("domains")
    if not isinstance(domains, Mapping) or not domains:
        raise ConfigError(f"{path}: 'domains' must be a non-empty mapping")
    out: dict[str, dict[str, LengthStat]] = {}
    for name, parts in domains.items():
        if not isinstance(parts, Mapping) or set(parts) != {"prompt", "output"}:
            raise ConfigError(f"{path}: domains.{name} must have exactly 'prompt' and 'output'")
        out[str(name)] = {}
        for part, fields in parts.items():
            where = f"domains.{name}.{part}"
            if not isinstance(fields, Mapping):
                raise ConfigError(f"{path}: {where} must be a mapping")
            try:
                out[str(name)][str(part)] = LengthStat.model_validate(fields)
            except ValidationError as exc:
                lines = validation_problems(exc, fields, prefix=where + ".")
                raise ConfigError(f"{path}: " + "; ".join(lines)) from None
    return out


# --------------------------------------------------------------------------- presets

LENGTH_STATS = load_length_stats()


def _fitted(stat: LengthStat) -> tuple[float, float, int, int]:
    """Return the (median, sigma, min, max) a preset draws with for a cited statistic."""
    median, sigma = stat.fit()
    return median, round(sigma, 6), stat.min, stat.max  # rounded: the card shows what is drawn


def _domain(target: float, slope: float, domain: str) -> DomainParams:
    """Return a preset domain: its Table 1 target, its shape, and its cited lengths fitted."""
    p_median, p_sigma, p_min, p_max = _fitted(LENGTH_STATS[domain]["prompt"])
    o_median, o_sigma, o_min, o_max = _fitted(LENGTH_STATS[domain]["output"])
    return DomainParams(
        target_accept_len=target, slope=slope,
        prompt_median=p_median, prompt_sigma=p_sigma, prompt_min=p_min, prompt_max=p_max,
        output_median=o_median, output_sigma=o_sigma, output_min=o_min, output_max=o_max,
    )


_SOURCES = (
    TABLE1_SOURCE,
    "per-position shape: DSpark paper Fig. 2 (Qwen3-4B): DSpark high and stable across the "
    "block, DFlash decaying (0.87 -> 0.78 code, 0.72 -> 0.63 chat), Eagle3 rising on chat from "
    "0.53; slopes chosen by hand so the measured conditional acceptance follows that shape",
    "prompt/output lengths: clipped lognormals fitted to the cited (mean, median) of each domain "
    "in sparksim/data/lengths.yaml; every figure's source (or 'assumption') is under "
    "model.lengths of this card",
)

PRESETS: dict[str, SynthModel] = {
    "dspark-qwen3-8b": SynthModel(
        name="dspark-qwen3-8b", drafter="DSpark (5 layers, block 7; synthetic)", target="Qwen3-8B",
        domains={
            "math": _domain(5.65, -0.06, "math"),
            "code": _domain(5.28, -0.06, "code"),
            "chat": _domain(3.50, -0.08, "chat"),
        },
        sources=_SOURCES,
    ),
    "dflash-qwen3-8b": SynthModel(
        name="dflash-qwen3-8b", drafter="DFlash (5 layers, block 7; synthetic)", target="Qwen3-8B",
        domains={
            "math": _domain(4.77, -0.16, "math"),
            "code": _domain(4.46, -0.17, "code"),
            "chat": _domain(2.97, -0.17, "chat"),
        },
        sources=_SOURCES,
    ),
    "eagle3-qwen3-8b": SynthModel(
        name="eagle3-qwen3-8b", drafter="Eagle3 (1 layer, TTT 7; synthetic)", target="Qwen3-8B",
        domains={
            "math": _domain(4.66, 0.06, "math"),
            "code": _domain(4.15, 0.06, "code"),
            "chat": _domain(2.58, 0.10, "chat"),
        },
        sources=_SOURCES,
    ),
}


def preset(name: str) -> SynthModel:
    """Return the named preset model; raise ConfigError listing the presets for an unknown name."""
    if name not in PRESETS:
        raise ConfigError(f"preset={name!r} is not one of {sorted(PRESETS)}")
    return PRESETS[name]


# --------------------------------------------------------------------------- validation

_MODEL_KNOBS = ("raw_temperature", "fit_requests", "fit_seed", "drafter")


def with_overrides(model: SynthModel, overrides: Mapping[str, Any], where: str = "params") -> SynthModel:
    """Return `model` with `overrides` applied (the shape of a params YAML), validated.

    `overrides` may set `raw_temperature`, `fit_requests`, `fit_seed`, `drafter` and
    `domains: {name: {field: value}}`. A domain not in `model` must give `target_accept_len`
    or `level`; its other fields take the DomainParams defaults. Raises ConfigError naming
    `where`, the key and the value of every problem.
    """
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"{where}: must be a mapping (got {type(overrides).__name__})")
    unknown = sorted(set(overrides) - {*_MODEL_KNOBS, "domains"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: {[*_MODEL_KNOBS, 'domains']})")
    raw_domains = overrides.get("domains", {}) or {}
    if not isinstance(raw_domains, Mapping):
        raise ConfigError(f"{where}: domains must be a mapping of domain name to fields")
    data = model.model_dump()
    data.update({k: overrides[k] for k in _MODEL_KNOBS if k in overrides})
    for name, fields in raw_domains.items():
        if not isinstance(fields, Mapping):
            raise ConfigError(f"{where}: domains.{name} must be a mapping of fields")
        base = data["domains"].get(name, {"target_accept_len": None})
        data["domains"][name] = {**base, **fields}
    try:
        return SynthModel.model_validate(data)
    except ValidationError as exc:
        lines = validation_problems(exc, data)
        raise ConfigError(f"{where}: {model.name}: " + "; ".join(lines)) from None


def load_params(path: Path | str) -> dict[str, Any]:
    """Read a params YAML with the safe loader; raise ConfigError naming the file if unreadable."""
    return read_yaml_mapping(path, "params")


# --------------------------------------------------------------------------- the model


@dataclass
class _DomainDraw:
    """One domain's sampled requests: everything but the level, which enters additively."""

    prompt_tokens: NDArray[np.int64]  # (R,)
    output_tokens: NDArray[np.int64]  # (R,)
    z0: NDArray[np.float64]  # (N, γ) latent logit without the level
    u: NDArray[np.float64]  # (N, γ) one uniform per draft: draft k passes iff u_k < c_true_k

    @property
    def offsets(self) -> NDArray[np.int64]:
        return np.concatenate([[0], np.cumsum(self.output_tokens)]).astype(np.int64)


def _stratified_normal(rng: np.random.Generator, n: int) -> NDArray[np.float64]:
    """Return n standard normals, one from each of n equal-probability strata, in random order.

    Per-request effects set a domain's mean, and stratifying them (Latin hypercube in one
    dimension) removes most of their sampling noise from that mean at no cost in realism.
    """
    u = (rng.permutation(n) + rng.random(n)) / n
    return ndtri(u)


def _lognormal_int(
    rng: np.random.Generator, median: float, sigma: float, n: int, lo: int, hi: int
) -> NDArray[np.int64]:
    draw = np.exp(np.log(median) + sigma * _stratified_normal(rng, n))
    return np.clip(np.rint(draw), lo, hi).astype(np.int64)


def _draw_domain(d: DomainParams, num_requests: int, gamma: int, seq: np.random.SeedSequence) -> _DomainDraw:
    """Sample `num_requests` requests of one domain at block size `gamma` from `seq`."""
    lengths_seq, difficulty_seq, latent_seq, accept_seq = seq.spawn(4)
    lengths_rng = np.random.default_rng(lengths_seq)
    prompt = _lognormal_int(
        lengths_rng, d.prompt_median, d.prompt_sigma, num_requests, d.prompt_min, d.prompt_max
    )
    output = _lognormal_int(
        lengths_rng, d.output_median, d.output_sigma, num_requests, d.output_min, d.output_max
    )
    b = d.difficulty_sd * _stratified_normal(np.random.default_rng(difficulty_seq), num_requests)  # (R,)

    # Latent per output token, padded to the longest request plus the γ−1 tokens its last
    # block drafts past the end; AR(1) rows start from the stationary law.
    width = int(output.max()) + gamma - 1
    latent_rng = np.random.default_rng(latent_seq)
    innov = latent_rng.standard_normal((num_requests, width))  # (R, W)
    innov[:, 1:] *= np.sqrt(1.0 - d.drift_rho**2)
    drift = lfilter([1.0], [1.0, -d.drift_rho], innov * d.drift_sd, axis=1)  # (R, W)
    noise = latent_rng.standard_normal((num_requests, width)) * d.token_sd  # (R, W)
    per_token = b[:, None] + drift + noise  # (R, W)
    blocks = sliding_window_view(per_token, gamma, axis=1)  # (R, W − γ + 1, γ): block at t
    live = np.arange(blocks.shape[1])[None, :] < output[:, None]  # (R, W − γ + 1)
    z0 = blocks[live] + d.slope * np.arange(gamma)[None, :]  # (N, γ) request by request, t ascending

    u = np.random.default_rng(accept_seq).random(z0.shape)  # (N, γ)
    return _DomainDraw(prompt_tokens=prompt, output_tokens=output, z0=z0, u=u)


def leading_accepts(u: NDArray[np.float64], conf: NDArray[np.floating[Any]]) -> NDArray[np.int8]:
    """Return, per row, how many leading drafts pass u_k < conf_k before the first that fails, shape (N,)."""
    return np.logical_and.accumulate(u < conf, axis=1).sum(axis=1).astype(np.int8)


def quantize(p: NDArray[np.float64]) -> NDArray[np.float32]:
    """Round probabilities to the 1/CONF_GRID grid the stored columns use, as float32."""
    return (np.rint(p * CONF_GRID) / CONF_GRID).astype(np.float32)


def _sigmoid(x: NDArray[np.float64]) -> NDArray[np.float64]:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # tanh form: no overflow warnings at large |x|


def fit_level(d: DomainParams, model: SynthModel, domain_index: int) -> float:
    """Return the level at which full-block verification at γ = 7 gives `d.target_accept_len`.

    Brent's root finding (scipy's `brentq`) on the accepted length measured on a calibration sample of `model.fit_requests`
    requests drawn from `model.fit_seed` (independent of any set's seed), with the same
    uniforms at every level so the measured length is monotone in the level. A given `level`
    is returned as is.
    """
    if d.level is not None:
        return float(d.level)
    return _fit_level(d, model.fit_requests, model.fit_seed, domain_index, model.name)


@functools.lru_cache(maxsize=64)
def _fit_level(d: DomainParams, fit_requests: int, fit_seed: int, domain_index: int, name: str) -> float:
    # Cached: the fit is a pure function of these arguments and costs ~0.5 s per domain. It
    # uses unrounded probabilities; the 1/4096 grid of the stored ones moves lengths < 0.01 %.
    assert d.target_accept_len is not None
    seq = np.random.SeedSequence(fit_seed, spawn_key=(domain_index,))
    draw = _draw_domain(d, fit_requests, CALIBRATION_GAMMA, seq)
    offsets = draw.offsets
    # Draft k passes iff u_k < σ(level + z0_k), i.e. level > logit(u_k) − z0_k; a row accepts
    # ≥ k drafts iff level exceeds the running max of those thresholds over 1..k. The same
    # uniforms serve every level (common random numbers), so each step of the search is a compare.
    with np.errstate(divide="ignore"):
        threshold = np.maximum.accumulate(np.log(draw.u) - np.log1p(-draw.u) - draw.z0, axis=1)
    threshold_t = np.ascontiguousarray(threshold.T)  # (γ, N): a column per compare, fast to scan

    def walk_length(level: float) -> float:
        acc = np.zeros(threshold_t.shape[1], dtype=np.int64)  # (N,)
        for column in threshold_t:
            acc += column < level
        rounds, tokens = walk_totals(offsets, acc)
        return tokens / rounds

    target = d.target_accept_len

    def gap(level: float) -> float:
        return walk_length(level) - target

    lo, hi = _LEVEL_BOUNDS
    if not gap(lo) < 0.0 < gap(hi):
        raise ConfigError(
            f"{name}: target_accept_len={target!r} is out of reach of levels "
            f"{lo}..{hi} with these noise parameters"
        )
    # The measured length is a step function of the level (each row's count changes at one of
    # its thresholds); Brent's bracketing keeps the sign change and lands within 1e-6 of it,
    # far below the sample's own noise, in ~10 walks.
    return float(brentq(gap, lo, hi, xtol=1e-6, rtol=1e-12))


@dataclass
class SynthSet:
    """A generated trace set in memory, with the fitted levels and the walk statistics."""

    model: SynthModel
    gamma: int
    seed: int
    miscalibration: float | None
    levels: dict[str, float]
    trace: TraceSet
    stats: dict[str, DomainStats]


def synthesize(
    model: SynthModel,
    *,
    requests_per_domain: int = 300,
    gamma: int = CALIBRATION_GAMMA,
    seed: int = 0,
    miscalibration: float | None = None,
) -> SynthSet:
    """Fit each domain's level, then draw `requests_per_domain` requests per domain from `seed`.

    `miscalibration` T rescales the logits of `conf` by 1/T (T < 1 over-confident, T > 1
    under-confident); `accepted` and `p_accept` follow the true probabilities regardless.
    """
    if isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= MAX_GAMMA:
        raise ConfigError(f"gamma={gamma!r} must be an integer in 1..{MAX_GAMMA}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed={seed!r} must be a non-negative integer")
    if (isinstance(requests_per_domain, bool) or not isinstance(requests_per_domain, int)
            or requests_per_domain < 1):
        raise ConfigError(f"requests_per_domain={requests_per_domain!r} must be a positive integer")
    longest = max(d.output_max for d in model.domains.values())
    if requests_per_domain * (longest + gamma) > _MAX_CELLS:
        raise ConfigError(
            f"requests_per_domain={requests_per_domain} with output_max={longest} exceeds "
            f"{_MAX_CELLS} latent cells per domain; draw several sets with different seeds"
        )
    if miscalibration is not None and not (np.isfinite(miscalibration) and miscalibration > 0):
        raise ConfigError(f"miscalibration={miscalibration!r} must be a temperature > 0")

    names = list(model.domains)
    levels = {name: fit_level(model.domains[name], model, i) for i, name in enumerate(names)}
    domain_seqs = np.random.SeedSequence(seed).spawn(len(names))
    frames: list[pd.DataFrame] = []
    z_parts: list[NDArray[np.float64]] = []
    p_parts: list[NDArray[np.float32]] = []
    acc_parts: list[NDArray[np.int8]] = []
    for name, seq in zip(names, domain_seqs, strict=True):
        draw = _draw_domain(model.domains[name], requests_per_domain, gamma, seq)
        frames.append(pd.DataFrame({
            "domain": name, "prompt_tokens": draw.prompt_tokens, "output_tokens": draw.output_tokens,
        }))
        z = draw.z0 + levels[name]  # (N_d, γ) true logits
        p = quantize(_sigmoid(z))
        z_parts.append(z)
        p_parts.append(p)
        acc_parts.append(leading_accepts(draw.u, p))
    requests = pd.concat(frames, ignore_index=True)
    requests.insert(0, "request_id", np.arange(len(requests), dtype=np.int64))
    requests = requests.loc[:, list(REQUEST_COLUMNS)]
    z = np.concatenate(z_parts)  # (N, γ) true logits
    p_accept = np.concatenate(p_parts)  # (N, γ) the probabilities accepted was drawn from
    conf = p_accept if miscalibration is None else quantize(_sigmoid(z / miscalibration))
    out_tok = requests["output_tokens"].to_numpy(np.int64)
    trace = TraceSet(
        name=model.name, card={}, gamma=gamma, requests=requests,
        offsets=np.concatenate([[0], np.cumsum(out_tok)]).astype(np.int64),
        conf=conf, accepted=np.concatenate(acc_parts), conf_raw=quantize(_sigmoid(z / model.raw_temperature)),
        p_accept=p_accept,
    )
    return SynthSet(model=model, gamma=gamma, seed=seed, miscalibration=miscalibration,
                    levels=levels, trace=trace, stats=domain_stats(trace))


# --------------------------------------------------------------------------- the card


def _rounded(values: NDArray[np.float64], digits: int = 4) -> list[float | None]:
    return [None if not np.isfinite(v) else round(float(v), digits) for v in values]


def build_card(synth: SynthSet, command: str, date: str | None = None) -> dict[str, Any]:
    """Return the card.yaml fields of a generated set: provenance, every parameter, the results."""
    m = synth.model
    stats = {name: synth.stats[name] for name in m.domains if name in synth.stats}  # model order
    table: dict[str, Any] = {}
    for name, st in stats.items():
        target = m.domains[name].target_accept_len
        row: dict[str, Any] = {
            "target": target, "achieved": round(st.accepted_length, 4),
            "uncut": round(st.uncut_accepted_length, 4),
            "rounds": st.num_rounds, "requests": st.num_requests,
        }
        if target is not None:
            row["error_pct"] = round(100.0 * (st.accepted_length / target - 1.0), 2)
        table[name] = row
    return {
        "source": "synthetic",
        "target": f"{m.target} (synthetic stand-in)",
        "drafter": m.drafter,
        "gamma": synth.gamma,
        "temperature": m.temperature,
        "date": date or dt.date.today().isoformat(),
        "command": command,
        "note": SYNTHETIC_NOTE,
        "data": {
            "requests": synth.trace.num_requests,
            "positions": synth.trace.num_positions,
            "domains": list(m.domains),
        },
        "model": {
            "preset": m.name,
            "equation": "c_true[r,t,k] = sigmoid(level_d + slope_d*(k-1) + b_r + e_r[t+k-1] + w_r[t+k-1])",
            "sampling": (
                "b_r ~ N(0, difficulty_sd^2) and lognormal lengths are drawn stratified (one draw per "
                "equal-probability stratum, in random order); e_r is AR(1) from its stationary law; "
                f"stored probabilities are rounded to a 1/{CONF_GRID} grid and accepted is drawn from them"
            ),
            "seed": synth.seed,
            "miscalibration_temperature": synth.miscalibration,
            "raw_temperature": m.raw_temperature,
            "fit_requests": m.fit_requests,
            "fit_seed": m.fit_seed,
            "fitted_level": {k: round(v, 5) for k, v in synth.levels.items()},
            "domains": {k: v.model_dump() for k, v in m.domains.items()},
            "sources": list(m.sources),
            "lengths": _lengths_card(synth),
        },
        "columns": {
            "conf": (
                "calibrated conditional confidence = p_accept" if synth.miscalibration is None
                else f"miscalibrated: sigmoid(logit(p_accept) / {synth.miscalibration})"
            ),
            "conf_raw": f"pre-calibration stand-in: sigmoid(logit(p_accept) / {m.raw_temperature})",
            "p_accept": "true conditional acceptance probability the accepted column was drawn from",
        },
        "calibration": {
            "measured_as": (
                "full-block walk per request (start at pos 0; a round at pos t yields accepted[t] + 1 "
                "tokens and moves to t + accepted[t] + 1), the last round cut at the response's end "
                "as real decoding cuts it; achieved = tokens / rounds of the domain (the level is "
                "fitted by this walk); uncut = mean of accepted + 1 over the same rounds"
            ),
            "target_gamma": CALIBRATION_GAMMA,
            "target_source": TABLE1_SOURCE,
            **({} if synth.gamma == CALIBRATION_GAMMA else {
                "caveat": f"targets hold at γ = {CALIBRATION_GAMMA}; this set has γ = {synth.gamma}, "
                          "so achieved lengths are not comparable to them",
            }),
            "accepted_length": table,
        },
        "conditional_acceptance": {
            "definition": "P(accepted >= k | accepted >= k-1) over the full-block rounds, k = 1..gamma",
            **{name: _rounded(st.conditional) for name, st in stats.items()},
        },
        "mean_conf_by_position": {
            "definition": "mean conf at position k over the rounds that reached k (compare with the above)",
            **{name: _rounded(st.predicted) for name, st in stats.items()},
        },
        "ece": {
            "definition": "per-position ECE (10 equal bins) over the rounds that reached k, mean over k",
            **{
                name: {
                    "conf": round(float(np.nanmean(st.ece)), 4),
                    "conf_raw": None if st.ece_raw is None else round(float(np.nanmean(st.ece_raw)), 4),
                }
                for name, st in stats.items()
            },
        },
    }


def _lengths_card(synth: SynthSet) -> dict[str, Any]:
    """Return, per domain, the lengths' cited statistics (with sources), the fit and the draw."""
    requests = synth.trace.requests
    out: dict[str, Any] = {}
    for name, d in synth.model.domains.items():
        mine = requests[requests["domain"] == name]
        entry: dict[str, Any] = {}
        for part in ("prompt", "output"):
            drawn = mine[f"{part}_tokens"].to_numpy(np.float64)
            used = (getattr(d, f"{part}_median"), getattr(d, f"{part}_sigma"),
                    getattr(d, f"{part}_min"), getattr(d, f"{part}_max"))
            cited = LENGTH_STATS.get(name, {}).get(part)
            # a params override of the lengths makes the cited figures no longer the source
            if cited is not None and used == _fitted(cited):
                entry[part] = {"cited": {"mean": cited.mean, "median": cited.median,
                                         "source": cited.source}}
            else:
                entry[part] = {"cited": "none: set by the model's parameters, not data/lengths.yaml"}
            entry[part] |= {
                "fit": {
                    "form": "lognormal clipped to [min, max], drawn stratified, rounded to tokens",
                    "median": round(float(used[0]), 4), "sigma": round(float(used[1]), 6),
                    "min": int(used[2]), "max": int(used[3]),
                },
                "drawn": ({"mean": round(float(drawn.mean()), 1),
                           "median": round(float(np.median(drawn)), 1)} if drawn.size else None),
            }
        out[name] = entry
    return out


def write_synth(path: Path | str, synth: SynthSet, command: str, date: str | None = None) -> Path:
    """Write `synth` as a trace-set folder with its card (atomically, checked on the way)."""
    t = synth.trace
    return write_traceset(
        path, t.requests, t.conf, t.accepted, build_card(synth, command, date),
        conf_raw=t.conf_raw, p_accept=t.p_accept,
    )


def synth_command(
    preset_name: str, *, requests_per_domain: int, gamma: int, seed: int,
    miscalibration: float | None, params: Path | None, out: Path,
) -> str:
    """Return the `sparksim traces synth` command line that remakes a set with these options."""
    parts: Sequence[str] = [
        "sparksim", "traces", "synth", "--preset", preset_name,
        "--requests-per-domain", str(requests_per_domain), "--gamma", str(gamma), "--seed", str(seed),
        *(["--miscalibration", repr(miscalibration)] if miscalibration is not None else []),
        *(["--params", str(params)] if params is not None else []),
        "--out", str(out),
    ]
    return " ".join(parts)
