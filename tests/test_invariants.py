"""INV-1..7 over a policy × workload matrix: the simulator's accounting must hold for every
scheduler and traffic shape, or no comparison between schedulers means anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sparksim.policies import REGISTRY
from sparksim.sim.cluster import Cluster
from sparksim.sim.invariants import check_run
from sparksim.sim.runner import (
    check_determinism,
    load_inputs,
    load_scenario,
    simulate,
    write_results,
)
from sparksim.step import kernels

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
    # A checker that cannot fail checks nothing: a deliberately broken policy must be stopped
    # (every step, check or not: tests/test_policy_safety.py).
    from sparksim.errors import PolicyError

    with pytest.raises(PolicyError, match=r"must be in 0\.\.7"):
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


def test_inv5_checker_fires_when_a_rerun_differs(sloped_profile: Path, varied_traces: Path) -> None:
    # Why: `--check` trusts check_determinism; fed a first run that is not what the scenario
    # gives (here another seed's), it must report INV-5 rather than compare nothing.
    sets = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=2"]
    sc, base = load_scenario(None, [*sets, "seed=1"], "static")
    other = simulate(*load_scenario(None, [*sets, "seed=2"], "static"))
    found = check_determinism(sc, base, other, strict=False)
    assert len(found) == 3 and all(v.startswith("INV-5:") for v in found), found


def test_inv6_static_gamma0_is_plain_decoding(sloped_profile: Path, varied_traces: Path) -> None:
    _, _, res = _run(sloped_profile, varied_traces, "static", ["policy.gamma=0"])
    assert res.steps is not None
    assert (res.steps["draft_s"] == 0).all() and (res.steps["verified_drafts"] == 0).all()
    assert (res.requests["decode_steps"] == res.requests["output_tokens"] - 1).all()
    # the user-plugin path with a policy that never drafts gives the same bytes
    _, _, twin = _run(sloped_profile, varied_traces, "tests.broken_policy:NeverDraft", [])
    assert twin.requests.equals(res.requests)
    assert twin.steps is not None and twin.steps.equals(res.steps)


# --------------------------------------------------------------------------- checkers that fire
#
# A checker that cannot fail checks nothing (STYLE 8): each invariant's checker is fed a real
# run's tables with one deliberate corruption and must name the invariant it guards. Replacing
# any checker in sparksim/sim/invariants.py with `return []` fails its case here.

Tables = tuple[pd.DataFrame, pd.DataFrame, dict[str, int]]


@pytest.fixture(scope="module")
def spec_run(sloped_profile: Path, varied_traces: Path) -> tuple[Tables, dict[str, Any]]:
    """A small drafting run on two replicas, its tables and the arguments `check_run` takes."""
    sc, _, res = _run(sloped_profile, varied_traces, "static",
                      ["policy.gamma=3", *WORKLOADS["gamma-2replicas"]], 2.0)
    assert res.steps is not None and res.violations == []
    return (res.requests, res.steps, dict(res.summary["census"])), {
        "gamma": res.summary["gamma"], "max_tokens": sc.cluster.max_batch_tokens,
        "plain_decoding": False}


@pytest.fixture(scope="module")
def plain_run(sloped_profile: Path, varied_traces: Path) -> tuple[Tables, dict[str, Any]]:
    """The same for plain decoding (static γ = 0), where INV-6 applies."""
    sc, _, res = _run(sloped_profile, varied_traces, "static", ["policy.gamma=0"], 2.0)
    assert res.steps is not None and res.violations == []
    return (res.requests, res.steps, dict(res.summary["census"])), {
        "gamma": res.summary["gamma"], "max_tokens": sc.cluster.max_batch_tokens,
        "plain_decoding": True}


def _second_step_of_replica(steps: pd.DataFrame, replica: int) -> Any:
    return steps.index[steps["replica"] == replica][1]


def _short_request(q: pd.DataFrame, s: pd.DataFrame, c: dict[str, int], a: dict[str, Any]) -> None:
    q.loc[q.index[0], "emitted_tokens"] -= 1  # a token lost on the way out


def _step_emits_a_phantom(q: pd.DataFrame, s: pd.DataFrame, c: dict[str, int], a: dict[str, Any]) -> None:
    s.loc[s.index[3], "emitted_tokens"] += 1  # more than Σ(min(ℓ, accepted) + 1)


def _length_above_gamma(q: pd.DataFrame, s: pd.DataFrame, c: dict[str, int], a: dict[str, Any]) -> None:
    i = s.index[(s["num_requests"] > 0).to_numpy()][0]
    s.loc[i, "verified_drafts"] = s.loc[i, "num_requests"] * a["gamma"] + 1  # some ℓ_r > γ


def _batch_over_the_limit(q: pd.DataFrame, s: pd.DataFrame, c: dict[str, int], a: dict[str, Any]) -> None:
    s.loc[s.index[5], "batch_tokens"] = a["max_tokens"] + 1


def _clock_backwards(q: pd.DataFrame, s: pd.DataFrame, c: dict[str, int], a: dict[str, Any]) -> None:
    i = _second_step_of_replica(s, 1)
    s.loc[i, "start_at"] -= 0.5 * s["step_s"].min()  # starts before the previous step ends


def _finish_before_first_token(q: pd.DataFrame, s: pd.DataFrame, c: dict[str, int], a: dict[str, Any]) -> None:
    q.loc[q.index[2], "finish_at"] = q.loc[q.index[2], "first_token_at"] - 1e-3


def _first_token_before_arrival(q: pd.DataFrame, s: pd.DataFrame, c: dict[str, int], a: dict[str, Any]) -> None:
    q.loc[q.index[1], "first_token_at"] = q.loc[q.index[1], "arrival_at"] - 1e-3


def _plain_run_drafts(q: pd.DataFrame, s: pd.DataFrame, c: dict[str, int], a: dict[str, Any]) -> None:
    s.loc[s.index[4], "verified_drafts"] += 1  # a draft verified (and rejected) with γ = 0


def _plain_run_pays_draft_cost(q: pd.DataFrame, s: pd.DataFrame, c: dict[str, int], a: dict[str, Any]) -> None:
    s.loc[s.index[4], "draft_s"] = 1e-4


def _lost_request(q: pd.DataFrame, s: pd.DataFrame, c: dict[str, int], a: dict[str, Any]) -> None:
    c["finished"] -= 1  # one arrival neither finished, running, queued nor prefilling


Corruption = Callable[[pd.DataFrame, pd.DataFrame, dict[str, int], dict[str, Any]], None]
CORRUPTIONS: dict[str, tuple[str, str, Corruption]] = {
    "a request short of its output": ("INV-1", "spec_run", _short_request),
    "a step emitting a phantom token": ("INV-1", "spec_run", _step_emits_a_phantom),
    "a length above gamma": ("INV-2", "spec_run", _length_above_gamma),
    "a batch over the token limit": ("INV-2", "spec_run", _batch_over_the_limit),
    "a clock going backwards": ("INV-3", "spec_run", _clock_backwards),
    "finish before first token": ("INV-4", "spec_run", _finish_before_first_token),
    "first token before arrival": ("INV-4", "spec_run", _first_token_before_arrival),
    "plain decoding with drafts": ("INV-6", "plain_run", _plain_run_drafts),
    "plain decoding paying a draft cost": ("INV-6", "plain_run", _plain_run_pays_draft_cost),
    "a request lost from the census": ("INV-7", "spec_run", _lost_request),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_inv1_to_inv7_checkers_fire_on_a_corrupted_run(case: str, request: pytest.FixtureRequest) -> None:
    # Why: a checker that returns [] passes every sound run too; only a broken run shows it works.
    inv, which, corrupt = CORRUPTIONS[case]
    (requests, steps, census), args = request.getfixturevalue(which)
    q, s, c = requests.copy(), steps.copy(), dict(census)
    assert check_run(q, s, c, **args) == []  # sound before the corruption
    corrupt(q, s, c, args)
    found = check_run(q, s, c, **args)
    assert any(v.startswith(f"{inv}:") for v in found), (case, found)


def _two_trace_requests(path: Path, gamma: int = 3, rows: int = 24) -> Path:
    """One domain, two trace requests: A accepts every draft at every position, B none."""
    from sparksim.traces import write_traceset

    req = pd.DataFrame({"request_id": [0, 1], "domain": ["chat", "chat"],
                        "prompt_tokens": [32, 32], "output_tokens": [rows, rows]})
    conf = np.concatenate([np.full((rows, gamma), 0.99), np.full((rows, gamma), 0.01)])
    accepted = np.concatenate([np.full(rows, gamma), np.zeros(rows)]).astype(np.int64)
    card = {"source": "synthetic", "target": "test", "drafter": "test", "gamma": gamma,
            "temperature": 1.0, "date": "2026-11-29", "command": "tests/test_invariants.py"}
    return write_traceset(path, req, conf, accepted, card)


def test_a_request_longer_than_its_trace_continues_on_another_trace_request(
    flat_profile: Path, tmp_path: Path
) -> None:
    # Why: docs/design.md §3 forbids looping a trace request; replaying the same one again would give a
    # long request the acceptance of one prompt only. With A (all drafts accepted) and B
    # (none) as the domain's only two, a 200-token request must alternate: about 23 tokens
    # in 6 steps on A, then 23 steps on B, so ~40 % of its decode tokens are accepted drafts.
    # Looping would give 75 % (on A) or 0 % (on B).
    traces = _two_trace_requests(tmp_path / "ab")
    sets = [f"profile={flat_profile}", f"traces={traces}", "policy.gamma=3", "workload.concurrency=4",
            "workload.mix={chat: 1.0}", "workload.lengths.source=lognormal",
            "workload.lengths.output.min=200", "workload.lengths.output.max=200",
            "workload.lengths.prompt.min=32", "workload.lengths.prompt.max=32", "run.duration_s=4"]
    res = simulate(*load_scenario(None, sets, "static"), check=True)
    req = res.requests
    assert len(req) >= 4 and res.violations == []
    share = req["accepted_drafts"] / (req["output_tokens"] - 1)
    assert share.between(0.3, 0.5).all(), share.describe()
    assert (req["trace_switches"] >= 4).all()


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


def test_steady_waiting_leaves_out_preempted_requests_that_have_decoded(
    flat_profile: Path, traces_07: Path
) -> None:
    # steady_waiting is the queue that has not started decoding (a growing one marks overload);
    # a preempted request waiting to be recomputed has decoded, and is not part of it.
    sets = [f"profile={flat_profile}", f"traces={traces_07}", "policy.gamma=3", "workload.kind=poisson",
            "workload.rate=40", "run.duration_s=3", "run.warmup_s=0", "run.cooldown_s=0",
            "cluster.kv_capacity_tokens=5000"]
    sc, base = load_scenario(None, sets, "static")
    cluster = Cluster(sc, *load_inputs(sc, base), base_dir=base)
    cluster.run()
    queued = [r for e in cluster.engines for r in (*e.queue, *e.prefilling)]
    assert any(r.decode_steps > 0 for r in queued)  # preempted ones wait at the horizon
    assert cluster.waiting_in_window() == sum(r.decode_steps == 0 for r in queued) > 0


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


@pytest.mark.parametrize("off_by", [1, -1])
def test_inv1_reads_the_trace_not_the_kernel_that_replayed_it(
    off_by: int, sloped_profile: Path, varied_traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Why: the records' own balance (accepted = emitted − R) is derived by the replay it is
    # meant to check, so a replay rule broken by one passed every run. Under --check the
    # engine recomputes min(ℓ, the trace's accepted) each step and compares.
    from sparksim.sim.invariants import InvariantError

    def broken(lengths, accepted, remaining):  # type: ignore[no-untyped-def]
        acc = np.clip(np.minimum(lengths, accepted + off_by), 0, lengths)
        return acc, np.minimum(acc + 1, remaining)

    monkeypatch.setattr(kernels, "advance", kernels.NUMPY.advance)  # the twin that calls replay_step
    monkeypatch.setattr(kernels, "replay_step", broken)
    with pytest.raises(InvariantError, match=r"INV-1: step .* accepted"):
        _run(sloped_profile, varied_traces, "greedy", ["workload.concurrency=8"], 2.0)


def test_inv2_exempts_only_a_lone_overlong_prompt_under_prefill_first(
    sloped_profile: Path, varied_traces: Path, tmp_path: Path
) -> None:
    # Why: prefill-first runs a prompt longer than the token limit alone (vLLM V0,
    # DistServe); INV-2 states that exemption and nothing wider.
    from sparksim.sim.invariants import inv2_bounds

    csv = tmp_path / "a.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,300,4\n0.0,40,4\n")
    sets = ["workload.kind=replay", f"workload.arrivals_csv={csv}", "cluster.max_batch_tokens=200",
            "cluster.prefill.mode=colocated", "cluster.prefill.schedule=prefill-first", "policy.gamma=1"]
    _, _, res = _run(sloped_profile, varied_traces, "static", sets, 3.0)
    assert res.violations == []
    steps = res.steps
    assert steps is not None and (steps["batch_tokens"] == 300).sum() == 1
    corrupted = steps.copy()
    corrupted.loc[corrupted.index[-1], ["num_requests", "batch_tokens"]] = [1, 251]  # a decode step over
    assert any(v.startswith("INV-2") for v in inv2_bounds(corrupted, 1, 200))
