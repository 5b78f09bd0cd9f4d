"""Holds the cited prompt and output length statistics and the clipped lognormals fitted to them.

`sparksim/data/lengths.yaml` gives each domain's prompt and output (mean, median, min, max)
in tokens, each with its source; a synthetic set draws lengths from the lognormal clipped
to [min, max] whose mean and median are those (`LengthStat.fit`, closed form plus a root).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, Field, ValidationError, field_validator
from scipy.optimize import brentq
from scipy.special import ndtr

from sparksim.config import read_yaml_mapping, validation_problems
from sparksim.errors import ConfigError
from sparksim.traces.synth_params import STRICT

LENGTHS_FILE = Path(__file__).resolve().parents[1] / "data" / "lengths.yaml"


def clipped_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """Return E[min(max(X, lo), hi)] for X ~ lognormal(mu, sigma) (closed form)."""
    if sigma == 0.0:
        return float(min(max(np.exp(mu), lo), hi))
    a, b = (np.log(lo) - mu) / sigma, (np.log(hi) - mu) / sigma
    inside = np.exp(mu + sigma**2 / 2) * (ndtr(b - sigma) - ndtr(a - sigma))  # E[X; lo < X < hi]
    return float(lo * ndtr(a) + inside + hi * (1.0 - ndtr(b)))


def fit_clipped_lognormal(mean: float, median: float, lo: float, hi: float) -> tuple[float, float]:
    """Return (median, sigma) of the lognormal whose clip to [lo, hi] has this mean and median.

    Clipping outside the median leaves it in place, so mu = ln(median); sigma is the root of
    clipped mean = `mean` (the clipped mean rises with sigma when mean > median). Raises
    ConfigError when no sigma reaches `mean` (mean <= median, or beyond what the clip allows).
    """
    where = f"lengths: mean={mean!r}, median={median!r}, clip [{lo!r}, {hi!r}]"
    if not lo < median < hi:
        raise ConfigError(f"{where}: the median must lie strictly inside the clip")
    if not mean > median:
        raise ConfigError(f"{where}: a lognormal's mean exceeds its median")
    mu = float(np.log(median))

    def gap(sigma: float) -> float:
        return clipped_lognormal_mean(mu, sigma, lo, hi) - mean

    top = 6.0
    if gap(top) < 0.0:
        raise ConfigError(f"{where}: the mean is out of reach of a lognormal clipped there")
    return float(median), float(brentq(gap, 1e-9, top, xtol=1e-10))


class LengthStat(BaseModel):
    """One cited length statistic (tokens): what a domain's prompts or outputs look like."""

    model_config = STRICT

    mean: Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
    median: Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
    min: Annotated[int, Field(ge=1)]
    max: Annotated[int, Field(ge=1)]
    source: str  # where the figures come from

    @field_validator("source")
    @classmethod
    def _named(cls, source: str) -> str:
        if not source.strip():
            raise ValueError("must name where the figures come from")
        return " ".join(source.split())

    def fit(self) -> tuple[float, float]:
        """Return the (median, sigma) of the clipped lognormal with this mean and median."""
        return fit_clipped_lognormal(self.mean, self.median, self.min, self.max)


def load_length_stats(path: Path | str = LENGTHS_FILE) -> dict[str, dict[str, LengthStat]]:
    """Read the cited length statistics, `{domain: {"prompt" | "output": LengthStat}}`.

    Raises ConfigError naming the file and the key for a missing or malformed entry.
    """
    data = read_yaml_mapping(path, "lengths")
    domains = data.get("domains")
    if not isinstance(domains, Mapping) or not domains:
        raise ConfigError(f"{path}: 'domains' must be a non-empty mapping")
    out: dict[str, dict[str, LengthStat]] = {}
    for name, parts in domains.items():
        if not isinstance(parts, Mapping) or set(parts) != {"prompt", "output"}:
            raise ConfigError(f"{path}: domains.{name} must have exactly 'prompt' and 'output'")
        out[str(name)] = {}
        for part, fields in parts.items():
            where = f"domains.{name}.{part}"
            if not isinstance(fields, Mapping):
                raise ConfigError(f"{path}: {where} must be a mapping")
            try:
                out[str(name)][str(part)] = LengthStat.model_validate(fields)
            except ValidationError as exc:
                lines = validation_problems(exc, fields, prefix=where + ".")
                raise ConfigError(f"{path}: " + "; ".join(lines)) from None
    return out


LENGTH_STATS = load_length_stats()


def preset_lengths(stat: LengthStat) -> tuple[float, float, int, int]:
    """Return the (median, sigma, min, max) a preset draws with for a cited statistic."""
    median, sigma = stat.fit()
    return median, round(sigma, 6), stat.min, stat.max  # rounded: the card shows what is drawn
