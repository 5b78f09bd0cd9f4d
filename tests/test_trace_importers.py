"""`sparksim traces import`: per-round logs (DeepSpec confidence dumps, round tables) as trace sets.

A per-round log observes only the positions where rounds started; the importer fills the
others with the remainder of the round (sparksim/traces/importers.py). These tests check the
layout against a naive re-implementation, that every replay schedule passes through every
observed row, that each bad input names its file, line and column (one case per rule, each
mutation-checked), that the fast and the line-by-line parses give the same table or the
same problems, and that the simulator runs on an imported set and replays the recorded
rounds exactly at full verification.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings, strategies
from typer.testing import CliRunner

import sparksim.traces.deepspec as deepspec_reader
import sparksim.traces.problems as problems_module
import sparksim.traces.rounds as rounds_reader
from sparksim.cli import app
from sparksim.errors import ConfigError, FormatError
from sparksim.sim.runner import load_scenario, simulate
from sparksim.traces import check_traceset, load_traceset
from sparksim.traces.importers import (
    MAX_PROBLEMS,
    RoundTable,
    import_traces,
    observed_rows,
    read_deepspec,
    read_rounds,
)
from sparksim.traces.problems import as_float, as_int, float_column, int_column, trim
from sparksim.traces.stats import domain_stats

DATA = Path(__file__).parent / "data" / "importers"
ROUNDS_CSV = DATA / "rounds.csv"
ROUNDS_JSONL = DATA / "rounds.jsonl"
DUMP = DATA / "deepspec"
GAMMA = 4

# The fixtures' rounds per request, as (conf_1..conf_4 with missing ones as 0, accepted, emitted).
ROUNDS = {
    11: [([0.9, 0.8, 0.6, 0.5], 2, 3), ([0.95, 0.9, 0.85, 0.8], 4, 5), ([0.5, 0.4, 0.3, 0.2], 0, 1),
         ([0.9, 0.7, 0.5, 0.4], 2, 3)],
    12: [([0.7, 0.4, 0.3, 0.2], 1, 2), ([0.8, 0.6, 0.0, 0.0], 2, 3), ([0.85, 0.8, 0.7, 0.6], 3, 4)],
    13: [([0.99, 0.98, 0.97, 0.9], 4, 5), ([0.6, 0.5, 0.45, 0.4], 1, 2)],
}


def sigmoid(x: list[float], temps: list[float] | None = None) -> list[float]:
    t = temps or [1.0] * len(x)
    return [float(1 / (1 + np.exp(-v / tk))) for v, tk in zip(x, t, strict=False)]


def reference_rows(rounds: list[tuple[list[float], int, int]], out: int) -> tuple[list[list[float]], list[int], list[int]]:
    """Lay rounds out one position at a time: the rule as the docs state it, in plain loops.

    Returns (conf rows, accepted, observed positions) for one response of `out` tokens.
    """
    conf: list[list[float]] = [[0.0] * GAMMA]  # pos 0: the prefill token
    acc: list[int] = [0]
    starts = []
    t = 1
    for c, a, emitted in rounds:
        starts.append(t)
        for j in range(emitted):
            if t + j >= out:
                break
            conf.append(list(c[j:]) + [0.0] * j)  # the rest of the block, then "never accepted"
            acc.append(a - j)
        t += emitted
    assert len(conf) == out
    return conf, acc, starts


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def deepspec_rounds(dataset: str) -> list[tuple[list[float], int, int, int]]:
    """(logits, accepted, emitted, given) per record of a fixture dump file."""
    out = []
    for rec in records(DUMP / dataset / "confidence_records.jsonl"):
        acc = sum(rec["labels"])
        short = len(rec["logits"]) < GAMMA
        out.append((rec["logits"], acc, acc if short else acc + 1, len(rec["logits"])))
    return out


def rows_of(ts, k: int) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = ts.offsets[k], ts.offsets[k + 1]
    return ts.conf[lo:hi], ts.accepted[lo:hi]


# --------------------------------------------------------------------------- round tables


def test_rounds_csv_round_trip(tmp_path: Path) -> None:
    res = import_traces("rounds", ROUNDS_CSV, tmp_path / "imp", prompt_tokens=7, note="fixture")
    assert check_traceset(res.path) == []
    ts = load_traceset(res.path)
    req = ts.requests
    assert req["request_id"].tolist() == [11, 12, 13]  # first-appearance order, rows interleaved
    assert req["domain"].tolist() == ["math", "chat", "math"]
    assert req["prompt_tokens"].tolist() == [40, 25, 7]  # request 13 gives none: --prompt-tokens
    assert req["output_tokens"].tolist() == [13, 10, 8]  # 1 + Σ (accepted + 1)
    assert ts.gamma == GAMMA and ts.conf_raw is None
    mask = observed_rows(res.path)
    for k, rid in enumerate((11, 12, 13)):
        conf, acc, starts = reference_rows(ROUNDS[rid], int(req["output_tokens"][k]))
        got_conf, got_acc = rows_of(ts, k)
        np.testing.assert_allclose(got_conf, np.array(conf, dtype=np.float32), atol=1e-7)
        np.testing.assert_array_equal(got_acc, acc)
        lo = ts.offsets[k]
        assert np.flatnonzero(mask[lo: ts.offsets[k + 1]]).tolist() == starts
    card = ts.card
    assert card["source"] == "recorded" and card["gamma"] == GAMMA and card["note"] == "fixture"
    assert card["imported_from"]["format"] == "rounds"
    assert card["command"].startswith("sparksim traces import --format rounds ")
    assert card["observed_positions"]["rows"] == {"observed": 9, "filled": 31 - 9 - 3, "prefill": 3}
    assert card["censoring"]["censored_rounds"] == 2
    assert card["acceptance"]["chat"]["accept_length"] == pytest.approx(9 / 3, abs=1e-4)
    # `sparksim traces stats` walks from pos 1 here (pos 0 is the prefill's token): the rounds
    # it visits are the recorded ones, and its accepted length is the card's
    for dom, st in domain_stats(ts).items():
        assert st.num_rounds == card["acceptance"][dom]["rounds"]
        assert st.accepted_length == pytest.approx(card["acceptance"][dom]["accept_length"], abs=1e-4)
    rounds = pq.read_table(res.path / "rounds.parquet").to_pandas()
    assert rounds["censored"].tolist() == [False, False, False, True, False, True, False, False, False]
    assert rounds["conf_given"].tolist() == [4, 4, 4, 4, 4, 2, 4, 4, 4]


def test_rounds_jsonl_gives_the_same_set_as_csv(tmp_path: Path) -> None:
    a = load_traceset(import_traces("rounds", ROUNDS_CSV, tmp_path / "a", prompt_tokens=7).path)
    b = load_traceset(import_traces("rounds", ROUNDS_JSONL, tmp_path / "b", prompt_tokens=7).path)
    assert a.requests.equals(b.requests)
    np.testing.assert_array_equal(a.conf, b.conf)
    np.testing.assert_array_equal(a.accepted, b.accepted)


def test_a_jsonl_domain_key_is_read_whichever_record_comes_first(tmp_path: Path) -> None:
    # The columns came from the first record's keys: without `domain` there, every later
    # record's domain was dropped without a word; the same records in another order failed.
    import json

    from sparksim.traces.rounds import read_rounds

    def rec(rid: int, dom: str | None) -> str:
        r: dict[str, object] = {"request_id": rid, "round": 0, "proposal_len": 2, "accepted": 1,
                                "conf_1": 0.9, "conf_2": 0.5}
        if dom is not None:
            r["domain"] = dom
        return json.dumps(r)

    for order in ([rec(1, None), rec(2, "code")], [rec(2, "code"), rec(1, None)]):
        path = tmp_path / "r.jsonl"
        path.write_text("\n".join(order) + "\n")
        with pytest.raises(FormatError, match="column 'domain': None is not a domain name"):
            read_rounds(path)
    path.write_text("\n".join([rec(1, "chat"), rec(2, "code")]) + "\n")
    assert read_rounds(path).domains == ["chat", "code"]


@pytest.mark.parametrize("seed", range(5))
def test_every_schedule_passes_through_every_observed_row(tmp_path: Path, seed: int) -> None:
    # Why: the fill rule must never carry a replay past a recorded rejection. Whatever the
    # drafts verified per step, a replay from pos 1 lands on each round start in turn, and a
    # replay verifying every draft visits only round starts.
    res = import_traces("rounds", ROUNDS_CSV, tmp_path / f"imp{seed}")
    ts = load_traceset(res.path)
    mask = observed_rows(res.path)
    rng = np.random.default_rng(seed)
    for k in range(ts.num_requests):
        lo, hi = int(ts.offsets[k]), int(ts.offsets[k + 1])
        for full in (True, False):
            t, seen = lo + 1, []
            while t < hi:
                seen.append(t)
                ell = GAMMA if full else int(rng.integers(0, GAMMA + 1))
                t += min(ell, int(ts.accepted[t])) + 1
            starts = set(np.flatnonzero(mask[lo:hi]) + lo)
            assert starts <= set(seen)
            if full:
                assert set(seen) == starts


def test_gamma_option_truncates_exactly(tmp_path: Path) -> None:
    full = load_traceset(import_traces("rounds", ROUNDS_CSV, tmp_path / "full").path)
    short = load_traceset(import_traces("rounds", ROUNDS_CSV, tmp_path / "short", gamma=2).path)
    want = full.truncated(2)
    assert short.gamma == 2 and short.card["gamma"] == 2
    np.testing.assert_array_equal(short.conf, want.conf)
    np.testing.assert_array_equal(short.accepted, want.accepted)
    with pytest.raises(ConfigError, match="--gamma 5"):
        import_traces("rounds", ROUNDS_CSV, tmp_path / "long", gamma=5)


# --------------------------------------------------------------------------- DeepSpec dumps


def test_deepspec_dump_folder(tmp_path: Path) -> None:
    res = import_traces("deepspec", DUMP, tmp_path / "ds")
    assert check_traceset(res.path) == []
    ts = load_traceset(res.path)
    # gsm8k: a response ended by an accepted EOS draft (the short record), then one to the end of
    # the file; mt-bench: two responses with no marked boundary, joined under the 2048 default cap
    assert ts.requests["domain"].tolist() == ["math", "math", "chat"]
    gsm, mt = deepspec_rounds("gsm8k"), deepspec_rounds("mt-bench")
    groups = [gsm[:4], gsm[4:], mt]
    outs = [1 + sum(e for _, _, e, _ in g) for g in groups]
    assert ts.requests["output_tokens"].tolist() == outs == [13, 6, 18]
    for k, group in enumerate(groups):
        rounds = [(sigmoid(lg) + [0.0] * (GAMMA - n), a, e) for lg, a, e, n in group]
        conf, acc, _ = reference_rows(rounds, outs[k])
        got_conf, got_acc = rows_of(ts, k)
        np.testing.assert_allclose(got_conf, np.array(conf, dtype=np.float32), atol=1e-6)
        np.testing.assert_array_equal(got_acc, acc)
    card = ts.card
    bounds = card["imported_from"]["request_boundaries"]
    assert bounds["ended_by"] == {"eos_draft": 1, "max_new_tokens": 0, "end_of_file": 2}
    assert bounds["max_new_tokens"] == 2048
    assert any("max_new_tokens = 2048" in a for a in card["assumed"])
    assert any("temperature" in a for a in card["assumed"])
    assert card["temperature"] == 1.0 and card["calibration"]["method"] == "none"
    assert card["data"]["datasets"] == {"gsm8k": 2, "mt-bench": 1}
    assert "pull/63" in card["imported_from"]["spec"]
    rounds = pq.read_table(res.path / "rounds.parquet").to_pandas()
    assert rounds["ended"].sum() == 1 and rounds["censored"].sum() == 0
    # DeepSpec's accept_len: tokens per round, the round that accepted EOS yielding no bonus
    assert rounds["emitted"].tolist() == [e for _, _, e, _ in gsm + mt]
    assert card["acceptance"]["math"]["accept_length"] == pytest.approx(17 / 6, abs=1e-4)


def test_deepspec_cap_calibration_and_one_file(tmp_path: Path) -> None:
    temps = json.loads((DATA / "calibration.json").read_text())["temperatures"]
    res = import_traces("deepspec", DUMP / "mt-bench" / "confidence_records.jsonl", tmp_path / "mt",
                        max_new_tokens=12, calibration=DATA / "calibration.json", temperature=0.0)
    ts = load_traceset(res.path)
    mt = deepspec_rounds("mt-bench")
    # the third round starts at 9 and would end past 12: the first response is cut at 12 tokens
    assert ts.requests["output_tokens"].tolist() == [12, 6]
    assert ts.requests["domain"].tolist() == ["chat", "chat"]
    assert ts.card["imported_from"]["request_boundaries"]["ended_by"]["max_new_tokens"] == 1
    for k, group in enumerate((mt[:3], mt[3:])):
        rounds = [(sigmoid(lg, temps), a, e) for lg, a, e, _ in group]
        conf, acc, _ = reference_rows(rounds, int(ts.requests["output_tokens"][k]))
        got_conf, got_acc = rows_of(ts, k)
        np.testing.assert_allclose(got_conf, np.array(conf, dtype=np.float32), atol=1e-6)
        np.testing.assert_array_equal(got_acc, acc)
    assert ts.conf_raw is not None
    np.testing.assert_allclose(ts.conf_raw[1], sigmoid(mt[0][0]), atol=1e-6)
    assert ts.card["calibration"]["method"] == "sts" and ts.card["temperature"] == 0.0
    # a round that starts at the cap adds no token: it has no row
    cut = load_traceset(import_traces("deepspec", DUMP / "mt-bench", tmp_path / "cut", max_new_tokens=9).path)
    assert cut.requests["output_tokens"].tolist() == [9, 6]
    assert cut.card["imported_from"]["dropped_rounds"] == 1


# --------------------------------------------------------------------------- bad input

GOOD_CSV = ROUNDS_CSV.read_text().splitlines()
GOOD_JSONL = ROUNDS_JSONL.read_text().splitlines()
GOOD_DS = (DUMP / "gsm8k" / "confidence_records.jsonl").read_text().splitlines()


def _csv(**edits: str) -> str:
    lines = list(GOOD_CSV)
    for key, text in edits.items():
        lines[int(key[1:]) - 1] = text
    return "\n".join(lines) + "\n"


def _jsonl(line: int, **changes: object) -> str:
    lines = list(GOOD_JSONL)
    rec = json.loads(lines[line - 1])
    for k, v in changes.items():
        if v is ...:
            rec.pop(k)
        else:
            rec[k] = v
    lines[line - 1] = json.dumps(rec)
    return "\n".join(lines) + "\n"


def _ds(line: int, text: str) -> str:
    lines = list(GOOD_DS)
    lines[line - 1] = text
    return "\n".join(lines) + "\n"


BAD_ROUNDS = {
    "missing column": ("csv", _csv(l1=GOOD_CSV[0].replace(",accepted", ""),
                                   **{f"l{i}": ",".join(GOOD_CSV[i - 1].split(",")[:3] + GOOD_CSV[i - 1].split(",")[4:])
                                      for i in range(2, len(GOOD_CSV) + 1)}),
                       ["line 1", "missing column 'accepted'"]),
    "conf column gap": ("csv", _csv(l1=GOOD_CSV[0].replace("conf_3", "conf_5")),
                        ["line 1", "missing column conf_3"]),
    "accepted > proposal_len": ("csv", _csv(l3="11,1,4,5,0.95,0.9,0.85,0.8,math,40"),
                                ["line 3, column 'accepted'", "5 > proposal_len 4"]),
    "accepted > proposal_len (censored round)": ("csv", _csv(l6="12,1,2,3,0.8,0.6,,,chat,25"),
                                                 ["line 6, column 'accepted'", "3 > proposal_len 2"]),
    "proposal_len > γ": ("csv", _csv(l4="12,0,5,1,0.7,0.4,0.3,0.2,chat,25"),
                         ["line 4, column 'proposal_len'", "5 > γ = 4"]),
    "confidence above 1": ("csv", _csv(l5="11,2,4,0,0.5,1.2,0.3,0.2,math,40"),
                           ["line 5, column 'conf_2'", "in [0, 1]"]),
    "negative confidence": ("csv", _csv(l9="13,0,4,4,0.99,0.98,-0.1,0.9,math,"),
                            ["line 9, column 'conf_3'", "in [0, 1]"]),
    "NaN confidence": ("csv", _csv(l2="11,0,4,2,nan,0.8,0.6,0.5,math,40"),
                       ["line 2, column 'conf_1'", "in [0, 1]"]),
    "missing confidence within proposal_len": ("csv", _csv(l8="12,2,4,3,0.85,0.8,,0.6,chat,25"),
                                               ["line 8, column 'conf_3'", "verified 4 drafts"]),
    "missing the last verified confidence": ("csv", _csv(l6="12,1,2,2,0.8,,,,chat,25"),
                                             ["line 6, column 'conf_2'", "verified 2 drafts"]),
    "non-integer accepted": ("csv", _csv(l3="11,1,4,two,0.95,0.9,0.85,0.8,math,40"),
                             ["line 3, column 'accepted'", "not an integer"]),
    "rounds out of order": ("csv", _csv(l3=GOOD_CSV[4], l5=GOOD_CSV[2]),
                            ["line 3, column 'round'", "request 11 has round 2 after round 0"]),
    "missing round": ("csv", _csv(l5=GOOD_CSV[4].replace("11,2,", "11,5,")),
                      ["line 5, column 'round'", "round 5 after round 1"]),
    "request starting late": ("csv", _csv(l9=GOOD_CSV[8].replace("13,0,", "13,3,")),
                              ["line 9, column 'round'", "starts at round 3"]),
    "domain changes within a request": ("csv", _csv(l5=GOOD_CSV[4].replace(",math,", ",code,")),
                                        ["line 5, column 'domain'", "line 2 gave 'math'"]),
    "too many fields": ("csv", _csv(l7=GOOD_CSV[6] + ",0.3"), ["line 7", "has 11 fields, the header has 10"]),
    "mixed γ (jsonl)": ("jsonl", _jsonl(4, conf_5=0.1), ["line 4", "mixed γ"]),
    "bad JSON line": ("jsonl", "\n".join([*GOOD_JSONL[:2], "{not json", *GOOD_JSONL[3:]]) + "\n",
                      ["line 3", "not valid JSON"]),
    "missing key (jsonl)": ("jsonl", _jsonl(6, accepted=...), ["line 6", "missing key 'accepted'"]),
    "accepted > proposal_len (jsonl)": ("jsonl", _jsonl(2, accepted=7), ["line 2, column 'accepted'"]),
    "confidence as text (jsonl)": ("jsonl", _jsonl(7, conf_1="high"), ["line 7, column 'conf_1'"]),
    "empty file": ("csv", "", ["no header or records"]),
    # one case per rule: each breaks that rule alone, and the first problem names it
    "blank request id": ("csv", _csv(l4=" ,0,4,1,0.7,0.4,0.3,0.2,chat,25"),
                         ["line 4, column 'request_id'", "' ' is not a request id"]),
    "request id a float (jsonl)": ("jsonl", _jsonl(4, request_id=12.5),
                                   ["line 4, column 'request_id'", "12.5 is not a request id"]),
    "request id a bool (jsonl)": ("jsonl", _jsonl(2, request_id=True),
                                  ["line 2, column 'request_id'", "True is not a request id"]),
    "request id a list (jsonl)": ("jsonl", _jsonl(9, request_id=[13]),
                                  ["line 9, column 'request_id'", "[13] is not a request id"]),
    "negative round": ("csv", _csv(l3="11,-1,4,4,0.95,0.9,0.85,0.8,math,40"),
                       ["line 3, column 'round'", "'-1' is not an integer ≥ 0"]),
    "round past 2**62 (jsonl)": ("jsonl", _jsonl(3, round=2**62 + 1),
                                 ["line 3, column 'round'", f"{2**62 + 1} is not an integer ≥ 0"]),
    "fractional proposal_len (jsonl)": ("jsonl", _jsonl(5, proposal_len=3.5),
                                        ["line 5, column 'proposal_len'", "3.5 is not an integer ≥ 0"]),
    "missing accepted": ("csv", _csv(l8="12,2,4,,0.85,0.8,0.7,0.6,chat,25"),
                         ["line 8, column 'accepted'", "'' is not an integer ≥ 0"]),
    "first request starting at 2": ("csv", _csv(**{f"l{i}": GOOD_CSV[i - 1].replace(f"11,{r},", f"11,{r + 2},")
                                                   for i, r in ((2, 0), (3, 1), (5, 2), (7, 3))}),
                                    ["line 2, column 'round'", "request 11 starts at round 2; rounds must start at 0 or 1"]),
    "request starting at 1 after a first at 0": (
        "csv", _csv(**{f"l{i}": GOOD_CSV[i - 1].replace(f"12,{r},", f"12,{r + 1},") for i, r in ((4, 0), (6, 1), (8, 2))}),
        ["line 4, column 'round'", "request 12 starts at round 1, not 0 like the first request"]),
    "blank domain": ("csv", _csv(l10="13,1,4,1,0.6,0.5,0.45,0.4, ,"), ["line 10, column 'domain'", "' ' is not a domain name"]),
    "domain a number (jsonl)": ("jsonl", _jsonl(9, domain=7), ["line 9, column 'domain'", "7 is not a domain name"]),
    "negative prompt_tokens": ("csv", _csv(l4="12,0,4,1,0.7,0.4,0.3,0.2,chat,-25"),
                               ["line 4, column 'prompt_tokens'", "'-25' is not an integer ≥ 0"]),
    "prompt_tokens as text (jsonl)": ("jsonl", _jsonl(6, prompt_tokens="25"),
                                      ["line 6, column 'prompt_tokens'", "'25' is not an integer ≥ 0"]),
    "prompt_tokens changes within a request": ("csv", _csv(l8="12,2,4,3,0.85,0.8,0.7,0.6,chat,26"),
                                               ["line 8, column 'prompt_tokens'",
                                                "request 12 has prompt_tokens 26 but line 4 gave 25"]),
    "too few fields": ("csv", _csv(l6="12,1,2,2,0.8,0.6"), ["line 6", "has 6 fields, the header has 10"]),
    "record that is no object (jsonl)": ("jsonl", "\n".join([*GOOD_JSONL[:4], "[11, 2]", *GOOD_JSONL[5:]]) + "\n",
                                         ["line 5", "must be a JSON object"]),
    "first line not JSON (jsonl)": ("jsonl", "\n".join(["{oops", *GOOD_JSONL[1:]]) + "\n", ["line 1", "not valid JSON"]),
    "column twice": ("csv", _csv(l1=GOOD_CSV[0].replace("prompt_tokens", "domain")),
                     ["line 1 (the header)", "column 'domain' appears twice"]),
    "conf column not numbered": ("csv", _csv(l1=GOOD_CSV[0].replace("conf_4", "conf_x")),
                                 ["line 1 (the header)", "column 'conf_x' is not conf_<k>"]),
    "no conf columns": ("csv", _csv(l1=GOOD_CSV[0].replace("conf_", "c_")),
                        ["line 1 (the header)", "missing columns conf_1..conf_γ"]),
    "γ past MAX_GAMMA": ("csv", _csv(l1=",".join([*GOOD_CSV[0].split(",")[:4], *(f"conf_{k}" for k in range(1, 66))])),
                         ["line 1 (the header)", "γ = 65 (conf_65) is more than 64"]),
}

BAD_DEEPSPEC = {
    "labels not a prefix mask": (_ds(2, '{"logits": [3.0, 2.5, 2.0, 1.0], "labels": [1, 0, 1, 1]}'),
                                 ["line 2, key 'labels'", "accept-prefix mask"]),
    "labels shorter than logits": (_ds(3, '{"logits": [0.5, -0.5, -1.0, -2.0], "labels": [1, 0]}'),
                                   ["line 3, key 'labels'", "as long as 'logits'"]),
    "short record that rejected (mixed γ)": (_ds(5, '{"logits": [-0.5, -1.0], "labels": [1, 0]}'),
                                             ["line 5", "mixed γ"]),
    "missing key": (_ds(1, '{"logits": [2.0, 1.5, 0.0, -1.0]}'), ["line 1", "missing key 'labels'"]),
    "NaN logit": (_ds(6, '{"logits": [1.0, NaN, 0.6, 0.4], "labels": [1, 1, 1, 0]}'),
                  ["line 6, key 'logits'", "finite number"]),
    "label out of range": (_ds(6, '{"logits": [1.0, 0.8, 0.6, 0.4], "labels": [1, 2, 0, 0]}'),
                           ["line 6, key 'labels'", "not 0 or 1"]),
    "not JSON": (_ds(4, "logits: [2.2, 1.1]"), ["line 4", "not valid JSON"]),
    # one case per rule: each breaks that rule alone, and the first problem names it
    "record that is no object": (_ds(2, "[3.0, 2.5]"), ["line 2", "must be a JSON object"]),
    "missing logits": (_ds(3, '{"labels": [1, 0, 0, 0]}'), ["line 3", "missing key 'logits'"]),
    "empty logits": (_ds(6, '{"logits": [], "labels": []}'), ["line 6, key 'logits'", "non-empty list"]),
    "logits not a list": (_ds(1, '{"logits": 2.0, "labels": [1, 1, 0, 0]}'), ["line 1, key 'logits'", "non-empty list"]),
    "labels not a list": (_ds(2, '{"logits": [3.0, 2.5, 2.0, 1.0], "labels": null}'),
                          ["line 2, key 'labels'", "as long as 'logits' (4), got NoneType"]),
    "logit as text": (_ds(3, '{"logits": [0.5, "-0.5", -1.0, -2.0], "labels": [1, 0, 0, 0]}'),
                      ["line 3, key 'logits'", "value 1 is '-0.5', not a finite number"]),
    "logit a bool": (_ds(1, '{"logits": [2.0, true, 0.0, -1.0], "labels": [1, 1, 0, 0]}'),
                     ["line 1, key 'logits'", "value 1 is True, not a finite number"]),
    "infinite logit": (_ds(6, '{"logits": [1.0, 0.8, -Infinity, 0.4], "labels": [1, 1, 1, 0]}'),
                       ["line 6, key 'logits'", "value 2 is -inf, not a finite number"]),
    "label a float": (_ds(1, '{"logits": [2.0, 1.5, 0.0, -1.0], "labels": [1, 1.0, 0, 0]}'),
                      ["line 1, key 'labels'", "value 1 is 1.0, not 0 or 1"]),
    "no records": ("\n  \n", ["no records (empty file?)"]),
}


@pytest.mark.parametrize("case", sorted(BAD_ROUNDS))
def test_bad_round_tables_name_line_and_column(tmp_path: Path, case: str) -> None:
    kind, text, fragments = BAD_ROUNDS[case]
    path = tmp_path / f"bad.{kind}"
    path.write_text(text)
    with pytest.raises(FormatError) as err:
        import_traces("rounds", path, tmp_path / "out")
    msg = str(err.value)
    assert str(path) in msg
    for frag in fragments:
        assert frag in err.value.problems[0], msg  # the first problem is the one this case makes
    assert not (tmp_path / "out").exists()  # nothing half-written


@pytest.mark.parametrize("case", sorted(BAD_DEEPSPEC))
def test_bad_deepspec_records_name_line_and_key(tmp_path: Path, case: str) -> None:
    text, fragments = BAD_DEEPSPEC[case]
    path = tmp_path / "gsm8k" / "confidence_records.jsonl"
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(FormatError) as err:
        import_traces("deepspec", tmp_path, tmp_path / "out")
    msg = str(err.value)
    assert str(path) in msg
    for frag in fragments:
        assert frag in err.value.problems[0], msg  # the first problem is the one this case makes


def test_bad_calibration_and_options(tmp_path: Path) -> None:
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"temperatures": [1.0, 1.5]}))
    with pytest.raises(FormatError, match="'temperatures' has 2 values; the records' γ is 4"):
        import_traces("deepspec", DUMP, tmp_path / "o", calibration=cal)
    cal.write_text(json.dumps({"temperatures": [1.0, 0.0, 1.0, 1.0]}))
    with pytest.raises(FormatError, match=r"value 1 is 0\.0, not a positive number"):
        import_traces("deepspec", DUMP, tmp_path / "o", calibration=cal)
    with pytest.raises(ConfigError, match="--calibration applies to --format deepspec only"):
        import_traces("rounds", ROUNDS_CSV, tmp_path / "o", calibration=cal)
    with pytest.raises(ConfigError, match="--format 'vllm'"):
        import_traces("vllm", ROUNDS_CSV, tmp_path / "o")
    with pytest.raises(ConfigError, match="no such file or folder"):
        import_traces("deepspec", DATA / "no-such", tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"no confidence_records\.jsonl"):
        import_traces("deepspec", tmp_path / "empty", tmp_path / "o")


# --------------------------------------------------------------------------- the command line


def test_cli_import_and_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "traces" / "imported"
    ok = runner.invoke(app, ["traces", "import", "--format", "rounds", str(ROUNDS_CSV), "--out", str(out),
                             "--name", "fixture", "--note", "from the tests", "--temperature", "0.7"])
    assert ok.exit_code == 0, ok.output
    assert "observed (round starts)" in " ".join(ok.output.split())
    ts = load_traceset(out)
    assert ts.card["name"] == "fixture" and ts.card["temperature"] == 0.7
    assert ts.card["command"] == (f"sparksim traces import --format rounds {ROUNDS_CSV} --out {out} "
                                  "--name fixture --note 'from the tests' --temperature 0.7")
    bad = tmp_path / "bad.csv"
    bad.write_text(_csv(l3="11,1,4,5,0.95,0.9,0.85,0.8,math,40"))
    res = runner.invoke(app, ["traces", "import", "--format", "rounds", str(bad), "--out", str(tmp_path / "x")])
    assert res.exit_code == 1
    text = " ".join(res.output.split())  # rich wraps lines at the terminal's width
    assert str(bad) in text and "line 3, column 'accepted'" in text and "Traceback" not in text
    assert res.exception is None or isinstance(res.exception, SystemExit)
    gone = runner.invoke(app, ["traces", "import", "--format", "rounds", str(tmp_path / "nope.csv"),
                               "--out", str(tmp_path / "x")])
    assert gone.exit_code == 1 and "cannot read" in gone.output and "Traceback" not in gone.output
    ds = runner.invoke(app, ["traces", "import", "--format", "deepspec", str(DUMP), "--out", str(tmp_path / "d"),
                             "--max-new-tokens", "12"])
    assert ds.exit_code == 0, ds.output
    # gsm8k's first response accepts EOS at 13 > 12 and the first mt-bench one runs past 12
    assert "max_new_tokens 2" in " ".join(ds.output.split())


# --------------------------------------------------------------------------- the simulator on it


@pytest.mark.filterwarnings("ignore::sparksim.cost.profile.ProfileWarning")  # the flat test profile has no draft table
def test_simulator_runs_on_imported_sets(tmp_path: Path, flat_profile: Path) -> None:
    rounds = import_traces("rounds", ROUNDS_CSV, tmp_path / "r").path
    dump = import_traces("deepspec", DUMP, tmp_path / "d", max_new_tokens=12).path
    for path in (rounds, dump):
        sets = [f"profile={flat_profile}", f"traces={path}", "run.duration_s=2",
                "workload.concurrency=4", "workload.mix.math=1", "workload.mix.chat=1"]
        res = simulate(*load_scenario(None, sets, "greedy"), check=True)
        assert res.summary["census"]["finished"] > 0
        assert res.violations == []


@pytest.mark.filterwarnings("ignore::sparksim.cost.profile.ProfileWarning")
def test_full_verification_replays_the_recorded_rounds(tmp_path: Path, flat_profile: Path) -> None:
    # Why: at static γ with lengths from the traces, every request must take exactly the
    # recorded rounds of its trace request: one decode step per round, no more, no fewer.
    path = import_traces("rounds", ROUNDS_CSV, tmp_path / "r").path
    rounds = pq.read_table(path / "rounds.parquet").to_pandas()
    n_rounds = rounds.groupby("request_id", sort=False).size().to_numpy()
    sets = [f"profile={flat_profile}", f"traces={path}", "run.duration_s=2", "workload.concurrency=3",
            "workload.mix.math=1", "workload.mix.chat=1", f"policy.gamma={GAMMA}"]
    req = simulate(*load_scenario(None, sets, "static"), check=True).requests
    done = req[(req["emitted_tokens"] == req["output_tokens"]) & (req["trace_switches"] == 0)]
    assert len(done) > 10
    np.testing.assert_array_equal(done["decode_steps"].to_numpy(), n_rounds[done["trace_request"].to_numpy()])


# --------------------------------------------------------------------------- limits


def test_limits_name_the_line_past_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Why: MAX_POSITIONS bounds what a file may make us allocate; each reader states it once.
    monkeypatch.setattr(rounds_reader, "MAX_POSITIONS", 8)  # 9 rounds: one too many
    with pytest.raises(FormatError, match=r"line 10: more than 8 rounds"):
        read_rounds(ROUNDS_CSV)
    monkeypatch.setattr(rounds_reader, "MAX_POSITIONS", 30)  # 9 rounds, 31 positions
    with pytest.raises(FormatError, match=r"the rounds cover 31 output positions \(limit 30\)"):
        read_rounds(ROUNDS_JSONL)
    monkeypatch.setattr(rounds_reader, "MAX_POSITIONS", 31)
    assert read_rounds(ROUNDS_JSONL).output_tokens.sum() == 31
    monkeypatch.setattr(deepspec_reader, "MAX_POSITIONS", 5)  # 6 records
    with pytest.raises(FormatError, match=r"line 6: more than 5 records"):
        read_deepspec(DUMP / "gsm8k")
    monkeypatch.setattr(deepspec_reader, "MAX_POSITIONS", 6)  # 6 records, but 19 positions
    with pytest.raises(ConfigError, match=r"the records cover 19 output positions \(limit 6\)"):
        read_deepspec(DUMP / "gsm8k")


@pytest.mark.parametrize("fast", [True, False])
def test_problems_come_in_line_order_and_stop_after_max_problems(tmp_path: Path, fast: bool) -> None:
    # Why: the rules are checked column by column, but a reader must list what it found line
    # by line: the first MAX_PROBLEMS, syntax problems (a row of the wrong width) among them.
    rows = [GOOD_CSV[0]] + [f"{q},0,4,{5 + q % 2},0.9,0.8,0.6,0.5,math,40" for q in range(30)]
    rows[4] += ",extra"  # line 5: the wrong width, found by the parse
    path = tmp_path / "many.csv"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(FormatError) as err:
        read_rounds(path, fast=fast)
    got = err.value.problems
    assert len(got) == MAX_PROBLEMS + 1 and got[-1] == f"(stopped after {MAX_PROBLEMS} problems)"
    lines = [int(p.split(":")[0].split(",")[0].removeprefix("line ")) for p in got[:-1]]
    assert lines == list(range(2, 2 + MAX_PROBLEMS))
    assert got[3].startswith("line 5: has 11 fields")
    assert got[0] == "line 2, column 'accepted': 5 > proposal_len 4"


# --------------------------------------------------------------------------- the parses


def _same_tables(a: RoundTable, b: RoundTable) -> None:
    assert a.source_ids == b.source_ids and a.domains == b.domains
    for name in ("prompt_tokens", "output_tokens", "offsets", "round_index", "conf", "conf_given",
                 "proposal_len", "accepted", "ended"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def _outcome(read: object, *args: object, **kwargs: object) -> tuple[str, object]:
    """What a reader makes of a file: its table's arrays, or the problems it lists."""
    try:
        table = read(*args, **kwargs)  # type: ignore[operator]
    except FormatError as exc:
        return "problems", exc.problems
    fields = ("prompt_tokens", "output_tokens", "offsets", "round_index", "conf", "conf_given",
              "proposal_len", "accepted", "ended")
    return "table", (table.source_ids, table.domains, *(getattr(table, f).tolist() for f in fields))


