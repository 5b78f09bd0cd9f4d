"""The step loop's bookkeeping in bulk: ITL gaps binned as arrays, the capped batch rotated in place.

Both replace per-request Python with array operations (issue 23), and both must leave every
result unchanged: the same bins, the same float sum, the same slot order.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sparksim.sim.cluster import Cluster
from sparksim.sim.engine import Engine
from sparksim.sim.invariants import InvariantError
from sparksim.sim.runner import load_inputs, load_scenario, simulate
from sparksim.sim.scheduler import Request, Scheduler
from sparksim.sim.workload import RequestSpec
from sparksim.step import kernels, records
from sparksim.step.batch_layout import CONTEXT, NUM_FIELDS, RID, ROW, ROW_END, TRACE_CUR
from sparksim.step.records import StreamStats, itl_bin, itl_bins

# every bin edge, just either side of it, 1 µs and below, beyond 1000 s, and a spread between
_EDGES = 1e-6 * 10.0 ** (np.arange(0, 1802) / 200)
_GAPS = np.concatenate([
    _EDGES, np.nextafter(_EDGES, 0), np.nextafter(_EDGES, np.inf),
    [0.0, 1e-9, 1e-6, 2e-6, 999.0, 1e3, 5e3, 1e6],
    10.0 ** np.random.default_rng(0).uniform(-8, 4, 20_000),
])


def test_array_binning_gives_the_scalar_bin_of_every_gap_even_on_a_bin_edge() -> None:
    # Why: the histogram's quantiles are in summary.json; a gap a last bit off an edge
    # must land in the bin the scalar function chose, or p99 ITL moves.
    assert itl_bins(_GAPS).tolist() == [itl_bin(float(g)) for g in _GAPS]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(1e-7, 50.0), st.just(math.nan), st.sampled_from([0.02, 0.05])),
                max_size=80), st.floats(0.0, 100.0))
def test_adding_gaps_as_an_array_equals_adding_them_one_by_one(gaps: list[float], start_s: float) -> None:
    # Why: mean ITL is itl_sum_s / itl_count; a pairwise sum would change its last bits.
    one, bulk = StreamStats(7, 0.0, 1.0), StreamStats(7, 0.0, 1.0)
    one.itl_sum_s = bulk.itl_sum_s = start_s
    for g in gaps:
        one.add_itl(g, 1)
    bulk.add_itls(np.array(gaps, dtype=np.float64))
    assert bulk.itl_sum_s == one.itl_sum_s  # the same float, not a close one
    assert bulk.itl_count == one.itl_count
    assert bulk.itl_hist.tolist() == one.itl_hist.tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.one_of(st.floats(1e-7, 50.0), st.just(math.nan)), st.integers(-1, 300)),
    st.lists(st.one_of(st.floats(1e-7, 50.0), st.just(math.nan)), max_size=12),
), max_size=40), st.integers(1, 9))
def test_buffered_gaps_fold_into_the_figures_adding_each_gap_in_turn_gives(
        calls: list[tuple[float, int] | list[float]], buffer: int) -> None:
    # Why: gaps wait in a buffer and are binned in bulk (issue 23); whatever the buffer size
    # and wherever it fills, the summary's ITL figures must be the scalar rule's, bit for bit.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(records, "ITL_BUFFER", buffer)
        stats = StreamStats(7, 0.0, 1.0)
        _feed_and_compare(stats, calls)


def _feed_and_compare(stats: StreamStats, calls: list[tuple[float, int] | list[float]]) -> None:
    hist, total, count = np.zeros_like(stats.itl_hist), 0.0, 0
    for call in calls:
        if isinstance(call, tuple):
            gap, times = call
            stats.add_itl(gap, times)
            pairs = [(gap, times)]
        else:
            stats.add_itls(np.array(call, dtype=np.float64))
            pairs = [(g, 1) for g in call]
        for gap, times in pairs:
            if times > 0 and gap == gap:
                hist[itl_bin(gap)] += times
                total += gap * times
                count += times
    assert stats.itl_count == count
    assert stats.itl_sum_s == total  # the same float, not a close one
    assert stats.itl_hist.tolist() == hist.tolist()


@pytest.fixture(scope="module")
def engine():  # type: ignore[no-untyped-def]
    return _default_engine(16)


def _default_engine(max_concurrency: int) -> Engine:
    """The first replica of the default scenario, slots for `max_concurrency` requests."""
    sc, base = load_scenario(None, [f"cluster.max_concurrency={max_concurrency}"])
    profile, traces, prefill = load_inputs(sc, base)
    return Cluster(sc, profile, traces, prefill, base_dir=base).engines[0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 16), st.integers(0, 16)), min_size=1, max_size=60))
@example([(10, 3)] * 30)  # the window walks right until it must recentre
@example([(10, 8)] * 30)  # and left
def test_rotating_the_capped_batch_in_place_is_a_roll_of_its_slots(engine, moves) -> None:  # type: ignore[no-untyped-def]
    # Why: DistServe's rotation sets who runs next under the context cap; copying into the
    # buffers' slack and moving the window must give np.roll's order, slot for slot, however
    # many rotations (and recentrings) come in a row.
    engine._recentre()
    for n, stepped in moves:
        stepped = min(stepped, n - 1)
        engine.n = n
        engine.state[:, :n] = np.arange(NUM_FIELDS * n).reshape(NUM_FIELDS, n) + 1000 * n
        engine.last_emit[:n] = np.arange(n) * 0.5
        want_state = np.roll(engine.state[:, :n], -stepped, axis=1)
        want_emit = np.roll(engine.last_emit[:n], -stepped)
        if stepped > 0:
            engine._rotate(stepped)
        assert engine.state[:, :n].tolist() == want_state.tolist()
        assert engine.last_emit[:n].tolist() == want_emit.tolist()
        assert engine.state.shape == (NUM_FIELDS, 16)  # room for a full batch after the window moved
        assert engine.state[RID, :n].tolist() == want_state[RID].tolist()
    engine.n = 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(2, 16), st.integers(1, 15), st.integers(0, 2**16)), min_size=1, max_size=40))
@example([(16, 15, 0b101)] * 30)  # the window walks right until it must recentre
def test_leaving_a_capped_step_equals_compacting_then_rotating(engine, moves) -> None:  # type: ignore[no-untyped-def]
    # Why: under the context cap, finished requests leave and the rest of the m stepped ones
    # queue behind the waiting ones; one O(m) move must give the O(n) compaction's then the
    # rotation's order.
    engine._recentre()
    for n, m, bits in moves:
        m = min(m, n - 1)  # capped: some slot waited
        done = np.array([(bits >> i) & 1 == 1 for i in range(m)] + [False] * (n - m))
        engine.n = n
        engine.state[:, :n] = np.arange(NUM_FIELDS * n).reshape(NUM_FIELDS, n) + 1000 * n
        engine.last_emit[:n] = np.arange(n) * 0.5
        kept_state, kept_emit = engine.state[:, :n][:, ~done], engine.last_emit[:n][~done]
        stepped = m - int(done.sum())
        want_state = np.roll(kept_state, -stepped, axis=1) if stepped else kept_state
        want_emit = np.roll(kept_emit, -stepped) if stepped else kept_emit
        engine._step_out(~done[:m], m)
        assert engine.n == n - int(done.sum())
        assert engine.state[:, : engine.n].tolist() == want_state.tolist()
        assert engine.last_emit[: engine.n].tolist() == want_emit.tolist()
        assert engine.state.shape == (NUM_FIELDS, 16)
    engine.n = 0


_PLAIN_RUNS = {
    "pool": ["policy.name=static", "policy.gamma=0"],
    "colocated, context cap": ["policy.name=static", "policy.gamma=0", "cluster.prefill.mode=colocated",
                               "cluster.max_context_tokens=6000", "workload.concurrency=48"],
    "KV pressure": ["policy.name=static", "policy.gamma=0", "cluster.kv_capacity_tokens=14000",
                    "workload.concurrency=48"],
    "drafting, some ℓ = 0": ["policy.name=threshold", "policy.t=0.6"],
}


def _tables(sets: list[str]) -> tuple[list[list[float]], list[list[float]], tuple[int, int]]:
    # lengths drawn past the traces' own, so requests switch trace requests mid-run
    sc, base = load_scenario(None, ["run.duration_s=40", "cluster.max_concurrency=32",
                                    "workload.lengths.source=lognormal", *sets])
    res = simulate(sc, base, check=True)  # --check: a quiet step found due raises
    steps = res.steps
    assert steps is not None and not isinstance(steps, Path)
    assert not isinstance(res.requests, Path)
    return (res.requests.to_numpy().tolist(), steps.to_numpy().tolist(),
            (int(res.requests["preemptions"].sum()), int(res.requests["trace_switches"].sum())))


def _advance_plain_by_the_kernel(self: Engine, m: int) -> tuple[int, bool, bool]:
    """The reference: `kernels.advance` with every ℓ = 0, all its checks made every step
    (on the trace set's acceptances: a plain engine holds none of its own)."""
    zeros = np.zeros(m, dtype=np.int64)
    _, emitted, done, past = kernels.advance_numpy(self.state, m, zeros, self.traces.accepted64, zeros[:0], self.gamma)
    return emitted, done, past


@pytest.mark.parametrize("name", list(_PLAIN_RUNS))
def test_steps_verifying_no_draft_give_the_replay_kernels_results(name: str) -> None:
    # Why: a step that verifies nothing advances in two slice additions and skips its finish
    # checks while `_quiet` says none can be due (issue 23); every table must stay what the
    # replay kernel gives, through joins, finishes, trace switches, the context cap's
    # rotation and preemption.
    got = _tables(_PLAIN_RUNS[name])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Engine, "_advance_plain", _advance_plain_by_the_kernel)
        want = _tables(_PLAIN_RUNS[name])
    assert got == want
    preempted, switched = got[2]
    assert switched > 0  # requests outlive their trace request: rows move under the count
    if name == "KV pressure":
        assert preempted > 0  # the run preempts, or it tests nothing here


