"""Bias over long spans, by Monte Carlo on the live engine: a policy's continuations against plain decoding.

`sparksim.bias.bias_exact` computes the first emitted token's law exactly; a policy could still
bend later tokens (two-step carries survivals across steps, a budget couples requests). Here
the live engine writes n continuations of `span` tokens from one context under a policy,
R at a time in one batch (so a policy that couples requests decides on R real requests), and
n more under plain decoding (the target's own law, no drafter). At every position k the two
samples' token distributions are compared:

- a split-half lower bound on their total-variation distance: the first halves choose the
  witness set S_k = {y : P̂(y) > Q̂(y)}, the second halves estimate P(S_k) − Q(S_k), which is
  ≤ TV and unbiased for it given S_k (the plug-in ½‖P̂ − Q̂‖₁ is biased upward by about
  √(V/n) and useless here); its 95 % CI is a bootstrap of the two independent halves
  (scipy.stats.bootstrap, percentile);
- a chi-square test of homogeneity (tokens seen fewer than 5 times pooled), Holm-adjusted
  over positions.

A lossless policy shows lower bounds whose CIs cover 0 and no small adjusted p-value. A
response that ends (EOS) before position k counts as the token "ended" there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from sparksim.cost.profile import Profile
from sparksim.live.engine import LiveBatch, LiveModels, LiveRequest, choose_lengths
from sparksim.policies.base import Policy, drafted_positions

ENDED = -1  # the token recorded at positions past a response's EOS


def continuations(models: LiveModels, context: list[int], policy: Policy | None, profile: Profile,
                  n: int, span: int, *, batch: int = 64, seed: int = 0, temperature: float = 1.0,
                  drafter: str | None = None) -> NDArray[np.int64]:
    """Return n continuations (n, span) of `context` written by the live engine under `policy`.

    `policy=None` is plain decoding (no drafter call). The first token is the prefill's.
    """
    positions = drafted_positions(policy, profile, drafter, models.gamma) if policy is not None else 0
    lb = LiveBatch(models, batch, positions, temperature=temperature, max_new_tokens=span, seed=seed)
    rows: list[list[int]] = []
    step = 0
    while len(rows) < n:
        reqs = [LiveRequest(len(rows) + i, -1, 0, 0, 0.0, list(context)) for i in range(min(batch, n - len(rows)))]
        lb.running = []
        lb.prefill(reqs, time.perf_counter)
        for r in [r for r in reqs if lb.done(r)]:
            lb.release(r)
        while lb.running:
            if policy is None:
                res = lb.decode(_plain)
            else:
                running = lb.running

                def choose(conf: NDArray[np.float64], running: list[LiveRequest] = running,
                           step: int = step, pol: Policy = policy) -> NDArray[np.int64]:
                    ids = [r.request_id for r in running]
                    kv = sum(r.length for r in running) + len(running)
                    longest = max(r.length for r in running) + 1
                    return choose_lengths(pol, profile, conf, ids, kv, longest, step, 1 << 30, positions,
                                          drafter)[1]

                res = lb.decode(choose)
            step += 1
            for r in res.finished:
                lb.release(r)
        for r in reqs:
            toks = r.tokens[:span]
            rows.append(toks + [ENDED] * (span - len(toks)))
    return np.asarray(rows, dtype=np.int64)


def _plain(conf: NDArray[np.float64]) -> NDArray[np.int64]:
    return np.zeros(conf.shape[0], dtype=np.int64)


SPAN_ALPHA = 0.01  # family-wise level of the per-position homogeneity tests (Holm)


@dataclass(frozen=True)
class SpanComparison:
    """Per position k = 1..span: the TV lower bound, its CI, and the homogeneity test."""

    tv_low_bound: NDArray[np.float64]
    ci_low: NDArray[np.float64]
    ci_high: NDArray[np.float64]
    p_value: NDArray[np.float64]  # chi-square, unadjusted
    p_holm: NDArray[np.float64]

    def summary(self) -> dict[str, Any]:
        """The span's figures and its verdict: biased when some position's TV lower bound has
        a CI above 0 and the homogeneity test rejects after Holm's correction at SPAN_ALPHA."""
        k = int(np.argmax(self.tv_low_bound))
        above = int((self.ci_low > 0).sum())
        p_min = float(self.p_holm.min())
        return {"max_tv_lower_bound": float(self.tv_low_bound[k]), "at_position": k + 1,
                "ci95": [float(self.ci_low[k]), float(self.ci_high[k])],
                "positions_ci_above_0": above, "min_p_holm": p_min,
                "biased": bool(above > 0 and p_min < SPAN_ALPHA)}


