"""Import trace sets from per-round speculative-decoding logs (`sparksim traces import`).

Two sources:
- `deepspec`: the confidence dumps of DeepSpec's evaluator (`eval.py --confidence-dump-dir`,
  deepseek-ai/DeepSpec PR #63): `<dir>/<dataset>/confidence_records.jsonl`, one JSON object
  per verification round, `{"logits": [...], "labels": [...]}`. `logits` are the DSpark
  confidence head's logits of the round's drafts (conf = σ(logit): the conditional
  acceptance of draft k given drafts 1..k−1 accepted), `labels` the accept-prefix mask
  (1 for each leading accepted draft, then 0). The evaluator records a round only when it
  runs with `--confidence-threshold 0`, so every block is drafted and verified in full (γ =
  the drafter's block size); a record is shorter than γ only when the round accepted an EOS
  draft (the evaluator cuts the record after it, and the response ends there). Records
  carry no request id, round index, prompt length or domain: rounds of one response follow
  each other in generation order (batch size 1), responses follow each other, and ranks
  are concatenated. Response boundaries are therefore inferred (see `read_deepspec`).
- `rounds`: a plain per-round table, CSV or JSONL, with `request_id, round, proposal_len,
  accepted, conf_1..conf_γ` and optional `domain`, `prompt_tokens`.

A trace set needs a row at every output position, but a per-round log observes only the
positions where a round started. The rule used for the others ("remainder of the round"):

- The prefill emits position 0 and the first round starts at position 1 (as in DeepSpec,
  vLLM and SGLang, and as the simulator replays: decoding starts at position 1). Row 0
  holds conf 0 and accepted 0: no block was drafted there and the engine never reads it.
- A round starting at t with a drafts accepted emits a + 1 tokens (a for a round that
  ended with an accepted EOS draft), covering positions t..t+a. Row t is the round as
  observed. Row t + j (1 ≤ j ≤ a) is the rest of the same block: conf = the round's
  conf[j+1..γ] followed by j zeros, accepted = a − j. Nothing is invented about
  acceptance: a replay that verifies all drafts (the recorded schedule) visits only
  observed rows; a replay that verifies fewer lands inside a round and continues on the
  remainder of the recorded block, never past its recorded rejection. Exact at temperature
  0 for a drafter that keeps its block; for a drafter that drafts afresh it is a lower
  bound (a fresh block at t + j might run past the old rejection). The j trailing zeros
  say "never accepted", which is what the replay does there (accepted ≤ γ − j).
- Censoring: a round that verified proposal_len < γ drafts and accepted all of them tells
  only that full verification would accept at least proposal_len. It is stored as
  accepted = proposal_len (a lower bound), counted in the card and flagged in
  `rounds.parquet`. Confidences beyond proposal_len that the source does not give are
  stored as 0.

Beside the three files of the format, an imported set holds `rounds.parquet`: one row per
source round (request_id, round, pos, row, proposal_len, accepted, censored, ended,
emitted, conf_given), the explicit record of which rows were observed (`observed_rows`).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from numpy.typing import NDArray

from sparksim.atomic import atomic_dir
from sparksim.errors import ConfigError, FormatError
from sparksim.traces.format import MAX_GAMMA, MAX_POSITIONS, write_traceset

IMPORT_FORMATS = ("deepspec", "rounds")
ROUNDS_FILE = "rounds.parquet"
DEEPSPEC_RECORDS = "confidence_records.jsonl"
DEEPSPEC_PR = "https://github.com/deepseek-ai/DeepSpec/pull/63"
DEEPSPEC_MAX_NEW_TOKENS = 2048  # eval.py's default --max-new-tokens
DEEPSPEC_TEMPERATURE = 1.0  # eval.py's default --temperature
# eval.py's TASKS grouped as the DSpark paper's Table 1 groups them
DEEPSPEC_DOMAINS = {
    "gsm8k": "math", "math500": "math", "aime25": "math",
    "humaneval": "code", "mbpp": "code", "livecodebench": "code",
    "mt-bench": "chat", "alpaca": "chat", "arena-hard-v2": "chat",
}
ROUNDS_REQUIRED = ("request_id", "round", "proposal_len", "accepted")
ROUNDS_OPTIONAL = ("domain", "prompt_tokens")
MAX_PROBLEMS = 20

OBSERVED_RULE = (
    "observed: round starts only (the prefill emits pos 0; the first round starts at pos 1, "
    "each next one at the previous start + its emitted tokens). pos 0: conf 0, accepted 0 "
    "(no block was drafted; the engine starts decoding at pos 1). Inside a round that started "
    "at t with a accepted (rows t+1..t+a, not observed): the remainder of the same block, "
    "conf = conf[j+1..γ] then j zeros, accepted = a − j at row t+j. A replay verifying every "
    "draft visits only observed rows; one verifying fewer continues on the recorded block's "
    "remainder and never passes its recorded rejection (exact at temperature 0 for a drafter "
    "that keeps its block, a lower bound for one that drafts afresh). rounds.parquet lists "
    "the observed rows."
)
CENSOR_RULE = (
    "a round that verified proposal_len < γ drafts and accepted all of them is censored: full "
    "verification would accept at least proposal_len. Stored as accepted = proposal_len (a "
    "lower bound: the replay rejects draft proposal_len + 1); flagged in rounds.parquet. "
    "Confidences the source does not give (beyond proposal_len) are stored as 0."
)


# --------------------------------------------------------------------------- problems


class _Problems:
    """Collect problems with the place they were found; stop reading after MAX_PROBLEMS."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(f"{where}: {message}")
        elif len(self.items) == MAX_PROBLEMS:
            self.items.append(f"(stopped after {MAX_PROBLEMS} problems)")

    @property
    def full(self) -> bool:
        return len(self.items) > MAX_PROBLEMS

    def raise_if_any(self) -> None:
        if self.items:
            raise FormatError(self.path, self.items)


