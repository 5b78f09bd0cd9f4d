"""A policy never verifies a position its drafter never drafted (issue 24).

The shipped DeepSeek-V3 profiles' DSpark drafter drafts a block of 5; the default trace
set was recorded at γ = 7. Verifying positions 6 and 7 would price drafts that were never
made and accept tokens nobody proposed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparksim.config import parse_scenario
from sparksim.cost.profile import load_profile
from sparksim.errors import ConfigError
from sparksim.sim.runner import load_inputs

REPO = Path(__file__).resolve().parents[1]
WITH_DRAFTERS = sorted(p.name for p in (REPO / "profiles").iterdir()
                       if (p / "card.yaml").is_file() and load_profile(p).drafters)


def _inputs(profile: str, **extra: object) -> tuple[object, ...]:
    sc = parse_scenario({"profile": f"profiles/{profile}", **extra})
    return load_inputs(sc, REPO)


@pytest.mark.parametrize("name", WITH_DRAFTERS)
def test_the_default_run_verifies_at_most_what_its_drafter_drafts(name: str) -> None:
    prof, traces, _ = _inputs(name)
    table = prof.drafter(None)  # type: ignore[attr-defined]
    top = table.max_positions
    assert top is None or traces.gamma <= top  # type: ignore[attr-defined]


def test_the_traces_are_cut_to_the_drafters_block_and_an_explicit_larger_block_is_refused() -> None:
    _, traces, _ = _inputs("h200x8-deepseek-v3-analytic")
    assert traces.gamma == 5 and traces.card["truncated_from_gamma"] == 7  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"trace_block=7 is more than drafter 'dspark-5'.*\(5 positions\)"):
        _inputs("h200x8-deepseek-v3-analytic", trace_block=7)
    # plain decoding drafts nothing: the traces keep their γ (unused)
    _, plain, _ = _inputs("h200x8-deepseek-v3-analytic", policy={"name": "static", "gamma": 0})
    assert plain.gamma == 7  # type: ignore[attr-defined]
    # a drafter that drafts all 7 positions keeps the traces whole
    _, whole, _ = _inputs("h100-qwen3-8b-analytic")
    assert whole.gamma == 7  # type: ignore[attr-defined]
