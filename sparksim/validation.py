"""Validate any sparksim input by what it is: profile folder, trace-set folder or scenario file."""

from __future__ import annotations

from pathlib import Path

from sparksim.profile import check_profile
from sparksim.traces.format import check_traceset


def detect_kind(path: Path) -> str:
    """Return 'profile', 'traces', 'scenario' or 'unknown' for `path`."""
    if path.is_dir():
        if (path / "verify.csv").exists():
            return "profile"
        if (path / "positions.parquet").exists() or (path / "requests.parquet").exists():
            return "traces"
        return "unknown"
    if path.suffix in (".yaml", ".yml"):
        return "scenario"
    return "unknown"


def validate_path(path: Path) -> tuple[str, list[str]]:
    """Return (kind, every problem found) for the input at `path`."""
    kind = detect_kind(path)
    if kind == "profile":
        return kind, check_profile(path)
    if kind == "traces":
        return kind, check_traceset(path)
    if kind == "scenario":
        from sparksim.config import check_scenario_file

        return kind, check_scenario_file(path)
    if not path.exists():
        return kind, [f"{path} does not exist"]
    return kind, [
        f"{path} is not a profile (verify.csv), a trace set (positions.parquet) or a scenario (.yaml)"
    ]
