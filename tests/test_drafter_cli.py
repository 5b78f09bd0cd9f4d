"""The drafter commands load torch lazily: the CLI runs without it and says clearly what is missing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sparksim.cli import app


def test_importing_the_cli_does_not_import_torch() -> None:
    """The simulator must install and run without the torch extra."""
    code = "import sys, sparksim.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_record_without_torch_fails_with_an_install_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A missing extra is a one-line error naming the package, not a traceback."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    result = CliRunner().invoke(app, ["record", "--target", str(tmp_path), "--drafter", str(tmp_path),
                                      "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "torch" in result.output and "pip install" in result.output
