"""The clock's skip: a timeout nobody can see may be skipped, and skipping must move no result."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparksim.sim.clock import Clock
from sparksim.sim.runner import load_scenario, simulate, write_results


def test_skip_moves_the_clock_only_when_no_event_is_due_by_then() -> None:
    env = Clock()
    assert env.skip(0.25) and env.now == 0.25  # nothing scheduled: nobody to interleave with
    env.timeout(1.0)  # due at 1.25
    assert not env.skip(1.0)  # due exactly then: it was scheduled first, so it runs first
    assert env.now == 0.25
    assert not env.skip(2.0)
    assert env.skip(0.5) and env.now == 0.75
    # the clock reads what a timeout would have set it to: the same float addition
    a, b = Clock(), Clock()
    for d in (0.1, 0.2, 0.30000000000000004, 1e-9):
        assert a.skip(d)
        b.run(until=b.timeout(d))
        assert a.now == b.now


def test_skip_never_passes_the_horizon() -> None:
    env = Clock()
    seen: list[float] = []

    def proc():  # type: ignore[no-untyped-def]
        while True:
            if not env.skip(0.3):
                yield env.timeout(0.3)
            seen.append(env.now)

    env.process(proc())
    env.run(until=1.0)
    assert env.now == 1.0 and seen and max(seen) < 1.0


REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("case", ["disaggregated", "colocated-2-replicas", "colocated-engine-loop"])
def test_runs_with_and_without_skipping_are_byte_identical(
    case: str, sloped_profile: Path, varied_traces: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Why: skipping a timeout is a speed-up only; any moved figure means an event was jumped.
    sets = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=4",
            "workload.kind=poisson", "workload.rate=30"]
    if case == "colocated-2-replicas":
        sets += ["cluster.prefill.mode=colocated", "cluster.replicas=2", "workload.rate=60"]
    elif case == "colocated-engine-loop":  # the shipped CPU profile waits the engine loop before each step
        sets = [f"profile={REPO / 'profiles/cpu-tinylm-d128-live-measured'}",
                f"traces={REPO / 'traces/tinylm-d128-l6-dspark-recorded'}", "run.duration_s=3",
                "workload.kind=poisson", "workload.rate=40", "cluster.prefill.mode=colocated"]
    outs, skipped = [], []
    real_skip = Clock.skip

    def counting(self: Clock, delay: float) -> bool:
        moved = real_skip(self, delay)
        skipped.append(moved)
        return moved

    for mode in ("skip", "never"):
        monkeypatch.setattr(Clock, "skip", counting if mode == "skip" else lambda self, delay: False)
        sc, base = load_scenario(None, sets, "two-step")
        outs.append(write_results(simulate(sc, base), tmp_path / mode))
    assert any(skipped), "the run never skipped a timeout: the test compares nothing"
    for name in ("summary.json", "requests.parquet", "steps.parquet"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
