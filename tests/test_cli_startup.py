"""Start-up of the `sparksim` command: `--help` must not import the simulator's heavy modules."""

from __future__ import annotations

import subprocess
import sys

import typer

from sparksim.cli import LAZY_COMMANDS, app, load_command


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