@pytest.mark.parametrize("path", [ROUNDS_CSV, ROUNDS_JSONL])
def test_array_and_line_readers_agree_on_round_tables(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Why: a valid table is parsed at once (pyarrow, one json call), an irregular one line by
    # line (which names unreadable lines); both must give the same rounds, and valid input
    # must take the fast parse.
    slow = read_rounds(path, prompt_tokens=7, fast=False)

    def no_slow(*args: object, **kwargs: object) -> None:
        raise AssertionError("a valid table went through the line-by-line parse")

    monkeypatch.setattr(rounds_reader, "_csv_rows", no_slow)
    monkeypatch.setattr(problems_module, "_json_each_line", no_slow)
    _same_tables(read_rounds(path, prompt_tokens=7), slow)


def test_array_and_line_readers_agree_on_dumps(monkeypatch: pytest.MonkeyPatch) -> None:
    slow = read_deepspec(DUMP, max_new_tokens=12, fast=False)
    monkeypatch.setattr(deepspec_reader, "_json_records", lambda *a, **k: (_ for _ in ()).throw(AssertionError("slow")))
    _same_tables(read_deepspec(DUMP, max_new_tokens=12), slow)


@pytest.mark.parametrize("case", sorted(BAD_ROUNDS))
def test_bad_tables_give_the_same_problems_either_parse(tmp_path: Path, case: str) -> None:
    kind, text, _ = BAD_ROUNDS[case]
    path = tmp_path / f"bad.{kind}"
    path.write_text(text)
    assert _outcome(read_rounds, path) == _outcome(read_rounds, path, fast=False)


@pytest.mark.parametrize("case", sorted(BAD_DEEPSPEC))
def test_bad_dumps_give_the_same_problems_either_parse(tmp_path: Path, case: str) -> None:
    path = tmp_path / "gsm8k" / "confidence_records.jsonl"
    path.parent.mkdir()
    path.write_text(BAD_DEEPSPEC[case][0])
    assert _outcome(read_deepspec, tmp_path) == _outcome(read_deepspec, tmp_path, fast=False)


CSV_DAMAGE = ["", " ", "-1", "1.5", "x", "nan", "2", "0", "4", "1e0", " 3 ", "0.5", "12", "+1", "1_0",
              "\uff17", "inf", "2.0", "9" * 20, "1e400", "chat", "13"]
JSON_DAMAGE = [None, "", " ", -1, 1.5, "x", 2, 0, 4, True, [1], {"a": 1}, "0.5", 2**63, 12, "13", 1.0,
               float("nan"), 1e308, 0.25, "chat", ...]


def _damaged_csv(rng: random.Random) -> str:
    lines = [line.split(",") for line in GOOD_CSV]
    for _ in range(rng.randint(1, 3)):
        fields = lines[rng.randrange(1, len(lines))]
        what = rng.random()
        if what < 0.7:
            fields[rng.randrange(len(fields))] = rng.choice(CSV_DAMAGE)
        elif what < 0.8:
            fields.append(rng.choice(CSV_DAMAGE))
        elif what < 0.9:
            fields.pop()
        else:
            i, j = rng.randrange(1, len(lines)), rng.randrange(1, len(lines))
            lines[i], lines[j] = lines[j], lines[i]
    text = "\n".join(",".join(fields) for fields in lines) + "\n"
    if rng.random() < 0.2:
        text = text.replace("\n1", "\n\n1", 1)  # a blank line
    if rng.random() < 0.2:
        text = text.replace(",chat,", ',"chat",')  # quotes: the csv module parses it
    return text


def _damaged_jsonl(rng: random.Random) -> str:
    recs: list[object] = [json.loads(line) for line in GOOD_JSONL]
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(recs))
        what = rng.random()
        rec = recs[i]
        if what < 0.8 and isinstance(rec, dict):
            key = rng.choice([*rec, "conf_5"])
            value = rng.choice(JSON_DAMAGE)
            if value is ...:
                rec.pop(key, None)
            else:
                rec[key] = value
        elif what < 0.9:
            recs[i] = rng.choice([[1, 2], 5, "x"])
        else:
            j = rng.randrange(len(recs))
            recs[i], recs[j] = recs[j], recs[i]
    lines = [json.dumps(r) for r in recs]
    if rng.random() < 0.1:
        lines[rng.randrange(len(lines))] = "{not json"
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_the_parse_does_not_change_what_a_damaged_table_reads_as(tmp_path: Path, kind: str) -> None:
    # Why: the rules are stated once, after the parse; the fast parse may only skip work. So a
    # file must give the same table, or the same problems, whichever parse read it.
    rng = random.Random(0)
    damage = _damaged_csv if kind == "csv" else _damaged_jsonl
    failed = 0
    for trial in range(150):
        path = tmp_path / f"t{trial}.{kind}"
        path.write_text(damage(rng))
        fast = _outcome(read_rounds, path, prompt_tokens=3)
        assert fast == _outcome(read_rounds, path, prompt_tokens=3, fast=False), path.read_text()
        failed += fast[0] == "problems"
    assert 30 < failed < 150  # the damage reaches both outcomes


