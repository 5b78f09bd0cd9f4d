"""Shared helpers for the policy tests: in-memory profiles, batches and a plain Alg. 1 reference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st
from numpy.typing import NDArray

from sparksim.cost.card import CostCard
from sparksim.cost.profile import DraftTable, LookupMode, Profile
from sparksim.policies.base import StepBatch

CONF_GRID = [round(0.05 * i, 2) for i in range(21)]  # 0.0 .. 1.0, so ties and zeros occur


def profile(
    tokens: Sequence[float],
    step_ms: Sequence[float],
    *,
    mode: LookupMode = "step",
    captured: Sequence[int] | None = None,
    draft: tuple[Sequence[float], Sequence[float]] | None = None,
) -> Profile:
    """Return an in-memory profile (no files): verify cost by tokens, optional draft table."""
    card: dict[str, Any] = {"source": "synthetic"}
    if captured is not None:
        card["graph_capture_sizes"] = list(captured)
    drafters = {"default": full_block("default", *draft)} if draft is not None else {}
    return Profile(
        name="test", card=card, tokens=np.asarray(tokens, np.float64),
        step_ms=np.asarray(step_ms, np.float64), drafters=drafters,
        default_drafter="default" if drafters else None, mode=mode, spec=CostCard.model_validate(card),
    )


def full_block(name: str, requests: Sequence[float], draft_ms: Sequence[float]) -> DraftTable:
    """Return a drafter's table that drafts its full block at every request count (two-column form)."""
    return DraftTable(name=name, requests=np.asarray(requests, np.float64), positions=np.empty(0),
                      ms=np.asarray(draft_ms, np.float64)[None, :])


def step_s(batch: StepBatch, tokens: int) -> float:
    """Return the step seconds at `tokens`, straight from the profile (not the policy's table)."""
    return float(batch.cost.fixed_s + batch.cost.profile.verify_s(tokens))


def reference_cut(batch: StepBatch, survival: NDArray[np.float64] | None = None,
                  early_stop: bool = True) -> NDArray[np.int64]:
    """Return ℓ from Algorithm 1 written as the paper does: one Python loop, one admission a step.

    early_stop=False is the argmax variant: walk the whole path, keep the best Θ (first max).
    """
    a = batch.survival if survival is None else survival
    num_requests, gamma = a.shape
    ranked = sorted((-a[r, j], j, r) for r in range(num_requests) for j in range(gamma))
    lengths = np.zeros(num_requests, dtype=np.int64)
    best_lengths = lengths.copy()
    b, tau = batch.fixed_tokens, float(num_requests)
    best = tau / step_s(batch, b)
    for neg_a, j, r in ranked:
        if b + 1 > batch.max_tokens:
            break
        lengths[r] = j + 1
        b += 1
        tau += -neg_a
        theta = tau / step_s(batch, b)
        if theta > best:
            best, best_lengths = theta, lengths.copy()
        elif early_stop:
            break
    return best_lengths


def theta_of(batch: StepBatch, lengths: NDArray[np.int64]) -> float:
    """Return Θ = τ · SPS(B) of a given ℓ on this batch's fresh survivals."""
    gamma = batch.gamma
    admitted = np.arange(gamma)[None, :] < lengths[:, None]
    tau = batch.num_requests + float(batch.survival[admitted].sum())
    return tau / step_s(batch, batch.fixed_tokens + int(lengths.sum()))


@st.composite
def confidences(draw: st.DrawFn, max_requests: int = 6, max_gamma: int = 5) -> NDArray[np.float64]:
    """Draw an (R, γ) matrix of conditional confidences from a coarse grid (ties, zeros, ones)."""
    r = draw(st.integers(1, max_requests))
    g = draw(st.integers(1, max_gamma))
    flat = draw(st.lists(st.sampled_from(CONF_GRID), min_size=r * g, max_size=r * g))
    return np.array(flat, dtype=np.float64).reshape(r, g)


@st.composite
def profiles(draw: st.DrawFn) -> Profile:
    """Draw a monotone profile: a few profiled sizes, either lookup mode, maybe graph sizes."""
    sizes = sorted(set(draw(st.lists(st.integers(1, 48), min_size=1, max_size=6))))
    # Costs rise between profiled sizes, or stay exactly flat in step mode: a flat segment
    # under linear interpolation is flat only up to rounding, which Alg. 1 would chase.
    steps = draw(st.lists(st.floats(0.01, 5.0), min_size=len(sizes), max_size=len(sizes)))
    ms = 5.0 + np.cumsum(steps)
    mode = draw(st.sampled_from(["step", "linear"]))
    captured = sizes if draw(st.booleans()) else None
    return profile(sizes, ms.tolist(), mode=mode, captured=captured)


@st.composite
def batches(draw: st.DrawFn, with_accepted: bool = True) -> StepBatch:
    """Draw a batch: confidences, a profile, prefill tokens, a token cap, a draft cost."""
    conf = draw(confidences())
    prof = draw(profiles())
    r, g = conf.shape
    extra = draw(st.integers(0, 4))
    cap = draw(st.one_of(st.none(), st.integers(0, r * (g + 1) + extra + 2)))
    accepted = None
    if with_accepted:
        accepted = draw(st.lists(st.integers(0, g), min_size=r, max_size=r))
    return StepBatch.from_conf(
        conf, prof, extra_fixed_tokens=extra, max_tokens=cap,
        draft_s=draw(st.sampled_from([0.0, 0.002])), accepted=accepted,
    )
