"""Holds the scenario's sections: cluster, workload, policy, run and SLO, each a validated model.

Every field has a default, and its bounds and meaning sit beside it; an unknown key is an
error (`extra="forbid"`), except under `policy`, whose parameters the policy checks itself.
`sparksim.config` puts the sections together into a `Scenario` and reads scenario files.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparksim.hardware import GPU_MEMORY_UTILIZATION


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


class PrefillConfig(ConfigModel):
    """How prompts are prefilled: on a separate pool, or chunked into the decode steps."""

    mode: Literal["disaggregated", "colocated"] = "disaggregated"
    instances: int = Field(
        4, gt=0, description="disaggregated: prefill instances in the pool (not counted in tput_per_gpu)"
    )
    profile: str | None = Field(None, description="disaggregated: prefill profile (default: the decode profile)")
    kv_transfer_s: float = Field(0.002, ge=0, description="disaggregated: fixed KV-transfer delay per request")
    kv_transfer_tokens_per_s: float | None = Field(
        None, gt=0, description="disaggregated: extra transfer time = prompt tokens / this rate"
    )
    chunk_tokens: int = Field(2048, gt=0, description="colocated, chunked: most prompt tokens one step may prefill")
    schedule: Literal["chunked", "prefill-first"] = Field(
        "chunked",
        description="colocated: 'chunked' mixes prompt chunks into decode steps under the token "
        "budget (vLLM V1); 'prefill-first' runs waiting prompts whole in prompt-only iterations "
        "while the running requests wait (vLLM V0, DistServe's colocated mode)",
    )
    max_batch_tokens: int = Field(
        8192, gt=0, description="disaggregated: most prompt tokens one prefill batch carries (whole prompts, FCFS)"
    )


class PrefixCacheConfig(ConfigModel):
    """Automatic prefix caching (vLLM's): full blocks of shared prompt prefixes stay cached."""

    enabled: bool = Field(
        False, description="cache the full blocks of workload.prefix's shared prefixes in each replica's "
        "KV space (the disaggregated prefill pool's instances under disaggregated prefill)"
    )
    block_tokens: int = Field(16, gt=0, description="tokens per KV block, the unit a prefix is cached in "
                              "(vLLM's default block size)")


class ClusterConfig(ConfigModel):
    """Decode replicas, routing, capacity limits and the engine pipeline."""

    replicas: int = Field(1, gt=0)
    gpus_per_replica: int | None = Field(
        None, gt=0, description="GPUs per replica, for tput_per_gpu (None: the profile card's, else 1)"
    )
    router: Literal["round-robin", "least-outstanding"] = "round-robin"
    max_concurrency: int = Field(256, gt=0, description="running requests per replica")
    kv_capacity_tokens: Annotated[int, Field(gt=0)] | Literal["auto", "unlimited"] = Field(
        "auto",
        description="KV-cache slots per replica; 'auto': from the profile card's memory figures "
        "(unlimited when the card has none)",
    )
    gpu_memory_utilization: float = Field(
        GPU_MEMORY_UTILIZATION, gt=0, le=1,
        description="auto KV capacity: share of HBM the engine may use (vLLM's default)"
    )
    max_context_tokens: int | None = Field(
        None, gt=0,
        description="most KV tokens a step's decode requests may hold; the rest wait their turn "
        "(DistServe's decode cap); None: no cap",
    )
    max_batch_tokens: int = Field(8192, gt=0, description="token limit of one step (B cap)")
    prefill: PrefillConfig = Field(default_factory=PrefillConfig)
    prefix_cache: PrefixCacheConfig = Field(default_factory=PrefixCacheConfig)
    pipeline: Literal["zos", "sync"] = "zos"
    decision_s: float | Literal["measured", "profile"] = Field(
        0.0, description="sync: policy decision time per step, seconds, 'measured' (timed here) or "
        "'profile' (the profile card's cost_model.decision_ms per policy and request count)"
    )

    @model_validator(mode="after")
    def _decision(self) -> ClusterConfig:
        if isinstance(self.decision_s, float) and self.decision_s < 0:
            raise ValueError(f"decision_s={self.decision_s} must be >= 0")
        if self.pipeline == "zos" and self.decision_s != 0.0:
            raise ValueError(
                f"decision_s={self.decision_s!r} has no effect under pipeline=zos "
                "(scheduling overlaps the GPU); set cluster.pipeline=sync"
            )
        return self


class LengthDist(ConfigModel):
    """A lognormal length distribution, clipped to [min, max] tokens."""

    mu: float = Field(6.0, allow_inf_nan=False)
    sigma: float = Field(0.8, ge=0, allow_inf_nan=False)
    min: int = Field(1, gt=0)
    max: int = Field(8192, gt=0)

    @model_validator(mode="after")
    def _range(self) -> LengthDist:
        if self.min > self.max:
            raise ValueError(f"min={self.min} is larger than max={self.max}")
        return self


class LengthsConfig(ConfigModel):
    source: Literal["traces", "lognormal"] = "traces"
    prompt: LengthDist = Field(default_factory=lambda: LengthDist(mu=6.5, sigma=0.7, min=16, max=8192))
    output: LengthDist = Field(default_factory=lambda: LengthDist(mu=6.0, sigma=0.8, min=1, max=4096))


class PrefixConfig(ConfigModel):
    """Shared prompt prefixes (a system prompt per group), as vLLM's prefix benchmarks and
    inference-perf's shared_prefix declare them."""

    groups: int = Field(1, gt=0, description="prefix groups; each request joins one uniformly at random")
    tokens: int = Field(0, ge=0, description="shared prefix length, counted inside the prompt (a shorter "
                        "prompt shares its own length)")


class WorkloadConfig(ConfigModel):
    """Who sends requests, when, and with which lengths and domains."""

    kind: Literal["closed", "poisson", "gamma", "replay"] = "closed"
    concurrency: int = Field(64, gt=0, description="closed: number of users")
    think_time_s: float = Field(0.0, ge=0, description="closed: pause between a reply and the next request")
    rate: float = Field(10.0, gt=0, description="poisson/gamma: requests per second (whole cluster)")
    cv: float = Field(1.0, gt=0, description="gamma: coefficient of variation of inter-arrival times")
    burstiness: float | None = Field(
        None, gt=0, description="gamma, vLLM's form: shape parameter; cv = 1/sqrt(burstiness)"
    )
    arrivals_csv: str | None = Field(
        None, description="replay: CSV with arrival_s, prompt_tokens, output_tokens[, domain]"
        "[, prefix_group, prefix_tokens]"
    )
    lengths: LengthsConfig = Field(default_factory=LengthsConfig)
    prefix: PrefixConfig = Field(default_factory=PrefixConfig)
    mix: dict[str, float] = Field(
        default_factory=lambda: {"math": 0.39, "code": 0.39, "chat": 0.22},
        description="domain weights choosing which trace requests are drawn",
    )

    @model_validator(mode="after")
    def _check(self) -> WorkloadConfig:
        if self.kind == "replay" and not self.arrivals_csv:
            raise ValueError("workload.kind=replay needs workload.arrivals_csv")
        if self.burstiness is not None and self.cv != 1.0:
            raise ValueError(
                f"give either cv={self.cv} or burstiness={self.burstiness} (cv = 1/sqrt(burstiness)), not both"
            )
        if not self.mix:
            raise ValueError("workload.mix is empty")
        for dom, w in self.mix.items():
            if not (math.isfinite(w) and w >= 0):  # NaN fails every comparison; inf takes every request
                raise ValueError(f"workload.mix.{dom}={w} must be a finite number >= 0")
        if sum(self.mix.values()) <= 0:
            raise ValueError(f"workload.mix={self.mix} has no positive weight")
        return self


class PolicyConfig(BaseModel):
    """The verification policy's name and its parameters (checked by the policy)."""

    model_config = ConfigDict(extra="allow")
    name: str = "two-step"
    drafter: str | None = Field(
        None, description="drafter whose cost the engine pays: a name in the profile card's "
        "drafters (e.g. mtp-1 for MTP-γ); None: the profile's default drafter"
    )

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class RecordsConfig(ConfigModel):
    steps: bool = Field(True, description="keep the per-step table (held in memory, it grows with the steps)")
    # the tables are the same either way (the files byte for byte); only where they are held differs
    stream: Literal["auto"] | bool = Field(
        "auto", description="stream the tables to parquet a row group at a time: true, false, or auto "
        "(when the run writes a results folder, as `sparksim run` does)")


class RunConfig(ConfigModel):
    """How long to simulate and which window counts as steady state."""

    duration_s: float = Field(60.0, gt=0, description="simulated horizon, seconds")
    max_requests: int | None = Field(None, gt=0, description="open loop: stop arrivals after this many")
    warmup_s: float | None = Field(None, ge=0, description="excluded from steady state (default 10 % of horizon)")
    cooldown_s: float | None = Field(None, ge=0, description="excluded from steady state (default 10 % of horizon)")
    records: RecordsConfig = Field(default_factory=RecordsConfig)

    @property
    def warmup(self) -> float:
        return 0.1 * self.duration_s if self.warmup_s is None else self.warmup_s

    @property
    def cooldown(self) -> float:
        return 0.1 * self.duration_s if self.cooldown_s is None else self.cooldown_s


class SLOConfig(ConfigModel):
    """Service-level objectives for goodput; None disables a bound."""

    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2el_ms: float | None = Field(None, gt=0)
