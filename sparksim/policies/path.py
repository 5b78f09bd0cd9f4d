"""The sorted candidate path and Θ along it: the maths shared by the DSpark-family policies.

Every candidate (r, j) with a positive survival a_{r,j} is ranked by it descending; ties
go to the lower position j, then to the lower request index r (paper Alg. 1 with
deterministic ties). A survival of 0 is a draft the target cannot accept: it is never a
candidate, so no cut verifies it: not where a step cost falling with B (as under
extrapolation) would make it raise Θ, nor where a budget K sized elsewhere exceeds the
positive survivals (two-step's fill).
Because a_{r,j} is non-increasing in j and ties prefer the lower j, every prefix of this
path is a union of per-request prefixes, so cutting the path after k admissions gives a
valid ℓ. Admitting the k-th candidate makes the step send B = fixed + k tokens and expect
τ = R + (sum of the first k survivals) tokens out; Θ = τ · SPS(B) = τ / step_s(B), where
step_s includes the draft cost (StepCost).

Everything here is vectorised over the R·γ candidates. The ranking itself needs only the
sorted survival *values* (Θ does not care which of two tied candidates comes first); which
requests a cut of k admits is then recovered from the k-th value, with the tie rule
applied only to candidates equal to it (`top_k_lengths`). `candidate_order` spells the
full ranking out with `np.lexsort`; tests use it as the reference.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from sparksim.cost.profile import Profile
from sparksim.policies.base import Lengths, StepBatch, StepCost
from sparksim.step import kernels

_ZERO_INT = np.zeros(1, dtype=np.int64)
_ZERO_FLOAT = np.zeros(1)


def candidate_order(survival: NDArray[np.float64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Return (r, j) of every candidate in path order: survival descending, then lower j, lower r.

    j is 0-based here (column index); the paper's position is j + 1.
    """
    num_requests = survival.shape[0]
    flat = survival.T.ravel()  # (γ·R,) position-major, so the flat index orders by (j, r)
    order = np.lexsort((np.arange(flat.size), -flat))
    j, r = np.divmod(order, num_requests)
    return r.astype(np.int64), j.astype(np.int64)


def sorted_survival(survival: NDArray[np.float64]) -> NDArray[np.float64]:
    """Return every survival value sorted descending, shape (R·γ,): the path's gains."""
    flat = survival.flatten()
    flat.sort()  # the method: np.sort's wrapper costs as much as sorting a few hundred values
    return flat[::-1]


def sorted_head(survival: NDArray[np.float64], count: int) -> NDArray[np.float64]:
    """Return the `count` largest survivals sorted descending: `sorted_survival`'s first `count`,
    by a partition and a sort of those alone."""
    flat = survival.flatten()
    flat.partition(flat.size - count)
    head = flat[flat.size - count :]
    head.sort()
    return head[::-1]


def path_length(num_candidates: int, fixed_tokens: int, max_tokens: int) -> int:
    """Return how many candidates the token cap lets a step admit: B = fixed + k ≤ max_tokens."""
    return max(0, min(num_candidates, max_tokens - fixed_tokens))


