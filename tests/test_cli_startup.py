"""Start-up of the `sparksim` command: `--help` must not import the simulator's heavy modules,
and `sparksim run` must not import pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer

from sparksim.cli import LAZY_COMMANDS, app, load_command
from sparksim.sim.runner import load_scenario, simulate, summary_json

REPO = Path(__file__).resolve().parents[1]


def test_importing_the_cli_imports_no_numpy_pandas_scipy_or_simulator() -> None:
    # Why: `sparksim --help` must answer within 0.3 s; NumPy, pandas and SciPy alone take 1 s+.
    code = ("import sys, sparksim.cli; "
            "print(sorted(m for m in ('numpy', 'pandas', 'scipy', 'simpy', 'sparksim.sim.runner', "
            "'sparksim.traces.synth') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_each_lazy_command_is_listed_with_the_help_of_the_command_it_loads() -> None:
    # The short help shown by `sparksim --help` is written twice (to avoid the import); a
    # changed docstring must fail here rather than drift.
    listed = typer.main.get_group(app)
    for name in LAZY_COMMANDS:
        real = load_command(name)
        assert real.name == name
        assert listed.commands[name].help == real.help.split("\n\n")[0].strip(), name  # type: ignore[union-attr]


def test_a_lazy_command_runs_its_own_options_after_loading() -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["traces", "--help"])
    assert result.exit_code == 0 and "synth" in result.output
    result = CliRunner().invoke(app, ["run", "--help"])
    assert result.exit_code == 0 and "--policy" in result.output and "--install-completion" not in result.output


RUNS = {
    # the default scenario: an analytic profile with draft tables, the synthetic trace set
    "default": ["--set", "run.duration_s=3", "--set", "workload.concurrency=8"],
    # tables held in memory and written whole, not streamed
    "held": ["--set", "run.duration_s=3", "--set", "workload.concurrency=8", "--set", "run.records.stream=false"],
    # an arrival log with a domain column (docs/scenarios/replay-arrivals.yaml)
    "replay": [str(REPO / "docs" / "scenarios" / "replay-arrivals.yaml"), "--set", "run.duration_s=5"],
}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_sparksim_run_writes_its_results_without_importing_pandas(run: str, tmp_path: Path) -> None:
    # Why: pandas costs ~0.25 s of start-up, a third of a whole `sparksim run` of DistServe's
    # 1,000-request benchmark (benchmarks/bench_distserve.py): reading the inputs, simulating,
    # summarising and writing the results all go without it, and write the files pandas would.
    out = tmp_path / "r"
    code = ("import sys, warnings; from sparksim.cli import app; warnings.simplefilter('ignore'); "
            "app(sys.argv[1:], standalone_mode=False); print('pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, "run", *RUNS[run], "-q", "--out", str(out)],
                          capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.strip().splitlines()[-1] == "False"
    sc, base = load_scenario(RUNS[run][0] if run == "replay" else None,
                             [s for s in RUNS[run] if "=" in s and not s.startswith("-")])
    held = simulate(sc, base)
    held.requests.to_parquet(tmp_path / "requests.parquet", index=False)  # pandas' own writer
    assert held.steps is not None
    held.steps.to_parquet(tmp_path / "steps.parquet", index=False)
    for name in ("requests.parquet", "steps.parquet"):
        assert (out / name).read_bytes() == (tmp_path / name).read_bytes(), name
    assert (out / "summary.json").read_text() == summary_json(held.summary)
