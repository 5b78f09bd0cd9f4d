"""Sweep points on a Ray cluster whose other nodes do not have this machine's disk.

A point reads input files by path: the profile folder, the trace set, a prefill pool's
profile, a replay's arrivals CSV, the scenario file and a plug-in policy's `.py` file. On
`ray.init(address=...)` (`RAY_ADDRESS`) a task may run on a node where none of them
exists. So the driver packs every input the points name, each once (a tar of the folder or
file, by content hash), into Ray's object store (`ship`); a task unpacks what it needs into
a cache on its node (`<tmp>/sparksim-ray/<sha256>/<name>`, the same name, so a profile or
trace set keeps its name), runs the point against those copies, and gives the row back
with every path it mentions put back to the driver's. The driver saves each finished row
in its own `points/` store (`sweep.run_rows`), so resume works across a driver restart as
it does locally.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sparksim.errors import ConfigError

# scenario keys whose values are input paths, as `sweep.point_key` fingerprints them
PATH_KEYS = ("profile", "traces", "cluster.prefill.profile", "workload.arrivals_csv")
CACHE_DIR = "sparksim-ray"


@dataclass
class Bundle:
    """The packed inputs of a sweep: content hash -> (name, tar bytes), and path -> hash."""

    blobs: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    by_path: dict[str, str] = field(default_factory=dict)

    def add(self, path: Path) -> str:
        """Pack `path` (a file or a folder) once; return its content hash."""
        key = str(path.resolve())
        if key in self.by_path:
            return self.by_path[key]
        if not path.exists():
            raise ConfigError(f"sweep input {path} does not exist (nothing to ship to the Ray workers)")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for item in sorted([path, *path.rglob("*")] if path.is_dir() else [path]):
                if item.name == "__pycache__" or "__pycache__" in item.parts:
                    continue
                info = tar.gettarinfo(str(item), arcname=str(Path(path.name) / item.relative_to(path))
                                      if path.is_dir() else path.name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if item.is_file():
                    with item.open("rb") as fh:
                        tar.addfile(info, fh)
                elif item.is_dir():
                    tar.addfile(info)
        data = buf.getvalue()
        digest = hashlib.sha256(data).hexdigest()
        self.blobs[digest] = (path.name, data)
        self.by_path[key] = digest
        return digest


@dataclass(frozen=True)
class ShippedPoint:
    """How one point runs on a worker: its scenario file and input paths, by content hash."""

    scenario: str | None  # hash of the scenario file, if any
    paths: tuple[tuple[str, str], ...]  # (scenario key, hash) to override with the local copy
    policy_file: str | None  # hash of a plug-in policy's .py file
    originals: tuple[tuple[str, str], ...]  # (local name under the cache, the driver's path)


def ship(scenario_path: str | None, base_sets: Sequence[str], points: Sequence[Any],
         bundle: Bundle | None = None) -> tuple[Bundle, list[ShippedPoint]]:
    """Pack every input the points read; return the bundle and, per point, how to run it remotely."""
    from sparksim.config import resolve_path
    from sparksim.studies.sweep import resolve_point

    bundle = bundle or Bundle()
    shipped = []
    for point in points:
        sc, base = resolve_point(scenario_path, base_sets, point)
        values = {"profile": sc.profile, "traces": sc.traces, "cluster.prefill.profile": sc.cluster.prefill.profile,
                  "workload.arrivals_csv": sc.workload.arrivals_csv}
        paths = []
        originals = []
        for key in PATH_KEYS:
            ref = values[key]
            if ref:
                local = resolve_path(ref, base)
                digest = bundle.add(local)
                paths.append((key, digest))
                originals.append((f"{digest}/{local.name}", str(local.resolve())))
        scen = bundle.add(Path(scenario_path)) if scenario_path else None
        name = point.policy.partition(":")[0]
        policy_file = None
        if name.endswith(".py"):
            policy_file = bundle.add(Path(name))
            originals.append((f"{policy_file}/{Path(name).name}", str(Path(name).resolve())))
        shipped.append(ShippedPoint(scen, tuple(paths), policy_file, tuple(originals)))
    return bundle, shipped


def materialise(digest: str, blob: tuple[str, bytes], root: Path | None = None) -> Path:
    """Unpack one shipped input under the node's cache (once per content); return its path."""
    name, data = blob
    root = root or Path(tempfile.gettempdir()) / CACHE_DIR
    target = root / digest / name
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{digest[:12]}-"))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(tmp, filter="data")
    try:
        os.replace(tmp, root / digest)  # atomic; another task may have won the race
    except OSError:
        if not target.exists():
            raise
    return target


def run_shipped(row: Callable[..., dict[str, Any]], blobs: dict[str, tuple[str, bytes]],
                scenario_path: str | None, base_sets: Sequence[str], point: Any, how: ShippedPoint,
                root: Path | None = None) -> dict[str, Any]:
    """Run one point on a worker from its shipped inputs; the row as the driver would have made it."""
    from sparksim.studies.sweep import SweepPoint

    local = {d: materialise(d, blobs[d], root) for d in
             {*(d for _, d in how.paths), *([how.scenario] if how.scenario else []),
              *([how.policy_file] if how.policy_file else [])}}
    sets = [f"{key}={local[d]}" for key, d in how.paths]
    policy = point.policy
    if how.policy_file:
        _, _, rest = policy.partition(":")
        policy = f"{local[how.policy_file]}:{rest}"
    scen = str(local[how.scenario]) if how.scenario else scenario_path
    out = row(scen, list(base_sets), SweepPoint(policy, (*point.overrides, *sets)))
    out["policy"] = point.policy
    given = dict(o.partition("=")[::2] for o in point.overrides)
    for key, _ in how.paths:  # the path overrides added here are no grid axis of the driver's
        if key in given:
            out[key] = yaml.safe_load(given[key])
        else:
            out.pop(key, None)
    cache = str(root or Path(tempfile.gettempdir()) / CACHE_DIR)
    back = [(f"{cache}/{name}", original) for name, original in how.originals]
    if isinstance(out.get("warnings"), list):  # a warning may name an input by its path
        out["warnings"] = [_restore(m, back) for m in out["warnings"]]
    return out


def _restore(text: str, back: Sequence[tuple[str, str]]) -> str:
    for local, original in back:
        text = text.replace(local, original)
    return text