class CostTable:
    """Step seconds at every integer batch size, cached between steps.

    The path needs step_s at many batch sizes every step; going through
    `Profile.verify_s` each time costs more than the sort itself, so the dense cost is
    tabulated once per profile and grown on demand. One table per policy instance: the engine owns one policy per replica.
    """

    def __init__(self) -> None:
        self._profile: Profile | None = None
        self._key: tuple[str, bool] = ("", False)
        self._dense = np.empty(0)  # (N,) dense seconds at B = 0..N-1
        self._captured: tuple[int, ...] = ()

    def step_s(self, cost: StepCost, first_tokens: int, count: int,
               longest: NDArray[np.int64] | None = None) -> NDArray[np.float64]:
        """Return step_s(B) for B = first_tokens .. first_tokens + count - 1, shape (count,).

        `longest` (count,) is each batch's longest verified block, where the price depends
        on it (`StepCost.shaped`).
        """
        self._ensure(cost.profile, first_tokens + count)
        out = cost.fixed_s + self._dense[first_tokens : first_tokens + count]
        if cost.varies:
            out = out + cost.extra_s(np.arange(first_tokens, first_tokens + count), longest)
        return out

    def covers(self, profile: Profile, end: int) -> bool:
        """Whether step_s(B) is tabulated up to B = end - 1 for `profile` (a walk that far grows nothing)."""
        return profile is self._profile and (profile.mode, profile.strict) == self._key and end <= self._dense.size

    def scan(self, cost: StepCost, first_tokens: int, gains: NDArray[np.float64], tau_start: float,
             early_stop: bool, chunk: int = 0) -> tuple[int, float]:
        """`kernels.theta_scan` along `gains` with step_s(B) for B = first_tokens .. + n, priced
        inside the kernel (`kernels.priced_scan`): for a price that depends on B only (not `shaped`).
        `chunk`: with `early_stop`, a guess of the stop (the numpy twin prices from there, by chunks)."""
        self._ensure(cost.profile, first_tokens + gains.size + 1)
        return kernels.priced_scan(gains, tau_start, self._dense, first_tokens, early_stop, *cost.scan_terms, chunk)

    def stale_cut(self, cost: StepCost, fixed_tokens: int, num_requests: int, max_tokens: int,
                  ranked: NDArray[np.float64], ids: NDArray[np.int64], stale_ids: NDArray[np.int64],
                  stale_survival: NDArray[np.float64]) -> int:
        """Two-step's K on its stale path, edited and walked in one kernel call (`kernels.stale_cut`),
        for a price that depends on B only: the argmax of Θ over the path cut to its positive
        survivals and the token limit; -1 while this table does not yet reach the cut's end (the
        caller builds the path and walks it with `scan`, which grows the table only that far)."""
        self._ensure(cost.profile, 1)
        return kernels.stale_cut(ranked, ids, stale_ids, stale_survival, num_requests, max_tokens,
                                 self._dense, fixed_tokens, *cost.scan_terms)

    def step_s_at(self, cost: StepCost, tokens: NDArray[np.int64],
                  longest: NDArray[np.int64] | None = None) -> NDArray[np.float64]:
        """Return step_s(B) for each B in `tokens` (sorted ascending), at its `longest` block if given."""
        self._ensure(cost.profile, int(tokens[-1]) + 1 if tokens.size else 1)
        out = cost.fixed_s + self._dense[tokens]
        if cost.varies:
            out = out + cost.extra_s(tokens, longest)
        return out

    def captured_sizes(self, cost: StepCost) -> tuple[int, ...]:
        """Return the profile's CUDA-graph capture sizes (cached: the card never changes)."""
        self._ensure(cost.profile, 1)
        return self._captured

    def _ensure(self, prof: Profile, end: int) -> None:
        same = prof is self._profile and (prof.mode, prof.strict) == self._key
        if same and end <= self._dense.size:
            return
        old = self._dense.size if same else 0
        # Grow geometrically inside the profiled range, but never past what is asked
        # beyond it, so a strict profile raises only for batches a step really needs.
        size = max(end, min(max(2 * old, 64), prof.max_tokens + 1))
        dense = prof.verify_s(np.arange(size, dtype=np.float64))  # (size,)
        # Linear interpolation between equal costs is equal only up to rounding; snap such
        # ulp-level wobbles (< 1e-9 relative) to the cost before, or Θ would "rise" on noise.
        changed = ~(np.abs(np.diff(dense)) <= 1e-9 * np.abs(dense[1:]))  # (size - 1,)
        keep = np.maximum.accumulate(np.where(np.concatenate([[True], changed]), np.arange(size), 0))
        self._profile, self._key, self._dense = prof, (prof.mode, prof.strict), dense[keep]
        self._captured = prof.captured_sizes


