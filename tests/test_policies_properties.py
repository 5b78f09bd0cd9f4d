"""Properties every registered policy must keep on any batch: the engine trusts ℓ blindly,
so a policy that breaks a bound or anticipates its own tokens corrupts every figure after it."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparksim.policies import REGISTRY, Policy, make_policy
from sparksim.policies.base import StepBatch
from sparksim.policies.path import candidate_order, top_k_lengths
from tests.policy_helpers import CONF_GRID, batches

pytestmark = pytest.mark.filterwarnings("ignore::sparksim.cost.profile.ProfileWarning")


def _fills_along_the_path(cls: type[Policy]) -> bool:
    """Whether a policy admits through the survival-sorted path's fill (the DSpark family).

    Its module importing `top_k_lengths` says so, so a new one is held to the path's
    properties the day it registers; a class whose rule uses the path's top-k for something
    else (TensorRT-LLM's floor of one draft) says otherwise itself (`fills_path = False`).
    """
    declared = getattr(cls, "fills_path", None)
    if declared is not None:
        return bool(declared)
    return getattr(sys.modules[cls.__module__], "top_k_lengths", None) is top_k_lengths


# Every registered policy, so a new one is held to these properties the day it registers.
POLICIES = sorted(REGISTRY)
PATH_POLICIES = [n for n in POLICIES if _fills_along_the_path(REGISTRY[n])]
# `static` is MTP-γ: ℓ = γ whatever the cap, because the engine's admission reserves γ + 1
# tokens per request; it never meets a cap tighter than fixed + R·γ, the others may.
CAP_READERS = [n for n in POLICIES if n != "static"]


def test_the_property_lists_are_built_from_the_registry() -> None:
    assert POLICIES == sorted(REGISTRY) and "static" in POLICIES
    assert {"greedy", "argmax", "two-step"} <= set(PATH_POLICIES)


def _room_for_every_block(batch: StepBatch) -> StepBatch:
    """The batch with the cap the engine guarantees: room for every request's whole block."""
    floor = batch.fixed_tokens + batch.num_requests * batch.gamma
    return batch.replace(max_tokens=max(batch.max_tokens, floor))


def run_steps(name: str, steps: list[StepBatch]) -> list[np.ndarray]:
    """Run a fresh policy over consecutive steps, feeding back the realised acceptances."""
    policy = make_policy(name, steps[0].gamma)
    out = []
    for b in steps:
        lengths = policy.decide(b)
        accepted = b.accepted if b.accepted is not None else np.zeros(b.num_requests, np.int64)
        policy.observe(b, lengths, np.minimum(lengths, accepted))
        out.append(lengths)
    return out


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=30, deadline=None)
@given(batch=batches(), repeats=st.integers(1, 4))
def test_lengths_stay_within_the_block_and_the_engines_token_cap(
    name: str, batch: StepBatch, repeats: int
) -> None:
    # INV-2: 0 ≤ ℓ_r ≤ γ and B = fixed + Σℓ ≤ max_tokens, on every step of a run.
    batch = _room_for_every_block(batch)
    for lengths in run_steps(name, [batch] * repeats):
        assert lengths.shape == (batch.num_requests,)
        assert lengths.dtype == np.int64
        assert ((lengths >= 0) & (lengths <= batch.gamma)).all()
        assert lengths.sum() <= max(0, batch.max_tokens - batch.fixed_tokens)


@pytest.mark.parametrize("name", CAP_READERS)
@settings(max_examples=30, deadline=None)
@given(batch=batches(), repeats=st.integers(1, 4))
def test_lengths_stay_within_the_block_and_any_token_cap(name: str, batch: StepBatch, repeats: int) -> None:
    # INV-2 again, under caps tighter than every request's whole block.
    for lengths in run_steps(name, [batch] * repeats):
        assert lengths.shape == (batch.num_requests,)
        assert lengths.dtype == np.int64
        assert ((lengths >= 0) & (lengths <= batch.gamma)).all()
        assert lengths.sum() <= max(0, batch.max_tokens - batch.fixed_tokens)


@pytest.mark.parametrize("name", PATH_POLICIES)
@settings(max_examples=60, deadline=None)
@given(batch=batches())
def test_admissions_are_a_prefix_of_the_survival_ranking(name: str, batch: StepBatch) -> None:
    # Per-request prefixes, and across requests the first Σℓ candidates of the ranking.
    lengths = run_steps(name, [batch] * 3)[-1]
    rr, jj = candidate_order(batch.survival)
    k = int(lengths.sum())
    expected = np.zeros(batch.num_requests, dtype=np.int64)
    np.add.at(expected, rr[:k], 1)
    np.testing.assert_array_equal(lengths, expected)
    assert (jj[:k] < lengths[rr[:k]]).all()


LOSSLESS = [n for n in POLICIES if REGISTRY[n].lossless]


@pytest.mark.parametrize("name", LOSSLESS)
@settings(max_examples=40, deadline=None)
@given(batch=batches(), data=st.data())
def test_lossless_policies_decide_r_k_without_the_survivals_after_k(name: str, batch: StepBatch, data) -> None:
    # INV-8 for every policy that claims losslessness: change c_{r,k+1..γ} (which depend on
    # the sampled x_{r,k}) on the last step; whether (r, k) is verified must not move.
    r = data.draw(st.integers(0, batch.num_requests - 1))
    k = data.draw(st.integers(1, batch.gamma))
    tail = data.draw(st.lists(st.sampled_from(CONF_GRID), min_size=batch.gamma - k,
                              max_size=batch.gamma - k))
    conf = batch.conf.copy()
    conf[r, k:] = tail
    changed = StepBatch.from_conf(
        conf, batch.cost.profile, extra_fixed_tokens=batch.fixed_tokens - batch.num_requests,
        max_tokens=batch.max_tokens, draft_s=batch.cost.draft_s, accepted=batch.accepted,
    )
    before = run_steps(name, [batch, batch, batch])[-1][r] >= k
    after = run_steps(name, [batch, batch, changed])[-1][r] >= k
    assert before == after


@pytest.mark.parametrize("name", PATH_POLICIES)
@settings(max_examples=60, deadline=None)
@given(batch=batches(), repeats=st.integers(1, 3))
def test_path_policies_never_verify_a_draft_of_survival_zero(
    name: str, batch: StepBatch, repeats: int
) -> None:
    # Alg. 1 ranks positive survivals only: a draft with a_{r,j} = 0 cannot be accepted, so
    # verifying it spends a token of B for nothing (two-step's budget K can exceed them).
    for lengths in run_steps(name, [batch] * repeats):
        verified = np.arange(batch.gamma)[None, :] < lengths[:, None]  # (R, γ)
        assert (batch.survival[verified] > 0).all(), (lengths, batch.survival)
