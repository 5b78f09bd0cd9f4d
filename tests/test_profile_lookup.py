"""SPS(B) lookup semantics: what cost the simulator charges for a batch the profile did not list.

Every scheduler decision is a comparison of costs read from a profile, so padding,
interpolation, extrapolation and clean-up must do exactly what docs/design.md §3 says.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparksim.cost.profile import (
    Profile,
    ProfileWarning,
    _interp_extrapolate,
    _interp_pair,
    load_profile,
    write_profile,
)
from sparksim.errors import RangeError

CARD: dict[str, Any] = {
    "source": "synthetic",
    "hardware": "test",
    "model": "test",
    "dtype": "bf16",
    "date": "2026-01-01",
    "command": "tests/test_profile_lookup.py",
}
TOKENS = [1, 8, 16, 128]
STEP_MS = [1.0, 2.0, 3.0, 10.0]


def _write(tmp_path: Path, verify: pd.DataFrame, draft: pd.DataFrame | None = None,
           name: str = "p") -> Path:
    return write_profile(tmp_path / name, verify, CARD, draft)


@pytest.fixture
def flat_path(tmp_path: Path) -> Path:
    draft = pd.DataFrame({"requests": [1, 4, 16], "draft_ms": [0.5, 1.0, 2.0]})
    return _write(tmp_path, pd.DataFrame({"tokens": TOKENS, "step_ms": STEP_MS}), draft)


def _ms(prof: Profile, tokens: Any) -> np.ndarray:
    return prof.verify_s(tokens) * 1e3


def test_step_mode_pads_a_batch_up_to_the_next_profiled_size(flat_path: Path) -> None:
    """A batch of 121 runs the 128-token graph: it must cost exactly what 128 costs."""
    prof = load_profile(flat_path, mode="step")
    got = _ms(prof, [1, 2, 8, 9, 16, 17, 121, 128])
    np.testing.assert_allclose(got, [1, 2, 2, 3, 3, 10, 10, 10])
    assert float(_ms(prof, 0.5)) == pytest.approx(1.0)  # below the first point: the first cost


def test_linear_mode_interpolates_between_profiled_sizes(flat_path: Path) -> None:
    """Linear mode is for eager engines: cost between two points lies on the segment joining them."""
    prof = load_profile(flat_path, mode="linear")
    t = np.array([1, 4.5, 8, 12, 72, 128])
    want = np.interp(t, TOKENS, STEP_MS)
    np.testing.assert_allclose(_ms(prof, t), want, rtol=1e-12)
    assert _ms(prof, 72) == pytest.approx(3 + (72 - 16) / (128 - 16) * 7)


def test_extrapolation_past_the_last_point_follows_the_last_slope_and_warns_once(
    flat_path: Path,
) -> None:
    """Past the table the cost must keep rising at the last slope, and the user hears about it once."""
    slope = (10.0 - 3.0) / (128 - 16)
    for mode in ("step", "linear"):
        prof = load_profile(flat_path, mode=mode)  # type: ignore[arg-type]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = _ms(prof, 256)
            again = _ms(prof, [300, 512])
        msgs = [w for w in caught if issubclass(w.category, ProfileWarning)]
        assert len(msgs) == 1, [str(w.message) for w in msgs]
        assert "tokens=256" in str(msgs[0].message) and "extrapolat" in str(msgs[0].message)
        assert float(first) == pytest.approx(10 + 128 * slope)
        np.testing.assert_allclose(again, [10 + 172 * slope, 10 + 384 * slope])


def test_strict_profile_raises_range_error_instead_of_extrapolating(flat_path: Path) -> None:
    """Under --strict a result must never rest on numbers the profile does not hold."""
    prof = load_profile(flat_path, strict=True)
    assert float(_ms(prof, 128)) == pytest.approx(10.0)
    with pytest.raises(RangeError, match="tokens=129"):
        prof.verify_s([4, 129])
    with pytest.raises(RangeError, match="draft"):
        prof.draft_s(17)


def test_lookup_is_vectorised_and_keeps_the_callers_shape(flat_path: Path) -> None:
    """The engine asks for many batches at once; the answer must line up element by element."""
    prof = load_profile(flat_path, mode="linear")
    tokens = np.array([[1, 8, 16], [128, 72, 4.5]])
    got = prof.verify_s(tokens)
    assert got.shape == (2, 3)
    np.testing.assert_allclose(got * 1e3, np.interp(tokens, TOKENS, STEP_MS), rtol=1e-12)
    assert prof.verify_s(16).shape == ()


def test_draft_cost_is_looked_up_by_request_count(flat_path: Path, tmp_path: Path) -> None:
    """Drafting costs by request count, padded like verification; no requests means no drafting."""
    prof = load_profile(flat_path, mode="step")
    np.testing.assert_allclose(prof.draft_s([0, 1, 2, 4, 5, 16]) * 1e3, [0, 0.5, 1, 1, 2, 2])
    lin = load_profile(flat_path, mode="linear")
    assert float(lin.draft_s(10)) * 1e3 == pytest.approx(1.0 + 6 / 12 * 1.0)
    no_draft = _write(tmp_path, pd.DataFrame({"tokens": TOKENS, "step_ms": STEP_MS}), name="nd")
    assert not (no_draft / "draft.csv").exists()
    np.testing.assert_array_equal(load_profile(no_draft).draft_s([1, 64]), [0.0, 0.0])


def test_cost_that_falls_with_batch_size_is_raised_to_the_running_maximum_with_a_warning(
    tmp_path: Path,
) -> None:
    """A cheaper bigger batch is measurement noise; trusting it would make schedulers chase it."""
    path = tmp_path / "dip"
    path.mkdir()
    pd.DataFrame({"tokens": [1, 2, 4, 8], "step_ms": [1.0, 3.0, 2.0, 4.0]}).to_csv(
        path / "verify.csv", index=False)
    pd.DataFrame({"requests": [1, 2, 3], "draft_ms": [2.0, 1.0, 3.0]}).to_csv(
        path / "draft.csv", index=False)
    (path / "card.yaml").write_text(
        "\n".join(f"{k}: {v}" for k, v in CARD.items()) + "\n")
    with pytest.warns(ProfileWarning, match="falls with batch size") as record:
        prof = load_profile(path)
    files = " ".join(str(w.message) for w in record)
    assert "verify.csv" in files and "draft.csv" in files
    np.testing.assert_allclose(prof.step_ms, [1, 3, 3, 4])
    np.testing.assert_allclose(prof.drafters[prof.default_drafter].ms[-1], [2, 2, 3])
    assert float(prof.verify_s(4)) * 1e3 == pytest.approx(3.0)


def test_step_mode_pads_only_inside_the_captured_graph_range(tmp_path: Path) -> None:
    # Past the largest CUDA graph the engine runs eagerly: there is no bigger graph to pad
    # to, so cost interpolates between rows there (vLLM does the same).
    verify = pd.DataFrame({"tokens": [1, 8, 16, 32, 64], "step_ms": [1.0, 2.0, 3.0, 7.0, 11.0]})
    card = {"source": "synthetic", "hardware": "t", "model": "t", "dtype": "bf16", "date": "d",
            "command": "c", "graph_capture_sizes": [1, 8, 16]}
    prof = load_profile(write_profile(tmp_path / "p", verify, card))
    assert prof.step_limit == 16
    ms = prof.verify_s([12, 16, 24, 48]) * 1e3
    assert ms.tolist() == pytest.approx([3.0, 3.0, 5.0, 9.0])
    assert [prof.verify_s_scalar(t) * 1e3 for t in (12, 24, 48)] == pytest.approx([3.0, 5.0, 9.0])


def random_profile(tmp_path: Path, rng: np.random.Generator, captured: bool) -> tuple[Path, np.ndarray]:
    """Write a random table (one to six sizes, with or without captured graphs); return it and its sizes."""
    sizes = np.unique(rng.integers(1, 600, size=int(rng.integers(1, 7))))
    verify = pd.DataFrame({"tokens": sizes, "step_ms": 0.5 + sizes / 100 + rng.random(sizes.size)})
    card = dict(CARD)
    if captured:
        card["graph_capture_sizes"] = [int(s) for s in sizes[: max(1, sizes.size // 2)]]
    return write_profile(tmp_path / "p", verify, card), sizes


@pytest.mark.parametrize("seed", range(12))
def test_scalar_fast_path_equals_the_vector_lookup_on_random_profiles(tmp_path: Path, seed: int) -> None:
    """The engine prices each step with `verify_s_scalar`; it must charge what `verify_s` says.

    Random tables (one to six sizes, with or without captured graphs, step and linear
    modes), asked below, on, between and past every profiled size.
    """
    rng = np.random.default_rng(seed)
    path, sizes = random_profile(tmp_path, rng, captured=bool(seed % 2))
    asked = np.unique(np.concatenate([sizes, sizes + 1, sizes - 1, [1, 2 * int(sizes[-1]) + 3],
                                      rng.uniform(1, 1.5 * sizes[-1], size=20)]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)
        for mode in ("step", "linear"):
            prof = load_profile(path, mode=mode)
            want = prof.verify_s(asked)
            got = [prof.verify_s_scalar(float(t)) for t in asked]
            np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"{mode=}")
            # asked again, in another order (each size is remembered once worked out)
            again = [prof.verify_s_scalar(float(t)) for t in asked[::-1]]
            assert again == got[::-1], f"{mode=}"


@pytest.mark.parametrize("seed", range(12))
def test_whole_batch_sizes_read_the_lookups_own_floats(tmp_path: Path, seed: int) -> None:
    """Integer batch sizes are read from a table of `verify_s` at every size (the path
    policies price thousands a step); it must give the lookup's floats bit for bit, keep the
    caller's shape, and leave sizes past the profile (which warn) to the lookup.

    Random tables as above, asked in random order, in two shapes, then past the profile.
    """
    rng = np.random.default_rng(seed)
    path, sizes = random_profile(tmp_path, rng, captured=bool(seed % 2))
    asked = rng.integers(0, int(sizes[-1]) + 1, size=24)
    for mode in ("step", "linear"):
        prof = load_profile(path, mode=mode)
        want = prof.verify_s(asked.astype(np.float64))  # floats: the lookup itself
        got = prof.verify_s(asked)
        assert got.dtype == np.float64 and got.tobytes() == want.tobytes(), f"{mode=}"
        square = asked[:16].reshape(4, 4)
        assert prof.verify_s(square).tobytes() == prof.verify_s(square.astype(np.float64)).tobytes()
        with pytest.warns(ProfileWarning, match="extrapolat"):
            past = prof.verify_s(np.array([1, 2 * int(sizes[-1]) + 3]))
        assert past.tobytes() == prof.verify_s(np.array([1.0, 2.0 * int(sizes[-1]) + 3])).tobytes()


@pytest.mark.parametrize("seed", range(6))
def test_kv_price_follows_its_table_linearly_in_kv_and_requests(tmp_path: Path, seed: int) -> None:
    """The engine prices each step's KV read with `attention_s` (plain Python): it must be the
    table read linearly in KV tokens (slope extrapolated past the last row, from 0 below the
    first) and in request count (clamped), as numpy's interp gives it."""
    rng = np.random.default_rng(seed)
    kv = np.unique(rng.integers(1, 100_000, size=4)).astype(float)
    reqs = np.unique(rng.integers(1, 300, size=3)).astype(float)
    ms = np.sort(rng.uniform(0.1, 9.0, size=(reqs.size, kv.size)), axis=1)
    attention = pd.DataFrame([{"requests": int(r), "kv_tokens": int(k), "attn_ms": float(ms[i, j])}
                              for i, r in enumerate(reqs) for j, k in enumerate(kv)])
    prof = load_profile(write_profile(tmp_path / "a", pd.DataFrame({"tokens": TOKENS, "step_ms": STEP_MS}),
                                      CARD, extra={"attention.csv": attention}))
    kv, reqs, ms = prof.attn_kv_tokens, prof.attn_requests, prof.attn_ms  # as stored (9 digits)

    def reference(r: float, k: float) -> float:
        def row(y: np.ndarray) -> float:
            if k <= kv[0]:
                return float(y[0] * k / kv[0])
            if k >= kv[-1] and kv.size > 1:
                return float(y[-1] + (k - kv[-1]) * (y[-1] - y[-2]) / (kv[-1] - kv[-2]))
            return float(np.interp(k, kv, y))
        if reqs.size == 1:
            return row(ms[0])
        i = int(np.clip(np.searchsorted(reqs, r, side="right") - 1, 0, reqs.size - 2))
        w = float(np.clip((r - reqs[i]) / (reqs[i + 1] - reqs[i]), 0.0, 1.0))
        return (1 - w) * row(ms[i]) + w * row(ms[i + 1])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)
        for r in [*reqs, 1.0, 0.5 * reqs[-1], 2.0 * reqs[-1]]:
            for k in [*kv, 0.5 * kv[0], float(kv.mean()), 1.5 * kv[-1]]:
                assert prof.attention_s(r, k) * 1e3 == pytest.approx(reference(r, k), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10**6), min_size=1, max_size=8, unique=True),  # KV columns hold tokens
       st.lists(st.floats(0.0, 50.0), min_size=16, max_size=16), st.floats(0.0, 3 * 10**6))
