"""The verification-policy interface: what a scheduler sees each step and what it returns.

A policy chooses ℓ_r ∈ {0..γ}, how many of request r's γ drafted tokens the target
verifies this step. The engine builds one `StepBatch` per step (a struct of arrays, no
per-request objects) and calls `Policy.decide`, which returns the lengths as an (R,)
integer array. The engine makes one policy instance per engine (replica), so instance
attributes are the per-engine memory a policy may keep across steps (the two-step policy
keeps survivals from earlier steps there).

Policies are pure NumPy: no SimPy, no clocks, no I/O. A test can build a `StepBatch`
by hand (`StepBatch.from_conf`) and call `decide` directly.
"""

from __future__ import annotations

import abc
import functools
from typing import Annotated, Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import Field, TypeAdapter, ValidationError

from sparksim.cost.pricing import StepCost
from sparksim.cost.profile import Profile
from sparksim.errors import ConfigError

Lengths = NDArray[np.int64]
_NO_TABLE = np.empty((0, 0))  # a batch built from arrays gathers nothing


class StepBatch:
    """Everything a policy may read when it decides one step's verification lengths.

    Treat it as read-only. The engine builds one per step from the trace set's rows
    (`from_rows`): the confidences and survivals are gathered from the trace tables the
    first time a policy reads them (a closed loop's batch of 256 scattered rows costs ~12 µs
    a step to gather, and `static` reads neither, `greedy` only the survivals).
    """

    __slots__ = ("_conf", "_conf_table", "_rows", "_survival", "_survival_table", "accepted", "cost",
                 "fixed_tokens", "max_tokens", "request_ids", "step_index")

    request_ids: NDArray[np.int64]  # (R,) engine-wide unique ids, stable across steps
    fixed_tokens: int  # tokens the step sends whatever is verified: R bonus slots + prefill chunks
    max_tokens: int  # the engine's token limit for B (fixed + verified)
    cost: StepCost
    step_index: int  # steps this engine has run before this one
    accepted: NDArray[np.int64] | None  # (R,) realised acceptances; only for reads_outcome

    def __init__(
        self, request_ids: NDArray[np.int64], conf: NDArray[np.float64], survival: NDArray[np.float64],
        fixed_tokens: int, max_tokens: int, cost: StepCost, step_index: int,
        accepted: NDArray[np.int64] | None = None,
    ) -> None:
        self._fill(request_ids, fixed_tokens, max_tokens, cost, step_index, accepted)
        self._conf: NDArray[np.float64] | None = conf
        self._survival: NDArray[np.float64] | None = survival
        self._rows: NDArray[np.int64] | None = None
        self._conf_table = self._survival_table = _NO_TABLE

    @classmethod
    def from_rows(
        cls, request_ids: NDArray[np.int64], rows: NDArray[np.int64], conf_table: NDArray[np.float64],
        survival_table: NDArray[np.float64], fixed_tokens: int, max_tokens: int, cost: StepCost,
        step_index: int, accepted: NDArray[np.int64] | None = None,
    ) -> StepBatch:
        """A batch whose request r is row `rows[r]` of the trace tables (N, γ); `rows` is kept, so
        pass a copy the caller will not change (the policy may read the batch after the step)."""
        batch = cls.__new__(cls)
        batch._fill(request_ids, fixed_tokens, max_tokens, cost, step_index, accepted)
        batch._conf = batch._survival = None
        batch._rows, batch._conf_table, batch._survival_table = rows, conf_table, survival_table
        return batch

    def _fill(self, request_ids: NDArray[np.int64], fixed_tokens: int, max_tokens: int, cost: StepCost,
              step_index: int, accepted: NDArray[np.int64] | None) -> None:
        self.request_ids, self.fixed_tokens, self.max_tokens = request_ids, fixed_tokens, max_tokens
        self.cost, self.step_index, self.accepted = cost, step_index, accepted

    @property
    def conf(self) -> NDArray[np.float64]:
        """(R, γ) fresh conditional confidences c_{r,j}."""
        if self._conf is None:
            self._conf = self._gather(self._conf_table)
        return self._conf

    @property
    def survival(self) -> NDArray[np.float64]:
        """(R, γ) a_{r,j} = ∏_{i≤j} c_{r,i}, non-increasing in j."""
        if self._survival is None:
            self._survival = self._gather(self._survival_table)
        return self._survival

    def _gather(self, table: NDArray[np.float64]) -> NDArray[np.float64]:
        """The batch's rows of a trace table (N, γ), for a batch built `from_rows`."""
        assert self._rows is not None
        return table.take(self._rows, axis=0)

    def replace(self, **changes: Any) -> StepBatch:
        """Return a copy with `changes` (any of the constructor's arguments) made."""
        args = {"request_ids": self.request_ids, "conf": self.conf, "survival": self.survival,
                "fixed_tokens": self.fixed_tokens, "max_tokens": self.max_tokens, "cost": self.cost,
                "step_index": self.step_index, "accepted": self.accepted}
        return StepBatch(**{**args, **changes})

    @property
    def num_requests(self) -> int:
        return int(self.request_ids.shape[0])

    @property
    def gamma(self) -> int:
        if self._conf is None:  # without gathering rows: the table's width is γ
            return int(self._survival.shape[1] if self._survival is not None else self._conf_table.shape[1])
        return int(self._conf.shape[1])

    @classmethod
    def from_conf(
        cls,
        conf: ArrayLike,
        profile: Profile,
        *,
        request_ids: ArrayLike | None = None,
        extra_fixed_tokens: int = 0,
        max_tokens: int | None = None,
        draft_s: float = 0.0,
        kv_s: float = 0.0,
        step_index: int = 0,
        accepted: ArrayLike | None = None,
        cost: StepCost | None = None,
    ) -> StepBatch:
        """Build a batch from conditional confidences (R, γ); convenient in tests and notebooks.

        `cost` is the step's price (`StepCost.for_step`, as the engine builds it: its R +
        prompt tokens are the batch's fixed tokens); without it the step costs `draft_s +
        kv_s` plus the profile's dense table.
        """
        c = np.atleast_2d(np.asarray(conf, dtype=np.float64))
        r = c.shape[0]
        ids = np.arange(r, dtype=np.int64) if request_ids is None else np.asarray(request_ids, np.int64)
        if cost is None:
            cost = StepCost(profile=profile, draft_s=draft_s, context=0.0, kv_s=kv_s,
                            base_tokens=r + extra_fixed_tokens, requests=r)
        return cls(
            request_ids=ids,
            conf=c,
            survival=np.cumprod(c, axis=1, dtype=np.float64),
            fixed_tokens=cost.base_tokens,
            max_tokens=max_tokens if max_tokens is not None else 1 << 40,
            cost=cost,
            step_index=step_index,
            accepted=None if accepted is None else np.asarray(accepted, np.int64),
        )


