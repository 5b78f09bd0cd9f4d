"""The timing harness: warm up, then time repeated replays of one step and keep min/median/max.

Devices run asynchronously (a CUDA launch returns before the kernels finish), so the
harness drains the device before it starts a clock and again before it stops one; reading
a clock without that measures the launch, not the work. The clock is an interface so a
test can swap in a fake asynchronous device and check exactly that.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

MIN_REPLAYS_RECOMMENDED = 5  # vLLM's _PROFILE_REPLAYS; fewer is allowed for smoke tests


class Clock(Protocol):
    """A device clock: drain the device, take a stamp, turn two stamps into milliseconds."""

    def synchronize(self) -> None:
        """Block until every piece of work launched so far has finished."""

    def stamp(self) -> Any:
        """Take a time stamp (meaningful only right after `synchronize`)."""

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Return the milliseconds between two stamps."""


class HostClock:
    """`time.perf_counter` on the host; `synchronize` is a no-op for synchronous CPU work."""

    def synchronize(self) -> None:
        pass

    def stamp(self) -> float:
        return time.perf_counter()

    def elapsed_ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3


class CudaEventClock:
    """CUDA events on the current stream, read after a device synchronisation."""

    def __init__(self) -> None:
        import torch

        self._torch = torch

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def stamp(self) -> Any:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_ms(self, start: Any, end: Any) -> float:
        end.synchronize()  # an event's time is defined only once it has completed
        return float(start.elapsed_time(end))


@dataclass(frozen=True)
class Timing:
    """Replay times of one step, in milliseconds."""

    samples_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return float(statistics.median(self.samples_ms))

    @property
    def min_ms(self) -> float:
        return float(min(self.samples_ms))

    @property
    def max_ms(self) -> float:
        return float(max(self.samples_ms))


def time_replays(
    run: Callable[[], object], clock: Clock, *, warmup: int = 2, replays: int = 5
) -> Timing:
    """Call `run` `warmup` times untimed, then time `replays` calls one by one.

    Each timed call sits between two synchronisations, so neither the warm-up's tail nor
    the call's own unfinished work leaks into or out of its time.
    """
    if replays < 1:
        raise ValueError(f"replays must be at least 1 (got {replays})")
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(replays):
        clock.synchronize()
        start = clock.stamp()
        run()
        clock.synchronize()
        end = clock.stamp()
        samples.append(clock.elapsed_ms(start, end))
    return Timing(tuple(samples))
