"""The simulator's invariants (docs/design.md §4), checked on a finished run's records.

Each check returns the violations it found as strings that start with the invariant's
number; `check_run` runs them all. Under `--check` the engine also checks INV-1 step by
step against the trace (not against the kernel that replayed it) and B (INV-2); a
policy's ℓ is checked every step, check or not (`sparksim.sim.step_checks`). INV-5 is checked by
running a scenario twice (`sparksim run --check`), and INV-8 by the policies' own
property tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparksim.errors import SparksimError

if TYPE_CHECKING:
    import pandas as pd


class InvariantError(SparksimError):
    """A run broke one of the numbered invariants."""


def inv1_tokens(requests: pd.DataFrame, steps: pd.DataFrame | None) -> list[str]:
    """INV-1: each step emits Σ(min(ℓ, accepted) + 1), cut at the output length; totals match."""
    out = []
    bad = requests["emitted_tokens"] != requests["output_tokens"]
    if bad.any():
        r = requests[bad].iloc[0]
        out.append(f"INV-1: request {r.request_id} emitted {r.emitted_tokens} of {r.output_tokens} tokens")
    # every decode step emits accepted + 1; the prefill emits the first token
    bal = requests["output_tokens"] - 1 - requests["decode_steps"] - requests["accepted_drafts"]
    if (bal != 0).any():
        r = requests[bal != 0].iloc[0]
        out.append(
            f"INV-1: request {r.request_id}: output {r.output_tokens} != 1 + steps "
            f"{r.decode_steps} + accepted {r.accepted_drafts}"
        )
    if steps is not None and len(steps):
        # a step's accepted drafts are the trace's, Σ min(ℓ, accepted), before the output-length
        # cut: each request emits one token and at most its accepted drafts on top
        bad_s = ((steps["emitted_tokens"] > steps["num_requests"] + steps["accepted_drafts"])
                 | (steps["emitted_tokens"] < steps["num_requests"]))
        if bad_s.any():
            s = steps[bad_s].iloc[0]
            out.append(f"INV-1: step {s.step} of replica {s.replica} emitted {s.emitted_tokens} tokens "
                       f"for {s.num_requests} requests and {s.accepted_drafts} accepted drafts")
        if (steps["accepted_drafts"] > steps["verified_drafts"]).any():
            out.append("INV-1: a step accepted more drafts than it verified")
    return out


def inv2_bounds(steps: pd.DataFrame | None, gamma: int, max_tokens: int) -> list[str]:
    """INV-2: 0 ≤ ℓ_r ≤ γ (in aggregate here; per request in the engine) and B ≤ the token limit.

    One exemption, by design: a prefill-first engine runs a prompt longer than the limit
    alone, in a prompt-only step (vLLM V0 and DistServe do; a prompt-only step over the limit
    holds exactly one prompt, since a second is taken only while it fits).
    """
    if steps is None or not len(steps):
        return []
    out = []
    if (steps["verified_drafts"] > steps["num_requests"] * gamma).any() or (steps["verified_drafts"] < 0).any():
        out.append("INV-2: a step verified more than γ drafts per request (or fewer than 0)")
    alone = (steps["num_requests"] == 0) & (steps["prefill_tokens"] == steps["batch_tokens"])
    over = (steps["batch_tokens"] > max_tokens) & ~alone
    if over.any():
        s = steps[over].iloc[0]
        out.append(f"INV-2: step {s.step} of replica {s.replica} sent B={s.batch_tokens} > {max_tokens}")
    return out


def inv3_clock(steps: pd.DataFrame | None) -> list[str]:
    """INV-3: the clock never runs backwards: each replica's steps start after the last one ends."""
    if steps is None or not len(steps):
        return []
    out = []
    for rep, grp in steps.groupby("replica", sort=True):
        start = grp["start_at"].to_numpy()
        end = start + grp["step_s"].to_numpy()
        if (grp["step_s"].to_numpy() < 0).any() or (start[1:] < end[:-1] - 1e-12).any():
            out.append(f"INV-3: replica {rep}: a step starts before the previous one ends")
    return out


def inv4_causality(requests: pd.DataFrame) -> list[str]:
    """INV-4: arrival ≤ first token ≤ finish for every finished request."""
    bad = ~((requests["arrival_at"] <= requests["first_token_at"])
            & (requests["first_token_at"] <= requests["finish_at"]))
    if bad.any():
        r = requests[bad].iloc[0]
        return [f"INV-4: request {r.request_id}: arrival {r.arrival_at}, first token "
                f"{r.first_token_at}, finish {r.finish_at}"]
    return []


def inv6_feature_off(steps: pd.DataFrame | None, requests: pd.DataFrame) -> list[str]:
    """INV-6: plain decoding (static γ=0): no drafts, no draft cost, one token per request-step."""
    out = []
    if steps is not None and len(steps):
        if (steps["verified_drafts"] != 0).any() or (steps["draft_s"] != 0).any():
            out.append("INV-6: static γ=0 verified drafts or paid draft cost")
        if (steps["emitted_tokens"] != steps["num_requests"]).any():
            out.append("INV-6: static γ=0 emitted more than one token per request-step")
    if (requests["decode_steps"] != requests["output_tokens"] - 1).any():
        out.append("INV-6: static γ=0 took other than output-1 decode steps")
    return out


def inv7_conservation(census: dict[str, int]) -> list[str]:
    """INV-7: every arrival is finished, running, queued or prefilling at the horizon."""
    held = census["finished"] + census["running"] + census["queued"] + census["prefill_pool"]
    if held != census["arrived"]:
        return [f"INV-7: {census['arrived']} arrived but {held} accounted for ({census})"]
    return []


def check_run(
    requests: pd.DataFrame,
    steps: pd.DataFrame | None,
    census: dict[str, int],
    *,
    gamma: int,
    max_tokens: int,
    plain_decoding: bool,
) -> list[str]:
    """Run every record-level invariant; return all violations (empty when the run is sound)."""
    out = inv1_tokens(requests, steps)
    out += inv2_bounds(steps, gamma, max_tokens)
    out += inv3_clock(steps)
    out += inv4_causality(requests)
    if plain_decoding:
        out += inv6_feature_off(steps, requests)
    out += inv7_conservation(census)
    return out
