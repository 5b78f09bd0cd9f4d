"""Validate any sparksim input by what it is: profile folder, trace-set folder or scenario file."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparksim.config import safe_load
from sparksim.cost.profile import check_profile
from sparksim.traces.format import check_traceset


@dataclass(frozen=True)
class Report:
    """What validating one input found.

    `problems` stop it from loading or running; `warnings` are what `sparksim run` would
    warn about on the same input (it runs, with a caveat), as plain sentences.
    """

    kind: str  # 'profile', 'traces', 'scenario' or 'unknown'
    problems: list[str]
    warnings: list[str]


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


def check_scenario(path: Path, *, strict: bool = False) -> list[str]:
    """Return every problem in a scenario file: its keys and values, then the inputs it names.

    Keys first (every bad key at once). Then each file it names, with the loaders' own
    checks, so every problem of each file is listed. When those files are sound, the rest
    is `sparksim run`'s own loading path (`runner.load_inputs`: policy, KV capacity, batch
    limits; then the workload's domains and arrival CSV), so validate answers "will this
    run?" exactly as `run` would before simulating.
    """
    from sparksim.config import check_scenario_file, resolve_path
    from sparksim.errors import SparksimError
    from sparksim.sim.runner import load_inputs, load_scenario
    from sparksim.sim.workload import DomainSampler, load_arrivals

    problems = check_scenario_file(path)
    if problems:
        return problems
    try:
        sc, base = load_scenario(path)
    except SparksimError as exc:
        return [str(exc)]
    names: dict[Path, str] = {}
    refs: list[tuple[str, str, Callable[[Path], list[str]]]] = [
        ("profile", sc.profile, check_profile), ("traces", sc.traces, check_traceset)]
    if sc.cluster.prefill.profile:
        refs.append(("cluster.prefill.profile", sc.cluster.prefill.profile, check_profile))
    gamma = None
    for key, ref, check in refs:
        target = resolve_path(ref, base)
        names[target] = f"{key}={ref!r}"
        found = check(target)
        problems += [f"{key}={ref!r}: {p}" for p in found]
        if key == "traces" and not found:
            gamma = yaml_gamma(target)
    wl = sc.workload
    csv = resolve_path(wl.arrivals_csv, base) if wl.kind == "replay" and wl.arrivals_csv else None
    if csv is not None:
        names[csv] = f"workload.arrivals_csv={wl.arrivals_csv!r}"
        if not csv.is_file():
            problems.append(f"workload.arrivals_csv={wl.arrivals_csv!r}: file not found")
    if problems:
        # load_inputs cannot get past a broken file; still say whether the policy is sound
        return problems + _policy_problems(sc.policy.name, gamma, sc.policy.params)
    try:
        _profile, traces, _prefill = load_inputs(sc, base, strict=strict)
        sampler = DomainSampler(traces, wl.mix)  # what the cluster builds first
        if csv is not None:
            load_arrivals(csv, sampler.domains)
    except SparksimError as exc:
        return _messages(exc, names)
    return []


def _policy_problems(name: str, gamma: int | None, params: dict[str, object]) -> list[str]:
    from sparksim.errors import SparksimError
    from sparksim.policies import make_policy

    try:
        make_policy(name, gamma if gamma is not None else 64, params)
    except SparksimError as exc:
        return [f"policy: {exc}"]
    return []


def _messages(exc: Exception, names: dict[Path, str]) -> list[str]:
    """Return an error's problems as lines, a file's problems prefixed by the key naming it."""
    from sparksim.errors import FormatError

    if isinstance(exc, FormatError):
        prefix = names.get(exc.path, str(exc.path))
        return [f"{prefix}: {p}" for p in exc.problems]
    return [str(exc)]


def yaml_gamma(traces: Path) -> int:
    """Return a valid trace set's γ from its card."""
    card = safe_load((traces / "card.yaml").read_text())
    return int(card["gamma"])


def validate_path(path: Path, *, strict: bool = False) -> Report:
    """Return what validating the input at `path` finds: its kind, problems and warnings.

    Warnings raised while reading (a profile whose cost falls with batch size, a run that
    would extrapolate) come back as their messages, once each, not as warning objects.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kind, problems = _check(path, strict)
    said = list(dict.fromkeys(str(w.message) for w in caught))
    return Report(kind, problems, said)


def _check(path: Path, strict: bool) -> tuple[str, list[str]]:
    kind = detect_kind(path)
    if kind == "profile":
        return kind, check_profile(path)
    if kind == "traces":
        return kind, check_traceset(path)
    if kind == "scenario":
        return kind, check_scenario(path, strict=strict)
    if not path.exists():
        return kind, [f"{path} does not exist"]
    return kind, [
        f"{path} is not a profile (verify.csv), a trace set (positions.parquet) or a scenario (.yaml)"
    ]
