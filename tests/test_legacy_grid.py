"""Legacy context grids, converted on load to dense + attention tables (sparksim/cost/legacy_grid.py).

A grid priced a step by (tokens, context) from rows measured with R = ceil(B / 8)
requests; sparksim now has one pricing rule, dense(B) + attention(R, K), so a grid is
rewritten into it when it loads. The conversion cannot be exact in general: these tests
show where it is (growth with context that depends on the requests alone, the KV read) and
measure what it costs where it is not (growth that also depends on the tokens).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sparksim.cost.legacy_grid import context_weight, convert
from sparksim.cost.profile import Profile, ProfileWarning, load_profile, write_profile

TOKENS = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512.0])  # B = 1..8 all hold R = 1 request
CONTEXTS = np.array([512, 2048, 8192.0])
PER_REQUEST = np.ceil(TOKENS / 8)  # (T,) the requests each column was measured with
DENSE_MS = 5.0 + TOKENS / 100
KV_MS = 1e-4  # per request per context token: a KV read
FLOPS_MS = 2e-5  # per token per context token: attention compute, which a table in (R, K) cannot hold
ASKED = (0.0, 300.0, 512.0, 1000.0, 2048.0, 5000.0, 8192.0, 16000.0)  # below, on, between and past rows


def converted(grid: np.ndarray) -> Profile:
    """Return the profile a (C, T) grid over CONTEXTS × TOKENS loads as (no files)."""
    conv = convert(TOKENS, CONTEXTS, grid, tokens_per_request=8)
    return Profile(name="grid", card={}, tokens=TOKENS, step_ms=conv.dense_ms, attn_requests=conv.attn_requests,
                   attn_kv_tokens=conv.attn_kv_tokens, attn_ms=conv.attn_ms, kv_conversion=conv.note)


def legacy_ms(grid: np.ndarray, column: int, context: float) -> float:
    """The grid's own price at one of its columns: linear in context, first row below, last slope past."""
    k, w = context_weight(CONTEXTS.tolist(), context)
    return (1.0 - w) * grid[k, column] + w * grid[k + 1, column]