def test_the_parse_does_not_change_what_a_damaged_dump_reads_as(tmp_path: Path) -> None:
    rng = random.Random(1)
    pool = [None, "", "1", 1.5, -2, 0, 1, 2, True, [1], float("nan"), float("inf"), 2**70, ...]
    failed = 0
    for trial in range(150):
        recs = [json.loads(line) for line in GOOD_DS]
        for _ in range(rng.randint(1, 2)):
            rec = recs[rng.randrange(len(recs))]
            key = rng.choice(["logits", "labels"])
            what = rng.random()
            listed = isinstance(rec.get(key), list) and rec[key]
            if what < 0.6 and listed:
                rec[key][rng.randrange(len(rec[key]))] = rng.choice(pool[:-1])
            elif what < 0.8 or not listed:
                value = rng.choice(pool)
                if value is ...:
                    rec.pop(key, None)
                else:
                    rec[key] = value
            else:
                rec[key] = rec[key][:-1]
        path = tmp_path / f"t{trial}" / "gsm8k" / "confidence_records.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
        fast = _outcome(read_deepspec, path.parent.parent)
        assert fast == _outcome(read_deepspec, path.parent.parent, fast=False), path.read_text()
        failed += fast[0] == "problems"
    assert 30 < failed < 150


def test_the_line_reader_accepts_what_the_array_reader_leaves_to_it(tmp_path: Path) -> None:
    # integral floats, numeric strings, blank lines, quoted CSV fields: valid, read line by line
    path = tmp_path / "odd.jsonl"
    text = ROUNDS_JSONL.read_text().replace('"round": 1,', '"round": 1.0,').replace('"conf_1": 0.9,', '"conf_1": "0.9",')
    path.write_text(text.replace("\n", "\n\n", 1))
    _same_tables(read_rounds(path, prompt_tokens=7), read_rounds(ROUNDS_JSONL, prompt_tokens=7))
    path = tmp_path / "odd.csv"
    path.write_text(ROUNDS_CSV.read_text().replace(",math,", ',"math",').replace("\n11,2,", "\n\n11,2,"))
    _same_tables(read_rounds(path, prompt_tokens=7), read_rounds(ROUNDS_CSV, prompt_tokens=7))
    # rows of blank fields are no records, under either parse (arrow reads them as rows)
    path = tmp_path / "blank_rows.csv"
    path.write_text(ROUNDS_CSV.read_text().replace("\n12,1,", "\n,,,,,,,,,\n12,1,").replace("\n13,0,", "\n , ,,,,,,,,\n13,0,"))
    for fast in (True, False):
        _same_tables(read_rounds(path, prompt_tokens=7, fast=fast), read_rounds(ROUNDS_CSV, prompt_tokens=7))


