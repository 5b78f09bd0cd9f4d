"""`--format rounds`: a per-round CSV or JSONL table, read into a RoundTable with every problem named.

Reading has two stages. Parsing turns the text into records, one per row, each with the
line it came from: CSV through pyarrow when the text is plain (no quotes, no lone carriage
returns) and every row has the header's width, else row by row with the csv module, which
names the rows of the wrong width; JSONL with the json module (`json_lines`: all lines at
once when each surely holds one object, else line by line, naming the lines that are no
JSON). Checking then states each rule once, over whole columns (`_check`): a bad record
reports the first rule it breaks, with its line and column. The parses give the same
records, so a table and its problems do not depend on which one ran (`fast=False` forces
the line-by-line ones).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from numpy.typing import NDArray

from sparksim.errors import FormatError
from sparksim.traces.format import MAX_GAMMA, MAX_POSITIONS
from sparksim.traces.problems import (
    Column,
    Problems,
    Rule,
    as_int,
    empty,
    float_column,
    int_column,
    is_count,
    json_lines,
    read_text,
    report,
    sha256,
    text_column,
    trim,
)
from sparksim.traces.round_table import RoundTable

ROUNDS_REQUIRED = ("request_id", "round", "proposal_len", "accepted")
ROUNDS_OPTIONAL = ("domain", "prompt_tokens")


def read_rounds(
    path: Path | str, *, domain: str | None = None, prompt_tokens: int = 0, fast: bool = True
) -> RoundTable:
    """Read a per-round CSV or JSONL table; raise FormatError naming line and column of each problem.

    Rows of a request may interleave with other requests' rows, but its rounds must run in
    file order without gaps (0, 1, 2, … or 1, 2, 3, …: a missing round leaves its positions
    unknown). `domain` overrides the `domain` column (default "default" without one);
    `prompt_tokens` fills requests without a `prompt_tokens` value. `fast=False` parses a
    CSV table row by row and a JSONL one line by line from the start (same result, slower).
    """
    path = Path(path)
    text = read_text(path)
    problems = Problems(path)
    is_json = text.lstrip()[:1] == "{"
    if is_json:
        lines, values = json_lines(text, problems, fast=fast)
        columns, head = _json_header(lines, values, problems)
        # an optional key a later record holds is read from every record (an error where one
        # lacks it), whichever record comes first: not dropped because the first one has none
        if columns and "domain" not in columns and any(isinstance(v, dict) and "domain" in v for v in values):
            columns.append("domain")
    else:
        columns, head = _csv_header(text)
    header = Problems(path)
    gamma = _check_header(columns, head, header)
    header.raise_if_any()
    check_domain = "domain" in columns and domain is None
    wanted = [*ROUNDS_REQUIRED, *(f"conf_{k}" for k in range(1, gamma + 1))]
    wanted += ["domain"] * check_domain + ["prompt_tokens"] * (is_json or "prompt_tokens" in columns)
    if is_json:
        records = _json_records(lines, values, wanted, gamma, problems)
    else:
        records = _csv_records(text, columns, wanted, problems, fast=fast)
    if records.line.size > MAX_POSITIONS:
        problems.add(f"line {records.line[MAX_POSITIONS]}", f"more than {MAX_POSITIONS} rounds",
                     int(records.line[MAX_POSITIONS]))
        problems.raise_if_any()
    checked = _check(records, gamma, check_domain, problems)
    problems.raise_if_any()
    if records.line.size == 0:
        raise FormatError(path, ["no rounds (only a header or blank lines?)"])
    table = _grouped(checked, gamma, domain, prompt_tokens)
    total = int(table.output_tokens.sum())
    if total > MAX_POSITIONS:
        raise FormatError(path, [f"the rounds cover {total} output positions (limit {MAX_POSITIONS})"])
    known = {*ROUNDS_REQUIRED, *ROUNDS_OPTIONAL, *(f"conf_{k}" for k in range(1, gamma + 1))}
    table.info = {
        "files": [{"path": str(path), "sha256": sha256(text), "rounds": int(table.accepted.size),
                   "layout": "jsonl" if is_json else "csv"}],
        "round_base": checked.base,
        "ignored_columns": [c for c in columns if c not in known],
        "domain_from": "--domain" if domain is not None else (
            "the domain column" if "domain" in columns else "none given: 'default'"),
        "prompt_tokens_from": ("the prompt_tokens column" if "prompt_tokens" in columns else
                               f"none given: {prompt_tokens} (--prompt-tokens)"),
        "output_tokens_rule": "1 (the prefill token) + Σ (accepted + 1) over the request's rounds: "
                              "every round is taken to end with a correction or bonus token",
    }
    return table


# --------------------------------------------------------------------------- header


def _csv_header(text: str) -> tuple[list[str], str]:
    return [h.strip() for h in next(csv.reader(_text_lines(text)), [])], "line 1 (the header)"


def _text_lines(text: str) -> Iterator[str]:
    """Yield the lines of `text` as `io.StringIO(text)` does, without copying the whole text."""
    start = 0
    while start < len(text):
        end = text.find("\n", start) + 1 or len(text)
        yield text[start:end]
        start = end


def _json_header(lines: NDArray[np.int64], values: list[Any], problems: Problems) -> tuple[list[str], str]:
    """Return the first record's keys as the columns; raise if the first line is no JSON."""
    noted = problems.first_line
    if noted is not None and (lines.size == 0 or noted < lines[0]):
        problems.raise_if_any()
    if not isinstance(values[0], dict):
        return [], "line 1 (the header)"
    return list(values[0]), f"line {lines[0]} (the first record's keys)"