class Policy(abc.ABC):
    """A verification scheduler. Subclasses set the class attributes and implement `decide`.

    Parameters arrive as keyword arguments to `__init__` (from `--set policy.NAME=VALUE`);
    a subclass validates them and raises `ConfigError` naming the parameter and value.
    """

    name: ClassVar[str]
    rule: ClassVar[str]  # one line, shown by `sparksim policies`
    lossless: ClassVar[bool]
    paper: ClassVar[str] = ""  # paper section or source
    upper_bound: ClassVar[bool] = False  # reads information no real engine has
    reads_outcome: ClassVar[bool] = False  # needs StepBatch.accepted (the oracle)
    # the target runs every request's whole block whatever ℓ commits (SGLang's cap-accept):
    # the engine prices γ per request and replays acceptance on ℓ
    pays_full_block: bool = False

    def __init__(self, block: int) -> None:
        if block < 0:
            raise ConfigError(f"block={block} must be >= 0")
        self.block = block  # γ of the drafter (the trace set's block)

    @property
    def drafts(self) -> bool:
        """Whether the engine runs the drafter (and pays draft_s) under this policy."""
        return self.draft_positions > 0

    @property
    def draft_positions(self) -> int:
        """Positions the policy needs drafted per request each step.

        Block policies need the whole block and choose how much of it to verify; a policy
        that only ever verifies a fixed prefix (static γ) needs just that prefix. What the
        engine pays also depends on the drafter: a block drafter drafts its whole block
        anyway (`drafted_positions`).
        """
        return self.block

    @property
    def params(self) -> dict[str, Any]:
        """The policy's parameters, as recorded in the run's summary."""
        return {}

    @abc.abstractmethod
    def decide(self, batch: StepBatch) -> Lengths:
        """Return ℓ, the number of drafts to verify for each request, shape (R,), 0 ≤ ℓ ≤ γ."""

    def drafts_at(self, requests: int) -> bool:
        """Whether the drafter runs this step, for a step of `requests` decode requests.

        Asked before the step is priced; the default drafts every step. A policy that
        sometimes verifies nothing by design (SGLang's adaptive step count at 0) says so
        here, and the step then costs no draft and asks it for no lengths.
        """
        del requests
        return True

    def positions_at(self, requests: int) -> int:
        """Positions a drafting step of `requests` decode requests drafts per request.

        Asked after `drafts_at`, before the step is priced, and only where the drafter is
        pass-based (mtp, autoregressive: one pass per position, stopped at what will be
        verified); a block drafter drafts its whole block. The default is `draft_positions`;
        a policy that fixes this step's ℓ from earlier steps alone (SGLang's adaptive step
        count) says how many here, 1..`draft_positions`, and verifies no more.
        """
        del requests
        return self.draft_positions

    def observe(self, batch: StepBatch, lengths: Lengths, num_accepted: NDArray[np.int64]) -> None:
        """Learn from a finished step: `num_accepted[r]` of the `lengths[r]` verified drafts passed.

        Called by the engine after every step; the default keeps nothing. Policies that
        estimate acceptance online (SmartSpec, Dynamic SD) update their estimates here.
        """
        del batch, lengths, num_accepted

    def label(self) -> str:
        """A legend label: the name, its parameters, and a mark when it is not lossless."""
        args = ",".join(f"{k}={v}" for k, v in self.params.items())
        tag = self.name + (f"({args})" if args else "")
        if self.upper_bound:
            tag += " [upper bound]"
        elif not self.lossless:
            tag += " [not lossless]"
        return tag


