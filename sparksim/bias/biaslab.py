"""The bias lab: does a verification policy change the output distribution? (INV-8)

It replays the paper's Appendix A counterexample with real rejection sampling and any
registered policy. One request, γ = 2, vocabulary {A, B}, target p_t = (0.7, 0.3), drafter
p_d = (0.5, 0.5) (so a_1 = Σ min(p_t, p_d) = 0.8), SPS(1) = 1.0, SPS(2) = 0.5, SPS(3) = 0.45.
The drafter's second confidence depends on the sampled first draft: c_2 = 0.9 after A and
0 after B. A lossless policy's first output token is A with probability 0.7; the argmax
policy, which admits x_1 only after seeing c_2 (i.e. after seeing x_1), gives 0.85.

Policies that size their budget from earlier steps (two-step) are first shown `warmup`
earlier steps of the same request, whose confidences are drawn independently of this
step's draft, exactly as an engine would have shown them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sparksim.cost.profile import Profile
from sparksim.policies import make_policy, parse_policy_spec
from sparksim.policies.base import StepBatch

P_TARGET = np.array([0.7, 0.3])
P_DRAFT = np.array([0.5, 0.5])
C2_AFTER = np.array([0.9, 0.0])  # c_2 after drafting A, after drafting B


def appendix_a_profile() -> Profile:
    """The worked example's cost table: SPS(1) = 1.0, SPS(2) = 0.5, SPS(3) = 0.45 steps/s."""
    tokens = np.array([1.0, 2.0, 3.0])
    return Profile(
        name="appendix-a",
        card={"source": "published", "hardware": "paper App. A", "model": "-", "dtype": "-",
              "date": "2026-06-27", "command": "sparksim.bias.biaslab.appendix_a_profile()"},
        tokens=tokens,
        step_ms=1e3 / np.array([1.0, 0.5, 0.45]),
    )


# |z| past which the lab calls a policy biased: at 4 standard errors a lossless policy is
# called biased about once in 16,000 runs, and App. A's argmax bias (0.85 against 0.7) is
# tens of standard errors away at the default 20,000 trials
BIASED_Z = 4.0


@dataclass(frozen=True)
class BiasResult:
    policy: str
    label: str
    trials: int
    p_first_a: float  # observed P(first output token = A)
    stderr: float
    target: float = 0.7

    @property
    def z(self) -> float:
        """Standard errors between the observed and the target probability."""
        return (self.p_first_a - self.target) / self.stderr if self.stderr > 0 else 0.0

    @property
    def biased(self) -> bool:
        """The verdict: more than BIASED_Z standard errors from the target."""
        return abs(self.z) > BIASED_Z


def _accepted_by(u: float, x1: int) -> bool:
    """Whether draft x_1 passes rejection sampling, for the uniform draw `u` that decides it."""
    return u < min(1.0, P_TARGET[x1] / P_DRAFT[x1])


def _outcome(x1: int, u: float) -> int:
    """Realised accepted drafts of the step (what the oracle reads): 2 if x_1 passes (x_2 then
    always does in this example), else 0. It reads the same draw `u` that decides x_1, so an
    oracle that looks at it sees the step's real outcome."""
    return 2 if _accepted_by(u, x1) else 0


def first_token(lengths_1: int, x1: int, u: float, rng: np.random.Generator) -> int:
    """The first output token under exact rejection sampling, given whether x_1 was verified.

    `u` is the uniform draw that accepts or rejects x_1 (shared with `_outcome`); on
    rejection the token is resampled from the residual norm(max(0, p_t − p_d)).
    """
    if lengths_1 == 0:
        return int(rng.random() >= P_TARGET[0])  # the step's own token, sampled from p_t
    if _accepted_by(u, x1):
        return x1
    residual = np.maximum(P_TARGET - P_DRAFT, 0.0)
    return int(rng.random() >= residual[0] / residual.sum())


def policy_stream(seed: int, spec: str) -> np.random.Generator:
    """Return the random stream of one policy: its own, from the seed and the policy's spec."""
    return np.random.default_rng([seed, zlib.crc32(spec.encode())])


def run_bias_lab(
    policy: str, params: dict[str, Any] | None = None, *, trials: int = 20_000, warmup: int = 4,
    seed: int = 0, progress: Callable[[int], None] | None = None,
) -> BiasResult:
    """Estimate P(first token = A) under `policy` by Monte Carlo.

    `policy` is a name or a `name:param=value,...` spec (`params` adds to it). The policy
    draws from its own stream (`policy_stream`); `progress(done)` is called every 1,000 trials.
    """
    name, spec_params = parse_policy_spec(policy)
    params = {**spec_params, **(params or {})}
    params.pop("drafter", None)  # what the drafter costs does not matter here: SPS is the paper's
    rng = policy_stream(seed, policy)
    profile = appendix_a_profile()
    label = make_policy(name, 2, params).label()  # a bad parameter fails before any trial
    count_a = 0
    for trial in range(trials):
        pol = make_policy(name, 2, params)
        for step in range(warmup):  # history: earlier steps, independent of this step's draft
            x_old = int(rng.random() >= P_DRAFT[0])
            conf = [[0.8, C2_AFTER[x_old]]]
            pol.decide(StepBatch.from_conf(conf, profile, step_index=step,
                                           accepted=[_outcome(x_old, rng.random())]))
        x1 = int(rng.random() >= P_DRAFT[0])  # the draft of this step
        u = rng.random()  # decides x_1's rejection sampling, whoever reads the outcome
        batch = StepBatch.from_conf([[0.8, C2_AFTER[x1]]], profile, step_index=warmup,
                                    accepted=[_outcome(x1, u)])
        ell = int(pol.decide(batch)[0])
        count_a += first_token(ell, x1, u, rng) == 0
        if progress is not None and (trial + 1) % 1000 == 0:
            progress(trial + 1)
    p = count_a / trials
    return BiasResult(policy, label, trials, p, float(np.sqrt(p * (1 - p) / trials)))


def bias_table(policies: list[str], trials: int = 20_000, seed: int = 0,
               progress: Callable[[str, int], None] | None = None) -> pd.DataFrame:
    """Run the lab for several policy specs; one row each (`progress(spec, trials done)`)."""
    rows = []
    for spec in policies:
        tick = None if progress is None else (lambda done, spec=spec: progress(spec, done))
        r = run_bias_lab(spec, trials=trials, seed=seed, progress=tick)
        rows.append({"policy": spec, "label": r.label, "p_first_A": r.p_first_a, "stderr": r.stderr,
                     "target": r.target, "z": r.z, "biased": r.biased})
    return pd.DataFrame(rows)