def _check_header(columns: list[str], head: str, problems: Problems) -> int:
    """Check the required columns and `conf_1..conf_γ` are there; return γ."""
    if not columns:
        problems.add("line 1", "no header or records (empty file, or a first record that is no JSON object?)")
        return 0
    dup = next((c for c in columns if columns.count(c) > 1), None)
    if dup is not None:
        problems.add(head, f"column {dup!r} appears twice")
    for col in ROUNDS_REQUIRED:
        if col not in columns:
            problems.add(head, f"missing column {col!r} (has {columns})")
    ks = []
    for col in columns:
        if col.startswith("conf_"):
            k = as_int(col[5:])
            if k is None or k < 1 or str(k) != col[5:]:
                problems.add(head, f"column {col!r} is not conf_<k> with k = 1, 2, …")
                continue
            ks.append(k)
    if not ks:
        problems.add(head, "missing columns conf_1..conf_γ (the γ conditional confidences of each round)")
        return 0
    gamma = max(ks)
    gaps = sorted(set(range(1, gamma + 1)) - set(ks))
    if gaps:
        problems.add(head, f"missing column conf_{gaps[0]} (has conf_1..conf_{gamma} with gaps)")
    if gamma > MAX_GAMMA:
        problems.add(head, f"γ = {gamma} (conf_{gamma}) is more than {MAX_GAMMA}")
    return gamma


# --------------------------------------------------------------------------- parsing


@dataclass
class _Records:
    """A table's records in file order, as columns of raw values."""

    line: NDArray[np.int64]  # (N,) line of each record (a CSV record's last line)
    values: dict[str, Column]  # column -> its fields, trimmed (CSV), or its JSON values
    raw: dict[str, Column]  # the same as written, for messages
    key_problem: list[str | None] | None = None  # JSONL: what is wrong with each record's keys

    def shown(self, col: str, i: int) -> Any:
        """Return record i's value in `col` as the file wrote it."""
        raw = self.raw[col]
        return raw[i] if isinstance(raw, list) else raw[i].as_py()


def _json_records(lines: NDArray[np.int64], values: list[Any], wanted: list[str], gamma: int,
                  problems: Problems) -> _Records:
    """Take the JSON objects as records; note each other value and what is wrong with each record's keys."""
    objects = np.fromiter((isinstance(v, dict) for v in values), dtype=np.bool_, count=len(values))
    for i in np.flatnonzero(~objects).tolist():
        problems.add(f"line {lines[i]}", "must be a JSON object", int(lines[i]))
    recs = [v for v, ok in zip(values, objects.tolist(), strict=True) if ok]
    conf_keys = {f"conf_{k}" for k in range(1, gamma + 1)}

    def verdict(keys: frozenset[str]) -> str | None:
        confs = [k for k in keys if k.startswith("conf_")]
        if set(confs) != conf_keys:
            return (f"has {len(confs)} confidences conf_k but the first record has conf_1..conf_{gamma} "
                    "(mixed γ)")
        absent = [col for col in ROUNDS_REQUIRED if col not in keys]
        return f"missing key {absent[0]!r}" if absent else None

    verdicts: dict[frozenset[str], str | None] = {}  # records share a few key sets
    key_problem = []
    for keys in map(frozenset, recs):
        if keys not in verdicts:
            verdicts[keys] = verdict(keys)
        key_problem.append(verdicts[keys])
    cols: dict[str, Column] = {col: [rec.get(col) for rec in recs] for col in wanted}
    return _Records(lines[objects], cols, cols, key_problem)


