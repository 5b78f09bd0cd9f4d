"""The one rule that prices an engine step: what the engine charges and what every policy optimises.

A step's time is a sum of terms (docs/profiles.md, docs/design.md §7.3 and §7.13), read
from the profile:

- draft: the drafter's table at (requests, drafted positions), plus its own KV read;
- dense: the target's linear layers on the step's B tokens (`verify.csv`, the CUDA-graph
  staircase; a prompt-only step uses `prefill.csv` when the profile has one);
- kv: the decode requests' KV read (`attention.csv`, by the batch's total context, or R ×
  the longest one where the engine pads attention) and each prompt chunk's causal attention
  against its prefix;
- attention: attention compute past the KV read (MLA on a GPU: max(read, FLOPs); a CPU
  engine pays both), by the step's queries: B − prompt tokens, or R × (1 + longest ℓ)
  where the engine pads every request to the longest verified block;
- drafts: what verifying any draft adds (rejection sampling), once per step;
- overhead: the engine loop's time before the step and a known (constant or profiled)
  decision time: fixed per step, but part of what a step costs in wall time, so Θ = τ /
  (step + overhead) is what a policy maximises.

`StepCost.for_step` fixes everything that does not depend on ℓ (who is in the batch, their
contexts, the prompt chunks, the drafter). The engine charges `StepCost.price(lengths)`; a
policy reads the same object's `step_s(B, longest)` for the lengths it considers, and the
path policies' cached tables are derived from it (`policies.path.CostTable`). A test holds
the two equal on every shipped profile (tests/test_one_price.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sparksim.config_sections import ClusterConfig
from sparksim.cost.profile import Profile


def known_decision_s(cluster: ClusterConfig, profile: Profile, policy: str, requests: int) -> float:
    """The decision time a drafting step of `requests` is known to take before its policy runs,
    which its price counts (`StepCost.overhead_s`): under `cluster.pipeline: sync`, the constant
    `cluster.decision_s` or the profile's figure for `policy` (`decision_s: profile`); none under
    zos, and none yet when it is `measured` (timed as it runs). One rule for both engines."""
    if cluster.pipeline != "sync":
        return 0.0
    if cluster.decision_s == "profile":
        return profile.decision_s(policy, requests)
    return cluster.decision_s if isinstance(cluster.decision_s, float) else 0.0


class StepPrice(NamedTuple):  # a tuple: made every step, and a frozen dataclass costs µs to build
    """One step's seconds, term by term (the engine's charge; `steps.parquet` records them)."""

    draft_s: float
    dense_s: float
    kv_s: float
    attention_s: float  # attention compute past the KV read
    drafts_s: float  # verifying any draft (rejection sampling)
    overhead_s: float  # the engine loop before the step and a known decision time

    @property
    def verify_s(self) -> float:
        """The target's forward: dense work, KV reads, attention compute and the drafts overhead."""
        return self.dense_s + self.kv_s + self.attention_s + self.drafts_s

    @property
    def total_s(self) -> float:
        """Wall time the step costs, overhead included: what Θ divides by."""
        return self.draft_s + self.verify_s + self.overhead_s


