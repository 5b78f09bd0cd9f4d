"""Reads scenario files: the validated description of one simulation (cluster, workload, policy, run).

A scenario is YAML read with the safe loader; every key has a default (the embedded
default scenario is simply `Scenario()`), `--set a.b=value` overrides any key, and an
unknown key or a bad value is a `ConfigError` naming the key and the value, with the
nearest valid key suggested. Policy parameters sit beside the policy's name
(`policy: {name: static, gamma: 1}`) and are checked by the policy itself. The
sections (`cluster`, `workload`, `policy`, `run`, `slo`) are `sparksim.config_sections`'s
models; here are the `Scenario` that holds them, the keys read only under certain values
of others (`READ_WHEN`), and the reading and checking of files.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from sparksim.config_sections import (
    ClusterConfig,
    ConfigModel,
    PolicyConfig,
    RunConfig,
    SLOConfig,
    WorkloadConfig,
)
from sparksim.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[1]

# The most requests one run may send: a million take minutes on one core, so a scenario that
# would send more is a typo (a rate in req/min, a horizon in ms) far more often than a plan.
MAX_RUN_REQUESTS = 10_000_000


class Scenario(ConfigModel):
    """One simulation. `Scenario()` is the embedded default scenario."""

    name: str = "default"
    seed: int = Field(0, ge=0)
    profile: str = "profiles/h100-qwen3-8b-analytic"
    lookup: Literal["step", "linear"] = "step"
    traces: str = "traces/synth-dspark-qwen3-8b"
    trace_block: int | None = Field(
        None, gt=0, description="replay only the first k drafted positions of each traced block "
        "(a drafter with a shorter block, e.g. DSpark-5 from γ = 7 traces; exact); default: the "
        "drafter's own block when it drafts fewer positions than the traces hold, and never more"
    )
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    slo: SLOConfig = Field(default_factory=SLOConfig)

    @model_validator(mode="after")
    def _window(self) -> Scenario:
        if self.run.warmup + self.run.cooldown >= self.run.duration_s:
            raise ValueError(
                f"run.warmup_s + run.cooldown_s ({self.run.warmup + self.run.cooldown:g}) must be "
                f"shorter than run.duration_s ({self.run.duration_s:g})"
            )
        return self

    @model_validator(mode="after")
    def _arrivals_fit(self) -> Scenario:
        """Refuse an open loop that would send more than MAX_RUN_REQUESTS within the horizon."""
        wl, run = self.workload, self.run
        if wl.kind not in ("poisson", "gamma"):
            return self  # a closed loop sends as it finishes; a replay file is bounded on load
        expected = min(wl.rate * run.duration_s, run.max_requests or math.inf)
        if expected > MAX_RUN_REQUESTS:
            raise ValueError(
                f"workload.rate={wl.rate:g} req/s over run.duration_s={run.duration_s:g} would send "
                f"{expected:,.0f} requests, more than the {MAX_RUN_REQUESTS:,} a run may simulate; "
                f"lower workload.rate or run.duration_s (rate × duration ≤ {MAX_RUN_REQUESTS:,}), "
                f"or cap arrivals with run.max_requests ≤ {MAX_RUN_REQUESTS:,}"
            )
        return self

    def to_yaml(self) -> str:
        """Return the resolved scenario as YAML (what a results folder records).

        Keys this scenario does not read (`unread_keys`) are left out, so the file says what
        was simulated and reads back as the same scenario.
        """
        data = self.model_dump(mode="json")
        for key in unread_keys(self):
            *parents, leaf = key.split(".")
            node = data
            for part in parents:
                node = node.get(part, {})  # {}: a parent already left out
            node.pop(leaf, None)
        if not self.cluster.prefix_cache.enabled:
            # a feature that is off leaves no trace: a run's file reads as it did before it existed
            data["cluster"].pop("prefix_cache")
        if self.run.records.stream == "auto":
            # where the tables were held, not what was simulated: at its default it leaves no trace
            data["run"]["records"].pop("stream")
        return yaml.safe_dump(data, sort_keys=False)


# --------------------------------------------------------------------------- keys read only sometimes

# Keys read only when other keys hold certain values (the workload's kind, the prefill mode
# and schedule, the source of lengths, the prefix cache's flag, as "true" / "false"):
# key -> ((selector, values that read it), ...), all of
# which must hold. A key given under any other value is an error, not silently ignored: a
# run that ignores it looks valid (a sweep over workload.rate on a closed loop draws three
# identical points).
_OPEN = frozenset({"poisson", "gamma"})
_DISAGG = (("cluster.prefill.mode", frozenset({"disaggregated"})),)
_CACHING = ("cluster.prefix_cache.enabled", frozenset({"true"}))  # a flag reads as true / false
READ_WHEN: dict[str, tuple[tuple[str, frozenset[str]], ...]] = {
    "workload.concurrency": (("workload.kind", frozenset({"closed"})),),
    "workload.think_time_s": (("workload.kind", frozenset({"closed"})),),
    "workload.rate": (("workload.kind", _OPEN),),
    "workload.cv": (("workload.kind", frozenset({"gamma"})),),
    "workload.burstiness": (("workload.kind", frozenset({"gamma"})),),
    "workload.arrivals_csv": (("workload.kind", frozenset({"replay"})),),
    # a replay's lengths are the CSV's
    "workload.lengths": (("workload.kind", _OPEN | {"closed"}),),
    "workload.lengths.prompt": (("workload.lengths.source", frozenset({"lognormal"})),),
    "workload.lengths.output": (("workload.lengths.source", frozenset({"lognormal"})),),
    "run.max_requests": (("workload.kind", _OPEN | {"replay"}),),
    # shared prefixes only change a run that caches them; a replay's are the CSV's columns
    "workload.prefix": (_CACHING, ("workload.kind", _OPEN | {"closed"})),
    "cluster.prefix_cache.block_tokens": (_CACHING,),
    "cluster.prefill.instances": _DISAGG,
    "cluster.prefill.profile": _DISAGG,
    "cluster.prefill.kv_transfer_s": _DISAGG,
    "cluster.prefill.kv_transfer_tokens_per_s": _DISAGG,
    "cluster.prefill.max_batch_tokens": _DISAGG,
    "cluster.prefill.schedule": (("cluster.prefill.mode", frozenset({"colocated"})),),
    "cluster.prefill.chunk_tokens": (("cluster.prefill.mode", frozenset({"colocated"})),
                                     ("cluster.prefill.schedule", frozenset({"chunked"}))),
}


def _value_at(scenario: BaseModel, key: str) -> Any:
    node: Any = scenario
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _selector_text(value: Any) -> Any:
    """A selector's value as READ_WHEN lists it (a flag as true / false, as YAML writes it)."""
    return str(value).lower() if isinstance(value, bool) else value


