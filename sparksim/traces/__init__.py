"""Trace sets: the format (load, validate, write) and generators of synthetic sets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparksim.traces.format import TraceSet, check_traceset, load_traceset, write_traceset

__all__ = ["TraceSet", "check_traceset", "load_traceset", "write_traceset"]


def __getattr__(name: str) -> Any:
    # The format imports pyarrow: importing `sparksim.traces.synth` or the CLI must
    # not pay for it until a trace set is read or written.
    if name in __all__:
        from sparksim.traces import format as trace_format

        return getattr(trace_format, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
