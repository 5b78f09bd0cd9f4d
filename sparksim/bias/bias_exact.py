"""Exact bias of a verification policy: the first emitted token's distribution, enumerated.

The Monte Carlo bias lab (`sparksim.bias.biaslab`) samples the paper's two-token toy; this module
computes, with no sampling at all, the distribution of the first token a speculative step
emits under a policy, for any drafter state, and compares it with the target's own next-token
distribution p_t (INV-8, paper App. A).

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

Everything up to `model_cases` is NumPy (and SciPy for the bootstrap): the toy tests call it
with plain arrays. `model_cases` builds the cases from a real target and DSpark drafter
(torch, imported inside it).

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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike, NDArray

from sparksim.cost.pricing import StepCost
from sparksim.cost.profile import Profile
from sparksim.errors import ConfigError
from sparksim.policies import make_policy, parse_policy_spec
from sparksim.policies.base import Lengths, Policy, StepBatch, drafted_positions
from sparksim.policies.static import Static

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

GAMMA = 2  # draft positions the policies see: the block truncated to its first two
LOSSLESS_TV = 1e-9  # exact TV below this is "lossless to float precision"
DEFAULT_PROFILE = Path("profiles/cpu-tinylm-d128-live-measured")
DEFAULT_PROMPTS = Path("models/tinylm-d128-l6/data/test.jsonl")
# The policies `sparksim bias --exact` compares when none is named (the oracle reads the
# step's outcome, not a function of x_1 alone, so it has no exact first-token law here).
DEFAULT_SPECS = (
    "static:gamma=1", "static:gamma=2", "threshold", "greedy", "argmax",
    "two-step:delay=0", "two-step:delay=1", "two-step", "smartspec", "dynamic-sd",
)


# --------------------------------------------------------------------------- the exact maths


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


# --------------------------------------------------------------------------- policy decisions


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
                                        overhead_s=self.profile.loop_s(True, "decode", r))
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


# --------------------------------------------------------------------------- Monte Carlo


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


# --------------------------------------------------------------------------- many contexts, many policies


def realised_rows(cases: Sequence[StepCase], seed: int) -> FloatArray:
    """Return one realised confidence row per case (N, 2): [c_1, c_2(x̃_1)] with x̃_1 ~ q_1 (seeded).

    These stand for the other requests of a batch and for earlier steps: drafts that were
    sampled, fixed once, independent of any path being enumerated.
    """
    rng = np.random.default_rng([seed, 0x5EED])
    out = np.empty((len(cases), GAMMA))
    for i, c in enumerate(cases):
        x = int(rng.choice(c.vocab, p=c.q1))
        out[i] = (c.c1, c.c2[x])
    return out


def neighbours(cases: Sequence[StepCase], rows: FloatArray, i: int, batch: int, warmup: int
               ) -> tuple[FloatArray, FloatArray, list[FloatArray]]:
    """Return (others (R−1, 2), contexts (R,), history) for case `i` in a batch of R requests.

    The others are the next R−1 cases' realised rows (cyclically); history step h shows the
    whole batch the realised rows of the R cases R·(h+1) further on.
    """
    n = len(cases)
    idx = [(i + k) % n for k in range(1, batch)]
    contexts = np.array([cases[i].context] + [cases[j].context for j in idx], np.float64)
    history = [rows[[(i + batch * (h + 1) + k) % n for k in range(batch)]] for h in range(warmup)]
    return rows[idx], contexts, history


ProgressFn = Callable[[str, int], None]


def exact_table(cases: Sequence[StepCase], specs: Sequence[str], profile: Profile, *, batch: int = 1,
                warmup: int = 4, seed: int = 0, progress: ProgressFn | None = None) -> pd.DataFrame:
    """Return one row per (policy, case): exact TV, P(verify x_1), whether ℓ depends on x_1, the law.

    Columns: policy (the spec), label, claims_lossless, context (index), name, tv, p_verify,
    depends_on_x1, dist (the (V,) first-token law).

    `batch` R puts each case among R−1 other requests (other cases' realised rows, fixed per
    case); `progress(spec, cases done)` is called after each case.
    """
    if batch < 1:
        raise ConfigError(f"--batch {batch} must be >= 1")
    if not cases:
        raise ConfigError("no contexts to evaluate")
    rows = realised_rows(cases, seed)
    records: list[dict[str, Any]] = []
    for spec in specs:
        for i, case in enumerate(cases):
            others, contexts, history = neighbours(cases, rows, i, batch, warmup)
            decider = PathDecider(spec, profile, others, contexts, history)
            res = exact_first_token(case, decider)
            records.append({"policy": spec, "label": decider.label, "claims_lossless": decider.policy.lossless,
                            "context": i, "name": case.name, "tv": res.tv, "p_verify": res.p_verify,
                            "depends_on_x1": res.depends_on_x1, "dist": res.dist})
            if progress is not None:
                progress(spec, i + 1)
    return pd.DataFrame(records)


def summarise(table: pd.DataFrame, worst: int = 3) -> pd.DataFrame:
    """Return one row per policy: mean/max TV, the `worst` contexts, lossless to float precision."""
    out = []
    for spec, g in table.groupby("policy", sort=False):
        top = g.nlargest(worst, "tv")
        out.append({
            "policy": spec, "label": g["label"].iloc[0], "claims_lossless": bool(g["claims_lossless"].iloc[0]),
            "contexts": len(g), "mean_tv": float(g["tv"].mean()), "max_tv": float(g["tv"].max()),
            "worst": [(int(c), str(n), float(t)) for c, n, t in top[["context", "name", "tv"]].to_numpy()],
            "depends_on_x1": int(g["depends_on_x1"].sum()), "mean_p_verify": float(g["p_verify"].mean()),
            "lossless": bool(g["tv"].max() < LOSSLESS_TV),
        })
    return pd.DataFrame(out)


def monte_carlo_check(cases: Sequence[StepCase], table: pd.DataFrame, profile: Profile, n: int, *,
                      batch: int = 1, warmup: int = 4, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """For each policy's worst context, sample the step `n` times and compare with the exact law.

    Returns one row per policy: the context, the exact TV, and two Monte Carlo estimates with
    bootstrap CIs (`Interval`): `mc_tv_witness`, P̂(S) − p_t(S) along the exact witness set
    S = {y: P(y) > p_t(y)} (unbiased for the exact TV; vacuous, 0, when S is empty), and
    `mc_tv_split`, the split-sample estimate that uses the samples alone (`bootstrap_tv`
    without a witness: what sampling can say by itself; its CI width is the smallest bias it
    resolves). `consistent`: the witness CI holds the exact TV.
    """
    rows = realised_rows(cases, seed)
    out = []
    for spec, g in table.groupby("policy", sort=False):
        i = int(g["context"].to_numpy()[int(np.argmax(g["tv"].to_numpy()))])
        others, contexts, history = neighbours(cases, rows, i, batch, warmup)
        decider = PathDecider(str(spec), profile, others, contexts, history)
        exact = exact_first_token(cases[i], decider)
        mc = monte_carlo_first_token(cases[i], decider, n, seed=seed + 1)
        witness = mc.tv(cases[i].p_t, witness=exact.dist > cases[i].p_t, level=level, seed=seed + 2)
        out.append({"policy": spec, "context": i, "exact_tv": exact.tv, "mc_tv_witness": witness,
                    "mc_tv_split": mc.tv(cases[i].p_t, level=level, seed=seed + 3),
                    "consistent": witness.contains(exact.tv)})
    return pd.DataFrame(out)


# --------------------------------------------------------------------------- the paper's case


def appendix_a_case() -> StepCase:
    """Paper App. A: V = {A, B}, p_t = (0.7, 0.3), q_1 = (0.5, 0.5), c_1 = 0.8, c_2 = 0.9 after A, 0 after B.

    With `biaslab.appendix_a_profile()` (SPS 1.0, 0.5, 0.45) and R = 1, argmax gives P(A) = 0.85.
    """
    from sparksim.bias.biaslab import C2_AFTER, P_DRAFT, P_TARGET

    return StepCase.make(P_TARGET, P_DRAFT, 0.8, C2_AFTER, name="appendix-a")


# --------------------------------------------------------------------------- real models


Log = Callable[[str], None]


def model_cases(target_dir: Path, drafter_dir: Path, prompts: Path, n: int, *, temperature: float = 1.0,
                seed: int = 0, max_new_tokens: int = 128, cuts_per_response: int = 4, batch_size: int = 16,
                log: Log = print) -> list[StepCase]:
    """Return `n` cases from a real target and drafter, at prefixes of the target's own responses.

    The target answers ⌈n / cuts_per_response⌉ prompts drawn from `prompts` (seeded; prompts
    too long for the target's positions with `max_new_tokens` more are skipped), sampling at
    `temperature` with a fixed seed; each context is a prompt plus a seeded prefix of its
    response, `cuts_per_response` distinct cuts per response (fewer if it is shorter; more
    when there are too few prompts). Per context: p_t, the target's
    next-token law at `temperature`; the drafter's block at that anchor (its full γ, as in
    drafting) truncated to two positions: q_1, c_1, and for every x_1 the Markov-biased
    c_2(x_1) (q_2 is not kept: no first-token question reads it); confidences calibrated
    with the drafter's `calibration.json` STS temperatures when present.
    """
    from sparksim.drafter.config import load_json
    from sparksim.drafter.data import read_prompts
    from sparksim.drafter.target import load_target
    from sparksim.drafter.tokenizer import get_tokenizer
    from sparksim.drafter.train import load_drafter, regenerate

    if n < 1:
        raise ConfigError(f"--contexts {n} must be >= 1")
    if temperature < 0:
        raise ConfigError(f"--temperature {temperature} must be >= 0")
    target = load_target(target_dir)
    drafter = load_drafter(drafter_dir, target)
    g = drafter.cfg.gamma
    if g < GAMMA:
        raise ConfigError(f"{drafter_dir}: drafter gamma={g}; the exact lab needs at least {GAMMA} positions")
    cal_path = drafter_dir / "calibration.json"
    temps = np.ones(g)
    if cal_path.is_file():
        temps = np.asarray(load_json(cal_path)["temperatures"], np.float64)
        if temps.shape != (g,):
            raise ConfigError(f"{cal_path}: {temps.size} temperatures for γ={g}")
    tok = get_tokenizer(target.tokenizer_name)
    limit = _max_positions(target)
    items = read_prompts(prompts)
    fits = [it for it in items if limit is None or len(tok.encode(it.prompt)) + max_new_tokens <= limit]
    if not fits:
        raise ConfigError(f"{prompts}: no prompt fits the target's {limit} positions with "
                          f"--max-new-tokens {max_new_tokens}")
    if len(fits) < len(items):
        log(f"{len(items) - len(fits)} of {len(items)} prompts skipped: longer than the target's {limit} "
            f"positions with {max_new_tokens} new tokens")
    rng = np.random.default_rng(seed)
    n_prompts = min(-(-n // max(cuts_per_response, 1)), len(fits))
    chosen = [fits[int(k)] for k in rng.permutation(len(fits))[:n_prompts]]
    seqs = regenerate(target, chosen, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                      log=log)
    per_seq = np.bincount(np.arange(n) % len(seqs), minlength=len(seqs))
    picks: list[tuple[int, int]] = []  # (sequence, response tokens kept in the context)
    for j, (s, k) in enumerate(zip(seqs, per_seq, strict=True)):
        cuts = rng.choice(len(s.response), size=min(int(k), len(s.response)), replace=False)
        picks.extend((j, int(t)) for t in np.sort(cuts))
    contexts = [seqs[j].prompt + seqs[j].response[:t] for j, t in picks]
    names = [f"{seqs[j].domain}:{seqs[j].key}@{t}" for j, t in picks]
    cases = drafter_cases(target, drafter, contexts, temperature=temperature, temps=temps, names=names,
                          batch_size=batch_size, pad_id=tok.pad_id)
    log(f"built {len(cases)} contexts from {len(seqs)} responses")
    return cases


def _max_positions(target: Any) -> int | None:
    """Return the longest sequence the target's positions allow, if it says."""
    model = getattr(target, "model", None)
    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    for key in ("max_seq_len", "max_position_embeddings"):
        value = getattr(cfg, key, None)
        if isinstance(value, int):
            return value
    return None


