"""Validation and round-trips of the on-disk formats (profiles and trace sets), and `sparksim validate`.

Profiles and traces come from other people's machines; a broken file must be refused with
one message naming the file, the column and the first bad row, never half-loaded, and what
sparksim writes must read back unchanged.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from sparksim.cli import app
from sparksim.cost.profile import check_profile, load_profile, write_profile
from sparksim.errors import FormatError
from sparksim.traces.format import check_traceset, load_traceset, write_traceset

REPO = Path(__file__).resolve().parents[1]
GAMMA = 7
PROFILE_CARD: dict[str, Any] = {
    "source": "synthetic", "hardware": "test", "model": "test", "dtype": "bf16",
    "date": "2026-01-01", "command": "tests/test_validate.py",
}
TRACE_CARD: dict[str, Any] = {
    "source": "synthetic", "target": "test", "drafter": "test", "gamma": GAMMA,
    "temperature": 1.0, "date": "2026-01-01", "command": "tests/test_validate.py",
}
OUTPUT_TOKENS = [5, 3, 4]  # 12 position rows: request 0 is rows 0-4, 1 is 5-7, 2 is 8-11


def _flat(text: str) -> str:
    """Undo rich's line wrapping so messages can be matched whole."""
    return " ".join(text.split())


# --------------------------------------------------------------------------- builders


def _verify_df() -> pd.DataFrame:
    rows = [(t, c, t / 8 + c / 1024) for c in (1024, 4096) for t in (8, 16, 32, 64)]
    df = pd.DataFrame(rows, columns=["tokens", "context", "step_ms"])
    df["p10_ms"] = df["step_ms"] * 0.95
    df["p90_ms"] = df["step_ms"] * 1.05
    return df


def _draft_df() -> pd.DataFrame:
    return pd.DataFrame({"requests": [1, 2, 4, 8], "draft_ms": [0.25, 0.3, 0.4, 0.6]})


def _profile(tmp_path: Path) -> Path:
    return write_profile(tmp_path / "prof", _verify_df(), PROFILE_CARD, _draft_df())


def _trace_arrays(seed: int = 0) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    requests = pd.DataFrame({
        "request_id": [10, 11, 12], "domain": ["math", "code", "chat"],
        "prompt_tokens": [100, 50, 20], "output_tokens": OUTPUT_TOKENS,
    })
    n = sum(OUTPUT_TOKENS)
    conf = rng.uniform(0.2, 1.0, size=(n, GAMMA)).astype(np.float32)
    accepted = rng.integers(0, GAMMA + 1, size=n).astype(np.int8)
    return requests, conf, accepted


def _traces(tmp_path: Path) -> Path:
    requests, conf, accepted = _trace_arrays()
    return write_traceset(tmp_path / "traces", requests, conf, accepted, TRACE_CARD)


def _edit_csv(path: Path, fn: Callable[[pd.DataFrame], pd.DataFrame]) -> None:
    fn(pd.read_csv(path)).to_csv(path, index=False)


def _edit_parquet(path: Path, fn: Callable[[pa.Table], pa.Table]) -> None:
    pq.write_table(fn(pq.read_table(path)), path)


