"""Holds the exact law of a speculative step's first emitted token, and the drafter state it needs.

The step, truncated to the drafter's first two draft positions (γ = 2 for the policy):
- x_1 ~ q_1 (the drafter's position-1 distribution); the confidences are c_1 and c_2(x_1),
  the latter depending on the sampled x_1 (DSpark's confidence head reads the Markov
  embedding W1[x_1]); x_2 ~ q_2(·|x_1) matters to no first-token question.
- The policy decides ℓ(x_1) ∈ {0, 1, 2} from the step's confidences (`Policy.decide` on the
  real batch: this request's row [c_1, c_2(x_1)] plus any other requests' rows).
- Rejection sampling: ℓ = 0 emits a token ~ p_t (the step's own token); ℓ ≥ 1 keeps x_1 with
  probability min(1, p_t(x_1)/q_1(x_1)), else emits a token ~ norm(max(0, p_t − q_1)).
So P(Y = y) = Σ_{x_1} q_1(x_1) · [ℓ(x_1) = 0] · p_t(y)
            + Σ_{x_1} [ℓ(x_1) ≥ 1] · (min(p_t, q_1)(x_1) · [y = x_1] + (q_1 − min(p_t, q_1))(x_1) · r(y)),
r = norm(max(0, p_t − q_1)). When [ℓ(x_1) ≥ 1] does not depend on x_1 this is p_t exactly;
a policy that reads c_2(x_1) before admitting x_1 (argmax, two-step with delay 0) can make it
depend on x_1, and then Y is biased. The total-variation distance ½‖P − p_t‖₁ measures it.

`StepCase` is one request's drafter state; everything here is NumPy over plain arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sparksim.errors import ConfigError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

GAMMA = 2  # draft positions the policies see: the block truncated to its first two


def normalise(p: ArrayLike) -> FloatArray:
    """Return `p` as float64 summing to 1 (negative entries are an error)."""
    a = np.asarray(p, dtype=np.float64)
    if a.ndim != 1 or a.size == 0 or (a < 0).any() or not np.isfinite(a).all() or a.sum() <= 0:
        raise ConfigError(f"not a probability vector: {a!r}")
    return a / a.sum()


def residual(p_t: FloatArray, q1: FloatArray) -> FloatArray:
    """Return norm(max(0, p_t − q_1)), the law of the token emitted when x_1 is rejected.

    When p_t = q_1 nothing is ever rejected; p_t is returned (as the recorder's `resample`).
    """
    resid = np.maximum(p_t - q1, 0.0)
    total = resid.sum()
    return resid / total if total > 0 else p_t.copy()


def first_token_distribution(p_t: ArrayLike, q1: ArrayLike, lengths: ArrayLike) -> FloatArray:
    """Return the exact law of the step's first emitted token, shape (V,).

    `lengths[x]` is ℓ chosen when the drafter's first token is x (only ℓ ≥ 1 matters: whether
    x_1 is verified). p_t and q_1 are probability vectors over the same vocabulary.
    """
    p, q = normalise(p_t), normalise(q1)
    ell = np.asarray(lengths)
    if ell.shape != p.shape or q.shape != p.shape:
        raise ConfigError(f"shapes differ: p_t {p.shape}, q1 {q.shape}, lengths {ell.shape}")
    verified = ell >= 1
    kept = np.minimum(p, q)  # q_1(x) · min(1, p_t(x)/q_1(x)): x drafted and accepted
    rejected = q - kept  # x drafted and rejected
    out = p * float(q[~verified].sum())  # not verified: the step's own token ~ p_t
    out += np.where(verified, kept, 0.0)
    out += residual(p, q) * float(rejected[verified].sum())
    return out


def tv_distance(a: ArrayLike, b: ArrayLike) -> float:
    """Return ½‖a − b‖₁."""
    return float(0.5 * np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).sum())


@dataclass(frozen=True)
class StepCase:
    """One request's drafter state at a step, truncated to two draft positions.

    p_t (V,) the target's next-token law; q1 (V,) the drafter's position-1 law; c1 the
    calibrated confidence of position 1; c2 (V,) the calibrated confidence of position 2
    after drafting x_1 = index; q2 (V, V) optional, row x_1 the position-2 law after x_1 (only
    the Monte Carlo sampler draws from it); context the request's KV tokens (prices the step).
    """

    p_t: FloatArray
    q1: FloatArray
    c1: float
    c2: FloatArray
    q2: FloatArray | None = None
    context: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        v = self.p_t.shape
        if self.q1.shape != v or self.c2.shape != v:
            raise ConfigError(f"case {self.name!r}: p_t {v}, q1 {self.q1.shape}, c2 {self.c2.shape} differ")
        if self.q2 is not None and self.q2.shape != v + v:
            raise ConfigError(f"case {self.name!r}: q2 {self.q2.shape} is not {v + v}")

    @classmethod
    def make(cls, p_t: ArrayLike, q1: ArrayLike, c1: float, c2: ArrayLike, q2: ArrayLike | None = None,
             context: float = 0.0, name: str = "") -> StepCase:
        """Build a case from array-likes (probabilities normalised, float64)."""
        q2a = None if q2 is None else np.asarray(q2, np.float64) / np.asarray(q2, np.float64).sum(1, keepdims=True)
        return cls(normalise(p_t), normalise(q1), float(c1), np.asarray(c2, np.float64), q2a, float(context), name)

    @property
    def vocab(self) -> int:
        return int(self.p_t.shape[0])

    def rows(self) -> FloatArray:
        """Return the (V, 2) confidence row of every path x_1: [c_1, c_2(x_1)]."""
        return np.column_stack([np.full(self.vocab, self.c1), self.c2])
