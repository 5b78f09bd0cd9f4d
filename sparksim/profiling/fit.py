"""Least-squares fits that turn measured whole steps into the profile format's cost terms.

The sweep times whole verification steps: at (tokens T, context C) a step of
R = ceil(T / tokens_per_request) requests, each reading C cached tokens, so the step
reads K = R·C KV tokens. The simulator prices a step as dense(T) + attention(R, K), so the
measurements of one T across contexts are fitted to a line in K: the intercept is dense(T),
the slope the cost of reading one KV token. attention.csv can vary only with R and K, so
token counts with the same R share one slope (`per-request`), or every T shares one
(`pooled`); each T keeps its own intercept. A prompt-only step of q tokens is fitted to
a + b·q + c·q²; c is the cost model's causal prefill attention coefficient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from sparksim.errors import ConfigError

MIN_CONTEXTS = 2  # a line through one context cannot tell dense work from KV reads
DENSE_FLOOR_MS = 1e-3  # a noisy negative intercept is clipped here; the loader's clean-up raises dips
AttentionFit = Literal["per-request", "pooled"]
ATTENTION_FITS: tuple[AttentionFit, ...] = ("per-request", "pooled")


def check_contexts(contexts: Sequence[int]) -> None:
    """Raise ConfigError unless the sweep has at least MIN_CONTEXTS distinct contexts."""
    if len(set(contexts)) < MIN_CONTEXTS:
        raise ConfigError(
            f"--context {','.join(map(str, contexts))} lists {len(set(contexts))} context(s); "
            f"the profile splits each step into dense work and KV reads by fitting a line over "
            f"contexts, which needs at least {MIN_CONTEXTS} (e.g. --context 512,2048,8000)")


@dataclass(frozen=True)
class KvSplit:
    """The grid split into dense(T) and a per-KV-token attention slope, with the fit's residuals."""

    how: AttentionFit
    dense: pd.DataFrame  # tokens, requests, intercept_ms, dense_ms, own_slope_ms_per_kv_token
    slopes: pd.DataFrame  # requests (0 when pooled), ms_per_kv_token, tokens (the T sharing it)
    points: pd.DataFrame  # tokens, context, requests, kv_tokens, step_ms, fit_ms, residual_ms
    pooled_slope: float  # one slope for every T, for comparison with the per-request ones
    left_out: list[int]  # token counts measured at fewer than MIN_CONTEXTS contexts

    @property
    def kv_top(self) -> int:
        """The largest KV tokens of any fitted point: where attention.csv's measured range ends."""
        return int(self.points["kv_tokens"].max())

    def verify_table(self) -> pd.DataFrame:
        """verify.csv: the dense step (no KV read) at every fitted token count."""
        return self.dense[["tokens"]].assign(step_ms=self.dense["dense_ms"])

    def attention_table(self) -> pd.DataFrame:
        """attention.csv: the fitted slope × KV tokens at 0 and the largest measured K.

        Every requests row needs the same kv_tokens (the format's grid), so each row spans
        0..kv_top, the largest K measured at any R; the loader extrapolates past it.
        """
        kv = np.array([0, self.kv_top], dtype=np.int64)
        if self.how == "pooled":
            return pd.DataFrame({"kv_tokens": kv, "attn_ms": self.pooled_slope * kv})
        rows = [(int(r), int(k), s * float(k))
                for r, s in zip(self.slopes["requests"], self.slopes["ms_per_kv_token"], strict=True)
                for k in kv]
        return pd.DataFrame(rows, columns=["requests", "kv_tokens", "attn_ms"])

    def summary(self) -> dict[str, Any]:
        """The fit as the card records it: the slopes, each T's intercept and the residuals."""
        res = self.points["residual_ms"].to_numpy(np.float64)
        rel = np.abs(res) / self.points["step_ms"].to_numpy(np.float64)
        per_t = self.points.groupby("tokens")["residual_ms"].apply(
            lambda r: math.sqrt(float(np.mean(np.square(r)))))
        return {
            "attention_fit": self.how,
            "model": "step_ms(T, C) = dense(T) + s * R * C, least squares over the measured "
                     "contexts; each token count T has its own intercept dense(T) (clipped at "
                     f"{DENSE_FLOOR_MS} ms), " + (
                         "token counts with the same R share the slope s_R (clipped at >= 0)"
                         if self.how == "per-request" else
                         "every token count shares one slope s (clipped at >= 0)"),
            "kv_tokens_measured_up_to": self.kv_top,
            "slopes_ms_per_kv_token": [
                {"requests": int(r), "slope": _r(s), "tokens_from": min(ts), "tokens_to": max(ts)}
                for r, s, ts in zip(self.slopes["requests"], self.slopes["ms_per_kv_token"],
                                    self.slopes["tokens"], strict=True)],
            "pooled_slope_ms_per_kv_token": _r(self.pooled_slope),
            "per_tokens": [
                {"tokens": t, "requests": r, "dense_ms": _r(d), "intercept_ms": _r(a),
                 "own_slope_ms_per_kv_token": _r(s), "rms_residual_ms": _r(float(per_t[t]))}
                for t, r, d, a, s in zip(
                    self.dense["tokens"].tolist(), self.dense["requests"].tolist(),
                    self.dense["dense_ms"].tolist(), self.dense["intercept_ms"].tolist(),
                    self.dense["own_slope_ms_per_kv_token"].tolist(), strict=True)],
            "residual": {
                "points": int(res.size),
                "rms_ms": _r(math.sqrt(float(np.mean(np.square(res))))),
                "max_abs_ms": _r(float(np.max(np.abs(res)))),
                "median_abs_relative": _r(float(np.median(rel))),
                "max_abs_relative": _r(float(np.max(rel))),
            },
            "intercepts_floored_at_tokens": [
                int(t) for t, a in zip(self.dense["tokens"], self.dense["intercept_ms"], strict=True)
                if a < DENSE_FLOOR_MS],
            "left_out_tokens": self.left_out,
        }