def test_a_slot_change_that_keeps_the_quiet_count_is_caught_under_check() -> None:
    # Why: skipping the finish checks is safe only if every change to the slots resets the
    # count; a join that kept it would let a short request run past its output length.
    join = Scheduler._join

    def join_keeping_count(self: Engine, req: Request) -> None:
        quiet = self._quiet
        join(self, req)
        self._quiet = quiet

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "_join", join_keeping_count)
        with pytest.raises(InvariantError, match="counted as quiet"):
            _tables(_PLAIN_RUNS["pool"])


@pytest.fixture(scope="module")
def wide_engine():  # type: ignore[no-untyped-def]
    return _default_engine(2000)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 2000), st.integers(1, 3000), st.integers(1, 400_000), st.integers(0, 2000), st.integers(0, 99))
@example(2000, 1, 100_000, 0, 0)  # every row fits: the prefix grows to the whole batch
@example(2000, 3000, 1, 3, 0)  # the first row alone is over the cap
@example(1500, 300, 50_000, 1000, 1)  # the last step took far more than this one can
def test_the_context_cap_takes_the_rows_a_whole_batch_prefix_sum_takes(  # type: ignore[no-untyped-def]
        wide_engine, n, top, cap, last, seed) -> None:
    # Why: the cap's rows are found on a prefix of the batch (DistServe's colocated benchmark
    # holds thousands of requests, most waiting); whatever the last step took, the rows must be
    # those of the full cumulative sum, and the step's KV theirs.
    contexts = np.random.default_rng(seed).integers(1, top + 1, n)
    wide_engine.n = n
    wide_engine.state[CONTEXT, :n] = contexts
    wide_engine.max_context_tokens, wide_engine._capped_last = cap, last
    want = max(1, int(np.searchsorted(np.cumsum(contexts), cap, side="right")))
    assert wide_engine._capped_rows(n) == (want, int(contexts[:want].sum()))  # and the KV they hold
    wide_engine.n = 0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.integers(0, 2**16), st.booleans())
