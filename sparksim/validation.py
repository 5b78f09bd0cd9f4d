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


def check_scenario(path: Path) -> list[str]:
    """Return every problem in a scenario file: its keys and values, then the inputs it names.

    When the keys are sound, the profile(s), trace set, arrival CSV and policy it names are
    checked too, so `sparksim validate scenario.yaml` answers "will this run?".
    """
    from sparksim.config import (
        check_scenario_file,
        parse_scenario,
        read_scenario_file,
        resolve_path,
    )
    from sparksim.errors import SparksimError
    from sparksim.policies import make_policy

    problems = check_scenario_file(path)
    if problems:
        return problems
    sc = parse_scenario(read_scenario_file(path))
    base = path.resolve().parent
    refs = [("profile", sc.profile, check_profile), ("traces", sc.traces, check_traceset)]
    if sc.cluster.prefill.profile:
        refs.append(("cluster.prefill.profile", sc.cluster.prefill.profile, check_profile))
    gamma = None
    for key, ref, check in refs:
        target = resolve_path(ref, base)
        found = check(target)
        problems += [f"{key}={ref!r}: {p}" for p in found]
        if key == "traces" and not found:
            gamma = int(yaml_gamma(target))
    if sc.workload.kind == "replay" and sc.workload.arrivals_csv:
        csv = resolve_path(sc.workload.arrivals_csv, base)
        if not csv.is_file():
            problems.append(f"workload.arrivals_csv={sc.workload.arrivals_csv!r}: file not found")
    try:
        make_policy(sc.policy.name, gamma if gamma is not None else 64, sc.policy.params)
    except SparksimError as exc:
        problems.append(f"policy: {exc}")
    return problems


def yaml_gamma(traces: Path) -> int:
    """Return a valid trace set's γ from its card."""
    import yaml

    card = yaml.safe_load((traces / "card.yaml").read_text())
    return int(card["gamma"])


def validate_path(path: Path) -> tuple[str, list[str]]:
    """Return (kind, every problem found) for the input at `path`."""
    kind = detect_kind(path)
    if kind == "profile":
        return kind, check_profile(path)
    if kind == "traces":
        return kind, check_traceset(path)
    if kind == "scenario":
        return kind, check_scenario(path)
    if not path.exists():
        return kind, [f"{path} does not exist"]
    return kind, [
        f"{path} is not a profile (verify.csv), a trace set (positions.parquet) or a scenario (.yaml)"
    ]
