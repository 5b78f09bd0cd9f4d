"""The round table every importer reads into, and its layout as one row per output position.

`expand` applies the remainder-of-the-round rule (see `sparksim.traces.importers`): row t
of a round that started at t is the round as observed, row t + j the rest of its block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from sparksim.errors import ConfigError


@dataclass
class RoundTable:
    """Verification rounds, request by request: request q's rounds are `offsets[q]:offsets[q+1]`.

    `conf` (M, γ) conditional confidences (0 where the source gave none), `proposal_len` the
    drafts verified, `accepted` the leading drafts accepted (a lower bound when censored),
    `ended` whether the round ended its response with an accepted EOS draft (it emits
    `accepted` tokens, no correction or bonus). `output_tokens` per request: 1 (the prefill)
    plus the tokens its rounds emitted, or less when a response was cut at a length cap.
    """

    source_ids: list[str]
    domains: list[str]
    prompt_tokens: NDArray[np.int64]
    output_tokens: NDArray[np.int64]
    offsets: NDArray[np.int64]
    round_index: NDArray[np.int64]  # (M,) the source's round number (deepspec: 0-based count)
    conf: NDArray[np.float64]
    conf_given: NDArray[np.int64]  # (M,) how many leading confidences the source gave
    proposal_len: NDArray[np.int64]
    accepted: NDArray[np.int64]
    ended: NDArray[np.bool_]
    conf_raw: NDArray[np.float64] | None = None
    info: dict[str, Any] = field(default_factory=dict)  # source-specific facts for the card

    @property
    def gamma(self) -> int:
        return int(self.conf.shape[1])

    @property
    def num_requests(self) -> int:
        return len(self.source_ids)

    @property
    def censored(self) -> NDArray[np.bool_]:
        return (self.accepted == self.proposal_len) & (self.proposal_len < self.gamma) & ~self.ended

    @property
    def emitted(self) -> NDArray[np.int64]:
        """Tokens each round emitted: its accepted drafts plus the correction or bonus token."""
        return self.accepted + 1 - self.ended.astype(np.int64)

    def truncated(self, gamma: int) -> RoundTable:
        """Return the rounds as a drafter drafting only the first `gamma` positions sees them.

        For statistics only: confidences beyond `gamma` are dropped and accepted counts
        capped at it. The position layout of an imported set comes from the recorded γ
        (`import_traces` truncates the expanded rows, as `TraceSet.truncated` does).
        """
        if not 1 <= gamma <= self.gamma:
            raise ConfigError(f"--gamma {gamma} must be in 1..{self.gamma} (the data's γ)")
        if gamma == self.gamma:
            return self
        return RoundTable(
            source_ids=self.source_ids, domains=self.domains, prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens, offsets=self.offsets, round_index=self.round_index,
            conf=self.conf[:, :gamma].copy(), conf_given=np.minimum(self.conf_given, gamma),
            proposal_len=np.minimum(self.proposal_len, gamma), accepted=np.minimum(self.accepted, gamma),
            # a round whose EOS draft lies past `gamma` accepts `gamma` and goes on with a bonus
            ended=self.ended & (self.accepted <= gamma),
            conf_raw=None if self.conf_raw is None else self.conf_raw[:, :gamma].copy(),
            info={**self.info, "truncated_from_gamma": self.gamma},
        )


@dataclass
class Expanded:
    """A round table expanded to one row per output position (the trace-set layout)."""

    requests: pd.DataFrame
    conf: NDArray[np.float32]
    accepted: NDArray[np.int8]
    conf_raw: NDArray[np.float32] | None
    round_pos: NDArray[np.int64]  # (M,) output position where each round started
    round_row: NDArray[np.int64]  # (M,) flat row of each round start in positions.parquet


def round_starts(table: RoundTable) -> NDArray[np.int64]:
    """Return the output position where each round started: 1, then + the tokens each emitted."""
    emitted = table.emitted
    counts = np.diff(table.offsets)
    excl = np.cumsum(emitted) - emitted  # tokens emitted before each round, over the whole table
    first = np.repeat(excl[table.offsets[:-1]], counts) if excl.size else excl
    return np.asarray(1 + excl - first, dtype=np.int64)


def expand(table: RoundTable) -> Expanded:
    """Lay the rounds out position by position with the remainder-of-the-round rule (module doc)."""
    g = table.gamma
    out = table.output_tokens
    req_of_round = np.repeat(np.arange(table.num_requests), np.diff(table.offsets))
    start = round_starts(table)
    # rows each round covers: its emitted tokens, the last round cut at the response's end
    span = np.minimum(table.emitted, out[req_of_round] - start)
    if (span < 1).any():
        raise AssertionError("a round starts past its response's end")  # the readers drop those
    req_first_row = np.concatenate([[0], np.cumsum(out)[:-1]]).astype(np.int64)
    n = int(out.sum())
    row_round = np.repeat(np.arange(span.size), span)
    j = np.arange(row_round.size) - np.repeat(np.cumsum(span) - span, span)
    dest = req_first_row[req_of_round][row_round] + start[row_round] + j
    idx = j[:, None] + np.arange(g)[None, :]
    inside = idx < g
    conf = np.zeros((n, g), dtype=np.float32)
    conf[dest] = np.where(inside, table.conf[row_round[:, None], np.minimum(idx, g - 1)], 0.0)
    conf_raw = None
    if table.conf_raw is not None:
        conf_raw = np.zeros((n, g), dtype=np.float32)
        conf_raw[dest] = np.where(inside, table.conf_raw[row_round[:, None], np.minimum(idx, g - 1)], 0.0)
    accepted = np.zeros(n, dtype=np.int8)
    accepted[dest] = (table.accepted[row_round] - j).astype(np.int8)
    covered = np.bincount(req_of_round, weights=span, minlength=table.num_requests)
    if not np.array_equal(covered + 1, out):
        raise AssertionError("the rounds do not cover their responses")
    ids = _request_ids(table.source_ids)
    requests = pd.DataFrame({
        "request_id": ids, "domain": table.domains,
        "prompt_tokens": table.prompt_tokens.astype(np.int64), "output_tokens": out.astype(np.int64),
    })
    return Expanded(requests, conf, accepted, conf_raw, start, req_first_row[req_of_round] + start)


def _request_ids(source_ids: Sequence[str]) -> NDArray[np.int64]:
    """Keep the ids when every one is a plain decimal integer (distinct, as written); else
    number the requests 0..R−1 (rounds.parquet keeps the source's ids beside them)."""
    if all(s.isascii() and s.isdigit() and len(s) < 18 and str(int(s)) == s for s in source_ids):
        return np.array([int(s) for s in source_ids], dtype=np.int64)
    return np.arange(len(source_ids), dtype=np.int64)
