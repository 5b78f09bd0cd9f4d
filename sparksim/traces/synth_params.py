"""Holds a synthetic model's parameters: per domain (`DomainParams`) and per set (`SynthModel`).

Parameters are validated where they are built (a preset, a params YAML, a test); a params
YAML changes a model through `with_overrides`. The level of each domain is fitted to a
target accepted length at γ = `CALIBRATION_GAMMA`, the block size of the DSpark paper's
Table 1 (`TABLE1_SOURCE`); `sparksim.traces.synth` says what each parameter does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sparksim.config import read_yaml_mapping, validation_problems
from sparksim.errors import ConfigError

CALIBRATION_GAMMA = 7  # the block size of the paper's Table 1
TABLE1_SOURCE = (
    "DSpark paper (Cheng et al. 2026) Table 1, Qwen3-8B, temperature 1, block 7; domain means "
    "of math = GSM8K/MATH/AIME25, code = MBPP/HumanEval/LCB, chat = MT-Bench/Alpaca/Arena-Hard"
)
# Bound on requests × (output_max + γ) per domain: the padded latent is that many float64s.
MAX_CELLS = 30_000_000


# Parameters are validated by pydantic where they are built (a preset, a params YAML, a
# test): a number must be a finite int or float (not a bool, not a string), and each field's
# range is stated once, beside it.
STRICT = ConfigDict(frozen=True, extra="forbid", strict=True)
Finite = Annotated[float, Field(allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
AtLeastOne = Annotated[float, Field(ge=1.0, allow_inf_nan=False)]


class DomainParams(BaseModel):
    """Model parameters of one domain; logits are natural-log odds."""

    model_config = STRICT

    # accepted length (bonus incl.) at γ = 7 the level is fitted to; in (1, γ + 1)
    target_accept_len: Annotated[float, Field(gt=1.0, lt=CALIBRATION_GAMMA + 1)] | None
    level: Finite | None = None  # logit of the position-1 conditional for an average token; None = fit
    slope: Finite = 0.0  # logit change per block position k → k + 1 (the Fig. 2 shape)
    difficulty_sd: NonNegative = 0.4  # sd of the per-request random effect b_r
    drift_sd: NonNegative = 0.5  # stationary sd of the AR(1) drift e_r over output tokens
    drift_rho: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9  # AR(1) coefficient per output token
    token_sd: NonNegative = 0.7  # sd of the per-token noise w_r
    prompt_median: AtLeastOne = 150.0  # prompt tokens: lognormal median
    prompt_sigma: NonNegative = 0.6  # prompt tokens: lognormal sigma
    prompt_min: Annotated[int, Field(ge=1)] = 1  # prompt tokens are clipped to [prompt_min, prompt_max]
    prompt_max: Annotated[int, Field(ge=1, le=1_000_000)] = 1_000_000
    output_median: AtLeastOne = 200.0  # output tokens: lognormal median
    output_sigma: NonNegative = 0.5  # output tokens: lognormal sigma
    output_min: Annotated[int, Field(ge=1)] = 16  # output tokens are clipped to [output_min, output_max]
    output_max: Annotated[int, Field(ge=1, le=100_000)] = 512

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.target_accept_len is None and self.level is None:
            raise ValueError("give target_accept_len or level (both are null)")
        for part in ("prompt", "output"):
            lo, hi = getattr(self, f"{part}_min"), getattr(self, f"{part}_max")
            if lo > hi:
                raise ValueError(f"{part}_min={lo} must not exceed {part}_max={hi}")
        return self


class SynthModel(BaseModel):
    """A drafter's synthetic model: one DomainParams per domain plus set-wide knobs."""

    model_config = STRICT

    name: str
    drafter: str
    target: str
    domains: Annotated[dict[Annotated[str, Field(min_length=1)], DomainParams], Field(min_length=1)]
    # conf_raw = σ(z / raw_temperature): over-confident before STS
    raw_temperature: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 0.7
    fit_requests: Annotated[int, Field(ge=1)] = 4000  # requests per domain the level is fitted on
    fit_seed: Annotated[int, Field(ge=0)] = 0  # seed of that sample, independent of the set's seed
    temperature: Annotated[float, Field(ge=0.0)] = 1.0  # sampling temperature the set stands for
    sources: tuple[str, ...] = ()  # where targets and shapes come from

    @model_validator(mode="after")
    def _fits_in_memory(self) -> Self:
        longest = max(d.output_max for d in self.domains.values())
        if self.fit_requests * (longest + CALIBRATION_GAMMA) > MAX_CELLS:
            raise ValueError(
                f"fit_requests={self.fit_requests} must be at most {MAX_CELLS} / "
                f"(output_max + {CALIBRATION_GAMMA}) with output_max={longest}"
            )
        return self


_MODEL_KNOBS = ("raw_temperature", "fit_requests", "fit_seed", "drafter")


def with_overrides(model: SynthModel, overrides: Mapping[str, Any], where: str = "params") -> SynthModel:
    """Return `model` with `overrides` applied (the shape of a params YAML), validated.

    `overrides` may set `raw_temperature`, `fit_requests`, `fit_seed`, `drafter` and
    `domains: {name: {field: value}}`. A domain not in `model` must give `target_accept_len`
    or `level`; its other fields take the DomainParams defaults. Raises ConfigError naming
    `where`, the key and the value of every problem.
    """
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"{where}: must be a mapping (got {type(overrides).__name__})")
    unknown = sorted(set(overrides) - {*_MODEL_KNOBS, "domains"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (allowed: {[*_MODEL_KNOBS, 'domains']})")
    raw_domains = overrides.get("domains", {}) or {}
    if not isinstance(raw_domains, Mapping):
        raise ConfigError(f"{where}: domains must be a mapping of domain name to fields")
    data = model.model_dump()
    data.update({k: overrides[k] for k in _MODEL_KNOBS if k in overrides})
    for name, fields in raw_domains.items():
        if not isinstance(fields, Mapping):
            raise ConfigError(f"{where}: domains.{name} must be a mapping of fields")
        base = data["domains"].get(name, {"target_accept_len": None})
        data["domains"][name] = {**base, **fields}
    try:
        return SynthModel.model_validate(data)
    except ValidationError as exc:
        lines = validation_problems(exc, data)
        raise ConfigError(f"{where}: {model.name}: " + "; ".join(lines)) from None


def load_params(path: Path | str) -> dict[str, Any]:
    """Read a params YAML with the safe loader; raise ConfigError naming the file if unreadable."""
    return read_yaml_mapping(path, "params")
