"""A profile's card.yaml: the keys sparksim reads, typed, with their ranges stated once.

A card carries free-form provenance (how the tables were made, sources, fits, caveats)
beside the figures the simulator reads: every model here allows unknown keys and types
only the keys sparksim reads. `parse_card` validates a card read with the safe loader
once, on load; each problem names the file, the key and the value
(`card.yaml: cost_model.attention_kv='both': Input should be 'sum' or 'padded'`).
docs/profiles.md §1 describes every key.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparksim.config import safe_load, validation_problems

Source = Literal["measured", "analytic", "calibrated", "published", "synthetic", "imported"]
DrafterKind = Literal["mtp", "block", "autoregressive"]
SOURCES: tuple[str, ...] = get_args(Source)
DRAFTER_KINDS: tuple[str, ...] = get_args(DrafterKind)

# a figure read from YAML: a number (True is not one), finite
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
Text = Annotated[str, Field(min_length=1)]
Count = Annotated[int, Field(ge=1, strict=True)]  # a whole number, not text, a bool or a float


class _Card(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)  # provenance rides along untyped


class LinearMs(_Card):
    """A fit a + b·R in milliseconds, R the step's (or the loop's) requests."""

    a_ms: NonNegative = Field(..., description="ms the step pays whatever its size")
    b_ms_per_request: NonNegative = Field(..., description="ms per request")


LoopFits = dict[Literal["plain", "drafting"], dict[Literal["decode", "prefill"], LinearMs]]


class CostModelCard(_Card):
    """`cost_model`: the terms that are not tables (docs/profiles.md §1)."""

    prefill_attention_ms_per_token_sq: NonNegative = Field(
        0.0, description="causal attention of a prompt chunk of q tokens after p: coef · ((p + q)² − p²) ms")
    attention_ms_per_query_kv_token: NonNegative = Field(
        0.0, description="decode attention FLOPs per (query token × KV token), ms; 0: memory-bound (GQA)")
    attention_kv: Literal["sum", "padded"] = Field(
        "sum", description="sum: a paged engine reads its requests' contexts; padded: R × the longest one")
    attention_compute: Literal["max", "sum"] = Field(
        "max", description="max: attention FLOPs overlap the KV read (a GPU); sum: they follow it (a CPU)")
    decision_ms: dict[str, LinearMs] | None = Field(
        None, description="per policy, what deciding costs a synchronous engine per step")
    verify_drafts_ms: LinearMs | None = Field(
        None, description="what a step adds once it verifies any draft (rejection sampling)")
    loop_ms: LoopFits | None = Field(
        None, min_length=1, description="{plain|drafting: {decode|prefill: fit}}: the engine loop before a step")


class MemoryCard(_Card):
    """`memory`: byte counts per replica (every GPU of it) that size the KV cache."""

    hbm_bytes: Positive = Field(..., description="HBM of the replica")
    weights_bytes: NonNegative = Field(..., description="the weights, the drafters' included")
    kv_bytes_per_token: Positive = Field(..., description="KV cache per token of context")
    activation_reserve_bytes: NonNegative = Field(0.0, description="held back for activations")

    @model_validator(mode="after")
    def _holds_the_weights(self) -> MemoryCard:
        # whether they fit at the scenario's cluster.gpu_memory_utilization is the run's check
        # (Profile.kv_capacity_tokens); a card is refused only when no utilisation could hold them
        if self.hbm_bytes <= self.weights_bytes + self.activation_reserve_bytes:
            raise ValueError(f"memory.hbm_bytes={self.hbm_bytes} cannot hold memory.weights_bytes="
                             f"{self.weights_bytes} + memory.activation_reserve_bytes={self.activation_reserve_bytes}")
        return self


class DrafterCard(_Card):
    """One entry of `drafters` (or the lone `drafter` of a `draft.csv`)."""

    name: str | None = Field(None, description="the lone drafter's name (`drafter:` only)")
    file: Text | None = Field(None, description="its table (default draft-NAME.csv)")
    kind: DrafterKind = Field(
        "block", description="block: drafts its whole block each step; mtp, autoregressive: one position a pass")
    layers: Count | None = Field(None, description="its layers (or `num_layers`)")
    num_layers: Count | None = None
    kv_ms_per_token: NonNegative = Field(
        0.0, description="ms to read its KV cache per context token, once a step (block) or a pass")


class CostCard(_Card):
    """The keys sparksim reads to price a step and size the KV cache; every one optional."""

    graph_capture_sizes: list[Count] | None = Field(
        None, description="CUDA-graph sizes: a batch inside them pads up to the next one "
                          "([]: no graphs, no batch pads; absent: every batch pads up)")
    gpus_per_replica: Count | None = Field(None, description="GPUs one replica occupies (default 1)")
    tokens_per_request: Count | None = Field(
        None, description="a legacy context grid's rows hold R = ceil(B / this) requests (default 8)")
    cost_model: CostModelCard = Field(default_factory=CostModelCard)
    memory: MemoryCard | None = None
    drafters: dict[str, DrafterCard] | None = Field(
        None, min_length=1, description="each drafter's description, by the name a scenario gives")
    default_drafter: str | None = Field(None, description="the drafter a policy pays for by default")
    drafter: DrafterCard | None = Field(None, description="describes a lone draft.csv")

    @field_validator("cost_model", mode="before")
    @classmethod
    def _absent(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("drafter", mode="before")
    @classmethod
    def _described(cls, value: Any) -> Any:
        return None if isinstance(value, str) else value  # a bare name (older cards) describes nothing

    @model_validator(mode="after")
    def _default_is_listed(self) -> CostCard:
        if self.drafters and self.default_drafter is not None and self.default_drafter not in self.drafters:
            raise ValueError(f"default_drafter={self.default_drafter!r} is not one of {sorted(self.drafters)}")
        return self


class ProfileCard(CostCard):
    """A card on disk: the cost keys plus the provenance every profile must carry."""

    source: Source = Field(..., description="how the tables were made")
    hardware: Text = Field(..., description="the machine it was made on, or for")
    model: Text = Field(..., description="the target model")
    dtype: Text = Field(..., description="its weights' dtype")
    date: datetime.date | Text = Field(..., description="when it was made")
    command: Text = Field(..., description="the exact command that remakes the folder")


CARD_REQUIRED: tuple[str, ...] = tuple(k for k, f in ProfileCard.model_fields.items() if f.is_required())


def parse_card(card: Any, problems: list[str]) -> CostCard | None:
    """Validate a card; append a problem for each bad key; return it typed (None if unusable).

    A card that fails only its provenance still returns its cost keys, so the tables it
    describes (the drafters' files) are checked too.
    """
    if not isinstance(card, dict):
        problems.append("card.yaml: must be a mapping of fields")
        return None
    try:
        return ProfileCard.model_validate(card)
    except ValidationError as exc:
        problems.extend(f"card.yaml: {line}" for line in validation_problems(exc, card))
    try:
        return CostCard.model_validate(card)
    except ValidationError:
        return None  # already reported


def check_card(card: Any, problems: list[str]) -> dict[str, Any]:
    """Append a problem for each missing or bad card field; return the card as a dict."""
    parse_card(card, problems)
    return card if isinstance(card, dict) else {}


def read_card(path: Path, problems: list[str]) -> Any:
    """Read a card.yaml with the safe loader; append a problem if it is missing, empty or not YAML."""
    if not path.is_file():
        problems.append("card.yaml: file is missing")
        return None
    try:
        card = safe_load(path.read_text())
    except yaml.YAMLError as exc:
        problems.append(f"card.yaml: not valid YAML ({exc})")
        return None
    if card is None:  # empty, or comments only: no field is given, so every required one is missing
        problems.append("card.yaml: is empty (it must be a mapping of the card's fields)")
    return card
