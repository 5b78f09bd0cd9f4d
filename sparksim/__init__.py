"""sparksim: a discrete-event serving simulator for confidence-scheduled speculative decoding."""

from __future__ import annotations

__version__ = "0.1.0"
