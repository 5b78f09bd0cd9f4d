"""One price: what a policy predicts a step costs is what the engine charges for it.

Why: a scheduler that optimises a different price than it pays is the one bug a scheduler
testbed must not have. Before the rule was one (`sparksim.cost.pricing`), padded attention was
priced by B in the policies and by R × (1 + longest ℓ) in the engine: the engine charged
12 % (up to 15 %) more per step than the cost the policy optimised, on the live profile.
Here, on every shipped profile and random batches, the policies' view (`StepCost.step_s`,
the path policies' cached tables along the survival-sorted path) equals the engine's
charge (`StepCost.price`), and a run's recorded steps equal what its policy was told.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sparksim.config import REPO_ROOT
from sparksim.cost.pricing import StepCost
from sparksim.cost.profile import ProfileWarning, load_profile
from sparksim.policies.base import Lengths, StepBatch
from sparksim.policies.greedy import Greedy
from sparksim.policies.path import CostTable, batch_path, top_k_lengths
from sparksim.sim.runner import load_scenario, simulate

PROFILES = sorted(p.parent for p in (REPO_ROOT / "profiles").glob("*/card.yaml"))
LIVE = REPO_ROOT / "profiles" / "cpu-tinylm-d128-live-measured"


def _random_cost(profile_dir: Path, rng: np.random.Generator, gamma: int) -> StepCost:
    prof = load_profile(profile_dir)
    requests = int(rng.integers(1, 48))
    contexts = rng.integers(16, 3000, size=requests)
    chunks = [(int(rng.integers(1, 300)), int(rng.integers(0, 2000)))] if rng.random() < 0.3 else []
    drafters = [None, *prof.drafters] if prof.drafters else [None]
    drafter = drafters[int(rng.integers(len(drafters)))]
    return StepCost.for_step(
        prof, requests=requests, kv_tokens=int(contexts.sum()), kv_longest=int(contexts.max()),
        chunks=chunks, positions=gamma if drafter is not None or not prof.drafters else 0,
        drafter=drafter, loop_s=float(rng.uniform(0, 1e-3)) if rng.random() < 0.5 else 0.0)


@pytest.mark.parametrize("profile_dir", PROFILES, ids=lambda p: p.name)
def test_the_policy_view_of_any_lengths_is_the_engines_charge(profile_dir: Path) -> None:
    rng = np.random.default_rng(7)
    gamma = 7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)
        for _ in range(20):
            cost = _random_cost(profile_dir, rng, gamma)
            for _ in range(5):
                lengths = rng.integers(0, gamma + 1, size=cost.requests) * (rng.random(cost.requests) < 0.7)
                tokens = cost.base_tokens + int(lengths.sum())
                view = float(cost.step_s(np.array([tokens]), np.array([int(lengths.max())]))[0])
                assert view == pytest.approx(cost.price(lengths).total_s, rel=1e-9)
                # the engine's scalar attention term is the policies' array one, to the bit
                longest = int(lengths.max()) if lengths.sum() else 0
                assert cost.price(lengths).attention_s == float(cost.attention_excess_s(tokens, longest))


@pytest.mark.parametrize("profile_dir", PROFILES, ids=lambda p: p.name)
def test_the_path_prices_each_cut_as_the_engine_charges_its_lengths(profile_dir: Path) -> None:
    # The path policies price k admissions from cached tables and the longest ℓ along the
    # path (`path_longest`); the engine prices the lengths those k admissions make.
    rng = np.random.default_rng(11)
    gamma = 7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)
        for trial in range(12):
            cost = _random_cost(profile_dir, rng, gamma)
            conf = rng.uniform(0.2, 1.0, size=(cost.requests, gamma))
            if trial % 3 == 0:
                conf = np.round(conf, 1)  # ties between positions and requests
            batch = StepBatch.from_conf(conf, cost.profile, cost=cost)
            path = batch_path(batch, CostTable())
            table = path.step_s()
            for k in sorted({0, 1, path.size // 3, path.size // 2, path.size}):
                lengths = top_k_lengths(batch.survival, k)
                assert table[k] == pytest.approx(cost.price(lengths).total_s, rel=1e-9), (trial, k)


@pytest.mark.parametrize("policy", ["greedy", "two-step", "argmax"])
def test_a_runs_recorded_steps_cost_what_its_policy_was_told(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # On the live engine's profile: padded attention, the drafts overhead and the loop.
    import sparksim.policies as registry
    from sparksim.policies.argmax import Argmax
    from sparksim.policies.two_step import TwoStep

    base = {"greedy": Greedy, "two-step": TwoStep, "argmax": Argmax}[policy]
    probes: list[Any] = []

    class P(base):  # type: ignore[valid-type, misc]
        """The policy, writing down what it was told each step would cost for the lengths it chose."""

        told: list[tuple[int, float, float]]

        def __init__(self, block: int) -> None:
            super().__init__(block)
            self.told = []
            probes.append(self)

        def decide(self, batch: StepBatch) -> Lengths:
            lengths = super().decide(batch)
            tokens = batch.fixed_tokens + int(lengths.sum())
            view = float(batch.cost.step_s(np.array([tokens]), np.array([int(lengths.max())]))[0])
            self.told.append((batch.step_index, view, batch.cost.overhead_s))
            return lengths

    monkeypatch.setitem(registry.REGISTRY, policy, P)
    sets = [f"profile={LIVE}", "traces=traces/tinylm-d128-l6-dspark-recorded", "workload.concurrency=16",
            "cluster.max_concurrency=16", "run.duration_s=4", "cluster.prefill.mode=colocated",
            "cluster.prefill.schedule=prefill-first", "cluster.kv_capacity_tokens=unlimited"]
    sc, base_dir = load_scenario(None, sets, policy)
    res = simulate(sc, base_dir)
    assert res.steps is not None
    steps = res.steps.set_index("step")
    told = max((p.told for p in probes), key=len)  # the replica's instance (the runner makes others)
    assert len(told) > 100
    for step, view, overhead in told:
        if step not in steps.index:  # decided, but the horizon came before the step ended
            continue
        row = steps.loc[step]
        # the record holds the GPU's time; the loop was waited before the step
        assert view - overhead == pytest.approx(row["step_s"] - row["decision_s"], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("profile_dir", [LIVE, REPO_ROOT / "profiles" / "h100-qwen3-8b-analytic",
                                         REPO_ROOT / "profiles" / "b200x8-deepseek-v3-analytic"],
                         ids=lambda p: p.name)
def test_every_term_of_a_hand_made_step_is_charged(profile_dir: Path) -> None:
    # Each term written out from the card's own figures, so dropping any one from the rule
    # (the drafter's own KV read included) fails here, whichever side it is dropped from.
    import yaml

    prof = load_profile(profile_dir)
    card = yaml.safe_load((profile_dir / "card.yaml").read_text())
    cm = card.get("cost_model") or {}
    contexts, chunk, lengths = np.array([100, 200, 300]), (50, 20), np.array([2, 0, 5])
    r, gamma, overhead_s = 3, 7, 1e-3
    drafter = prof.default_drafter
    cost = StepCost.for_step(prof, requests=r, kv_tokens=int(contexts.sum()), kv_longest=int(contexts.max()),
                             chunks=[chunk], positions=gamma, drafter=drafter, loop_s=overhead_s)
    padded = cm.get("attention_kv") == "padded"
    kv_attn = r * contexts.max() if padded else contexts.sum()
    info = card["drafters"][drafter]
    passes = 1 if info.get("kind", "block") == "block" else gamma
    draft_s = prof.draft_s_scalar(r, gamma, drafter) + float(info.get("kv_ms_per_token", 0)) * kv_attn * passes / 1e3
    tokens = r + chunk[0] + int(lengths.sum())
    read_s = prof.attention_s(r, kv_attn)
    kv_s = read_s + prof.prefill_attention_s(*chunk)
    flops_s = float(cm.get("attention_ms_per_query_kv_token", 0)) / 1e3 * kv_attn / r * (
        r * (1 + lengths.max()) if padded else tokens - chunk[0])
    attention_s = flops_s if cm.get("attention_compute") == "sum" else max(flops_s - read_s, 0.0)
    vd = cm.get("verify_drafts_ms") or {"a_ms": 0.0, "b_ms_per_request": 0.0}
    drafts_s = (vd["a_ms"] + vd["b_ms_per_request"] * r) / 1e3
    want = draft_s + prof.verify_s_scalar(tokens) + kv_s + attention_s + drafts_s + overhead_s
    price = cost.price(lengths)
    assert price.total_s == pytest.approx(want, rel=1e-12)
    assert price.draft_s > 0 and price.kv_s > 0 and price.dense_s > 0
    if profile_dir == LIVE:  # the live card has every term
        assert price.attention_s > 0 and price.drafts_s > 0 and info["kv_ms_per_token"] > 0
