"""Decision time per step of every registered policy, beside a bare np.sort of the same survivals.

For R = 64, 256, 512 requests and γ = 5, 7, 15 it builds one step (calibrated-looking
confidences, realised acceptances for the oracle) on a synthetic CUDA-graph staircase
profile, warms each policy up for a few steps (two-step needs its history), then times
`decide` and `np.sort` of the R·γ survivals in alternating rounds of the same run and
reports the best round of each (the least disturbed by other load) and their ratio.
docs/design.md §5 target: greedy and two-step within 3x of the bare sort at R = 256, γ = 7.

Each grid point also prints a floor for the policies that search the whole path (argmax,
two-step, oracle): the sort plus one cumulative sum of the sorted values, which Θ at
every k needs, timed the same way.

    .venv/bin/python benchmarks/bench_policies.py            # full grid
    .venv/bin/python benchmarks/bench_policies.py --quick    # R = 256, γ = 7 only
    .venv/bin/python benchmarks/bench_policies.py --quick --kernels numpy   # without numba

The path policies walk Θ and count the fill in `sparksim.step.kernels`: compiled by
numba when it is installed (the `fast` extra), numpy otherwise. The header says which.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable

import numpy as np

from sparksim.cost.card import CostCard
from sparksim.cost.profile import DraftTable, Profile
from sparksim.policies import REGISTRY, make_policy
from sparksim.policies.base import StepBatch
from sparksim.step import kernels

GRAPH_SIZES = [1, 2, 4, *range(8, 513, 8)]  # vLLM's default CUDA-graph capture sizes


def staircase_profile() -> Profile:
    """Return an analytic H100-like profile: graph staircase to 512 tokens, then a cliff."""
    tokens = np.array([*GRAPH_SIZES, 768, 1024, 2048, 4096, 8192], dtype=np.float64)
    step_ms = np.where(tokens <= 512, 9.0 + 0.006 * tokens, 14.0 + 0.012 * tokens)
    requests = np.array([1, 64, 256, 512, 1024], dtype=np.float64)
    card = {"source": "synthetic", "graph_capture_sizes": GRAPH_SIZES}
    full_block = DraftTable("default", requests, np.empty(0), (0.4 + 0.002 * requests)[None, :])
    return Profile(
        name="bench-staircase", card=card, tokens=tokens, step_ms=step_ms,
        drafters={"default": full_block}, default_drafter="default", spec=CostCard.model_validate(card),
    )


def make_batch(rng: np.random.Generator, profile: Profile, r: int, gamma: int) -> StepBatch:
    """Return one step's batch: conditional confidences drawn around 0.8, acceptances to match."""
    conf = rng.beta(8.0, 2.0, size=(r, gamma))
    accepted = (rng.random((r, gamma)) < conf).cumprod(axis=1).sum(axis=1)
    return StepBatch.from_conf(
        conf, profile, max_tokens=8192, draft_s=float(profile.draft_s(r)), accepted=accepted
    )


def best_us(fn: Callable[[], object], number: int) -> float:
    """Return the time of one call in µs, from one timing round of `number` calls."""
    return timeit.timeit(fn, number=number) / number * 1e6


def bench(r: int, gamma: int, rounds: int, number: int, seed: int) -> list[tuple[str, float, float]]:
    """Return (policy, µs per decide, µs per bare sort) for one grid point, then the floor row."""
    rng = np.random.default_rng(seed)
    profile = staircase_profile()
    warmup = [make_batch(rng, profile, r, gamma) for _ in range(3)]
    batch = make_batch(rng, profile, r, gamma)
    survival = batch.survival
    out = []
    for name in sorted(REGISTRY):
        policy = make_policy(name, gamma, {"gamma": gamma} if name == "static" else None)
        for b in warmup:
            policy.decide(b)

        def decide(policy=policy) -> object:  # default arg binds this policy, not the last
            return policy.decide(batch)

        def bare_sort() -> object:
            return np.sort(survival, axis=None)

        t_pol, t_sort = np.inf, np.inf
        for _ in range(rounds):  # alternate, so both see the same machine load
            t_sort = min(t_sort, best_us(bare_sort, number))
            t_pol = min(t_pol, best_us(decide, number))
        out.append((name, t_pol, t_sort))

    def sort_and_cumsum() -> object:
        return np.sort(survival, axis=None).cumsum()

    t_floor, t_sort = np.inf, np.inf
    for _ in range(rounds):
        t_sort = min(t_sort, best_us(bare_sort, number))
        t_floor = min(t_floor, best_us(sort_and_cumsum, number))
    out.append(("(sort+cumsum)", t_floor, t_sort))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="only R = 256, γ = 7")
    ap.add_argument("--rounds", type=int, default=7, help="alternating timing rounds (best kept)")
    ap.add_argument("--number", type=int, default=300, help="calls per timing round")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernels", choices=["numba", "numpy"], default=kernels.BACKEND,
                    help=f"kernel backend (default here: {kernels.BACKEND})")
    args = ap.parse_args()
    kernels.use(args.kernels)
    print(f"# kernels: {kernels.BACKEND}; numpy {np.__version__}")
    grid = [(256, 7)] if args.quick else [(r, g) for r in (64, 256, 512) for g in (5, 7, 15)]
    print(f"{'R':>4} {'γ':>3} {'policy':<13} {'µs/step':>8} {'np.sort µs':>11} {'ratio':>6}")
    for r, gamma in grid:
        for name, t_pol, t_sort in bench(r, gamma, args.rounds, args.number, args.seed):
            print(f"{r:>4} {gamma:>3} {name:<13} {t_pol:>8.1f} {t_sort:>11.1f} {t_pol / t_sort:>6.2f}")


if __name__ == "__main__":
    main()