def _read_text(path: Path) -> str:
    try:
        size = path.stat().st_size
        # a round takes at least a few bytes, so this bounds the rounds a file can hold
        if size > 64 * MAX_POSITIONS:
            raise FormatError(path, [f"file is {size} bytes (limit {64 * MAX_POSITIONS})"])
        return path.read_text(encoding="utf-8-sig")  # a spreadsheet's byte-order mark is no column name
    except UnicodeDecodeError as exc:
        raise FormatError(path, [f"not UTF-8 text ({exc.reason} at byte {exc.start})"]) from None
    except OSError as exc:
        raise FormatError(path, [f"cannot read ({exc.strerror})"]) from None


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _as_int(value: Any) -> int | None:
    """Return `value` as an int if it is an integer (JSON int, integral float or digit string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value == int(value) else None
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                return None
            return int(f) if math.isfinite(f) and f == int(f) else None
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "")


def _sigmoid(x: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * x)), dtype=np.float64)  # stable for large |x|


# --------------------------------------------------------------------------- the round table


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


def observed_rows(path: Path | str) -> NDArray[np.bool_]:
    """Return a mask over an imported set's position rows: True where a round started (observed)."""
    path = Path(path)
    rounds = pq.read_table(path / ROUNDS_FILE, columns=["row"]).column("row").to_numpy()
    total = pq.read_metadata(path / "positions.parquet").num_rows
    mask = np.zeros(total, dtype=np.bool_)
    mask[rounds] = True
    return mask


# --------------------------------------------------------------------------- rounds tables


@dataclass
class _Parsed:
    """A valid round table, rounds grouped by request (first-appearance order), in round order."""

    columns: list[str]
    is_json: bool
    ids: list[str]  # per request
    domains: list[str | None]  # per request (None: not given)
    prompts: list[int | None]  # per request (None: not given)
    counts: NDArray[np.int64]  # rounds per request
    base: int  # the first round's number, 0 or 1
    round_index: NDArray[np.int64]
    proposal_len: NDArray[np.int64]
    accepted: NDArray[np.int64]
    conf: NDArray[np.float64]  # (M, γ), 0 where not given
    given: NDArray[np.int64]


def _conf_columns(columns: Sequence[str], where: str, problems: _Problems) -> int:
    """Return γ from the `conf_1..conf_γ` columns, checking they run without gaps."""
    ks = []
    for col in columns:
        if col.startswith("conf_"):
            k = _as_int(col[5:])
            if k is None or k < 1 or str(k) != col[5:]:
                problems.add(where, f"column {col!r} is not conf_<k> with k = 1, 2, …")
                continue
            ks.append(k)
    if not ks:
        problems.add(where, "missing columns conf_1..conf_γ (the γ conditional confidences of each round)")
        return 0
    gamma = max(ks)
    missing = sorted(set(range(1, gamma + 1)) - set(ks))
    if missing:
        problems.add(where, f"missing column conf_{missing[0]} (has conf_1..conf_{gamma} with gaps)")
    if gamma > MAX_GAMMA:
        problems.add(where, f"γ = {gamma} (conf_{gamma}) is more than {MAX_GAMMA}")
    return gamma


def _header(text: str, problems: _Problems) -> tuple[list[str], str, bool]:
    """Return (columns, where they were read, is JSONL) and check the required ones are there."""
    is_json = text.lstrip()[:1] == "{"
    columns: list[str] = []
    head = "line 1 (the header)"
    if is_json:
        for no, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    problems.add(f"line {no}", f"not valid JSON ({exc.msg})")
                    return [], head, is_json
                if isinstance(obj, dict):
                    columns, head = list(obj), f"line {no} (the first record's keys)"
                break
    else:
        columns = [h.strip() for h in next(csv.reader(io.StringIO(text)), [])]
    if not columns:
        problems.add("line 1", "no header or records (empty file, or a first record that is no JSON object?)")
        return [], head, is_json
    dup = next((c for c in columns if columns.count(c) > 1), None)
    if dup is not None:
        problems.add(head, f"column {dup!r} appears twice")
    for col in ROUNDS_REQUIRED:
        if col not in columns:
            problems.add(head, f"missing column {col!r} (has {columns})")
    return columns, head, is_json


def _fast_columns(text: str, columns: list[str], is_json: bool) -> dict[str, Any] | None:
    """Return the table's columns, lists for JSONL and trimmed arrow strings for CSV (None when
    a row is irregular: the line-by-line reader then says where)."""
    if is_json:
        lines = [line for line in text.splitlines() if line.strip()]
        try:
            recs = json.loads("[" + ",".join(lines) + "]")
        except json.JSONDecodeError:
            return None
        if len(recs) != len(lines) or not all(type(r) is dict for r in recs):
            return None
        # every record holds the first one's keys but the optional ones, and no others
        allowed = set(columns) | set(ROUNDS_OPTIONAL)
        need = set(columns) - set(ROUNDS_OPTIONAL)
        if not all(need <= r.keys() <= allowed for r in recs):
            return None
        present = set(columns) | {c for c in ROUNDS_OPTIONAL if any(c in r for r in recs)}
        return {c: [r.get(c) for r in recs] for c in present}
    import pyarrow.csv as pacsv

    try:
        table = pacsv.read_csv(
            io.BytesIO(text.encode("utf-8")),
            convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(columns, pa.string())),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.column_names != columns:
        return None
    return {c: pc.utf8_trim_whitespace(table.column(c).combine_chunks()) for c in columns}