def _csv_records(text: str, columns: list[str], wanted: list[str], problems: Problems, *,
                 fast: bool) -> _Records:
    """Parse the rows after the header; skip rows of blank fields."""
    got = _csv_plain(text, len(columns)) if fast else None
    line, fields = got if got is not None else _csv_rows(text, len(columns), problems)
    at = [columns.index(col) for col in wanted]
    trimmed = [trim(f) for f in fields]
    raw = {col: fields[j] for col, j in zip(wanted, at, strict=True)}
    values = {col: trimmed[j] for col, j in zip(wanted, at, strict=True)}
    skip = _blank_rows(trimmed)
    if skip.any():
        keep = pa.array(~skip)
        raw = {col: f.filter(keep) for col, f in raw.items()}
        values = {col: f.filter(keep) for col, f in values.items()}
        line = line[~skip]
    return _Records(line, values, raw)


def _blank_rows(trimmed: list[pa.Array]) -> NDArray[np.bool_]:
    """Whether each row's fields (given as trimmed columns) are all empty: such a row is no record."""
    return np.asarray(np.logical_and.reduce([empty(t) for t in trimmed]), dtype=np.bool_)


def _csv_plain(text: str, width: int) -> tuple[NDArray[np.int64], list[pa.Array]] | None:
    """Parse a plain table (one row per line) with pyarrow; None if it is not plain or a row is
    not `width` fields wide."""
    import pyarrow.csv as pacsv

    if '"' in text or text.count("\r") != text.count("\r\n"):
        return None  # a quoted field may hold a line break, and a lone \r breaks lines for arrow only
    data = text.encode("utf-8")
    names = [f"c{j}" for j in range(width)]
    try:
        table = pacsv.read_csv(
            io.BytesIO(data),
            read_options=pacsv.ReadOptions(skip_rows=1, column_names=names),
            convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string())),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # arrow cannot read it whole: the line-by-line parse names the bad lines
    # arrow skips empty lines ("" or "\r"): the rows are the other lines after the header
    raw = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(raw == ord("\n"))
    if raw[-1] != ord("\n"):
        ends = np.append(ends, raw.size)
    starts = np.concatenate([[0], ends[:-1] + 1])
    length = ends - starts
    blank_line = (length == 0) | ((length == 1) & (raw[np.minimum(starts, raw.size - 1)] == ord("\r")))
    rows = np.flatnonzero(~blank_line[1:]) + 2
    if table.num_rows != rows.size:
        return None
    return rows.astype(np.int64), [table.column(j).combine_chunks() for j in range(width)]


def _csv_rows(text: str, width: int, problems: Problems) -> tuple[NDArray[np.int64], list[pa.Array]]:
    """Parse the table row by row, noting each row that is not `width` fields wide."""
    reader = csv.reader(io.StringIO(text))
    next(reader, None)
    lines: list[int] = []
    rows: list[list[str]] = []
    try:
        for fields in reader:
            if problems.full:
                break
            no = reader.line_num
            if len(fields) != width:
                if not _blank_rows([trim(pa.array([f], type=pa.string())) for f in fields]).all():
                    problems.add(f"line {no}", f"has {len(fields)} fields, the header has {width}", no)
                continue
            lines.append(no)
            rows.append(fields)
    except csv.Error as exc:
        problems.add(f"line {reader.line_num}", f"not valid CSV ({exc})", reader.line_num)
    cols = [pa.array([row[j] for row in rows], type=pa.string()) for j in range(width)]
    return np.array(lines, dtype=np.int64), cols


