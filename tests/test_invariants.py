"""INV-1..7 over a policy × workload matrix: the simulator's accounting must hold for every
scheduler and traffic shape, or no comparison between schedulers means anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparksim import kernels
from sparksim.invariants import check_run
from sparksim.policies import REGISTRY
from sparksim.runner import check_determinism, load_scenario, simulate, write_results

WORKLOADS = {
    "closed-disagg": ["workload.kind=closed", "workload.concurrency=16"],
    "poisson-colocated": ["workload.kind=poisson", "workload.rate=40", "cluster.prefill.mode=colocated",
                          "cluster.prefill.chunk_tokens=256"],
    "gamma-2replicas": ["workload.kind=gamma", "workload.rate=60", "workload.cv=2.5",
                        "cluster.replicas=2", "cluster.router=least-outstanding"],
    "closed-kv-pressure": ["workload.kind=closed", "workload.concurrency=48",
                           "cluster.kv_capacity_tokens=6000", "cluster.prefill.mode=colocated"],
    "lognormal-lengths": ["workload.kind=closed", "workload.concurrency=8",
                          "workload.lengths.source=lognormal", "workload.lengths.output.mu=6.5"],
}


def _run(profile: Path, traces: Path, policy: str, extra: list[str], duration: float = 4.0):
    sets = [f"profile={profile}", f"traces={traces}", f"run.duration_s={duration}", *extra]
    sc, base = load_scenario(None, sets, policy)
    return sc, base, simulate(sc, base, check=True)


def _policies() -> list[tuple[str, list[str]]]:
    out = [("static", ["policy.gamma=0"]), ("static", ["policy.gamma=3"])]
    out += [(name, []) for name in sorted(REGISTRY) if name != "static"]
    return out


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_inv1_to_inv7_hold_for_static_on_every_workload(
    sloped_profile: Path, varied_traces: Path, workload: str
) -> None:
    _sc, _, res = _run(sloped_profile, varied_traces, "static", ["policy.gamma=3", *WORKLOADS[workload]])
    assert res.violations == []
    assert res.summary["census"]["finished"] > 0


@pytest.mark.parametrize(("policy", "params"), _policies(), ids=lambda p: str(p))
def test_inv1_to_inv7_hold_for_every_policy(
    sloped_profile: Path, varied_traces: Path, policy: str, params: list[str]
) -> None:
    for workload in ("closed-disagg", "closed-kv-pressure"):
        _, _, res = _run(sloped_profile, varied_traces, policy, [*params, *WORKLOADS[workload]], 3.0)
        assert res.violations == [], (policy, workload)


def test_inv2_caught_when_a_policy_breaks_its_bounds(sloped_profile: Path, varied_traces: Path) -> None:
    # A checker that cannot fail checks nothing: a deliberately broken policy must trip INV-2.
    from sparksim.invariants import InvariantError

    with pytest.raises(InvariantError, match="INV-2"):
        _run(sloped_profile, varied_traces, "tests.broken_policy:TooLong", [])


def test_inv5_same_seed_gives_byte_identical_results(
    sloped_profile: Path, varied_traces: Path, tmp_path: Path
) -> None:
    sets = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=3",
            "workload.kind=poisson", "workload.rate=50"]
    outs = []
    for k in range(2):
        sc, base = load_scenario(None, sets, "static")
        outs.append(write_results(simulate(sc, base), tmp_path / f"r{k}"))
    for name in ("summary.json", "requests.parquet", "steps.parquet", "scenario.yaml"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    sc, base = load_scenario(None, sets, "static")
    assert check_determinism(sc, base, simulate(sc, base), strict=False) == []


@pytest.mark.skipif(not kernels.HAVE_NUMBA, reason="numba is not installed")
@pytest.mark.parametrize(("policy", "extra"), [
    ("greedy", []), ("two-step", []), ("static", ["policy.gamma=0"]),
    ("greedy", ["cluster.prefill.mode=colocated"]),
])
def test_inv5_holds_across_kernel_backends(
    policy: str, extra: list[str], sloped_profile: Path, varied_traces: Path, tmp_path: Path
) -> None:
    # Why: whether a machine has numba must not change a single result byte.
    sets = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=3",
            "workload.kind=poisson", "workload.rate=50", *extra]
    before, outs = kernels.BACKEND, []
    try:
        for backend in ("numba", "numpy"):
            kernels.use(backend)
            sc, base = load_scenario(None, sets, policy)
            outs.append(write_results(simulate(sc, base), tmp_path / backend))
    finally:
        kernels.use(before)
    for name in ("summary.json", "requests.parquet", "steps.parquet"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


def test_inv5_other_seed_gives_other_results(sloped_profile: Path, varied_traces: Path) -> None:
    base_sets = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=3"]
    a = simulate(*load_scenario(None, [*base_sets, "seed=1"], "static"))
    b = simulate(*load_scenario(None, [*base_sets, "seed=2"], "static"))
    assert not a.requests.equals(b.requests)


def test_inv6_static_gamma0_is_plain_decoding(sloped_profile: Path, varied_traces: Path) -> None:
    _, _, res = _run(sloped_profile, varied_traces, "static", ["policy.gamma=0"])
    assert res.steps is not None
    assert (res.steps["draft_s"] == 0).all() and (res.steps["verified_drafts"] == 0).all()
    assert (res.requests["decode_steps"] == res.requests["output_tokens"] - 1).all()
    # the user-plugin path with a policy that never drafts gives the same bytes
    _, _, twin = _run(sloped_profile, varied_traces, "tests.broken_policy:NeverDraft", [])
    assert twin.requests.equals(res.requests)
    assert twin.steps is not None and twin.steps.equals(res.steps)


def test_inv7_checker_reports_lost_requests() -> None:
    import pandas as pd

    empty = pd.DataFrame(columns=["request_id", "emitted_tokens", "output_tokens", "decode_steps",
                                  "accepted_drafts", "arrival_at", "first_token_at", "finish_at"])
    census = {"arrived": 5, "finished": 2, "running": 1, "queued": 1, "prefill_pool": 0}
    out = check_run(empty, None, census, gamma=7, max_tokens=100, plain_decoding=False)
    assert any(v.startswith("INV-7") for v in out)


def test_kv_pressure_preempts_and_recomputes_without_losing_tokens(
    sloped_profile: Path, varied_traces: Path
) -> None:
    _, _, res = _run(sloped_profile, varied_traces, "static",
                     ["policy.gamma=3", *WORKLOADS["closed-kv-pressure"]], 6.0)
    assert res.requests["preemptions"].sum() > 0
    assert res.violations == []


def test_sync_pipeline_adds_the_decision_time_to_every_step(
    sloped_profile: Path, varied_traces: Path
) -> None:
    _, _, zos = _run(sloped_profile, varied_traces, "static", ["policy.gamma=3"], 2.0)
    _, _, sync = _run(sloped_profile, varied_traces, "static",
                      ["policy.gamma=3", "cluster.pipeline=sync", "cluster.decision_s=0.001"], 2.0)
    assert zos.steps is not None and sync.steps is not None
    assert (zos.steps["decision_s"] == 0).all()
    assert (sync.steps["decision_s"] == 0.001).all()
    total = sync.steps["draft_s"] + sync.steps["verify_s"] + sync.steps["decision_s"]
    assert (abs(sync.steps["step_s"] - total) < 1e-12).all()


def test_chunked_prefill_and_verification_share_the_token_limit(
    sloped_profile: Path, varied_traces: Path
) -> None:
    # INV-2 under the tightest mix: slow chunked prefills competing with full verification.
    _, _, res = _run(sloped_profile, varied_traces, "static", [
        "policy.gamma=7", "cluster.prefill.mode=colocated", "cluster.prefill.chunk_tokens=16",
        "cluster.max_batch_tokens=256", "workload.concurrency=100",
    ], 6.0)
    assert res.violations == []
    assert res.steps is not None and res.steps["batch_tokens"].max() <= 256
