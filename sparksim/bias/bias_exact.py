"""Runs the exact bias lab: every policy's first-token law over many contexts, against p_t (INV-8).

The Monte Carlo bias lab (`sparksim.bias.biaslab`) samples the paper's two-token toy; this lab
computes, with no sampling at all, the distribution of the first token a speculative step
emits under a policy, for any drafter state, and compares it with the target's own
next-token distribution p_t (INV-8, paper App. A). Its parts: `first_token` (the exact law
of one step, and `StepCase`, the drafter state it needs), `path_decider` (a policy's ℓ on
every drafted path, in a batch, after a history), `first_token_mc` (the same step sampled,
with bootstrap CIs) and `model_cases` (drafter states from a real target and drafter).
This module runs them over many contexts and policies (`exact_table`, `summarise`,
`monte_carlo_check`), and keeps the names docs/bias.md gives as its Python API
(`StepCase.make`, `PathDecider`, `model_cases`) importable from here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sparksim.bias.first_token import GAMMA, FloatArray, StepCase
from sparksim.bias.first_token_mc import monte_carlo_first_token

# re-exported: docs/bias.md gives `bias_exact.model_cases` as the Python API
from sparksim.bias.model_cases import model_cases as model_cases
from sparksim.bias.path_decider import PathDecider, exact_first_token
from sparksim.cost.profile import Profile
from sparksim.errors import ConfigError

LOSSLESS_TV = 1e-9  # exact TV below this is "lossless to float precision"
DEFAULT_PROFILE = Path("profiles/cpu-tinylm-d128-live-measured")
DEFAULT_PROMPTS = Path("models/tinylm-d128-l6/data/test.jsonl")
# The policies `sparksim bias --exact` compares when none is named (the oracle reads the
# step's outcome, not a function of x_1 alone, so it has no exact first-token law here).
DEFAULT_SPECS = (
    "static:gamma=1", "static:gamma=2", "threshold", "greedy", "argmax",
    "two-step:delay=0", "two-step:delay=1", "two-step", "smartspec", "dynamic-sd",
)


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