# --------------------------------------------------------------------------- the rules


@dataclass
class _Checked:
    """The decoded columns of a table (valid where no problem was reported)."""

    codes: NDArray[np.int64]  # (N,) request of each record, by first appearance (−1: no valid id)
    ids: NDArray[np.object_]  # (N,)
    base: int
    round_index: NDArray[np.int64]
    proposal_len: NDArray[np.int64]
    accepted: NDArray[np.int64]
    conf: NDArray[np.float64]  # (N, γ), 0 where not given
    present: NDArray[np.bool_]  # (N, γ)
    domains: NDArray[np.object_] | None  # (N,) when the domain column is read
    prompts: NDArray[np.int64] | None  # (N,) when the table gives prompt_tokens
    prompt_given: NDArray[np.bool_] | None


def _check(records: _Records, gamma: int, check_domain: bool, problems: Problems) -> _Checked:
    """State every rule of a round table over its columns; note each bad record's first problem.

    The rules are listed in the order a record is read (keys, id, counts, confidences, round
    sequence, domain, prompt_tokens): a record reports the first one it breaks.
    """
    v, line, shown = records.values, records.line, records.shown
    n = line.size

    def written(col: str, what: str) -> Callable[[int], str]:
        return lambda i: f"{shown(col, i)!r} is not {what}"

    rules: list[Rule] = []
    if records.key_problem is not None:
        keys = records.key_problem
        rules.append(Rule(np.array([p is not None for p in keys], dtype=np.bool_), "", lambda i: str(keys[i])))
    id_ok, ids = text_column(v["request_id"], numbers=True)
    rules.append(Rule(~id_ok, "column 'request_id'", written("request_id", "a request id")))
    ints: dict[str, NDArray[np.int64]] = {}
    oks: dict[str, NDArray[np.bool_]] = {}
    for col in ("round", "proposal_len", "accepted"):
        ints[col], _, is_int = int_column(v[col])
        oks[col] = is_int & is_count(ints[col])
        rules.append(Rule(~oks[col], f"column {col!r}", written(col, "an integer ≥ 0")))
    rnd, plen, acc = ints["round"], ints["proposal_len"], ints["accepted"]
    rules.append(Rule(plen > gamma, "column 'proposal_len'",
                      lambda i: f"{plen[i]} > γ = {gamma} (the conf_k columns)"))
    rules.append(Rule(acc > plen, "column 'accepted'", lambda i: f"{acc[i]} > proposal_len {plen[i]}"))
    conf = np.zeros((n, gamma), dtype=np.float64)
    present = np.zeros((n, gamma), dtype=np.bool_)
    for k in range(1, gamma + 1):
        key = f"conf_{k}"
        vals, none, is_num = float_column(v[key])
        in_range = is_num & (vals >= 0.0) & (vals <= 1.0)  # NaN fails both comparisons
        rules.append(Rule(none & (plen >= k), f"column {key!r}",
                          lambda i: f"missing, but the round verified {plen[i]} drafts"))
        rules.append(Rule(~none & ~in_range, f"column {key!r}", written(key, "a confidence in [0, 1]")))
        conf[:, k - 1] = np.where(in_range, vals, 0.0)
        present[:, k - 1] = ~none

    # rounds: the first request sets the base (0 or 1); each request starts there and counts up by 1
    codes = np.full(n, -1, dtype=np.int64)
    codes[id_ok] = pd.factorize(ids[id_ok])[0]
    seq = id_ok & oks["round"]
    prev, _ = _previous_and_first(codes, seq)
    start = seq & (prev < 0)
    starts = np.flatnonzero(start)
    at_base = starts[(rnd[starts] == 0) | (rnd[starts] == 1)]
    base_row = int(at_base[0]) if at_base.size else n
    base = int(rnd[base_row]) if at_base.size else 0
    row = np.arange(n)
    rules.append(Rule(start & (row < base_row), "column 'round'",
                      lambda i: f"request {ids[i]} starts at round {rnd[i]}; rounds must start at 0 or 1"))
    rules.append(Rule(start & (row > base_row) & (rnd != base), "column 'round'",
                      lambda i: f"request {ids[i]} starts at round {rnd[i]}, not {base} like the first "
                                "request (a missing round leaves its positions unknown)"))
    rules.append(Rule(seq & (prev >= 0) & (rnd != rnd[prev] + 1), "column 'round'",
                      lambda i: f"request {ids[i]} has round {rnd[i]} after round {rnd[prev[i]]} (rounds "
                                "must increase by 1 in file order; a missing round leaves its positions unknown)"))

    domains = None
    if check_domain:
        dom_ok, domains = text_column(v["domain"])
        rules.append(Rule(~dom_ok, "column 'domain'", written("domain", "a domain name")))
        _, first = _previous_and_first(codes, id_ok & dom_ok)
        doms = domains
        rules.append(Rule((first >= 0) & (doms != doms[first]), "column 'domain'",
                          lambda i: f"request {ids[i]} has domain {doms[i]!r} but line {line[first[i]]} "
                                    f"gave {doms[first[i]]!r}"))
    prompts = given = None
    if "prompt_tokens" in v:
        prompts, none, is_int = int_column(v["prompt_tokens"], strict=True)
        given = ~none
        p_ok = is_int & is_count(prompts)
        rules.append(Rule(given & ~p_ok, "column 'prompt_tokens'", written("prompt_tokens", "an integer ≥ 0")))
        _, first_p = _previous_and_first(codes, id_ok & given & p_ok)
        ps = prompts
        rules.append(Rule((first_p >= 0) & (ps != ps[first_p]), "column 'prompt_tokens'",
                          lambda i: f"request {ids[i]} has prompt_tokens {ps[i]} but line {line[first_p[i]]} "
                                    f"gave {ps[first_p[i]]}"))
    report(problems, line, rules)
    return _Checked(codes, ids, base, rnd, plen, acc, conf, present, domains, prompts, given)


