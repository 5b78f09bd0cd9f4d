"""Decides ℓ on every drafted path as a policy would in a real batch, and enumerates the exact law.

A `PathDecider` asks the policy (`Policy.decide` on the step's whole batch) for ℓ
of one request under every confidence row [c_1, c_2(x_1)] its drafter could show;
`exact_first_token` turns those decisions into the step's exact first-token law
(`sparksim.bias.first_token`).

Policies with history (two-step's stale survivals, SmartSpec's EMA) are first shown `warmup`
earlier steps whose confidences are other contexts' realised rows, independent of this
step's draft, as an engine would have shown them; every path then starts from a copy of that
warmed state. A fixed history is no loss of generality for a losslessness check: a policy is
lossless iff the output is p_t conditionally on every history independent of the draft.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from sparksim.bias.first_token import (
    GAMMA,
    FloatArray,
    IntArray,
    StepCase,
    first_token_distribution,
    tv_distance,
)
from sparksim.cost.pricing import StepCost
from sparksim.cost.profile import Profile
from sparksim.errors import ConfigError
from sparksim.policies import make_policy, parse_policy_spec
from sparksim.policies.base import Lengths, Policy, StepBatch, drafted_positions
from sparksim.policies.static import Static


def _builtin_policies() -> set[type[Policy]]:
    """The policy classes sparksim registers itself (their state layout is known)."""
    from sparksim.policies import REGISTRY

    return {cls for cls in REGISTRY.values() if cls.__module__.startswith("sparksim.policies.")}


def _row_independent(policy: Policy) -> bool:
    """Whether ℓ_r reads row r only (so unrelated paths may share one batch): static, threshold.

    Threshold trims to the engine's token limit, which these batches leave unbounded.
    """
    from sparksim.policies.threshold import Threshold

    return type(policy) in (Static, Threshold)


@dataclass
class PathDecider:
    """ℓ of request 0 for any confidence row, in a fixed batch with a fixed history.

    `others` (R−1, 2) are the other requests' confidence rows this step, `contexts` (R,) the KV
    tokens of request 0 and the others, `history` the whole batch's (R, 2) rows at each earlier
    step the policy is shown first. Each call to `lengths` starts from a copy of the warmed
    policy, so one path's decision never sees another's.
    """

    spec: str
    profile: Profile
    others: FloatArray = field(default_factory=lambda: np.empty((0, GAMMA)))
    contexts: FloatArray = field(default_factory=lambda: np.zeros(1))
    history: Sequence[FloatArray] = ()
    policy: Policy = field(init=False)

    def __post_init__(self) -> None:
        name, params = parse_policy_spec(self.spec)
        self.drafter: str | None = params.pop("drafter", None)
        self.policy = make_policy(name, GAMMA, params)
        if self.policy.reads_outcome:
            raise ConfigError(f"policy {self.spec!r} reads the step's realised outcome: its decision is "
                              "not a function of the draft, so it has no exact first-token law here")
        r = 1 + self.others.shape[0]
        if self.contexts.shape != (r,):
            raise ConfigError(f"{r} requests but {self.contexts.shape} contexts")
        # the price the live engine shows its policy for this step (`live.engine.choose_lengths`):
        # the positions its drafter drafts, and the engine loop's time before the step
        positions = drafted_positions(self.policy, self.profile, self.drafter, GAMMA)
        self.cost = StepCost.for_decode(self.profile, r, float(self.contexts.sum()), positions, self.drafter,
                                        kv_longest=float(self.contexts.max()),
                                        loop_s=self.profile.loop_s(True, "decode", r))
        self._memo = {id(self.profile): self.profile}  # copies share the (read-only) profile
        for step, conf in enumerate(self.history):
            self.policy.decide(self._batch(np.asarray(conf, np.float64), step))

    @property
    def label(self) -> str:
        return self.policy.label()

    def _batch(self, conf: FloatArray, step: int) -> StepBatch:
        return StepBatch.from_conf(conf, self.profile, step_index=step, cost=self.cost)

    def _fresh(self) -> Policy:
        """Return a copy of the warmed policy that one decision may change freely.

        A built-in policy keeps its state in plain attributes, containers and arrays, which are
        copied one level deep (its `CostTable`, a cache of the shared profile's costs, is
        shared); any other policy is deep-copied (the profile shared).
        """
        if type(self.policy) not in _builtin_policies():
            return copy.deepcopy(self.policy, dict(self._memo))
        new = copy.copy(self.policy)
        state = new.__dict__
        for key, value in state.items():
            # a helper object that holds history (the engines' rules' stale confidences) says
            # so with `copied_per_path`; sharing it would let one path's decision feed another's
            if isinstance(value, deque | list | dict | set | np.ndarray) or getattr(value, "copied_per_path", False):
                state[key] = copy.copy(value)
        return new

    def lengths(self, rows: ArrayLike) -> Lengths:
        """Return ℓ of request 0 for each confidence row (P, 2) of `rows`, one decision per row."""
        rows = np.atleast_2d(np.asarray(rows, np.float64))
        step = len(self.history)
        if _row_independent(self.policy):  # one batch of all paths: rows do not interact
            return np.asarray(self._fresh().decide(self._batch(rows, step)), np.int64)
        out = np.empty(rows.shape[0], np.int64)
        conf = np.vstack([rows[:1], self.others])
        for i, row in enumerate(rows):
            conf[0] = row
            out[i] = int(self._fresh().decide(self._batch(conf, step))[0])
        return out


@dataclass(frozen=True)
class ExactResult:
    """The exact first-token law of one case under one policy."""

    dist: FloatArray  # (V,) law of the first emitted token
    tv: float  # ½‖dist − p_t‖₁
    lengths: IntArray  # (V,) ℓ(x_1)
    p_verify: float  # P(x_1 is verified) = Σ q_1(x) [ℓ(x) ≥ 1]
    depends_on_x1: bool  # whether [ℓ(x_1) ≥ 1] varies over the drafter's support


def exact_first_token(case: StepCase, decide: PathDecider | Callable[[FloatArray], Lengths]) -> ExactResult:
    """Enumerate every x_1, decide its ℓ, and return the exact first-token law (no sampling)."""
    fn = decide.lengths if isinstance(decide, PathDecider) else decide
    ell = np.asarray(fn(case.rows()), np.int64)
    dist = first_token_distribution(case.p_t, case.q1, ell)
    verified = (ell >= 1)[case.q1 > 0]
    return ExactResult(dist, tv_distance(dist, case.p_t), ell,
                       float(case.q1[ell >= 1].sum()), bool(verified.any() and not verified.all()))
