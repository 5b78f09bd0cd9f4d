"""`--out` is checked before simulating: a place that cannot be written must fail in one line
at once, not with a traceback after the whole run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import sparksim.sim.runner
import sparksim.studies.sweep
from sparksim.cli import app
from sparksim.cli.common import check_out
from sparksim.errors import OutputPathError

runner = CliRunner()


@pytest.fixture
def no_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything is simulated: the check must come first."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("simulated before checking --out")

    monkeypatch.setattr(sparksim.sim.runner, "simulate", forbidden)
    monkeypatch.setattr(sparksim.studies.sweep, "run_sweep", forbidden)


def bad_outs(tmp_path: Path) -> list[tuple[Path, str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    return [(a_file / "res", "is a file"), (a_file, "is a file"), (Path("/proc/x/res"), "cannot write")]


@pytest.mark.parametrize("command", [
    ["traces", "synth", "--requests-per-domain", "2"],
    ["profile", "analytic"],
    ["profile", "fitted"],
    ["profile", "calibrate", "--runs", "no-such-run.csv", "--profile", "profiles/h100-qwen3-8b-analytic"],
])
def test_every_command_that_writes_a_folder_refuses_a_file_in_its_place(
    command: list[str], tmp_path: Path
) -> None:
    # `--out afile` had replaced the file with the folder (data lost), or failed with a
    # traceback after the work for a path below a file or in /proc.
    for out, reason in bad_outs(tmp_path):
        result = runner.invoke(app, [*command, "--out", str(out)])
        assert result.exit_code == 1, result.output
        said = " ".join(result.output.split())
        assert said.startswith("error: --out") and reason in said and str(out) in said, said
    assert (tmp_path / "a-file").read_text() == "x"


@pytest.mark.parametrize("command", [["run", "-q"], ["sweep", "--workers", "1"]])
def test_an_unwritable_out_fails_in_one_line_before_simulating(
    command: list[str], no_simulation: None, tmp_path: Path
) -> None:
    for out, reason in bad_outs(tmp_path):
        result = runner.invoke(app, [*command, "--out", str(out)])
        assert result.exit_code == 1, result.output
        assert isinstance(result.exception, SystemExit), result.exception
        said = " ".join(result.output.split())
        assert said.startswith("error: --out") and reason in said and str(out) in said, said


def test_a_new_nested_out_folder_passes_the_check(tmp_path: Path) -> None:
    # The results folder and its parents are created by the writer; their absence is fine.
    check_out(tmp_path / "new" / "deeper" / "res")
    check_out(tmp_path)  # an existing folder is replaced atomically
    assert not (tmp_path / "new").exists()  # checking writes nothing


def test_a_file_out_must_not_be_a_folder(tmp_path: Path) -> None:
    with pytest.raises(OutputPathError, match="is a folder"):
        check_out(tmp_path, kind="file")
    check_out(tmp_path / "fig" / "x.png", kind="file")


def test_run_never_replaces_a_folder_that_holds_something_else(no_simulation: None, tmp_path: Path) -> None:
    # A run replaces its results folder whole; `--out results/sweep` had dropped a sweep's points/.
    sweep = tmp_path / "sweep"
    (sweep / "points").mkdir(parents=True)
    (sweep / "points" / "a.json").write_text("{}")
    result = runner.invoke(app, ["run", "-q", "--out", str(sweep)])
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert said.startswith(f"error: --out {sweep}: holds points, not a run's results"), said
    assert (sweep / "points" / "a.json").read_text() == "{}"