def _previous_and_first(codes: NDArray[np.int64], sel: NDArray[np.bool_]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """For each selected record, the previous and the first selected record of the same request
    in file order (prev −1 for the first; both −1 where not selected)."""
    idx = np.flatnonzero(sel)
    order = idx[np.argsort(codes[idx], kind="stable")]  # by request, in file order within each
    c = codes[order]
    new = np.concatenate([[True], c[1:] != c[:-1]]) if c.size else np.zeros(0, dtype=np.bool_)
    prev = np.full(codes.size, -1, dtype=np.int64)
    prev[order[~new]] = order[np.flatnonzero(~new) - 1]
    first = np.full(codes.size, -1, dtype=np.int64)
    first[order] = order[np.flatnonzero(new)][np.cumsum(new) - 1]
    return prev, first


def _grouped(t: _Checked, gamma: int, domain: str | None, prompt_tokens: int) -> RoundTable:
    """Group a valid table's rounds by request (first-appearance order), each in round order."""
    counts = np.bincount(t.codes).astype(np.int64)
    order = np.argsort(t.codes, kind="stable")
    firsts = order[np.concatenate([[0], np.cumsum(counts)[:-1]])]  # each request's first record
    if domain is not None:
        domains = [domain] * counts.size
    elif t.domains is not None:
        domains = [str(d) for d in t.domains[firsts]]
    else:
        domains = ["default"] * counts.size
    prompts = np.full(counts.size, prompt_tokens, dtype=np.int64)
    if t.prompts is not None and t.prompt_given is not None:
        rows = np.flatnonzero(t.prompt_given)
        reqs, at = np.unique(t.codes[rows], return_index=True)  # each request's first value given
        prompts[reqs] = t.prompts[rows[at]]
    present = t.present[order]
    accepted = t.accepted[order]
    req_of_round = np.repeat(np.arange(counts.size), counts)
    return RoundTable(
        source_ids=[str(s) for s in t.ids[firsts]], domains=domains, prompt_tokens=prompts,
        output_tokens=1 + np.bincount(req_of_round, weights=accepted + 1, minlength=counts.size).astype(np.int64),
        offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        round_index=t.round_index[order], conf=t.conf[order],
        conf_given=np.cumprod(present, axis=1).sum(axis=1).astype(np.int64),
        proposal_len=t.proposal_len[order], accepted=accepted,
        ended=np.zeros(accepted.size, dtype=np.bool_),
    )
