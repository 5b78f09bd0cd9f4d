"""Sequential Temperature Scaling keeps the ranking and fixes the magnitudes of an overconfident head."""

from __future__ import annotations

import numpy as np
import pytest

from sparksim.drafter.calibrate import apply_sts, ece, fit_sts, prefix_labels, reliability, sigmoid


def _miscalibrated(n: int = 20000, gamma: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """True conditional acceptance σ(z); the head reports 3·z (overconfident)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(1.0, 1.2, size=(n, gamma))
    ok = rng.random((n, gamma)) < sigmoid(z)
    accepted = np.cumprod(ok, axis=1).sum(axis=1)
    return 3.0 * z, accepted


def test_sts_lowers_the_ece_of_every_cumulative_position() -> None:
    """The scheduler reads absolute survival values; a miscalibrated head must come out calibrated."""
    logits, accepted = _miscalibrated()
    temps = fit_sts(logits, accepted)
    rep = reliability(logits, accepted, temps)
    assert all(a < b for a, b in zip(rep["ece_after"], rep["ece_before"], strict=True))
    assert max(rep["ece_after"]) < 0.02
    assert np.allclose(temps[0], 3.0, atol=0.3)  # recovers the scale the head was inflated by


def test_sts_preserves_the_order_of_confidences_at_each_position() -> None:
    """Calibration must not change which drafts the scheduler prefers (AUC unchanged)."""
    logits, accepted = _miscalibrated(n=2000)
    cal = apply_sts(logits, fit_sts(logits, accepted))
    for k in range(logits.shape[1]):
        assert np.array_equal(np.argsort(logits[:, k], kind="stable"), np.argsort(cal[:, k], kind="stable"))


def test_ece_is_zero_for_perfect_bins_and_large_for_constant_wrong_predictions() -> None:
    """ECE must be the weighted gap between predicted and observed rates."""
    label = np.array([0, 1] * 50, dtype=float)
    assert ece(np.full(100, 0.5), label) == 0.0
    assert abs(ece(np.full(100, 0.9), label) - 0.4) < 1e-12
    assert prefix_labels(np.array([0, 2]), 3).tolist() == [[0, 0, 0], [1, 1, 0]]


def test_sts_temperatures_must_match_the_drafters_positions_and_sampling_temperature() -> None:
    from sparksim.drafter.calibrate import sts_temperatures
    from sparksim.errors import ConfigError

    cal = {"temperatures": [1.1, 0.9, 1.0], "temperature": 1.0}
    assert sts_temperatures(cal, 3, 1.0).tolist() == [1.1, 0.9, 1.0]
    assert sts_temperatures(None, 3, 0.0).tolist() == [1.0, 1.0, 1.0]
    assert sts_temperatures({"temperatures": [2.0, 2.0, 2.0]}, 3, 0.5).tolist() == [2.0] * 3  # not recorded
    with pytest.raises(ConfigError, match=r"x\.json: 3 temperatures for γ=4"):
        sts_temperatures(cal, 4, 1.0, "x.json")
    with pytest.raises(ConfigError, match=r"fitted at sampling temperature 1, but this run samples at 0\.7"):
        sts_temperatures(cal, 3, 0.7)
