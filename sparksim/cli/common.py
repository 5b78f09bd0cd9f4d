"""Helpers shared by the CLI modules: error reporting, the console and the `--out` check."""

from __future__ import annotations

import functools
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Literal, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from sparksim.errors import ConfigError, OutputPathError, SparksimError

console = Console()
err_console = Console(stderr=True)

P = ParamSpec("P")
T = TypeVar("T")


def friendly_errors(fn: Callable[P, T]) -> Callable[P, T]:
    """Turn a SparksimError into one red message and exit code 1, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except SparksimError as exc:
            # Escaped: a message may hold brackets (`pip install -e ".[plot]"`) that are no
            # markup. Soft-wrapped: the terminal wraps a long line, rich would split it in two.
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


def check_out(out: Path, *, kind: Literal["folder", "file"] = "folder") -> None:
    """Raise OutputPathError unless `out` can be written as a `kind`; call it before any work.

    An existing `out` of the right kind passes (writers replace it atomically), and so does a
    missing one (writers create it and its parents). It fails when `out` is of the other
    kind, when a file stands where a parent folder must go, or when the nearest existing
    folder refuses a new entry (read-only, no permission, /proc). Nothing is left behind.
    """
    try:
        if kind == "file" and out.is_dir():
            raise OutputPathError(f"--out {out}: {out} is a folder, not a file")
        if kind == "folder" and out.exists() and not out.is_dir():
            raise OutputPathError(f"--out {out}: {out} is a file, not a folder")
        parent = out.absolute().parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise OutputPathError(f"--out {out}: {parent} is a file, not a folder")
    except OSError as exc:  # a folder on the way that cannot even be looked into
        raise OutputPathError(f"--out {out}: cannot reach {exc.filename} ({exc.strerror})") from None
    try:
        # Permission bits do not tell (root passes os.access on /proc and read-only mounts),
        # so create and remove an empty folder where the writer will create its own.
        os.rmdir(tempfile.mkdtemp(prefix=".sparksim-out-check-", dir=parent))
    except OSError as exc:
        raise OutputPathError(f"--out {out}: cannot write in {parent} ({exc.strerror})") from None


def plural(count: float, noun: str) -> str:
    """Return `count noun`, the noun in the plural unless the count is one ("1 position")."""
    return f"{count:g} {noun}{'' if count == 1 else 's'}"


def print_warnings(given: Iterable[Sequence[str]], run: str = "point") -> None:
    """Print each distinct warning that runs gave once, with how many `run`s gave it."""
    counts = Counter(message for messages in given for message in dict.fromkeys(messages))
    for message, n in counts.items():
        err_console.print(f"[yellow]warning[/] ({plural(n, run)}): {escape(message)}", highlight=False,
                          soft_wrap=True)


def need_torch() -> None:
    """Raise a clear error if torch (or safetensors) is not installed: the commands that need them say so."""
    import importlib.util

    missing = [m for m in ("torch", "safetensors") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"this command needs {missing}; install the torch extra: pip install 'sparksim[torch]'")
