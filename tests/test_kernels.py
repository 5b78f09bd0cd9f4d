"""The compiled kernels and their numpy twins: a run must not depend on whether numba is
installed, so both backends must give the same cut and the same counts bit for bit, and
both must agree with the walk written out in plain Python."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from sparksim.cost.pricing import StepCost, unpadded_extra_s
from sparksim.policies import make_policy
from sparksim.policies.base import StepBatch
from sparksim.step import kernels
from sparksim.step.batch_layout import (
    ACCEPTED,
    CONTEXT,
    EMITTED,
    NUM_FIELDS,
    OUT_LEN,
    ROW,
    ROW_END,
    STEPS,
)
from tests.policy_helpers import CONF_GRID, batches, confidences, profiles

pytestmark = pytest.mark.filterwarnings("ignore::sparksim.cost.profile.ProfileWarning")
numba_only = pytest.mark.skipif(not kernels.HAVE_NUMBA, reason="numba is not installed")


@contextmanager
def backend(name: str) -> Iterator[None]:
    before = kernels.BACKEND
    kernels.use(name)
    try:
        yield
    finally:
        kernels.use(before)


def walk(gains: NDArray[np.float64], tau: float, step_s: NDArray[np.float64], early_stop: bool) -> tuple[int, float]:
    """Return the cut as Algorithm 1 (or its argmax) reads: one Python float at a time."""
    best, best_k, best_tau = tau / float(step_s[0]), 0, tau
    for i, g in enumerate(gains.tolist()):
        tau += g
        theta = tau / float(step_s[i + 1])
        if theta > best:
            best, best_k, best_tau = theta, i + 1, tau
        elif early_stop:
            break
    return best_k, best_tau


@st.composite
def paths(draw: st.DrawFn) -> tuple[NDArray[np.float64], float, NDArray[np.float64]]:
    """Draw descending gains from the grid (ties, zeros), a τ start and a staircase of costs."""
    n = draw(st.integers(0, 40))
    gains = np.sort(np.array(draw(st.lists(st.sampled_from(CONF_GRID), min_size=n, max_size=n))))[::-1]
    rises = draw(st.lists(st.sampled_from([0.0, 0.0, 0.05, 0.3, 2.0]), min_size=n + 1, max_size=n + 1))
    step_s = 1.0 + np.cumsum(rises)  # flat stairs, small rises and cliffs
    return gains, float(draw(st.integers(1, 12))), step_s


@settings(max_examples=200, deadline=None)
@given(paths(), st.booleans())
def test_the_numpy_walk_is_algorithm_1_one_admission_at_a_time(path, early_stop) -> None:
    gains, tau, step_s = path
    assert kernels.theta_scan_numpy(gains, tau, step_s, early_stop) == walk(gains, tau, step_s, early_stop)


@numba_only
@settings(max_examples=200, deadline=None)
@given(paths(), st.booleans())
def test_the_compiled_walk_gives_the_numpy_cut_and_tau_bit_for_bit(path, early_stop) -> None:
    gains, tau, step_s = path
    got = kernels.numba_kernels().theta_scan(gains, tau, step_s, early_stop)
    assert got == kernels.theta_scan_numpy(gains, tau, step_s, early_stop)


@st.composite
def priced_paths(draw: st.DrawFn) -> tuple[NDArray[np.float64], float, NDArray[np.float64], int, tuple]:
    """Draw a path, a dense staircase past it, where it starts, and a step's price terms."""
    gains, tau, stairs = draw(paths())
    first = draw(st.integers(0, 20))
    dense = np.concatenate((np.full(first, 0.7), stairs, [9.0, 9.5]))  # the table runs past the path
    terms = (draw(st.sampled_from([0.0, 0.4])), draw(st.sampled_from([0.0, 1e-3, 0.05, 0.3])),
             draw(st.sampled_from([0.0, 0.1, 0.6])), float(draw(st.integers(0, 20))),
             draw(st.sampled_from([0.0, 0.2])), draw(st.integers(0, first + gains.size)))
    return gains, tau, dense, first, terms