def _edit_card(path: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    card = yaml.safe_load(path.read_text())
    fn(card)
    path.write_text(yaml.safe_dump(card))


def _set_matrix(table: pa.Table, col: str, row: int, value: float) -> pa.Table:
    mat = np.stack(table.column(col).to_numpy(zero_copy_only=False)).astype(np.float32)
    mat[row, 3] = value
    arr = pa.FixedSizeListArray.from_arrays(pa.array(mat.ravel()), GAMMA)
    return table.set_column(table.column_names.index(col), col, arr)


def _set_int(table: pa.Table, col: str, row: int, value: float) -> pa.Table:
    vals = table.column(col).to_numpy().astype(np.float64)
    vals[row] = value
    arr = pa.array(vals if np.isnan(vals).any() else vals.astype(np.int64))
    return table.set_column(table.column_names.index(col), col, arr)


# --------------------------------------------------------------------------- broken profiles

PROFILE_BREAKS: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "missing verify.csv": (
        lambda p: (p / "verify.csv").unlink(), ["verify.csv: file is missing"]),
    "missing column": (
        lambda p: _edit_csv(p / "verify.csv", lambda d: d.drop(columns="step_ms")),
        ["verify.csv: missing column 'step_ms'"]),
    "NaN cost": (
        lambda p: _edit_csv(p / "verify.csv", lambda d: d.assign(
            step_ms=d["step_ms"].where(d.index != 3, np.nan))),
        ["verify.csv: column 'step_ms' row 4", "(nan)"]),
    "text where a number belongs": (
        lambda p: _edit_csv(p / "verify.csv", lambda d: d.astype({"tokens": object}).assign(
            tokens=["8", "abc", *map(str, d["tokens"][2:])])),
        ["verify.csv: column 'tokens' row 2", "'abc'"]),
    "negative context": (
        lambda p: _edit_csv(p / "verify.csv", lambda d: d.assign(
            context=d["context"].where(d.index != 5, -4096))),
        ["verify.csv: column 'context' row 6 out of range (-4096)"]),
    "context grid with a hole": (
        lambda p: _edit_csv(p / "verify.csv", lambda d: d.drop(index=6)),
        ["verify.csv", "context=4096 lacks tokens=32"]),
    "duplicate rows": (
        lambda p: _edit_csv(p / "verify.csv", lambda d: pd.concat([d, d.iloc[[2]]])),
        ["verify.csv: duplicate (context, tokens) rows: row 9 repeats row 3 (1024, 32)"]),
    "unknown column": (
        lambda p: _edit_csv(p / "verify.csv", lambda d: d.assign(speed=1.0)),
        ["verify.csv: unknown column 'speed'"]),
    "binary garbage": (
        lambda p: (p / "verify.csv").write_bytes(b"\x00\xff\xfe\x89PNG\x00" * 40),
        ["verify.csv: cannot be parsed as CSV"]),
    "attention with one KV size at 0 tokens": (
        lambda p: pd.DataFrame({"kv_tokens": [0], "attn_ms": [0.5]}).to_csv(p / "attention.csv", index=False),
        ["attention.csv: a single kv_tokens value must be >= 1 (got 0)"]),
    "attention with a negative KV size": (
        lambda p: pd.DataFrame({"kv_tokens": [-8, 1024], "attn_ms": [0.1, 0.5]}).to_csv(
            p / "attention.csv", index=False),
        ["attention.csv: column 'kv_tokens' row 1"]),
    "draft.csv missing column": (
        lambda p: _edit_csv(p / "draft.csv", lambda d: d.rename(columns={"draft_ms": "ms"})),
        ["draft.csv: missing column 'draft_ms'"]),
    "card without command": (
        lambda p: _edit_card(p / "card.yaml", lambda c: c.pop("command")),
        ["card.yaml: missing field 'command'"]),
    "card with unknown source": (
        lambda p: _edit_card(p / "card.yaml", lambda c: c.update(source="guessed")),
        ["card.yaml: source='guessed'"]),
    "card figure below its range": (
        lambda p: _edit_card(p / "card.yaml", lambda c: c.update(
            cost_model={"prefill_attention_ms_per_token_sq": -1e-6, "note": "free-form keys stay allowed"})),
        ["card.yaml: cost_model.prefill_attention_ms_per_token_sq=-1e-06", "greater than or equal to 0"]),
    "card figure given as text": (
        lambda p: _edit_card(p / "card.yaml", lambda c: c.update(
            cost_model={"attention_ms_per_query_kv_token": "1e-6"})),
        ["card.yaml: cost_model.attention_ms_per_query_kv_token='1e-6'", "valid number"]),
    "card with an unknown attention mode": (
        lambda p: _edit_card(p / "card.yaml", lambda c: c.update(cost_model={"attention_kv": "dense"})),
        ["card.yaml: cost_model.attention_kv='dense'", "'sum' or 'padded'"]),
    "card with a zero graph size": (
        lambda p: _edit_card(p / "card.yaml", lambda c: c.update(graph_capture_sizes=[0, 8])),
        ["card.yaml: graph_capture_sizes=[0, 8]", "greater than or equal to 1"]),
    "card with zero gpus per replica": (
        lambda p: _edit_card(p / "card.yaml", lambda c: c.update(gpus_per_replica=0)),
        ["card.yaml: gpus_per_replica=0"]),
    "card drafter of an unknown kind": (
        lambda p: _edit_card(p / "card.yaml", lambda c: c.update(drafter={"name": "d", "kind": "medusa"})),
        ["card.yaml: drafter.kind='medusa'"]),
    "card drafter reading KV at a negative cost": (
        lambda p: _edit_card(p / "card.yaml", lambda c: c.update(drafter={"name": "d", "kv_ms_per_token": -1})),
        ["card.yaml: drafter.kv_ms_per_token=-1"]),
    "card not YAML": (
        lambda p: (p / "card.yaml").write_text("source: [unclosed\n"), ["card.yaml: not valid YAML"]),
    "step_ms given as True/False": (  # pandas reads them as booleans; they had become 1 and 0 ms
        lambda p: _edit_csv(p / "verify.csv", lambda df: df.assign(step_ms=[True, False] * (len(df) // 2)
                                                                   + [True] * (len(df) % 2))),
        ["verify.csv: column 'step_ms' row 1 is not a finite number (True)"]),
    "card missing": (
        lambda p: (p / "card.yaml").unlink(), ["card.yaml: file is missing"]),
    "card empty": (
        lambda p: (p / "card.yaml").write_text(""), ["card.yaml: is empty"]),
    "card count given as a bool": (  # read as 1 GPU, silently, before
        lambda p: _edit_card(p / "card.yaml", lambda c: c.update(gpus_per_replica=True)),
        ["card.yaml: gpus_per_replica=True"]),
    "card capture size given as text": (
        lambda p: _edit_card(p / "card.yaml", lambda c: c.update(graph_capture_sizes=[1, "16"])),
        ["card.yaml: graph_capture_sizes="]),
}


@pytest.mark.parametrize("case", sorted(PROFILE_BREAKS))
def test_a_broken_profile_is_refused_naming_the_file_column_and_row(
    tmp_path: Path, case: str
) -> None:
    """Each deliberate break must be caught by the validator and by the loader, with a precise message."""
    path = _profile(tmp_path)
    assert check_profile(path) == []
    breaker, expected = PROFILE_BREAKS[case]
    breaker(path)
    problems = check_profile(path)
    joined = "\n".join(problems)
    for text in expected:
        assert text in joined, joined
    with pytest.raises(FormatError) as info:
        load_profile(path)
    assert info.value.problems == problems and str(path) in str(info.value)


# --------------------------------------------------------------------------- broken trace sets


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


TRACE_BREAKS: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "missing positions file": (
        lambda p: (p / "positions.parquet").unlink(), ["positions.parquet: file is missing"]),
    "missing column": (
        lambda p: _edit_parquet(p / "positions.parquet", lambda t: t.drop(["accepted"])),
        ["positions.parquet: missing column 'accepted'"]),
    "missing requests column": (
        lambda p: _edit_parquet(p / "requests.parquet", lambda t: t.drop(["domain"])),
        ["requests.parquet: missing column 'domain'"]),
    "NaN confidence": (
        lambda p: _edit_parquet(p / "positions.parquet", lambda t: _set_matrix(t, "conf", 6, np.nan)),
        ["positions.parquet: column 'conf' row 6", "nan"]),
    "confidences given as text": (  # cast to numbers, they had passed
        lambda p: _edit_parquet(p / "positions.parquet", lambda t: t.set_column(
            t.schema.get_field_index("conf"), "conf", t.column("conf").cast(pa.list_(pa.string())))),
        ["positions.parquet: column 'conf' must hold a list of γ floats (is list<element: string>)"]),
    "domains given as numbers": (  # turned into the text "0", "1", they had passed
        lambda p: _edit_parquet(p / "requests.parquet", lambda t: t.set_column(
            t.schema.get_field_index("domain"), "domain", pa.array(np.arange(t.num_rows) % 2))),
        ["requests.parquet: column 'domain' must hold names, as text (is int64)"]),
    "NaN accepted": (
        lambda p: _edit_parquet(p / "positions.parquet", lambda t: _set_int(t, "accepted", 4, np.nan)),
        ["positions.parquet: column 'accepted' row 4", "nan"]),
    "corrupt parquet": (
        lambda p: (p / "positions.parquet").write_bytes(b"PAR1" + b"\x13" * 300 + b"PAR1"),
        ["positions.parquet: corrupt or truncated parquet"]),
    "truncated parquet": (
        lambda p: _truncate(p / "requests.parquet"),
        ["requests.parquet: corrupt or truncated parquet"]),
    "confidence above 1": (
        lambda p: _edit_parquet(p / "positions.parquet", lambda t: _set_matrix(t, "conf", 2, 1.5)),
        ["positions.parquet: column 'conf' row 2", "outside [0, 1]", "1.5"]),
    "confidence below 0": (
        lambda p: _edit_parquet(p / "positions.parquet", lambda t: _set_matrix(t, "conf", 9, -0.25)),
        ["positions.parquet: column 'conf' row 9", "-0.25"]),
    "accepted above gamma": (
        lambda p: _edit_parquet(p / "positions.parquet", lambda t: _set_int(t, "accepted", 9, 8)),
        ["positions.parquet: column 'accepted' row 9 is 8", "0..7"]),
    "accepted negative": (
        lambda p: _edit_parquet(p / "positions.parquet", lambda t: _set_int(t, "accepted", 0, -1)),
        ["positions.parquet: column 'accepted' row 0 is -1"]),
    "positions not contiguous": (
        lambda p: _edit_parquet(p / "positions.parquet", lambda t: _set_int(t, "pos", 3, 4)),
        ["positions.parquet: column 'pos' row 3 is 4, expected 3"]),
    "a request's rows out of order": (
        lambda p: _edit_parquet(p / "positions.parquet", lambda t: _set_int(t, "request_id", 8, 11)),
        ["positions.parquet: column 'request_id' row 8 is 11, expected 12"]),
    "rows missing": (
        lambda p: _edit_parquet(p / "positions.parquet", lambda t: t.slice(0, 11)),
        ["positions.parquet: has 11 rows", "sum to 12"]),
    "card without temperature": (
        lambda p: _edit_card(p / "card.yaml", lambda c: c.pop("temperature")),
        ["card.yaml: missing field 'temperature'"]),
    "card missing": (
        lambda p: (p / "card.yaml").unlink(), ["card.yaml: file is missing"]),
    "card of comments only": (  # no field given: not a card that passes every check
        lambda p: (p / "card.yaml").write_text("# to do\n"), ["card.yaml: is empty"]),
    "gamma differs between card and data": (
        lambda p: _edit_card(p / "card.yaml", lambda c: c.update(gamma=5)),
        ["card.yaml: gamma=5", "γ=7"]),
}