@example(16, 1, True)  # the first slot leaves
@example(16, 1 << 15, True)  # the last one
def test_leaving_slots_keep_the_order_of_the_rest(engine, n, bits, give_gone) -> None:  # type: ignore[no-untyped-def]
    # Why: a finished request leaves the batch and the rest keep their order (the slot order is
    # DistServe's batch order); in numpy up to four leaving shift the rest by slices, more gather
    # by mask, and the compiled kernel moves one column at a time: each backend on its own.
    before = kernels.BACKEND
    for which in ("numpy", "numba") if kernels.HAVE_NUMBA else ("numpy",):
        kernels.use(which)
        try:
            engine._recentre()
            keep = np.array([(bits >> i) & 1 == 0 for i in range(n)])
            engine.n = n
            engine.state[:, :n] = np.arange(NUM_FIELDS * n).reshape(NUM_FIELDS, n) + 1000 * n
            engine.last_emit[:n] = np.arange(n) * 0.5
            want_state, want_emit = engine.state[:, :n][:, keep].tolist(), engine.last_emit[:n][keep].tolist()
            engine._compact(keep, np.flatnonzero(~keep) if give_gone else None)
            assert engine.n == int(keep.sum()), which
            assert engine.state[:, : engine.n].tolist() == want_state, which
            assert engine.last_emit[: engine.n].tolist() == want_emit, which
        finally:
            engine.n = 0
            kernels.use(before)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 3000), st.integers(0, 2**31))
def test_a_request_past_its_trace_continues_on_others_of_its_domain_as_often_as_it_takes(
        overshoot, seed) -> None:
    # Why: a request emitting past its trace request's rows continues on another of the same
    # domain, from position 1 moved on by the overshoot (clamped at that request's end); an
    # overshoot past a whole trace request switches again, from position 1. Every switch counts.
    engine = _default_engine(4)
    engine.rng = np.random.default_rng(seed)
    offsets = engine.t_offsets
    dom = 0
    first = int(engine.sampler.by_domain[dom][0])
    end = int(offsets[first + 1])
    req = Request(RequestSpec(7, 0.0, 10, 10**6, dom, first, -1), row=end + overshoot, row_end=end,
                  trace_current=first, emitted=1, context=11)
    engine._join(req)  # runs past its rows on joining: continued there
    replay = np.random.default_rng(seed)
    row, cur, left, switches = end + overshoot, first, overshoot, 0
    while row >= end:  # the rule, spelled out
        cur = engine.sampler.next_in_domain(replay, dom, cur)
        end = int(offsets[cur + 1])
        row, left, switches = min(int(offsets[cur]) + 1 + left, end), 0, switches + 1
    assert (int(engine.state[ROW, 0]), int(engine.state[ROW_END, 0]), int(engine.state[TRACE_CUR, 0])) == (row, end, cur)
    assert req.switches == switches >= 1
