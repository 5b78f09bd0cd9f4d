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

This module holds the import command: it reads a source with its format's reader
(`sparksim.traces.rounds`, `sparksim.traces.deepspec`), lays the rounds out
(`sparksim.traces.round_table`) and writes the set with its card. The readers' names are
re-exported here, the entry point the CLI and the tests use.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from sparksim.atomic import atomic_dir
from sparksim.errors import ConfigError
from sparksim.traces.deepspec import (
    DEEPSPEC_DOMAINS,
    DEEPSPEC_MAX_NEW_TOKENS,
    DEEPSPEC_PR,
    DEEPSPEC_RECORDS,
    DEEPSPEC_TEMPERATURE,
    deepspec_files,
    read_calibration,
    read_deepspec,
)
from sparksim.traces.format import write_traceset
from sparksim.traces.problems import MAX_PROBLEMS
from sparksim.traces.round_table import Expanded, RoundTable, expand, round_starts
from sparksim.traces.rounds import ROUNDS_OPTIONAL, ROUNDS_REQUIRED, read_rounds

__all__ = [
    "CENSOR_RULE", "DEEPSPEC_DOMAINS", "DEEPSPEC_MAX_NEW_TOKENS", "DEEPSPEC_PR", "DEEPSPEC_RECORDS",
    "DEEPSPEC_TEMPERATURE", "IMPORT_FORMATS", "MAX_PROBLEMS", "OBSERVED_RULE", "ROUNDS_FILE",
    "ROUNDS_OPTIONAL", "ROUNDS_REQUIRED", "Expanded", "ImportResult", "RoundTable", "acceptance_by_domain",
    "card_summary", "deepspec_files", "expand", "import_command", "import_traces", "observed_rows",
    "read_calibration", "read_deepspec", "read_rounds", "round_starts",
]

IMPORT_FORMATS = ("deepspec", "rounds")
ROUNDS_FILE = "rounds.parquet"

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


def observed_rows(path: Path | str) -> NDArray[np.bool_]:
    """Return a mask over an imported set's position rows: True where a round started (observed)."""
    path = Path(path)
    rounds = pq.read_table(path / ROUNDS_FILE, columns=["row"]).column("row").to_numpy()
    total = pq.read_metadata(path / "positions.parquet").num_rows
    mask = np.zeros(total, dtype=np.bool_)
    mask[rounds] = True
    return mask



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