@settings(max_examples=200, deadline=None)
@given(priced_paths(), st.booleans())
def test_the_priced_walk_charges_what_the_step_cost_charges(path, early_stop) -> None:
    # Why: the policies' Θ must divide by the engine's price (one price): the kernel prices
    # each B itself, so it must equal the walk over StepCost's own step seconds.
    gains, tau, dense, first, terms = path
    fixed_s, attn_token_s, attn_mem_s, prefill, drafts_s, base = terms
    cost = StepCost(None, fixed_s, 0.0, attn_mem_s=attn_mem_s, attn_token_s=attn_token_s,  # type: ignore[arg-type]
                    prefill_tokens=int(prefill), drafts_s=drafts_s, base_tokens=base)
    assert cost.scan_terms == terms
    tokens = np.arange(first, first + gains.size + 1)
    step_s = dense[first : first + gains.size + 1] + cost.fixed_s + cost.extra_s(tokens)
    expected = kernels.theta_scan_numpy(gains, tau, step_s, early_stop)
    assert kernels.priced_scan_numpy(gains, tau, dense, first, early_stop, *terms) == expected
    assert expected == walk(gains, tau, step_s, early_stop)
    np.testing.assert_array_equal(np.broadcast_to(unpadded_extra_s(tokens, *terms[1:]), tokens.shape),
                                  np.broadcast_to(cost.extra_s(tokens), tokens.shape))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=1, max_size=30), st.integers(0, 5), st.sampled_from([0.0, 0.4]),
       st.sampled_from([0.0, 1e-3, 0.05, 0.3]), st.sampled_from([0.0, 0.1, 0.6]), st.integers(0, 20),
       st.sampled_from([0.0, 0.2]), st.integers(0, 30))
def test_with_nothing_gained_both_priced_walks_stop_at_the_cheapest_step(
    dense, first, fixed_s, attn_token_s, attn_mem_s, prefill, drafts_s, base
) -> None:
    # The cut hides the prices behind Θ; with every gain 0, τ stays put and the argmax of Θ
    # is the cheapest B (the first on ties), so each backend shows where its price is lowest.
    dense_a = np.concatenate((np.zeros(first), dense))
    n = len(dense) - 1
    cost = StepCost(None, fixed_s, 0.0, attn_mem_s=attn_mem_s, attn_token_s=attn_token_s,  # type: ignore[arg-type]
                    prefill_tokens=prefill, drafts_s=drafts_s, base_tokens=base)
    terms_f = cost.scan_terms
    tokens = np.arange(first, first + n + 1)
    # (Θ, not the price: two prices an ulp apart can divide τ into the same Θ)
    cheapest = int(np.argmax(3.0 / (dense_a[first:] + cost.fixed_s + cost.extra_s(tokens))))
    zero = np.zeros(n)
    backends = [kernels.priced_scan_numpy] + ([kernels.numba_kernels().priced_scan] if kernels.HAVE_NUMBA else [])
    for scan in backends:
        assert scan(zero, 3.0, dense_a, first, False, *terms_f) == (cheapest, 3.0)


@settings(max_examples=200, deadline=None)
@given(priced_paths(), st.integers(1, 12))
def test_an_early_stop_priced_by_chunks_is_the_whole_walks(path, chunk) -> None:
    # Why: the numpy twin prices an early-stopping walk a chunk at a time (greedy's guess of
    # the stop, growing 4x); where the chunks end must not move the cut or τ by a bit.
    gains, tau, dense, first, terms = path
    whole = kernels.priced_scan_numpy(gains, tau, dense, first, True, *terms)
    assert kernels.priced_scan_numpy(gains, tau, dense, first, True, *terms, chunk) == whole


@numba_only
@settings(max_examples=200, deadline=None)
@given(priced_paths(), st.booleans(), st.integers(0, 12))
def test_the_compiled_priced_walk_gives_the_numpy_cut_and_tau_bit_for_bit(path, early_stop, chunk) -> None:
    gains, tau, dense, first, terms = path
    got = kernels.numba_kernels().priced_scan(gains, tau, dense, first, early_stop, *terms, chunk)
    assert got == kernels.priced_scan_numpy(gains, tau, dense, first, early_stop, *terms, chunk)