def _unread_reason(scenario: Scenario, key: str) -> str | None:
    """Why `scenario` does not read `key` (None: it does), naming the values that would."""
    for selector, readers in READ_WHEN.get(key, ()):
        value = _selector_text(_value_at(scenario, selector))
        if value not in readers:
            return (f"{selector}={value} does not read it (read when {selector} is "
                    f"{' or '.join(sorted(readers))})")
    return None


def unread_keys(scenario: Scenario) -> list[str]:
    """Return the keys of READ_WHEN that `scenario` does not read, outermost first."""
    return [key for key in READ_WHEN if _unread_reason(scenario, key) is not None]


def _given_keys(data: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        yield dotted
        if isinstance(value, Mapping) and dotted not in OPEN_MAPS:
            yield from _given_keys(value, dotted + ".")


def _read_under(base: Mapping[str, Any], key: str) -> bool:
    """Whether `base`'s own selector values (their defaults where it has none) read `key`."""
    for selector, readers in READ_WHEN[key]:
        value = _lookup(base, selector.split("."))
        if value == "<missing>":
            value = _value_at(_DEFAULT, selector)
        if _selector_text(value) not in readers:
            return False
    return True


def unread_problems(scenario: Scenario, data: Mapping[str, Any],
                    base: Mapping[str, Any] | None = None) -> list[str]:
    """Return a line for each key given in `data` that `scenario` would not read.

    `base` is the scenario file (with any presets) before `--set`, `--vary` and `--policy`:
    a key it gives and reads itself, left unread because an override switched its selector
    (`--set workload.kind=poisson` on a closed-loop file), is dropped, not an error: the
    override chose another kind on purpose. A key an override gives is always checked.
    """
    problems: list[str] = []
    reported: list[str] = []
    for key in _given_keys(data):
        if key not in READ_WHEN or any(key.startswith(r + ".") for r in reported):
            continue
        if base is not None and _lookup(base, key.split(".")) == _lookup(data, key.split(".")) \
                and _read_under(base, key):
            continue
        reason = _unread_reason(scenario, key)
        if reason is not None:
            value = _lookup(data, key.split("."))
            problems.append(f"{key}{'' if isinstance(value, Mapping) else f'={value!r}'}: {reason}")
            reported.append(key)
    return problems


# --------------------------------------------------------------------------- keys


def _valid_keys(model: type[BaseModel], prefix: str = "") -> dict[str, type[BaseModel] | None]:
    """Map every dotted key of `model` to its sub-model (None for leaves)."""
    keys: dict[str, type[BaseModel] | None] = {}
    for name, field in model.model_fields.items():
        ann = field.annotation
        key = prefix + name
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys[key] = ann
            keys.update(_valid_keys(ann, key + "."))
        else:
            keys[key] = None
    return keys


VALID_KEYS = _valid_keys(Scenario)
_DEFAULT = Scenario()
OPEN_MAPS = ("workload.mix", "policy")  # keys below these are free-form (domains, policy params)


def _check_keys(data: Mapping[str, Any], prefix: str, problems: list[str]) -> None:
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if prefix.rstrip(".") in OPEN_MAPS:
            continue
        if dotted not in VALID_KEYS:
            near = difflib.get_close_matches(dotted, VALID_KEYS, n=1, cutoff=0.5)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            problems.append(f"unknown key {dotted!r}{hint}")
            continue
        if VALID_KEYS[dotted] is not None or dotted in OPEN_MAPS:
            if isinstance(value, Mapping):
                _check_keys(value, dotted + ".", problems)
            elif value is not None and dotted not in OPEN_MAPS:
                problems.append(f"key {dotted!r} must be a mapping (got {value!r})")


def _lookup(data: Mapping[str, Any], loc: Iterable[Any]) -> Any:
    cur: Any = data
    for part in loc:
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        else:
            return "<missing>"
    return cur


def scenario_problems(data: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> list[str]:
    """Return every problem in a scenario mapping (unknown keys, bad values, keys it would not read).

    `base`: the mapping before overrides (`unread_problems`)."""
    problems: list[str] = []
    _check_keys(data, "", problems)
    if problems:
        return problems
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        problems.extend(validation_problems(exc, data))
        return problems
    return unread_problems(scenario, data, base)


def _data_keys(data: Mapping[str, Any], loc: Iterable[Any], *, missing: bool) -> list[str]:
    """The keys of pydantic's error location `loc` that are in `data`, in order: a validator's
    or a union member's name (`float`, `function-after[...]`) is no key of the data and drops
    out; a list index is stepped through but not named. A missing key keeps its name."""
    parts = list(loc)
    if missing and parts:
        return [*_data_keys(data, parts[:-1], missing=False), str(parts[-1])]
    keys: list[str] = []
    cur: Any = data
    for part in parts:
        if isinstance(cur, Mapping) and isinstance(part, str) and part in cur:
            keys.append(part)
            cur = cur[part]
        elif isinstance(cur, list | tuple) and isinstance(part, int) and -len(cur) <= part < len(cur):
            cur = cur[part]
    return keys


def validation_problems(exc: ValidationError, data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Return pydantic's complaints about `data` as lines a person reads: `key.sub=value: why`.

    One line per key (a union's members each complain; their reasons are joined), an unknown
    or a missing key says so by name, and a complaint about a whole mapping names the mapping,
    not its repr.
    `prefix` is where `data` sits in a larger file (`domains.chat.`).
    """
    problems: list[str] = []
    seen: dict[str, int] = {}
    for err in exc.errors():
        # pydantic adds validator and union-member names to the location; keep the keys
        loc = _data_keys(data, err["loc"], missing=err["type"] == "missing")
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] in ("extra_forbidden", "missing"):
            parent = prefix + ".".join(loc[:-1])
            what = "unknown key" if err["type"] == "extra_forbidden" else "missing field"
            problems.append(f"{parent + ': ' if parent else ''}{what} {loc[-1]!r}")
            continue
        value = _lookup(data, loc)
        key = prefix + ".".join(loc) if loc else prefix.rstrip(".")
        if not key:
            line = msg
        elif isinstance(value, Mapping):
            line = f"{key}: {msg}"
        else:
            line = f"{key}={value!r}: {msg}"
        if key and key in seen:
            problems[seen[key]] += f"; or {msg[0].lower()}{msg[1:]}"
            continue
        seen[key] = len(problems)
        problems.append(line)
    return problems


def parse_scenario(data: Mapping[str, Any] | None, base: Mapping[str, Any] | None = None) -> Scenario:
    """Validate a scenario mapping; raise ConfigError listing every problem.

    `base` is the mapping before overrides: keys it gave that an override made unread are
    dropped rather than errors (`unread_problems`).
    """
    data = dict(data or {})
    problems = scenario_problems(data, base)
    if problems:
        raise ConfigError("bad scenario:\n" + "\n".join(f"  - {p}" for p in problems))
    return Scenario.model_validate(data)


def read_yaml_mapping(path: Path | str, what: str = "scenario") -> dict[str, Any]:
    """Read a YAML file that must hold a mapping, with the safe loader (empty file: {}).

    Raises ConfigError naming the file when it is unreadable, not YAML, or not a mapping.
    """
    path = Path(path)
    try:
        data = safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read {what} ({exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a {what} file must hold a YAML mapping")
    return data


def read_json_object(path: Path | str) -> dict[str, Any]:
    """Read a JSON file that must hold an object; raise ConfigError naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file is missing")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


# libyaml's parser where PyYAML has it: the same safe constructor and resolver, so the same
# values (every YAML file in the repository compared), in about an eighth of the time a run
# spends reading its cards at start-up
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """Return `yaml.safe_load(text)`, parsed by libyaml where PyYAML was built with it."""
    return yaml.load(text, Loader=_SAFE_LOADER)


def read_scenario_file(path: Path | str) -> dict[str, Any]:
    """Read a scenario YAML file with the safe loader; raise ConfigError if it is empty or not a mapping.

    An empty file (or one of comments only) is refused rather than read as {}: a run would
    silently simulate the default scenario, not the one the user meant to write.
    """
    data = read_yaml_mapping(path, "scenario")
    if not data:
        raise ConfigError(f"{path}: the scenario file is empty (to run the default scenario, give no file)")
    return data


def check_scenario_file(path: Path | str) -> list[str]:
    """Return every problem in the scenario file at `path` (for `sparksim validate`)."""
    try:
        data = read_scenario_file(path)
    except ConfigError as exc:
        return [str(exc)]
    return scenario_problems(data)


_EXPONENT_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def parse_value(raw: str) -> Any:
    """Read a `KEY=VALUE` value as YAML, and a number written with an exponent (`1e1`, `5E-3`)
    as that number: YAML 1.1, which PyYAML reads, keeps it as text without a dot (`1.0e1`)."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value.strip()):
        return float(value)
    return value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply `key.sub=value` overrides (values parsed as YAML) to a scenario mapping in place."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE (e.g. workload.concurrency=128)")
        value = parse_value(raw)
        parts = key.split(".")
        cur = data
        for part in parts[:-1]:
            nxt = cur.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                cur[part] = nxt
            cur = nxt
        cur[parts[-1]] = value
    return data


def resolve_path(ref: str, base: Path | None = None) -> Path:
    """Find a file named in a scenario: relative to the scenario's folder, the cwd, then the repo."""
    p = Path(ref).expanduser()
    if p.is_absolute():
        return p
    for root in (base, Path.cwd(), REPO_ROOT):
        if root is not None and (root / p).exists():
            return root / p
    return (base or Path.cwd()) / p