def _fast_numbers(values: Any, is_json: bool, *, integer: bool) -> tuple[NDArray[np.float64], NDArray[np.bool_]] | None:
    """Return (values as floats, missing) for a column, or None if a value is not a number or missing."""
    if is_json:
        kinds = set(map(type, values))
        if not kinds <= ({int} if integer else {int, float, type(None)}):
            return None
        missing = np.fromiter((v is None for v in values), dtype=np.bool_, count=len(values))
        try:
            nums = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        except OverflowError:
            return None
    else:
        empty = pc.equal(values, "")
        missing = empty.to_numpy(zero_copy_only=False)
        try:
            cast = pc.cast(pc.if_else(empty, pa.scalar(None, pa.string()), values), pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        nums = cast.to_numpy(zero_copy_only=False)
    if (np.isnan(nums) & ~missing).any():  # a NaN written out is no missing value
        return None
    if integer and (missing.any() or (nums != np.round(nums)).any() or (nums < 0).any()
                    or (np.abs(nums) > 2**62).any()):
        return None
    return nums, missing


def _fast_rounds(text: str, columns: list[str], is_json: bool, gamma: int, domain: str | None) -> _Parsed | None:
    """Validate and group a round table with array operations; None if any row is not valid."""
    cols = _fast_columns(text, columns, is_json)
    if cols is None or len(cols["request_id"]) == 0:
        return None
    raw_ids = cols["request_id"] if is_json else cols["request_id"].to_pylist()
    if is_json and not set(map(type, raw_ids)) <= {int, str}:
        return None
    ids = [str(v).strip() for v in raw_ids]
    if not all(ids):
        return None
    ints = {}
    for col in ("round", "proposal_len", "accepted"):
        got = _fast_numbers(cols[col], is_json, integer=True)
        if got is None:
            return None
        ints[col] = got[0].astype(np.int64)
    rnd, plen, acc = ints["round"], ints["proposal_len"], ints["accepted"]
    if (plen > gamma).any() or (acc > plen).any():
        return None
    conf = np.zeros((len(ids), gamma), dtype=np.float64)
    present = np.zeros((len(ids), gamma), dtype=np.bool_)
    for k in range(gamma):
        got = _fast_numbers(cols[f"conf_{k + 1}"], is_json, integer=False)
        if got is None:
            return None
        nums, missing = got
        if ((nums < 0) | (nums > 1)).any() or (missing & (plen > k)).any():
            return None
        conf[:, k] = np.where(missing, 0.0, nums)
        present[:, k] = ~missing
    codes, uniques = pd.factorize(pd.Series(ids))
    counts = np.bincount(codes).astype(np.int64)
    order = np.argsort(codes, kind="stable")
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    base = int(rnd[0])
    within = np.arange(len(ids)) - np.repeat(first, counts)
    if base not in (0, 1) or not np.array_equal(rnd[order], base + within):
        return None
    doms: list[str | None] = [None] * len(counts)
    if "domain" in cols and domain is None:
        raw = cols["domain"] if is_json else cols["domain"].to_pylist()
        if not set(map(type, raw)) <= {str}:
            return None
        dom = np.char.strip(np.array(raw, dtype=str))
        if (dom == "").any():
            return None
        dom_sorted = dom[order]
        if (dom_sorted != np.repeat(dom_sorted[first], counts)).any():
            return None
        doms = [str(d) for d in dom_sorted[first]]
    prompts: list[int | None] = [None] * len(counts)
    if "prompt_tokens" in cols:
        raw = cols["prompt_tokens"]
        if is_json and not set(map(type, raw)) <= {int, type(None)}:
            return None
        if not is_json:
            got = _fast_numbers(raw, is_json, integer=False)
            if got is None:
                return None
            nums, missing = got
        else:
            missing = np.fromiter((v is None for v in raw), dtype=np.bool_, count=len(raw))
            try:
                nums = np.array([np.nan if v is None else v for v in raw], dtype=np.float64)
            except OverflowError:
                return None
        ok = missing | ((nums == np.round(nums)) & (nums >= 0))
        if not ok.all():
            return None
        per = pd.Series(nums).groupby(codes)
        if (per.nunique() > 1).any():
            return None
        prompts = [None if np.isnan(v) else int(v) for v in per.first().to_numpy()]
    given = np.cumprod(present, axis=1).sum(axis=1).astype(np.int64)
    return _Parsed(
        columns=columns, is_json=is_json, ids=[str(u) for u in uniques], domains=doms, prompts=prompts,
        counts=counts, base=base, round_index=rnd[order], proposal_len=plen[order], accepted=acc[order],
        conf=conf[order], given=given[order],
    )


def _slow_records(text: str, is_json: bool, columns: list[str], problems: _Problems) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line, record) one at a time, noting unreadable lines as problems."""
    if is_json:
        for no, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.add(f"line {no}", f"not valid JSON ({exc.msg})")
                continue
            if not isinstance(obj, dict):
                problems.add(f"line {no}", "must be a JSON object")
                continue
            yield no, obj
        return
    reader = csv.reader(io.StringIO(text))
    next(reader, None)
    for fields in reader:
        no = reader.line_num
        if not any(f.strip() for f in fields):
            continue
        if len(fields) != len(columns):
            problems.add(f"line {no}", f"has {len(fields)} fields, the header has {len(columns)}")
            continue
        yield no, dict(zip(columns, fields, strict=True))


def _slow_rounds(
    text: str, columns: list[str], is_json: bool, gamma: int, domain: str | None, problems: _Problems
) -> _Parsed:
    """Read a round table line by line, noting each problem with its line and column."""
    conf_keys = [f"conf_{k}" for k in range(1, gamma + 1)]
    order: dict[str, int] = {}  # source id -> request index, in first-appearance order
    rounds_of: list[list[int]] = []  # per request, its rounds (indices into the lists below)
    last_round: list[int] = []
    req_domain: list[tuple[str, int] | None] = []
    req_prompt: list[tuple[int, int] | None] = []
    base: int | None = None
    r_index: list[int] = []
    r_plen: list[int] = []
    r_acc: list[int] = []
    r_conf: list[list[float]] = []
    r_given: list[int] = []
    for no, rec in _slow_records(text, is_json, columns, problems):
        if problems.full:
            break
        where = f"line {no}"
        if is_json:
            keys = [k for k in rec if k.startswith("conf_")]
            if sorted(keys) != sorted(conf_keys):
                problems.add(where, f"has {len(keys)} confidences conf_k but the first record has "
                             f"conf_1..conf_{gamma} (mixed γ)")
                continue
            absent = [col for col in ROUNDS_REQUIRED if col not in rec]
            if absent:
                problems.add(where, f"missing key {absent[0]!r}")
                continue
        rid_raw = rec.get("request_id")
        if _missing(rid_raw) or isinstance(rid_raw, bool | list | dict | float):
            problems.add(f"{where}, column 'request_id'", f"{rid_raw!r} is not a request id")
            continue
        rid = str(rid_raw).strip()
        vals: dict[str, int] = {}
        for col in ("round", "proposal_len", "accepted"):
            v = _as_int(rec.get(col))
            if v is None or v < 0 or v > 2**62:
                problems.add(f"{where}, column {col!r}", f"{rec.get(col)!r} is not an integer ≥ 0")
                break
            vals[col] = v
        if len(vals) < 3:
            continue
        plen, acc, rnd = vals["proposal_len"], vals["accepted"], vals["round"]
        if plen > gamma:
            problems.add(f"{where}, column 'proposal_len'", f"{plen} > γ = {gamma} (the conf_k columns)")
            continue
        if acc > plen:
            problems.add(f"{where}, column 'accepted'", f"{acc} > proposal_len {plen}")
            continue
        conf: list[float] = []
        given = 0
        bad = False
        for k, key in enumerate(conf_keys, start=1):
            raw = rec.get(key)
            if _missing(raw):
                if k <= plen:
                    problems.add(f"{where}, column {key!r}", f"missing, but the round verified {plen} drafts")
                    bad = True
                    break
                conf.append(0.0)
                continue
            c = _as_float(raw)
            if c is None or not 0.0 <= c <= 1.0:  # NaN fails both comparisons
                problems.add(f"{where}, column {key!r}", f"{raw!r} is not a confidence in [0, 1]")
                bad = True
                break
            if given == k - 1:
                given = k
            conf.append(c)
        if bad:
            continue
        q = order.get(rid)
        if q is None:
            if base is None:
                if rnd not in (0, 1):
                    problems.add(f"{where}, column 'round'",
                                 f"request {rid} starts at round {rnd}; rounds must start at 0 or 1")
                    continue
                base = rnd
            if rnd != base:
                problems.add(f"{where}, column 'round'",
                             f"request {rid} starts at round {rnd}, not {base} like the first request "
                             "(a missing round leaves its positions unknown)")
                continue
            q = order[rid] = len(rounds_of)
            rounds_of.append([])
            last_round.append(rnd - 1)
            req_domain.append(None)
            req_prompt.append(None)
        if rnd != last_round[q] + 1:
            problems.add(f"{where}, column 'round'",
                         f"request {rid} has round {rnd} after round {last_round[q]} (rounds must "
                         "increase by 1 in file order; a missing round leaves its positions unknown)")
            continue
        if "domain" in columns and domain is None:
            d = rec.get("domain")
            if _missing(d) or not isinstance(d, str):
                problems.add(f"{where}, column 'domain'", f"{d!r} is not a domain name")
                continue
            seen = req_domain[q]
            if seen is not None and seen[0] != d.strip():
                problems.add(f"{where}, column 'domain'",
                             f"request {rid} has domain {d.strip()!r} but line {seen[1]} gave {seen[0]!r}")
                continue
            if seen is None:
                req_domain[q] = (d.strip(), no)
        p_raw = rec.get("prompt_tokens")
        if "prompt_tokens" in rec and not _missing(p_raw):
            p = _as_int(p_raw) if not (is_json and isinstance(p_raw, float | str)) else None
            if p is None or p < 0:
                problems.add(f"{where}, column 'prompt_tokens'", f"{p_raw!r} is not an integer ≥ 0")
                continue
            seenp = req_prompt[q]
            if seenp is not None and seenp[0] != p:
                problems.add(f"{where}, column 'prompt_tokens'",
                             f"request {rid} has prompt_tokens {p} but line {seenp[1]} gave {seenp[0]}")
                continue
            if seenp is None:
                req_prompt[q] = (p, no)
        last_round[q] = rnd
        rounds_of[q].append(len(r_plen))
        r_index.append(rnd)
        r_plen.append(plen)
        r_acc.append(acc)
        r_conf.append(conf)
        r_given.append(given)
        if len(r_plen) > MAX_POSITIONS:
            problems.add(where, f"more than {MAX_POSITIONS} rounds")
            break
    perm = np.array([i for rows in rounds_of for i in rows], dtype=np.int64)
    return _Parsed(
        columns=columns, is_json=is_json, ids=list(order),
        domains=[None if d is None else d[0] for d in req_domain],
        prompts=[None if p is None else p[0] for p in req_prompt],
        counts=np.array([len(rows) for rows in rounds_of], dtype=np.int64), base=base or 0,
        round_index=np.array(r_index, dtype=np.int64)[perm],
        proposal_len=np.array(r_plen, dtype=np.int64)[perm],
        accepted=np.array(r_acc, dtype=np.int64)[perm],
        conf=np.array(r_conf, dtype=np.float64).reshape(-1, gamma)[perm],
        given=np.array(r_given, dtype=np.int64)[perm],
    )


def read_rounds(
    path: Path | str, *, domain: str | None = None, prompt_tokens: int = 0, fast: bool = True
) -> RoundTable:
    """Read a per-round CSV or JSONL table; raise FormatError naming line and column of each problem.

    Rows of a request may interleave with other requests' rows, but its rounds must run in
    file order without gaps (0, 1, 2, … or 1, 2, 3, …: a missing round leaves its positions
    unknown). `domain` overrides the `domain` column (default "default" without one);
    `prompt_tokens` fills requests without a `prompt_tokens` value. A valid table is read
    with array operations; any irregular row sends the whole file through the line-by-line
    reader, which names every problem (`fast=False` uses it from the start).
    """
    path = Path(path)
    text = _read_text(path)
    problems = _Problems(path)
    columns, head, is_json = _header(text, problems)
    gamma = _conf_columns(columns, head, problems) if columns else 0
    problems.raise_if_any()
    parsed = _fast_rounds(text, columns, is_json, gamma, domain) if fast else None
    if parsed is None:
        parsed = _slow_rounds(text, columns, is_json, gamma, domain, problems)
        problems.raise_if_any()
    if not parsed.ids:
        raise FormatError(path, ["no rounds (only a header or blank lines?)"])
    if parsed.accepted.size > MAX_POSITIONS:
        raise FormatError(path, [f"more than {MAX_POSITIONS} rounds"])
    counts = parsed.counts
    req_of_round = np.repeat(np.arange(len(counts)), counts)
    output = 1 + np.bincount(req_of_round, weights=parsed.accepted + 1, minlength=len(counts)).astype(np.int64)
    total = int(output.sum())
    if total > MAX_POSITIONS:
        raise FormatError(path, [f"the rounds cover {total} output positions (limit {MAX_POSITIONS})"])
    known = {*ROUNDS_REQUIRED, *ROUNDS_OPTIONAL, *(f"conf_{k}" for k in range(1, gamma + 1))}
    return RoundTable(
        source_ids=parsed.ids,
        domains=[domain if domain is not None else (d if d is not None else "default") for d in parsed.domains],
        prompt_tokens=np.array([p if p is not None else prompt_tokens for p in parsed.prompts], dtype=np.int64),
        output_tokens=output, offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        round_index=parsed.round_index, conf=parsed.conf, conf_given=parsed.given,
        proposal_len=parsed.proposal_len, accepted=parsed.accepted,
        ended=np.zeros(parsed.accepted.size, dtype=np.bool_),
        info={
            "files": [{"path": str(path), "sha256": _sha256(text), "rounds": int(parsed.accepted.size),
                       "layout": "jsonl" if is_json else "csv"}],
            "round_base": parsed.base,
            "ignored_columns": [c for c in columns if c not in known],
            "domain_from": "--domain" if domain is not None else (
                "the domain column" if "domain" in columns else "none given: 'default'"),
            "prompt_tokens_from": ("the prompt_tokens column" if "prompt_tokens" in columns else
                                   f"none given: {prompt_tokens} (--prompt-tokens)"),
            "output_tokens_rule": "1 (the prefill token) + Σ (accepted + 1) over the request's rounds: "
                                  "every round is taken to end with a correction or bonus token",
        },
    )


# --------------------------------------------------------------------------- DeepSpec dumps


def deepspec_files(src: Path | str) -> list[tuple[str, Path]]:
    """Return (dataset, file) pairs for a `confidence_records.jsonl` file or a dump folder."""
    src = Path(src)
    if src.is_file():
        return [(src.parent.name or "default", src)]
    if src.is_dir():
        direct = src / DEEPSPEC_RECORDS
        if direct.is_file():
            return [(src.name, direct)]
        found = sorted(src.glob(f"*/{DEEPSPEC_RECORDS}"))
        if found:
            return [(f.parent.name, f) for f in found]
        raise ConfigError(f"{src}: no {DEEPSPEC_RECORDS} in it or in its subfolders "
                          "(eval.py --confidence-dump-dir writes <dir>/<dataset>/confidence_records.jsonl)")
    raise ConfigError(f"{src}: no such file or folder")


def read_calibration(path: Path | str, gamma: int) -> NDArray[np.float64]:
    """Read the STS temperatures of `scripts/fit_confidence_calibration.py` (DeepSpec PR #63)."""
    path = Path(path)
    try:
        payload = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise FormatError(path, [f"not valid JSON (line {exc.lineno}: {exc.msg})"]) from None
    temps = payload.get("temperatures") if isinstance(payload, dict) else None
    if not isinstance(temps, list):
        raise FormatError(path, ["missing key 'temperatures' (a list of γ positive numbers)"])
    vals = [_as_float(t) for t in temps]
    if len(vals) != gamma:
        raise FormatError(path, [f"key 'temperatures' has {len(vals)} values; the records' γ is {gamma}"])
    for k, t in enumerate(vals):
        if t is None or not (math.isfinite(t) and t > 0):
            raise FormatError(path, [f"key 'temperatures' value {k} is {temps[k]!r}, not a positive number"])
    return np.array(vals, dtype=np.float64)


@dataclass
class _Dump:
    """The records of one dump file: logits zero-padded to the longest record."""

    line: NDArray[np.int64]  # (M,) line of each record
    logits: NDArray[np.float64]  # (M, longest)
    given: NDArray[np.int64]  # (M,) entries of each record
    accepted: NDArray[np.int64]  # (M,) leading 1s of its labels


def _fast_dump(text: str) -> _Dump | None:
    """Parse and check a dump with arrow and array operations; None if any record is irregular."""
    import pyarrow.json as pajson

    lines = text.splitlines()
    numbered = np.flatnonzero([bool(line.strip()) for line in lines]) + 1
    if numbered.size == 0:
        return None
    schema = pa.schema([("logits", pa.list_(pa.float64())), ("labels", pa.list_(pa.int64()))])
    try:
        table = pajson.read_json(
            io.BytesIO(text.encode("utf-8")),
            parse_options=pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != numbered.size:
        return None
    logits = table.column("logits").combine_chunks()
    labels = table.column("labels").combine_chunks()
    if logits.null_count or labels.null_count:
        return None
    flat, flab = logits.flatten(), labels.flatten()
    if flat.null_count or flab.null_count:
        return None
    given = pc.list_value_length(logits).to_numpy(zero_copy_only=False).astype(np.int64)
    if (given == 0).any() or not np.array_equal(given, pc.list_value_length(labels).to_numpy(zero_copy_only=False)):
        return None
    values = flat.to_numpy(zero_copy_only=False)
    marks = flab.to_numpy(zero_copy_only=False)
    if not np.isfinite(values).all() or ((marks != 0) & (marks != 1)).any():
        return None
    width = int(given.max())
    filled = np.arange(width)[None, :] < given[:, None]
    mat = np.zeros((given.size, width), dtype=np.float64)
    mat[filled] = values
    lab = np.zeros((given.size, width), dtype=np.int64)
    lab[filled] = marks
    if (np.cumprod(lab, axis=1) != lab).any():  # an accept-prefix mask: 1s, then 0s
        return None
    return _Dump(numbered.astype(np.int64), mat, given, lab.sum(axis=1))


def _slow_dump(text: str, problems: _Problems) -> _Dump:
    """Read a dump line by line, noting each problem with its line and key."""
    lines: list[int] = []
    rows: list[list[float]] = []
    accs: list[int] = []
    for no, line in enumerate(text.splitlines(), start=1):
        if problems.full:
            break
        if not line.strip():
            continue
        where = f"line {no}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.add(where, f"not valid JSON ({exc.msg})")
            continue
        if not isinstance(rec, dict):
            problems.add(where, "must be a JSON object {\"logits\": [...], \"labels\": [...]}")
            continue
        if "logits" not in rec or "labels" not in rec:
            missing = [k for k in ("logits", "labels") if k not in rec]
            problems.add(where, f"missing key {missing[0]!r} (a record is {{\"logits\": [...], \"labels\": [...]}})")
            continue
        logits, labels = rec["logits"], rec["labels"]
        if not isinstance(logits, list) or not logits:
            problems.add(f"{where}, key 'logits'", "must be a non-empty list of numbers")
            continue
        if not isinstance(labels, list) or len(labels) != len(logits):
            got = len(labels) if isinstance(labels, list) else type(labels).__name__
            problems.add(f"{where}, key 'labels'", f"must be a list as long as 'logits' ({len(logits)}), got {got}")
            continue
        vals = [_as_float(v) if not isinstance(v, str) else None for v in logits]
        bad = next((k for k, v in enumerate(vals) if v is None or not math.isfinite(v)), None)
        if bad is not None:
            problems.add(f"{where}, key 'logits'", f"value {bad} is {logits[bad]!r}, not a finite number")
            continue
        labs = [v if type(v) is int else None for v in labels]
        bad = next((k for k, v in enumerate(labs) if v not in (0, 1)), None)
        if bad is not None:
            problems.add(f"{where}, key 'labels'", f"value {bad} is {labels[bad]!r}, not 0 or 1")
            continue
        acc = 0
        while acc < len(labs) and labs[acc] == 1:
            acc += 1
        if any(labs[acc:]):
            problems.add(f"{where}, key 'labels'", f"{labels} is not an accept-prefix mask (1s, then 0s)")
            continue
        lines.append(no)
        rows.append([float(v) for v in vals if v is not None])
        accs.append(acc)
        if len(lines) > MAX_POSITIONS:
            problems.add(where, f"more than {MAX_POSITIONS} records")
            break
    given = np.array([len(r) for r in rows], dtype=np.int64)
    mat = np.zeros((len(rows), int(given.max()) if rows else 0), dtype=np.float64)
    for i, r in enumerate(rows):
        mat[i, : len(r)] = r
    return _Dump(np.array(lines, dtype=np.int64), mat, given, np.array(accs, dtype=np.int64))


def _read_dump(path: Path, *, fast: bool = True) -> tuple[_Dump, str]:
    text = _read_text(path)
    dump = _fast_dump(text) if fast else None
    if dump is None:
        problems = _Problems(path)
        dump = _slow_dump(text, problems)
        problems.raise_if_any()
    if dump.given.size == 0:
        raise FormatError(path, ["no records (empty file?)"])
    if dump.given.size > MAX_POSITIONS:
        raise FormatError(path, [f"more than {MAX_POSITIONS} records"])
    return dump, text


def read_deepspec(
    src: Path | str, *, calibration: Path | str | None = None,
    max_new_tokens: int = DEEPSPEC_MAX_NEW_TOKENS, domain: str | None = None, prompt_tokens: int = 0,
    fast: bool = True,
) -> RoundTable:
    """Read DeepSpec confidence dumps (PR #63 format) into rounds, inferring response boundaries.

    γ is the longest record (the drafter's block size). A record shorter than γ must be a
    round that accepted an EOS draft (labels all 1); any other short record is an error
    (mixed γ). Records carry no response ids, so a response is taken to end
    - after a shorter record (its round accepted EOS: the evaluator cut the record there), or
    - when its next round would start past `max_new_tokens` (the evaluator's length cap;
      0 turns this off), the response then holding `max_new_tokens` tokens, or
    - at the end of a file.
    A response that ended with EOS as the correction or bonus token (or as draft γ) is not
    marked in the dump, so its rounds run on into the next response's: an imported request
    may join several responses. The card says how many requests each rule ended.
    """
    if max_new_tokens < 0:
        raise ConfigError(f"--max-new-tokens {max_new_tokens} must be ≥ 0 (0: unknown, no cap rule)")
    files = deepspec_files(src)
    per_file: list[tuple[str, Path, _Dump, str]] = []
    for dataset, path in files:
        dump, text = _read_dump(path, fast=fast)
        per_file.append((dataset, path, dump, text))
    gamma = max(int(d.given.max()) for _, _, d, _ in per_file)
    if gamma > MAX_GAMMA:
        raise ConfigError(f"γ = {gamma} (the longest record) is more than {MAX_GAMMA}")
    for _, path, dump, _ in per_file:
        problems = _Problems(path)
        for i in np.flatnonzero((dump.given < gamma) & (dump.accepted < dump.given))[:MAX_PROBLEMS]:
            problems.add(f"line {dump.line[i]}", f"{dump.given[i]} confidences but γ = {gamma} (the longest "
                         "record), and the round rejected a draft: only a round that accepted an EOS "
                         "draft is shorter than the block (mixed γ?)")
        problems.raise_if_any()
    temps = read_calibration(calibration, gamma) if calibration is not None else None

    ids: list[str] = []
    doms: list[str] = []
    datasets: list[str] = []
    outs: list[int] = []
    counts: list[int] = []
    keep: list[NDArray[np.bool_]] = []
    ends = {"eos_draft": 0, "max_new_tokens": 0, "end_of_file": 0}
    dropped = 0
    file_info = []
    for dataset, path, dump, text in per_file:
        dom = domain if domain is not None else DEEPSPEC_DOMAINS.get(dataset, dataset)
        kept = np.ones(dump.given.size, dtype=np.bool_)
        t, n = 1, 0  # the next round's start position, rounds kept in the current response
        last = dump.given.size - 1
        for i, (acc, size) in enumerate(zip(dump.accepted.tolist(), dump.given.tolist(), strict=True)):
            ended = size < gamma
            t_next = t + acc + (0 if ended else 1)
            capped = bool(max_new_tokens) and t_next > max_new_tokens
            if capped and t >= max_new_tokens:
                # eval.py runs a round while t ≤ max_new_tokens, then keeps max_new_tokens
                # tokens: a round starting at the cap adds none, so it has no row here
                kept[i] = False
                dropped += 1
                out_len = max_new_tokens
            else:
                n += 1
                out_len = min(t_next, max_new_tokens) if capped else t_next
            if ended or capped or i == last:
                if n:
                    ends["max_new_tokens" if capped else "eos_draft" if ended else "end_of_file"] += 1
                    ids.append(f"{dataset}:{len(ids)}")
                    doms.append(dom)
                    datasets.append(dataset)
                    outs.append(out_len)
                    counts.append(n)
                t, n = 1, 0
            else:
                t = t_next
        keep.append(kept)
        file_info.append({"path": str(path), "dataset": dataset, "domain": dom, "sha256": _sha256(text),
                          "records": int(dump.given.size)})
    total = int(sum(outs))
    if total > MAX_POSITIONS:
        raise ConfigError(f"the records cover {total} output positions (limit {MAX_POSITIONS})")
    logits = np.concatenate([np.pad(d.logits, ((0, 0), (0, gamma - d.logits.shape[1])))[k]
                             for (_, _, d, _), k in zip(per_file, keep, strict=True)])
    given = np.concatenate([d.given[k] for (_, _, d, _), k in zip(per_file, keep, strict=True)])
    acc_arr = np.concatenate([d.accepted[k] for (_, _, d, _), k in zip(per_file, keep, strict=True)])
    have = np.arange(gamma)[None, :] < given[:, None]
    raw = np.where(have, _sigmoid(logits), 0.0)
    conf = np.where(have, _sigmoid(logits / temps[None, :]), 0.0) if temps is not None else raw
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    m = int(given.size)
    round_index = np.arange(m, dtype=np.int64) - np.repeat(offsets[:-1], counts)
    return RoundTable(
        source_ids=ids, domains=doms, prompt_tokens=np.full(len(ids), prompt_tokens, dtype=np.int64),
        output_tokens=np.array(outs, dtype=np.int64), offsets=offsets, round_index=round_index,
        conf=conf, conf_given=given, proposal_len=given.copy(), accepted=acc_arr, ended=given < gamma,
        conf_raw=raw if temps is not None else None,
        info={
            "files": file_info,
            "datasets": datasets,
            "calibration": (
                {"method": "sts", "file": str(calibration), "temperatures": [float(x) for x in temps],
                 "applied": "conf = σ(logit / T_k); conf_raw = σ(logit)"}
                if temps is not None else
                {"method": "none", "applied": "conf = σ(logit) of the dumped logits: raw if eval.py ran "
                 "without --confidence-calibration-path (PR #63 asks for that when dumping; the records "
                 "do not say), so expect the head's overconfidence"}),
            "request_boundaries": {
                "rule": "records carry no response ids; a response ends after a record shorter than γ "
                        "(an accepted EOS draft), when its next round would start past "
                        "max_new_tokens, or at the end of a file. A response that ended with EOS as the "
                        "correction/bonus token (or as draft γ) is not marked, so its rounds run on into "
                        "the next response's: a request here may join several responses.",
                "max_new_tokens": max_new_tokens or None,
                "ended_by": ends,
            },
            "output_tokens_rule": "1 (the prefill token) + Σ over rounds of accepted + 1 (accepted for "
                                  "the round that accepted EOS), cut at max_new_tokens",
            "prompt_tokens_from": f"not in the dump: {prompt_tokens} (--prompt-tokens)",
            "dropped_rounds": dropped,
        },
    )


# --------------------------------------------------------------------------- summary and writing


def acceptance_by_domain(table: RoundTable) -> dict[str, Any]:
    """Per domain: requests, rounds, tokens per round (DeepSpec's accept_len), censored rounds,
    and by block position k the conditional acceptance P(acc ≥ k | acc ≥ k−1) with the mean
    conf of the same rounds, over the rounds that verified draft k (censored ones excluded)."""
    doms = np.array(table.domains)
    counts = np.diff(table.offsets)
    row_dom = np.repeat(doms, counts)
    g = table.gamma
    k = np.arange(1, g + 1)[None, :]
    out: dict[str, Any] = {}
    for dom in sorted(set(table.domains)):
        sel = row_dom == dom
        acc = table.accepted[sel][:, None]
        seen = (table.proposal_len[sel][:, None] >= k) & (acc >= k - 1)
        hit = seen & (acc >= k)
        n_seen = seen.sum(axis=0)
        given = seen & (table.conf_given[sel][:, None] >= k)
        with np.errstate(invalid="ignore", divide="ignore"):
            cond = hit.sum(axis=0) / n_seen
            mean_conf = np.where(given, table.conf[sel], 0.0).sum(axis=0) / given.sum(axis=0)
        out[dom] = {
            "requests": int((doms == dom).sum()),
            "rounds": int(sel.sum()),
            "accept_length": round(float(table.emitted[sel].mean()), 4),
            "censored_rounds": int(table.censored[sel].sum()),
            "conditional_acceptance": [None if not np.isfinite(v) else round(float(v), 4) for v in cond],
            "mean_conf": [None if not np.isfinite(v) else round(float(v), 4) for v in mean_conf],
        }
    return out


def import_command(
    fmt: str, src: Path | str, out: Path | str, *, gamma: int | None = None, name: str | None = None,
    note: str | None = None, domain: str | None = None, prompt_tokens: int | None = None,
    target: str | None = None, drafter: str | None = None, temperature: float | None = None,
    calibration: Path | str | None = None, max_new_tokens: int | None = None,
) -> str:
    """Return the `sparksim traces import` command line for these options."""
    import shlex

    parts = ["sparksim", "traces", "import", "--format", fmt, str(src), "--out", str(out)]
    opts: list[tuple[str, object | None]] = [
        ("--gamma", gamma), ("--name", name), ("--note", note), ("--domain", domain),
        ("--prompt-tokens", prompt_tokens), ("--target", target), ("--drafter", drafter),
        ("--temperature", temperature), ("--calibration", calibration), ("--max-new-tokens", max_new_tokens),
    ]
    for flag, value in opts:
        if value is not None:
            parts += [flag, str(value)]
    return " ".join(shlex.quote(p) for p in parts)


@dataclass
class ImportResult:
    path: Path
    table: RoundTable
    card: dict[str, Any]
    observed: int  # rows where a round started
    filled: int  # rows inside rounds (remainder rule)
    prefill: int  # pos-0 rows


def import_traces(
    fmt: str, src: Path | str, out: Path | str, *, gamma: int | None = None, name: str | None = None,
    note: str | None = None, domain: str | None = None, prompt_tokens: int | None = None,
    target: str | None = None, drafter: str | None = None, temperature: float | None = None,
    calibration: Path | str | None = None, max_new_tokens: int | None = None,
    command: str | None = None,
) -> ImportResult:
    """Read `src` in format `fmt`, expand its rounds and write a validated trace set at `out`."""
    if fmt not in IMPORT_FORMATS:
        raise ConfigError(f"--format {fmt!r} is not one of {list(IMPORT_FORMATS)}")
    if prompt_tokens is not None and prompt_tokens < 0:
        raise ConfigError(f"--prompt-tokens {prompt_tokens} must be ≥ 0")
    if temperature is not None and not temperature >= 0:
        raise ConfigError(f"--temperature {temperature} must be ≥ 0")
    out = Path(out)
    src = Path(src)
    assumed: list[str] = []
    if fmt == "deepspec":
        mnt = DEEPSPEC_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
        if max_new_tokens is None:
            assumed.append(f"max_new_tokens = {mnt} (eval.py's default; pass --max-new-tokens, 0 for unknown)")
        table = read_deepspec(src, calibration=calibration, max_new_tokens=mnt, domain=domain,
                              prompt_tokens=prompt_tokens or 0)
        temp: float | str = DEEPSPEC_TEMPERATURE if temperature is None else temperature
        if temperature is None:
            assumed.append(f"temperature = {DEEPSPEC_TEMPERATURE} (eval.py's default; the dump does not say)")
        source_format = {
            "format": "deepspec",
            "spec": f"DeepSpec eval.py --confidence-dump-dir ({DEEPSPEC_PR}): one JSON object per "
                    "verification round, {logits: confidence-head logits of the round's drafts, labels: "
                    "accept-prefix mask}; recorded with --confidence-threshold 0, so blocks are full",
        }
        default_drafter = "DSpark (DeepSpec eval; confidence head)"
        conf_meaning = ("σ(logit_k [/ T_k]) of the DSpark confidence head: the conditional acceptance of "
                        "draft k given drafts 1..k−1 accepted, from the realised drafts of each round")
    else:
        for flag, value in (("--calibration", calibration), ("--max-new-tokens", max_new_tokens)):
            if value is not None:
                raise ConfigError(f"{flag} applies to --format deepspec only")
        table = read_rounds(src, domain=domain, prompt_tokens=prompt_tokens or 0)
        temp = "unknown" if temperature is None else temperature
        source_format = {
            "format": "rounds",
            "spec": "one row per verification round: request_id, round, proposal_len, accepted, "
                    "conf_1..conf_γ [, domain, prompt_tokens]",
        }
        default_drafter = "unknown (not in the imported file)"
        conf_meaning = "conf_k as given: the conditional acceptance of draft k given drafts 1..k−1 accepted"
    exp = expand(table)  # laid out at the recorded γ: the rounds' positions are the recording's
    view = table  # the rounds as a drafter of the set's γ sees them (card statistics)
    conf, accepted, conf_raw = exp.conf, exp.accepted, exp.conf_raw
    if gamma is not None:
        view = table.truncated(gamma)
        conf, accepted = np.ascontiguousarray(conf[:, :gamma]), np.minimum(accepted, gamma).astype(np.int8)
        conf_raw = None if conf_raw is None else np.ascontiguousarray(conf_raw[:, :gamma])
    n = conf.shape[0]
    observed = int(table.accepted.size)
    prefill = table.num_requests
    info = dict(view.info)
    files = info.pop("files")
    calib = info.pop("calibration", {"method": "unknown", "applied": "conf as given"})
    datasets = info.pop("datasets", None)
    card: dict[str, Any] = {
        "source": "recorded",
        "name": name or out.name,
        "target": target or "unknown (not in the imported file)",
        "drafter": drafter or default_drafter,
        "gamma": view.gamma,
        "temperature": temp,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": command or import_command(
            fmt, src, out, gamma=gamma, name=name, note=note, domain=domain, prompt_tokens=prompt_tokens,
            target=target, drafter=drafter, temperature=temperature, calibration=calibration,
            max_new_tokens=max_new_tokens),
        "imported_from": {**source_format, "files": files, **info},
        "data": {
            "requests": table.num_requests, "rounds": observed, "positions": n,
            "domains": dict(sorted(Counter(table.domains).items())),
        },
        "conf_meaning": conf_meaning,
        "calibration": calib,
        "observed_positions": {
            "rule": OBSERVED_RULE,
            "rows": {"observed": observed, "filled": n - observed - prefill, "prefill": prefill},
            "file": ROUNDS_FILE + ("" if gamma is None else f" (the rounds as recorded, at γ = {table.gamma})"),
        },
        "censoring": {"rule": CENSOR_RULE, "censored_rounds": int(view.censored.sum()),
                      "fraction": round(float(view.censored.mean()), 4)},
        "acceptance": acceptance_by_domain(view),
        "stats_note": "`sparksim traces stats` walks this set from pos 1 (pos 0 is the prefill's token), "
                      "so it counts rounds only, as `acceptance` above and DeepSpec's eval do",
    }
    if datasets is not None:
        card["data"]["datasets"] = dict(sorted(Counter(datasets).items()))
    if assumed:
        card["assumed"] = assumed
    if note:
        card["note"] = note
    rid = exp.requests["request_id"].to_numpy(np.int64)
    counts = np.diff(table.offsets)
    rounds = pa.table({
        "request_id": pa.array(np.repeat(rid, counts)),
        "source_request_id": pa.array(np.repeat(np.array(table.source_ids, dtype=object), counts).tolist(),
                                      type=pa.string()),
        "round": pa.array(table.round_index),
        "pos": pa.array(exp.round_pos),
        "row": pa.array(exp.round_row),
        "proposal_len": pa.array(table.proposal_len.astype(np.int16)),
        "accepted": pa.array(table.accepted.astype(np.int16)),
        "censored": pa.array(table.censored),
        "ended": pa.array(table.ended),
        "emitted": pa.array(table.emitted.astype(np.int16)),
        "conf_given": pa.array(table.conf_given.astype(np.int16)),
    })
    with atomic_dir(out) as tmp:
        write_traceset(tmp, exp.requests, conf, accepted, card, conf_raw=conf_raw)
        pq.write_table(rounds, tmp / ROUNDS_FILE, compression="zstd")
    return ImportResult(out, view, card, observed, n - observed - prefill, prefill)


def card_summary(card: Mapping[str, Any]) -> list[str]:
    """Return the lines the CLI prints under its table: rows by kind and the assumptions."""
    rows = card["observed_positions"]["rows"]
    lines = [f"rows: {rows['observed']} observed (round starts), {rows['filled']} filled inside rounds "
             f"(remainder of the round), {rows['prefill']} prefill (pos 0)",
             f"censored rounds: {card['censoring']['censored_rounds']}"]
    bounds = card["imported_from"].get("request_boundaries")
    if bounds:
        ends = ", ".join(f"{k} {v}" for k, v in bounds["ended_by"].items())
        lines.append(f"requests ended by: {ends} (boundaries inferred; see the card)")
    lines += [f"assumed: {a}" for a in card.get("assumed", [])]
    return lines
