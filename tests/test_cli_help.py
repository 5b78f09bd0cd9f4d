"""Every command's `--help` reads as written: no doubled percent signs, no sentence broken mid-line.

Typer prints option help as it is (argparse's `%%` escape shows up as "95%%") and keeps
the single line breaks of a docstring's later paragraphs, so a paragraph wrapped in the
source came out broken mid-sentence in a terminal of any width.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from sparksim.cli import LAZY_COMMANDS, app, load_command


def commands() -> Iterator[tuple[str, Any]]:
    """Yield (`sparksim …` words, click command) for every command and group, lazy ones loaded."""
    top = typer.main.get_group(app)

    def walk(cmd: Any, words: list[str]) -> Iterator[tuple[str, Any]]:
        yield " ".join(words), cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            if cmd is top and name in LAZY_COMMANDS:
                sub = load_command(name)
            yield from walk(sub, [*words, name])

    yield from walk(top, [])


COMMANDS = dict(commands())


@pytest.mark.parametrize("words", sorted(COMMANDS), ids=lambda w: w or "sparksim")
def test_help_paragraphs_are_single_lines_and_percent_signs_single(words: str) -> None:
    cmd = COMMANDS[words]
    for paragraph in inspect.cleandoc(cmd.help or "").split("\n\n")[1:]:
        assert "\n" not in paragraph, f"sparksim {words}: a help paragraph is broken mid-sentence: {paragraph!r}"
    for param in cmd.params:
        assert "%%" not in (getattr(param, "help", None) or ""), f"sparksim {words} {param.name}"


def test_bias_help_shows_one_percent_sign_in_an_80_column_terminal() -> None:
    out = CliRunner().invoke(app, ["bias", "--help"], env={"COLUMNS": "80"}).output
    assert "95%" in out and "%%" not in out