def split_dense_attention(grid: pd.DataFrame, how: AttentionFit = "per-request") -> KvSplit:
    """Fit `grid` (columns tokens, context, requests, step_ms) as dense(T) + s·R·C.

    A token count measured at fewer than MIN_CONTEXTS contexts is left out; with none left
    the grid cannot be split, a ConfigError. Slopes below 0 (noise where KV reads cost
    nothing measurable) are clipped to 0 and the intercept refitted as the mean.
    """
    if how not in ATTENTION_FITS:
        raise ConfigError(f"attention fit {how!r} is not one of {', '.join(ATTENTION_FITS)}")
    seen = grid.groupby("tokens")["context"].nunique()
    kept = sorted(int(t) for t in seen.index[seen >= MIN_CONTEXTS])
    left_out = sorted(int(t) for t in seen.index[seen < MIN_CONTEXTS])
    if not kept:
        check_contexts(sorted({int(c) for c in grid["context"]}))
        raise ConfigError(f"no token count was measured at {MIN_CONTEXTS} or more contexts "
                          "(the others ran out of memory); the grid cannot be split")
    pts = grid[grid["tokens"].isin(kept)].copy()
    pts["kv_tokens"] = pts["requests"] * pts["context"]
    # Centre within each T: a shared slope with a free intercept per T (fixed effects).
    by_t = pts.groupby("tokens")
    xc = pts["kv_tokens"] - by_t["kv_tokens"].transform("mean")
    yc = pts["step_ms"] - by_t["step_ms"].transform("mean")
    pts["_group"] = pts["requests"] if how == "per-request" else 0
    pts["_xy"], pts["_xx"] = xc * yc, xc * xc
    sums = pts.groupby("_group")[["_xy", "_xx"]].sum()
    slope = (sums["_xy"] / sums["_xx"]).clip(lower=0.0)
    pooled = max(float(pts["_xy"].sum() / pts["_xx"].sum()), 0.0)
    own = (pts.groupby("tokens")["_xy"].sum() / pts.groupby("tokens")["_xx"].sum())
    s = pts["_group"].map(slope)
    intercept = (pts["step_ms"] - s * pts["kv_tokens"]).groupby(pts["tokens"]).mean()
    dense = pd.DataFrame({"tokens": intercept.index.astype(np.int64),
                          "requests": by_t["requests"].first().to_numpy(np.int64),
                          "intercept_ms": intercept.to_numpy(np.float64)})
    dense["dense_ms"] = dense["intercept_ms"].clip(lower=DENSE_FLOOR_MS)
    dense["own_slope_ms_per_kv_token"] = own.to_numpy(np.float64)
    pts["fit_ms"] = pts["tokens"].map(dense.set_index("tokens")["dense_ms"]) + s * pts["kv_tokens"]
    pts["residual_ms"] = pts["step_ms"] - pts["fit_ms"]
    groups = pts.groupby("_group")["tokens"].apply(lambda t: sorted({int(x) for x in t}))
    slopes = pd.DataFrame({"requests": slope.index.astype(np.int64),
                           "ms_per_kv_token": slope.to_numpy(np.float64),
                           "tokens": groups.reindex(slope.index).to_list()})
    cols = ["tokens", "context", "requests", "kv_tokens", "step_ms", "fit_ms", "residual_ms"]
    return KvSplit(how=how, dense=dense, slopes=slopes,
                   points=pts[cols].sort_values(["context", "tokens"]).reset_index(drop=True),
                   pooled_slope=pooled, left_out=left_out)


