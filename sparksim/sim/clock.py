"""The simulation's clock: a SimPy environment whose processes may skip a timeout nobody can see.

A process that yields `env.timeout(d)` is resumed at now + d after every event due before
then (and every event due then that was scheduled earlier). When no event at all is due by
now + d, nothing else can run in between (only a running process schedules events, and the
one running is this one), so resuming it is the same as moving the clock on and carrying on:
`Clock.skip(d)` does that and returns True, or returns False and the process yields the
timeout as usual. The clock reads the same float either way (SimPy's timeout is due at
`now + delay`, the value `skip` sets), events keep their relative order (the event counter
only skips numbers), and the horizon is an event, so nothing is skipped past it.

A decode engine that steps alone between arrivals (the disaggregated pool's usual case)
skips SimPy's schedule, pop and resume for each of those steps.
"""

from __future__ import annotations

import simpy


class Clock(simpy.Environment):
    """`simpy.Environment` with `skip`, for processes whose timeouts are mostly unobserved."""

    def skip(self, delay: float) -> bool:
        """Move the clock on by `delay` if no event is due by then; return whether it moved."""
        at = self._now + delay
        queue = self._queue
        if queue and queue[0][0] <= at:
            return False
        self._now = at
        return True