@pytest.mark.parametrize("case", sorted(TRACE_BREAKS))
def test_a_broken_trace_set_is_refused_naming_the_file_column_and_row(
    tmp_path: Path, case: str
) -> None:
    """Each deliberate break must be caught by the validator and the loader, with a precise message."""
    path = _traces(tmp_path)
    assert check_traceset(path) == []
    breaker, expected = TRACE_BREAKS[case]
    breaker(path)
    problems = check_traceset(path)
    joined = "\n".join(problems)
    for text in expected:
        assert text in joined, joined
    with pytest.raises(FormatError):
        load_traceset(path)


def test_a_trace_set_with_several_breaks_reports_each_of_them(tmp_path: Path) -> None:
    """Fixing one problem per run wastes a user's afternoon: independent problems come out together."""
    path = _traces(tmp_path)
    _edit_card(path / "card.yaml", lambda c: c.pop("drafter"))
    _edit_parquet(path / "positions.parquet",
                  lambda t: _set_int(_set_int(t, "accepted", 1, 9), "pos", 10, 7))
    joined = "\n".join(check_traceset(path))
    for text in ("missing field 'drafter'", "'accepted' row 1 is 9", "'pos' row 10 is 7"):
        assert text in joined, joined


# --------------------------------------------------------------------------- round trips