def drafted_positions(policy: Policy, profile: Profile, drafter: str | None, block: int) -> int:
    """Positions the drafter drafts per request each step under `policy` (what the step pays for).

    A block drafter (`kind: block`, DSpark/DFlash) drafts its whole block in one pass whatever
    the policy verifies: its positions attend to each other, so a shorter block is another
    drafter than the one trained and recorded. MTP and autoregressive drafters draft one
    position per pass and stop at what the policy can verify (`Policy.draft_positions`).
    """
    if not policy.drafts:
        return 0
    table = profile.drafter(drafter) if profile.drafters else None
    if table is not None and table.kind == "block":
        return max(block, policy.draft_positions)
    return policy.draft_positions


def check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """Validate an integer parameter in lo..hi (a string of digits is read, a bool is not).

    Raises ConfigError naming the parameter, its value and the reason.
    """
    if isinstance(value, np.integer):
        value = int(value)
    return int(_checked(name, value, Annotated[int, Field(ge=lo, le=hi)]))


def check_float(name: str, value: Any, lo: float, hi: float) -> float:
    """Validate a float parameter in [lo, hi]; raise ConfigError naming it and its value."""
    if isinstance(value, np.floating | np.integer):
        value = float(value)
    return float(_checked(name, value, Annotated[float, Field(ge=lo, le=hi, allow_inf_nan=False)]))


def check_bool(name: str, value: Any) -> bool:
    """Validate an on/off parameter: a bool, or the text true or false (any case), as a quoted
    YAML value or a Python caller may give it; anything else (a typo) raises ConfigError."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"policy parameter {name}={value!r}: true or false is needed")


@functools.cache
def _adapter(kind: Any) -> TypeAdapter[Any]:
    return TypeAdapter(kind)


def _checked(name: str, value: Any, kind: Any) -> Any:
    if isinstance(value, bool):  # pydantic's lax mode would read True as 1
        raise ConfigError(f"policy parameter {name}={value!r}: a number is needed, not a bool")
    try:
        return _adapter(kind).validate_python(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        # a value out of range shows as the number it was read as; one that is no number, as typed
        ranged = err["type"] in {"greater_than_equal", "less_than_equal"}
        shown = _adapter(kind.__origin__).validate_python(value) if ranged else repr(value)
        raise ConfigError(f"policy parameter {name}={shown}: {err['msg']}") from None
