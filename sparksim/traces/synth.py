"""Draws synthetic trace sets from a parametric model of drafter confidences, fitted to published means.

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

The parameters are `synth_params`'s, the shipped models `synth_presets`'s (lengths from
`synth_lengths`), and a set's card and folder `synth_card`'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray
from scipy.optimize import brentq
from scipy.signal import lfilter
from scipy.special import ndtri

from sparksim.errors import ConfigError
from sparksim.traces.format import MAX_GAMMA, REQUEST_COLUMNS, TraceSet
from sparksim.traces.stats import DomainStats, domain_stats, walk_totals
from sparksim.traces.synth_params import CALIBRATION_GAMMA, MAX_CELLS, DomainParams, SynthModel

_LEVEL_BOUNDS = (-8.0, 12.0)  # logit search interval for the fitted level
# Stored probabilities sit on a 1/4096 grid (finer than bf16's 8-bit mantissa, which real
# heads emit): the low mantissa bits are then zero and the parquet files compress ~2x.
CONF_GRID = 4096


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
    if requests_per_domain * (longest + gamma) > MAX_CELLS:
        raise ConfigError(
            f"requests_per_domain={requests_per_domain} with output_max={longest} exceeds "
            f"{MAX_CELLS} latent cells per domain; draw several sets with different seeds"
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
        name=model.name, card={}, gamma=gamma,
        request_columns={c: requests[c].to_numpy(object if c == "domain" else np.int64) for c in REQUEST_COLUMNS},
        offsets=np.concatenate([[0], np.cumsum(out_tok)]).astype(np.int64),
        conf=conf, accepted=np.concatenate(acc_parts), conf_raw=quantize(_sigmoid(z / model.raw_temperature)),
        p_accept=p_accept,
    )
    return SynthSet(model=model, gamma=gamma, seed=seed, miscalibration=miscalibration,
                    levels=levels, trace=trace, stats=domain_stats(trace))