def test_a_profile_reads_back_what_was_written(tmp_path: Path) -> None:
    """write_profile → load_profile must reproduce the tables and the card, to the 9 digits written."""
    verify = _verify_df().query("context == 1024").drop(columns="context")
    # float-typed sizes and a 1M KV row: the writer must not round sizes to 6 digits
    attention = pd.DataFrame({"kv_tokens": [1024.0, 1048576.0], "attn_ms": [0.01, 10.24]})
    card = {**PROFILE_CARD, "graph_capture_sizes": [8, 16, 32, 64], "nested": {"a": [1, 2]}}
    path = write_profile(tmp_path / "rt", verify, card, _draft_df(), extra={"attention.csv": attention})
    prof = load_profile(path)
    assert prof.card == card and prof.kv_model == "per-request"
    np.testing.assert_array_equal(prof.attn_kv_tokens, [1024, 1048576])
    np.testing.assert_allclose(prof.attn_ms[0], attention["attn_ms"], rtol=1e-9)
    np.testing.assert_array_equal(prof.tokens, [8, 16, 32, 64])
    np.testing.assert_allclose(prof.step_ms, verify["step_ms"], rtol=1e-9)
    table = prof.drafter()
    assert table is not None
    np.testing.assert_array_equal(table.requests, _draft_df()["requests"])
    np.testing.assert_allclose(table.ms[-1], _draft_df()["draft_ms"], rtol=1e-6)
    assert prof.captured_sizes == (8, 16, 32, 64)
    # writing over an existing profile replaces it whole
    write_profile(path, verify, card)
    again = load_profile(path)
    assert again.kv_model == "none" and not again.drafters