@st.composite
def memberships(draw: st.DrawFn) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]:
    """Draw a snapshot (ids in any order, survivals) and this step's ids: some stayed, some joined.

    Ids lie close together (the compiled kernel maps them through a table over their span)
    or far apart (it sorts and searches)."""
    old = draw(st.integers(1, 300))
    order = draw(st.permutations(range(old))) if draw(st.booleans()) else range(old)
    spread = draw(st.sampled_from([1, 3, 1000]))
    stale_ids = np.array(order, dtype=np.int64) * spread
    gamma = draw(st.integers(1, 16))
    seed = draw(st.integers(0, 2**32 - 1))
    survival = np.cumprod(np.random.default_rng(seed).uniform(0.0, 1.0, (old, gamma)), axis=1)
    kept = [int(i) for i in stale_ids if draw(st.booleans())] if draw(st.booleans()) else list(stale_ids)
    joined = [spread * old + 1 + i for i in range(draw(st.integers(0, 12)))]
    ids = np.array(draw(st.permutations(kept + joined)) if draw(st.booleans()) else kept + joined, dtype=np.int64)
    return ids, stale_ids, survival


@settings(max_examples=150, deadline=None)
@given(memberships())
def test_the_stale_rows_are_each_present_requests_own_in_its_order(case) -> None:
    ids, stale_ids, survival = case
    rows, p = kernels.stale_rows_numpy(ids, stale_ids, survival, True)
    where = {int(i): r for r, i in enumerate(stale_ids)}
    present = [where[int(i)] for i in ids if int(i) in where]
    assert p == len(present) and rows.shape == (ids.size, survival.shape[1])
    np.testing.assert_array_equal(rows[:p], survival[present])
    np.testing.assert_allclose(rows[p:], np.broadcast_to(survival.mean(axis=0), rows[p:].shape), rtol=1e-12)


@numba_only
@settings(max_examples=150, deadline=None)
@given(memberships())
def test_the_compiled_stale_rows_are_the_numpy_rows_bit_for_bit(case) -> None:
    ids, stale_ids, survival = case
    # the joined ones' mean too, wherever numpy sums the rows in order (γ > 1)
    fill = survival.shape[1] > 1
    got, p = kernels.numba_kernels().stale_rows(ids, stale_ids, survival, fill)
    want, q = kernels.stale_rows_numpy(ids, stale_ids, survival, fill)
    assert p == q
    np.testing.assert_array_equal(got if fill else got[:p], want if fill else want[:p])


@numba_only
@settings(max_examples=150, deadline=None)
@given(memberships(), st.booleans())
def test_the_compiled_stale_path_is_the_sorted_stale_rows_bit_for_bit(case, coarse) -> None:
    # Why: two-step's K is read off this path; the compiled kernel edits the snapshot's sorted
    # values where numpy sorts the matched rows afresh, and K (so every figure) must not
    # depend on which ran. Coarse survivals tie across rows and reach 0: a request that left
    # must take one copy of each of its values out, not every equal one.
    ids, stale_ids, survival = case
    assume(survival.shape[1] > 1)  # γ = 1 sums the joined mean pairwise: the caller sorts the rows
    if coarse:
        survival = np.floor(survival * 4.0) / 4.0  # still non-increasing along each row
    ranked = np.sort(survival.ravel())[::-1]
    got = kernels.numba_kernels().stale_path(ranked, ids, stale_ids, survival)
    want = kernels.stale_path_numpy(ranked, ids, stale_ids, survival)
    rows, _ = kernels.stale_rows_numpy(ids, stale_ids, survival, True)
    assert got.shape == (ids.size * survival.shape[1],)
    np.testing.assert_array_equal(want, np.sort(rows.ravel())[::-1])
    np.testing.assert_array_equal(got, want)