@dataclass(slots=True)
class Path:
    """Θ along the survival-sorted path: k = 0..n admissions of `gains` (descending).

    Admission k adds gains[k-1] to τ and makes B = fixed + k. `greedy_cut` scans Θ from
    k = 0 and stops at the first k that does not raise it, pricing only the k it reaches;
    `best_cut` takes the argmax of Θ over every k. Step costs come from the table's dense
    costs and the step's terms (`CostTable.scan`, `CostTable.step_s`).
    """

    ranked: NDArray[np.float64]  # (R·γ,) every survival, descending
    gains: NDArray[np.float64]  # (n,) ranked cut to what the token cap admits
    num_requests: int
    fixed_tokens: int
    cost: StepCost
    table: CostTable
    longest: NDArray[np.int64] | None = None  # (n + 1,) longest ℓ after k admissions, if it is priced

    @classmethod
    def build(
        cls, ranked: NDArray[np.float64], n: int, num_requests: int, fixed_tokens: int,
        cost: StepCost, table: CostTable, survival: NDArray[np.float64] | None = None,
    ) -> Path:
        """Price the first n cuts of `ranked` with the step costs of `table`.

        The table grows only as far as the cuts a policy prices ask (`step_s`, `theta_at`),
        so a strict profile raises only for batches a step really considers. Where the price
        depends on the longest verified block (`StepCost.shaped`), `survival` (the matrix
        `ranked` sorts) gives it along the path.
        """
        longest = path_longest(survival, ranked, n) if cost.shaped and survival is not None else None
        return cls(ranked, ranked[:n], num_requests, fixed_tokens, cost, table, longest)

    @property
    def size(self) -> int:
        return int(self.gains.size)

    def step_s(self, lo: int = 0, hi: int | None = None) -> NDArray[np.float64]:
        """Return the step seconds after k = lo .. hi admissions (default: the whole path)."""
        n = self.size
        hi = n if hi is None else hi
        longest = None if self.longest is None else self.longest[lo : hi + 1]
        return self.table.step_s(self.cost, self.fixed_tokens + lo, hi - lo + 1, longest)

    def theta(self) -> NDArray[np.float64]:
        """Return Θ at every k = 0..n, shape (n + 1,), τ summed in the order the kernels sum it."""
        head = np.full(1, float(self.num_requests))
        return np.concatenate((head, self.gains)).cumsum() / self.step_s()

    def theta_at(self, ks: NDArray[np.int64]) -> NDArray[np.float64]:
        """Return Θ after k admissions for each k in `ks` (sorted, unique, in 0..n)."""
        longest = None if self.longest is None else self.longest[ks]
        step = self.table.step_s_at(self.cost, self.fixed_tokens + ks, longest)
        return (self.num_requests + self._prefix(ks)) / step

    def greedy_cut(self, first_chunk: int = 64) -> int:
        """Return how many admissions Alg. 1 keeps: it stops at the first k not raising Θ.

        Where the price depends on B only, one walk (`kernels.priced_scan`) prices each B as it
        reaches it (the numpy twin by chunks from `first_chunk`, as below). Otherwise (padded attention: the price reads the longest
        block) the walk (`kernels.theta_scan`) goes over consecutive chunks of k growing 4x,
        each carrying τ over from the last, so only the chunks it reaches are priced, and
        Alg. 1 usually stops early; a caller that knows roughly where the stop lies (the
        last step's) passes a `first_chunk` past it, so a steady batch takes one chunk.
        """
        tau, chunk = float(self.num_requests), max(first_chunk, 1)
        if self.longest is None:  # priced by B alone: the kernel prices what the walk reaches
            return self.table.scan(self.cost, self.fixed_tokens, self.gains, tau, True, chunk)[0]
        return kernels.chunked_walk(self.gains, tau, self.step_s, chunk, kernels.theta_scan)[0]

    def best_cut(self) -> int:
        """Return the k maximising Θ over the whole path (the smallest such k on ties).

        One walk of Θ at every k (`kernels.priced_scan`, or `kernels.theta_scan` over the
        priced path where the price reads the longest block).
        (Bounding Θ on segments between the CUDA-graph stairs and walking only the
        promising ones was measured slower with numpy up to R·γ = 7680: it needs a dozen
        small array operations.)
        """
        if self.longest is None:  # priced by B alone: the kernel prices each B itself
            return self.table.scan(self.cost, self.fixed_tokens, self.gains, float(self.num_requests), False)[0]
        k, _ = kernels.theta_scan(self.gains, float(self.num_requests), self.step_s(), False)
        return k

    def _prefix(self, ks: NDArray[np.int64]) -> NDArray[np.float64]:
        """Return the sum of the first k gains for each k in `ks` (sorted, unique)."""
        m = int(ks[-1]) if ks.size else 0  # only gains[:m] matter
        if ks.size * 8 > m:
            cum = np.empty(m + 1)
            cum[0] = 0.0
            self.gains[:m].cumsum(out=cum[1:])
            return cum[ks]
        # Few points: one segment sum between each pair (reduceat, vectorised), then a
        # short cumsum; a full cumsum is a sequential loop as long as the sort.
        zero_first = ks.size > 0 and ks[0] == 0
        pos = ks[1:] if zero_first else ks
        if pos.size == 0:
            return np.zeros(ks.size)
        starts = np.concatenate((_ZERO_INT, pos[:-1]))
        sums = np.add.reduceat(self.gains[: pos[-1]], starts).cumsum()
        return np.concatenate((_ZERO_FLOAT, sums)) if zero_first else sums