def test_a_trace_set_reads_back_bit_for_bit(tmp_path: Path) -> None:
    """Traces are replayed exactly, so the float32 confidences must survive the disk unchanged."""
    requests, conf, accepted = _trace_arrays(seed=3)
    rng = np.random.default_rng(4)
    conf_raw = rng.uniform(0, 1, conf.shape).astype(np.float32)
    p_accept = rng.uniform(0, 1, conf.shape).astype(np.float32)
    path = write_traceset(tmp_path / "rt", requests, conf, accepted, TRACE_CARD,
                          conf_raw=conf_raw, p_accept=p_accept)
    ts = load_traceset(path)
    assert ts.card == TRACE_CARD and ts.gamma == GAMMA
    pd.testing.assert_frame_equal(ts.requests.reset_index(drop=True), requests, check_dtype=False)
    np.testing.assert_array_equal(ts.conf, conf)
    np.testing.assert_array_equal(ts.accepted, accepted)
    assert ts.conf_raw is not None and ts.p_accept is not None
    np.testing.assert_array_equal(ts.conf_raw, conf_raw)
    np.testing.assert_array_equal(ts.p_accept, p_accept)
    np.testing.assert_array_equal(ts.offsets, [0, 5, 8, 12])
    assert ts.num_positions == 12 and ts.domains == ["chat", "code", "math"]
    # a simulation reads only what it replays: the same arrays, the two extra columns unread
    run = load_traceset(path, extras=False)
    assert run.conf_raw is None and run.p_accept is None
    np.testing.assert_array_equal(run.conf, conf)
    np.testing.assert_array_equal(run.accepted, accepted)
    np.testing.assert_array_equal(run.offsets, ts.offsets)


def test_a_run_skips_the_extra_columns_and_a_check_still_reads_them(tmp_path: Path) -> None:
    requests, conf, accepted = _trace_arrays(seed=5)
    path = write_traceset(tmp_path / "rt", requests, conf, accepted, TRACE_CARD, conf_raw=conf)
    table = pq.read_table(path / "positions.parquet")
    bad_raw = pa.FixedSizeListArray.from_arrays(pa.array(np.full(conf.size, 2.0, dtype=np.float32)), conf.shape[1])
    table = table.set_column(table.column_names.index("conf_raw"), "conf_raw", bad_raw)  # outside [0, 1]
    pq.write_table(table, path / "positions.parquet")
    assert any("conf_raw" in p for p in check_traceset(path))
    with pytest.raises(FormatError, match="conf_raw"):
        load_traceset(path)
    assert load_traceset(path, extras=False).conf_raw is None  # a run never reads it
    no_conf = tmp_path / "no-conf"
    shutil.copytree(path, no_conf)
    table = pq.read_table(no_conf / "positions.parquet").drop_columns(["conf"])
    pq.write_table(table, no_conf / "positions.parquet")
    with pytest.raises(FormatError, match="missing column 'conf'"):  # a required one is still required
        load_traceset(no_conf, extras=False)


# --------------------------------------------------------------------------- the CLI


def test_validate_exits_0_on_valid_inputs_and_the_shipped_profiles(tmp_path: Path) -> None:
    """A clean input must pass quietly (exit 0), or scripts cannot gate on the validator."""
    runner = CliRunner()
    paths = [_profile(tmp_path), _traces(tmp_path),
             *sorted((REPO / "profiles").glob("*-analytic"))]
    assert len(paths) >= 4  # the two shipped analytic profiles are among them
    for path in paths:
        result = runner.invoke(app, ["validate", str(path)])
        assert result.exit_code == 0, result.output
        assert "ok" in result.output