def drafter_cases(target: Any, drafter: Any, contexts: Sequence[Sequence[int]], *, temperature: float = 1.0,
                  temps: ArrayLike | None = None, names: Sequence[str] | None = None, batch_size: int = 16,
                  pad_id: int = 258) -> list[StepCase]:
    """Return one case per token context: the drafter's block anchored at the context's last token.

    `target` a `TargetAdapter`, `drafter` a `Drafter` (torch); `temps` the STS temperatures
    (γ,) (default 1: raw confidences). The drafter runs its full block, as when drafting; the
    case keeps positions 1 and 2, through the same heads `drafter.model.draft` samples from:
    q_1 and c_1 after the anchor, and c_2(x_1) = σ(logit_2(x_1) / T_2) after every x_1 (the
    Markov embedding W1[x_1] enters position 2's confidence). Distributions in float64.
    """
    import torch

    from sparksim.drafter.calibrate import apply_sts
    from sparksim.drafter.model import BlockOutput
    from sparksim.drafter.train import pad_batch

    g, V = int(drafter.cfg.gamma), int(drafter.cfg.vocab_size)
    if g < GAMMA:
        raise ConfigError(f"drafter gamma={g}; the exact lab needs at least {GAMMA} positions")
    t_sts = np.ones(g) if temps is None else np.asarray(temps, np.float64)
    cases: list[StepCase] = []
    for lo in range(0, len(contexts), batch_size):
        ctx = [list(c) for c in contexts[lo: lo + batch_size]]
        if min(len(c) for c in ctx) < 1:
            raise ConfigError("an empty context has no anchor token")
        ids = pad_batch(ctx, pad_id)
        B, S = ids.shape
        last = torch.tensor([len(c) - 1 for c in ctx])
        with torch.no_grad():
            logits, hidden = target.forward_masked(ids, torch.arange(S).expand(B, S), None)
            out = drafter.backbone(drafter.context(drafter.target_features(hidden)), ids, last[:, None])
            # every x_1 as its own block row: prev = [anchor, x_1, ...] gives position 2's Markov
            # bias and confidence after x_1 (position 1's is the same on every row)
            wide = BlockOutput(out.logits.expand(B, V, g, V), out.hidden.expand(B, V, g, out.hidden.shape[-1]))
            prev = torch.zeros(B, V, g, dtype=torch.long)
            prev[:, :, 0] = ids.gather(1, last[:, None])
            prev[:, :, 1] = torch.arange(V)
            d_logits, conf = drafter.heads(wide, prev)  # (B, V, γ, V), (B, V, γ) or None
            d_logits = d_logits[:, :, :GAMMA].double()
            t_logits = logits[torch.arange(B), last].double()  # (B, V)
            if temperature == 0:
                p_t = torch.nn.functional.one_hot(t_logits.argmax(-1), V).double()
                q = torch.nn.functional.one_hot(d_logits.argmax(-1), V).double()
            else:
                p_t = torch.softmax(t_logits / temperature, dim=-1)
                q = torch.softmax(d_logits / temperature, dim=-1)  # (B, V, 2, V)
            if conf is None:  # DFlash: the top draft probability stands for the confidence (as `draft`)
                top = q.max(-1).values.clamp(1e-6, 1 - 1e-6)
                conf_l = (torch.log(top) - torch.log1p(-top)).numpy()
            else:
                conf_l = conf[:, :, :GAMMA].double().numpy()
        c = apply_sts(conf_l.reshape(-1, GAMMA), t_sts[:GAMMA]).reshape(B, V, GAMMA)
        for b in range(B):
            k = lo + b
            cases.append(StepCase(normalise(p_t[b].numpy()), normalise(q[b, 0, 0].numpy()), float(c[b, 0, 0]),
                                  c[b, :, 1].copy(), None, float(len(ctx[b]) - 1),
                                  names[k] if names is not None else f"context {k}"))
    return cases