@numba_only
def test_the_compiled_stale_path_refuses_values_that_are_not_the_snapshots() -> None:
    # Why: the kernel edits `ranked` trusting it to be the snapshot's own sort; a leaving
    # request's value missing from it would leave a stale row in the path, so it must raise.
    survival = np.cumprod(np.full((3, 2), 0.5), axis=1) * np.array([[1.0], [0.9], [0.8]])
    stale_ids, ids = np.array([1, 2, 3]), np.array([1, 2])  # request 3 left
    ranked = np.sort(survival.ravel())[::-1]
    compiled = kernels.numba_kernels().stale_path
    assert compiled(ranked, ids, stale_ids, survival).tolist() == np.sort(survival[:2].ravel())[::-1].tolist()
    wrong = ranked.copy()
    wrong[ranked == survival[2, 0]] = 0.41  # not request 3's value: still descending
    with pytest.raises(ValueError, match="not the snapshot's survivals sorted"):
        compiled(wrong, ids, stale_ids, survival)


@settings(max_examples=150, deadline=None)
@given(memberships(), st.booleans(), st.integers(0, 2**32 - 1))
def test_the_stale_cut_is_the_priced_walk_along_the_stale_path(case, coarse, seed) -> None:
    # Why: two-step's K comes from this one call where nothing but B prices a step; it must be
    # the argmax of Θ along the stale path cut to its positive survivals and the token limit,
    # as `Path.best_cut` walks it, in either backend, and say so (-1) where the dense table is
    # too short for that cut rather than read past it.
    ids, stale_ids, survival = case
    assume(survival.shape[1] > 1)
    if coarse:
        survival = np.floor(survival * 4.0) / 4.0  # ties, and survivals of 0 at the path's end
    rng = np.random.default_rng(seed)
    ranked = np.sort(survival.ravel())[::-1]
    first = int(ids.size + rng.integers(0, 40))  # R bonus slots and some prompt tokens
    max_tokens = int(first + rng.integers(0, ids.size * survival.shape[1] + 10))
    # prices that may fall with B (extrapolation): an admission of survival 0 could then raise Θ
    dense = rng.uniform(0.01, 0.012, first + ids.size * survival.shape[1] + 1)
    terms = (float(rng.choice([0.0, 0.003])), float(rng.choice([0.0, 1e-6])), float(rng.choice([0.0, 1e-4])),
             float(rng.integers(0, 20)), float(rng.choice([0.0, 2e-4])), first)
    path = kernels.stale_path_numpy(ranked, ids, stale_ids, survival)
    n = max(0, min(int(np.count_nonzero(path > 0.0)), max_tokens - first))
    want = kernels.priced_scan_numpy(path[:n], float(ids.size), dense, first, False, *terms)[0]
    backends = [kernels.stale_cut_numpy] + ([kernels.numba_kernels().stale_cut] if kernels.HAVE_NUMBA else [])
    for cut in backends:
        assert cut(ranked, ids, stale_ids, survival, ids.size, max_tokens, dense, first, *terms) == want
        short = dense[: first + n]  # one B short of the cut's end
        assert cut(ranked, ids, stale_ids, survival, ids.size, max_tokens, short, first, *terms) == -1


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(-3, 12), max_size=40), st.integers(0, 9))
def test_verified_sums_an_answer_in_bounds_and_flags_one_out_of_them(values, max_length) -> None:
    # Why: the engine prices and replays Σℓ only after this check; an ℓ out of bounds would
    # index the trace out of range, so the check must catch each one, in either backend.
    lengths = np.array(values, dtype=np.int64)
    want = sum(values) if all(0 <= v <= max_length for v in values) else -1
    assert kernels.verified_numpy(lengths, max_length) == want
    if kernels.HAVE_NUMBA:
        assert kernels.numba_kernels().verified(lengths, max_length) == want


