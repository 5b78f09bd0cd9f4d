"""Shared fixtures: tiny profiles and trace sets built from known parameters."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sparksim.cost.profile import write_profile
from sparksim.step import kernels
from sparksim.step.batch_layout import NUM_FIELDS, OUT_LEN, ROW_END
from sparksim.traces import write_traceset


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels() -> None:
    """Compile the numba kernels for the array layouts policies pass, before any test runs.

    A first call compiles (about half a second per layout); inside a hypothesis example
    with a deadline that would fail the test on timing alone.
    """
    if kernels.BACKEND == "numba":  # bind numba now, not after the warm-up steps
        kernels.use("numba")
    gains = np.linspace(0.1, 0.9, 6)[::-1]  # a reversed view, as `sorted_survival` returns
    for writeable in (True, False):  # cached step windows are read-only
        step_s = np.linspace(1.0, 2.0, 7)
        step_s.flags.writeable = writeable
        kernels.theta_scan(gains, 1.0, step_s, True)
    kernels.count_at_least(np.full((2, 3), 0.5), 0.5)
    state = np.zeros((NUM_FIELDS, 2), dtype=np.int64)
    state[OUT_LEN], state[ROW_END] = 5, 5
    ones = np.ones(2, dtype=np.int64)
    kernels.advance(state, 2, ones, np.ones(8, dtype=np.int64), np.zeros(16, dtype=np.int64), 3)
    window = np.zeros((NUM_FIELDS, 6), dtype=np.int64)[:, 2:4]  # the engine's batch: a buffer window
    window[OUT_LEN], window[ROW_END] = 5, 5
    kernels.advance(window, 2, ones, np.ones(8, dtype=np.int64), np.zeros(16, dtype=np.int64), 3)


PROFILE_CARD = {
    "source": "synthetic", "hardware": "test", "model": "test", "dtype": "bf16",
    "date": "2026-11-29", "command": "tests/conftest.py",
}


def make_profile(
    path: Path,
    tokens: Sequence[int] = (1, 8, 64, 256, 1024, 4096, 8192),
    step_ms: Sequence[float] | None = None,
    draft_ms: float | None = None,
    **card: object,
) -> Path:
    """Write a profile; flat 10 ms per step unless `step_ms` is given."""
    ms = [10.0] * len(tokens) if step_ms is None else list(step_ms)
    draft = None
    if draft_ms is not None:
        draft = pd.DataFrame({"requests": [1, 4096], "draft_ms": [draft_ms, draft_ms]})
    return write_profile(path, pd.DataFrame({"tokens": tokens, "step_ms": ms}),
                         {**PROFILE_CARD, **card}, draft)


def make_traces(
    path: Path,
    *,
    conf: float | Callable[[np.random.Generator, int, int], np.ndarray] = 0.7,
    gamma: int = 7,
    requests_per_domain: int = 20,
    output_tokens: tuple[int, int] = (50, 400),
    domains: Sequence[str] = ("math", "code", "chat"),
    seed: int = 0,
) -> Path:
    """Write a trace set whose acceptances are drawn exactly from its (calibrated) confidences."""
    rng = np.random.default_rng(seed)
    n = requests_per_domain * len(domains)
    out = rng.integers(output_tokens[0], output_tokens[1] + 1, n)
    req = pd.DataFrame({
        "request_id": np.arange(n) + 1000,
        "domain": np.repeat(list(domains), requests_per_domain),
        "prompt_tokens": rng.integers(20, 300, n),
        "output_tokens": out,
    })
    rows = int(out.sum())
    c = np.full((rows, gamma), conf) if isinstance(conf, float) else conf(rng, rows, gamma)
    accepted = np.cumprod(rng.random((rows, gamma)) < c, axis=1).sum(axis=1)
    card = {"source": "synthetic", "target": "test", "drafter": "test", "gamma": gamma,
            "temperature": 1.0, "date": "2026-11-29", "command": "tests/conftest.py"}
    return write_traceset(path, req, c, accepted, card)


@pytest.fixture(scope="session")
def flat_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_profile(tmp_path_factory.mktemp("prof") / "flat")


@pytest.fixture(scope="session")
def sloped_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokens = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    ms = [6.0 + max(0, t - 128) * 0.02 for t in tokens]
    return make_profile(tmp_path_factory.mktemp("prof") / "sloped", tokens, ms, draft_ms=0.5,
                        graph_capture_sizes=[1, 8, 16, 32, 64, 128, 256, 512])


@pytest.fixture(scope="session")
def traces_07(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_traces(tmp_path_factory.mktemp("tr") / "c07", conf=0.7)


@pytest.fixture(scope="session")
def varied_traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    def conf(rng: np.random.Generator, rows: int, gamma: int) -> np.ndarray:
        base = rng.beta(6, 2, size=(rows, 1))
        return np.clip(base * np.linspace(1.0, 0.8, gamma)[None, :], 0.01, 0.99)

    return make_traces(tmp_path_factory.mktemp("tr") / "varied", conf=conf)