def batch_path(
    batch: StepBatch,
    table: CostTable,
    survival: NDArray[np.float64] | None = None,
    ranked: NDArray[np.float64] | None = None,
) -> Path:
    """Return the path over `survival` (default: the batch's fresh survivals), cut to the cap.

    `ranked` may pass those survivals already sorted descending, to skip the sort.
    """
    if survival is None:
        survival = batch.survival
    if ranked is None:
        ranked = sorted_survival(survival)
    n = path_length(num_positive(ranked), batch.fixed_tokens, batch.max_tokens)
    return Path.build(ranked, n, batch.num_requests, batch.fixed_tokens, batch.cost, table, survival)


def path_longest(survival: NDArray[np.float64], ranked: NDArray[np.float64], n: int) -> NDArray[np.int64]:
    """Return the longest ℓ after k = 0..n admissions of the path over `survival` (R, γ), shape (n + 1,).

    Position j (0-based) first enters the path with the column's largest survival M_j, at
    rank p_j = (values above M_j) + (values equal to M_j in earlier columns): ties go to the
    lower position first. M_j falls with j, so p_j rises, and after k admissions the longest
    ℓ is the number of positions with p_j < k. A position whose survivals are all 0 never
    enters.
    """
    top = survival.max(axis=0)  # (γ,) M_j
    ascending = ranked[::-1]
    above = ranked.size - np.searchsorted(ascending, top, side="right")  # (γ,)
    ties = np.array([int((survival[:, :j] == top[j]).sum()) for j in range(top.size)], dtype=np.int64)
    first = np.where(top > 0.0, above + ties, np.iinfo(np.int64).max)  # (γ,) p_j
    return np.searchsorted(np.sort(first), np.arange(n + 1), side="left").astype(np.int64)


def num_positive(ranked: NDArray[np.float64]) -> int:
    """Return how many of `ranked` (descending) are above 0: the candidates a path may admit."""
    if ranked.size == 0 or ranked[-1] > 0.0:  # the usual case: no zero survival
        return int(ranked.size)
    # ranked[::-1] is ascending (for `sorted_survival`'s view, the sorted array itself)
    return int(ranked.size - ranked[::-1].searchsorted(0.0, side="right"))


def top_k_lengths(
    survival: NDArray[np.float64], k: int, ranked: NDArray[np.float64] | None = None
) -> Lengths:
    """Return ℓ admitting the first k candidates of the path over `survival` (R, γ).

    Only positive survivals are candidates: a k past them (a budget sized elsewhere, as
    two-step's) admits all of them and no draft of survival 0. `ranked` may pass
    `sorted_survival(survival)` (all R·γ values) when the caller has it.
    """
    num_requests, gamma = survival.shape
    k = min(max(k, 0), num_requests * gamma)
    if k == 0:
        return np.zeros(num_requests, dtype=np.int64)
    if ranked is not None and k < ranked.size:  # `_first_k`'s usual case, without its checks
        v = float(ranked[k - 1])
        if v > 0.0 and ranked[k] < v:  # nothing tied with the cut's value, and it is acceptable
            return kernels.count_at_least(survival, v)
    v = _kth_largest(survival, k, ranked)
    if v <= 0.0:  # rare: the cut reaches drafts that cannot be accepted; stop before them
        k = num_positive(ranked) if ranked is not None else int(np.count_nonzero(survival > 0.0))
        v = _kth_largest(survival, k, ranked) if k else v
    return _first_k(survival, k, ranked, v)