def test_a_json_array_that_joins_lines_is_not_taken_for_records(tmp_path: Path) -> None:
    # Why: the fast JSONL parse reads all lines as one array; a value split over two lines
    # (here a string holding "},{") must not pass for two records while another line holds two.
    lines = list(GOOD_JSONL)
    lines[1] = lines[1][:-1] + ', "note": "a}'
    lines[2] = '{b"}'
    lines[3] = lines[3] + "," + lines[3]
    path = tmp_path / "joined.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert _outcome(read_rounds, path) == _outcome(read_rounds, path, fast=False)
    assert "line 2: not valid JSON" in _outcome(read_rounds, path)[1][0]  # type: ignore[index]


def test_a_dump_record_split_over_lines_is_not_taken_for_a_record(tmp_path: Path) -> None:
    # Why: pyarrow reads records across line breaks and several on one line; the fast dump
    # parse must not pair records with the wrong lines when the counts happen to match.
    lines = list(GOOD_DS)
    head, tail = lines[0].split('"labels"')
    lines[0:1] = [head, '"labels"' + tail]  # one record over lines 1-2
    lines[4] = lines[4] + " " + lines[5]  # line 5 holds two
    del lines[5]
    path = tmp_path / "gsm8k" / "confidence_records.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(lines) + "\n")
    fast = _outcome(read_deepspec, tmp_path)
    assert fast == _outcome(read_deepspec, tmp_path, fast=False)
    assert fast[0] == "problems" and fast[1][0].startswith("line 1: not valid JSON")  # type: ignore[index]