def test_two_attention_rows_interpolate_as_each_row_alone(xs, ys, at) -> None:
    # Why: the engine prices the KV read between two request rows every step with one search
    # for both; each value must be the one-row interpolation's, to the bit.
    x = [float(v) for v in sorted(xs)]
    y0, y1 = ys[: len(x)], ys[8 : 8 + len(x)]
    got = _interp_pair(x, y0, y1, at)
    assert got == (_interp_extrapolate(x, y0, at), _interp_extrapolate(x, y1, at))


def test_a_prompt_step_below_the_prefill_tables_first_row_costs_that_row(tmp_path: Path) -> None:
    """A prompt-only step reads the weights whatever its tokens: below prefill.csv's first row
    it costs that row (as verify.csv holds its first size), not a share of it through 0 ms."""
    prefill = pd.DataFrame({"tokens": [64, 512], "prefill_ms": [8.0, 22.0]})
    prof = load_profile(write_profile(tmp_path / "p", pd.DataFrame({"tokens": TOKENS, "step_ms": STEP_MS}),
                                      CARD, extra={"prefill.csv": prefill}))
    assert prof.prefill_dense_s(10) * 1e3 == 8.0 and prof.prefill_dense_s(64) * 1e3 == 8.0
    assert prof.prefill_dense_s(288) * 1e3 == pytest.approx(15.0)  # linear between rows
    assert prof.prefill_s([4, 6]) == pytest.approx(8.0e-3 + prof.prefill_attention_coef_ms * 52 / 1e3)