@dataclass(slots=True)  # not frozen: frozen __init__ costs ~3 µs a step; treat as read-only
class StepCost:
    """A step's price as a function of what its policy verifies, for one batch.

    Everything but the verified drafts is fixed when the batch is formed (`for_step`):
    step_s(B) = fixed_s + dense(B) + extra_s(B), where fixed_s = draft + kv + overhead and
    extra_s holds the terms that move with the verification (attention compute past the KV
    read, and the drafts overhead at the first verified draft). Build it with `for_step`;
    the fields are the rule's intermediate figures.
    """

    profile: Profile
    draft_s: float  # drafter cost for this step's requests and drafted positions (0: no drafting)
    context: float  # mean KV context per request, tokens (steps.parquet's context_mean; no term reads it)
    kv_s: float = 0.0  # KV reads of the batch and prompt-chunk attention, seconds
    attn_mem_s: float = 0.0  # of kv_s: the decode requests' KV read that attention FLOPs overlap (0: they add)
    attn_token_s: float = 0.0  # attention compute per decode query at this batch's contexts
    prefill_tokens: int = 0  # prompt tokens in the step (they do not query the decode KV)
    drafts_s: float = 0.0  # what verifying any draft adds to the step (rejection sampling; 0: nothing)
    base_tokens: int = 0  # the step's tokens when it verifies no draft: R + prompt tokens
    requests: int = 0  # R, the decode requests
    padded: bool = False  # attention queries padded to the longest verified block
    overhead_s: float = 0.0  # the engine loop before the step and a known decision time
    decision_s: float = 0.0  # of overhead_s, the decision time (a step that drafts nothing pays none)

    @classmethod
    def for_step(
        cls,
        profile: Profile,
        *,
        requests: int,
        kv_tokens: float,
        kv_longest: float = 0.0,
        chunks: Sequence[tuple[int, int]] = (),
        positions: int = 0,
        drafter: str | None = None,
        loop_s: float = 0.0,
        decision_s: float = 0.0,
    ) -> StepCost:
        """Fix a step's price for `requests` decode requests holding `kv_tokens` (the longest
        `kv_longest`), prompt `chunks` of (tokens, prefix), `positions` drafted per request by
        `drafter` (0: the drafter does not run), `loop_s` of the engine loop before it and
        `decision_s` of known decision time (`known_decision_s`)."""
        prefill_tokens = sum(t for t, _ in chunks) if chunks else 0  # most steps carry no prompt
        kv_s = attn_mem_s = attn_token_s = 0.0
        padded = profile.attention_kv_padded
        # an engine that pads attention to the batch's longest context pays for R times it
        kv_attn = requests * kv_longest if padded and requests else kv_tokens
        if requests:
            attn_mem_s = profile.attention_s(requests, kv_attn)
            kv_s = attn_mem_s
            coef_s = profile.attention_compute_coef_ms / 1e3  # per (query, KV token)
            attn_token_s = coef_s * kv_attn / requests if coef_s else 0.0
        if chunks:
            kv_s = profile.chunks_attention_s(chunks, kv_s)
        draft_s = drafts_s = 0.0
        if positions:
            draft_s = profile.draft_step_s(requests, positions, drafter, kv_attn)
            if profile.verify_drafts_ms != (0.0, 0.0):  # only where the card measured it: a call a step saved
                drafts_s = profile.verify_drafts_s(requests)
        return cls(
            profile, draft_s, kv_tokens / requests if requests else 0.0, kv_s,
            0.0 if profile.attention_compute_adds else attn_mem_s, attn_token_s, prefill_tokens,
            drafts_s, requests + prefill_tokens, requests, padded, loop_s + decision_s, decision_s,
        )

    @classmethod
    def for_decode(cls, profile: Profile, requests: int, kv_tokens: float, positions: int,
                   drafter: str | None, kv_longest: float = 0.0, loop_s: float = 0.0,
                   decision_s: float = 0.0) -> StepCost:
        """The price of a decode-only step (the live engine's and the exact bias lab's)."""
        return cls.for_step(profile, requests=requests, kv_tokens=kv_tokens, kv_longest=kv_longest,
                            positions=positions, drafter=drafter, loop_s=loop_s, decision_s=decision_s)

    # ---------------------------------------------------------------- the engine's charge

    def price(self, lengths: NDArray[np.int64], verified: int | None = None) -> StepPrice:
        """Return the step's seconds by term when it verifies `lengths` (R,) drafts (Σ `verified`)."""
        if verified is None:
            verified = int(lengths.sum()) if lengths.size else 0
        tokens = self.base_tokens + verified
        prof = self.profile
        dense_s = prof.verify_s_scalar(tokens) if self.requests else prof.prefill_dense_s(tokens)
        attention_s = 0.0
        if self.attn_token_s:  # `attention_excess_s` at one B, in Python floats (the same operations)
            if self.padded:  # every request padded to the longest verified block
                queries = self.requests * (1.0 + (int(lengths.max()) if verified else 0))
            else:
                queries = tokens - float(self.prefill_tokens)
            attention_s = max(self.attn_token_s * queries - self.attn_mem_s, 0.0)
        return StepPrice(self.draft_s, dense_s, self.kv_s, attention_s,
                         self.drafts_s if verified else 0.0, self.overhead_s)

    # ---------------------------------------------------------------- the policies' view

    @property
    def fixed_s(self) -> float:
        """The part of the step's time that no verification length changes: drafting, KV, overhead."""
        return self.draft_s + self.kv_s + self.overhead_s

    @property
    def varies(self) -> bool:
        """Whether the step pays more than fixed + dense(B): attention FLOPs or a drafts overhead."""
        return bool(self.attn_token_s or self.drafts_s)

    @property
    def shaped(self) -> bool:
        """Whether the price depends on the longest ℓ, not only on B (padded attention compute)."""
        return bool(self.padded and self.attn_token_s)

    def queries(self, tokens: ArrayLike, longest: ArrayLike | None = None) -> NDArray[np.float64]:
        """Return the attention queries of a step of `tokens` whose longest verified block is `longest`.

        Each decode request queries with its bonus slot and its verified drafts: B − prompt
        tokens in all. An engine that pads attention (`cost_model.attention_kv: padded`)
        pads every request to the longest block: R × (1 + longest), which a caller must
        then pass (`longest`; without it the tokens' count is used, exact for equal ℓ).
        """
        t = np.asarray(tokens, dtype=np.float64)
        if self.padded and longest is not None:
            return self.requests * (1.0 + np.asarray(longest, dtype=np.float64))
        return t - self.prefill_tokens

    def attention_excess_s(self, tokens: ArrayLike, longest: ArrayLike | None = None
                           ) -> NDArray[np.float64] | float:
        """Attention compute beyond the KV read at `tokens` batch tokens (0 while memory-bound).

        Decode attention costs max(KV read, FLOPs) on a GPU: GQA stays memory-bound, MLA's
        absorbed attention does not (docs/profiles.md). With `attn_mem_s` = 0 the FLOPs add.
        """
        if not self.attn_token_s:
            return 0.0
        return np.maximum(self.attn_token_s * self.queries(tokens, longest) - self.attn_mem_s, 0.0)

    def extra_s(self, tokens: ArrayLike, longest: ArrayLike | None = None) -> NDArray[np.float64] | float:
        """What a step of `tokens` pays beyond fixed + dense(B): attention compute past the KV
        read, and `drafts_s` once it verifies any draft (B past `base_tokens`)."""
        return with_drafts_s(self.attention_excess_s(tokens, longest), tokens, self.drafts_s, self.base_tokens)

    @property
    def scan_terms(self) -> tuple[float, float, float, float, float, int]:
        """(fixed_s, attn_token_s, attn_mem_s, prefill_tokens, drafts_s, base_tokens): what
        `kernels.priced_scan` needs to price B itself, where the price depends on B only."""
        return (self.fixed_s, self.attn_token_s, self.attn_mem_s, float(self.prefill_tokens),
                self.drafts_s, self.base_tokens)

    def step_s(self, tokens: ArrayLike, longest: ArrayLike | None = None) -> NDArray[np.float64]:
        """Return seconds per step (overhead included) for each total batch size in `tokens`.

        `longest` gives each batch's longest verified block where the price depends on it
        (`shaped`); the engine charges exactly this (`price(lengths).total_s`).
        """
        return self.fixed_s + self.profile.verify_s(tokens) + self.extra_s(tokens, longest)

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        return self.profile.captured_sizes


def with_drafts_s(excess_s: NDArray[np.float64] | float, tokens: ArrayLike, drafts_s: float,
                  base_tokens: int) -> NDArray[np.float64] | float:
    """Add the drafts overhead to `excess_s` at each of `tokens` that verifies a draft (B > base)."""
    if not drafts_s:
        return excess_s
    return excess_s + drafts_s * (np.asarray(tokens) > base_tokens).astype(np.float64)


def unpadded_extra_s(tokens: NDArray[np.int64], attn_token_s: float, attn_mem_s: float, prefill_tokens: float,
                     drafts_s: float, base_tokens: int) -> NDArray[np.float64] | float:
    """`StepCost.extra_s` where the price depends on B only (no padded attention), from its terms."""
    excess: NDArray[np.float64] | float = 0.0
    if attn_token_s:
        excess = np.maximum(attn_token_s * (tokens.astype(np.float64) - prefill_tokens) - attn_mem_s, 0.0)
    return with_drafts_s(excess, tokens, drafts_s, base_tokens)
