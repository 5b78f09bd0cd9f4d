"""Finished sweep points on disk, one small JSON file per point, so an interrupted sweep resumes.

A point's file is named by a key that hashes everything its row depends on (see
`sweep.point_key`), so a rerun with the same arguments finds it and a changed scenario,
input file or sparksim version does not. Each file is written atomically the moment its
point finishes: a sweep stopped by Ctrl-C, a crash or `kill -9` keeps every finished point.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from sparksim.atomic import write_text


class PointStore:
    """The folder of finished points of one sweep (usually OUT/points/)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.reused = 0  # rows `get` read back instead of simulating them
        self.saved = 0  # rows `put` wrote in this run

    def path(self, key: str) -> Path:
        """Return the file that holds the point named `key`."""
        return self.folder / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """Return the saved row of point `key`, or None when it has none (it must be simulated).

        A damaged file (a full disk, an edit by hand) counts as none: it costs one point,
        not the sweep.
        """
        try:
            saved = json.loads(self.path(key).read_text())
        except (OSError, ValueError):
            return None
        row = saved.get("row") if isinstance(saved, dict) else None
        if not isinstance(row, dict):
            return None
        self.reused += 1
        return row

    def put(self, key: str, row: dict[str, Any]) -> None:
        """Save the row of point `key` atomically (its folder is created on the first point)."""
        # JSON keeps Python floats exact (repr round-trips) and NaN as NaN, so a resumed
        # table equals a fresh one; NumPy scalars are turned into the Python ones they hold.
        plain = {k: v.item() if isinstance(v, np.generic) else v for k, v in row.items()}
        write_text(self.path(key), json.dumps({"row": plain}, indent=1) + "\n")
        self.saved += 1


def fingerprint_files(paths: list[Path]) -> list[tuple[str, int, int]]:
    """Return (path, size, mtime_ns) of every file at or under `paths`: cheap, and it changes when one is rewritten."""
    found = []
    for root in paths:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for f in files:
            try:
                st = f.stat()
            except OSError:
                continue  # missing inputs fail in load_inputs with a clear message
            found.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    return found


PACKAGE = Path(__file__).resolve().parents[1]  # the sparksim package's folder


def source_files() -> list[Path]:
    """Every Python file of the sparksim package, sorted."""
    return sorted(PACKAGE.rglob("*.py"))


@functools.cache
def code_fingerprint() -> str:
    """Return a hash of sparksim's own source (the whole package), so points simulated by other
    code are not reused."""
    digest = hashlib.sha256()
    for f in source_files():
        digest.update(str(f.relative_to(PACKAGE)).encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()