# --------------------------------------------------------------------------- the coercions


FIELD = strategies.text(alphabet="0123456789.eE+- x_", max_size=8)


@settings(max_examples=200, deadline=None)
@given(strategies.lists(FIELD, min_size=1, max_size=12))
@example(["-1E20", "1E20"])  # beyond int64 both ways: clipped to its range (found by CI)
def test_csv_numbers_read_as_python_reads_them(fields: list[str]) -> None:
    # Why: a plain CSV column is cast by pyarrow, an odd one field by field with float() and
    # int(); a field must read the same either way (the arrow cast is only a shortcut).
    trimmed = trim(pa.array(fields, type=pa.string()))
    stripped = [f.strip() for f in fields]
    vals, none, ok = float_column(trimmed)
    want = [None if f == "" else as_float(f) for f in stripped]
    assert none.tolist() == [f == "" for f in stripped]
    assert ok.tolist() == [w is not None for w in want]
    np.testing.assert_array_equal(vals[ok], [w for w in want if w is not None])
    ints, none, ok = int_column(trimmed)
    want_int = [None if f == "" else as_int(f) for f in stripped]
    assert ok.tolist() == [w is not None for w in want_int]
    assert ints[ok].tolist() == [min(max(w, -(2**63)), 2**63 - 1) for w in want_int if w is not None]