def compare(a: NDArray[np.int64], b: NDArray[np.int64], *, seed: int = 0, n_resamples: int = 1000
            ) -> SpanComparison:
    """Compare two samples of continuations (n_a, span) and (n_b, span) position by position."""
    rng = np.random.default_rng(seed)
    span = a.shape[1]
    ha, hb = a.shape[0] // 2, b.shape[0] // 2
    lows, ci_lo, ci_hi, pvals = [], [], [], []
    for k in range(span):
        x, y = a[:, k], b[:, k]
        vals = np.union1d(x[:ha], y[:hb])
        pa = np.array([(x[:ha] == v).mean() for v in vals])
        pb = np.array([(y[:hb] == v).mean() for v in vals])
        witness = vals[pa > pb]
        xa = np.isin(x[ha:], witness).astype(np.float64)
        yb = np.isin(y[hb:], witness).astype(np.float64)
        lows.append(float(xa.mean() - yb.mean()))
        if witness.size and 0 < xa.mean() + yb.mean() < 2:
            res = stats.bootstrap((xa, yb), lambda u, v, axis=-1: u.mean(axis) - v.mean(axis),
                                  n_resamples=n_resamples, method="percentile", vectorized=True,
                                  random_state=rng)
            ci_lo.append(float(res.confidence_interval.low))
            ci_hi.append(float(res.confidence_interval.high))
        else:
            ci_lo.append(lows[-1])
            ci_hi.append(lows[-1])
        pvals.append(_homogeneity(x, y))
    p = np.asarray(pvals)
    return SpanComparison(np.asarray(lows), np.asarray(ci_lo), np.asarray(ci_hi), p, _holm(p))


def _homogeneity(x: NDArray[np.int64], y: NDArray[np.int64]) -> float:
    """Chi-square test that x and y come from one distribution (rare tokens pooled)."""
    vals, counts = np.unique(np.concatenate([x, y]), return_counts=True)
    common = vals[counts >= 5]
    cx = [int((x == v).sum()) for v in common] + [int((~np.isin(x, common)).sum())]
    cy = [int((y == v).sum()) for v in common] + [int((~np.isin(y, common)).sum())]
    table = np.array([cx, cy])
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return 1.0
    return float(stats.chi2_contingency(table)[1])


def _holm(p: NDArray[np.float64]) -> NDArray[np.float64]:
    """Holm's step-down adjustment of p-values (family-wise error over positions)."""
    order = np.argsort(p)
    m = p.size
    adj = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p[i])))
        adj[i] = running
    return adj


def span_bias(models: LiveModels, contexts: list[list[int]], specs: list[str], profile: Profile, n: int,
              span: int, *, batch: int, seed: int, temperature: float,
              progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Compare each policy's `n` continuations of `span` tokens with plain decoding's, per context.

    One row per (context, policy): `SpanComparison.summary()`'s figures and verdict, the CI
    split into `ci95_low`/`ci95_high`. Bad policy names or parameters fail before any work.
    """
    from sparksim.policies import make_policy, parse_policy_spec

    parsed = [parse_policy_spec(spec) for spec in specs]
    for name, params in parsed:
        make_policy(name, models.gamma, params)
    rows = []
    for c, ctx in enumerate(contexts):
        if progress is not None:
            progress(f"context #{c}: plain decoding, {n} continuations of {span} tokens")
        base = continuations(models, ctx, None, profile, n, span, batch=batch, seed=seed + 7919 * c,
                             temperature=temperature)
        for spec, (name, params) in zip(specs, parsed, strict=True):
            if progress is not None:
                progress(f"context #{c}: {spec}")
            pol = make_policy(name, models.gamma, params)
            got = continuations(models, ctx, pol, profile, n, span, batch=batch, seed=seed + 7919 * c + 1,
                                temperature=temperature, drafter=None)
            summ = compare(got, base, seed=seed).summary()
            rows.append({"context": c, "policy": pol.label(), **{k: v for k, v in summ.items() if k != "ci95"},
                         "ci95_low": summ["ci95"][0], "ci95_high": summ["ci95"][1]})
    return rows
