"""Sequential Temperature Scaling (STS) and the reliability metrics of the paper's Fig. 6.

STS fits one temperature per draft position, left to right: T_k minimises the ECE of the
cumulative product ∏_{i≤k} σ(logit_i / T_i) against the prefix-acceptance label
1[accepted ≥ k], with T_1..T_{k−1} already fixed. Dividing a logit by T > 0 keeps its order,
so each position's own ranking (and AUC) is unchanged; the survival products of k ≥ 2 can
reorder when the positions' temperatures differ. NumPy only (no torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.stats import rankdata

from sparksim.errors import ConfigError

FloatArray = NDArray[np.float64]
TEMPERATURE_GRID = np.round(np.arange(0.05, 5.0001, 0.05), 2)  # 100 values, as the community STS module
ECE_BINS = 15


def sigmoid(x: NDArray[Any]) -> FloatArray:
    """Return 1 / (1 + e^−x) without overflow warnings."""
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64))))


def ece(pred: NDArray[Any], label: NDArray[Any], n_bins: int = ECE_BINS) -> float:
    """Return the expected calibration error: Σ_bins (n_b / n) |mean pred − mean label|, equal-width bins."""
    pred, label = np.asarray(pred, np.float64), np.asarray(label, np.float64)
    if pred.size == 0:
        return float("nan")
    idx = np.minimum((pred * n_bins).astype(np.int64), n_bins - 1)
    n = np.bincount(idx, minlength=n_bins)
    gap = np.abs(np.bincount(idx, pred, n_bins) - np.bincount(idx, label, n_bins))
    return float(gap.sum() / pred.size) if n.sum() else float("nan")


def auc(pred: NDArray[Any], label: NDArray[Any]) -> float:
    """Return the ROC AUC of `pred` for binary `label` (Mann–Whitney, ties averaged); NaN if one class."""
    label = np.asarray(label) > 0.5
    n_pos, n_neg = int(label.sum()), int((~label).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(np.asarray(pred, np.float64))
    return float((ranks[label].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def brier(pred: NDArray[Any], label: NDArray[Any]) -> float:
    """Return the mean squared error of `pred` against `label`."""
    return float(np.mean((np.asarray(pred, np.float64) - np.asarray(label, np.float64)) ** 2))


def prefix_labels(accepted: NDArray[Any], gamma: int) -> FloatArray:
    """Return (N, γ) labels 1[accepted ≥ k] for k = 1..γ."""
    return (np.asarray(accepted)[:, None] >= np.arange(1, gamma + 1)[None, :]).astype(np.float64)


def fit_sts(conf_logits: NDArray[Any], accepted: NDArray[Any],
            grid: NDArray[Any] = TEMPERATURE_GRID, n_bins: int = ECE_BINS) -> FloatArray:
    """Return per-position temperatures (γ,) fitted by STS on raw logits (N, γ) and accepted counts (N,).

    Ties in ECE go to the temperature closest to 1 (smallest |log T|).
    """
    logits = np.asarray(conf_logits, np.float64)
    gamma = logits.shape[1]
    labels = prefix_labels(accepted, gamma)
    temps = np.ones(gamma)
    cum = np.ones(logits.shape[0])
    order = np.argsort(np.abs(np.log(grid)), kind="stable")  # try T near 1 first: ties keep it
    for k in range(gamma):
        best_t, best_e = 1.0, np.inf
        for t in np.asarray(grid)[order]:
            e = ece(cum * sigmoid(logits[:, k] / t), labels[:, k], n_bins)
            if e < best_e - 1e-12:
                best_t, best_e = float(t), e
        temps[k] = best_t
        cum = cum * sigmoid(logits[:, k] / best_t)
    return temps


def apply_sts(conf_logits: NDArray[Any], temps: NDArray[Any]) -> FloatArray:
    """Return calibrated conditional confidences σ(logit_k / T_k) (N, γ)."""
    return sigmoid(np.asarray(conf_logits, np.float64) / np.asarray(temps, np.float64)[None, :])


def reliability(conf_logits: NDArray[Any], accepted: NDArray[Any], temps: NDArray[Any]) -> dict[str, list[float]]:
    """Return per-position metrics of the cumulative prediction vs 1[accepted ≥ k], before and after STS.

    Keys: ece_before, ece_after, auc, brier_before, brier_after, pred_mean_before, pred_mean_after,
    target_mean; each a list over k = 1..γ.
    """
    logits = np.asarray(conf_logits, np.float64)
    labels = prefix_labels(accepted, logits.shape[1])
    raw = np.cumprod(sigmoid(logits), axis=1)
    cal = np.cumprod(apply_sts(logits, temps), axis=1)
    g = range(logits.shape[1])
    r4 = lambda v: round(float(v), 4)  # noqa: E731 - a local formatter
    return {
        "ece_before": [r4(ece(raw[:, k], labels[:, k])) for k in g],
        "ece_after": [r4(ece(cal[:, k], labels[:, k])) for k in g],
        "auc": [r4(auc(raw[:, k], labels[:, k])) for k in g],
        "brier_before": [r4(brier(raw[:, k], labels[:, k])) for k in g],
        "brier_after": [r4(brier(cal[:, k], labels[:, k])) for k in g],
        "pred_mean_before": [r4(raw[:, k].mean()) for k in g],
        "pred_mean_after": [r4(cal[:, k].mean()) for k in g],
        "target_mean": [r4(labels[:, k].mean()) for k in g],
    }


def sts_temperatures(cal: dict[str, Any] | None, gamma: int, temperature: float,
                     where: str = "calibration") -> FloatArray:
    """The STS temperatures of `cal` (a calibration.json's object; None: all 1) for a drafter of
    `gamma` positions sampled at `temperature`.

    Refused, naming `where`: a count other than γ, and a file fitted at another sampling
    temperature (it calibrates confidences to the acceptance at that temperature, which
    changes with it). A file that does not record its temperature is taken as it is.
    """
    if cal is None:
        return np.ones(gamma)
    temps = np.asarray(cal.get("temperatures"), np.float64)
    if temps.shape != (gamma,):
        raise ConfigError(f"{where}: {temps.size} temperatures for γ={gamma}")
    fitted_at = cal.get("temperature")
    if isinstance(fitted_at, int | float) and not isinstance(fitted_at, bool) and float(fitted_at) != temperature:
        raise ConfigError(f"{where}: fitted at sampling temperature {fitted_at:g}, but this run samples at "
                          f"{temperature:g}: acceptance, which STS calibrates to, depends on it; calibrate "
                          f"again at --temperature {temperature:g}")
    return temps


def read_sts(path: Path, gamma: int, temperature: float) -> tuple[dict[str, Any] | None, FloatArray]:
    """Read `path` (a drafter's calibration.json; absent: no calibration) for `sts_temperatures`."""
    from sparksim.drafter.config import load_json

    cal = load_json(path) if path.is_file() else None
    return cal, sts_temperatures(cal, gamma, temperature, str(path))
