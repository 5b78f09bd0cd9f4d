"""Helpers shared by the CLI modules: error reporting and the console."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console

from sparksim.errors import SparksimError

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
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(1) from None

    return wrapper
