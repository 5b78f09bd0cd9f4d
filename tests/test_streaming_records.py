"""Records streamed to parquet (`run.records.stream`): a run of any length holds one row group
of its tables, and gives the tables, files and summary a run holding them whole gives.

Why: a million-request run's per-step table is gigabytes when held. Streamed, it must still
be the same table, written to the same bytes, with the summary float for float the same
(exact percentiles from the streamed file, never an estimate), or a long run would report
other figures than a short one of the same scenario.
"""

from __future__ import annotations

import gc
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from sparksim.cli import app
from sparksim.config import parse_scenario
from sparksim.sim.runner import load_scenario, simulate, summary_json, write_results
from sparksim.step import records
from sparksim.step.records import PENDING_ROWS, STEP_COLUMNS, Columns, ParquetColumns

WORKLOADS = {
    "closed-disaggregated": ["workload.kind=closed", "workload.concurrency=16"],
    "poisson-colocated": ["workload.kind=poisson", "workload.rate=40", "cluster.prefill.mode=colocated",
                          "cluster.prefill.chunk_tokens=256"],
    "gamma-2replicas": ["workload.kind=gamma", "workload.rate=60", "workload.cv=2.5", "cluster.replicas=2"],
    "no-step-table": ["workload.kind=poisson", "workload.rate=40", "run.records.steps=false"],
}


def _rows(n: int, seed: int = 0) -> list[tuple[float | int, ...]]:
    """`n` step rows of random values, every seventh row's floats NaN (written as nulls)."""
    rng = np.random.default_rng(seed)
    return [tuple(
        (math.nan if i % 7 == 0 else float(rng.random())) if kind == "d" else int(rng.integers(-5, 10**9))
        for kind in STEP_COLUMNS.values()) for i in range(n)]


@pytest.mark.parametrize("n", [0, 1, 4, 5, 6, 10, 23])
def test_a_streamed_table_is_the_file_to_parquet_writes_at_every_row_group_edge(n: int, tmp_path: Path) -> None:
    # Why: results folders are compared byte for byte (INV-5, the goldens): a streamed table
    # must cut its row groups where pyarrow cuts a whole table's, empty and exact multiples included.
    held, streamed = Columns(STEP_COLUMNS), ParquetColumns(STEP_COLUMNS, tmp_path / "s.parquet", row_group_rows=5)
    for row in _rows(n):
        held.append_row(row)
        streamed.append_row(row)
    held.to_frame().to_parquet(tmp_path / "h.parquet", index=False, row_group_size=5)
    assert streamed.close().read_bytes() == (tmp_path / "h.parquet").read_bytes()
    assert len(streamed) == n
    if n:
        assert pq.ParquetFile(tmp_path / "s.parquet").num_row_groups == math.ceil(n / 5)


def test_a_streamed_table_at_the_default_row_group_is_the_bytes_to_parquet_writes(tmp_path: Path) -> None:
    held, streamed = Columns(STEP_COLUMNS), ParquetColumns(STEP_COLUMNS, tmp_path / "s.parquet")
    for row in _rows(3000):
        held.append_row(row)
        streamed.append_row(row)
    held.to_frame().to_parquet(tmp_path / "h.parquet", index=False)  # what write_results does
    assert streamed.close().read_bytes() == (tmp_path / "h.parquet").read_bytes()
    pd.testing.assert_frame_equal(streamed.to_frame(), held.to_frame())


def test_a_streamed_table_holds_one_row_group_however_many_rows_it_is_given(tmp_path: Path) -> None:
    # Why: the point of streaming. The rows held must not grow with the rows appended.
    group = 2000
    table = ParquetColumns(STEP_COLUMNS, tmp_path / "s.parquet", row_group_rows=group)
    row = _rows(2)[1]
    most_held = 0
    for _ in range(25 * group):
        table.append_row(row)
        most_held = max(most_held, len(table._arrays[0]) + len(table._pending))
    assert most_held <= group + PENDING_ROWS
    assert table.rows_written >= 24 * group - PENDING_ROWS
    table.close()
    assert pq.ParquetFile(tmp_path / "s.parquet").metadata.num_rows == 25 * group


@pytest.fixture
def small_row_groups(monkeypatch: pytest.MonkeyPatch) -> int:
    """Row groups of 97 rows, so a short run's tables stream in many groups."""
    monkeypatch.setattr(records, "ROW_GROUP_ROWS", 97)
    return 97


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_a_streamed_run_gives_the_tables_and_summary_of_one_held_in_memory(
    workload: str, sloped_profile: Path, varied_traces: Path, small_row_groups: int,
) -> None:
    sets = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=3", *WORKLOADS[workload]]
    held = simulate(*load_scenario(None, [*sets, "run.records.stream=false"], "two-step"))
    streamed = simulate(*load_scenario(None, [*sets, "run.records.stream=true"], "two-step"))
    assert not held.streamed and streamed.streamed
    assert summary_json(streamed.summary) == summary_json(held.summary)
    pd.testing.assert_frame_equal(streamed.requests, held.requests)
    assert isinstance(streamed.requests_table, Path)
    assert pq.ParquetFile(streamed.requests_table).num_row_groups == math.ceil(len(held.requests) / small_row_groups)
    if held.steps is None:
        assert streamed.steps is None and not (streamed.requests_table.parent / "steps.parquet").exists()
    else:
        steps = streamed.steps
        assert steps is not None and len(steps) > 3 * small_row_groups  # several groups streamed
        pd.testing.assert_frame_equal(steps, held.steps)


