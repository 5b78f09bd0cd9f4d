"""Samples a step's first emitted token by Monte Carlo, with bootstrap CIs, to check its exact law.

Each trial draws x_1 ~ q_1, asks the policy for ℓ and rejection-samples, as the step
does (`sparksim.bias.first_token` gives the law the samples should follow); `bootstrap_tv`
estimates the TV from p_t along a witness set, or from the samples alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from sparksim.bias.first_token import FloatArray, IntArray, StepCase, residual
from sparksim.bias.path_decider import PathDecider
from sparksim.errors import ConfigError


def sample_first_tokens(case: StepCase, decide: Callable[[int], int], n: int,
                        rng: np.random.Generator) -> IntArray:
    """Run the step `n` times by sampling and return the first emitted tokens (n,).

    Each trial draws x_1 ~ q_1 (and x_2 ~ q_2(·|x_1) when the case has q_2), asks
    `decide(x_1)` for ℓ (memoised per x_1: a decision is a function of the path), then
    rejection-samples: ℓ = 0 → a token ~ p_t; else x_1 with probability min(1, p_t/q_1),
    otherwise a token ~ norm(max(0, p_t − q_1)).
    """
    v = case.vocab
    x1 = rng.choice(v, size=n, p=case.q1)
    if case.q2 is not None:  # drafted, never read by a first-token question
        cum = np.cumsum(case.q2[x1], axis=1)
        _x2 = (rng.random(n)[:, None] > cum).sum(axis=1)
    ell = np.empty(n, np.int64)
    for x in np.unique(x1):  # one decision per drafted token
        ell[x1 == x] = int(decide(int(x)))
    ratio = np.minimum(1.0, case.p_t[x1] / case.q1[x1])
    accept = rng.random(n) < ratio
    own = rng.choice(v, size=n, p=case.p_t)
    resampled = rng.choice(v, size=n, p=residual(case.p_t, case.q1))
    return np.where(ell == 0, own, np.where(accept, x1, resampled)).astype(np.int64)


@dataclass(frozen=True)
class Interval:
    """An estimate with a bootstrap confidence interval."""

    estimate: float
    low: float
    high: float
    level: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def shifted(self, by: float) -> Interval:
        """Return the interval moved by `by`."""
        return Interval(self.estimate + by, self.low + by, self.high + by, self.level)

    def __str__(self) -> str:
        return f"{self.estimate:.4f} [{self.low:.4f}, {self.high:.4f}]"


def _bootstrap(data: FloatArray, statistic: Callable[..., Any], level: float, n_resamples: int,
               seed: int) -> Interval:
    from scipy.stats import bootstrap

    batch = max(1, 2_000_000 // max(data.size, 1))  # resamples held at once: ~16 MB, not n_resamples·n
    res = bootstrap((data,), statistic, vectorized=True, confidence_level=level, n_resamples=n_resamples,
                    method="percentile", random_state=np.random.default_rng(seed), batch=batch)
    ci = res.confidence_interval
    return Interval(float(statistic(data, axis=-1)), float(ci.low), float(ci.high), level)


def bootstrap_probability(tokens: ArrayLike, k: int, *, level: float = 0.95, n_resamples: int = 2000,
                          seed: int = 0) -> Interval:
    """Return the empirical P(token = k) of sampled `tokens` with a percentile bootstrap CI."""
    hits = (np.asarray(tokens) == k).astype(np.float64)
    return _bootstrap(hits, np.mean, level, n_resamples, seed)


def bootstrap_tv(tokens: ArrayLike, p_t: ArrayLike, *, witness: ArrayLike | None = None,
                 level: float = 0.95, n_resamples: int = 2000, seed: int = 0) -> Interval:
    """Return an estimate of TV(law of `tokens`, p_t) with a percentile bootstrap CI.

    TV = max_S P(S) − p_t(S). With `witness` (a boolean mask S over the vocabulary, e.g. where
    the exact law exceeds p_t) the estimate is P̂(Y ∈ S) − p_t(S), unbiased for the TV when S
    is the exact witness set. Without it, a split-sample estimate from the samples alone: the
    first half picks S = {y: P̂₁(y) > p_t(y)}, the second half estimates P̂₂(S) − p_t(S), an
    unbiased estimate of a lower bound of the TV (0 in expectation for a lossless policy),
    with a valid CI. (The plug-in ½‖P̂ − p_t‖₁ is not used: it is biased upwards by about
    √(V/n) even for a lossless policy, and its bootstrap doubles that bias.)
    """
    y = np.asarray(tokens, np.int64)
    p = np.asarray(p_t, np.float64)
    if witness is None:
        half = y.size // 2
        if half < 1:
            raise ConfigError("bootstrap_tv: need at least 2 samples for the split-sample estimate")
        first = np.bincount(y[:half], minlength=p.size) / half
        s, y = first > p, y[half:]
    else:
        s = np.asarray(witness, bool)
    return _bootstrap(s[y].astype(np.float64), np.mean, level, n_resamples, seed).shifted(-float(p[s].sum()))


@dataclass(frozen=True)
class MonteCarloResult:
    """The sampled first-token law of one case under one policy."""

    tokens: IntArray  # (n,) sampled first tokens
    dist: FloatArray  # (V,) empirical law

    def probability(self, k: int, **kw: Any) -> Interval:
        return bootstrap_probability(self.tokens, k, **kw)

    def tv(self, p_t: ArrayLike, witness: ArrayLike | None = None, **kw: Any) -> Interval:
        return bootstrap_tv(self.tokens, p_t, witness=witness, **kw)


def monte_carlo_first_token(case: StepCase, decide: PathDecider | Callable[[int], int], n: int,
                            seed: int = 0) -> MonteCarloResult:
    """Sample the step `n` times (draw x_1, decide, rejection-sample) and return the tokens and their law.

    `decide` maps a drafted x_1 to ℓ; a `PathDecider` is asked with the row [c_1, c_2(x_1)].
    """
    if isinstance(decide, PathDecider):
        pd_ = decide
        fn: Callable[[int], int] = lambda x: int(pd_.lengths([[case.c1, case.c2[x]]])[0])  # noqa: E731
    else:
        fn = decide
    tokens = sample_first_tokens(case, fn, n, np.random.default_rng(seed))
    return MonteCarloResult(tokens, np.bincount(tokens, minlength=case.vocab) / n)