def test_validate_exits_1_and_lists_every_problem(tmp_path: Path) -> None:
    """The validator's job is the whole list: three independent breaks, three lines, exit 1."""
    path = _profile(tmp_path)
    _edit_csv(path / "verify.csv", lambda d: d.assign(step_ms=d["step_ms"].where(d.index != 2, np.nan)))
    _edit_csv(path / "draft.csv", lambda d: d.drop(columns="requests"))
    _edit_card(path / "card.yaml", lambda c: c.pop("command"))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1
    out = _flat(result.output)
    assert "3 problem(s)" in out, out
    for text in ("verify.csv: column 'step_ms' row 3", "draft.csv: missing column 'requests'",
                 "card.yaml: missing field 'command'"):
        assert text in out, out

    traces = _traces(tmp_path)
    _edit_parquet(traces / "positions.parquet", lambda t: _set_int(t, "accepted", 7, 12))
    result = CliRunner().invoke(app, ["validate", str(traces)])
    assert result.exit_code == 1
    assert "'accepted' row 7 is 12" in _flat(result.output)


def test_validate_exits_1_on_a_path_that_is_not_an_input(tmp_path: Path) -> None:
    """A typo in a path must fail loudly, not validate nothing and exit 0."""
    runner = CliRunner()
    missing = runner.invoke(app, ["validate", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "does not exist" in _flat(missing.output)
    (tmp_path / "empty").mkdir()
    empty = runner.invoke(app, ["validate", str(tmp_path / "empty")])
    assert empty.exit_code == 1 and "is not a profile" in _flat(empty.output)


def test_validate_refuses_a_scenario_that_run_refuses_before_simulating(tmp_path: Path) -> None:
    """One validation path: what `run` refuses before simulating (a KV cache too small for the
    longest request) must fail `validate` too, in run's own words, or a clean validate means nothing."""
    from sparksim.errors import ConfigError
    from sparksim.sim.runner import load_inputs, load_scenario

    scenario = tmp_path / "s.yaml"
    body = {"profile": str(_profile(tmp_path)), "traces": str(_traces(tmp_path)),
            "cluster": {"kv_capacity_tokens": 64}}
    scenario.write_text(yaml.safe_dump(body))
    with pytest.raises(ConfigError) as refused:
        load_inputs(*load_scenario(scenario))
    result = CliRunner().invoke(app, ["validate", str(scenario)])
    out = _flat(result.output)
    assert result.exit_code == 1, out
    assert "1 problem(s)" in out and _flat(str(refused.value)) in out, out
    # the same scenario with room for its longest request validates clean
    scenario.write_text(yaml.safe_dump({**body, "cluster": {"kv_capacity_tokens": 100_000}}))
    result = CliRunner().invoke(app, ["validate", str(scenario)])
    assert result.exit_code == 0, result.output


def test_validate_prints_a_profile_warning_as_a_sentence(tmp_path: Path) -> None:
    """A warning is for a person: one readable line, not a warning object's repr or a source line."""
    verify = pd.DataFrame({"tokens": [8, 16, 32, 64], "step_ms": [1.0, 2.0, 1.5, 3.0]})
    path = write_profile(tmp_path / "dip", verify, PROFILE_CARD)
    result = CliRunner().invoke(app, ["validate", str(path)])
    out = _flat(result.output)
    assert result.exit_code == 0, out
    assert "warning: profile 'dip': verify.csv cost falls with batch size at 1 point(s)" in out, out
    for raw in ("ProfileWarning", "warnings.warn", "profile.py"):
        assert raw not in out, out


def test_profile_problems_count_rows_from_1_and_print_plain_numbers(tmp_path: Path) -> None:
    """Row 1 is the first data row under the header, as a person counts in a CSV, and a value
    reads as the number in the file, not as numpy's repr of it."""
    path = _profile(tmp_path)
    _edit_csv(path / "verify.csv", lambda d: d.assign(step_ms=d["step_ms"].where(d.index != 0, -2.5)))
    _edit_csv(path / "draft.csv", lambda d: d.assign(requests=d["requests"].where(d.index != 1, 0)))
    result = CliRunner().invoke(app, ["validate", str(path)])
    out = _flat(result.output)
    assert result.exit_code == 1
    assert "verify.csv: column 'step_ms' row 1 out of range (-2.5)" in out, out
    assert "draft.csv: column 'requests' row 2 out of range (0)" in out, out
    assert "np.float64" not in out and "np.int64" not in out, out
