"""Trace-set statistics measured the way DeepSpec's eval measures them: full-block rounds.

A full-block walk starts each request at pos 0; a round at pos t yields accepted[t] + 1
tokens and moves to t + accepted[t] + 1, until it passes the request's last position. As
real decoding does, the last round is cut at the response's end: a request of L tokens
whose last round starts at t yields min(accepted[t] + 1, L − t) tokens there, so a
request's rounds yield exactly its L tokens. The accepted length of a domain is the tokens
its rounds yield over its number of rounds (bonus included; the paper's Table 1 metric),
and the conditional acceptance at block position k is P(accepted ≥ k | accepted ≥ k − 1)
over those rounds' recorded `accepted` (Fig. 2 of the DSpark paper).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sparksim.traces.format import TraceSet


def walk_rows(offsets: NDArray[np.int64], accepted: NDArray[np.integer[Any]], start: int = 0
              ) -> NDArray[np.int64]:
    """Return the flat row indices a full-block walk visits, request by request, in order.

    `offsets` (R + 1,) delimits each request's rows; `accepted` (N,) holds the leading drafts
    accepted at each row when all γ were verified. The walk starts at each request's pos
    `start` (1 on an imported set, whose pos 0 is the prefill's token, not a round).
    """
    acc = np.asarray(accepted, dtype=np.int64)
    row = offsets[:-1].astype(np.int64) + start  # (R,) current row of each request
    end = offsets[1:].astype(np.int64)
    # One iteration advances every live request by one round, so the loop runs max-rounds
    # times over arrays of R entries rather than once per round in Python.
    live = np.flatnonzero(row < end)
    who: list[NDArray[np.int64]] = []
    where: list[NDArray[np.int64]] = []
    while live.size:
        here = row[live]
        who.append(live)
        where.append(here)
        row[live] = here + acc[here] + 1
        live = live[row[live] < end[live]]
    if not who:
        return np.zeros(0, dtype=np.int64)
    # A stable sort by request restores request-by-request order with rounds in time order.
    order = np.argsort(np.concatenate(who), kind="stable")
    return np.concatenate(where)[order]


def walk_totals(offsets: NDArray[np.int64], accepted: NDArray[np.integer[Any]]) -> tuple[int, int]:
    """Return (rounds, tokens) of a full-block walk over every request: `walk_rows` without the rows.

    Each request's last round is cut at its end, so `tokens` is the requests' total length.
    """
    acc = np.asarray(accepted, dtype=np.int64)
    row = offsets[:-1].astype(np.int64).copy()
    end = offsets[1:].astype(np.int64)
    live = np.flatnonzero(row < end)
    rounds = 0
    while live.size:
        here = row[live]
        rounds += int(here.size)
        row[live] = here + acc[here] + 1
        live = live[row[live] < end[live]]
    return rounds, int((end - offsets[:-1]).sum())


def round_tokens(
    offsets: NDArray[np.int64], accepted: NDArray[np.integer[Any]], rows: NDArray[np.int64]
) -> NDArray[np.int64]:
    """Return the tokens each walked row yields, min(accepted + 1, tokens left), shape like `rows`.

    `rows` are flat row indices from `walk_rows`; a row's request is found from `offsets`.
    """
    request = np.searchsorted(offsets, rows, side="right") - 1  # (n,)
    left = offsets[request + 1] - rows  # (n,) tokens from this row to the response's end
    return np.minimum(np.asarray(accepted, dtype=np.int64)[rows] + 1, left)


def accepted_length(accepted_rounds: NDArray[np.integer[Any]]) -> float:
    """Return the mean of accepted + 1 over the given rounds, none of them cut (NaN for no rounds)."""
    if accepted_rounds.size == 0:
        return float("nan")
    return float(np.mean(accepted_rounds.astype(np.float64)) + 1.0)


def conditional_acceptance(accepted_rounds: NDArray[np.integer[Any]], gamma: int) -> NDArray[np.float64]:
    """Return P(accepted ≥ k | accepted ≥ k − 1) for k = 1..γ over the given rounds, shape (γ,).

    A position no round reached is NaN.
    """
    counts = np.bincount(np.asarray(accepted_rounds, dtype=np.int64), minlength=gamma + 1)
    reached = counts[::-1].cumsum()[::-1].astype(np.float64)  # reached[k] = #rounds with accepted ≥ k
    with np.errstate(invalid="ignore", divide="ignore"):
        return reached[1 : gamma + 1] / reached[:gamma]


def predicted_conditional(
    conf_rounds: NDArray[np.floating[Any]], accepted_rounds: NDArray[np.integer[Any]]
) -> NDArray[np.float64]:
    """Return the mean conf at position k over the rounds that reached k (accepted ≥ k − 1), shape (γ,).

    Set beside `conditional_acceptance`, this is a reliability check of the confidences.
    """
    gamma = conf_rounds.shape[1]
    reached = np.asarray(accepted_rounds)[:, None] >= np.arange(gamma)[None, :]  # (n, γ)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (np.where(reached, conf_rounds, 0.0).sum(axis=0) / reached.sum(axis=0)).astype(np.float64)


def expected_calibration_error(
    conf_rounds: NDArray[np.floating[Any]], accepted_rounds: NDArray[np.integer[Any]], bins: int = 10
) -> NDArray[np.float64]:
    """Return the per-position ECE of conditional confidences over the rounds that reached k, shape (γ,).

    At position k the label is accepted ≥ k among rounds with accepted ≥ k − 1; equal-width bins.
    """
    gamma = conf_rounds.shape[1]
    acc = np.asarray(accepted_rounds)
    out = np.full(gamma, np.nan)
    for k in range(gamma):
        mask = acc >= k
        if not mask.any():
            continue
        c = conf_rounds[mask, k].astype(np.float64)
        y = (acc[mask] >= k + 1).astype(np.float64)
        idx = np.minimum((c * bins).astype(np.int64), bins - 1)
        weight = np.bincount(idx, minlength=bins)
        gap = np.abs(np.bincount(idx, c, bins) - np.bincount(idx, y, bins))
        out[k] = float(gap.sum() / weight.sum())
    return out


@dataclass(frozen=True)
class DomainStats:
    """Full-block walk statistics of one domain of a trace set."""

    domain: str
    num_requests: int
    num_positions: int
    num_rounds: int
    accepted_length: float  # tokens per round, last round of each request cut at its end
    uncut_accepted_length: float  # mean accepted + 1 per round, last rounds not cut
    conditional: NDArray[np.float64]  # (γ,) P(accepted ≥ k | accepted ≥ k − 1)
    predicted: NDArray[np.float64]  # (γ,) mean conf over the rounds that reached k
    ece: NDArray[np.float64]  # (γ,) per-position ECE of conf
    ece_raw: NDArray[np.float64] | None  # (γ,) per-position ECE of conf_raw, if the set has it


def prefill_rows(ts: TraceSet) -> int:
    """Return 1 when the set's pos 0 is the prefill's token rather than a round (an imported set), else 0.

    `sparksim traces import` says so in the card (`observed_positions.rows.prefill`).
    """
    rows = (ts.card.get("observed_positions") or {}).get("rows") or {}
    return 1 if isinstance(rows, dict) and int(rows.get("prefill", 0) or 0) > 0 else 0


def domain_stats(ts: TraceSet) -> dict[str, DomainStats]:
    """Return full-block walk statistics for every domain of `ts`, keyed by domain.

    The walk starts at pos 0, or at pos 1 where pos 0 is the prefill's token (`prefill_rows`).
    """
    rows = walk_rows(ts.offsets, ts.accepted, prefill_rows(ts))
    tokens = round_tokens(ts.offsets, ts.accepted, rows)  # (n,) cut at each response's end
    row_request = np.repeat(np.arange(ts.num_requests), np.diff(ts.offsets))
    domain_of = ts.request_columns["domain"]
    out: dict[str, DomainStats] = {}
    for domain in ts.domains:
        idx = ts.requests_in(domain)
        mine = np.isin(row_request[rows], idx)
        sel = rows[mine]
        acc = ts.accepted[sel]
        out[domain] = DomainStats(
            domain=domain,
            num_requests=int(idx.size),
            num_positions=int((np.diff(ts.offsets)[domain_of == domain]).sum()),  # the prefill's too
            num_rounds=int(sel.size),
            accepted_length=float(tokens[mine].sum() / sel.size) if sel.size else float("nan"),
            uncut_accepted_length=accepted_length(acc),
            conditional=conditional_acceptance(acc, ts.gamma),
            predicted=predicted_conditional(ts.conf[sel], acc),
            ece=expected_calibration_error(ts.conf[sel], acc),
            ece_raw=(
                expected_calibration_error(ts.conf_raw[sel], acc) if ts.conf_raw is not None else None
            ),
        )
    return out