@dataclass(frozen=True)
class PrefillFit:
    """A prompt-only step's time fitted as a + b·q + c·q² over prompt lengths q."""

    lengths: tuple[int, ...]  # q, prompt tokens of the one request
    step_ms: tuple[float, ...]  # the measured median at each q
    a_ms: float
    b_ms_per_token: float
    c_ms_per_token_sq: float  # as fitted; may be negative when the quadratic term is below noise

    @property
    def coef_ms_per_token_sq(self) -> float:
        """c clipped at 0: what the cost model uses for causal prefill attention."""
        return max(self.c_ms_per_token_sq, 0.0)

    def residuals_ms(self) -> list[float]:
        q = np.asarray(self.lengths, np.float64)
        fit = self.a_ms + self.b_ms_per_token * q + self.c_ms_per_token_sq * q**2
        return (np.asarray(self.step_ms) - fit).tolist()

    def summary(self) -> dict[str, Any]:
        return {
            "model": "prefill-only step of one request with q prompt tokens (no cached context): "
                     "step_ms = a + b*q + c*q^2, least squares; c (clipped at >= 0) is "
                     "prefill_attention_ms_per_token_sq",
            "a_ms": _r(self.a_ms), "b_ms_per_token": _r(self.b_ms_per_token),
            "c_ms_per_token_sq": _r(self.c_ms_per_token_sq),
            **({"clipped": "the fitted c is negative: the quadratic term is below the timing "
                           "noise at these lengths; the cost model uses 0"}
               if self.c_ms_per_token_sq < 0 else {}),
            "points": [{"tokens": int(q), "step_ms": _r(ms), "residual_ms": _r(r)}
                       for q, ms, r in zip(self.lengths, self.step_ms, self.residuals_ms(),
                                           strict=True)],
        }


def fit_prefill(lengths: Sequence[int], step_ms: Sequence[float]) -> PrefillFit:
    """Fit a + b·q + c·q² to prompt-only steps; needs at least three distinct lengths."""
    if len(set(lengths)) < 3 or len(lengths) != len(step_ms):
        raise ConfigError(f"a quadratic prefill fit needs 3 or more distinct prompt lengths "
                          f"with a time each (got lengths {list(lengths)})")
    q = np.asarray(lengths, np.float64)
    scale = float(q.max())  # fit in q / max(q) so the columns are of one magnitude
    c, b, a = np.polyfit(q / scale, np.asarray(step_ms, np.float64), 2)
    return PrefillFit(tuple(int(x) for x in lengths), tuple(float(x) for x in step_ms),
                      float(a), float(b / scale), float(c / scale**2))


def prefill_lengths(max_position: int, top: int) -> list[int]:
    """Return the prompt lengths to time: top/8, top/4, top/2 and top, capped by the model."""
    top = min(top, max_position)
    return sorted({max(1, top // 8), max(1, top // 4), max(1, top // 2), top})


def _r(x: float) -> float:
    return float(f"{x:.5g}") if math.isfinite(x) else x
