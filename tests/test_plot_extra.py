"""Without the `plot` extra (no matplotlib) every command that draws says how to install it in
one line, and a sweep still writes its table: the simulations must never be lost to a plot."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from sparksim.cli import app
from tests.test_plot_profile import make_profile

runner = CliRunner()
INSTALL = 'pip install -e ".[plot]"'


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `import matplotlib` fail as it does where the extra is not installed."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)


def one_clean_line(result: object, exit_code: int) -> str:
    """Assert the command ended with `exit_code` and no traceback; return its output on one line."""
    assert result.exit_code == exit_code, result.output
    assert isinstance(result.exception, SystemExit | None), result.exception
    return " ".join(result.output.split())


def test_a_sweep_without_matplotlib_writes_its_table_and_says_how_to_plot(
    no_matplotlib: None, sloped_profile: Path, varied_traces: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sw"
    result = runner.invoke(app, [
        "sweep", "--vary", "workload.concurrency=1,4", "--policy", "static:gamma=1", "--workers", "1",
        "--set", f"profile={sloped_profile}", "--set", f"traces={varied_traces}",
        "--set", "run.duration_s=3", "--out", str(out),
    ])
    said = one_clean_line(result, 0)
    assert INSTALL in said
    assert len(pd.read_parquet(out / "sweep.parquet")) == 2
    assert (out / "sweep.csv").exists() and not (out / "pareto.png").exists()


def test_plot_profile_without_matplotlib_says_how_to_install_it(
    no_matplotlib: None, tmp_path: Path
) -> None:
    prof = make_profile(tmp_path / "p")
    result = runner.invoke(app, ["plot", "profile", str(prof), "--out", str(tmp_path / "x.png")])
    assert INSTALL in one_clean_line(result, 1)
    assert not (tmp_path / "x.png").exists()


def test_plot_pareto_without_matplotlib_says_how_to_install_it(
    no_matplotlib: None, tmp_path: Path
) -> None:
    table = pd.DataFrame({"policy": ["a", "a"], "label": ["a", "a"], "lossless": [True, True],
                          "interactivity": [10.0, 20.0], "tput_per_gpu": [100.0, 50.0]})
    table.to_parquet(tmp_path / "sweep.parquet", index=False)
    result = runner.invoke(app, ["plot", "pareto", str(tmp_path)])
    assert INSTALL in one_clean_line(result, 1)
    assert not (tmp_path / "pareto.png").exists()


def test_plot_pareto_refuses_a_baseline_the_sweep_does_not_hold(tmp_path: Path) -> None:
    table = pd.DataFrame({"policy": ["a", "b"], "label": ["a", "b"], "lossless": [True, True],
                          "interactivity": [10.0, 20.0], "tput_per_gpu": [100.0, 50.0]})
    table.to_parquet(tmp_path / "sweep.parquet", index=False)
    result = runner.invoke(app, ["plot", "pareto", str(tmp_path), "--baseline", "c"])
    assert "--baseline 'c' is none of the sweep's policies ('a', 'b')" in one_clean_line(result, 1)
    assert not (tmp_path / "pareto.png").exists()


def test_a_sweep_without_plotly_writes_its_table_and_says_how_to_write_the_report(
    monkeypatch: pytest.MonkeyPatch, sloped_profile: Path, varied_traces: Path, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "plotly", None)  # `import plotly` fails, as without the extra
    out = tmp_path / "sw"
    result = runner.invoke(app, [
        "sweep", "--vary", "workload.concurrency=1,4", "--policy", "static:gamma=1", "--workers", "1",
        "--set", f"profile={sloped_profile}", "--set", f"traces={varied_traces}",
        "--set", "run.duration_s=3", "--out", str(out),
    ])
    said = one_clean_line(result, 0)
    assert f"no report.html: plotly is not installed; to write it: {INSTALL}, then sparksim report {out}" in said
    assert (out / "sweep.parquet").exists() and not (out / "report.html").exists()
    result = runner.invoke(app, ["report", str(out)])
    assert INSTALL in one_clean_line(result, 1)