def test_a_streamed_run_writes_the_results_folder_an_in_memory_run_writes(
    sloped_profile: Path, varied_traces: Path, tmp_path: Path,
) -> None:
    # Why: where the tables were held must not move a byte of what a run leaves (INV-5).
    sets = [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=3",
            "workload.kind=poisson", "workload.rate=50"]
    out = {}
    for stream in ("false", "true"):
        sc, base = load_scenario(None, [*sets, f"run.records.stream={stream}"], "greedy")
        out[stream] = write_results(simulate(sc, base), tmp_path / stream)
    for name in ("summary.json", "requests.parquet", "steps.parquet"):
        assert (out["true"] / name).read_bytes() == (out["false"] / name).read_bytes(), name


def test_sparksim_run_streams_and_leaves_only_its_results_folder(tmp_path: Path) -> None:
    sets = ["run.duration_s=4", "workload.concurrency=8"]
    out = tmp_path / "runs" / "r"
    result = CliRunner().invoke(app, ["run", *(a for s in sets for a in ("--set", s)), "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert [p.name for p in out.parent.iterdir()] == ["r"]  # the records folder went with the run
    sc, base = load_scenario(None, [*sets, "run.records.stream=false"])
    held = write_results(simulate(sc, base), tmp_path / "held")
    for name in ("summary.json", "requests.parquet", "steps.parquet"):
        assert (out / name).read_bytes() == (held / name).read_bytes(), name


def test_sparksim_run_check_reads_a_streamed_run_back(tmp_path: Path) -> None:
    # Why: --check checks the tables, not the summary: streamed, they are read back whole.
    result = CliRunner().invoke(app, ["run", "--set", "run.duration_s=3", "--set", "workload.concurrency=8",
                                      "--check", "--out", str(tmp_path / "r"), "-q"])
    assert result.exit_code == 0, result.output
    assert "invariants INV-1..7 hold" in result.output


def test_a_result_streamed_on_its_own_keeps_its_files_while_it_lives(
    sloped_profile: Path, varied_traces: Path,
) -> None:
    sc, base = load_scenario(None, [f"profile={sloped_profile}", f"traces={varied_traces}", "run.duration_s=1",
                                    "run.records.stream=true"], "static")
    res = simulate(sc, base)
    assert isinstance(res.requests_table, Path)
    folder = res.requests_table.parent
    assert {p.name for p in folder.iterdir()} == {"requests.parquet", "steps.parquet"}
    del res
    gc.collect()
    assert not folder.exists()


def test_auto_leaves_no_trace_in_the_resolved_scenario() -> None:
    # Why: results folders and sweep points name their scenario by its YAML; a key that only
    # says where tables were held must not change it at its default.
    auto = parse_scenario({})
    assert "stream" not in yaml.safe_load(auto.to_yaml())["run"]["records"]
    on = parse_scenario({"run": {"records": {"stream": True}}})
    data = yaml.safe_load(on.to_yaml())
    assert data["run"]["records"]["stream"] is True and parse_scenario(data) == on


@pytest.mark.parametrize("n", [0, 1, 3000])
def test_a_held_table_writes_the_bytes_to_parquet_writes(n: int, tmp_path: Path) -> None:
    # Why: a run that holds its tables writes them without pandas (`Columns.write_parquet`);
    # results folders are compared byte for byte, so the file must be pandas' own.
    held = Columns(STEP_COLUMNS)
    for row in _rows(n):
        held.append_row(row)
    held.write_parquet(tmp_path / "w.parquet")
    held.to_frame().to_parquet(tmp_path / "h.parquet", index=False)
    assert (tmp_path / "w.parquet").read_bytes() == (tmp_path / "h.parquet").read_bytes()


@pytest.mark.parametrize("schema", [records.REQUEST_COLUMNS, STEP_COLUMNS])
def test_the_arrow_schema_built_by_hand_is_the_one_pandas_gives(schema: dict[str, str]) -> None:
    import pyarrow as pa

    empty = pd.DataFrame({k: np.zeros(0, np.float64 if t == "d" else np.int64) for k, t in schema.items()})
    want = pa.Schema.from_pandas(empty, preserve_index=False)
    got = records.arrow_schema(schema)
    assert got.equals(want, check_metadata=True) and got.metadata == want.metadata