def _kth_largest(survival: NDArray[np.float64], k: int, ranked: NDArray[np.float64] | None) -> float:
    """Return the k-th largest of `survival` (1 ≤ k ≤ R·γ), from `ranked` when given."""
    if ranked is not None:
        return float(ranked[k - 1])
    if k == survival.size:
        return float(survival.min())
    flat = survival.flatten()
    flat.partition(flat.size - k)
    return float(flat[flat.size - k])


def _first_k(
    survival: NDArray[np.float64], k: int, ranked: NDArray[np.float64] | None, v: float | None = None
) -> Lengths:
    """Return ℓ admitting the first k (0 ≤ k ≤ R·γ) of all R·γ entries in path order, zeros included.

    The k-th value v (passed when the caller has it) splits the path: everything above v is
    in, and of the entries equal to v only the first ones in (j, r) order are, so the tie
    rule costs work only on ties.
    """
    num_requests, gamma = survival.shape
    if k == 0:
        return np.zeros(num_requests, dtype=np.int64)
    if k == num_requests * gamma:
        return np.full(num_requests, gamma, dtype=np.int64)
    if v is None:
        v = _kth_largest(survival, k, ranked)
    lengths = kernels.count_at_least(survival, v)
    if ranked is not None and ranked[k] < v:
        return lengths  # v is not shared with a candidate below the cut: no tie to settle
    surplus = int(lengths.sum()) - k
    if surplus == 0:
        return lengths
    # More candidates tie at v than there are slots left: drop the last ties in (j, r) order.
    tied = (survival == v).T.ravel()  # (γ·R,) position-major
    drop = tied & (tied.cumsum() > int(tied.sum()) - surplus)
    return lengths - drop.reshape(gamma, num_requests).sum(axis=0)


def cap_lengths(batch: StepBatch, lengths: Lengths) -> Lengths:
    """Trim ℓ so that B = fixed + Σℓ ≤ max_tokens, dropping the lowest-survival admissions first.

    The admitted candidates are per-request prefixes; the top of them by the path order
    are again prefixes, so the trimmed ℓ stays valid.
    """
    budget = max(0, batch.max_tokens - batch.fixed_tokens)
    if int(lengths.sum()) <= budget:
        return lengths
    admitted = np.arange(batch.gamma)[None, :] < lengths[:, None]  # (R, γ)
    masked = np.where(admitted, batch.survival, -1.0)  # not admitted ranks below everything
    # the policy chose what to admit, survival-0 drafts included; only the cap trims it
    return _first_k(masked, budget, None)


def round_to_captured(path: Path, best_k: int, captured: tuple[int, ...]) -> int:
    """Round a budget k (B = fixed + k) to a CUDA-graph captured size, by Θ on `path`.

    Candidates are the largest captured size ≤ B and the smallest ≥ B that the path can
    reach (fixed ≤ size ≤ fixed + n); the one with higher Θ wins, the smaller on a tie.
    With no captured sizes, B on a captured size already, B past the largest one (eager
    mode: no graph to pad to) or no reachable candidate, k is returned unchanged.
    """
    b = path.fixed_tokens + best_k
    if not captured or b > captured[-1]:
        return best_k
    i = bisect.bisect_left(captured, b)
    if captured[i] == b:
        return best_k
    ks = [c - path.fixed_tokens for c in captured[max(i - 1, 0) : i + 1]]  # down, up
    reachable = np.array([k for k in ks if 0 <= k <= path.size], dtype=np.int64)
    if reachable.size == 0:
        return best_k
    return int(reachable[int(path.theta_at(reachable).argmax())])  # the smaller on ties
