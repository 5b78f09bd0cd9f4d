"""`--format deepspec`: DeepSpec's confidence dumps (PR #63), read into a RoundTable with every problem named.

A dump folder holds `<dataset>/confidence_records.jsonl`, one `{"logits": [...], "labels":
[...]}` per verification round (see `sparksim.traces.importers`). Reading a file has two
stages, as for round tables. Parsing turns each line into a record, its logits and labels
as flat columns: with pyarrow when every line holds one object whose `logits` and `labels`
are lists of numbers, else line by line with the json module (which also names the lines
that are no JSON object). Checking (`_check`) then states each rule once over the columns.
`read_deepspec` joins the files' rounds into responses.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from sparksim.errors import ConfigError, FormatError
from sparksim.traces.format import MAX_GAMMA, MAX_POSITIONS
from sparksim.traces.problems import (
    MAX_PROBLEMS,
    Problems,
    Rule,
    as_float,
    float_column,
    int_column,
    json_lines,
    read_text,
    report,
    sha256,
)
from sparksim.traces.round_table import RoundTable

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
_RECORD = '{"logits": [...], "labels": [...]}'


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
        payload = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise FormatError(path, [f"not valid JSON (line {exc.lineno}: {exc.msg})"]) from None
    temps = payload.get("temperatures") if isinstance(payload, dict) else None
    if not isinstance(temps, list):
        raise FormatError(path, ["missing key 'temperatures' (a list of γ positive numbers)"])
    vals = [as_float(t) for t in temps]
    if len(vals) != gamma:
        raise FormatError(path, [f"key 'temperatures' has {len(vals)} values; the records' γ is {gamma}"])
    for k, t in enumerate(vals):
        if t is None or not (math.isfinite(t) and t > 0):
            raise FormatError(path, [f"key 'temperatures' value {k} is {temps[k]!r}, not a positive number"])
    return np.array(vals, dtype=np.float64)


# --------------------------------------------------------------------------- one dump file


@dataclass
class _Records:
    """A dump file's records in file order: per record whether `logits` and `labels` are there
    and lists, and the lists' entries as flat columns (record i's logits are the
    `num_logits[i]` entries after those of the records before it)."""

    line: NDArray[np.int64]  # (N,) line of each record
    has: NDArray[np.bool_]  # (N, 2) the record holds the key 'logits', 'labels'
    is_list: NDArray[np.bool_]  # (N, 2) ... and its value is a list
    num_logits: NDArray[np.int64]  # (N,) entries (0 when not a list)
    num_labels: NDArray[np.int64]  # (N,)
    logits: NDArray[np.float64]  # (Σ num_logits,) NaN where an entry is no number
    logit_is_number: NDArray[np.bool_]
    labels: NDArray[np.int64]  # (Σ num_labels,) 0 where an entry is no integer
    label_is_int: NDArray[np.bool_]


@dataclass
class _Dump:
    """The records of one dump file: logits zero-padded to the longest record."""

    line: NDArray[np.int64]  # (M,) line of each record
    logits: NDArray[np.float64]  # (M, longest)
    given: NDArray[np.int64]  # (M,) entries of each record
    accepted: NDArray[np.int64]  # (M,) leading 1s of its labels


def _arrow_records(text: str) -> _Records | None:
    """Parse a regular dump with pyarrow: one object per line, nothing around it, whose `logits`
    and `labels` are lists of numbers and of integers; None for any other text (the json
    module parses it)."""
    import pyarrow.json as pajson

    if len(text.splitlines()) != text.count("\n") + (not text.endswith("\n")):
        return None  # splitlines breaks lines at characters arrow reads as text
    data = text.encode("utf-8")
    raw = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(raw == ord("\n"))
    if raw.size and raw[-1] != ord("\n"):
        ends = np.append(ends, raw.size)
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
    stops = ends - ((ends > starts) & (raw[np.maximum(ends - 1, 0)] == ord("\r")))  # before a \r\n
    filled = stops > starts
    numbered = np.flatnonzero(filled) + 1
    if numbered.size == 0 or not ((raw[starts[filled]] == ord("{")) & (raw[stops[filled] - 1] == ord("}"))).all():
        return None  # a line that is not one object may hold two, or half of one
    schema = pa.schema([("logits", pa.list_(pa.float64())), ("labels", pa.list_(pa.int64()))])
    try:
        table = pajson.read_json(
            io.BytesIO(data),
            parse_options=pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # arrow cannot read it whole: the line-by-line parse names the bad lines
    logits = table.column("logits").combine_chunks()
    labels = table.column("labels").combine_chunks()
    if table.num_rows != numbered.size or logits.null_count or labels.null_count:
        return None  # arrow reads a missing key as null: the json module tells them apart
    flat_logits, flat_labels = logits.flatten(), labels.flatten()
    n = table.num_rows
    return _Records(
        line=numbered.astype(np.int64), has=np.ones((n, 2), dtype=np.bool_), is_list=np.ones((n, 2), dtype=np.bool_),
        num_logits=pc.list_value_length(logits).to_numpy(zero_copy_only=False).astype(np.int64),
        num_labels=pc.list_value_length(labels).to_numpy(zero_copy_only=False).astype(np.int64),
        logits=pc.fill_null(flat_logits, math.nan).to_numpy(zero_copy_only=False).astype(np.float64),
        logit_is_number=pc.is_valid(flat_logits).to_numpy(zero_copy_only=False).astype(np.bool_),
        labels=pc.fill_null(flat_labels, 0).to_numpy(zero_copy_only=False).astype(np.int64),
        label_is_int=pc.is_valid(flat_labels).to_numpy(zero_copy_only=False).astype(np.bool_),
    )


def _json_records(text: str, problems: Problems, *, fast: bool) -> _Records:
    """Parse a dump line by line, noting the lines that are no JSON object."""
    numbers, values = json_lines(text, problems, fast=fast)
    line: list[int] = []
    has: list[tuple[bool, bool]] = []
    is_list: list[tuple[bool, bool]] = []
    logits: list[list[Any]] = []
    labels: list[list[Any]] = []
    for no, rec in zip(numbers.tolist(), values, strict=True):
        if not isinstance(rec, dict):
            problems.add(f"line {no}", f"must be a JSON object {_RECORD}", no)
            continue
        lg, lb = rec.get("logits"), rec.get("labels")
        line.append(no)
        has.append(("logits" in rec, "labels" in rec))
        is_list.append((isinstance(lg, list), isinstance(lb, list)))
        logits.append(lg if isinstance(lg, list) else [])
        labels.append(lb if isinstance(lb, list) else [])
    logit_values, _, logit_is_number = float_column([v for rec in logits for v in rec], text=False)
    label_values, _, label_is_int = int_column([v for rec in labels for v in rec], strict=True)
    return _Records(
        line=np.array(line, dtype=np.int64),
        has=np.array(has, dtype=np.bool_).reshape(-1, 2), is_list=np.array(is_list, dtype=np.bool_).reshape(-1, 2),
        num_logits=np.array([len(r) for r in logits], dtype=np.int64),
        num_labels=np.array([len(r) for r in labels], dtype=np.int64),
        logits=logit_values, logit_is_number=logit_is_number, labels=label_values, label_is_int=label_is_int,
    )


def _first_in_record(bad: NDArray[np.bool_], offsets: NDArray[np.int64]) -> tuple[NDArray[np.bool_], NDArray[np.int64]]:
    """Return (records with a bad entry, index of each one's first bad entry) for flat entries."""
    n = offsets.size - 1
    idx = np.flatnonzero(bad)
    recs, at = np.unique(np.searchsorted(offsets, idx, side="right") - 1, return_index=True)
    out = np.zeros(n, dtype=np.bool_)
    out[recs] = True
    first = np.zeros(n, dtype=np.int64)
    first[recs] = idx[at] - offsets[recs]
    return out, first


def _check(rec: _Records, record: Callable[[int], dict[str, Any]], problems: Problems) -> NDArray[np.int64]:
    """State every rule of a dump record over the columns; note each bad record's first problem.

    Return the accepted drafts of each record (its labels' leading 1s, when valid).
    `record(i)` re-reads record i from its line, to show its bad values as written.
    """
    n_lg, n_lb = rec.num_logits, rec.num_labels
    lg_at = np.concatenate([[0], np.cumsum(n_lg)]).astype(np.int64)
    lb_at = np.concatenate([[0], np.cumsum(n_lb)]).astype(np.int64)
    rules = [
        Rule(np.asarray(~rec.has.all(axis=1), dtype=np.bool_), "",
             lambda i: f"missing key {'labels' if rec.has[i, 0] else 'logits'!r} (a record is {_RECORD})"),
        Rule(~rec.is_list[:, 0] | (n_lg == 0), "key 'logits'", lambda i: "must be a non-empty list of numbers"),
        Rule(~rec.is_list[:, 1] | (n_lb != n_lg), "key 'labels'",
             lambda i: f"must be a list as long as 'logits' ({n_lg[i]}), got "
                       f"{n_lb[i] if rec.is_list[i, 1] else type(record(i)['labels']).__name__}"),
    ]
    bad, k = _first_in_record(~(rec.logit_is_number & np.isfinite(rec.logits)), lg_at)
    rules.append(Rule(bad, "key 'logits'",
                      lambda i: f"value {k[i]} is {record(i)['logits'][k[i]]!r}, not a finite number"))
    is_mark = rec.label_is_int & ((rec.labels == 0) | (rec.labels == 1))
    bad, j = _first_in_record(~is_mark, lb_at)
    rules.append(Rule(bad, "key 'labels'", lambda i: f"value {j[i]} is {record(i)['labels'][j[i]]!r}, not 0 or 1"))
    # an accept-prefix mask: 1s, then 0s (no 1 right after a 0 of the same record)
    later = np.ones(rec.labels.size, dtype=np.bool_)
    later[lb_at[:-1][n_lb > 0]] = False
    rise = np.zeros(rec.labels.size, dtype=np.bool_)
    rise[1:] = (rec.labels[1:] == 1) & (rec.labels[:-1] == 0) & later[1:]
    rules.append(Rule(_first_in_record(rise, lb_at)[0], "key 'labels'",
                      lambda i: f"{record(i)['labels']} is not an accept-prefix mask (1s, then 0s)"))
    report(problems, rec.line, rules)
    owner = np.repeat(np.arange(n_lb.size), n_lb)
    return np.bincount(owner, weights=np.where(is_mark, rec.labels, 0), minlength=n_lb.size).astype(np.int64)


def _read_dump(path: Path, *, fast: bool = True) -> tuple[_Dump, str]:
    text = read_text(path)
    problems = Problems(path)
    rec = _arrow_records(text) if fast else None
    if rec is None:
        rec = _json_records(text, problems, fast=fast)
    if rec.line.size > MAX_POSITIONS:
        problems.add(f"line {rec.line[MAX_POSITIONS]}", f"more than {MAX_POSITIONS} records",
                     int(rec.line[MAX_POSITIONS]))
        problems.raise_if_any()
    lines: list[str] = []

    def record(i: int) -> dict[str, Any]:
        if not lines:
            lines.extend(text.splitlines())
        return dict(json.loads(lines[rec.line[i] - 1]))

    accepted = _check(rec, record, problems)
    problems.raise_if_any()
    if rec.line.size == 0:
        raise FormatError(path, ["no records (empty file?)"])
    given = rec.num_logits
    filled = np.arange(int(given.max()))[None, :] < given[:, None]
    logits = np.zeros(filled.shape, dtype=np.float64)
    logits[filled] = rec.logits
    return _Dump(rec.line, logits, given, accepted), text


def _sigmoid(x: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * x)), dtype=np.float64)  # stable for large |x|


# --------------------------------------------------------------------------- a dump folder


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
        problems = Problems(path)
        for i in np.flatnonzero((dump.given < gamma) & (dump.accepted < dump.given))[:MAX_PROBLEMS]:
            problems.add(f"line {dump.line[i]}", f"{dump.given[i]} confidences but γ = {gamma} (the longest "
                         "record), and the round rejected a draft: only a round that accepted an EOS "
                         "draft is shorter than the block (mixed γ?)", int(dump.line[i]))
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
        file_info.append({"path": str(path), "dataset": dataset, "domain": dom, "sha256": sha256(text),
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