@numba_only
@settings(max_examples=150, deadline=None)
@given(confidences(max_requests=9, max_gamma=20), st.sampled_from(CONF_GRID))
def test_the_compiled_counts_match_numpy_on_rows_of_any_width(conf, v) -> None:
    survival = np.cumprod(conf, axis=1)
    got = kernels.numba_kernels().count_at_least(survival, v)
    np.testing.assert_array_equal(got, kernels.count_at_least_numpy(survival, v))
    np.testing.assert_array_equal(got, (survival >= v).sum(axis=1))


@numba_only
@settings(max_examples=60, deadline=None)
@given(st.lists(batches(with_accepted=False), min_size=1, max_size=4), st.sampled_from(["greedy", "argmax", "two-step"]))
def test_every_path_policy_decides_the_same_under_either_backend(steps, name) -> None:
    # Why: results are promised byte-identical for a scenario and seed; the backend a
    # machine happens to have must not change a single verification length.
    steps = [b for b in steps if b.gamma == steps[0].gamma]
    decisions = {}
    for which in ("numpy", "numba"):
        with backend(which):
            policy = make_policy(name, steps[0].gamma, {"delay": 1} if name == "two-step" else None)
            decisions[which] = [policy.decide(b).tolist() for b in steps]
    assert decisions["numpy"] == decisions["numba"]


@numba_only
@settings(max_examples=60, deadline=None)
@given(profiles(), st.integers(2, 8), st.integers(1, 2), st.booleans(),
       st.lists(st.tuples(st.integers(1, 40), st.integers(0, 40), st.integers(0, 2**32 - 1)), min_size=3, max_size=6))
def test_two_step_decides_the_same_under_either_backend_as_requests_come_and_go(prof, gamma, delay, coarse, plan) -> None:
    # Why: with requests joining and leaving between steps, compiled two-step sizes K on the
    # snapshot's sorted values edited for them (`stale_path`, `stale_cut`) where numpy sorts
    # the matched rows afresh; every K, so every ℓ, must be the same bit for bit.
    steps, ids = [], np.empty(0, dtype=np.int64)
    for i, (r, stay, seed) in enumerate(plan):  # some requests stay (in order), the rest are new
        kept = ids[ids.size - min(stay, r, ids.size):]
        ids = np.concatenate((kept, np.arange(1000 * (i + 1), 1000 * (i + 1) + r - kept.size)))
        conf = np.random.default_rng(seed).uniform(0.0, 1.0, (r, gamma))
        if coarse:
            conf = np.floor(conf * 4.0) / 4.0  # ties and survivals of 0
        steps.append(StepBatch.from_conf(conf, prof, request_ids=ids))
    decisions = {}
    for which in ("numpy", "numba"):
        with backend(which):
            policy = make_policy("two-step", gamma, {"delay": delay})
            decisions[which] = [policy.decide(b).tolist() for b in steps]
    assert decisions["numpy"] == decisions["numba"]


@st.composite
def steps(draw: st.DrawFn) -> tuple[NDArray[np.int64], int, NDArray[np.int64], NDArray[np.int64], int]:
    """Draw a running batch mid-run: trace rows, emitted counts near the output length, ℓ."""
    gamma = draw(st.integers(1, 7))
    n = draw(st.integers(0, 12))
    trace_accepted = np.array(draw(st.lists(st.integers(0, gamma), min_size=60, max_size=60)))
    state = np.zeros((NUM_FIELDS, n + 3), dtype=np.int64)  # spare slots must stay untouched
    for i in range(n):
        state[ROW, i] = draw(st.integers(0, 50))
        state[ROW_END, i] = draw(st.integers(state[ROW, i] + 1, 60))
        state[OUT_LEN, i] = draw(st.integers(1, 40))
        state[EMITTED, i] = draw(st.integers(0, state[OUT_LEN, i] - 1))
        state[CONTEXT, i] = 100 + state[EMITTED, i]
    state[STEPS:ACCEPTED + 1, :n] = draw(st.integers(0, 9))
    lengths = np.array(draw(st.lists(st.integers(0, gamma), min_size=n, max_size=n)), dtype=np.int64)
    return state, n, lengths, trace_accepted, gamma


