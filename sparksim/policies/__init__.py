"""Verification policies, one per module, and the registry that names them.

`make_policy("greedy", block=7, params={...})` builds a registered policy;
`make_policy("mypkg.mod:MyPolicy", ...)` imports a user's class (code the user chose to
run: sparksim imports it as it is, the same trust as any installed package).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
import zlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from sparksim.errors import ConfigError
from sparksim.policies.base import Lengths, Policy, StepBatch, StepCost
from sparksim.policies.static import Static

REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Add a policy class to the registry under `cls.name`."""
    REGISTRY[cls.name] = cls
    return cls


for _cls in (Static,):
    register(_cls)


def _load_extra() -> None:
    """Register the policies that live in their own modules, if present."""
    for mod, cls_name in (
        ("greedy", "Greedy"),
        ("argmax", "Argmax"),
        ("two_step", "TwoStep"),
        ("oracle", "Oracle"),
        ("smartspec", "SmartSpec"),
        ("dynamic_sd", "DynamicSD"),
        ("threshold", "Threshold"),
        # the engines' rules (issue 25): each module cites the engine commit it follows
        ("vllm_adaptive", "VllmAdaptive"),
        ("sglang_dspark", "SglangDspark"),
        ("sglang_steps", "SglangAdaptiveSteps"),
        ("trtllm", "TrtllmThreshold"),
        ("trtllm", "TrtllmPlanner"),
        ("atom", "AtomSchedule"),
    ):
        try:
            module = importlib.import_module(f"sparksim.policies.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name == f"sparksim.policies.{mod}":
                continue
            raise
        register(getattr(module, cls_name))


_load_extra()


def _import_file(path_str: str) -> ModuleType:
    """Import a Python file by path, once per process (the user chose to run this code)."""
    path = Path(path_str).expanduser().resolve()
    key = f"sparksim_user_policy_{zlib.crc32(str(path).encode()):08x}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ImportError(f"no Python file at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module


def resolve(name: str) -> type[Policy]:
    """Return the policy class for a registered name, `package.module:Class` or `path/file.py:Class`."""
    if ":" in name:
        mod_name, _, cls_name = name.rpartition(":")
        try:
            module = (_import_file(mod_name) if mod_name.endswith(".py")
                      else importlib.import_module(mod_name))
        except ImportError as exc:
            raise ConfigError(f"policy {name!r}: cannot import {mod_name!r} ({exc})") from None
        cls = getattr(module, cls_name, None)
        if not (inspect.isclass(cls) and issubclass(cls, Policy)):
            raise ConfigError(f"policy {name!r}: {cls_name!r} is not a sparksim Policy subclass")
        return cls
    if name not in REGISTRY:
        near = difflib.get_close_matches(name, REGISTRY, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(
            f"unknown policy {name!r}{hint}; valid policies: {', '.join(sorted(REGISTRY))}, "
            "or package.module:Class, or path/to/file.py:Class"
        )
    return REGISTRY[name]


def parse_policy_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split `name:param=value,param=value` into (name, params); values are read as YAML.

    A plug-in path `package.module:Class` (a colon but no `=` after it) is a name. Raises
    ConfigError for a parameter without `=`.
    """
    import yaml

    name, _, args = spec.partition(":")
    head, _, rest = args.partition(":")
    if head and "=" not in head:  # module:Class or file.py:Class, then its parameters
        name, args = f"{name}:{head}", rest
    params: dict[str, Any] = {}
    for item in (a.strip() for a in args.split(",") if a.strip()):
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"policy {spec!r}: expected NAME:param=value,param=value (got {item!r})")
        params[key.strip()] = yaml.safe_load(raw)
    return name, params


def make_policy(name: str, block: int, params: Mapping[str, Any] | None = None) -> Policy:
    """Build policy `name` for a drafter of block `block`; bad parameters raise ConfigError."""
    cls = resolve(name)
    params = dict(params or {})
    sig = inspect.signature(cls.__init__)
    accepted = [p for p in sig.parameters if p not in ("self", "block")]
    has_var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    for key in params:
        if key not in accepted and not has_var_kw:
            raise ConfigError(
                f"policy {name!r} has no parameter {key!r}; its parameters: {accepted or 'none'}"
            )
    return cls(block, **params)


__all__ = [
    "REGISTRY", "Lengths", "Policy", "StepBatch", "StepCost", "make_policy", "register", "resolve",
]
