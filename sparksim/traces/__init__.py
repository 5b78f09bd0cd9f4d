"""Trace sets: the format (load, validate, write) and generators of synthetic sets."""

from __future__ import annotations

from sparksim.traces.format import TraceSet, check_traceset, load_traceset, write_traceset

__all__ = ["TraceSet", "check_traceset", "load_traceset", "write_traceset"]
