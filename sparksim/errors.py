"""Errors raised at sparksim's boundaries; each names the file, key or column and the bad value."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class SparksimError(Exception):
    """Base class for every error sparksim raises on purpose."""


class FormatError(SparksimError):
    """A profile, trace set or scenario file breaks its format.

    Carries every problem found, so a validator can report them all at once.
    """

    def __init__(self, path: Path | str, problems: Sequence[str]) -> None:
        self.path = Path(path)
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{self.path}: {len(self.problems)} problem(s)\n{lines}")


class ConfigError(SparksimError):
    """A scenario key or a policy parameter has a bad value."""


class PolicyError(SparksimError):
    """A policy answered outside its interface (ℓ of the wrong shape, type or range)."""


class RangeError(SparksimError):
    """A lookup left the range a profile covers and `--strict` forbids extrapolation."""


class OutputPathError(SparksimError):
    """An output path (`--out`) cannot be written: a file stands in the way or the folder refuses writes."""


class MissingExtraError(SparksimError):
    """An optional dependency is not installed; the message says which pip extra installs it."""
