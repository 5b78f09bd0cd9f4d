"""Long-span Monte Carlo bias (`sparksim bias --span`): the comparison detects a real difference and
not a false one, and the live engine's continuations under a lossless policy match plain decoding."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # sparksim.live runs the real models

from sparksim.live.span import ENDED, _holm, compare  # noqa: E402


def test_same_law_shows_no_bias_and_a_shifted_law_is_caught() -> None:
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    a = rng.choice(4, size=(3000, 6), p=p)
    b = rng.choice(4, size=(3000, 6), p=p)
    same = compare(a, b, seed=1)
    assert same.p_holm.min() > 0.01
    assert (same.ci_low <= 0.02).all()  # every position's CI reaches (nearly) 0
    q = p.copy()
    q[[0, 1]] = [0.6, 0.2]  # TV 0.1 at one position only
    c = a.copy()
    c[:, 3] = rng.choice(4, size=3000, p=q)
    diff = compare(c, b, seed=1)
    assert diff.p_holm[3] < 1e-6 and diff.ci_low[3] > 0.03
    assert int(np.argmax(diff.tv_low_bound)) == 3
    assert 0.05 < diff.tv_low_bound[3] < 0.15


def test_holm_adjustment_is_step_down_and_monotone() -> None:
    p = np.array([0.01, 0.04, 0.03, 0.5])
    adj = _holm(p)
    assert np.allclose(adj, [0.04, 0.09, 0.09, 0.5])  # 4·0.01; max(3·0.03, 2·0.04); 0.5


def test_live_continuations_under_a_lossless_policy_match_plain_decoding() -> None:
    from sparksim.cost.profile import load_profile
    from sparksim.live.engine import LiveModels
    from sparksim.live.span import continuations
    from sparksim.policies import make_policy

    from .test_live import GAMMA, PROMPT, _models

    model, drafter = _models(head_sigma=0.6)
    models = LiveModels(model, drafter, np.ones(GAMMA), GAMMA, 257)
    prof = load_profile("profiles/h100-qwen3-8b-analytic")
    base = continuations(models, PROMPT, None, prof, 600, 4, batch=100, seed=0)
    assert base.shape == (600, 4) and ((base >= 0) | (base == ENDED)).all()
    got = continuations(models, PROMPT, make_policy("static", GAMMA, {"gamma": GAMMA}), prof, 600, 4,
                        batch=100, seed=1)
    res = compare(got, base, seed=0)
    assert res.p_holm.min() > 0.001  # the engine is exact: no position differs detectably
    # and the comparison has power on these models: the drafter's own tokens differ from the target's
    bad = got.copy()
    bad[:, 1] = np.where(np.arange(600) % 2 == 0, bad[:, 1], base[0, 1])  # half the samples forced to one token
    assert compare(bad, base, seed=0).p_holm[1] < 1e-6