def converted_ms(prof: Profile, tokens: float, requests: float, context: float) -> float:
    """What the one pricing rule charges a step of `tokens` whose `requests` hold `context` each."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)  # past the last context: extrapolated, as the grid was
        return (prof.verify_s_scalar(tokens) + prof.attention_s(requests, requests * context)) * 1e3


def test_a_grid_whose_growth_is_a_kv_read_is_converted_exactly() -> None:
    # Why: the grids `sparksim profile` measured grow with context by the KV their R requests
    # read; for those, every step the grid priced must cost what it did, below, between and
    # past its context rows.
    grid = DENSE_MS + KV_MS * PER_REQUEST * CONTEXTS[:, None]  # (C, T)
    prof = converted(grid)
    assert prof.kv_model == "converted-grid"
    np.testing.assert_array_equal(prof.step_ms, grid[0])
    for j, (tokens, requests) in enumerate(zip(TOKENS, PER_REQUEST, strict=True)):
        for c in ASKED:
            assert converted_ms(prof, tokens, requests, c) == pytest.approx(legacy_ms(grid, j, c), rel=1e-12)


def test_growth_that_depends_on_tokens_is_averaged_over_each_request_count_and_the_error_is_measured() -> None:
    # Why: attention FLOPs grow with queries × context, which attention(R, K) cannot hold. The
    # conversion averages each request count's columns (B = 1, 2, 4, 8 all hold one request),
    # so those columns are off by FLOPS_MS · (B − 3.75) · (c − 512) ms; a column alone with its
    # R is exact. On this grid (5 ms + B / 100 dense, 0.82 ms KV and up to 1.3 ms of FLOPs at
    # B = 8, c = 8192) the worst step the grid measured is 9.1 % off inside its contexts and
    # 14.2 % past them (B = 8 underpriced, B = 1 overpriced).
    grid = DENSE_MS + (KV_MS * PER_REQUEST + FLOPS_MS * TOKENS) * CONTEXTS[:, None]
    prof = converted(grid)
    worst_inside = worst_past = 0.0
    for j, (tokens, requests) in enumerate(zip(TOKENS, PER_REQUEST, strict=True)):
        mean_tokens = TOKENS[PER_REQUEST == requests].mean()
        for c in ASKED:
            old, new = legacy_ms(grid, j, c), converted_ms(prof, tokens, requests, c)
            expected = FLOPS_MS * (mean_tokens - tokens) * (max(c, CONTEXTS[0]) - CONTEXTS[0])
            assert new - old == pytest.approx(expected, abs=1e-12)
            rel = abs(new - old) / old
            if c <= CONTEXTS[-1]:
                worst_inside = max(worst_inside, rel)
            else:
                worst_past = max(worst_past, rel)
    assert worst_inside == pytest.approx(0.0905, abs=5e-4)
    assert worst_past == pytest.approx(0.1425, abs=5e-4)


def test_a_step_whose_tokens_per_request_differ_from_the_grids_pays_its_own_requests_kv() -> None:
    # Why: the grid priced a step of B tokens as if it held ceil(B / 8) requests, so plain
    # decoding of 64 requests (B = 64) paid 8 requests' KV. The converted profile prices the
    # KV above the first context for the requests the step holds: the behaviour change, and
    # the reason for it. Below the first context the dense row still holds ceil(B / 8)
    # requests' KV at 512 tokens (what the grid measured), so the step is 56 · 512 KV tokens
    # short of its true 64 · 8192: 5.5 % of the KV term here.
    grid = DENSE_MS + KV_MS * PER_REQUEST * CONTEXTS[:, None]
    prof = converted(grid)
    j, c, first = int(np.flatnonzero(TOKENS == 64)[0]), 8192.0, CONTEXTS[0]
    new = converted_ms(prof, 64, 64, c)
    assert new == pytest.approx(DENSE_MS[j] + KV_MS * (8 * first + 64 * (c - first)), rel=1e-12)
    assert legacy_ms(grid, j, c) == pytest.approx(DENSE_MS[j] + KV_MS * 8 * c, rel=1e-12)


def test_a_legacy_grid_loads_converted_and_says_how(tmp_path: Path) -> None:
    # Why: a conversion nobody hears of is a silent change of model; the loader must warn,
    # keep the card as written, and name what it did (the summary reports kv_model).
    verify = pd.DataFrame([(t, c, 5 + t / 100 + KV_MS * np.ceil(t / 8) * c)
                           for c in (1024.0, 1048576.0) for t in (8, 16, 32, 64)],
                          columns=["tokens", "context", "step_ms"])
    card = {"source": "synthetic", "hardware": "t", "model": "t", "dtype": "bf16", "date": "2026-01-01",
            "command": "tests/test_legacy_grid.py", "tokens_per_request": 8}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)
        path = write_profile(tmp_path / "grid", verify, card)
    with pytest.warns(ProfileWarning, match=r"converted on load from a legacy context grid .*1024\.\.1048576"):
        prof = load_profile(path)
    assert prof.card == card and prof.kv_model == "converted-grid"
    assert prof.kv_conversion is not None and "attention(R, K)" in prof.kv_conversion
    np.testing.assert_allclose(prof.step_ms, verify["step_ms"][:4], rtol=1e-9)
    assert prof.attention_s(8, 8 * 1048576.0) * 1e3 == pytest.approx(KV_MS * 8 * (1048576 - 1024), rel=1e-8)


def test_a_one_context_grid_loads_as_its_row_without_a_kv_term(tmp_path: Path) -> None:
    # Why: one row has no growth with context to convert; it prices what it did (its row).
    verify = pd.DataFrame({"tokens": [8, 16], "context": [2048, 2048], "step_ms": [1.0, 2.0]})
    card = {"source": "synthetic", "hardware": "t", "model": "t", "dtype": "bf16", "date": "2026-01-01",
            "command": "tests/test_legacy_grid.py"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)
        prof = load_profile(write_profile(tmp_path / "one", verify, card))
    assert prof.kv_model == "none" and prof.kv_conversion is not None and "one context row" in prof.kv_conversion
    np.testing.assert_array_equal(prof.step_ms, [1.0, 2.0])