@numba_only
@settings(max_examples=150, deadline=None)
@given(steps(), st.booleans())
def test_the_compiled_step_advances_the_batch_exactly_as_numpy_does(step, count_joint) -> None:
    state, n, lengths, trace_accepted, gamma = step
    results = []
    for advance in (kernels.advance_numpy, kernels.numba_kernels().advance):
        s = state.copy()
        joint = np.zeros((gamma + 1) ** 2 if count_joint else 0, dtype=np.int64)
        ok, emitted, done, past = advance(s, n, lengths, trace_accepted, joint, gamma)
        results.append((ok.tolist(), emitted, done, past, s.tolist(), joint.tolist()))
    assert results[0] == results[1]
    ok, emitted, done, past, after, joint = results[0]
    after = np.array(after)
    # the replay rule itself, and every counter, against the state before the step
    emit = after[EMITTED] - state[EMITTED]
    assert ok == np.minimum(lengths, trace_accepted[state[ROW, :n]]).tolist()
    assert emit[:n].tolist() == np.minimum(np.array(ok, dtype=np.int64) + 1, state[OUT_LEN, :n] - state[EMITTED, :n]).tolist()
    assert emitted == int(emit.sum()) and (emit[n:] == 0).all()
    np.testing.assert_array_equal(after[ROW] - state[ROW], emit)
    np.testing.assert_array_equal(after[CONTEXT] - state[CONTEXT], emit)
    assert done == bool((after[EMITTED, :n] >= after[OUT_LEN, :n]).any())
    assert sum(joint) == (n if count_joint else 0)


def test_sparksim_kernels_numpy_selects_the_numpy_backend() -> None:
    env = {**os.environ, "SPARKSIM_KERNELS": "numpy"}
    out = subprocess.run(
        [sys.executable, "-c", "from sparksim.step import kernels; print(kernels.BACKEND)"],
        env=env, capture_output=True, text=True, check=True,
    )
    assert out.stdout.strip() == "numpy"


@numba_only
def test_numba_loads_only_once_a_run_has_called_the_kernels_enough_to_pay_for_it() -> None:
    # Why: numba loads LLVM (0.5-0.7 s); `sparksim policies` or `validate` never step, and a
    # short run finishes sooner on the numpy twins (same results): it loads after WARM_CALLS
    # kernel calls, counting the one already made. SPARKSIM_KERNELS=numba
    # binds it on the first call.
    code = (
        "import sys; import numpy as np; import sparksim.cli, sparksim.policies, sparksim.sim.engine; "
        "from sparksim.step import kernels; from sparksim.step.batch_layout import NUM_FIELDS, OUT_LEN, ROW_END; "
        "before = 'numba' in sys.modules; "
        "kernels.count_at_least(np.full((2, 3), 0.5), 0.5); first = 'numba' in sys.modules; "
        "st = np.zeros((NUM_FIELDS, 2), dtype=np.int64); st[OUT_LEN] = st[ROW_END] = 10**9; "
        "one = np.ones(2, dtype=np.int64); acc = np.ones(2 * 10**5, dtype=np.int64); "
        "joint = np.zeros(64, dtype=np.int64); "
        "[kernels.advance(st, 2, one, acc, joint, 7) for _ in range(kernels.WARM_CALLS)]; "
        "print(before, first, 'numba' in sys.modules, kernels.BACKEND)"
    )
    env = {k: v for k, v in os.environ.items() if k != "SPARKSIM_KERNELS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["False", "False", "True", "numba"]
    eager = subprocess.run(
        [sys.executable, "-c", "import sys, numpy as np; from sparksim.step import kernels; "
         "kernels.count_at_least(np.full((2, 3), 0.5), 0.5); print('numba' in sys.modules)"],
        capture_output=True, text=True, check=True, env={**env, "SPARKSIM_KERNELS": "numba"})
    assert out.stdout and eager.stdout.split() == ["True"]


def test_an_unknown_backend_is_an_error_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"'cuda'.*'numba' or 'numpy'"):
        kernels.use("cuda")
